//! Launching a GPU kernel from Python: `kernel[grid](*args)` on torch CUDA tensors (or any
//! object exporting DLPack), enqueued on torch's current stream of the tensors' device, in
//! torch's primary context, without a copy and without waiting.
//!
//! What a launch costs is what this file does: `kernel[grid]` a dict lookup in the base class
//! [`Launchers`]; per tensor, its type compared with `torch.Tensor`, its dtype compared by
//! identity with torch's dtype objects, `get_device()` (-1 on the host), `is_contiguous()` and
//! `data_ptr()`; then torch's raw current stream and the kernel's [`PreparedLaunch`]: the
//! declared alignments checked and one `cuLaunchKernel`. Everything else (the kernel's
//! signature, the torch objects, the loaded function and the hidden parameters) is looked up
//! once. Kernels a plain `cuLaunchKernel` does not serve (persistent, cooperative, with tensor
//! maps) take the general path, `CudaDevice::enqueue_on`.
//!
//! Waits: a kernel's bounded waits still time out on the device; what they record is reported
//! by `trident.synchronize()` (or after every launch with `TRIDENT_SYNC_LAUNCH=1`, which also
//! waits for each launch, as `CUDA_LAUNCH_BLOCKING` does).

use crate::dlpack::{DlDataType, DlTensor, DL_CPU, DL_CUDA, DL_CUDA_MANAGED};
use crate::errors;
use crate::kernel::Kernel;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use std::sync::{Arc, OnceLock};
use trident_backend_nvidia::prepared::PreparedLaunch;
use trident_backend_nvidia::runtime::{arg_slot, CudaDevice};
use trident_core::backend::{KernelArg, LaunchOptions};
use trident_core::ir::{DType, Elem};

