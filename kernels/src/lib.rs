//! trident-kernels: the kernel library.
//!
//! Every kernel is a Rust function of its meta-parameters (element type, block sizes, warps,
//! stages) that builds one specialization in the tile IR, like Triton's `constexpr`s, plus host
//! orchestration that checks shapes, sizes the grid and launches it on any backend's device.
//! Kernels know nothing about backends beyond the `Backend`/`Device` traits.

pub mod ag_gemm;
pub mod allgather;
pub mod allreduce;
pub mod gemm;
pub mod gemm_rs;
pub mod ring_shift;
pub mod softmax;
pub mod splitk_gemm;
pub mod tuning;
pub mod vector_add;

use trident_core::backend::{Artifact, Backend, BackendError, Buffer, Device, KernelArg, LaunchOptions};
use trident_core::world::KernelCache;
use trident_core::{Function, VerifyError};

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
pub struct Launcher<'a> {
    pub backend: &'a dyn Backend,
    pub device: &'a dyn Device,
    pub opts: LaunchOptions,
    /// The backend target kernels are compiled for (`None`: the backend's default).
    pub target: Option<String>,
    cache: KernelCache,
}

impl<'a> Launcher<'a> {
    pub fn new(backend: &'a dyn Backend, device: &'a dyn Device, opts: LaunchOptions) -> Launcher<'a> {
        Launcher { backend, device, opts, target: None, cache: KernelCache::default() }
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

    pub fn launch(&self, kernel: &Artifact, grid: [u32; 3], args: &[KernelArg]) -> Result<(), BackendError> {
        self.device.launch(kernel, grid, args, &self.opts)
    }
}

/// Every kernel of the library at its default meta-parameters for `dtype`, by name (what
/// `cargo xtask emit --kernel NAME` compiles).
pub fn catalogue(dtype: trident_core::ir::DType) -> Vec<(&'static str, Result<Function, VerifyError>)> {
    use allreduce::{Algorithm, AllReduce};
    vec![
        ("vector_add", vector_add::VectorAdd { dtype, block: 1024 }.build()),
        ("softmax", softmax::Softmax::for_cols(dtype, 1024).build()),
        ("gemm", gemm::Gemm::new(dtype).build()),
        // The divisible GEMM through tensor descriptors, C included (TMA copies and store on sm_90a).
        (
            "gemm_desc",
            gemm::Gemm { divisible: true, descriptors: true, tma_store: true, ..gemm::Gemm::new(dtype) }.build(),
        ),
        ("splitk_gemm", splitk_gemm::SplitKGemm::new(dtype, 4).build()),
        ("allgather", allgather::AllGather::new(dtype).build()),
        ("allreduce_oneshot", AllReduce::new(dtype, Algorithm::OneShot).build()),
        ("allreduce_twoshot", AllReduce::new(dtype, Algorithm::TwoShot).build()),
        ("ag_gemm", ag_gemm::AgGemm::new(dtype, ag_gemm::GatherMode::CopyEngine).build()),
        ("gemm_rs_gemm", gemm_rs::GemmRs::new(dtype).build_gemm(64)),
        ("gemm_rs_reduce", gemm_rs::GemmRs::new(dtype).build_reduce(64)),
        ("ring_shift_put", ring_shift::RingShift::new(dtype, ring_shift::ShiftMode::Put).build()),
        ("ring_shift_get", ring_shift::RingShift::new(dtype, ring_shift::ShiftMode::Get).build()),
    ]
}
