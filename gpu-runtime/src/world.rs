//! A world of ranks on GPUs: one host thread per rank, each with its own streams, running the
//! same SPMD host code as the CPU world (`RankCtx`).
//!
//! Each rank has its own symmetric heap (one allocation, bump-allocated identically on every
//! rank), and `__heap_bases` holds every rank's heap address for `symm_at`. Rank `r` lives on
//! device `r % devices`: several ranks on one GPU make the loopback world, which tests signal
//! protocols with the instructions multi-GPU runs use (every cross-rank operation is at system
//! scope); one rank per GPU with peer access makes the peer world (`Driver::enable_peer`).
//!
//! Rules that keep ranks that signal each other from hanging (`probes/loopback-signals`): every
//! rank loads a kernel before any rank launches it (a host barrier after the first compile of
//! each kernel), and a kernel that waits is refused when its grid times the ranks sharing the
//! GPU cannot be resident at once (`Driver::launch_on`); every stream of the world is created
//! when it starts and needs a hardware queue of its own (`crate::queues`: a world that would
//! need more is refused before it starts). Kernel waits are bounded on the device and reported
//! by `synchronize` from the rank's diagnostics record, which names the kernel (by the tag the
//! lowering writes) and the signal (by the symmetric buffer at its offset, on any rank); stream
//! waits are bounded by the watchdog (`watchdog`); every call into the driver is marked
//! (`crate::host_calls`), and the thread that runs the world ends it with a diagnostic when
//! one never returns. A rank that fails breaks the host barrier, so no rank waits for it.

use crate::barrier::HostBarrier;
use crate::diagnostics::wait_error;
use crate::driver::{Driver, RawStream};
use crate::first_launch::{FirstLaunches, FIRST_LAUNCH_MEET};
use crate::host_calls::HostCalls;
use crate::queues::check_queues;
use crate::watchdog::{self, StreamWait};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use trident_core::abi::{diag, HiddenArgs};
use trident_core::backend::{check_launch, Artifact, Backend, BackendError, Buffer, KernelArg};
use trident_core::ir::CmpOp;
use trident_core::world::{RankCtx, StreamId};
use trident_core::{Function, VerifyError};

#[derive(Clone, Debug)]
pub struct GpuWorldOptions {
    pub ranks: usize,
    /// Bound of every wait inside a kernel.
    pub wait_bound: Duration,
    /// How long `synchronize` lets a stream stay blocked (stream waits, long kernels) before it
    /// reports and releases the stream's waits.
    pub stream_wait_bound: Duration,
    /// Streams each rank may use (ids `0..streams_per_rank`), all created when the world
    /// starts: each needs a hardware queue of its own (`crate::queues`), so a world whose ranks
    /// would need more than their device has is refused before it starts. 2 by default: a
    /// compute stream and a communication stream, what the library's operations use.
    pub streams_per_rank: usize,
    /// How long one call into the driver (a copy, a free, a module load) may take before the
    /// world gives up on it with a diagnostic (`crate::host_calls`); `synchronize` may take two
    /// stream-wait bounds more.
    pub host_call_bound: Duration,
    /// Bytes of symmetric heap per rank.
    pub heap_bytes: usize,
}

impl GpuWorldOptions {
    pub fn new(ranks: usize) -> GpuWorldOptions {
        let bound = trident_core::backend::default_wait_bound();
        // Stream waits outlast the kernels they wait for (at least 5 kernel wait bounds), unless
        // `TRIDENT_STREAM_WAIT_BOUND_MS` says otherwise (tests that plant stuck stream waits).
        let stream_wait_bound = std::env::var("TRIDENT_STREAM_WAIT_BOUND_MS")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|ms| *ms > 0)
            .map_or(Duration::from_secs(10).max(bound * 5), Duration::from_millis);
        GpuWorldOptions {
            ranks,
            wait_bound: bound,
            stream_wait_bound,
            streams_per_rank: 2,
            host_call_bound: stream_wait_bound,
            heap_bytes: 64 << 20,
        }
    }
}

/// Symmetric heaps are carved in units of this many bytes (any access of the heap is aligned).
pub(crate) const HEAP_GRAIN: usize = trident_core::world::SYMMETRIC_ALIGN;

/// `symm_at` keeps what is known of a pointer's alignment up to `SYMMETRIC_ALIGN`: every
/// rank's heap (`bases`, in rank order, made by `provider`) must start at a multiple of it.
pub(crate) fn require_aligned_heaps(provider: &str, bases: impl Iterator<Item = u64>) -> Result<(), BackendError> {
    match bases.enumerate().find(|(_, b)| !b.is_multiple_of(HEAP_GRAIN as u64)) {
        Some((r, base)) => Err(BackendError::Host(format!(
            "{provider}'s symmetric heap of rank {r} starts at {base:#x}, not a multiple of {HEAP_GRAIN} bytes (what `symm_at` assumes of every heap)"
        ))),
        None => Ok(()),
    }
}