/// What the launch path looks up once in torch (absent without torch: DLPack only).
struct Torch {
    tensor: Py<PyType>,
    /// `torch._C._cuda_getCurrentRawStream(device)`: the current stream as an integer, what
    /// Triton's launcher calls too (`torch.cuda.current_stream()` builds a Python object).
    raw_stream: Py<PyAny>,
    /// torch's dtype objects and the element type each is (`fp8` for the 8-bit floats, which
    /// kernels take as bytes until the IR has FP8).
    dtypes: Vec<(Py<PyAny>, &'static str)>,
    /// `torch.cuda.device_count()` is 1: a CUDA tensor is on device 0, which the launch then
    /// knows from the `is_cuda` attribute without a `get_device()` call (a method torch parses
    /// arguments for; what that saves per tensor is not measured yet).
    one_device: bool,
}

fn torch(py: Python<'_>) -> Option<&'static Torch> {
    static TORCH: PyOnceLock<Option<Torch>> = PyOnceLock::new();
    TORCH
        .get_or_init(py, || {
            let t = py.import("torch").ok()?;
            let raw_stream = t.getattr("_C").ok()?.getattr("_cuda_getCurrentRawStream").ok()?.unbind();
            let tensor = t.getattr("Tensor").ok()?.cast_into::<PyType>().ok()?.unbind();
            let mut dtypes = Vec::new();
            for (name, elem) in [
                ("float32", "f32"),
                ("float16", "f16"),
                ("bfloat16", "bf16"),
                ("float64", "f64"),
                ("int32", "i32"),
                ("int64", "i64"),
                ("int16", "i16"),
                ("int8", "i8"),
                ("uint8", "u8"),
                ("uint16", "u16"),
                ("uint32", "u32"),
                ("uint64", "u64"),
                ("bool", "i1"),
                ("float8_e4m3fn", "f8e4m3fn"),
                ("float8_e5m2", "f8e5m2"),
                ("float8_e4m3fnuz", "fp8"),
                ("float8_e5m2fnuz", "fp8"),
            ] {
                if let Ok(d) = t.getattr(name) {
                    dtypes.push((d.unbind(), elem));
                }
            }
            let one_device = t
                .getattr("cuda")
                .and_then(|c| c.call_method0("device_count"))
                .and_then(|n| n.extract::<i64>())
                .is_ok_and(|n| n == 1);
            Some(Torch { tensor, raw_stream, dtypes, one_device })
        })
        .as_ref()
}

/// Whether every launch waits and reports its timed-out waits (`TRIDENT_SYNC_LAUNCH=1`).
fn sync_launches() -> bool {
    static SYNC: OnceLock<bool> = OnceLock::new();
    *SYNC.get_or_init(|| std::env::var("TRIDENT_SYNC_LAUNCH").is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// Whether a tensor of element type `given` fits a `!ptr<want>` parameter: the same type
/// (`f8e4m3fn`, `f8e5m2` included), or any 8-bit float as bytes (`!ptr<u8>`/`!ptr<i8>`: the
/// FNUZ formats, which the IR does not have).
fn fits(given: &str, want: DType) -> bool {
    let fp8 = given == "fp8" || given.starts_with("f8");
    given == want.as_str() || (fp8 && matches!(want, DType::U8 | DType::I8))
}

/// One pointer argument: its address and the CUDA device it lives on.
struct DevicePtr {
    address: u64,
    device: i64,
}

/// The element type of a DLPack dtype (single lane).
fn dlpack_element(t: &DlDataType) -> String {
    let kind = match t.code {
        0 => "i",
        1 => "u",
        2 => "f",
        4 => "bf",
        6 => return "i1".into(),
        // DLPack 1.1's 8-bit floats: 10 is E4M3FN and 12 is E5M2; the others (FNUZ, E3M4,
        // E8M0) only as bytes.
        10 if t.bits == 8 => return "f8e4m3fn".into(),
        12 if t.bits == 8 => return "f8e5m2".into(),
        7..=14 if t.bits == 8 => return "fp8".into(),
        _ => return format!("DLPack type code {} of {} bits", t.code, t.bits),
    };
    if t.lanes != 1 {
        return format!("{} lanes of {kind}{}", t.lanes, t.bits);
    }
    format!("{kind}{}", t.bits)
}

impl Kernel {
    fn bad(&self, name: &str, d: DType, what: String) -> PyErr {
        errors::argument(format!("kernel {}: `{name}: !ptr<{d}>` {what}", self.signature()))
    }

    /// A torch tensor's address, checked: dtype, CUDA, contiguous.
    fn tensor_ptr(&self, t: &Torch, name: &str, d: DType, a: &Bound<'_, PyAny>) -> PyResult<DevicePtr> {
        let py = a.py();
        let dtype = a.getattr(intern!(py, "dtype"))?;
        let given = t.dtypes.iter().find(|(o, _)| o.is(&dtype)).map(|(_, e)| *e);
        if !given.is_some_and(|g| fits(g, d)) {
            return Err(self.bad(name, d, format!("was given a tensor of {dtype}")));
        }
        // `get_device()` is -1 for a host tensor: no separate `is_cuda` read. With one CUDA
        // device, `is_cuda` says it all.
        let device: i64 = match t.one_device {
            true => match a.getattr(intern!(py, "is_cuda"))?.is_truthy()? {
                true => 0,
                false => -1,
            },
            false => a.call_method0(intern!(py, "get_device"))?.extract()?,
        };
        if device < 0 {
            let device = a.getattr(intern!(py, "device"))?;
            return Err(self.bad(
                name,
                d,
                format!("was given a tensor on {device}; the {} backend takes CUDA tensors", self.backend_name()),
            ));
        }
        if !a.call_method0(intern!(py, "is_contiguous"))?.is_truthy()? {
            return Err(self.bad(
                name,
                d,
                "was given a tensor that is not contiguous (.contiguous() copies it)".into(),
            ));
        }
        let address: u64 = a.call_method0(intern!(py, "data_ptr"))?.extract()?;
        Ok(DevicePtr { address, device })
    }

    /// The address of an object exporting DLPack (CuPy, JAX, Numba, ...), checked as a tensor.
    fn dlpack_ptr(&self, name: &str, d: DType, a: &Bound<'_, PyAny>) -> PyResult<DevicePtr> {
        let py = a.py();
        let capsule = a.call_method0(intern!(py, "__dlpack__"))?;
        // SAFETY: a DLPack capsule named "dltensor" holds a `DLManagedTensor*`, whose first
        // member is the `DLTensor`; the capsule (and so the tensor) lives until this returns.
        let t = unsafe {
            let p = pyo3::ffi::PyCapsule_GetPointer(capsule.as_ptr(), c"dltensor".as_ptr());
            if p.is_null() {
                return Err(PyErr::take(py).unwrap_or_else(|| {
                    self.bad(name, d, "was given an object whose __dlpack__ is not a DLPack capsule".into())
                }));
            }
            &*(p as *const DlTensor)
        };
        let given = dlpack_element(&t.dtype);
        if !fits(&given, d) {
            return Err(self.bad(name, d, format!("was given a DLPack tensor of {given}")));
        }
        if !matches!(t.device.device_type, DL_CUDA | DL_CUDA_MANAGED) {
            return Err(self.bad(
                name,
                d,
                match t.device.device_type {
                    DL_CPU => format!(
                        "was given a host array (DLPack CPU); the {} backend takes CUDA tensors",
                        self.backend_name()
                    ),
                    other => format!(
                        "was given a DLPack tensor on device type {other}; the {} backend takes CUDA tensors (type 2)",
                        self.backend_name()
                    ),
                },
            ));
        }
        // SAFETY: `shape` and `strides` (when not null) hold `ndim` entries each.
        let compact = t.strides.is_null()
            || unsafe {
                let n = t.ndim.max(0) as usize;
                let (shape, strides) =
                    (std::slice::from_raw_parts(t.shape, n), std::slice::from_raw_parts(t.strides, n));
                let mut want = 1i64;
                let mut ok = true;
                for i in (0..n).rev() {
                    if shape[i] != 1 && strides[i] != want {
                        ok = false;
                    }
                    want *= shape[i];
                }
                ok
            };
        if !compact {
            return Err(self.bad(name, d, "was given a DLPack tensor that is not contiguous".into()));
        }
        Ok(DevicePtr { address: t.data as u64 + t.byte_offset, device: t.device.device_id as i64 })
    }

    fn device_ptr(&self, torch: Option<&Torch>, name: &str, d: DType, a: &Bound<'_, PyAny>) -> PyResult<DevicePtr> {
        if let Some(t) = torch {
            if a.get_type().is(t.tensor.bind(a.py())) || a.is_instance(t.tensor.bind(a.py()))? {
                return self.tensor_ptr(t, name, d, a);
            }
        }
        if a.hasattr(intern!(a.py(), "__dlpack__"))? {
            return self.dlpack_ptr(name, d, a);
        }
        Err(self.bad(
            name,
            d,
            format!("takes a CUDA tensor (torch, or anything exporting DLPack), not {}", a.get_type().name()?),
        ))
    }

    /// Launches on the caller's current stream and returns at once (see the file's comment).
    pub(crate) fn launch_gpu(&self, py: Python<'_>, grid: [u32; 3], args: &Bound<'_, PyTuple>) -> PyResult<()> {
        let (index, stream, kargs) = self.prepare(py, args)?;
        if !sync_launches() {
            if let Some(p) = self.prepared_at(index)? {
                return p.launch(stream, grid, &slots(&kargs)).map_err(errors::backend);
            }
        }
        let dev = gpu(index)?;
        let opts = launch_options();
        dev.enqueue_on(stream, &self.art, grid, &kargs, opts).map_err(errors::backend)?;
        if sync_launches() {
            py.detach(|| dev.finish_on(stream, &self.art.kernel, opts)).map_err(errors::backend)?;
        }
        Ok(())
    }

    /// The kernel prepared for plain launches on CUDA device `index`
    /// (`trident_backend_nvidia::prepared`), made at the first launch; `None` where it needs
    /// the general path, or launches on another device than the first.
    fn prepared_at(&self, index: i64) -> PyResult<Option<&PreparedLaunch>> {
        if let Some((i, p)) = self.prepared.get() {
            return Ok(p.as_ref().filter(|_| *i == index));
        }
        let dev = gpu(index)?;
        let p = PreparedLaunch::new(&dev, &self.art, launch_options()).map_err(errors::backend)?;
        let (i, p) = self.prepared.get_or_init(|| (index, p));
        Ok(p.as_ref().filter(|_| *i == index))
    }

    /// The CUDA device index, torch's current stream and the kernel arguments of a launch
    /// with `args`.
    fn prepare(&self, py: Python<'_>, args: &Bound<'_, PyTuple>) -> PyResult<(i64, u64, Vec<KernelArg>)> {
        let params = &self.func.params;
        self.check_arity(args.len())?;
        let t = torch(py);
        let mut kargs = Vec::with_capacity(params.len());
        let mut device: Option<i64> = None;
        for (p, a) in params.iter().zip(args.iter()) {
            match self.func.ty(p.value).elem {
                Elem::Num(d) => kargs.push(self.scalar(&p.name, d, &a)?),
                Elem::Ptr(d) => {
                    let ptr = self.device_ptr(t, &p.name, d, &a)?;
                    match device {
                        Some(other) if other != ptr.device => {
                            return Err(self.bad(
                                &p.name,
                                d,
                                format!("is on cuda:{}, an earlier argument on cuda:{other}", ptr.device),
                            ))
                        }
                        _ => device = Some(ptr.device),
                    }
                    kargs.push(KernelArg::Ptr(ptr.address));
                }
                _ => {
                    return Err(errors::argument(format!(
                        "kernel {}: parameter `{}` cannot be passed from Python",
                        self.signature(),
                        p.name
                    )))
                }
            }
        }
        let index = match (device, t) {
            (Some(i), _) => i,
            (None, Some(_)) => py
                .import(intern!(py, "torch"))?
                .getattr(intern!(py, "cuda"))?
                .call_method0("current_device")?
                .extract()?,
            (None, None) => 0,
        };
        let stream: u64 = match t {
            Some(t) => t.raw_stream.bind(py).call1((index,))?.extract()?,
            None => 0,
        };
        Ok((index, stream, kargs))
    }
}

/// The 8-byte parameter slots of `args`, as `cuLaunchKernel` reads them.
fn slots(args: &[KernelArg]) -> Vec<u64> {
    args.iter().map(arg_slot).collect()
}

/// The options of launches from Python, read once (the wait bound comes from the environment).
pub(crate) fn launch_options() -> &'static LaunchOptions {
    static OPTS: OnceLock<LaunchOptions> = OnceLock::new();
    OPTS.get_or_init(LaunchOptions::default)
}

/// The process's CUDA device `index` (torch's primary context: the same one).
pub(crate) fn gpu(index: i64) -> PyResult<Arc<CudaDevice>> {
    let i = usize::try_from(index).map_err(|_| errors::argument(format!("CUDA device {index}")))?;
    trident_backend_nvidia::world::device_at(i).map_err(errors::backend)
}

/// The base class of the Python `Kernel`: `kernel[grid]` is a lookup in a dict of launchers by
/// grid, done here rather than by a Python `__getitem__` (which cost about 0.8 us of a launch
/// of a few microseconds). A grid not seen yet goes to the subclass's `_launcher(grid)`, which
/// makes the launcher and may keep it in `_launchers`.
#[pyclass(frozen, subclass, module = "trident._trident")]
pub struct Launchers {
    cache: Py<PyDict>,
}

#[pymethods]
impl Launchers {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(py: Python<'_>, _args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> Self {
        Launchers { cache: PyDict::new(py).unbind() }
    }

    fn __getitem__<'py>(slf: &Bound<'py, Self>, grid: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        if let Some(l) = slf.get().cache.bind(slf.py()).get_item(grid)? {
            return Ok(l);
        }
        slf.call_method1(intern!(slf.py(), "_launcher"), (grid,))
    }

    /// The launchers by grid (the CPU backends' launchers refer to the kernel: the collector
    /// sees the cycle through `__traverse__`).
    #[getter]
    fn _launchers(&self, py: Python<'_>) -> Py<PyDict> {
        self.cache.clone_ref(py)
    }

    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        visit.call(&self.cache)
    }

    fn __clear__(&self, py: Python<'_>) {
        self.cache.bind(py).clear();
    }
}

/// `kernel[grid]`: calling it launches.
#[pyclass(frozen, module = "trident._trident")]
pub struct Launcher {
    pub(crate) kernel: Py<Kernel>,
    pub(crate) grid: [u32; 3],
}

#[pymethods]
impl Launcher {
    #[pyo3(signature = (*args))]
    fn __call__(&self, py: Python<'_>, args: &Bound<'_, PyTuple>) -> PyResult<()> {
        self.kernel.get().launch_gpu(py, self.grid, args)
    }

