//! The HIP runtime, loaded with `libloading` at run time (no ROCm at build time; why not
//! `hip-sys`: `docs/DECISIONS.md`): device, memory, modules from our code objects, and launches
//! whose argument buffer is packed at the offsets the code object's metadata gives.
//!
//! All FFI lives here. Every entry point returns a typed error naming the call and HIP's own
//! message. Tested in CI against a stub `libamdhip64` the tests build (`tests/hip_stub.rs`).

use crate::metadata::KernelMeta;
use crate::AmdModule;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::{Arc, Mutex};
use trident_core::backend::{check_launch, Artifact, BackendError, Buffer, Device, KernelArg, LaunchOptions};
use trident_core::ir::{DType, Literal};

type Err = c_int;
const MEMCPY_HOST_TO_DEVICE: c_int = 1;
const MEMCPY_DEVICE_TO_HOST: c_int = 2;
const LAUNCH_PARAM_BUFFER_POINTER: usize = 1;
const LAUNCH_PARAM_BUFFER_SIZE: usize = 2;
const LAUNCH_PARAM_END: usize = 3;

type LaunchKernel = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> Err;

/// The entry points trident uses.
struct Api {
    init: unsafe extern "C" fn(c_uint) -> Err,
    device_count: unsafe extern "C" fn(*mut c_int) -> Err,
    set_device: unsafe extern "C" fn(c_int) -> Err,
    malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> Err,
    free: unsafe extern "C" fn(*mut c_void) -> Err,
    memcpy: unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> Err,
    module_load_data: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> Err,
    module_get_function: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_char) -> Err,
    launch: LaunchKernel,
    synchronize: unsafe extern "C" fn() -> Err,
    error_string: unsafe extern "C" fn(Err) -> *const c_char,
    stream_create: unsafe extern "C" fn(*mut *mut c_void) -> Err,
    stream_destroy: unsafe extern "C" fn(*mut c_void) -> Err,
    stream_synchronize: unsafe extern "C" fn(*mut c_void) -> Err,
    event_create: unsafe extern "C" fn(*mut *mut c_void) -> Err,
    event_destroy: unsafe extern "C" fn(*mut c_void) -> Err,
    event_record: unsafe extern "C" fn(*mut c_void, *mut c_void) -> Err,
    event_synchronize: unsafe extern "C" fn(*mut c_void) -> Err,
    event_elapsed: unsafe extern "C" fn(*mut f32, *mut c_void, *mut c_void) -> Err,
    write_value64: unsafe extern "C" fn(*mut c_void, *mut c_void, u64, c_uint) -> Err,
    wait_value64: unsafe extern "C" fn(*mut c_void, *mut c_void, u64, c_uint, u64) -> Err,
    ipc_get: unsafe extern "C" fn(*mut IpcHandle, *mut c_void) -> Err,
    ipc_open: unsafe extern "C" fn(*mut *mut c_void, IpcHandle, c_uint) -> Err,
}

/// `hipIpcMemHandle_t`: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpcHandle(pub [u8; 64]);

/// `hipStreamWaitValue64`'s comparison flags (`hipStreamWaitValueGte` and friends).
pub const WAIT_VALUE_GEQ: c_uint = 0;
pub const WAIT_VALUE_EQ: c_uint = 1;

/// A loaded HIP runtime.
pub struct Hip {
    api: Api,
    _lib: libloading::Library,
    pub path: String,
}

fn no_device(reason: String) -> BackendError {
    BackendError::NoDevice { backend: crate::NAME, reason }
}

impl Hip {
    /// Loads `libamdhip64` from `TRIDENT_HIP_LIBRARY`, else the loader's search path (ROCm's
    /// `/opt/rocm/lib` included).
    pub fn load() -> Result<Hip, BackendError> {
        let names: Vec<String> = match std::env::var("TRIDENT_HIP_LIBRARY") {
            Ok(p) => vec![p],
            Err(_) => vec!["libamdhip64.so".into(), "libamdhip64.so.6".into(), "/opt/rocm/lib/libamdhip64.so".into()],
        };
        let mut tried = Vec::new();
        for n in &names {
            // SAFETY: loading runs the library's initialisers only.
            match unsafe { libloading::Library::new(n) } {
                Ok(lib) => return Self::bind(lib, n),
                Err(e) => tried.push(format!("{n}: {e}")),
            }
        }
        Err(no_device(format!("HIP runtime not found ({})", tried.join("; "))))
    }

