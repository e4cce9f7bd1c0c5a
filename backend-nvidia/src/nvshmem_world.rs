//! The NVSHMEM world on NVIDIA: one process per rank (started by `trident launch`, torchrun,
//! Slurm or mpirun), the symmetric heap from NVSHMEM, host code SPMD through `RankCtx` as in
//! the CPU and loopback worlds (`trident_gpu_runtime::ProcessWorld`).
//!
//! Joining: every rank reads its place from the environment (`WorldEnv`), connects to the
//! rendezvous, and tells the others whether it found CUDA and NVSHMEM (and which NVSHMEM):
//! all ranks then go on, or all stop with the same reason, so that a machine without NVSHMEM
//! skips everywhere instead of leaving some ranks waiting. Rank 0 makes NVSHMEM's unique id and
//! the rendezvous hands it to the others; after `nvshmemx_hostlib_init_attr` the heap comes
//! from `nvshmem_malloc` and every peer's copy from `nvshmem_ptr`. Ranks on the same GPU are
//! counted from everyone's host name and device, so that a waiting launch must fit beside
//! theirs (`check_resident`).
//!
//! Scope: communication lowers at intra-node scope (loads, stores and atomics through the
//! peers' heap addresses, as in the loopback world). A peer that `nvshmem_ptr` cannot reach
//! (another node) is refused at start-up with a typed error until the inter-node lowering
//! (NVSHMEM's device functions) exists.

use crate::nvshmem::{Nvshmem, UNIQUE_ID_BYTES};
use crate::runtime::{CudaDevice, DeviceLibrary};
use std::sync::Arc;
use trident_core::backend::BackendError;
use trident_core::world::RankCtx;
use trident_gpu_runtime::world_env::WorldEnv;
use trident_gpu_runtime::{GpuWorldOptions, ProcessWorld, SymmetricHeap};

/// The version every rank must run (the launcher's rendezvous checks it at start-up).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// This process's rank of an NVSHMEM world.
pub struct NvshmemWorld {
    world: ProcessWorld<CudaDevice>,
    nvshmem: Arc<Nvshmem>,
    heap: u64,
    device_ordinal: usize,
    /// NVSHMEM was initialised by someone else in this process (not finalised here).
    borrowed: bool,
}

impl std::fmt::Debug for NvshmemWorld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NvshmemWorld(rank {} of {}, NVSHMEM {})", self.rank(), self.size(), self.nvshmem.version)
    }
}

fn no_device(reason: String) -> BackendError {
    BackendError::NoDevice { backend: crate::NAME, reason }
}

fn host(e: impl std::fmt::Display) -> BackendError {
    BackendError::Host(e.to_string())
}

/// What one rank found: CUDA and NVSHMEM, or why not (`no device` reasons make everyone skip).
fn local_setup(local_rank: usize) -> Result<(Arc<CudaDevice>, Nvshmem), BackendError> {
    let device = crate::world::local_device(local_rank)?;
    let nvshmem = Nvshmem::open().map_err(|e| no_device(format!("NVSHMEM: {e}")))?;
    Ok((device, nvshmem))
}

impl NvshmemWorld {
    /// Joins the world of processes this process was started in (every rendezvous operation
    /// bounded by `WorldEnv::bound`). A machine without CUDA, a GPU or NVSHMEM gives
    /// `NoDevice` on every rank.
    pub fn join(opts: GpuWorldOptions) -> Result<NvshmemWorld, BackendError> {
        let env = WorldEnv::from_env().map_err(|e| {
            host(format!("{e}: start one process per rank, e.g. `trident launch -n 2 -- PROGRAM ARGS`"))
        })?;
        Self::join_at(env, opts)
    }

