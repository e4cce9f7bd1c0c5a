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
use trident_core::abi::HiddenArgs;
use trident_core::backend::{check_launch, Artifact, Backend, BackendError, Buffer, Device, KernelArg, LaunchOptions};
use trident_core::ir::{CmpOp, DType, Literal};
use trident_gpu_runtime::diagnostics::Allocations;
use trident_gpu_runtime::hidden::HiddenBuffers;
use trident_gpu_runtime::{launch_grid, watchdog, DeviceHealth, Driver, HardwareQueues, RawStream};

type Err = c_int;
const MEMCPY_HOST_TO_DEVICE: c_int = 1;
const MEMCPY_DEVICE_TO_HOST: c_int = 2;
const MEMCPY_DEVICE_TO_DEVICE: c_int = 3;
/// `hipErrorNotReady`: a stream query's "still busy".
const ERROR_NOT_READY: Err = 600;
/// `hipErrorPeerAccessAlreadyEnabled`.
const ERROR_PEER_ACCESS_ALREADY_ENABLED: Err = 704;
/// `hipStreamNonBlocking`.
const STREAM_NON_BLOCKING: c_uint = 1;
/// `hipDeviceAttributeMultiprocessorCount` in HIP 5 and 6's numbering of `hipDeviceAttribute_t`.
const ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 63;
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
    error_string: unsafe extern "C" fn(Err) -> *const c_char,
    stream_create: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> Err,
    stream_query: unsafe extern "C" fn(*mut c_void) -> Err,
    memcpy_async: unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int, *mut c_void) -> Err,
    device_attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> Err,
    occupancy: unsafe extern "C" fn(*mut c_int, *mut c_void, c_int, usize) -> Err,
    enable_peer: unsafe extern "C" fn(c_int, c_uint) -> Err,
    stream_destroy: unsafe extern "C" fn(*mut c_void) -> Err,
    event_create: unsafe extern "C" fn(*mut *mut c_void) -> Err,
    event_destroy: unsafe extern "C" fn(*mut c_void) -> Err,
    event_record: unsafe extern "C" fn(*mut c_void, *mut c_void) -> Err,
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
            error_string: sym!(b"hipGetErrorString\0"),
            stream_create: sym!(b"hipStreamCreateWithFlags\0"),
            stream_query: sym!(b"hipStreamQuery\0"),
            memcpy_async: sym!(b"hipMemcpyAsync\0"),
            device_attribute: sym!(b"hipDeviceGetAttribute\0"),
            occupancy: sym!(b"hipModuleOccupancyMaxActiveBlocksPerMultiprocessor\0"),
            enable_peer: sym!(b"hipDeviceEnablePeerAccess\0"),
            stream_destroy: sym!(b"hipStreamDestroy\0"),
            event_create: sym!(b"hipEventCreate\0"),
            event_destroy: sym!(b"hipEventDestroy\0"),
            event_record: sym!(b"hipEventRecord\0"),
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
    index: usize,
    /// Compute units (`hipDeviceAttributeMultiprocessorCount`).
    cus: u32,
    /// The device's target from the KFD topology (`None`: the backend's default).
    target: Option<String>,
    /// Loaded functions by kernel name and code object hash.
    functions: Mutex<HashMap<(String, usize), usize>>,
    /// Live allocations, to name buffers in diagnostics.
    names: Allocations,
    /// The hidden buffers of single-rank launches.
    hidden: HiddenBuffers,
    /// The hardware queues of this process's HIP runtime (`GPU_MAX_HW_QUEUES`).
    queues: HardwareQueues,
    /// Usable, or the stuck work that made it unusable.
    health: DeviceHealth,
}

/// The variable that sizes the HIP runtime's hardware queues per device (read when the runtime
/// starts; 4 when unset).
const HW_QUEUES: &str = "GPU_MAX_HW_QUEUES";