    fn bind(lib: libloading::Library, path: &str) -> Result<Hip, BackendError> {
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is HIP's entry point of this name, with the C signature
                // the field declares (HIP runtime API).
                *unsafe { lib.get($name) }.map_err(|e| {
                    no_device(format!("{path} lacks {}: {e}", String::from_utf8_lossy(&$name[..$name.len() - 1])))
                })?
            };
        }
        let api = Api {
            init: sym!(b"hipInit\0"),
            device_count: sym!(b"hipGetDeviceCount\0"),
            set_device: sym!(b"hipSetDevice\0"),
            malloc: sym!(b"hipMalloc\0"),
            free: sym!(b"hipFree\0"),
            memcpy: sym!(b"hipMemcpy\0"),
            module_load_data: sym!(b"hipModuleLoadData\0"),
            module_get_function: sym!(b"hipModuleGetFunction\0"),
            launch: sym!(b"hipModuleLaunchKernel\0"),
            synchronize: sym!(b"hipDeviceSynchronize\0"),
            error_string: sym!(b"hipGetErrorString\0"),
            stream_create: sym!(b"hipStreamCreate\0"),
            stream_destroy: sym!(b"hipStreamDestroy\0"),
            stream_synchronize: sym!(b"hipStreamSynchronize\0"),
            event_create: sym!(b"hipEventCreate\0"),
            event_destroy: sym!(b"hipEventDestroy\0"),
            event_record: sym!(b"hipEventRecord\0"),
            event_synchronize: sym!(b"hipEventSynchronize\0"),
            event_elapsed: sym!(b"hipEventElapsedTime\0"),
            write_value64: sym!(b"hipStreamWriteValue64\0"),
            wait_value64: sym!(b"hipStreamWaitValue64\0"),
            ipc_get: sym!(b"hipIpcGetMemHandle\0"),
            ipc_open: sym!(b"hipIpcOpenMemHandle\0"),
        };
        Ok(Hip { api, _lib: lib, path: path.to_string() })
    }

    /// `Ok` for `hipSuccess`, else the call's name and HIP's message.
    fn check(&self, what: &str, e: Err) -> Result<(), String> {
        if e == 0 {
            return Ok(());
        }
        // SAFETY: hipGetErrorString returns a static NUL-terminated string (or null).
        let msg = unsafe {
            let p = (self.api.error_string)(e);
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        Err(format!("{what} failed with error {e} ({msg})"))
    }
}

/// The kernel argument buffer: each argument at the offset and size the metadata's `.args`
/// gives (scalars little-endian), `kernarg_segment_size` bytes before the hidden arguments
/// HIP appends itself.
pub fn pack_args(meta: &KernelMeta, args: &[KernelArg]) -> Result<Vec<u8>, String> {
    if meta.args.len() != args.len() {
        return Err(format!("the kernel takes {} arguments, {} given", meta.args.len(), args.len()));
    }
    let end = meta.args.iter().map(|(o, s, _)| o + s).max().unwrap_or(0);
    let mut buf = vec![0u8; end.next_multiple_of(8) as usize];
    for (i, ((off, size, _), a)) in meta.args.iter().zip(args).enumerate() {
        let bytes: Vec<u8> = match a {
            KernelArg::Ptr(p) => p.to_le_bytes().to_vec(),
            KernelArg::Scalar(Literal::Int(v), d) => v.to_le_bytes()[..d.size_bytes() as usize].to_vec(),
            KernelArg::Scalar(Literal::Float(x), DType::F64) => x.to_le_bytes().to_vec(),
            KernelArg::Scalar(Literal::Float(x), DType::F32) => (*x as f32).to_le_bytes().to_vec(),
            KernelArg::Scalar(Literal::Float(x), DType::F16) => half::f16::from_f64(*x).to_le_bytes().to_vec(),
            KernelArg::Scalar(Literal::Float(x), DType::BF16) => half::bf16::from_f64(*x).to_le_bytes().to_vec(),
            KernelArg::Scalar(l, d) => return Err(format!("argument {i}: {l:?} as {d}")),
        };
        if bytes.len() != *size as usize {
            return Err(format!("argument {i} is {} bytes, the kernel's slot {size}", bytes.len()));
        }
        buf[*off as usize..(*off + *size) as usize].copy_from_slice(&bytes);
    }
    Ok(buf)
}

