//! The backend contract and the registry of backends.
//!
//! A backend registers a [`BackendDescriptor`] with `inventory::submit!`; binaries see the
//! backends they link (name each backend crate with `use trident_backend_x as _;`). A backend
//! compiles verified kernels into [`Artifact`]s and, where a device is present, opens a
//! [`Device`] that allocates buffers and launches artifacts. A backend whose driver is absent
//! still compiles; it reports [`BackendError::NoDevice`] from `open_device`, never at build time.

use crate::ir::{DType, Elem, Function, LaunchAttrs, Literal, Loc, Type};
use crate::verify::VerifyError;
use std::any::Any;
use std::sync::Arc;

/// What a backend registers.
pub struct BackendDescriptor {
    /// The name `--backend` takes (`cpu`, `nvidia`, `amd`).
    pub name: &'static str,
    pub description: &'static str,
    /// Targets `compile` accepts.
    pub targets: Targets,
    pub create: fn() -> Box<dyn Backend>,
}

inventory::collect!(BackendDescriptor);

/// Every backend linked into this binary, sorted by name.
pub fn registered() -> Vec<&'static BackendDescriptor> {
    let mut v: Vec<_> = inventory::iter::<BackendDescriptor>.into_iter().collect();
    v.sort_by_key(|d| d.name);
    v
}

/// The registered backend called `name`.
pub fn lookup(name: &str) -> Result<&'static BackendDescriptor, BackendError> {
    registered().into_iter().find(|d| d.name == name).ok_or_else(|| BackendError::UnknownBackend {
        name: name.to_string(),
        known: registered().iter().map(|d| d.name).collect::<Vec<_>>().join(", "),
    })
}

/// The targets a backend compiles for.
#[derive(Clone, Copy, Debug)]
pub enum Targets {
    /// The registered GPU targets (`crate::target::registered`) of `vendor`, or of every vendor
    /// (`None`), `default` first.
    Gpu { vendor: Option<crate::target::Vendor>, default: &'static str },
    /// Targets that are not GPUs (`interp`), the first the default.
    Host(&'static [&'static str]),
}

impl BackendDescriptor {
    /// Its targets, the default first.
    pub fn target_names(&self) -> Vec<&'static str> {
        match self.targets {
            Targets::Host(names) => names.to_vec(),
            Targets::Gpu { vendor, default } => {
                let all = crate::target::registered();
                let mine = all.iter().filter(|t| vendor.is_none_or(|v| t.vendor == v)).map(|t| t.name);
                std::iter::once(default).chain(mine.filter(|n| *n != default)).collect()
            }
        }
    }

    /// Resolves a requested target (`None` = the default) against this backend's targets.
    pub fn resolve_target(&self, target: Option<&str>) -> Result<&'static str, BackendError> {
        let names = self.target_names();
        match target {
            None => names.first().copied().ok_or_else(|| BackendError::UnsupportedTarget {
                backend: self.name,
                target: "(default)".into(),
                supported: String::new(),
            }),
            Some(t) => names.iter().copied().find(|x| *x == t).ok_or_else(|| BackendError::UnsupportedTarget {
                backend: self.name,
                target: t.to_string(),
                supported: names.join(", "),
            }),
        }
    }
}