    /// Profiling: the arguments read once, then `n` launches enqueued from Rust; what a launch
    /// costs without Python's part (`python/bench/launch_overhead.py` subtracts).
    #[pyo3(signature = (n, *args))]
    fn _repeat(&self, py: Python<'_>, n: usize, args: &Bound<'_, PyTuple>) -> PyResult<()> {
        let k = self.kernel.get();
        let (index, stream, kargs) = k.prepare(py, args)?;
        match k.prepared_at(index)? {
            Some(p) => {
                let slots = slots(&kargs);
                for _ in 0..n {
                    p.launch(stream, self.grid, &slots).map_err(errors::backend)?;
                }
            }
            None => {
                let dev = gpu(index)?;
                for _ in 0..n {
                    dev.enqueue_on(stream, &k.art, self.grid, &kargs, launch_options()).map_err(errors::backend)?;
                }
            }
        }
        Ok(())
    }

    /// Profiling: reads the arguments as a launch does, without launching.
    #[pyo3(signature = (*args))]
    fn _prepare(&self, py: Python<'_>, args: &Bound<'_, PyTuple>) -> PyResult<()> {
        self.kernel.get().prepare(py, args).map(|_| ())
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let k = self.kernel.bind(py).repr()?;
        Ok(format!("{k}[{:?}]", self.grid))
    }
}

/// Reports a wait of a kernel launched from Python on CUDA device `index` that timed out since
/// the last check (and resets the record). The caller synchronized the device first
/// (`torch.cuda.synchronize()`); without torch, this waits for the legacy stream (bounded).
#[pyfunction]
#[pyo3(signature = (index, synchronized))]
pub fn check_waits(py: Python<'_>, index: i64, synchronized: bool) -> PyResult<()> {
    let dev = gpu(index)?;
    let opts = LaunchOptions::default();
    if !synchronized {
        py.detach(|| dev.finish_on(0, "a kernel launched from Python", &opts)).map_err(errors::backend)?;
    }
    dev.check_waits("a kernel launched from Python", &opts).map_err(errors::backend)
}