/// One AMD GPU through HIP.
pub struct HipDevice {
    hip: Arc<Hip>,
    /// Loaded functions by kernel name and code object hash.
    functions: Mutex<HashMap<(String, usize), usize>>,
    /// Hidden buffers every launch passes (heap bases, diagnostics, barrier words).
    hidden: Mutex<Option<[Buffer; 3]>>,
}

impl HipDevice {
    pub fn open(index: usize) -> Result<HipDevice, BackendError> {
        let hip = Hip::load()?;
        let fail = |e: String| no_device(format!("{}: {e}", hip.path));
        // SAFETY: plain HIP calls with valid out-pointers.
        unsafe {
            hip.check("hipInit", (hip.api.init)(0)).map_err(fail)?;
            let mut n: c_int = 0;
            hip.check("hipGetDeviceCount", (hip.api.device_count)(&mut n)).map_err(fail)?;
            if index >= n.max(0) as usize {
                return Err(fail(format!("device {index} asked, {n} present")));
            }
            hip.check("hipSetDevice", (hip.api.set_device)(index as c_int)).map_err(fail)?;
        }
        Ok(HipDevice { hip: Arc::new(hip), functions: Mutex::new(HashMap::new()), hidden: Mutex::new(None) })
    }

    fn launch_err(&self, kernel: &str, e: String) -> BackendError {
        BackendError::Launch { kernel: kernel.to_string(), message: e }
    }

    fn function(&self, m: &AmdModule) -> Result<*mut c_void, BackendError> {
        let key = (m.kernel.name.clone(), m.code_object.as_ptr() as usize);
        if let Some(f) = self.functions.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(*f as *mut c_void);
        }
        let (mut module, mut f) = (std::ptr::null_mut(), std::ptr::null_mut());
        let name = CString::new(m.kernel.name.clone()).unwrap_or_default();
        // SAFETY: the image is a complete code object that outlives the call; out-pointers valid.
        unsafe {
            self.hip
                .check(
                    "hipModuleLoadData",
                    (self.hip.api.module_load_data)(&mut module, m.code_object.as_ptr() as *const c_void),
                )
                .map_err(|e| self.launch_err(&m.kernel.name, e))?;
            self.hip
                .check("hipModuleGetFunction", (self.hip.api.module_get_function)(&mut f, module, name.as_ptr()))
                .map_err(|e| self.launch_err(&m.kernel.name, e))?;
        }
        self.functions.lock().unwrap_or_else(|e| e.into_inner()).insert(key, f as usize);
        Ok(f)
    }

    fn hidden(&self, bound: std::time::Duration) -> Result<Vec<KernelArg>, BackendError> {
        let mut h = self.hidden.lock().unwrap_or_else(|e| e.into_inner());
        if h.is_none() {
            let words = trident_core::simt::diag::WORDS;
            let b = [
                self.alloc(8, "__heap_bases")?,
                self.alloc(8 * words, "__wait_diagnostics")?,
                self.alloc(16, "__barrier")?,
            ];
            for x in &b {
                self.write(x, 0, &vec![0u8; x.bytes])?;
            }
            *h = Some(b);
        }
        let [t, d, bar] = h.as_ref().expect("just made");
        Ok(trident_core::simt::hidden_args(0, 1, t.address, d.address, bound, bar.address).to_vec())
    }
}

/// A HIP stream of a device (destroyed on drop).
pub struct Stream {
    hip: Arc<Hip>,
    raw: *mut c_void,
}

// SAFETY: a HIP stream handle may be used from any host thread.
unsafe impl Send for Stream {}
// SAFETY: as above; HIP serializes calls on one stream.
unsafe impl Sync for Stream {}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: `raw` came from hipStreamCreate and is destroyed once.
        let _ = unsafe { (self.hip.api.stream_destroy)(self.raw) };
    }
}

impl HipDevice {
    fn call(&self, what: &str, e: Err) -> Result<(), BackendError> {
        self.hip.check(what, e).map_err(|message| BackendError::Launch { kernel: "(stream)".into(), message })
    }