/// Bytes at the start of every rank's heap kept from symmetric allocations: `barrier_all`'s
/// words (`trident_core::abi::BARRIER_WORDS`), at the same offset on every rank.
pub(crate) const RESERVED: usize = HEAP_GRAIN;

/// How often the thread that runs a world of threads looks for a driver call that overran.
const SUPERVISION_TICK: Duration = Duration::from_millis(20);

/// A live symmetric buffer: offset in every heap, bytes, name without the rank.
type Symmetric = (usize, usize, String);

pub(crate) struct Shared<D: Driver> {
    pub(crate) devices: Vec<Arc<D>>,
    pub(crate) opts: GpuWorldOptions,
    /// The first rank this process runs: 0 in a world of threads, the process's rank in a
    /// world of processes (`crate::process_world`), which runs one.
    pub(crate) first: usize,
    /// Every rank's heap, at the address this process reaches it.
    pub(crate) heaps: Vec<Buffer>,
    /// Bytes at the start of every heap that symmetric allocations do not use.
    pub(crate) reserved: usize,
    /// `__heap_bases` of every device (the heap addresses, the same table on each).
    pub(crate) tables: Vec<Buffer>,
    /// The wait diagnostics of the ranks this process runs (from `first`).
    pub(crate) diags: Vec<Buffer>,
    /// The streams of the ranks this process runs (from `first`), ids `0..streams_per_rank`,
    /// created when the world started.
    pub(crate) streams: Vec<Vec<RawStream>>,
    /// Next free byte of the heaps of the ranks this process runs (identical on all ranks in
    /// SPMD code).
    pub(crate) next: Mutex<Vec<usize>>,
    /// The live symmetric buffers (the same on every rank), which name signals in diagnostics;
    /// forgotten when the allocator starts over, so a reused offset is named by its new buffer.
    pub(crate) symmetric: Mutex<Vec<Symmetric>>,
    /// The names of the kernels compiled in this world, by `diag::kernel_tag`.
    pub(crate) kernels: Mutex<HashMap<u64, String>>,
    /// Ranks sharing each local rank's device (a waiting launch must fit beside theirs).
    pub(crate) sharing: Vec<u32>,
    /// Every allocation above with the index of the device that owns it (freed at the end).
    pub(crate) owned: Vec<(usize, Buffer)>,
    /// The driver call each local rank is in (`crate::host_calls`).
    pub(crate) calls: HostCalls,
    pub(crate) sync: HostSync,
    /// Where ranks sharing a device meet before each kernel's first launch
    /// (`crate::first_launch`).
    pub(crate) first_launches: FirstLaunches,
    /// One submission at a time per device where ranks share it (`crate::submit`).
    pub(crate) submits: Vec<crate::submit::SubmitLock>,
}

/// How the hosts of a world meet: threads at a barrier that a failing rank breaks, or
/// processes at the launcher's rendezvous (bounded, and told at once of a rank that died).
pub(crate) enum HostSync {
    Threads(HostBarrier),
    Processes(Mutex<crate::rendezvous::Client>),
}

impl HostSync {
    pub(crate) fn wait(&self, rank: usize, what: &str) -> Result<(), BackendError> {
        match self {
            HostSync::Threads(b) => b.wait(rank),
            HostSync::Processes(c) => {
                c.lock().unwrap_or_else(|e| e.into_inner()).barrier(what).map_err(|e| BackendError::Host(e.to_string()))
            }
        }
    }

    fn abandon(&self, why: String) {
        // A process that fails ends, and its closed connection tells the rendezvous.
        if let HostSync::Threads(b) = self {
            b.abandon(why);
        }
    }

    /// The first failure of a world of threads, if a rank failed.
    fn why(&self) -> Option<String> {
        match self {
            HostSync::Threads(b) => b.why(),
            HostSync::Processes(_) => None,
        }
    }
}

impl<D: Driver> Shared<D> {
    fn device(&self, rank: usize) -> &Arc<D> {
        &self.devices[rank % self.devices.len()]
    }

    fn local(&self, rank: usize) -> usize {
        rank - self.first
    }

    /// "`name@rankR`[i]" for the 8-byte word at `address`: a symmetric buffer of any rank's
    /// heap, else a buffer of `device`, else the address in hex.
    fn describe(&self, device: &D, address: u64) -> String {
        let symmetric = self.symmetric.lock().unwrap_or_else(|e| e.into_inner());
        for (r, h) in self.heaps.iter().enumerate() {
            if address < h.address + self.reserved as u64 || address >= h.address + h.bytes as u64 {
                continue;
            }
            let off = (address - h.address) as usize;
            if let Some((o, _, name)) =
                symmetric.iter().filter(|(o, b, _)| off >= *o && off < o + b).min_by_key(|(_, b, _)| *b)
            {
                return format!("`{name}@rank{r}`[{}]", (off - o) / 8);
            }
        }
        device.allocations().describe_word(address)
    }

