//! A world of processes: one rank per process (`trident launch`, torchrun, Slurm, mpirun), the
//! same SPMD host code (`RankCtx`) as the worlds of threads in `crate::world`.
//!
//! The vendor layer brings the symmetric heap ([`SymmetricHeap`]: NVSHMEM's `nvshmem_malloc`
//! with `nvshmem_ptr` to every peer on NVIDIA) and the rendezvous connection; this module
//! builds the rest as the thread world does (`__heap_bases` from the peers' addresses as this
//! process maps them, wait diagnostics, the stream-wait watchdog) and puts every host barrier
//! through the rendezvous, which is bounded and knows a rank that died. `barrier_all`'s words
//! live in the reserved start of every rank's heap, as in the thread world.

use crate::driver::Driver;
use crate::host_calls::HostCalls;
use crate::rendezvous::Client;
use crate::world::{create_streams, free_owned, GpuRank, GpuWorld, GpuWorldOptions, HostSync, Shared, RESERVED};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use trident_core::abi::diag;
use trident_core::backend::{BackendError, Buffer};
use trident_core::world::RankCtx;

/// A symmetric heap made by a vendor library: the same size on every rank, each rank's heap
/// reachable by load and store from this process.
#[derive(Clone, Debug)]
pub struct SymmetricHeap {
    /// Every rank's heap at the address this process reaches it (its own at its rank).
    pub bases: Vec<u64>,
    pub bytes: usize,
    /// What made it, for reports ("NVSHMEM 3.4.5").
    pub provider: String,
}

/// This process's rank of a world of processes, ready to run host code.
pub struct ProcessWorld<D: Driver> {
    shared: Arc<Shared<D>>,
    rank: usize,
    provider: String,
}

impl<D: Driver> ProcessWorld<D> {
    /// Rank `rank` of `heap.bases.len()` ranks on `device`, which `sharing` ranks (this one
    /// included) use; host barriers through `rendezvous`.
    pub fn new(
        device: Arc<D>,
        rank: usize,
        sharing: u32,
        heap: SymmetricHeap,
        rendezvous: Client,
        mut opts: GpuWorldOptions,
    ) -> Result<ProcessWorld<D>, BackendError> {
        let n = heap.bases.len();
        if rank >= n || rendezvous.size != n || rendezvous.rank != rank {
            return Err(BackendError::Host(format!(
                "rank {rank}: the symmetric heap has {n} ranks, the rendezvous {} (as rank {})",
                rendezvous.size, rendezvous.rank
            )));
        }
        crate::world::require_aligned_heaps(&heap.provider, heap.bases.iter().copied())?;
        if heap.bytes <= RESERVED {
            return Err(BackendError::Host(format!("a symmetric heap of {} bytes is too small", heap.bytes)));
        }
        opts.ranks = n;
        // The process has a context of its own, whose queues its one rank's streams share.
        GpuWorld::check(std::slice::from_ref(&device), &GpuWorldOptions { ranks: 1, ..opts.clone() })?;
        device.bind()?;
        let mut owned = Vec::new();
        let made = (|| {
            let d = device.alloc(8 * diag::WORDS, &format!("__wait_diagnostics@rank{rank}"))?;
            owned.push((0, d.clone()));
            device.fill(&d, &[0])?;
            let t = device.alloc(8 * n, "__heap_bases")?;
            owned.push((0, t.clone()));
            let bases: Vec<u8> = heap.bases.iter().flat_map(|b| b.to_le_bytes()).collect();
            device.write(&t, 0, &bases)?;
            let streams = create_streams(&*device, opts.streams_per_rank)?;
            Ok((d, t, streams))
        })();
        let (diag_buf, table, streams) = match made {
            Ok(p) => p,
            Err(e) => {
                free_owned(std::slice::from_ref(&device), &owned);
                return Err(e);
            }
        };
        let heaps = heap
            .bases
            .iter()
            .enumerate()
            .map(|(r, &address)| Buffer { name: format!("heap@rank{r}"), address, bytes: heap.bytes })
            .collect();
        let shared = Shared {
            devices: vec![device],
            opts,
            first: rank,
            heaps,
            reserved: RESERVED,
            tables: vec![table],
            diags: vec![diag_buf],
            streams: vec![streams],
            next: Mutex::new(vec![RESERVED]),
            symmetric: Mutex::new(Vec::new()),
            kernels: Mutex::new(HashMap::new()),
            sharing: vec![sharing.max(1)],
            owned,
            calls: HostCalls::new(1),
            sync: HostSync::Processes(Mutex::new(rendezvous)),
            first_launches: crate::first_launch::FirstLaunches::default(),
            submits: vec![Default::default()],
        };
        Ok(ProcessWorld { shared: Arc::new(shared), rank, provider: heap.provider })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.shared.opts.ranks
    }