    pub fn stream(&self) -> Result<Stream, BackendError> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        self.call("hipStreamCreate", unsafe { (self.hip.api.stream_create)(&mut raw) })?;
        Ok(Stream { hip: self.hip.clone(), raw })
    }

    pub fn synchronize(&self, s: &Stream) -> Result<(), BackendError> {
        // SAFETY: a live stream.
        self.call("hipStreamSynchronize", unsafe { (self.hip.api.stream_synchronize)(s.raw) })
    }

    /// Enqueues on `s` a 64-bit store of `value` at `offset` of `buffer` (a signal).
    pub fn write_value(&self, s: &Stream, buffer: &Buffer, offset: usize, value: u64) -> Result<(), BackendError> {
        let p = (buffer.address as usize + offset) as *mut c_void;
        // SAFETY: a live stream and an address inside the allocation.
        self.call("hipStreamWriteValue64", unsafe { (self.hip.api.write_value64)(s.raw, p, value, 0) })
    }

    /// Enqueues on `s` a wait until the 64-bit word at `offset` of `buffer` is `>= value`
    /// (HIP's wait takes a mask, unlike CUDA's: all bits).
    pub fn wait_value(&self, s: &Stream, buffer: &Buffer, offset: usize, value: u64) -> Result<(), BackendError> {
        let p = (buffer.address as usize + offset) as *mut c_void;
        // SAFETY: a live stream and an address inside the allocation.
        self.call("hipStreamWaitValue64", unsafe {
            (self.hip.api.wait_value64)(s.raw, p, value, WAIT_VALUE_GEQ, u64::MAX)
        })
    }

    /// Milliseconds between two events recorded on `s` around `work`.
    pub fn time_ms(&self, s: &Stream, work: &mut dyn FnMut() -> Result<(), BackendError>) -> Result<f32, BackendError> {
        let (mut a, mut b) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: valid out-pointers, live stream, events destroyed below.
        unsafe {
            self.call("hipEventCreate", (self.hip.api.event_create)(&mut a))?;
            self.call("hipEventCreate", (self.hip.api.event_create)(&mut b))?;
            let r = (|| {
                self.call("hipEventRecord", (self.hip.api.event_record)(a, s.raw))?;
                work()?;
                self.call("hipEventRecord", (self.hip.api.event_record)(b, s.raw))?;
                self.call("hipEventSynchronize", (self.hip.api.event_synchronize)(b))?;
                let mut ms = 0f32;
                self.call("hipEventElapsedTime", (self.hip.api.event_elapsed)(&mut ms, a, b))?;
                Ok(ms)
            })();
            let _ = (self.hip.api.event_destroy)(a);
            let _ = (self.hip.api.event_destroy)(b);
            r
        }
    }

    /// The IPC handle of an allocation, for another process of the node to open.
    pub fn ipc_handle(&self, buffer: &Buffer) -> Result<IpcHandle, BackendError> {
        let mut h = IpcHandle([0; 64]);
        // SAFETY: valid out-pointer; the address came from hipMalloc.
        self.call("hipIpcGetMemHandle", unsafe { (self.hip.api.ipc_get)(&mut h, buffer.address as *mut c_void) })?;
        Ok(h)
    }

    /// Maps another process's allocation: its address in this process.
    pub fn open_ipc(&self, h: IpcHandle) -> Result<u64, BackendError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: valid out-pointer; flags 1 = hipIpcMemLazyEnablePeerAccess.
        self.call("hipIpcOpenMemHandle", unsafe { (self.hip.api.ipc_open)(&mut p, h, 1) })?;
        Ok(p as u64)
    }
}

