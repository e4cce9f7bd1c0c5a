//! trident-backend-cpu: the reference backend.
//!
//! It interprets the tile IR on the host, one op over a whole tile at a time. It is what CI and
//! every laptop run, and it is adversarial where the execution model allows freedom: the
//! programs of an independent launch run in a seeded random order, masked-off lanes of a load
//! without `other` read as NaN, and every memory access is checked against its buffer, with
//! errors that name the program and the op.
//!
//! Owns: [`CpuBackend`] (registered as `cpu`), the device memory model ([`memory`]) and the
//! interpreter ([`interp`]). Multi-rank worlds, cooperative scheduling and delayed visibility
//! build on these.

pub mod device;
pub mod interp;
pub mod memory;
pub mod race;
pub mod sched;
pub mod shared_race;
pub mod simt_exec;
pub mod value;
pub mod view;
pub mod world;

use std::sync::Arc;
use trident_core::backend::{Artifact, Backend, BackendDescriptor, BackendError, Device};
use trident_core::{text, verify, Function};

pub use device::CpuDevice;

/// The backend's registered name.
pub const NAME: &str = "cpu";

inventory::submit! {
    BackendDescriptor {
        name: NAME,
        description: "reference interpreter of the tile IR on the host (no GPU needed)",
        targets: trident_core::backend::Targets::Host(&["interp"]),
        create: || Box::new(CpuBackend),
    }
}

/// The reference backend.
pub struct CpuBackend;

impl Backend for CpuBackend {
    fn descriptor(&self) -> &'static BackendDescriptor {
        trident_core::backend::lookup(NAME).expect("the cpu backend registers itself in this crate")
    }

    fn compile(&self, func: &Function, target: Option<&str>) -> Result<Artifact, BackendError> {
        let target = self.descriptor().resolve_target(target)?;
        verify(func)?;
        let text = text::print(func);
        Ok(Artifact::new(func, NAME, target, text, Arc::new(func.clone())))
    }

    fn open_device(&self, _index: usize) -> Result<Arc<dyn Device>, BackendError> {
        Ok(Arc::new(CpuDevice::default()))
    }
}

/// Keeps this backend's registration in a binary that reaches it only through the registry:
/// `inventory` entries live in this module's object code, which the linker drops unless
/// something in it is referenced. Call it once from `main`.
#[inline(never)]
pub fn link() {
    std::hint::black_box(NAME);
}