    /// Starts the symmetric allocator over (a world of processes, at each run).
    pub(crate) fn reset_symmetric(&self) {
        *self.next.lock().unwrap_or_else(|e| e.into_inner()) = vec![self.reserved; self.diags.len()];
        self.symmetric.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Frees what the world allocated and destroys its streams, on every device still usable
    /// (a device marked unusable keeps them: freeing would wait for its stuck work).
    pub(crate) fn release(&self) {
        for (local, streams) in self.streams.iter().enumerate() {
            let dev = self.device(self.first + local);
            if !dev.health().is_wedged() {
                streams.iter().for_each(|s| dev.stream_destroy(*s));
            }
        }
        free_owned(&self.devices, &self.owned);
    }
}

/// Frees `owned` (buffers with their device's index) on the devices still usable; the names of
/// the symmetric buffers carved from a heap go with it.
pub(crate) fn free_owned<D: Driver>(devices: &[Arc<D>], owned: &[(usize, Buffer)]) {
    for (d, b) in owned {
        if devices[*d].health().is_wedged() {
            continue;
        }
        devices[*d].allocations().remove_within(b.address, b.bytes);
        let _ = devices[*d].free(b);
    }
}

/// Creates `count` streams on `device`, or destroys those made and fails.
pub(crate) fn create_streams<D: Driver>(device: &D, count: usize) -> Result<Vec<RawStream>, BackendError> {
    let mut made = Vec::with_capacity(count);
    for _ in 0..count {
        match device.stream_create() {
            Ok(s) => made.push(s),
            Err(e) => {
                made.into_iter().for_each(|s| device.stream_destroy(s));
                return Err(e);
            }
        }
    }
    Ok(made)
}

/// Runs SPMD host code on the ranks of a world of GPUs.
pub struct GpuWorld;

impl GpuWorld {
    /// Refuses, before anything is allocated, a world of `opts` on `devices` that cannot run:
    /// a size outside 1..=64, no device, a device an earlier world left unusable, or more
    /// streams on a device than it has hardware queues (`crate::queues`).
    pub fn check<D: Driver>(devices: &[Arc<D>], opts: &GpuWorldOptions) -> Result<(), BackendError> {
        let n = opts.ranks;
        if n == 0 || n > 64 {
            return Err(BackendError::Host(format!("a GPU world has 1..=64 ranks, not {n}")));
        }
        if devices.is_empty() {
            return Err(BackendError::Host("a GPU world needs at least one device".into()));
        }
        if opts.streams_per_rank == 0 {
            return Err(BackendError::Host("a GPU world needs at least one stream per rank".into()));
        }
        for (d, dev) in devices.iter().enumerate() {
            let name = format!("{} (device {d})", dev.device_name());
            dev.health().check(&name)?;
            let ranks = (0..n).filter(|r| r % devices.len() == d).count();
            check_queues(&name, ranks, opts.streams_per_rank, &dev.hardware_queues())?;
        }
        Ok(())
    }

