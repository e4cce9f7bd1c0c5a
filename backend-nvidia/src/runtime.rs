//! The CUDA runtime of the NVIDIA backend: cudarc's driver API, loaded at run time.
//!
//! Nothing here links CUDA: `cargo build` works without it, and [`CudaDevice::open`] first checks
//! that the driver library can be loaded (cudarc would panic otherwise), returning the typed
//! "no CUDA driver" error. Modules are loaded eagerly at their first launch and every function
//! is resolved then; the raw `CUmodule` is kept (NVSHMEM's `nvshmemx_cumodule_init` needs it).

use crate::PtxModule;
use cudarc::driver::{result, sys};
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex};
use trident_core::abi::HiddenArgs;
use trident_core::backend::{check_launch, Artifact, BackendError, Buffer, Device, KernelArg, LaunchOptions};
use trident_core::ir::CmpOp;
use trident_core::ir::{DType, Literal};
use trident_gpu_runtime::diagnostics::Allocations;
use trident_gpu_runtime::hidden::HiddenBuffers;
use trident_gpu_runtime::{launch_grid, DeviceHealth, Driver, HardwareQueues, RawStream};

/// The driver entry points trident calls (as cudarc's `cuda-13000` bindings name them), checked
/// when a device opens: cudarc panics on a missing one at its first call, so a driver older than
/// the newest of them (`cuEventElapsedTime_v2`: CUDA 12.8) is a typed error here instead.
/// `cuTensorMapEncodeTiled` is checked where TMA kernels launch (`tensor_map`).
pub const ENTRY_POINTS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxGetState",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuCtxEnablePeerAccess",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemsetD8_v2",
    "cuModuleLoadData",
    "cuModuleLoadDataEx",
    "cuModuleGetFunction",
    "cuFuncLoad",
    "cuModuleUnload",
    "cuFuncSetAttribute",
    "cuLaunchKernel",
    "cuLaunchCooperativeKernel",
    "cuLaunchKernelEx",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamQuery",
    "cuStreamWaitEvent",
    "cuStreamWaitValue64_v2",
    "cuStreamWriteValue64_v2",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventQuery",
    "cuEventElapsedTime_v2",
    "cuLinkCreate_v2",
    "cuLinkAddData_v2",
    "cuLinkComplete",
    "cuLinkDestroy",
];

/// Whether the CUDA driver library can be loaded here and has every entry point trident calls.
pub fn driver_available() -> Result<(), String> {
    let mut reasons = Vec::new();
    for name in ["libcuda.so.1", "libcuda.so"] {
        // SAFETY: loading the driver runs only its own initialisers; the handle is dropped at the
        // end (cudarc loads it again for its calls).
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => return missing_entry_points(&lib, name),
            Err(e) => reasons.push(format!("{name}: {e}")),
        }
    }
    let present = trident_gpu_runtime::discovery::pci_gpus().iter().filter(|g| g.vendor == 0x10de).count();
    let seen = if present > 0 {
        format!("{present} NVIDIA GPU(s) present on PCI, but ")
    } else {
        "no NVIDIA GPU on PCI and ".to_string()
    };
    Err(format!("{seen}no CUDA driver ({})", reasons.join("; ")))
}

