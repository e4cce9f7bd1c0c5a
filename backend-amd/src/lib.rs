//! trident-backend-amd: the AMD CDNA backend.
//!
//! Owns today: the targets ([`target`]: gfx90a and gfx942, registered for the shared lowering
//! and `cpu-simt`, which runs the AMD lowering at wave 64 with MFMA atoms on the host). The LLVM
//! IR writer, the code objects and the HIP runtime are the next issue's; until then no `amd`
//! backend is registered, so `--backend amd` is a typed "unknown backend" error.

pub mod target;

/// Keeps this crate's registrations in a binary that reaches them only through the registries.
#[inline(never)]
pub fn link() {
    std::hint::black_box(target::NAMES);
}
