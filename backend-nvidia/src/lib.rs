//! trident-backend-nvidia: tile IR -> SIMT IR -> PTX, and a CUDA runtime loaded at run time.
//!
//! Owns: the PTX writer ([`ptx`]) and the device runtime
//! ([`runtime`], [`event`], the loopback [`world`]). The layout decisions live in
//! `trident_core::simt`, shared with the AMD backend; ops the lowering does not handle yet give a
//! typed `Compile` error naming the op.

pub mod event;
pub mod nvshmem;
pub mod nvshmem_shim;
pub mod nvshmem_world;
pub mod prepared;
pub mod ptx;
pub mod ptx_cache;
pub mod runtime;
pub mod tensor_map;
pub mod world;

use std::sync::Arc;
use trident_core::backend::{Artifact, Backend, BackendDescriptor, BackendError, Device};
use trident_core::simt::lower;
use trident_core::target::TargetDesc;
use trident_core::{verify, Function};

pub const NAME: &str = "nvidia";

inventory::submit! {
    BackendDescriptor {
        name: NAME,
        description: "PTX for sm_90a/sm_90/sm_80, run through the CUDA driver (loaded at run time)",
        targets: trident_core::backend::Targets::Gpu { vendor: Some(trident_core::target::Vendor::Nvidia), default: "sm_90a" },
        create: || Box::new(NvidiaBackend),
    }
}

/// A compiled kernel: PTX text and its entry point.
pub struct PtxModule {
    /// Unique to this compilation: devices cache the module they loaded by it, so a launch never
    /// hashes the PTX (70 KB for the Hopper GEMM: hashing it at every launch cost about 40 us on
    /// the H200 machine's CPU, which the GPU waited through).
    pub id: u64,
    pub ptx: String,
    pub entry: String,
    /// Threads per program.
    pub threads: u32,
    /// Some program may spin on a signal (see `simt::Kernel::waits`).
    pub waits: bool,
    /// Launched as a programmatic dependent of the kernel before it (`simt::Kernel::
    /// programmatic`: its code waits for that kernel first).
    pub programmatic: bool,
    /// Dynamic shared memory per program (bytes), given at launch.
    pub shared_bytes: u32,
    /// The tensor maps the kernel's TMA copies read, encoded at each launch from its arguments
    /// and passed after every other parameter.
    pub tensor_maps: Vec<trident_core::simt::tma::TensorMap>,
    /// NVSHMEM device functions the kernel calls (inter-node scope): the runtime links the
    /// NVSHMEM shim into its module and registers the module with NVSHMEM.
    pub device_calls: Vec<trident_core::ir::DeviceCall>,
}

pub struct NvidiaBackend;

impl NvidiaBackend {
    /// PTX for `func` on `target` (no driver needed).
    pub fn ptx(func: &Function, target: &'static TargetDesc) -> Result<PtxModule, BackendError> {
        verify(func)?;
        let compile_err = |message: String| BackendError::Compile { backend: NAME, kernel: func.name.clone(), message };
        let mut k = lower(func, target).map_err(|e| compile_err(e.to_string()))?;
        let (waits, programmatic) = (k.waits(), k.programmatic());
        let device_calls = k.device_calls();
        trident_core::simt::protocol::expand(&mut k);
        let ptx = ptx::write_ptx(&k, target).map_err(|e| compile_err(e.to_string()))?;
        Ok(PtxModule {
            id: next_module_id(),
            ptx,
            entry: k.name.clone(),
            threads: k.threads(),
            waits,
            programmatic,
            shared_bytes: k.shared_bytes,
            tensor_maps: k.tensor_maps.clone(),
            device_calls,
        })
    }
}

/// A number no other module of this process has (`PtxModule::id`).
pub(crate) fn next_module_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl NvidiaBackend {
    /// [`Backend::compile`] through the disk cache ([`ptx_cache`]): a kernel compiled by an
    /// earlier process is read instead of lowered. Returns whether it was.
    pub fn compile_cached(&self, func: &Function, target: Option<&str>) -> Result<(Artifact, bool), BackendError> {
        let (name, t) = self.target_desc(target)?;
        let (m, hit) = ptx_cache::lookup_or_lower(ptx_cache::dir().as_deref(), func, t)?;
        let text = m.ptx.clone();
        Ok((Artifact::new(func, NAME, name, text, Arc::new(m)), hit))
    }

    fn target_desc(&self, target: Option<&str>) -> Result<(&'static str, &'static TargetDesc), BackendError> {
        let name = self.descriptor().resolve_target(target)?;
        let t = trident_core::target::lookup(name).map_err(|e| BackendError::UnsupportedTarget {
            backend: NAME,
            target: name.to_string(),
            supported: e.known,
        })?;
        Ok((name, t))
    }
}

impl Backend for NvidiaBackend {
    fn descriptor(&self) -> &'static BackendDescriptor {
        trident_core::backend::lookup(NAME).expect("the nvidia backend registers itself in this crate")
    }

    fn compile(&self, func: &Function, target: Option<&str>) -> Result<Artifact, BackendError> {
        let (name, t) = self.target_desc(target)?;
        let m = Self::ptx(func, t)?;
        let text = m.ptx.clone();
        Ok(Artifact::new(func, NAME, name, text, Arc::new(m)))
    }

    fn open_device(&self, index: usize) -> Result<Arc<dyn Device>, BackendError> {
        Ok(Arc::new(runtime::CudaDevice::open(index)?))
    }
}

/// Keeps this backend's registration in a binary that reaches it only through the registry:
/// `inventory` entries live in this module's object code, which the linker drops unless
/// something in it is referenced. Call it once from `main`.
#[inline(never)]
pub fn link() {
    std::hint::black_box(NAME);
}