    /// Runs `host` on `opts.ranks` ranks, rank `r` on `devices[r % devices.len()]`, and returns
    /// every rank's result, or the first rank's error. A driver call of a rank that overruns
    /// `opts.host_call_bound` ends the world with its diagnostic (the rank's thread is left
    /// behind, the device marked unusable).
    pub fn run<D: Driver, T: Send + 'static>(
        devices: Vec<Arc<D>>,
        opts: GpuWorldOptions,
        host: impl Fn(&dyn RankCtx) -> Result<T, BackendError> + Send + Sync + 'static,
    ) -> Result<Vec<T>, BackendError> {
        Self::check(&devices, &opts)?;
        let n = opts.ranks;
        for (i, a) in devices.iter().enumerate() {
            for (j, b) in devices.iter().enumerate() {
                if i != j {
                    a.enable_peer(b)?;
                }
            }
        }
        let nd = devices.len();
        let mut made: Vec<(usize, Buffer)> = Vec::new();
        let mut streams: Vec<Vec<RawStream>> = Vec::new();
        let parts = (|| {
            let mut alloc = |owner: usize, bytes: usize, name: String| -> Result<Buffer, BackendError> {
                let d = &devices[owner];
                d.bind()?;
                let b = d.alloc(bytes, &name)?;
                made.push((owner, b.clone()));
                // Fresh allocations may hold an earlier world's bytes: a stale diagnostics flag
                // would abort every wait, and symmetric memory starts zeroed.
                d.fill(&b, &[0])?;
                Ok(b)
            };
            let heaps: Vec<Buffer> = (0..n)
                .map(|r| {
                    let bytes = RESERVED + opts.heap_bytes.next_multiple_of(HEAP_GRAIN);
                    alloc(r % nd, bytes, format!("heap@rank{r}"))
                })
                .collect::<Result<_, _>>()?;
            // The drivers' allocations are at least 256-byte aligned: checked, not assumed.
            require_aligned_heaps("the driver", heaps.iter().map(|h| h.address))?;
            let diags: Vec<Buffer> = (0..n)
                .map(|r| alloc(r % nd, 8 * diag::WORDS, format!("__wait_diagnostics@rank{r}")))
                .collect::<Result<_, _>>()?;
            let tables: Vec<Buffer> =
                (0..nd).map(|d| alloc(d, 8 * n, format!("__heap_bases@device{d}"))).collect::<Result<_, _>>()?;
            let bases: Vec<u8> = heaps.iter().flat_map(|h| h.address.to_le_bytes()).collect();
            for (d, t) in tables.iter().enumerate() {
                devices[d].write(t, 0, &bases)?;
            }
            // Every stream of the world now, in rank order, so that each is counted against
            // its device's queues before any work can wait.
            for r in 0..n {
                let d = &devices[r % nd];
                d.bind()?;
                streams.push(create_streams(&**d, opts.streams_per_rank)?);
            }
            Ok((heaps, tables, diags))
        })();
        let (heaps, tables, diags) = match parts {
            Ok(p) => p,
            Err(e) => {
                for (r, s) in streams.iter().enumerate() {
                    s.iter().for_each(|x| devices[r % nd].stream_destroy(*x));
                }
                free_owned(&devices, &made);
                return Err(e);
            }
        };
        let shared = Arc::new(Shared {
            devices: devices.clone(),
            opts: opts.clone(),
            first: 0,
            heaps,
            reserved: RESERVED,
            tables,
            diags,
            streams,
            next: Mutex::new(vec![RESERVED; n]),
            symmetric: Mutex::new(Vec::new()),
            kernels: Mutex::new(HashMap::new()),
            sharing: (0..n).map(|r| (0..n).filter(|q| q % nd == r % nd).count() as u32).collect(),
            sync: HostSync::Threads(HostBarrier::new(n)),
            first_launches: FirstLaunches::default(),
            submits: (0..nd).map(|_| Default::default()).collect(),
            calls: HostCalls::new(n),
            owned: made,
        });
        let host = Arc::new(host);
        let (tx, rx) = mpsc::channel();
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let (shared, host, tx) = (shared.clone(), host.clone(), tx.clone());
                std::thread::spawn(move || {
                    let ctx = GpuRank::new(shared, rank);
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ctx.run(&*host)))
                        .unwrap_or_else(|_| Err(BackendError::Host("host thread panicked".into())));
                    if let Err(e) = &r {
                        ctx.shared.sync.abandon(format!("rank {rank} failed: {e}"));
                    }
                    let _ = tx.send((rank, r));
                })
            })
            .collect();
        drop(tx);
        let mut results: Vec<Option<Result<T, BackendError>>> = (0..n).map(|_| None).collect();
        let mut left = n;
        while left > 0 {
            match rx.recv_timeout(SUPERVISION_TICK) {
                Ok((rank, r)) => {
                    results[rank] = Some(r);
                    left -= 1;
                }
                Err(RecvTimeoutError::Timeout) => {
                    if let Some(o) = shared.calls.overdue() {
                        // The stuck thread keeps its share of the world; nothing is freed.
                        let rank = shared.first + o.local;
                        shared.device(rank).health().wedge(format!("rank {rank}: {}", o.message));
                        // A call stuck behind work that never finishes is often the consequence
                        // of an earlier failure (a rank that left with its peers' waits
                        // unsatisfied): name that first failure too.
                        let message = match shared.sync.why() {
                            Some(why) => format!("{} (before it, the world had failed: {why})", o.message),
                            None => o.message,
                        };
                        shared.sync.abandon(format!("rank {rank} is stuck in the driver"));
                        return Err(BackendError::Rank { rank, error: Box::new(BackendError::Host(message)) });
                    }
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        for h in handles {
            let _ = h.join();
        }
        shared.release();
        let mut out = Vec::with_capacity(n);
        for (rank, r) in results.into_iter().enumerate() {
            match r.unwrap_or_else(|| Err(BackendError::Host("host thread ended without a result".into()))) {
                Ok(v) => out.push(v),
                Err(e) => return Err(BackendError::Rank { rank, error: Box::new(e) }),
            }
        }
        Ok(out)
    }
}

/// What was enqueued on one stream since the last `synchronize`, for the diagnostic of a
/// stream that stays busy: how many operations, and the last few.
#[derive(Default)]
struct Enqueued {
    count: usize,
    last: VecDeque<String>,
}

impl Enqueued {
    const KEPT: usize = 4;

    fn push(&mut self, what: String) {
        self.count += 1;
        if self.last.len() == Self::KEPT {
            self.last.pop_front();
        }
        self.last.push_back(what);
    }

    fn describe(&self) -> String {
        if self.count == 0 {
            return "nothing enqueued since the last synchronize".into();
        }
        let last: Vec<&str> = self.last.iter().map(String::as_str).collect();
        let more = if self.count > last.len() {
            format!(" (the last {} of {})", last.len(), self.count)
        } else {
            String::new()
        };
        format!("enqueued since the last synchronize{more}: {}", last.join(", "))
    }
}

/// One rank's context (`RankCtx`) in either world.
pub(crate) struct GpuRank<D: Driver> {
    pub(crate) shared: Arc<Shared<D>>,
    rank: usize,
    compiled: Mutex<HashMap<String, Artifact>>,
    /// The kernels this rank has launched (`crate::first_launch`).
    launched: Mutex<HashSet<String>>,
    /// Stream waits enqueued since the last `synchronize`.
    pending: Mutex<Vec<StreamWait>>,
    /// What each stream was given since the last `synchronize`.
    enqueued: Mutex<Vec<Enqueued>>,
    /// This rank's own buffers (`RankCtx::alloc`), freed when its host code ends.
    private: Mutex<Vec<Buffer>>,
    /// Timing events recorded on its streams (`RankCtx::stream_mark`), and events made for
    /// marks before and free again (`clear_marks`: marks of later repetitions take them, so
    /// that no event is created while work is timed); all released when its host code ends.
    marks: Mutex<(Vec<u64>, Vec<u64>)>,
}

fn in_buffer(buffer: &Buffer, offset: usize, len: usize) -> Result<u64, BackendError> {
    if offset.checked_add(len).is_none_or(|e| e > buffer.bytes) {
        return Err(BackendError::Buffer {
            buffer: buffer.name.clone(),
            message: format!("{len} bytes at {offset} overrun {} bytes", buffer.bytes),
        });
    }
    Ok(buffer.address + offset as u64)
}

impl<D: Driver> GpuRank<D> {
    pub(crate) fn new(shared: Arc<Shared<D>>, rank: usize) -> GpuRank<D> {
        let streams = shared.opts.streams_per_rank;
        GpuRank {
            shared,
            rank,
            compiled: Mutex::new(HashMap::new()),
            launched: Mutex::new(HashSet::new()),
            pending: Mutex::new(Vec::new()),
            enqueued: Mutex::new((0..streams).map(|_| Enqueued::default()).collect()),
            private: Mutex::new(Vec::new()),
            marks: Mutex::new((Vec::new(), Vec::new())),
        }
    }

    /// Runs `host` on this rank, then waits for its streams (whatever `host` returned) and
    /// frees its own buffers.
    pub(crate) fn run<T>(&self, host: &dyn Fn(&dyn RankCtx) -> Result<T, BackendError>) -> Result<T, BackendError> {
        let r = self.device().bind().and_then(|()| host(self));
        // The others learn of a failure at once (their barriers break), before this rank waits
        // for its streams and frees its buffers, which may block behind their work.
        if let Err(e) = &r {
            self.shared.sync.abandon(format!("rank {} failed: {e}", self.rank));
        }
        let done = self.synchronize();
        if let Err(e) = &done {
            self.shared.sync.abandon(format!("rank {} failed: {e}", self.rank));
        }
        let dev = self.device();
        if !dev.health().is_wedged() {
            let (used, spare) = std::mem::take(&mut *self.marks.lock().unwrap_or_else(|e| e.into_inner()));
            for ev in used.into_iter().chain(spare) {
                dev.event_release(ev);
            }
            for b in self.private.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
                let _ = self.call(|| format!("free of `{}`", b.name), || dev.free(&b));
            }
        }
        r.and_then(|v| done.map(|_| v))
    }

    fn device(&self) -> &D {
        self.shared.device(self.rank)
    }

    /// Whether other ranks of this world of threads share this rank's device (one context:
    /// a process's is its own).
    fn shares_context(&self) -> bool {
        self.shared.sharing[self.local()] > 1 && matches!(self.shared.sync, HostSync::Threads(_))
    }

    /// The device's submission lock, held where ranks of this world of threads share it
    /// (`crate::submit`).
    fn submitting(&self) -> Option<std::sync::MutexGuard<'_, ()>> {
        let sh = &self.shared;
        sh.submits[self.rank % sh.devices.len()].hold(self.shares_context())
    }

    fn local(&self) -> usize {
        self.shared.local(self.rank)
    }

    /// `f`, a call into the driver, marked as this rank's call `what` (`crate::host_calls`).
    fn call<T>(&self, what: impl FnOnce() -> String, f: impl FnOnce() -> T) -> T {
        let limit = self.shared.opts.host_call_bound;
        self.shared.calls.run(self.local(), || format!("rank {}: {}", self.rank, what()), limit, f)
    }

    fn streams(&self) -> &[RawStream] {
        &self.shared.streams[self.local()]
    }

    fn stream(&self, id: StreamId) -> Result<RawStream, BackendError> {
        self.streams().get(id).copied().ok_or_else(|| {
            BackendError::Host(format!(
                "rank {} asked for stream {id}: this world gives each rank streams 0..{} (GpuWorldOptions::streams_per_rank)",
                self.rank,
                self.streams().len()
            ))
        })
    }

    /// Notes that `what` was enqueued on stream `id`.
    fn enqueued(&self, id: StreamId, what: String) {
        if let Some(e) = self.enqueued.lock().unwrap_or_else(|e| e.into_inner()).get_mut(id) {
            e.push(what);
        }
    }

    /// Drains every stream within the stream-wait bound; a stream still busy then has its
    /// unsatisfied waits named and released (`watchdog`), and a stream busy even after that
    /// leaves the device unusable. Then reads the rank's wait record.
    fn drain_and_check(&self) -> Result<(), BackendError> {
        let dev = self.device();
        // Stuck work of this world (or an earlier one) made the device unusable: say so at once
        // instead of waiting the bounds again.
        dev.health().check(&dev.device_name())?;
        let streams = self.streams();
        // A stream being captured into a graph (by the application, e.g. torch.cuda.graph) has
        // run nothing yet, and querying it would invalidate the capture: refuse, query nothing.
        for (id, s) in streams.iter().enumerate() {
            if dev.stream_capturing(*s)? {
                return Err(BackendError::Host(format!(
                    "rank {}: synchronize while stream {id} is being captured into a graph: not capturable (the watchdog does not query a capturing stream; end the capture, then synchronize)",
                    self.rank
                )));
            }
        }
        let bound = self.shared.opts.stream_wait_bound;
        let deadline = Instant::now() + bound;
        for (id, s) in streams.iter().enumerate() {
            if !watchdog::drain(dev, *s, deadline)? {
                let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
                let busy = std::mem::take(&mut *self.enqueued.lock().unwrap_or_else(|e| e.into_inner()));
                let what = busy.get(id).map(Enqueued::describe).unwrap_or_default();
                let e = watchdog::release_stuck(dev, self.rank, id, &pending, streams, bound, &what);
                *self.enqueued.lock().unwrap_or_else(|e| e.into_inner()) =
                    (0..streams.len()).map(|_| Enqueued::default()).collect();
                if streams.iter().any(|s| !dev.stream_idle(*s).unwrap_or(false)) {
                    dev.health().wedge(format!("rank {}, stream {id} never finished its work ({what})", self.rank));
                }
                return Err(e);
            }
        }
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.enqueued.lock().unwrap_or_else(|e| e.into_inner()).iter_mut().for_each(|e| *e = Enqueued::default());
        let d = &self.shared.diags[self.local()];
        let mut raw = vec![0u8; d.bytes];
        dev.read(d, 0, &mut raw)?;
        let kernel = |tag| {
            let kernels = self.shared.kernels.lock().unwrap_or_else(|e| e.into_inner());
            kernels.get(&tag).cloned().unwrap_or_else(|| format!("a kernel of rank {}", self.rank))
        };
        let r = wait_error(&raw, self.shared.opts.wait_bound, &kernel, &|address| self.shared.describe(dev, address));
        if r.is_err() {
            dev.write(d, 0, &vec![0u8; d.bytes])?;
        }
        r
    }
}

