//! trident-gpu-runtime: what every GPU world needs, written once against a small [`Driver`]
//! trait that each vendor crate implements (all FFI stays in the vendor crates' `runtime`/`hip`
//! modules).
//!
//! Owns: the world of ranks on GPUs ([`world::GpuWorld`]: one host thread per rank, each rank's
//! symmetric heap and the `__heap_bases` table, its streams counted against the device's
//! hardware queues ([`queues`]), loading every kernel on every rank before any rank launches it,
//! residency of waiting kernels, driver calls that never return ending the world instead of
//! hanging it, and devices left unusable by stuck work ([`health`])), the host barrier a failing rank breaks
//! ([`barrier`]), the names of live allocations and the decoding of a timed-out wait's record
//! into an error ([`diagnostics`]), the watchdog of stream waits ([`watchdog`]) and the hidden
//! buffers of single-device launches ([`hidden`]), and the rendezvous of a world of processes
//! ([`rendezvous`]: bounded barriers and all-gathers that know who is missing or dead), and the
//! world of processes built on it ([`process_world::ProcessWorld`]: one rank per process, the
//! symmetric heap from a vendor library). Also the launch policy every driver applies
//! ([`launch_grid`]: persistent grids sized to what is resident, waiting and cooperative grids
//! refused unless resident whole) and the discovery of the machine's GPUs without a vendor
//! runtime ([`discovery`]). It does not own code generation (the backends), the launch ABI
//! (`trident_core::abi`) nor the host API of a rank (`trident_core::world::RankCtx`).

pub mod barrier;
pub mod diagnostics;
pub mod discovery;
pub mod driver;
pub mod first_launch;
pub mod health;
pub mod hidden;
mod host_calls;
pub mod launch_log;
pub mod process_world;
pub mod queues;
pub mod rendezvous;
pub mod submit;
pub mod watchdog;
pub mod world;
pub mod world_env;

/// Whether the environment variable `name` is `1`, read once into `cell` (a switch a process
/// sets before it starts: `TRIDENT_LOG_LAUNCHES`, `TRIDENT_CONCURRENT_SUBMITS`).
pub(crate) fn env_switch(cell: &'static std::sync::OnceLock<bool>, name: &str) -> bool {
    *cell.get_or_init(|| std::env::var(name).is_ok_and(|v| v == "1"))
}

pub use driver::{check_resident, launch_grid, persistent_grid, Driver, RawStream};
pub use health::DeviceHealth;
pub use process_world::{ProcessWorld, RankSession, SymmetricHeap};
pub use queues::HardwareQueues;
pub use world::{GpuWorld, GpuWorldOptions};
