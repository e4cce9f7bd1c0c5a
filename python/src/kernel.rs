//! Kernels from `.tile` text: compiled once for a backend and target, launched on host buffers
//! (the CPU backends: the bytes of a NumPy array go in and, if the kernel changed them, come
//! back) or on device addresses (GPU backends: a torch tensor's `data_ptr`, no copy).
//!
//! Why the CPU backends copy: their memory is the interpreter's own (versioned, with delayed
//! visibility and the race detector's clocks), not the process's; an array is copied into it
//! before the launch and back after. On a GPU the tensor's memory is the kernel's.

use crate::errors;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use trident_core::backend::{Artifact, Buffer, Device, KernelArg, LaunchOptions};
use trident_core::ir::{DType, Elem, Literal};
use trident_core::Function;

/// The backends linked into the package: (name, targets, description).
#[pyfunction]
pub fn backends() -> Vec<(String, Vec<String>, String)> {
    trident_core::backend::registered()
        .into_iter()
        .map(|d| {
            (d.name.to_string(), d.target_names().into_iter().map(str::to_string).collect(), d.description.to_string())
        })
        .collect()
}

/// Devices opened so far, by backend and target.
type Devices = Mutex<HashMap<(String, String), Arc<dyn Device>>>;

/// The device of `backend` for `target`, opened once (opening one costs a context).
fn device(backend: &'static str, target: &str) -> PyResult<Arc<dyn Device>> {
    static DEVICES: OnceLock<Devices> = OnceLock::new();
    let mut devices = DEVICES.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    let key = (backend.to_string(), target.to_string());
    if let Some(d) = devices.get(&key) {
        return Ok(d.clone());
    }
    let desc = trident_core::backend::lookup(backend).map_err(errors::backend)?;
    let d: Arc<dyn Device> = (desc.create)().open_device(0).map_err(errors::backend)?;
    devices.insert(key, d.clone());
    Ok(d)
}

/// Kernels compiled in this process, by (text, backend, target): compiling the same text again
/// (a module imported twice, a decode step that rebuilds its callables) costs a lookup.
type Compiled = Mutex<HashMap<(String, &'static str, String), Py<Kernel>>>;

/// Parses and verifies `text` (`origin` names it in messages: a path or `<string>`) and compiles
/// it for `backend` and `target` (the backend's default when `None`), once per process.
/// Shapes are kernel arguments, so a kernel is compiled once whatever sizes it runs on.
#[pyfunction]
#[pyo3(signature = (text, backend = "cpu", target = None, origin = "<string>"))]
pub fn compile(py: Python<'_>, text: &str, backend: &str, target: Option<&str>, origin: &str) -> PyResult<Py<Kernel>> {
    static COMPILED: OnceLock<Compiled> = OnceLock::new();
    let desc = trident_core::backend::lookup(backend).map_err(errors::backend)?;
    let target = desc.resolve_target(target).map_err(errors::backend)?;
    let key = (text.to_string(), desc.name, target.to_string());
    if let Some(k) = COMPILED.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(k.clone_ref(py));
    }
    let func =
        trident_core::text::parse(text).map_err(|e| crate::errors::ParseError::new_err(format!("{origin}: {e}")))?;
    trident_core::verify(&func).map_err(|e| crate::errors::ParseError::new_err(format!("{origin}: {e}")))?;
    // On nvidia through the disk cache (`trident_backend_nvidia::ptx_cache`): a new process
    // reads what an earlier one lowered.
    let (art, from_disk) = py
        .detach(|| match desc.name {
            trident_backend_nvidia::NAME => trident_backend_nvidia::NvidiaBackend.compile_cached(&func, Some(target)),
            _ => (desc.create)().compile(&func, Some(target)).map(|a| (a, false)),
        })
        .map_err(errors::backend)?;
    let k = Py::new(py, Kernel { func, art, backend: desc.name, from_disk, prepared: OnceLock::new() })?;
    COMPILED.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner()).insert(key, k.clone_ref(py));
    Ok(k)
}

/// A compiled kernel (`trident.compile`); `kernel[grid](*args)` launches it.
#[pyclass(frozen, module = "trident._trident")]
pub struct Kernel {
    pub(crate) func: Function,
    pub(crate) art: Artifact,
    backend: &'static str,
    /// Read from the disk cache rather than compiled by this process.
    from_disk: bool,
    /// On nvidia: the CUDA device index of the first launch and the kernel prepared for
    /// launches there (`None`: it needs the general path), made at that launch.
    pub(crate) prepared: OnceLock<(i64, Option<trident_backend_nvidia::prepared::PreparedLaunch>)>,
}

