//! trident-backend-amd: tile IR -> SIMT IR -> LLVM IR for `amdgcn-amd-amdhsa` -> code objects.
//!
//! Owns: the AMD targets' backend (gfx942, gfx90a: `trident_core::target` describes and
//! registers them), the LLVM IR writer ([`llvm`]), code objects through LLVM 19's `llc` and
//! `ld.lld` found at run time ([`codeobj`]), and the checks of a code object without an AMD GPU
//! ([`metadata`]). Lowering decisions live in `trident_core::simt`, shared with the NVIDIA
//! backend. The HIP runtime ([`hip`]) is loaded at run time; without it `open_device` is a typed
//! `NoDevice` error saying what is present and what is missing.

pub mod codeobj;
pub mod hip;
pub mod llvm;
pub mod metadata;

use std::sync::Arc;
use trident_core::backend::{Artifact, Backend, BackendDescriptor, BackendError, Device};
use trident_core::simt::{lower, protocol, Kernel};
use trident_core::target::TargetDesc;
use trident_core::{verify, Function};

pub const NAME: &str = "amd";

inventory::submit! {
    BackendDescriptor {
        name: NAME,
        description: "AMDGCN code objects (gfx942, gfx90a) from LLVM IR through LLVM 19's llc and ld.lld, checked without a GPU",
        targets: trident_core::backend::Targets::Gpu { vendor: Some(trident_core::target::Vendor::Amd), default: "gfx942" },
        create: || Box::new(AmdBackend),
    }
}

/// A compiled kernel: its LLVM IR, code object and what the code object says of it.
pub struct AmdModule {
    pub llvm_ir: String,
    pub code_object: Vec<u8>,
    pub meta: metadata::KernelMeta,
    pub kernel: Kernel,
}

pub struct AmdBackend;

impl AmdBackend {
    /// The SIMT program a writer receives for `target`.
    pub fn simt(func: &Function, target: &'static TargetDesc) -> Result<Kernel, BackendError> {
        verify(func)?;
        let mut k = lower(func, target).map_err(|e| compile_err(func, e.to_string()))?;
        protocol::expand(&mut k);
        Ok(k)
    }

    /// LLVM IR for `func` on `target` (no LLVM tools needed).
    pub fn llvm_ir(func: &Function, target: &'static TargetDesc) -> Result<(Kernel, String), BackendError> {
        let k = Self::simt(func, target)?;
        let ir = llvm::write_llvm(&k, target.name).map_err(|e| compile_err(func, e.to_string()))?;
        Ok((k, ir))
    }

    /// The code object, checked (`metadata::check`): a kernel that fails a check is a compile
    /// error naming every failed check.
    pub fn compile_checked(func: &Function, target: &'static TargetDesc) -> Result<AmdModule, BackendError> {
        let (kernel, llvm_ir) = Self::llvm_ir(func, target)?;
        let tools = codeobj::tools().map_err(|e| compile_err(func, e.to_string()))?;
        let code_object = codeobj::code_object(&tools, &llvm_ir, &kernel.name, target.name)
            .map_err(|e| compile_err(func, e.to_string()))?;
        let elf = metadata::read_elf(&code_object).map_err(|e| compile_err(func, e))?;
        let meta = metadata::check(&elf, &kernel, target.shared_bytes)
            .map_err(|bad| compile_err(func, format!("code object check failed: {}", bad.join("; "))))?;
        Ok(AmdModule { llvm_ir, code_object, meta, kernel })
    }
}

fn compile_err(func: &Function, message: String) -> BackendError {
    BackendError::Compile { backend: NAME, kernel: func.name.clone(), message }
}

impl Backend for AmdBackend {
    fn descriptor(&self) -> &'static BackendDescriptor {
        trident_core::backend::lookup(NAME).expect("the amd backend registers itself in this crate")
    }

    fn compile(&self, func: &Function, target: Option<&str>) -> Result<Artifact, BackendError> {
        let name = self.descriptor().resolve_target(target)?;
        let desc = trident_core::target::lookup(name).map_err(|e| compile_err(func, e.to_string()))?;
        let m = Self::compile_checked(func, desc)?;
        let text = m.llvm_ir.clone();
        Ok(Artifact::new(func, NAME, name, text, Arc::new(m)))
    }

    fn open_device(&self, _index: usize) -> Result<Arc<dyn Device>, BackendError> {
        match hip::HipDevice::open(_index) {
            Ok(d) => Ok(Arc::new(d)),
            Err(BackendError::NoDevice { reason, .. }) => {
                let targets = trident_gpu_runtime::discovery::amd_targets();
                let seen = if targets.is_empty() {
                    "no AMD GPU on this machine (PCI, KFD topology)".to_string()
                } else {
                    format!("{} present", targets.join(", "))
                };
                Err(BackendError::NoDevice { backend: NAME, reason: format!("{seen}; {reason}") })
            }
            Err(e) => Err(e),
        }
    }
}

/// Keeps this crate's registration in a binary that reaches it only through the registry.
#[inline(never)]
pub fn link() {
    std::hint::black_box(NAME);
}