/// `Err` naming the driver's version and the [`ENTRY_POINTS`] `lib` lacks.
fn missing_entry_points(lib: &libloading::Library, name: &str) -> Result<(), String> {
    // SAFETY: looking symbols up does not call them.
    let has = |sym: &str| unsafe { lib.get::<*const c_void>(sym.as_bytes()) }.is_ok();
    let missing: Vec<&str> = ENTRY_POINTS.iter().copied().filter(|s| !has(s)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let mut version = 0i32;
    // SAFETY: `cuDriverGetVersion(int*)` only writes the version; called only if present.
    if let Ok(f) = unsafe { lib.get::<unsafe extern "C" fn(*mut i32) -> i32>(b"cuDriverGetVersion") } {
        unsafe { f(&mut version) };
    }
    Err(format!(
        "the CUDA driver {name} (CUDA {}.{}) lacks entry points trident calls: {}; install a driver for CUDA 12.8 or newer",
        version / 1000,
        version % 1000 / 10,
        missing.join(", ")
    ))
}

struct Loaded {
    _module: sys::CUmodule,
    function: sys::CUfunction,
}

/// A vendor library's device code that modules calling its device functions are linked with
/// (NVSHMEM's shim, `crate::nvshmem_world`), and how a loaded module is registered with it.
pub struct DeviceLibrary {
    /// "NVSHMEM 3.4.5".
    pub name: String,
    /// PTX defining the functions (and the library's device state), or why there is none (the
    /// error a module that needs it gets).
    pub ptx: Result<String, String>,
    /// Registers a loaded module (`nvshmemx_cumodule_init`).
    pub register: Box<dyn Fn(sys::CUmodule) -> Result<(), String> + Send + Sync>,
}

/// One GPU, through its primary context.
pub struct CudaDevice {
    ctx: sys::CUcontext,
    /// `sm_XY` from the compute capability.
    arch: String,
    ordinal: usize,
    name: String,
    /// Multiprocessors (for the occupancy check of cooperative launches).
    pub(crate) sms: u32,
    /// Loaded modules by `PtxModule::id`.
    modules: Mutex<HashMap<u64, Loaded>>,
    /// Live allocations, to name buffers in diagnostics.
    names: Allocations,
    /// The hidden buffers of single-rank launches.
    hidden: HiddenBuffers,
    /// The device library modules with `device_calls` are linked with (set by the NVSHMEM world).
    library: Mutex<Option<Arc<DeviceLibrary>>>,
    /// The hardware queues of this process's context (`CUDA_DEVICE_MAX_CONNECTIONS`).
    queues: HardwareQueues,
    /// Usable, or the stuck work that made it unusable.
    health: DeviceHealth,
    /// The event that orders one stream after another (`Driver::stream_wait_stream`): recorded
    /// and waited for under the lock, so one event serves every pair.
    ordering: Mutex<Option<crate::event::Event>>,
}

/// The most hardware queues (connections) CUDA gives a context, and what trident asks for.
pub const MAX_CONNECTIONS: u32 = 32;

/// The variable that sizes a context's hardware queues; CUDA reads it when the process creates
/// the context (8 when unset).
const CONNECTIONS: &str = "CUDA_DEVICE_MAX_CONNECTIONS";

/// Whether trident initialised the driver in this process, after [`prepare_environment`]: then
/// every context of the process was created with its settings.
static PREPARED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Before the process's CUDA context exists: asks for every hardware queue CUDA allows
/// (`CUDA_DEVICE_MAX_CONNECTIONS=32`: worlds on one GPU need a queue per stream,
/// `trident_gpu_runtime::queues`) and for modules loaded whole (`CUDA_MODULE_LOADING=EAGER`: a
/// lazy load cannot happen while another rank's kernel spins, `probes/loopback-signals`), each
/// unless the user set it.
fn prepare_environment() {
    for (var, value) in [(CONNECTIONS, "32"), ("CUDA_MODULE_LOADING", "EAGER")] {
        if std::env::var_os(var).is_none() {
            // SAFETY: called before the driver creates the context, from the thread opening the
            // first device; trident's binaries and tests read the environment only through
            // `std::env` (which locks it) meanwhile.
            unsafe { std::env::set_var(var, value) };
        }
    }
}

/// The queues a context has: `CUDA_DEVICE_MAX_CONNECTIONS` as the driver reads it (8 when
/// unset or unreadable, at most 32). `created_here`: whether trident created the context;
/// otherwise the variable may have changed since, which the description says.
fn connections(created_here: bool) -> HardwareQueues {
    let set = std::env::var(CONNECTIONS).ok().and_then(|v| v.trim().parse::<u32>().ok());
    let queues = set.unwrap_or(8).clamp(1, MAX_CONNECTIONS);
    let when = if created_here {
        "read when the CUDA context was created"
    } else {
        "as set now; the CUDA context existed before trident opened the device"
    };
    HardwareQueues { queues, max: MAX_CONNECTIONS, setting: format!("{CONNECTIONS}={queues}, {when}") }
}

// SAFETY: a CUDA context and the modules/functions loaded in it may be used from any thread once
// the context is made current on that thread, which every method does first.
unsafe impl Send for CudaDevice {}
// SAFETY: as above; the module table is behind a mutex.
unsafe impl Sync for CudaDevice {}

fn driver_err(what: &str, e: result::DriverError) -> BackendError {
    BackendError::NoDevice { backend: crate::NAME, reason: format!("{what}: {e:?}") }
}

impl CudaDevice {
    pub fn open(index: usize) -> Result<CudaDevice, BackendError> {
        driver_available().map_err(|reason| BackendError::NoDevice { backend: crate::NAME, reason })?;
        // SAFETY: cuDeviceGetCount only writes the count; before cuInit it says so.
        let initialised = unsafe { sys::cuDeviceGetCount(&mut 0) } != sys::CUresult::CUDA_ERROR_NOT_INITIALIZED;
        if !initialised {
            prepare_environment();
            PREPARED.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        result::init().map_err(|e| driver_err("cuInit", e))?;
        let count = result::device::get_count().map_err(|e| driver_err("cuDeviceGetCount", e))?;
        if index as i32 >= count {
            return Err(BackendError::NoDevice {
                backend: crate::NAME,
                reason: format!("device {index} requested, {count} present"),
            });
        }
        let dev = result::device::get(index as i32).map_err(|e| driver_err("cuDeviceGet", e))?;
        let name = result::device::get_name(dev).unwrap_or_default();
        let (mut flags, mut active) = (0u32, 0i32);
        // SAFETY: `dev` is a valid device handle; both out-pointers are valid.
        let existed = unsafe { sys::cuDevicePrimaryCtxGetState(dev, &mut flags, &mut active) }
            == sys::CUresult::CUDA_SUCCESS
            && active != 0;
        if !existed {
            prepare_environment();
        }
        // SAFETY: `dev` is a valid device handle from cuDeviceGet.
        let ctx = unsafe { result::primary_ctx::retain(dev) }.map_err(|e| driver_err("cuDevicePrimaryCtxRetain", e))?;
        // SAFETY: `dev` is a valid device handle.
        let sms = unsafe {
            result::device::get_attribute(dev, sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        }
        .map_err(|e| driver_err("cuDeviceGetAttribute", e))? as u32;
        let cc = |a| {
            // SAFETY: `dev` is a valid device handle.
            unsafe { result::device::get_attribute(dev, a) }.map_err(|e| driver_err("cuDeviceGetAttribute", e))
        };
        let arch = format!(
            "sm_{}{}",
            cc(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            cc(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?
        );
        let d = CudaDevice {
            arch,
            ctx,
            ordinal: index,
            name,
            sms,
            modules: Mutex::new(HashMap::new()),
            names: Allocations::default(),
            hidden: HiddenBuffers::default(),
            library: Mutex::new(None),
            queues: connections(!existed || PREPARED.load(std::sync::atomic::Ordering::Relaxed)),
            health: DeviceHealth::default(),
            ordering: Mutex::new(None),
        };
        d.current()?;
        Ok(d)
    }

    /// How long the driver takes to JIT-compile `ptx` into a loaded module (PTX -> cubin), in
    /// milliseconds; the module is unloaded again.
    pub fn jit_ms(&self, ptx: &str) -> Result<f64, BackendError> {
        self.current()?;
        let image = CString::new(ptx)
            .map_err(|_| driver_err("PTX", result::DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE)))?;
        let start = std::time::Instant::now();
        // SAFETY: `image` is a NUL-terminated PTX string that outlives the call.
        let m = unsafe { result::module::load_data(image.as_ptr() as *const c_void) }
            .map_err(|e| driver_err("cuModuleLoadData", e))?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        // SAFETY: `m` was just loaded and nothing uses it.
        let _ = unsafe { result::module::unload(m) };
        Ok(ms)
    }

    /// How many devices the driver sees (`NoDevice` without a driver).
    pub fn count() -> Result<usize, BackendError> {
        driver_available().map_err(|reason| BackendError::NoDevice { backend: crate::NAME, reason })?;
        result::init().map_err(|e| driver_err("cuInit", e))?;
        let n = result::device::get_count().map_err(|e| driver_err("cuDeviceGetCount", e))?;
        if n <= 0 {
            return Err(BackendError::NoDevice { backend: crate::NAME, reason: "the driver sees no GPU".into() });
        }
        Ok(n as usize)
    }

    /// `sm_XY`, the device's compute capability.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// The device's ordinal (`cuDeviceGet`'s index).
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Links later modules that call a device library's functions with `library`.
    pub fn set_device_library(&self, library: Arc<DeviceLibrary>) {
        *self.library.lock().unwrap_or_else(|e| e.into_inner()) = Some(library);
    }

    /// `ptx` linked with `library`'s PTX by the driver's JIT linker, loaded, and registered with
    /// the library.
    fn load_linked(&self, ptx: &str, library: &DeviceLibrary) -> Result<sys::CUmodule, String> {
        let err = |what: &str, r: sys::CUresult| format!("{what}: {r:?}");
        let mut state = std::mem::MaybeUninit::uninit();
        // SAFETY: no options; `state` receives the linker.
        let r = unsafe { sys::cuLinkCreate_v2(0, std::ptr::null_mut(), std::ptr::null_mut(), state.as_mut_ptr()) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(err("cuLinkCreate", r));
        }
        // SAFETY: initialised by the successful call.
        let state = unsafe { state.assume_init() };
        let linked = (|| {
            let shim = library.ptx.as_deref().map_err(|e| e.to_string())?;
            for (name, text) in [("nvshmem_shim.ptx", shim), ("kernel.ptx", ptx)] {
                let data = CString::new(text).map_err(|_| format!("{name} contains a NUL byte"))?;
                let cname = CString::new(name).unwrap_or_default();
                let bytes = data.as_bytes_with_nul();
                // SAFETY: `data` is NUL-terminated PTX that outlives the call; no options.
                let r = unsafe {
                    sys::cuLinkAddData_v2(
                        state,
                        sys::CUjitInputType::CU_JIT_INPUT_PTX,
                        bytes.as_ptr() as *mut c_void,
                        bytes.len(),
                        cname.as_ptr(),
                        0,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                    )
                };
                if r != sys::CUresult::CUDA_SUCCESS {
                    return Err(err(&format!("cuLinkAddData ({name})"), r));
                }
            }
            let (mut cubin, mut size) = (std::ptr::null_mut(), 0usize);
            // SAFETY: the linker owns the image until it is destroyed, after the load below.
            let r = unsafe { sys::cuLinkComplete(state, &mut cubin, &mut size) };
            if r != sys::CUresult::CUDA_SUCCESS {
                return Err(err("cuLinkComplete", r));
            }
            // SAFETY: `cubin` is the linker's image, alive until `cuLinkDestroy`.
            unsafe { result::module::load_data(cubin as *const c_void) }.map_err(|e| format!("cuModuleLoadData: {e:?}"))
        })();
        // SAFETY: the state is no longer used.
        let _ = unsafe { sys::cuLinkDestroy(state) };
        let m = linked?;
        (library.register)(m).map_err(|e| format!("registering the module with {}: {e}", library.name))?;
        Ok(m)
    }

    /// The GPU's name as the driver reports it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device's primary context (torch's too).
    pub fn context(&self) -> sys::CUcontext {
        self.ctx
    }

    /// The hidden parameters of a launch of one rank alone on this device.
    pub fn single_rank_hidden(&self, opts: &LaunchOptions) -> Result<HiddenArgs, BackendError> {
        self.hidden.args(self, opts.wait_bound)
    }

    pub fn current(&self) -> Result<(), BackendError> {
        // SAFETY: `self.ctx` is the retained primary context of this device.
        unsafe { result::ctx::set_current(self.ctx) }.map_err(|e| driver_err("cuCtxSetCurrent", e))
    }

    /// Waits for the legacy default stream, where `cuMemsetD8` and `cuMemcpyHtoD` run: for
    /// device memory `cuMemsetD8` returns before the memory is set, and a pageable
    /// `cuMemcpyHtoD` may return before its DMA lands. Neither is ordered with the worlds'
    /// non-blocking streams, so a rank's zeroed signal words could be zeroed only after a
    /// peer's kernel, launched after the host barrier that follows, had already signalled
    /// them (the expert-parallel combine cases timed out in the loopback world of 4 and 8
    /// ranks on the H100, 2026-12-05: "seen 0"). This waits for nothing on those streams.
    fn drain_legacy(buffer: &Buffer, what: &str) -> Result<(), BackendError> {
        // SAFETY: the null stream is the context's legacy default stream, always valid.
        unsafe { result::stream::synchronize(std::ptr::null_mut()) }
            .map_err(|e| Self::buffer_err(buffer, &format!("cuStreamSynchronize after {what}"), e))
    }

    fn buffer_err(buffer: &Buffer, what: &str, e: result::DriverError) -> BackendError {
        BackendError::Buffer { buffer: buffer.name.clone(), message: format!("{what}: {e:?}") }
    }

    fn check_range(buffer: &Buffer, offset: usize, len: usize) -> Result<(), BackendError> {
        if offset.checked_add(len).is_none_or(|end| end > buffer.bytes) {
            return Err(BackendError::Buffer {
                buffer: buffer.name.clone(),
                message: format!("{len} bytes at offset {offset} overrun its {} bytes", buffer.bytes),
            });
        }
        Ok(())
    }

    pub(crate) fn function(&self, kernel: &Artifact, module: &PtxModule) -> Result<sys::CUfunction, BackendError> {
        let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = modules.get(&module.id) {
            return Ok(l.function);
        }
        let fail = |what: &str, e: result::DriverError| BackendError::Launch {
            kernel: kernel.kernel.clone(),
            message: format!("{what}: {e:?}"),
        };
        let image = CString::new(module.ptx.clone()).map_err(|_| BackendError::Launch {
            kernel: kernel.kernel.clone(),
            message: "PTX contains a NUL byte".into(),
        })?;
        // A kernel from the text format carries `.loc` lines: the JIT keeps them (line info does
        // not change the code) so compute-sanitizer and debuggers name the tile-IR line.
        let m = if !module.device_calls.is_empty() {
            let library = self.library.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let Some(library) = library else {
                return Err(BackendError::Launch {
                    kernel: kernel.kernel.clone(),
                    message: "it calls NVSHMEM's device functions (communication at inter-node scope), which only the \
                              NVSHMEM world links: run it under `trident launch -n N` in that world"
                        .into(),
                });
            };
            self.load_linked(&module.ptx, &library)
                .map_err(|message| BackendError::Launch { kernel: kernel.kernel.clone(), message })?
        } else if module.ptx.contains("\n  .loc ") {
            let mut opts = [sys::CUjit_option::CU_JIT_GENERATE_LINE_INFO];
            let mut vals = [std::ptr::without_provenance_mut::<c_void>(1)];
            let mut m = std::mem::MaybeUninit::uninit();
            // SAFETY: `image` is a NUL-terminated PTX string that outlives the call; one option
            // with its value (an integer passed in the pointer, as the driver API specifies).
            unsafe {
                sys::cuModuleLoadDataEx(
                    m.as_mut_ptr(),
                    image.as_ptr() as *const c_void,
                    1,
                    opts.as_mut_ptr(),
                    vals.as_mut_ptr(),
                )
                .result()
                .map(|()| m.assume_init())
            }
            .map_err(|e| fail("cuModuleLoadDataEx", e))?
        } else {
            // SAFETY: `image` is a NUL-terminated PTX string that outlives the call.
            unsafe { result::module::load_data(image.as_ptr() as *const c_void) }
                .map_err(|e| fail("cuModuleLoadData", e))?
        };
        let entry = CString::new(module.entry.clone()).unwrap_or_default();
        // SAFETY: `m` was just loaded and `entry` names a `.visible .entry` of it.
        let f = unsafe { result::module::get_function(m, entry) }.map_err(|e| fail("cuModuleGetFunction", e))?;
        // Loaded now even where the context loads lazily (a context torch created: trident
        // asks for eager loading only when it creates the context itself): a lazy load
        // cannot happen while another kernel spins (`probes/loopback-signals`), and the first
        // launch of a kernel may come while one of trident's waits spins.
        // SAFETY: `f` is a function of the module just loaded.
        unsafe { sys::cuFuncLoad(f) }.result().map_err(|e| fail("cuFuncLoad", e))?;
        if module.shared_bytes > 48 << 10 {
            // SAFETY: `f` is a function of the module just loaded.
            unsafe {
                result::function::set_function_attribute(
                    f,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    module.shared_bytes as i32,
                )
            }
            .map_err(|e| fail("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)", e))?;
        }
        modules.insert(module.id, Loaded { _module: m, function: f });
        // Once per module, not per launch: a wait record of a single-device launch names it.
        self.hidden.note_kernel(&kernel.kernel);
        Ok(f)
    }
}

impl CudaDevice {
    /// Enqueues a launch on the legacy default stream and returns at once (benchmarks time
    /// batches of these with events); [`CudaDevice::finish`] waits and reports timed-out waits.
    pub fn enqueue(
        &self,
        kernel: &Artifact,
        grid: [u32; 3],
        args: &[KernelArg],
        opts: &LaunchOptions,
    ) -> Result<(), BackendError> {
        self.enqueue_on(0, kernel, grid, args, opts)
    }

    /// Enqueues a launch on `stream`, an application's stream (torch's current stream, a CUDA
    /// graph being captured), and returns at once. A wait that times out is recorded on the
    /// device; [`CudaDevice::check_waits`] reports it once the application has synchronized.
    pub fn enqueue_on(
        &self,
        stream: u64,
        kernel: &Artifact,
        grid: [u32; 3],
        args: &[KernelArg],
        opts: &LaunchOptions,
    ) -> Result<(), BackendError> {
        check_launch(kernel, grid, args, u64::MAX)?;
        let hidden = self.hidden.args(self, opts.wait_bound)?;
        self.launch_on(stream, kernel, grid, args, &hidden, 1)
    }

    /// After the application synchronized the device: the error of a wait of a launch by
    /// [`CudaDevice::enqueue_on`] that timed out since the last check (named `kernel` when the
    /// record has no tag), and the record reset.
    pub fn check_waits(&self, kernel: &str, opts: &LaunchOptions) -> Result<(), BackendError> {
        self.current()?;
        self.hidden.check(self, kernel, &self.names, opts.wait_bound)
    }

    /// Waits for everything enqueued (at most `watchdog::FINISH_BOUND`, or five wait bounds if longer)
    /// and reports a timed-out wait of `kernel`'s launches. Work still running then leaves the
    /// device unusable (its later work would queue behind it) and is an error.
    pub fn finish(&self, kernel: &str, opts: &LaunchOptions) -> Result<(), BackendError> {
        self.finish_on(0, kernel, opts)
    }

    /// [`CudaDevice::finish`] for the work enqueued on `stream` (an application's stream).
    pub fn finish_on(&self, stream: u64, kernel: &str, opts: &LaunchOptions) -> Result<(), BackendError> {
        self.current()?;
        let bound = trident_gpu_runtime::watchdog::FINISH_BOUND.max(opts.wait_bound * 5);
        trident_gpu_runtime::watchdog::finish(self, stream, bound, &format!("kernel `{kernel}`")).map_err(|e| {
            BackendError::Launch { kernel: kernel.to_string(), message: format!("kernel execution: {e}") }
        })?;
        self.hidden.check(self, kernel, &self.names, opts.wait_bound)
    }
}

/// Enqueues `f` on `stream` with `args` and then the hidden parameters. `sharing` is how many
/// ranks launch this grid on the GPU at the same time (1 for a device of its own): a cooperative
/// launch, or one whose programs wait on signals, must fit the GPU together with theirs
/// (occupancy x SMs), and is refused with a typed error otherwise, never started to deadlock.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_raw(
    kernel: &Artifact,
    module: &PtxModule,
    f: sys::CUfunction,
    grid: [u32; 3],
    stream: sys::CUstream,
    args: &[KernelArg],
    hidden: &HiddenArgs,
    sms: u32,
    sharing: u32,
) -> Result<(), BackendError> {
    let mut slots: Vec<u64> = args.iter().chain(hidden.args().iter()).map(arg_slot).collect();
    let mut params: Vec<*mut c_void> = slots.iter_mut().map(|x| x as *mut u64 as *mut c_void).collect();
    // The maps live until the launch returns (the driver copies parameters at the call).
    let mut maps = crate::tensor_map::encode_all(kernel, &module.tensor_maps, args)?;
    params.extend(maps.iter_mut().map(|m| m as *mut sys::CUtensorMap as *mut c_void));
    let fail = |what: &str, e: result::DriverError| BackendError::Launch {
        kernel: kernel.kernel.clone(),
        message: format!("{what}: {e:?}"),
    };
    let occupancy = || per_multiprocessor(kernel, module, f);
    let grid = launch_grid(kernel, grid, module.waits, sharing, sms, &occupancy)?;
    let (g, b) = ((grid[0], grid[1], grid[2]), (module.threads, 1, 1));
    if kernel.attrs.cooperative {
        // SAFETY: as below; cooperative launches take the same parameter array.
        return unsafe { result::launch_cooperative_kernel(f, g, b, module.shared_bytes, stream, &mut params) }
            .map_err(|e| fail("cuLaunchCooperativeKernel", e));
    }
    if module.programmatic {
        // A programmatic dependent of the kernel before it on `stream`: its programs may be
        // scheduled while that kernel's last ones run, and wait for its end in the
        // `griddepcontrol.wait` the lowering put first (`LaunchAttrs::programmatic`).
        // SAFETY: a zeroed attribute value is valid (a union of plain integers); the one set
        // is the C API's `programmaticStreamSerializationAllowed`.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: g.0,
            gridDimY: g.1,
            gridDimZ: g.2,
            blockDimX: b.0,
            blockDimY: b.1,
            blockDimZ: b.2,
            sharedMemBytes: module.shared_bytes,
            hStream: stream,
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: as below; `config` and the attribute it points at live until the call
        // returns, which copies them.
        return unsafe { sys::cuLaunchKernelEx(&config, f, params.as_mut_ptr(), std::ptr::null_mut()) }
            .result()
            .map_err(|e| fail("cuLaunchKernelEx", e));
    }
    // SAFETY: `f` is a function of a loaded module; `params` points at one live 8-byte slot per
    // kernel parameter (each at most 8 bytes, checked against the signature), which the driver
    // copies before the call returns.
    unsafe { result::launch_kernel(f, g, b, module.shared_bytes, stream, &mut params) }
        .map_err(|e| fail("cuLaunchKernel", e))
}

/// Programs of `kernel` (loaded as `f` from `module`) resident on one multiprocessor at once, at
/// the block size and shared memory it is launched with.
fn per_multiprocessor(kernel: &Artifact, module: &PtxModule, f: sys::CUfunction) -> Result<u64, BackendError> {
    // SAFETY: `f` is a loaded function; the block size is the one it is launched with.
    unsafe {
        result::occupancy::max_active_block_per_multiprocessor(f, module.threads as i32, module.shared_bytes as usize)
    }
    .map(|n| n.max(0) as u64)
    .map_err(|e| BackendError::Launch {
        kernel: kernel.kernel.clone(),
        message: format!("cuOccupancyMaxActiveBlocksPerMultiprocessor: {e:?}"),
    })
}

/// The 8-byte parameter slot of a kernel argument, as `cuLaunchKernel` reads it: an address, or
/// a scalar's bytes ([`scalar_slot`]).
pub fn arg_slot(a: &KernelArg) -> u64 {
    match *a {
        KernelArg::Ptr(p) => p,
        KernelArg::Scalar(lit, d) => scalar_slot(lit, d),
    }
}

/// The bytes of a scalar argument as the kernel's `.param` reads them (little-endian, low bytes).
fn scalar_slot(lit: Literal, d: DType) -> u64 {
    match d {
        DType::F32 => (lit.as_f64() as f32).to_bits() as u64,
        DType::F64 => lit.as_f64().to_bits(),
        DType::F16 => half::f16::from_f64(lit.as_f64()).to_bits() as u64,
        DType::BF16 => half::bf16::from_f64(lit.as_f64()).to_bits() as u64,
        _ => match lit {
            Literal::Int(i) => i as u64,
            Literal::Float(f) => f as i64 as u64,
        },
    }
}

impl Device for CudaDevice {
    fn backend(&self) -> &'static str {
        crate::NAME
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn alloc(&self, bytes: usize, name: &str) -> Result<Buffer, BackendError> {
        self.current()?;
        // SAFETY: plain device allocation in the current context.
        let ptr = unsafe { result::malloc_sync(bytes.max(1)) }.map_err(|e| BackendError::Buffer {
            buffer: name.to_string(),
            message: format!("cuMemAlloc of {bytes} bytes: {e:?}"),
        })?;
        let b = Buffer { name: name.to_string(), address: ptr, bytes };
        self.names.insert(&b);
        Ok(b)
    }

    fn free(&self, buffer: &Buffer) -> Result<(), BackendError> {
        self.current()?;
        self.names.remove(buffer.address);
        // SAFETY: `buffer.address` came from `alloc` on this device.
        unsafe { result::free_sync(buffer.address) }.map_err(|e| Self::buffer_err(buffer, "cuMemFree", e))
    }

    fn write(&self, buffer: &Buffer, offset: usize, data: &[u8]) -> Result<(), BackendError> {
        Self::check_range(buffer, offset, data.len())?;
        self.current()?;
        // SAFETY: the range was checked against the allocation.
        unsafe { result::memcpy_htod_sync(buffer.address + offset as u64, data) }
            .map_err(|e| Self::buffer_err(buffer, "cuMemcpyHtoD", e))?;
        Self::drain_legacy(buffer, "cuMemcpyHtoD")
    }

    fn read(&self, buffer: &Buffer, offset: usize, out: &mut [u8]) -> Result<(), BackendError> {
        Self::check_range(buffer, offset, out.len())?;
        self.current()?;
        // SAFETY: the range was checked against the allocation.
        unsafe { result::memcpy_dtoh_sync(out, buffer.address + offset as u64) }
            .map_err(|e| Self::buffer_err(buffer, "cuMemcpyDtoH", e))
    }

    fn fill(&self, buffer: &Buffer, pattern: &[u8]) -> Result<(), BackendError> {
        if let [byte] = pattern {
            self.current()?;
            // SAFETY: the whole allocation of `buffer`.
            unsafe { result::memset_d8_sync(buffer.address, *byte, buffer.bytes) }
                .map_err(|e| Self::buffer_err(buffer, "cuMemsetD8", e))?;
            return Self::drain_legacy(buffer, "cuMemsetD8");
        }
        self.write(buffer, 0, &trident_core::backend::fill_bytes(buffer, pattern)?)
    }

    fn launch(
        &self,
        kernel: &Artifact,
        grid: [u32; 3],
        args: &[KernelArg],
        opts: &LaunchOptions,
    ) -> Result<(), BackendError> {
        self.enqueue(kernel, grid, args, opts)?;
        self.finish(&kernel.kernel, opts)
    }

    fn resident_programs(&self, kernel: &Artifact) -> Result<Option<u64>, BackendError> {
        Driver::resident_programs(self, kernel)
    }
}

fn stream_err(what: &str, e: result::DriverError) -> BackendError {
    BackendError::Host(format!("{what}: {e:?}"))
}

/// The CUDA side of the shared GPU runtime (`trident_gpu_runtime`): streams are `CUstream`s
/// carried as integers, waits are `cuStreamWaitValue64`.
impl Driver for CudaDevice {
    fn compiler(&self) -> &dyn trident_core::backend::Backend {
        &crate::NvidiaBackend
    }

    fn target(&self) -> Option<String> {
        None
    }

    fn allocations(&self) -> &Allocations {
        &self.names
    }

    fn enable_peer(&self, peer: &Self) -> Result<(), BackendError> {
        self.current()?;
        // SAFETY: both are retained primary contexts of this process.
        match unsafe { sys::cuCtxEnablePeerAccess(peer.ctx, 0) } {
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
            other => Err(BackendError::Host(format!(
                "cuCtxEnablePeerAccess from {} to {}: {other:?} (no peer access between these GPUs?)",
                self.name, peer.name
            ))),
        }
    }

    fn bind(&self) -> Result<(), BackendError> {
        self.current()
    }

    fn load(&self, kernel: &Artifact) -> Result<(), BackendError> {
        let module = kernel.payload_for::<PtxModule>(crate::NAME)?;
        self.current()?;
        self.function(kernel, module).map(|_| ())
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
        let module = kernel.payload_for::<PtxModule>(crate::NAME)?;
        self.current()?;
        let f = self.function(kernel, module)?;
        launch_raw(kernel, module, f, grid, stream as sys::CUstream, args, hidden, self.sms, sharing)
    }

    fn device_name(&self) -> String {
        self.name.clone()
    }

    fn resident_programs(&self, kernel: &Artifact) -> Result<Option<u64>, BackendError> {
        let module = kernel.payload_for::<PtxModule>(crate::NAME)?;
        self.current()?;
        let f = self.function(kernel, module)?;
        Ok(Some(per_multiprocessor(kernel, module, f)? * self.sms as u64))
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
        let (a, b) = (crate::event::Event::new(self)?, crate::event::Event::new(self)?);
        a.record(stream as sys::CUstream)?;
        enqueue()?;
        b.record(stream as sys::CUstream)?;
        trident_gpu_runtime::watchdog::finish(self, stream, bound, "the timed work")?;
        b.elapsed_since(&a)
    }

    fn stream_create(&self) -> Result<RawStream, BackendError> {
        self.current()?;
        let s = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(|e| stream_err("cuStreamCreate", e))?;
        Ok(s as RawStream)
    }

    fn stream_destroy(&self, stream: RawStream) {
        // SAFETY: a stream this device created; the world drained it before.
        let _ = unsafe { result::stream::destroy(stream as sys::CUstream) };
    }

    fn stream_idle(&self, stream: RawStream) -> Result<bool, BackendError> {
        // SAFETY: a stream this device created.
        match unsafe { sys::cuStreamQuery(stream as sys::CUstream) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            other => Err(BackendError::Host(format!("cuStreamQuery: {other:?}"))),
        }
    }

    fn stream_capturing(&self, stream: RawStream) -> Result<bool, BackendError> {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: a stream this device created; `status` is a valid out-pointer.
        unsafe { sys::cuStreamIsCapturing(stream as sys::CUstream, &mut status) }
            .result()
            .map_err(|e| stream_err("cuStreamIsCapturing", e))?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    fn copy_async(&self, stream: RawStream, dst: u64, src: u64, bytes: usize) -> Result<(), BackendError> {
        self.current()?;
        // SAFETY: the world checked both ranges against their buffers.
        unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream as sys::CUstream) }
            .result()
            .map_err(|e| stream_err("cuMemcpyDtoDAsync", e))
    }

    fn write_value(&self, stream: RawStream, address: u64, value: u64) -> Result<(), BackendError> {
        self.current()?;
        // SAFETY: `address` is 8 bytes inside a device buffer (checked by the world).
        unsafe { sys::cuStreamWriteValue64_v2(stream as sys::CUstream, address, value, 0) }
            .result()
            .map_err(|e| stream_err("cuStreamWriteValue64", e))
    }

    fn stream_wait_stream(&self, waiter: RawStream, on: RawStream) -> Result<(), BackendError> {
        self.current()?;
        // A wait takes the event's state when it is enqueued: re-recording it later does not
        // change what an earlier wait waits for (also inside a graph capture).
        let mut ev = self.ordering.lock().unwrap_or_else(|e| e.into_inner());
        if ev.is_none() {
            *ev = Some(crate::event::Event::ordering(self)?);
        }
        let ev = ev.as_ref().expect("made above");
        ev.record(on as sys::CUstream)?;
        ev.wait_on(waiter as sys::CUstream)
    }

    fn event_create(&self) -> Result<Option<u64>, BackendError> {
        Ok(Some(crate::event::Event::new(self)?.into_handle()))
    }

    fn event_record(&self, event: u64, stream: RawStream) -> Result<(), BackendError> {
        self.current()?;
        crate::event::Event::record_handle(event, stream as sys::CUstream)
    }

    fn event_elapsed_ms(&self, from: u64, to: u64) -> Result<f64, BackendError> {
        self.current()?;
        crate::event::Event::handles_elapsed_ms(from, to)
    }

    fn event_release(&self, event: u64) {
        if self.current().is_ok() {
            // SAFETY: a handle of `event_create`, released once (the world forgets it).
            drop(unsafe { crate::event::Event::from_handle(event) });
        }
    }

    fn wait_value(&self, stream: RawStream, address: u64, cmp: CmpOp, value: u64) -> Result<(), BackendError> {
        let flags = match cmp {
            CmpOp::Ge => 0, // CU_STREAM_WAIT_VALUE_GEQ
            CmpOp::Eq => 1, // CU_STREAM_WAIT_VALUE_EQ
            other => return Err(BackendError::Host(format!("stream waits support ge and eq, not {other}"))),
        };
        self.current()?;
        // SAFETY: `address` is 8 bytes inside a device buffer (checked by the world).
        unsafe { sys::cuStreamWaitValue64_v2(stream as sys::CUstream, address, value, flags) }
            .result()
            .map_err(|e| stream_err("cuStreamWaitValue64", e))
    }
}

#[cfg(test)]
mod tests {
    /// A library without the driver's entry points (here the C library) is refused with the
    /// names of those it lacks, not with a panic at the first call.
    #[test]
    fn a_driver_without_the_entry_points_is_a_typed_error() {
        // SAFETY: the C library is already loaded in every process.
        let libc = unsafe { libloading::Library::new("libc.so.6") }.unwrap();
        let e = super::missing_entry_points(&libc, "libc.so.6").unwrap_err();
        assert!(e.contains("cuEventElapsedTime_v2") && e.contains("CUDA 12.8 or newer"), "{e}");
    }
}