/// A pointer argument as the Python layer hands it over.
enum PtrArg {
    /// A host buffer's bytes, copied in; the Python layer copies what the kernel changed back
    /// into the array (the stable ABI of Python 3.9 has no buffer protocol).
    Host { bytes: Vec<u8>, readonly: bool },
    /// A device address (a GPU tensor's `data_ptr`).
    Device(u64),
}

impl Kernel {
    pub(crate) fn backend_name(&self) -> &'static str {
        self.backend
    }

    /// A typed error unless `given` arguments fit the kernel's parameters.
    pub(crate) fn check_arity(&self, given: usize) -> PyResult<()> {
        let want = self.func.params.len();
        if given != want {
            return Err(errors::argument(format!("kernel {} takes {want} arguments, got {given}", self.signature())));
        }
        Ok(())
    }

    pub(crate) fn signature(&self) -> String {
        let ps: Vec<String> =
            self.func.params.iter().map(|p| format!("{}: {}", p.name, self.func.ty(p.value))).collect();
        format!("@{}({})", self.func.name, ps.join(", "))
    }

    /// A scalar of type `d` from a Python int, float or bool, range-checked.
    pub(crate) fn scalar(&self, name: &str, d: DType, v: &Bound<'_, PyAny>) -> PyResult<KernelArg> {
        let bad = |what: &str| errors::argument(format!("kernel {}: `{name}: {d}` {what}", self.signature()));
        if d.is_float() {
            let x: f64 = v.extract().map_err(|_| bad("takes a number"))?;
            return Ok(KernelArg::Scalar(Literal::Float(x), d));
        }
        if d == DType::I1 {
            let x: bool = v.extract().map_err(|_| bad("takes a bool"))?;
            return Ok(KernelArg::Scalar(Literal::Int(x as i64), d));
        }
        // An i64 first (one C call); i128 only for what does not fit (u64's upper half, and
        // the error for what is out of range).
        let x: i128 = match v.extract::<i64>() {
            Ok(x) => x as i128,
            Err(_) => v.extract().map_err(|_| bad("takes an int"))?,
        };
        let bits = d.bits();
        let (lo, hi) = if d.is_signed_int() {
            (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
        } else {
            (0, (1i128 << bits) - 1)
        };
        if x < lo || x > hi {
            return Err(bad(&format!("takes {lo}..={hi}, not {x}")));
        }
        Ok(KernelArg::Scalar(Literal::Int(x as i64), d))
    }

    /// A pointer argument: `("host", bytes, dtype, readonly)` or `("device", address, dtype)`,
    /// its element type checked against the parameter's.
    fn pointer(&self, name: &str, d: DType, v: &Bound<'_, PyAny>) -> PyResult<PtrArg> {
        let bad = |what: String| errors::argument(format!("kernel {}: `{name}: !ptr<{d}>` {what}", self.signature()));
        let t = v.cast::<PyTuple>().map_err(|_| bad("takes an array or a tensor".into()))?;
        let kind: String = t.get_item(0)?.extract()?;
        let dtype: String = t.get_item(2)?.extract()?;
        if dtype != d.to_string() {
            return Err(bad(format!("was given elements of {dtype}")));
        }
        match kind.as_str() {
            "host" => {
                let bytes: Vec<u8> = t.get_item(1)?.extract()?;
                let readonly: bool = t.get_item(3)?.extract()?;
                Ok(PtrArg::Host { bytes, readonly })
            }
            "device" => Ok(PtrArg::Device(t.get_item(1)?.extract()?)),
            other => Err(bad(format!("was given a `{other}` buffer"))),
        }
    }
}

#[pymethods]
impl Kernel {
    #[getter]
    fn name(&self) -> String {
        self.func.name.clone()
    }