/// The hardware queues HIP gives each device, and the most trident asks for. As with CUDA's
/// connections, a stream wait (`hipStreamWaitValue64`, a barrier packet in the queue) blocks
/// its queue, so a world needs a queue per stream. Not measured on AMD hardware (none here):
/// 32 mirrors CUDA's maximum; HIP's own limit may be higher.
fn hw_queues() -> HardwareQueues {
    static FIRST_LOAD: std::sync::Once = std::sync::Once::new();
    FIRST_LOAD.call_once(|| {
        if std::env::var_os(HW_QUEUES).is_none() {
            // SAFETY: before this process loads the HIP runtime through trident, from the thread
            // opening the first device; trident reads the environment only through `std::env`.
            unsafe { std::env::set_var(HW_QUEUES, "32") };
        }
    });
    let queues = std::env::var(HW_QUEUES).ok().and_then(|v| v.trim().parse::<u32>().ok()).unwrap_or(4).max(1);
    HardwareQueues {
        queues,
        max: queues.max(32),
        setting: format!("{HW_QUEUES}={queues}, read when the HIP runtime starts"),
    }
}

impl HipDevice {
    pub fn open(index: usize) -> Result<HipDevice, BackendError> {
        let queues = hw_queues();
        let hip = Hip::load()?;
        let fail = |e: String| no_device(format!("{}: {e}", hip.path));
        let mut cus: c_int = 0;
        // SAFETY: plain HIP calls with valid out-pointers.
        unsafe {
            hip.check("hipInit", (hip.api.init)(0)).map_err(fail)?;
            let mut n: c_int = 0;
            hip.check("hipGetDeviceCount", (hip.api.device_count)(&mut n)).map_err(fail)?;
            if index >= n.max(0) as usize {
                return Err(fail(format!("device {index} asked, {n} present")));
            }
            hip.check("hipSetDevice", (hip.api.set_device)(index as c_int)).map_err(fail)?;
            hip.check(
                "hipDeviceGetAttribute(MultiprocessorCount)",
                (hip.api.device_attribute)(&mut cus, ATTRIBUTE_MULTIPROCESSOR_COUNT, index as c_int),
            )
            .map_err(fail)?;
        }
        Ok(HipDevice {
            hip: Arc::new(hip),
            index,
            cus: cus.max(1) as u32,
            target: trident_gpu_runtime::discovery::amd_targets().get(index).cloned(),
            functions: Mutex::new(HashMap::new()),
            names: Allocations::default(),
            hidden: HiddenBuffers::default(),
            queues,
            health: DeviceHealth::default(),
        })
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

    fn call(&self, what: &str, e: Err) -> Result<(), BackendError> {
        self.hip.check(what, e).map_err(|message| BackendError::Launch { kernel: "(stream)".into(), message })
    }

    pub fn stream(&self) -> Result<Stream, BackendError> {
        Ok(Stream { hip: self.hip.clone(), raw: self.stream_create()? as *mut c_void })
    }

    /// Waits for `s` (at most `watchdog::FINISH_BOUND`).
    pub fn synchronize(&self, s: &Stream) -> Result<(), BackendError> {
        watchdog::finish(self, s.raw(), watchdog::FINISH_BOUND, "the stream's work")
    }

    /// Milliseconds between two events recorded on `s` around `work`.
    pub fn time_ms(&self, s: &Stream, work: &mut dyn FnMut() -> Result<(), BackendError>) -> Result<f32, BackendError> {
        self.time_on(s.raw, watchdog::FINISH_BOUND, work)
    }

    fn time_on(
        &self,
        s: *mut c_void,
        bound: std::time::Duration,
        work: &mut dyn FnMut() -> Result<(), BackendError>,
    ) -> Result<f32, BackendError> {
        let (mut a, mut b) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: valid out-pointers, live stream, events destroyed below.
        unsafe {
            self.call("hipEventCreate", (self.hip.api.event_create)(&mut a))?;
            self.call("hipEventCreate", (self.hip.api.event_create)(&mut b))?;
            let r = (|| {
                self.call("hipEventRecord", (self.hip.api.event_record)(a, s))?;
                work()?;
                self.call("hipEventRecord", (self.hip.api.event_record)(b, s))?;
                watchdog::finish(self, s as RawStream, bound, "the timed work")?;
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

/// A HIP stream of a device (destroyed on drop); its raw handle serves the `Driver` calls.
pub struct Stream {
    hip: Arc<Hip>,
    raw: *mut c_void,
}

impl Stream {
    pub fn raw(&self) -> RawStream {
        self.raw as RawStream
    }
}

// SAFETY: a HIP stream handle may be used from any host thread.
unsafe impl Send for Stream {}
// SAFETY: as above; HIP serializes calls on one stream.
unsafe impl Sync for Stream {}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: `raw` came from hipStreamCreateWithFlags and is destroyed once.
        let _ = unsafe { (self.hip.api.stream_destroy)(self.raw) };
    }
}

impl Device for HipDevice {
    fn backend(&self) -> &'static str {
        crate::NAME
    }

    fn name(&self) -> String {
        Driver::device_name(self)
    }

    fn alloc(&self, bytes: usize, name: &str) -> Result<Buffer, BackendError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        unsafe { self.hip.check("hipMalloc", (self.hip.api.malloc)(&mut p, bytes.max(1))) }
            .map_err(|message| BackendError::Buffer { buffer: name.to_string(), message })?;
        let b = Buffer { name: name.to_string(), address: p as u64, bytes };
        self.names.insert(&b);
        Ok(b)
    }

    fn free(&self, buffer: &Buffer) -> Result<(), BackendError> {
        self.names.remove(buffer.address);
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
        check_launch(kernel, grid, args, u32::MAX as u64)?;
        let hidden = self.hidden.args(self, opts.wait_bound)?;
        self.launch_on(0, kernel, grid, args, &hidden, 1)?;
        let bound = watchdog::FINISH_BOUND.max(opts.wait_bound * 5);
        watchdog::finish(self, 0, bound, &format!("kernel `{}`", kernel.kernel))
            .map_err(|e| self.launch_err(&kernel.kernel, e.to_string()))?;
        self.hidden.check(self, &kernel.kernel, &self.names, opts.wait_bound)
    }
}

/// The HIP side of the shared GPU runtime (`trident_gpu_runtime`): non-blocking streams,
/// `hipStreamWaitValue64` with a full mask, `hipMemcpyAsync` between device addresses.
impl Driver for HipDevice {
    fn compiler(&self) -> &dyn Backend {
        &crate::AmdBackend
    }

    fn target(&self) -> Option<String> {
        self.target.clone()
    }

    fn allocations(&self) -> &Allocations {
        &self.names
    }

    fn enable_peer(&self, peer: &Self) -> Result<(), BackendError> {
        self.bind()?;
        // SAFETY: plain call; the peer is a device index of this process.
        let e = unsafe { (self.hip.api.enable_peer)(peer.index as c_int, 0) };
        if e == ERROR_PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        self.call("hipDeviceEnablePeerAccess", e)
    }

    fn bind(&self) -> Result<(), BackendError> {
        // SAFETY: plain call with a device index that `open` checked.
        self.call("hipSetDevice", unsafe { (self.hip.api.set_device)(self.index as c_int) })
    }

    fn load(&self, kernel: &Artifact) -> Result<(), BackendError> {
        self.function(kernel.payload_for::<AmdModule>(crate::NAME)?).map(|_| ())
    }

    fn launch_on(
        &self,
        stream: RawStream,
        kernel: &Artifact,
        grid: [u32; 3],
        args: &[KernelArg],
        hidden: &HiddenArgs,
        sharing: u32,
    ) -> Result<(), BackendError> {
        let m = kernel.payload_for::<AmdModule>(crate::NAME)?;
        let f = self.function(m)?;
        let threads = m.kernel.threads();
        let occupancy = || -> Result<u64, BackendError> {
            let mut per_cu: c_int = 0;
            // SAFETY: a loaded function and a valid out-pointer.
            self.call("hipModuleOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
                (self.hip.api.occupancy)(&mut per_cu, f, threads as c_int, m.kernel.shared_bytes as usize)
            })?;
            Ok(per_cu.max(0) as u64)
        };
        let grid = launch_grid(kernel, grid, m.kernel.waits(), sharing, self.cus, &occupancy)?;
        let mut all = args.to_vec();
        all.extend(hidden.args());
        let mut buf = pack_args(&m.meta, &all).map_err(|e| self.launch_err(&kernel.kernel, e))?;
        let mut size = buf.len();
        let mut extra = [
            LAUNCH_PARAM_BUFFER_POINTER as *mut c_void,
            buf.as_mut_ptr() as *mut c_void,
            LAUNCH_PARAM_BUFFER_SIZE as *mut c_void,
            &mut size as *mut usize as *mut c_void,
            LAUNCH_PARAM_END as *mut c_void,
        ];
        // SAFETY: `f` is a loaded function; `extra` follows HIP's argument-buffer convention
        // and lives until the call returns (HIP copies the buffer at launch). LDS is static in
        // the code object, so no dynamic shared memory is passed.
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
                    stream as *mut c_void,
                    std::ptr::null_mut(),
                    extra.as_mut_ptr(),
                ),
            )
        }
        .map_err(|e| self.launch_err(&kernel.kernel, e))
    }

    fn device_name(&self) -> String {
        format!("AMD {}", self.target.as_deref().unwrap_or("GPU"))
    }

    fn health(&self) -> &DeviceHealth {
        &self.health
    }

    fn hardware_queues(&self) -> HardwareQueues {
        self.queues.clone()
    }

    fn time_enqueued(
        &self,
        stream: RawStream,
        bound: std::time::Duration,
        enqueue: &mut dyn FnMut() -> Result<(), BackendError>,
    ) -> Result<std::time::Duration, BackendError> {
        let ms = self.time_on(stream as *mut c_void, bound, enqueue)?;
        Ok(std::time::Duration::from_secs_f64(ms as f64 / 1e3))
    }

    fn stream_create(&self) -> Result<RawStream, BackendError> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        self.call("hipStreamCreateWithFlags", unsafe { (self.hip.api.stream_create)(&mut raw, STREAM_NON_BLOCKING) })?;
        Ok(raw as RawStream)
    }

    fn stream_destroy(&self, stream: RawStream) {
        // SAFETY: a stream this device created, destroyed once.
        let _ = unsafe { (self.hip.api.stream_destroy)(stream as *mut c_void) };
    }

    fn stream_idle(&self, stream: RawStream) -> Result<bool, BackendError> {
        // SAFETY: a stream this device created.
        match unsafe { (self.hip.api.stream_query)(stream as *mut c_void) } {
            0 => Ok(true),
            ERROR_NOT_READY => Ok(false),
            e => self.call("hipStreamQuery", e).map(|_| false),
        }
    }

    fn copy_async(&self, stream: RawStream, dst: u64, src: u64, bytes: usize) -> Result<(), BackendError> {
        // SAFETY: the world checked both ranges against their buffers.
        self.call("hipMemcpyAsync(device to device)", unsafe {
            (self.hip.api.memcpy_async)(
                dst as *mut c_void,
                src as *const c_void,
                bytes,
                MEMCPY_DEVICE_TO_DEVICE,
                stream as *mut c_void,
            )
        })
    }

    fn write_value(&self, stream: RawStream, address: u64, value: u64) -> Result<(), BackendError> {
        // SAFETY: a live stream and 8 bytes inside an allocation (checked by the caller).
        self.call("hipStreamWriteValue64", unsafe {
            (self.hip.api.write_value64)(stream as *mut c_void, address as *mut c_void, value, 0)
        })
    }

    fn wait_value(&self, stream: RawStream, address: u64, cmp: CmpOp, value: u64) -> Result<(), BackendError> {
        let flags = match cmp {
            CmpOp::Ge => WAIT_VALUE_GEQ,
            CmpOp::Eq => WAIT_VALUE_EQ,
            other => return Err(BackendError::Host(format!("stream waits support ge and eq, not {other}"))),
        };
        // SAFETY: a live stream and 8 bytes inside an allocation (checked by the caller). HIP's
        // wait takes a mask, unlike CUDA's: all bits.
        self.call("hipStreamWaitValue64", unsafe {
            (self.hip.api.wait_value64)(stream as *mut c_void, address as *mut c_void, value, flags, u64::MAX)
        })
    }
}