/// Errors of compiling, loading and running kernels.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("unknown backend `{name}`; registered backends: {known}")]
    UnknownBackend { name: String, known: String },
    #[error("backend `{backend}` does not support target `{target}`; supported: {supported}")]
    UnsupportedTarget { backend: &'static str, target: String, supported: String },
    #[error("no device for backend `{backend}`: {reason}")]
    NoDevice { backend: &'static str, reason: String },
    #[error(transparent)]
    Verify(#[from] VerifyError),
    /// The backend cannot compile this kernel (an op outside what it lowers yet, say).
    #[error("backend `{backend}` cannot compile kernel `{kernel}`: {message}")]
    Compile { backend: &'static str, kernel: String, message: String },
    #[error("kernel `{kernel}` compiled by backend `{compiled_by}` cannot run on backend `{device}`")]
    WrongBackend { kernel: String, compiled_by: &'static str, device: &'static str },
    #[error("kernel `{kernel}`, argument {index} (`%{param}`): {message}")]
    Argument { kernel: String, index: usize, param: String, message: String },
    #[error("kernel `{kernel}`: invalid launch: {message}")]
    Launch { kernel: String, message: String },
    #[error("buffer `{buffer}`: {message}")]
    Buffer { buffer: String, message: String },
    /// A fault while a kernel ran, located at a program and an op.
    #[error("kernel `{kernel}`, program {program:?}, op `{op}`{}: {message}", loc.map(|l| format!(" (line {}:{})", l.line, l.col)).unwrap_or_default())]
    Execution { kernel: String, program: [u32; 3], op: String, loc: Option<Loc>, message: String },
    /// A problem the kernel cannot solve as posed (shapes, world size), found by its host code.
    #[error("kernel `{kernel}`: {message}")]
    Problem { kernel: String, message: String },
    #[error("host orchestration: {0}")]
    Host(String),
    /// A failure on one rank of a world.
    #[error("rank {rank}: {error}")]
    Rank { rank: usize, error: Box<BackendError> },
}

/// A compiled kernel: the backend's payload plus what hosts need to launch it.
#[derive(Clone)]
pub struct Artifact {
    pub kernel: String,
    pub backend: &'static str,
    pub target: String,
    pub params: Vec<(String, Type)>,
    /// The parameters' declared divisibility facts (`ir::Param::divisibility`), checked at
    /// every launch.
    pub divisibility: Vec<Option<u32>>,
    pub attrs: LaunchAttrs,
    /// Human-readable code (printed IR, PTX, LLVM IR).
    pub text: String,
    /// Backend-private compiled form.
    pub payload: Arc<dyn Any + Send + Sync>,
}

impl Artifact {
    /// The artifact of `func` compiled by `backend` for `target`: its signature from `func`,
    /// `text` for people, `payload` for the backend's devices.
    pub fn new(
        func: &Function,
        backend: &'static str,
        target: &str,
        text: String,
        payload: Arc<dyn Any + Send + Sync>,
    ) -> Artifact {
        Artifact {
            kernel: func.name.clone(),
            backend,
            target: target.to_string(),
            params: func.params.iter().map(|p| (p.name.clone(), func.ty(p.value).clone())).collect(),
            divisibility: func.params.iter().map(|p| p.divisibility).collect(),
            attrs: func.attrs,
            text,
            payload,
        }
    }

    /// The backend-private compiled form, if this artifact is one of `device`'s kind (`T`).
    pub fn payload_for<T: Any>(&self, device: &'static str) -> Result<&T, BackendError> {
        self.payload.downcast_ref::<T>().ok_or_else(|| BackendError::WrongBackend {
            kernel: self.kernel.clone(),
            compiled_by: self.backend,
            device,
        })
    }
}

impl std::fmt::Debug for Artifact {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Artifact")
            .field("kernel", &self.kernel)
            .field("backend", &self.backend)
            .field("target", &self.target)
            .finish()
    }
}

/// A device allocation. Its `address` is what pointer arguments carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Buffer {
    pub name: String,
    pub address: u64,
    pub bytes: usize,
}

impl Buffer {
    /// Pointer argument to the start of the buffer.
    pub fn arg(&self) -> KernelArg {
        KernelArg::Ptr(self.address)
    }

    /// Pointer argument `offset` bytes into the buffer.
    pub fn arg_at(&self, offset: usize) -> KernelArg {
        KernelArg::Ptr(self.address + offset as u64)
    }
}

/// A launch argument.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KernelArg {
    Ptr(u64),
    Scalar(Literal, DType),
}

impl KernelArg {
    pub fn i32(x: i32) -> KernelArg {
        KernelArg::Scalar(Literal::Int(x as i64), DType::I32)
    }
    pub fn i64(x: i64) -> KernelArg {
        KernelArg::Scalar(Literal::Int(x), DType::I64)
    }
    pub fn u64(x: u64) -> KernelArg {
        KernelArg::Scalar(Literal::Int(x as i64), DType::U64)
    }
    pub fn f32(x: f32) -> KernelArg {
        KernelArg::Scalar(Literal::Float(x as f64), DType::F32)
    }
}