    /// Joins the world `env` describes (the Python package makes it from a `torch.distributed`
    /// process group: its rank, size and device, and a rendezvous whose address travelled
    /// over the group).
    pub fn join_at(env: WorldEnv, opts: GpuWorldOptions) -> Result<NvshmemWorld, BackendError> {
        let mut client = env.connect(VERSION, env.bound).map_err(host)?;
        let found = local_setup(env.local_rank);
        // Everyone's verdict, so that all ranks go on or all stop with the first reason.
        let mine = match &found {
            Ok((dev, lib)) => format!("ok NVSHMEM {} at {} on {}", lib.version, lib.path.display(), dev.name()),
            Err(e @ BackendError::NoDevice { .. }) => format!("skip {e}"),
            Err(e) => format!("fail {e}"),
        };
        let all = client.all_gather("nvshmem_found", mine.as_bytes()).map_err(host)?;
        let all: Vec<String> = all.iter().map(|b| String::from_utf8_lossy(b).into_owned()).collect();
        if let Some((r, why)) = all.iter().enumerate().find(|(_, s)| !s.starts_with("ok ")) {
            let why = why.split_once(' ').map_or(why.as_str(), |x| x.1);
            return Err(match found {
                // This rank's own reason first; else the first other rank's.
                Err(e) => e,
                Ok(_) if all[r].starts_with("skip ") => no_device(format!("rank {r}: {why}")),
                Ok(_) => host(format!("rank {r}: {why}")),
            });
        }
        let (device, nvshmem) = found?;
        let version = |s: &str| s.split_whitespace().nth(2).unwrap_or("").to_string();
        if let Some(r) = (0..all.len()).find(|&r| version(&all[r]) != version(&all[0])) {
            return Err(host(format!(
                "NVSHMEM versions differ: rank 0 has {}, rank {r} has {}",
                version(&all[0]),
                version(&all[r])
            )));
        }
        // Ranks sharing this GPU: the same host and device ordinal.
        let here = format!("{} {}", host_name(), device.ordinal());
        let places = client.all_gather("placement", here.as_bytes()).map_err(host)?;
        let sharing = places.iter().filter(|p| p.as_slice() == here.as_bytes()).count() as u32;
        // NVSHMEM initialised in this process already (torch's symmetric memory): used as it
        // is, if its PEs are this world's ranks; every rank must find the same.
        let borrowed = nvshmem.initialized();
        let flags = client.all_gather("nvshmem_borrowed", &[borrowed as u8]).map_err(host)?;
        if let Some(r) = flags.iter().position(|f| f.as_slice() != [borrowed as u8]) {
            return Err(host(format!(
                "rank {r} {} NVSHMEM initialised already and rank {} {}: initialise it in every process or in none",
                if borrowed { "has not" } else { "has" },
                env.rank,
                if borrowed { "has" } else { "has not" }
            )));
        }
        if borrowed && nvshmem.pe() != (env.rank, env.size) {
            let (pe, n) = nvshmem.pe();
            return Err(host(format!(
                "NVSHMEM was initialised in this process as PE {pe} of {n}, but this is rank {} of {}",
                env.rank, env.size
            )));
        }
        let id = if env.rank == 0 && !borrowed { nvshmem.unique_id().map_err(host)?.to_vec() } else { Vec::new() };
        let ids = client.all_gather("nvshmem_unique_id", &id).map_err(host)?;
        device.current()?;
        // NVLink multicast stays off (the project's rule, `DESIGN.md`): NVSHMEM reads this at
        // init; a value the user set is kept.
        if std::env::var_os("NVSHMEM_DISABLE_NVLS").is_none() {
            // SAFETY: set before NVSHMEM's init reads it; no other thread of the process reads
            // the environment while a world is joined.
            unsafe { std::env::set_var("NVSHMEM_DISABLE_NVLS", "1") };
        }
        if !borrowed {
            let id: [u8; UNIQUE_ID_BYTES] = ids[0]
                .as_slice()
                .try_into()
                .map_err(|_| host(format!("rank 0 sent a unique id of {} bytes", ids[0].len())))?;
            nvshmem.init(env.rank, env.size, &id).map_err(host)?;
        }
        let nvshmem = Arc::new(nvshmem);
        // Modules whose communication is at inter-node scope call NVSHMEM's device functions:
        // linked with the shim, registered with NVSHMEM once loaded.
        let arch = crate::nvshmem_shim::arch_of(device.arch());
        let bitcode = crate::nvshmem_shim::bitcode_beside(&nvshmem.path);
        let ptx =
            crate::nvshmem_shim::find_or_build(&nvshmem.version, &arch, bitcode.as_deref()).map_err(|e| e.to_string());
        let lib = nvshmem.clone();
        device.set_device_library(Arc::new(DeviceLibrary {
            name: format!("NVSHMEM {}", nvshmem.version),
            ptx,
            // SAFETY: the runtime registers modules it has just loaded, after this init.
            register: Box::new(move |m| unsafe { lib.cumodule_init(m.cast()) }.map_err(|e| e.to_string())),
        }));
        let bytes = opts.heap_bytes + 256;
        let heap = nvshmem.malloc(bytes).map_err(host)?;
        let bases = (0..env.size)
            .map(|pe| {
                nvshmem.peer(heap, pe).ok_or_else(|| {
                    host(format!(
                        "rank {}: rank {pe} is not reachable by load and store (another node); \
                         the inter-node lowering through NVSHMEM's device functions is not built yet",
                        env.rank
                    ))
                })
            })
            .collect::<Result<Vec<u64>, _>>()?;
        let heap_desc = SymmetricHeap { bases, bytes, provider: format!("NVSHMEM {}", nvshmem.version) };
        let device_ordinal = device.ordinal();
        let world = ProcessWorld::new(device, env.rank, sharing, heap_desc, client, opts)?;
        Ok(NvshmemWorld { world, nvshmem, heap, device_ordinal, borrowed })
    }

    pub fn rank(&self) -> usize {
        self.world.rank()
    }

    pub fn size(&self) -> usize {
        self.world.size()
    }

    /// "NVSHMEM 3.4.5".
    pub fn provider(&self) -> &str {
        self.world.provider()
    }

    /// Runs SPMD host code as this process's rank (see `ProcessWorld::run`).
    pub fn run<T>(&self, host: &dyn Fn(&dyn RankCtx) -> Result<T, BackendError>) -> Result<T, BackendError> {
        self.world.run(host)
    }

    /// Opens a session of this rank (`ProcessWorld::session`): library ops called one by one
    /// from the host (the Python package), each on the session's context.
    pub fn session(&self) -> Result<trident_gpu_runtime::RankSession<CudaDevice>, BackendError> {
        self.world.session()
    }

    /// The process's device.
    pub fn device_ordinal(&self) -> usize {
        self.device_ordinal
    }

    /// Every rank's `data`, by rank.
    pub fn all_gather(&self, name: &str, data: &[u8]) -> Result<Vec<Vec<u8>>, BackendError> {
        self.world.all_gather(name, data)
    }

    /// Ends the world: a bounded rendezvous barrier first (every rank is alive and done), then
    /// NVSHMEM's own collective teardown, which cannot time out and so never starts while a
    /// rank may be dead. Dropping without `finish` leaves NVSHMEM to the process's exit.
    pub fn finish(self) -> Result<(), BackendError> {
        let NvshmemWorld { world, nvshmem, heap, borrowed, .. } = self;
        world.all_gather("finish", &[])?;
        // Trident's own buffers go before NVSHMEM does.
        drop(world);
        nvshmem.free(heap);
        if !borrowed {
            nvshmem.finalize();
        }
        Ok(())
    }
}

/// This machine's name (ranks with the same name and device ordinal share a GPU).
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| std::env::var("HOSTNAME").unwrap_or_else(|_| "localhost".into()))
}