impl Device for HipDevice {
    fn backend(&self) -> &'static str {
        crate::NAME
    }

    fn alloc(&self, bytes: usize, name: &str) -> Result<Buffer, BackendError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        unsafe { self.hip.check("hipMalloc", (self.hip.api.malloc)(&mut p, bytes.max(1))) }
            .map_err(|message| BackendError::Buffer { buffer: name.to_string(), message })?;
        Ok(Buffer { name: name.to_string(), address: p as u64, bytes })
    }

    fn free(&self, buffer: &Buffer) -> Result<(), BackendError> {
        // SAFETY: the address came from hipMalloc.
        unsafe { self.hip.check("hipFree", (self.hip.api.free)(buffer.address as *mut c_void)) }
            .map_err(|message| BackendError::Buffer { buffer: buffer.name.clone(), message })
    }

    fn write(&self, buffer: &Buffer, offset: usize, data: &[u8]) -> Result<(), BackendError> {
        if offset + data.len() > buffer.bytes {
            return Err(BackendError::Buffer { buffer: buffer.name.clone(), message: "write past the end".into() });
        }
        // SAFETY: the range lies inside the allocation; `data` is a host slice.
        unsafe {
            self.hip.check(
                "hipMemcpy(host to device)",
                (self.hip.api.memcpy)(
                    (buffer.address as usize + offset) as *mut c_void,
                    data.as_ptr() as *const c_void,
                    data.len(),
                    MEMCPY_HOST_TO_DEVICE,
                ),
            )
        }
        .map_err(|message| BackendError::Buffer { buffer: buffer.name.clone(), message })
    }

    fn read(&self, buffer: &Buffer, offset: usize, out: &mut [u8]) -> Result<(), BackendError> {
        if offset + out.len() > buffer.bytes {
            return Err(BackendError::Buffer { buffer: buffer.name.clone(), message: "read past the end".into() });
        }
        // SAFETY: the range lies inside the allocation; `out` is a host slice.
        unsafe {
            self.hip.check(
                "hipMemcpy(device to host)",
                (self.hip.api.memcpy)(
                    out.as_mut_ptr() as *mut c_void,
                    (buffer.address as usize + offset) as *const c_void,
                    out.len(),
                    MEMCPY_DEVICE_TO_HOST,
                ),
            )
        }
        .map_err(|message| BackendError::Buffer { buffer: buffer.name.clone(), message })
    }

    fn launch(
        &self,
        kernel: &Artifact,
        grid: [u32; 3],
        args: &[KernelArg],
        opts: &LaunchOptions,
    ) -> Result<(), BackendError> {
        let m = kernel.payload_for::<AmdModule>(crate::NAME)?;
        check_launch(kernel, grid, args, u32::MAX as u64)?;
        let f = self.function(m)?;
        let mut all = args.to_vec();
        all.extend(self.hidden(opts.wait_bound)?);
        let mut buf = pack_args(&m.meta, &all).map_err(|e| self.launch_err(&kernel.kernel, e))?;
        let mut size = buf.len();
        let mut extra = [
            LAUNCH_PARAM_BUFFER_POINTER as *mut c_void,
            buf.as_mut_ptr() as *mut c_void,
            LAUNCH_PARAM_BUFFER_SIZE as *mut c_void,
            &mut size as *mut usize as *mut c_void,
            LAUNCH_PARAM_END as *mut c_void,
        ];
        let threads = m.kernel.threads();
        // SAFETY: `f` is a loaded function; `extra` follows HIP's argument-buffer convention
        // and lives until the call returns (HIP copies the buffer at launch).
        unsafe {
            self.hip.check(
                "hipModuleLaunchKernel",
                (self.hip.api.launch)(
                    f,
                    grid[0],
                    grid[1],
                    grid[2],
                    threads,
                    1,
                    1,
                    0,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    extra.as_mut_ptr(),
                ),
            )
        }
        .map_err(|e| self.launch_err(&kernel.kernel, e))?;
        // SAFETY: plain call.
        unsafe { self.hip.check("hipDeviceSynchronize", (self.hip.api.synchronize)()) }
            .map_err(|e| self.launch_err(&kernel.kernel, e))?;
        let diag = self.hidden.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|h| h[1].clone());
        if let Some(d) = diag {
            let mut raw = vec![0u8; d.bytes];
            self.read(&d, 0, &mut raw)?;
            if let Some(r) = trident_core::simt::diag::Record::decode(&raw) {
                self.write(&d, 0, &vec![0u8; d.bytes])?;
                return Err(BackendError::Execution {
                    kernel: kernel.kernel.clone(),
                    program: r.program,
                    op: "wait".into(),
                    loc: None,
                    message: r.message(&format!("{:#x}", r.signal), opts.wait_bound),
                });
            }
        }
        Ok(())
    }
}