/// Checks launch arguments against the kernel's parameters (count and types).
pub fn check_args(kernel: &Artifact, args: &[KernelArg]) -> Result<(), BackendError> {
    let bad = |index: usize, message: String| BackendError::Argument {
        kernel: kernel.kernel.clone(),
        index,
        param: kernel.params.get(index).map(|p| p.0.clone()).unwrap_or_default(),
        message,
    };
    if args.len() != kernel.params.len() {
        return Err(bad(
            args.len().min(kernel.params.len()),
            format!("{} arguments given, the kernel takes {}", args.len(), kernel.params.len()),
        ));
    }
    for (i, ((_, ty), arg)) in kernel.params.iter().zip(args).enumerate() {
        let ok = match (ty.elem, arg) {
            (Elem::Ptr(_), KernelArg::Ptr(_)) => true,
            (Elem::Num(d), KernelArg::Scalar(lit, ad)) => {
                d == *ad && matches!((lit, d.is_float()), (Literal::Float(_), true) | (Literal::Int(_), false))
            }
            _ => false,
        };
        if !ok {
            return Err(bad(i, format!("expected `{ty}`, got {arg:?}")));
        }
        let Some(&Some(d)) = kernel.divisibility.get(i) else { continue };
        match arg {
            KernelArg::Ptr(a) if a % d as u64 != 0 => {
                return Err(bad(i, format!("pointer {a:#x} is not aligned to {d} bytes, as the kernel declares")));
            }
            KernelArg::Scalar(Literal::Int(v), _) if v.rem_euclid(d as i64) != 0 => {
                return Err(bad(i, format!("{v} is not a multiple of {d}, as the kernel declares")));
            }
            _ => {}
        }
    }
    Ok(())
}

/// `buffer.bytes` bytes of repeated `pattern` (an empty pattern is an error).
pub fn fill_bytes(buffer: &Buffer, pattern: &[u8]) -> Result<Vec<u8>, BackendError> {
    if pattern.is_empty() {
        return Err(BackendError::Buffer { buffer: buffer.name.clone(), message: "empty fill pattern".into() });
    }
    Ok(pattern.iter().copied().cycle().take(buffer.bytes).collect())
}

/// Checks a launch before any backend runs it: arguments against parameters, and a grid with no
/// empty axis and at most `max_programs` programs.
pub fn check_launch(
    kernel: &Artifact,
    grid: [u32; 3],
    args: &[KernelArg],
    max_programs: u64,
) -> Result<(), BackendError> {
    check_args(kernel, args)?;
    let total = grid.iter().map(|&g| g as u64).product::<u64>();
    if grid.contains(&0) || total > max_programs {
        return Err(BackendError::Launch {
            kernel: kernel.kernel.clone(),
            message: format!("grid {grid:?} must have 1..={max_programs} programs and no empty axis"),
        });
    }
    Ok(())
}

/// How to launch.
#[derive(Clone, Copy, Debug)]
pub struct LaunchOptions {
    /// Seeds whatever the backend randomizes (the CPU backend's program order).
    pub seed: u64,
    /// How long a GPU wait may spin before it gives up with a diagnostic.
    pub wait_bound: std::time::Duration,
}

impl Default for LaunchOptions {
    fn default() -> Self {
        LaunchOptions { seed: 0x7121_d3a7, wait_bound: default_wait_bound() }
    }
}

/// trident's per-user cache directory: `$TRIDENT_CACHE_DIR`, else `~/.cache/trident` (the GEMM
/// tuning cache, NVSHMEM device shims).
pub fn cache_dir() -> std::path::PathBuf {
    std::env::var_os("TRIDENT_CACHE_DIR")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache/trident")))
        .unwrap_or_else(std::env::temp_dir)
}