impl<D: Driver> RankCtx for GpuRank<D> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.opts.ranks
    }

    fn ranks_sharing_device(&self) -> usize {
        self.shared.sharing[self.local()] as usize
    }

    fn topology(&self) -> String {
        let transport = if self.shared.streams.len() < self.shared.opts.ranks {
            "processes"
        } else if self.ranks_sharing_device() > 1 {
            "loopback"
        } else {
            "peer"
        };
        format!("{} / {transport}", self.device().device_name())
    }

    fn backend(&self) -> &dyn Backend {
        self.device().compiler()
    }

    fn target(&self) -> Option<String> {
        self.device().target()
    }

    fn resident_programs(&self, kernel: &Artifact) -> Result<Option<u64>, BackendError> {
        let sharing = self.ranks_sharing_device().max(1) as u64;
        Ok(Driver::resident_programs(self.device(), kernel)?.map(|r| (r / sharing).max(1)))
    }

    fn compile(&self, key: &str, build: &dyn Fn() -> Result<Function, VerifyError>) -> Result<Artifact, BackendError> {
        if let Some(a) = self.compiled.lock().unwrap_or_else(|e| e.into_inner()).get(key) {
            return Ok(a.clone());
        }
        let dev = self.device();
        let a = dev.compiler().compile(&build()?, dev.target().as_deref())?;
        // Every rank has enqueued what comes before this compile before any rank loads the
        // module: loading a module may wait for the device's running kernels, and a kernel
        // already launched here may wait for a peer's kernel that the peer would launch only
        // after its own compile (SPMD). Loading while a peer's launch is still to come held
        // that launch behind the load and the waiting kernel timed out.
        self.shared.sync.wait(self.rank, &format!("enqueued_{key}"))?;
        self.call(|| format!("load of kernel `{}`", a.kernel), || dev.load(&a))?;
        self.shared
            .kernels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(diag::kernel_tag(&a.kernel), a.kernel.clone());
        // Every rank has loaded the module before any rank launches it (SPMD: all compile it).
        self.shared.sync.wait(self.rank, &format!("load_{key}"))?;
        self.compiled.lock().unwrap_or_else(|e| e.into_inner()).insert(key.to_string(), a.clone());
        Ok(a)
    }

    fn alloc(&self, bytes: usize, name: &str) -> Result<Buffer, BackendError> {
        let name = format!("{name}@rank{}", self.rank);
        let b = self.call(|| format!("allocation of `{name}`"), || self.device().alloc(bytes.max(1), &name))?;
        self.private.lock().unwrap_or_else(|e| e.into_inner()).push(b.clone());
        Ok(b)
    }

    fn symm_alloc(&self, bytes: usize, name: &str) -> Result<Buffer, BackendError> {
        let mut next = self.shared.next.lock().unwrap_or_else(|e| e.into_inner());
        let here = self.local();
        let off = next[here];
        let end = off + bytes.max(1).next_multiple_of(HEAP_GRAIN);
        let (reserved, heap) = (self.shared.reserved, self.shared.heaps[self.rank].bytes);
        if end > heap {
            return Err(BackendError::Buffer {
                buffer: name.to_string(),
                message: format!(
                    "symmetric heap of {} bytes exhausted ({} used, {bytes} asked)",
                    heap - reserved,
                    off - reserved
                ),
            });
        }
        next[here] = end;
        drop(next);
        let b = Buffer {
            name: format!("{name}@rank{}", self.rank),
            address: self.shared.heaps[self.rank].address + off as u64,
            bytes,
        };
        // Symmetric buffers start zeroed on every rank, as in the CPU world, and carry their
        // name into wait diagnostics (every rank records the same buffer; once is enough).
        self.call(|| format!("zeroing of `{}`", b.name), || self.device().fill(&b, &[0]))?;
        {
            let mut symmetric = self.shared.symmetric.lock().unwrap_or_else(|e| e.into_inner());
            if !symmetric.iter().any(|(o, _, _)| *o == off) {
                symmetric.push((off, bytes, name.to_string()));
            }
        }
        // Collective, as `shmem_malloc`: no rank returns before every rank has zeroed its part,
        // so a peer's first write (a signal) cannot be wiped by the owner's zeroing. (Without
        // this the HIP stub's world test lost a signal written right after the allocation.)
        self.shared.sync.wait(self.rank, "symm_alloc")?;
        Ok(b)
    }

    fn peer(&self, buffer: &Buffer, rank: usize) -> Result<Buffer, BackendError> {
        let mine = &self.shared.heaps[self.rank];
        if rank >= self.world_size()
            || buffer.address < mine.address + self.shared.reserved as u64
            || buffer.address >= mine.address + mine.bytes as u64
        {
            return Err(BackendError::Buffer {
                buffer: buffer.name.clone(),
                message: format!("not a symmetric buffer, or rank {rank} out of range"),
            });
        }
        let off = buffer.address - mine.address;
        let base = buffer.name.rsplit_once('@').map_or(buffer.name.as_str(), |(n, _)| n);
        Ok(Buffer {
            name: format!("{base}@rank{rank}"),
            address: self.shared.heaps[rank].address + off,
            bytes: buffer.bytes,
        })
    }

    fn write(&self, buffer: &Buffer, offset: usize, data: &[u8]) -> Result<(), BackendError> {
        self.call(
            || format!("write of {} bytes to `{}`", data.len(), buffer.name),
            || self.device().write(buffer, offset, data),
        )
    }

    fn read(&self, buffer: &Buffer, offset: usize, out: &mut [u8]) -> Result<(), BackendError> {
        let len = out.len();
        self.call(|| format!("read of {len} bytes from `{}`", buffer.name), || self.device().read(buffer, offset, out))
    }

    fn launch(
        &self,
        stream: StreamId,
        kernel: &Artifact,
        grid: [u32; 3],
        args: &[KernelArg],
    ) -> Result<(), BackendError> {
        check_launch(kernel, grid, args, u64::MAX)?;
        let s = self.stream(stream)?;
        let (sh, r) = (&self.shared, self.rank);
        let table = &sh.tables[r % sh.devices.len()];
        let here = sh.local(r);
        // `barrier_all`'s words: the reserved start of this rank's heap.
        let words = sh.heaps[r].address;
        let hidden = HiddenArgs {
            rank: r,
            ranks: self.world_size(),
            heap_bases: table.address,
            diag: sh.diags[here].address,
            wait_bound: sh.opts.wait_bound,
            barrier: words,
        };
        // Ranks sharing a device meet before each kernel's first launch (threads only: a
        // process's context is its own).
        let t0 = std::time::Instant::now();
        let mut met = None;
        if self.shares_context()
            && self.launched.lock().unwrap_or_else(|e| e.into_inner()).insert(kernel.kernel.clone())
        {
            let key = format!("{}/{}", r % sh.devices.len(), kernel.kernel);
            met = Some(sh.first_launches.meet(&key, sh.sharing[here] as usize, FIRST_LAUNCH_MEET));
        }
        let what = format!("kernel `{}` (grid {grid:?})", kernel.kernel);
        let t1 = std::time::Instant::now();
        self.call(
            || format!("launch of {what} on stream {stream}"),
            || {
                let _one = self.submitting();
                self.device().launch_on(s, kernel, grid, args, &hidden, sh.sharing[here])
            },
        )?;
        crate::launch_log::note(r, stream, &kernel.kernel, met, t1 - t0, t1.elapsed());
        self.enqueued(stream, what);
        Ok(())
    }

    fn copy(
        &self,
        stream: StreamId,
        dst: &Buffer,
        dst_offset: usize,
        src: &Buffer,
        src_offset: usize,
        bytes: usize,
    ) -> Result<(), BackendError> {
        let (d, s) = (in_buffer(dst, dst_offset, bytes)?, in_buffer(src, src_offset, bytes)?);
        let st = self.stream(stream)?;
        let what = format!("copy of {bytes} bytes from `{}` to `{}`", src.name, dst.name);
        self.call(
            || format!("{what} on stream {stream}"),
            || {
                let _one = self.submitting();
                self.device().copy_async(st, d, s, bytes)
            },
        )?;
        self.enqueued(stream, what);
        Ok(())
    }

    fn write_signal(&self, stream: StreamId, signal: &Buffer, offset: usize, value: u64) -> Result<(), BackendError> {
        let a = in_buffer(signal, offset, 8)?;
        let st = self.stream(stream)?;
        let what = format!("signal write `{}`[{}] = {value}", signal.name, offset / 8);
        self.call(
            || format!("{what} on stream {stream}"),
            || {
                let _one = self.submitting();
                self.device().write_value(st, a, value)
            },
        )?;
        self.enqueued(stream, what);
        Ok(())
    }

    fn wait_signal(
        &self,
        stream: StreamId,
        signal: &Buffer,
        offset: usize,
        cmp: CmpOp,
        value: u64,
    ) -> Result<(), BackendError> {
        if !matches!(cmp, CmpOp::Ge | CmpOp::Eq) {
            return Err(BackendError::Host(format!("stream waits support ge and eq, not {cmp}")));
        }
        let a = in_buffer(signal, offset, 8)?;
        let st = self.stream(stream)?;
        let what = format!("stream wait `{}`[{}] {cmp} {value}", signal.name, offset / 8);
        self.call(
            || format!("{what} on stream {stream}"),
            || {
                let _one = self.submitting();
                self.device().wait_value(st, a, cmp, value)
            },
        )?;
        self.enqueued(stream, what);
        let w = StreamWait { stream, signal: signal.name.clone(), index: offset / 8, address: a, cmp, value };
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).push(w);
        Ok(())
    }

    fn stream_mark(&self, stream: StreamId) -> Result<Option<usize>, BackendError> {
        let st = self.stream(stream)?;
        let mut marks = self.marks.lock().unwrap_or_else(|e| e.into_inner());
        let ev = match marks.1.pop() {
            Some(ev) => ev,
            None => match self.call(|| "timing event".to_string(), || self.device().event_create())? {
                Some(ev) => ev,
                None => return Ok(None),
            },
        };
        marks.0.push(ev);
        self.call(|| format!("timing mark on stream {stream}"), || self.device().event_record(ev, st))?;
        Ok(Some(marks.0.len() - 1))
    }

    fn marks_elapsed_ms(&self, from: usize, to: usize) -> Result<f64, BackendError> {
        let marks = &self.marks.lock().unwrap_or_else(|e| e.into_inner()).0;
        let (Some(&a), Some(&b)) = (marks.get(from), marks.get(to)) else {
            return Err(BackendError::Host(format!(
                "rank {}: stream marks {from} and {to} asked for, {} recorded",
                self.rank,
                marks.len()
            )));
        };
        self.device().event_elapsed_ms(a, b)
    }

    fn clear_marks(&self) {
        let mut marks = self.marks.lock().unwrap_or_else(|e| e.into_inner());
        let used = std::mem::take(&mut marks.0);
        marks.1.extend(used);
    }

    fn synchronize(&self) -> Result<(), BackendError> {
        // Draining may take a stream-wait bound, and releasing stuck waits another.
        let o = &self.shared.opts;
        let limit = o.stream_wait_bound * 2 + o.host_call_bound;
        let what = || format!("rank {}: synchronize", self.rank);
        self.shared.calls.run(self.local(), what, limit, || self.drain_and_check())
    }

    fn barrier(&self) -> Result<(), BackendError> {
        self.shared.sync.wait(self.rank, "barrier")
    }

    fn follow_stream(&self, external: u64) -> Result<(), BackendError> {
        for (id, &s) in self.streams().iter().enumerate() {
            let what = || format!("stream {id} after the application's stream {external:#x}");
            self.call(what, || self.device().stream_wait_stream(s, external as RawStream))?;
        }
        Ok(())
    }

    fn join_stream(&self, external: u64) -> Result<(), BackendError> {
        for (id, &s) in self.streams().iter().enumerate() {
            let what = || format!("the application's stream {external:#x} after stream {id}");
            self.call(what, || self.device().stream_wait_stream(external as RawStream, s))?;
        }
        Ok(())
    }

    fn rearm_barrier_all(&self) -> Result<(), BackendError> {
        // The words live at the reserved start of every rank's heap; intra-node the ranks count
        // on rank 0's, inter-node each rank's third word: every rank clears its own.
        self.write(&self.shared.heaps[self.rank], 0, &[0u8; 8 * trident_core::abi::BARRIER_WORDS])
    }
}
