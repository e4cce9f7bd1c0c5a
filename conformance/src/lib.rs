//! trident-conformance: the cross-backend suite (`trident test`, `trident ops`, `trident math`).
//!
//! Every kernel x dtype x shape runs through its host orchestration on a backend's device and is
//! checked against an f64 host reference computed from the same (rounded) random inputs, with
//! outputs poisoned first. Inputs come from a fresh seed per run (printed; `--seed` replays).

mod cases;
pub mod cli;
pub mod commands;
pub mod dist_bench;
pub mod distributed;
pub mod host;
pub mod npy;
pub mod ops;
pub mod progress;
pub mod reference;
pub mod registry;
pub mod suite;

/// Registers the backends this suite can run on (call first in every binary).
pub fn link_backends() {
    trident_backend_cpu::link();
    trident_backend_cpu::simt_exec::link();
    trident_backend_nvidia::link();
    trident_backend_amd::link();
}
