//! trident-conformance: the cross-backend suite.
//!
//! Every kernel x dtype x shape runs through its host orchestration on a backend's device and is
//! checked against an f64 host reference computed from the same (rounded) random inputs, with
//! outputs poisoned first. Inputs come from a fresh seed per run (printed; `--seed` replays).

pub mod cases;
pub mod distributed;
pub mod host;
pub mod reference;

// The backends this suite can run on: linking them registers them.
use trident_backend_cpu as _;