/// The bound of a kernel's waits when the caller sets none: 2 s, or `TRIDENT_WAIT_BOUND_MS`
/// (raised under compute-sanitizer, whose tools slow kernels down by 10-1000x). A value that is
/// not a positive integer is ignored with a message on stderr.
pub fn default_wait_bound() -> std::time::Duration {
    const DEFAULT: std::time::Duration = std::time::Duration::from_secs(2);
    match std::env::var("TRIDENT_WAIT_BOUND_MS") {
        Err(_) => DEFAULT,
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(ms) if ms > 0 => std::time::Duration::from_millis(ms),
            _ => {
                eprintln!("trident: TRIDENT_WAIT_BOUND_MS={v:?} is not a positive number of milliseconds; using 2000");
                DEFAULT
            }
        },
    }
}

/// A compiler from tile IR to one backend's artifacts, and the door to its devices.
pub trait Backend: Send + Sync {
    fn descriptor(&self) -> &'static BackendDescriptor;

    /// Verifies and compiles `func` for `target` (`None` = the backend's default).
    fn compile(&self, func: &Function, target: Option<&str>) -> Result<Artifact, BackendError>;

    /// Opens device `index`; `NoDevice` when the driver or hardware is absent.
    fn open_device(&self, index: usize) -> Result<Arc<dyn Device>, BackendError>;
}

/// A check run on every function a backend compiles (with the target it is compiled for): for
/// example a second backend's compiler, so that `cargo xtask test --backend amd` compiles and
/// checks every kernel's code object while `cpu-simt` executes it.
#[derive(Clone)]
#[allow(clippy::type_complexity)]
pub struct CompileCheck(pub Arc<dyn Fn(&Function, Option<&str>) -> Result<(), BackendError> + Send + Sync>);

impl std::fmt::Debug for CompileCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CompileCheck")
    }
}

/// `inner`, with `check` run before each compile; a failed check fails the compile.
pub struct Checked {
    pub inner: Box<dyn Backend>,
    pub check: CompileCheck,
}

impl Backend for Checked {
    fn descriptor(&self) -> &'static BackendDescriptor {
        self.inner.descriptor()
    }

    fn compile(&self, func: &Function, target: Option<&str>) -> Result<Artifact, BackendError> {
        (self.check.0)(func, target)?;
        self.inner.compile(func, target)
    }

    fn open_device(&self, index: usize) -> Result<Arc<dyn Device>, BackendError> {
        self.inner.open_device(index)
    }
}

/// Memory and launches on one device.
pub trait Device: Send + Sync {
    fn backend(&self) -> &'static str;

    /// What the device is, for people and for caches keyed by device ("NVIDIA H200"); the
    /// backend's name where it has nothing more precise.
    fn name(&self) -> String {
        self.backend().to_string()
    }

    /// Allocates `bytes` bytes (contents unspecified).
    fn alloc(&self, bytes: usize, name: &str) -> Result<Buffer, BackendError>;

    fn free(&self, buffer: &Buffer) -> Result<(), BackendError>;

    fn write(&self, buffer: &Buffer, offset: usize, data: &[u8]) -> Result<(), BackendError>;

    fn read(&self, buffer: &Buffer, offset: usize, out: &mut [u8]) -> Result<(), BackendError>;

    /// Fills the whole buffer with copies of `pattern` (poisoning outputs, zeroing workspaces).
    fn fill(&self, buffer: &Buffer, pattern: &[u8]) -> Result<(), BackendError> {
        self.write(buffer, 0, &fill_bytes(buffer, pattern)?)
    }

    /// Programs of `kernel` resident on the device at once (per multiprocessor at the kernel's
    /// registers and shared memory, times the multiprocessors), where the backend can tell:
    /// what host code sizes a grid by so that it fills whole waves (flash decoding's splits).
    /// `None` by default.
    fn resident_programs(&self, _kernel: &Artifact) -> Result<Option<u64>, BackendError> {
        Ok(None)
    }

    /// Runs `kernel` over `grid` programs and waits for it to finish.
    fn launch(
        &self,
        kernel: &Artifact,
        grid: [u32; 3],
        args: &[KernelArg],
        opts: &LaunchOptions,
    ) -> Result<(), BackendError>;
}