    /// What made the symmetric heap ("NVSHMEM 3.4.5").
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// Runs `host` as this process's rank, with a fresh symmetric allocator (whose buffers name
    /// signals in diagnostics from then on): every rank starts it together (after clearing its
    /// `barrier_all` words) and, when it succeeded, ends it together. A rank that fails returns
    /// at once; the others learn it at their next rendezvous operation (or their kernels'
    /// bounded waits), never by hanging. A driver call that never returns ends the process
    /// with its diagnostic on stderr (`crate::health::exit`): the launcher names the rank.
    pub fn run<T>(&self, host: &dyn Fn(&dyn RankCtx) -> Result<T, BackendError>) -> Result<T, BackendError> {
        let sh = &self.shared;
        let (stop, watch) = self.start("run_start")?;
        let r = GpuRank::new(sh.clone(), self.rank).run(host);
        stop.store(true, Ordering::Relaxed);
        let _ = watch.join();
        let r = r?;
        sh.sync.wait(self.rank, "run_end")?;
        Ok(r)
    }

    /// Starts a session: what [`ProcessWorld::run`] does around its host code, with the host
    /// code being whatever the caller does with [`RankSession::ctx`] until
    /// [`RankSession::end`] (the Python package: each library op called from PyTorch is a
    /// call on the session's context, from the calling thread). Collective, as `run`.
    pub fn session(&self) -> Result<RankSession<D>, BackendError> {
        let (stop, watch) = self.start("session_start")?;
        Ok(RankSession { rank: GpuRank::new(self.shared.clone(), self.rank), stop, watch: Some(watch) })
    }

    /// What starts a run or a session: the device usable and bound, `barrier_all`'s words
    /// cleared, a fresh symmetric allocator, every rank met (at `what`), and the watchdog of
    /// driver calls started (stopped through the flag it returns).
    fn start(&self, what: &str) -> Result<(Arc<AtomicBool>, std::thread::JoinHandle<()>), BackendError> {
        let sh = &self.shared;
        sh.devices[0].health().check(&sh.devices[0].device_name())?;
        sh.devices[0].bind()?;
        let words = Buffer { name: "__barrier_all".into(), address: sh.heaps[self.rank].address, bytes: RESERVED };
        sh.devices[0].write(&words, 0, &[0u8; RESERVED])?;
        sh.reset_symmetric();
        sh.sync.wait(self.rank, what)?;
        let stop = Arc::new(AtomicBool::new(false));
        let watch = {
            let (sh, stop) = (sh.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(o) = sh.calls.overdue() {
                        let rank = sh.first + o.local;
                        sh.devices[0].health().wedge(format!("rank {rank}: {}", o.message));
                        eprintln!("trident: rank {rank}: {}", o.message);
                        crate::health::exit(1);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        Ok((stop, watch))
    }

    /// Every rank's `data`, by rank (bounded, through the rendezvous).
    pub fn all_gather(&self, name: &str, data: &[u8]) -> Result<Vec<Vec<u8>>, BackendError> {
        match &self.shared.sync {
            HostSync::Processes(c) => c
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .all_gather(name, data)
                .map_err(|e| BackendError::Host(e.to_string())),
            HostSync::Threads(_) => Err(BackendError::Host("not a world of processes".into())),
        }
    }
}

/// A rank's open session of a world of processes ([`ProcessWorld::session`]).
pub struct RankSession<D: Driver> {
    rank: GpuRank<D>,
    stop: Arc<AtomicBool>,
    watch: Option<std::thread::JoinHandle<()>>,
}

impl<D: Driver> RankSession<D> {
    /// The rank's context: SPMD host code, called from any thread of the process.
    pub fn ctx(&self) -> &dyn RankCtx {
        &self.rank
    }

    /// Ends the session: waits for the rank's streams, frees its own buffers, then meets the
    /// other ranks (bounded).
    pub fn end(mut self) -> Result<(), BackendError> {
        let r = self.rank.run(&|_| Ok(()));
        self.stop_watch();
        r?;
        self.rank.shared.sync.wait(trident_core::world::RankCtx::rank(&self.rank), "session_end")
    }

    fn stop_watch(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(w) = self.watch.take() {
            let _ = w.join();
        }
    }
}

impl<D: Driver> Drop for RankSession<D> {
    fn drop(&mut self) {
        self.stop_watch();
    }
}

impl<D: Driver> Drop for ProcessWorld<D> {
    fn drop(&mut self) {
        self.shared.release();
    }
}
