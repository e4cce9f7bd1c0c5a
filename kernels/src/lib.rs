//! trident-kernels: the kernel library.
//!
//! Every kernel is a Rust function of its meta-parameters (element type, block sizes, warps,
//! stages) that builds one specialization in the tile IR, like Triton's `constexpr`s, plus host
//! orchestration that checks shapes, sizes the grid and launches it on any backend's device.
//! Kernels know nothing about backends beyond the `Backend`/`Device` traits.

// Every file of `src/` is a public module: adding a kernel adds its file and edits none.
automod::dir!(pub "src");

use trident_core::backend::{Artifact, Backend, BackendError, Buffer, Device, KernelArg, LaunchOptions};
use trident_core::world::KernelCache;
use trident_core::{Function, VerifyError};

/// The grid asked for by the persistent kernels that move rows through memory at prefill sizes
/// (the high-throughput all-to-all, the tensor-parallel MoE block's route and finish): the launch
/// runs what is resident of it, up to 16 programs of 4 warps per multiprocessor. A program moves
/// one 16-byte vector per thread per step (2 KB), so one program per multiprocessor keeps about
/// 264 KB in flight over 132 of them, an eighth of the H100's bandwidth-latency product
/// (3.35 TB/s x about 0.7 us): at a581f9b the high-throughput dispatch, 128 MB of copies at
/// Mixtral's prefill, took 309 us, 0.41 TB/s, as that predicts.
pub const STREAMING_PROGRAMS: u32 = 2048;

/// Ceiling division for grid sizes.
pub fn cdiv(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

/// A typed error unless `buffer` holds at least `bytes` bytes.
pub fn require_bytes(buffer: &Buffer, bytes: usize, role: &str) -> Result<(), BackendError> {
    if buffer.bytes < bytes {
        return Err(BackendError::Host(format!(
            "{role} buffer `{}` has {} bytes, the problem needs {bytes}",
            buffer.name, buffer.bytes
        )));
    }
    Ok(())
}

/// A typed error unless a problem dimension fits the kernels' `i32` index arithmetic.
pub fn require_i32(value: usize, what: &str) -> Result<i32, BackendError> {
    i32::try_from(value).map_err(|_| BackendError::Host(format!("{what} = {value} does not fit i32 indexing")))
}

/// Where host orchestration runs kernels: a backend, one of its devices, launch options, and
/// the artifacts compiled so far (one per specialization: kernels are built and compiled once).
pub struct DeviceCtx<'a> {
    pub backend: &'a dyn Backend,
    pub device: &'a dyn Device,
    pub opts: LaunchOptions,
    /// The backend target kernels are compiled for (`None`: the backend's default).
    pub target: Option<String>,
    cache: KernelCache,
}

impl<'a> DeviceCtx<'a> {
    pub fn new(backend: &'a dyn Backend, device: &'a dyn Device, opts: LaunchOptions) -> DeviceCtx<'a> {
        DeviceCtx { backend, device, opts, target: None, cache: KernelCache::default() }
    }

    /// The artifact of the specialization `key` (its meta-parameters), building it on first use.
    pub fn compile(
        &self,
        key: String,
        build: impl Fn() -> Result<Function, VerifyError>,
    ) -> Result<Artifact, BackendError> {
        self.cache.get_or_compile(self.backend, self.target.as_deref(), &key, &build)
    }

    /// The GPU target kernels are compiled for, when the backend lowers for one (`nvidia`,
    /// `cpu-simt`, `amd`): kernels pick their meta-parameters for it (`Gemm::for_target`).
    pub fn gpu_target(&self) -> Option<&'static trident_core::target::TargetDesc> {
        let name = self.backend.descriptor().resolve_target(self.target.as_deref()).ok()?;
        trident_core::target::lookup(name).ok()
    }

    /// Programs of `kernel` resident on the device at once, where the backend can tell
    /// ([`trident_core::backend::Device::resident_programs`]).
    pub fn resident_programs(&self, kernel: &Artifact) -> Result<Option<u64>, BackendError> {
        self.device.resident_programs(kernel)
    }

    pub fn launch(&self, kernel: &Artifact, grid: [u32; 3], args: &[KernelArg]) -> Result<(), BackendError> {
        self.device.launch(kernel, grid, args, &self.opts)
    }
}

/// A specialization of the catalogue at its default meta-parameters: what `emit --kernel NAME`
/// compiles, the snapshot tests print and `ptx-check` assembles. Each kernel's module registers
/// its own with `inventory::submit!`, so adding a kernel touches no list here.
pub struct Catalogued {
    /// The specialization's name (`allreduce_oneshot`).
    pub name: &'static str,
    /// The operation it belongs to, as the conformance suite names its cases (`allreduce`).
    pub operation: &'static str,
    /// Whether it runs in a world of ranks (it communicates).
    pub distributed: bool,
    pub build: fn(trident_core::ir::DType) -> Result<Function, VerifyError>,
}

inventory::collect!(Catalogued);

/// A catalogue kernel built around a GEMM whose configuration the caller chooses (tile shape,
/// warps, stages, TMA: `trident emit --kernel NAME --config ..`), registered beside the kernel.
pub struct GemmBased {
    /// The catalogue name ([`Catalogued::name`]).
    pub name: &'static str,
    pub build: fn(gemm::Gemm) -> Result<Function, VerifyError>,
}

inventory::collect!(GemmBased);

/// The kernels built around a chosen GEMM, by name.
pub fn gemm_based() -> Vec<&'static GemmBased> {
    let mut all: Vec<&'static GemmBased> = inventory::iter::<GemmBased>.into_iter().collect();
    all.sort_by_key(|c| c.name);
    all
}

/// Every registered specialization, by name.
pub fn catalogued() -> Vec<&'static Catalogued> {
    let mut all: Vec<&'static Catalogued> = inventory::iter::<Catalogued>.into_iter().collect();
    all.sort_by_key(|c| c.name);
    all
}

/// Every kernel of the library at its default meta-parameters for `dtype`, by name (what
/// `cargo xtask emit --kernel NAME` compiles).
pub fn catalogue(dtype: trident_core::ir::DType) -> Vec<(&'static str, Result<Function, VerifyError>)> {
    catalogued().into_iter().map(|c| (c.name, (c.build)(dtype))).collect()
}
