//! Worlds of threads on NVIDIA GPUs, run by the shared GPU runtime (`trident_gpu_runtime::GpuWorld`,
//! which owns heaps, barrier, diagnostics and the stream-wait watchdog) over [`CudaDevice`]'s
//! `Driver` implementation: the loopback world (N ranks on the process's GPU 0) and the peer
//! world (one rank per GPU of the node, peer access between every pair).
//!
//! The process's context is made with modules loaded eagerly and every hardware queue CUDA
//! allows (`CudaDevice::open`: `CUDA_MODULE_LOADING=EAGER`, `CUDA_DEVICE_MAX_CONNECTIONS=32`,
//! unless set): a lazy load cannot happen while another rank's kernel spins
//! (`probes/loopback-signals`), and every stream of a world needs a queue of its own, so one GPU
//! holds at most 16 ranks of 2 streams (`trident_gpu_runtime::queues`). The device is opened
//! once per process and shared by every world (a module is JIT-compiled once per process, not
//! once per world).

use crate::runtime::CudaDevice;
use std::sync::{Arc, Mutex};
use trident_core::backend::BackendError;
use trident_core::world::RankCtx;
pub use trident_gpu_runtime::GpuWorldOptions;

/// The process's device `index`, opened once (worlds, the Python package and the command line
/// share it: a module is loaded once per process).
pub fn device_at(index: usize) -> Result<Arc<CudaDevice>, BackendError> {
    static DEVICES: Mutex<Vec<(usize, Arc<CudaDevice>)>> = Mutex::new(Vec::new());
    let mut d = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, dev)) = d.iter().find(|(i, _)| *i == index) {
        return Ok(dev.clone());
    }
    let dev = Arc::new(CudaDevice::open(index)?);
    d.push((index, dev.clone()));
    Ok(dev)
}

/// The device of the process of local rank `local_rank` in a world of processes: device
/// `local_rank` modulo the devices present (several ranks share a GPU when there are fewer
/// GPUs than ranks on the node).
pub fn local_device(local_rank: usize) -> Result<Arc<CudaDevice>, BackendError> {
    device_at(local_rank % CudaDevice::count()?.max(1))
}

/// Runs SPMD host code on N ranks of one GPU, or one rank per GPU.
pub struct GpuWorld;

impl GpuWorld {
    /// Refuses, before anything is allocated, a world of `opts` this machine cannot run (the
    /// loopback world, or with `peer` the peer world): a device left unusable, or more streams
    /// on a GPU than it has hardware queues (`trident_gpu_runtime::GpuWorld::check`).
    pub fn check(opts: &GpuWorldOptions, peer: bool) -> Result<(), BackendError> {
        let g = if peer { Self::peer_devices(opts.ranks)? } else { 1 };
        let devices = (0..g).map(device_at).collect::<Result<Vec<_>, _>>()?;
        trident_gpu_runtime::GpuWorld::check(&devices, opts)
    }

    /// The loopback world: every rank on GPU 0.
    pub fn run<T: Send + 'static>(
        opts: GpuWorldOptions,
        host: impl Fn(&dyn RankCtx) -> Result<T, BackendError> + Send + Sync + 'static,
    ) -> Result<Vec<T>, BackendError> {
        trident_gpu_runtime::GpuWorld::run(vec![device_at(0)?], opts, host)
    }

    /// The peer world: rank `r` on GPU `r % g`, where `g` is the smaller of the ranks and the
    /// GPUs present (one rank per GPU when there are enough; ranks share GPUs otherwise, as in
    /// the loopback world), with peer access enabled between every pair of those GPUs.
    pub fn run_peer<T: Send + 'static>(
        opts: GpuWorldOptions,
        host: impl Fn(&dyn RankCtx) -> Result<T, BackendError> + Send + Sync + 'static,
    ) -> Result<Vec<T>, BackendError> {
        let g = Self::peer_devices(opts.ranks)?;
        let devices = (0..g).map(device_at).collect::<Result<Vec<_>, _>>()?;
        trident_gpu_runtime::GpuWorld::run(devices, opts, host)
    }

    /// How many GPUs a peer world of `ranks` ranks spreads over on this machine.
    pub fn peer_devices(ranks: usize) -> Result<usize, BackendError> {
        Ok(ranks.clamp(1, CudaDevice::count()?))
    }
}