    #[getter]
    fn backend(&self) -> &'static str {
        self.backend
    }

    /// Whether this process read the kernel from the disk cache instead of compiling it.
    #[getter(from_disk)]
    fn read_from_disk(&self) -> bool {
        self.from_disk
    }

    #[getter]
    fn target(&self) -> String {
        self.art.target.clone()
    }

    /// `(name, "ptr" | "scalar", element type)` of every parameter, in order.
    #[getter]
    fn params(&self) -> Vec<(String, &'static str, String)> {
        self.func
            .params
            .iter()
            .map(|p| {
                let ty = self.func.ty(p.value);
                match ty.elem {
                    Elem::Ptr(d) => (p.name.clone(), "ptr", d.to_string()),
                    Elem::Num(d) => (p.name.clone(), "scalar", d.to_string()),
                    _ => (p.name.clone(), "other", ty.to_string()),
                }
            })
            .collect()
    }

    /// `kernel[grid]` on a GPU backend: a launcher that enqueues on the caller's current stream.
    fn at(slf: &Bound<'_, Self>, grid: (u32, u32, u32)) -> PyResult<crate::launch::Launcher> {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Err(errors::argument(format!("grid {grid:?}: every dimension must be at least 1")));
        }
        if slf.get().backend != trident_backend_nvidia::NAME {
            return Err(errors::argument(format!(
                "the {} backend launches through Kernel.launch (arrays are copied in and out)",
                slf.get().backend
            )));
        }
        Ok(crate::launch::Launcher { kernel: slf.clone().unbind(), grid: [grid.0, grid.1, grid.2] })
    }

    /// A hash of the compiled code (PTX, LLVM IR): equal for the same code.
    fn ptx_hash(&self) -> String {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.art.text.hash(&mut h);
        format!("{:016x}", h.finish())
    }

    /// The kernel's tile IR as text.
    fn text(&self) -> String {
        trident_core::text::print(&self.func)
    }

    fn __repr__(&self) -> String {
        format!("<trident kernel {} on {} {}>", self.signature(), self.backend, self.art.target)
    }

    /// Launches the kernel over `grid` programs with `args` (one per parameter, as the Python
    /// layer converts them) and waits for it. Returns, per argument, the new bytes of a host
    /// buffer the kernel changed (else `None`).
    fn launch<'py>(
        &self,
        py: Python<'py>,
        grid: (u32, u32, u32),
        args: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Vec<Option<Bound<'py, PyBytes>>>> {
        let params = &self.func.params;
        self.check_arity(args.len())?;
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Err(errors::argument(format!("grid {grid:?}: every dimension must be at least 1")));
        }
        let mut ptrs: Vec<Option<PtrArg>> = Vec::with_capacity(args.len());
        let mut kargs: Vec<Option<KernelArg>> = Vec::with_capacity(args.len());
        for (p, a) in params.iter().zip(&args) {
            match self.func.ty(p.value).elem {
                Elem::Num(d) => {
                    kargs.push(Some(self.scalar(&p.name, d, a)?));
                    ptrs.push(None);
                }
                Elem::Ptr(d) => {
                    ptrs.push(Some(self.pointer(&p.name, d, a)?));
                    kargs.push(None);
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
        let dev = device(self.backend, &self.art.target)?;
        // Host buffers into the device's memory.
        let mut staged: Vec<Option<(Buffer, Vec<u8>)>> = Vec::with_capacity(args.len());
        for (i, p) in ptrs.iter().enumerate() {
            match p {
                Some(PtrArg::Host { bytes, .. }) => {
                    let data = bytes.clone();
                    let buf = dev.alloc(data.len().max(1), &params[i].name).map_err(errors::backend)?;
                    dev.write(&buf, 0, &data).map_err(errors::backend)?;
                    kargs[i] = Some(buf.arg());
                    staged.push(Some((buf, data)));
                }
                Some(PtrArg::Device(addr)) => {
                    kargs[i] = Some(KernelArg::Ptr(*addr));
                    staged.push(None);
                }
                None => staged.push(None),
            }
        }
        let kargs: Vec<KernelArg> = kargs.into_iter().map(|a| a.expect("every argument converted")).collect();
        let art = &self.art;
        let launched = py.detach(|| dev.launch(art, [grid.0, grid.1, grid.2], &kargs, &LaunchOptions::default()));
        // Back into the arrays (also after a failed launch: the buffers are freed either way).
        let mut result = launched.map_err(errors::backend);
        let mut changed: Vec<Option<Bound<'py, PyBytes>>> = (0..staged.len()).map(|_| None).collect();
        for (i, s) in staged.iter().enumerate() {
            let Some((buf, before)) = s else { continue };
            let mut after = vec![0u8; before.len()];
            let read = dev.read(buf, 0, &mut after).map_err(errors::backend);
            let _ = dev.free(buf);
            if result.is_err() {
                continue;
            }
            if let Err(e) = read {
                result = Err(e);
                continue;
            }
            if after == *before {
                continue;
            }
            if let Some(PtrArg::Host { readonly, .. }) = &ptrs[i] {
                if *readonly {
                    result = Err(errors::argument(format!(
                        "kernel {} wrote into the read-only array passed as `{}` (it is left unchanged)",
                        self.signature(),
                        params[i].name
                    )));
                } else {
                    changed[i] = Some(PyBytes::new(py, &after));
                }
            }
        }
        result.map(|()| changed)
    }
}
