//! The CPU world: N ranks in one process, one symmetric heap, the execution model enforced.
//!
//! Every rank's host function, stream and parked program is a task of one [`Sched`]: exactly one
//! runs at a time, and hand-overs at communication ops follow a seeded generator, so a run is a
//! function of its seed. Programs see memory through delayed views ([`ProgramView`]): relaxed
//! stores and non-blocking transfers become visible late, and loads after a missing acquire see
//! stale data. A wait parks its program; when nothing can run the world reports the deadlock with
//! every waiter's rank, launch, program, signal, expected value and last value seen. A program of
//! an independent launch whose wait was satisfied by a sibling program is reported as a contract
//! violation whichever order they ran in (parked programs let their siblings run, so the sibling
//! always gets to write the signal, and the signal's writer is recorded).

use crate::interp::{fault, Hooks, Program, ProgramCtx, WordTest, R};
use crate::memory::{Memory, Writer};
use crate::race::{Races, VClock};
use crate::sched::{Blocker, Sched, TaskId};
use crate::view::{ProgramView, RaceCtx};
use crate::CpuBackend;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use trident_core::backend::{check_launch, Artifact, Backend, BackendError, Buffer, KernelArg};
use trident_core::ir::CmpOp;
use trident_core::simt::Kernel;
use trident_core::world::{KernelCache, RankCtx, StreamId};
use trident_core::{Function, VerifyError};

/// How a world runs.
#[derive(Clone, Debug)]
pub struct WorldOptions {
    pub ranks: usize,
    /// Seeds the schedule, program orders and visibility delays.
    pub seed: u64,
    /// Probability that a yield point publishes part of a program's buffered stores or
    /// transfers early (0 = only at releases).
    pub chaos: f64,
    /// Record signal writes and completed waits.
    pub trace: bool,
    /// Most programs a cooperative launch may have (the CPU's "resident" limit).
    pub max_cooperative_programs: u64,
    /// Track happens-before with vector clocks and fail on the first data race.
    pub race: bool,
    /// Run kernels through the SIMT lowering (at this warp size) instead of the tile interpreter.
    pub simt_target: Option<&'static str>,
    /// Run on every kernel the world compiles (a second backend's compiler and checks).
    pub compile_check: Option<trident_core::backend::CompileCheck>,
    /// Device waits (kernel waits, `barrier_all`, stream waits) time out where the world would
    /// otherwise deadlock, as a GPU's bounded waits do: each fails its launch or stream with a
    /// diagnostic ("timed out: ...") and host code goes on (to re-arm the world, say). Off by
    /// default: a deadlock ends the world with the report of every waiter.
    pub timeouts: bool,
}

impl WorldOptions {
    pub fn new(ranks: usize, seed: u64) -> WorldOptions {
        WorldOptions {
            ranks,
            seed,
            chaos: 0.3,
            trace: false,
            max_cooperative_programs: 1024,
            race: false,
            simt_target: None,
            compile_check: None,
            timeouts: false,
        }
    }
}

/// Largest world the CPU backend runs.
pub const MAX_RANKS: usize = 64;

/// A recorded event (with [`WorldOptions::trace`]).
#[derive(Clone, Debug)]
pub enum TraceEvent {
    /// A signal was written into `rank`'s copy of symmetric buffer `buffer` at `index`.
    Signal { time: u64, rank: usize, buffer: String, index: usize, value: u64, by: String },
    /// A program's wait on `rank`'s own `buffer[index]` completed.
    WaitDone { time: u64, rank: usize, kernel: String, program: [u32; 3], buffer: String, index: usize },
}

/// What a world run returns: each rank's result, the trace, and the number of task switches.
pub struct WorldRun<T> {
    pub results: Vec<T>,
    pub trace: Vec<TraceEvent>,
    pub switches: u64,
}

struct SymAlloc {
    name: String,
    bytes: usize,
    addrs: Vec<u64>,
}

#[derive(Default)]
struct Symm {
    allocs: Vec<SymAlloc>,
    /// Memory slot -> (allocation, rank).
    by_slot: HashMap<usize, (usize, usize)>,
    /// How many symmetric allocations each rank has made.
    calls: Vec<usize>,
}

struct Inner {
    opts: WorldOptions,
    sched: Arc<Sched>,
    mem: Arc<Memory>,
    symm: Mutex<Symm>,
    barrier_arrived: AtomicUsize,
    barrier_generation: Arc<AtomicU64>,
    kernel_barriers: Mutex<HashMap<(String, u64, u64), Arc<AtomicU64>>>,
    trace: Mutex<Vec<TraceEvent>>,
    next_tag: AtomicU64,
    next_launch: AtomicU64,
    races: Option<Races>,
    barrier_clock: Mutex<VClock>,
    /// The `__barrier` words of lowered kernels' `barrier_all` (count, generation, arrivals),
    /// one symmetric allocation (every rank's at the same place of the map), by rank.
    barrier_words: Vec<u64>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Inner {
    /// Where a byte lives, for race reports.
    fn describe_byte(&self, addr: u64) -> String {
        match self.symmetric_place(addr) {
            Some((name, r, off)) => format!("`{name}` byte {off} on rank {r}"),
            None => {
                let v = self.mem.view();
                match v.locate(addr, 1) {
                    Ok((region, off)) => format!("`{}` byte {off}", region.name),
                    Err(_) => format!("{addr:#x}"),
                }
            }
        }
    }

    /// Race-checks `bytes` bytes at `addr` accessed by a stream or host task.
    fn race_bytes(&self, addr: u64, bytes: usize, write: bool, task: u64, clock: &VClock) -> Result<(), BackendError> {
        if let Some(races) = &self.races {
            for b in addr..addr + bytes as u64 {
                if let Some(report) = races.access(b, write, task, clock, &|| self.describe_byte(b)) {
                    return Err(BackendError::Host(report));
                }
            }
        }
        Ok(())
    }

    fn tag(&self) -> u64 {
        self.next_tag.fetch_add(1, Ordering::Relaxed)
    }

    /// (symmetric buffer name, rank, byte offset) of an address in the symmetric heap.
    fn symmetric_place(&self, addr: u64) -> Option<(String, usize, u64)> {
        let s = self.symm.lock().unwrap_or_else(|e| e.into_inner());
        let &(a, r) = s.by_slot.get(&Memory::slot_of(addr))?;
        let alloc = &s.allocs[a];
        Some((alloc.name.clone(), r, addr - alloc.addrs[r]))
    }

    fn describe_addr(&self, addr: u64) -> String {
        match self.symmetric_place(addr) {
            Some((name, r, off)) => format!("`{name}`[{}] on rank {r}", off / 8),
            None => format!("{addr:#x}"),
        }
    }

    fn record(&self, e: TraceEvent) {
        if self.opts.trace {
            self.trace.lock().unwrap_or_else(|e| e.into_inner()).push(e);
        }
    }

    fn record_signal(&self, addr: u64, value: u64, by: String) {
        if self.opts.trace {
            if let Some((buffer, rank, off)) = self.symmetric_place(addr) {
                let time = self.mem.now();
                self.record(TraceEvent::Signal { time, rank, buffer, index: (off / 8) as usize, value, by });
            }
        }
    }

    /// A readiness test for `signal <cmp> value` on every address (newest values).
    fn signals_ready(mem: &Memory, addrs: &[u64], test: WordTest) -> bool {
        let view = mem.view();
        addrs.iter().all(|&a| view.locate(a, 8).map(|(r, o)| test.holds(r.load(o, 8))).unwrap_or(false))
    }
}

/// What a rank's host task left: its result, or nothing if it never finished.
type RankResult<T> = Option<Result<T, BackendError>>;

/// Runs SPMD host code on a world of CPU ranks.
pub struct CpuWorld;

impl CpuWorld {
    /// Runs `host` once per rank and returns every rank's result, or the first rank's error
    /// (a deadlock's report names every waiter).
    pub fn run<T: Send + 'static>(
        opts: WorldOptions,
        host: impl Fn(&dyn RankCtx) -> Result<T, BackendError> + Send + Sync + 'static,
    ) -> Result<WorldRun<T>, BackendError> {
        if opts.ranks == 0 || opts.ranks > MAX_RANKS {
            return Err(BackendError::Host(format!("a CPU world has 1..={MAX_RANKS} ranks, not {}", opts.ranks)));
        }
        let sched = if opts.timeouts { Sched::new_timing_out(opts.seed) } else { Sched::new(opts.seed) };
        let races = opts.race.then(Races::default);
        let mem = Arc::new(Memory::default());
        // `barrier_all`'s words: symmetric (the intra-node lowering reaches rank 0's with
        // `symm_at`, the inter-node one signals every rank's), made before any rank's own.
        let barrier_words: Vec<u64> = (0..opts.ranks)
            .map(|r| mem.alloc(&format!("__barrier@rank{r}"), 8 * trident_core::abi::BARRIER_WORDS))
            .collect::<Result<_, _>>()
            .map_err(|e| BackendError::Host(e.0))?;
        let symm = Symm {
            by_slot: barrier_words.iter().enumerate().map(|(r, a)| (Memory::slot_of(*a), (0, r))).collect(),
            allocs: vec![SymAlloc {
                name: "__barrier".into(),
                bytes: 8 * trident_core::abi::BARRIER_WORDS,
                addrs: barrier_words.clone(),
            }],
            // The first allocation of every rank is the world's (`__barrier`).
            calls: vec![1; opts.ranks],
        };
        let inner = Arc::new(Inner {
            symm: Mutex::new(symm),
            opts,
            sched: sched.clone(),
            mem,
            barrier_words,
            barrier_arrived: AtomicUsize::new(0),
            barrier_generation: Arc::new(AtomicU64::new(0)),
            kernel_barriers: Mutex::new(HashMap::new()),
            trace: Mutex::new(Vec::new()),
            next_tag: AtomicU64::new(1),
            next_launch: AtomicU64::new(1),
            races,
            barrier_clock: Mutex::new(VClock::default()),
        });
        let n = inner.opts.ranks;
        let results: Arc<Mutex<Vec<RankResult<T>>>> = Arc::new(Mutex::new((0..n).map(|_| None).collect()));
        let host = Arc::new(host);
        for rank in 0..n {
            let (inner2, results2, host2) = (inner.clone(), results.clone(), host.clone());
            let spawned = sched.spawn(format!("rank{rank}-host"), move |task| {
                let ctx = CpuRank::new(inner2, rank, task);
                let r = host2(&ctx);
                // Host code ends with its streams drained, like a process exiting after a sync.
                let done = ctx.finish();
                let r = match (r, done) {
                    (Ok(v), Ok(())) => Ok(v),
                    (Err(e), _) | (Ok(_), Err(e)) => Err(e),
                };
                results2.lock().unwrap_or_else(|e| e.into_inner())[rank] = Some(r);
            });
            spawned.map_err(BackendError::Host)?;
        }
        let (abort, switches) = sched.run_to_completion();
        let mut out = Vec::with_capacity(n);
        let mut first_err = None;
        let slots = std::mem::take(&mut *results.lock().unwrap_or_else(|e| e.into_inner()));
        for (rank, r) in slots.into_iter().enumerate() {
            match r {
                Some(Ok(v)) => out.push(v),
                Some(Err(e)) => {
                    first_err.get_or_insert(BackendError::Rank { rank, error: Box::new(e) });
                }
                None => {
                    first_err.get_or_insert(BackendError::Rank {
                        rank,
                        error: Box::new(BackendError::Host(
                            abort.clone().unwrap_or_else(|| "host task did not finish".into()),
                        )),
                    });
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        let trace = std::mem::take(&mut *inner.trace.lock().unwrap_or_else(|e| e.into_inner()));
        Ok(WorldRun { results: out, trace, switches })
    }
}

enum StreamOp {
    Launch { kernel: Artifact, grid: [u32; 3], args: Vec<KernelArg> },
    Copy { dst: u64, src: u64, bytes: usize },
    WriteSignal { addr: u64, value: u64 },
    WaitSignal { addr: u64, cmp: CmpOp, value: u64 },
}

struct Stream {
    id: StreamId,
    rank: usize,
    tag: u64,
    /// Each op with the enqueuing host's clock (race detection).
    queue: Mutex<VecDeque<(StreamOp, VClock)>>,
    clock: Mutex<VClock>,
    outstanding: AtomicUsize,
    closed: AtomicBool,
    error: Mutex<Option<BackendError>>,
}

impl Stream {
    fn fail(&self, e: BackendError) {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e);
    }

    fn failed(&self) -> bool {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }
}

/// One rank's context, living in its host task.
struct CpuRank {
    inner: Arc<Inner>,
    rank: usize,
    task: TaskId,
    tag: u64,
    streams: Mutex<Vec<Arc<Stream>>>,
    cache: KernelCache,
    backend: Box<dyn Backend>,
    target: Option<&'static str>,
    clock: Mutex<VClock>,
}

fn host_err(e: String) -> BackendError {
    BackendError::Host(e)
}

impl CpuRank {
    fn new(inner: Arc<Inner>, rank: usize, task: TaskId) -> CpuRank {
        let tag = inner.tag();
        if let Some(r) = &inner.races {
            r.label(tag, format!("rank {rank} host"));
        }
        let backend: Box<dyn Backend> = match inner.opts.simt_target {
            Some(_) => Box::new(crate::simt_exec::SimtBackend),
            None => Box::new(CpuBackend),
        };
        let backend: Box<dyn Backend> = match inner.opts.compile_check.clone() {
            Some(check) => Box::new(trident_core::backend::Checked { inner: backend, check }),
            None => backend,
        };
        let target = inner.opts.simt_target;
        CpuRank {
            inner,
            rank,
            task,
            tag,
            streams: Mutex::new(Vec::new()),
            cache: KernelCache::default(),
            backend,
            target,
            clock: Mutex::new(VClock::default()),
        }
    }

    fn writer(&self) -> Writer {
        Writer { task: self.tag, launch: 0, rank: self.rank as u32, program: [0; 3] }
    }

    fn yield_now(&self) -> Result<(), BackendError> {
        self.inner.sched.yield_now(self.task).map_err(host_err)
    }

    fn stream(&self, id: StreamId) -> Result<Arc<Stream>, BackendError> {
        if id >= 64 {
            return Err(host_err(format!("stream {id}: a rank has streams 0..64")));
        }
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = streams.iter().find(|s| s.id == id) {
            return Ok(s.clone());
        }
        let s = Arc::new(Stream {
            id,
            rank: self.rank,
            tag: self.inner.tag(),
            queue: Mutex::new(VecDeque::new()),
            clock: Mutex::new(VClock::default()),
            outstanding: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            error: Mutex::new(None),
        });
        if let Some(r) = &self.inner.races {
            r.label(s.tag, format!("rank {} stream {id}", self.rank));
        }
        let (inner, s2) = (self.inner.clone(), s.clone());
        self.inner
            .sched
            .spawn(format!("rank{}-stream{id}", self.rank), move |task| stream_task(inner, s2, task))
            .map_err(host_err)?;
        streams.push(s.clone());
        Ok(s)
    }

    fn enqueue(&self, stream: StreamId, op: StreamOp) -> Result<(), BackendError> {
        let s = self.stream(stream)?;
        let clock = lock(&self.clock).clone();
        lock(&s.queue).push_back((op, clock));
        s.outstanding.fetch_add(1, Ordering::AcqRel);
        self.yield_now()
    }

    fn checked(&self, buffer: &Buffer, offset: usize, len: usize) -> Result<u64, BackendError> {
        if offset.checked_add(len).is_none_or(|end| end > buffer.bytes) {
            return Err(BackendError::Buffer {
                buffer: buffer.name.clone(),
                message: format!("{len} bytes at offset {offset} overrun its {} bytes", buffer.bytes),
            });
        }
        Ok(buffer.address + offset as u64)
    }

    fn finish(&self) -> Result<(), BackendError> {
        let r = self.synchronize();
        for s in self.streams.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            s.closed.store(true, Ordering::Release);
        }
        r
    }
}

impl RankCtx for CpuRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn target(&self) -> Option<String> {
        self.target.map(str::to_string)
    }

    fn world_size(&self) -> usize {
        self.inner.opts.ranks
    }

    fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    fn compile(&self, key: &str, build: &dyn Fn() -> Result<Function, VerifyError>) -> Result<Artifact, BackendError> {
        self.cache.get_or_compile(self.backend.as_ref(), self.target, key, build)
    }

    fn alloc(&self, bytes: usize, name: &str) -> Result<Buffer, BackendError> {
        let name = format!("{name}@rank{}", self.rank);
        let address = self
            .inner
            .mem
            .alloc(&name, bytes.max(1))
            .map_err(|e| BackendError::Buffer { buffer: name.clone(), message: e.0 })?;
        Ok(Buffer { name, address, bytes })
    }

    fn symm_alloc(&self, bytes: usize, name: &str) -> Result<Buffer, BackendError> {
        let mut s = self.inner.symm.lock().unwrap_or_else(|e| e.into_inner());
        let k = s.calls[self.rank];
        s.calls[self.rank] += 1;
        if k == s.allocs.len() {
            let mut addrs = Vec::with_capacity(self.world_size());
            for r in 0..self.world_size() {
                let a = self
                    .inner
                    .mem
                    .alloc(&format!("{name}@rank{r}"), bytes.max(1))
                    .map_err(|e| BackendError::Buffer { buffer: name.to_string(), message: e.0 })?;
                addrs.push(a);
            }
            let index = s.allocs.len();
            for (r, a) in addrs.iter().enumerate() {
                s.by_slot.insert(Memory::slot_of(*a), (index, r));
            }
            s.allocs.push(SymAlloc { name: name.to_string(), bytes, addrs });
        }
        let a = &s.allocs[k];
        if a.bytes != bytes || a.name != name {
            return Err(host_err(format!(
                "symmetric allocation #{}: rank {} asks for `{name}` of {bytes} bytes, another rank made `{}` of {} bytes (every rank must allocate the same buffers in the same order)",
                k - 1,
                self.rank,
                a.name,
                a.bytes
            )));
        }
        Ok(Buffer { name: format!("{name}@rank{}", self.rank), address: a.addrs[self.rank], bytes })
    }

    fn peer(&self, buffer: &Buffer, rank: usize) -> Result<Buffer, BackendError> {
        if rank >= self.world_size() {
            return Err(host_err(format!("rank {rank} is outside the world of {} ranks", self.world_size())));
        }
        let s = self.inner.symm.lock().unwrap_or_else(|e| e.into_inner());
        let (a, _) = *s.by_slot.get(&Memory::slot_of(buffer.address)).ok_or_else(|| BackendError::Buffer {
            buffer: buffer.name.clone(),
            message: "not a symmetric buffer (use symm_alloc)".into(),
        })?;
        let alloc = &s.allocs[a];
        // A view of part of a symmetric buffer (a half of a double buffer) keeps its offset.
        let off = buffer
            .address
            .checked_sub(alloc.addrs[self.rank()])
            .filter(|o| o + buffer.bytes as u64 <= alloc.bytes as u64);
        let Some(off) = off else {
            return Err(BackendError::Buffer {
                buffer: buffer.name.clone(),
                message: format!("not inside this rank's copy of symmetric buffer `{}`", alloc.name),
            });
        };
        Ok(Buffer { name: format!("{}@rank{rank}", alloc.name), address: alloc.addrs[rank] + off, bytes: buffer.bytes })
    }

    fn write(&self, buffer: &Buffer, offset: usize, data: &[u8]) -> Result<(), BackendError> {
        let addr = self.checked(buffer, offset, data.len())?;
        self.inner.race_bytes(addr, data.len(), true, self.tag, &lock(&self.clock))?;
        self.inner
            .mem
            .publish_bytes(addr, data, self.writer())
            .map_err(|e| BackendError::Buffer { buffer: buffer.name.clone(), message: e.0 })
    }

    fn read(&self, buffer: &Buffer, offset: usize, out: &mut [u8]) -> Result<(), BackendError> {
        let addr = self.checked(buffer, offset, out.len())?;
        self.inner.race_bytes(addr, out.len(), false, self.tag, &lock(&self.clock))?;
        self.inner
            .mem
            .read_bytes(addr, out)
            .map_err(|e| BackendError::Buffer { buffer: buffer.name.clone(), message: e.0 })
    }

    fn launch(
        &self,
        stream: StreamId,
        kernel: &Artifact,
        grid: [u32; 3],
        args: &[KernelArg],
    ) -> Result<(), BackendError> {
        let ours =
            kernel.payload.downcast_ref::<Function>().is_some() || kernel.payload.downcast_ref::<Kernel>().is_some();
        if !ours {
            return Err(BackendError::WrongBackend {
                kernel: kernel.kernel.clone(),
                compiled_by: kernel.backend,
                device: "cpu",
            });
        }
        check_launch(kernel, grid, args, crate::device::MAX_PROGRAMS)?;
        let total = grid.iter().map(|&g| g as u64).product::<u64>();
        if kernel.attrs.cooperative && total > self.inner.opts.max_cooperative_programs {
            return Err(BackendError::Launch {
                kernel: kernel.kernel.clone(),
                message: format!(
                    "cooperative launch of {total} programs: at most {} can be resident at once",
                    self.inner.opts.max_cooperative_programs
                ),
            });
        }
        self.enqueue(stream, StreamOp::Launch { kernel: kernel.clone(), grid, args: args.to_vec() })
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
        let d = self.checked(dst, dst_offset, bytes)?;
        let s = self.checked(src, src_offset, bytes)?;
        self.enqueue(stream, StreamOp::Copy { dst: d, src: s, bytes })
    }

    fn write_signal(&self, stream: StreamId, signal: &Buffer, offset: usize, value: u64) -> Result<(), BackendError> {
        let addr = self.checked(signal, offset, 8)?;
        self.enqueue(stream, StreamOp::WriteSignal { addr, value })
    }

    fn wait_signal(
        &self,
        stream: StreamId,
        signal: &Buffer,
        offset: usize,
        cmp: CmpOp,
        value: u64,
    ) -> Result<(), BackendError> {
        let addr = self.checked(signal, offset, 8)?;
        self.enqueue(stream, StreamOp::WaitSignal { addr, cmp, value })
    }

    fn synchronize(&self) -> Result<(), BackendError> {
        let streams: Vec<Arc<Stream>> = self.streams.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if streams.iter().any(|s| s.outstanding.load(Ordering::Acquire) > 0) {
            let ready_streams = streams.clone();
            let describe_streams = streams.clone();
            let rank = self.rank;
            self.inner
                .sched
                .park(
                    self.task,
                    Blocker {
                        bounded: false,
                        ready: Box::new(move || {
                            ready_streams.iter().all(|s| s.outstanding.load(Ordering::Acquire) == 0)
                        }),
                        describe: Box::new(move || {
                            let busy: Vec<String> = describe_streams
                                .iter()
                                .filter(|s| s.outstanding.load(Ordering::Acquire) > 0)
                                .map(|s| {
                                    format!("stream {} ({} ops left)", s.id, s.outstanding.load(Ordering::Acquire))
                                })
                                .collect();
                            format!("rank {rank} host: synchronize, waiting for {}", busy.join(", "))
                        }),
                    },
                )
                .map_err(host_err)?;
        }
        for s in &streams {
            lock(&self.clock).join(&lock(&s.clock));
        }
        // Every stream's error is taken (the first returned): one left behind would surface at
        // the next synchronize, as if the work after it had failed.
        let mut first = None;
        for s in &streams {
            if let Some(e) = s.error.lock().unwrap_or_else(|e| e.into_inner()).take() {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    fn barrier(&self) -> Result<(), BackendError> {
        let n = self.world_size();
        lock(&self.inner.barrier_clock).join(&lock(&self.clock));
        let r = self.barrier_wait(n);
        lock(&self.clock).join(&lock(&self.inner.barrier_clock));
        r
    }

    fn rearm_barrier_all(&self) -> Result<(), BackendError> {
        // The interpreter's meeting counters (shared: clearing them twice is harmless, no kernel
        // runs between the host barriers around this) and the SIMT lowering's words.
        self.inner.kernel_barriers.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let words = Buffer {
            name: "__barrier".into(),
            address: self.inner.barrier_words[self.rank],
            bytes: 8 * trident_core::abi::BARRIER_WORDS,
        };
        self.write(&words, 0, &[0u8; 8 * trident_core::abi::BARRIER_WORDS])
    }
}

impl CpuRank {
    fn barrier_wait(&self, n: usize) -> Result<(), BackendError> {
        let generation = self.inner.barrier_generation.load(Ordering::Acquire);
        if self.inner.barrier_arrived.fetch_add(1, Ordering::AcqRel) + 1 == n {
            self.inner.barrier_arrived.store(0, Ordering::Release);
            self.inner.barrier_generation.fetch_add(1, Ordering::AcqRel);
            return self.yield_now();
        }
        let (g1, g2) = (self.inner.barrier_generation.clone(), self.inner.barrier_generation.clone());
        let rank = self.rank;
        self.inner
            .sched
            .park(
                self.task,
                Blocker {
                    bounded: false,
                    ready: Box::new(move || g1.load(Ordering::Acquire) != generation),
                    describe: Box::new(move || {
                        format!("rank {rank} host: barrier (generation {})", g2.load(Ordering::Acquire))
                    }),
                },
            )
            .map_err(host_err)
    }
}

/// Runs a stream's operations in order until its rank's host code has finished.
fn stream_task(inner: Arc<Inner>, s: Arc<Stream>, task: TaskId) {
    loop {
        if s.outstanding.load(Ordering::Acquire) == 0 {
            let (s1, s2) = (s.clone(), s.clone());
            let parked = inner.sched.park(
                task,
                Blocker {
                    bounded: false,
                    ready: Box::new(move || {
                        s1.outstanding.load(Ordering::Acquire) > 0 || s1.closed.load(Ordering::Acquire)
                    }),
                    describe: Box::new(move || {
                        let _ = &s2;
                        String::new()
                    }),
                },
            );
            if parked.is_err() {
                // Deadlock elsewhere: drop what is queued so that waiting hosts unwind.
                let n = lock(&s.queue).drain(..).count();
                s.outstanding.fetch_sub(n, Ordering::AcqRel);
                return;
            }
        }
        let op = lock(&s.queue).pop_front();
        let Some((op, clock)) = op else {
            if s.closed.load(Ordering::Acquire) {
                return;
            }
            continue;
        };
        lock(&s.clock).join(&clock);
        let r = if s.failed() { Ok(()) } else { run_stream_op(&inner, &s, task, op) };
        if let Err(e) = r {
            s.fail(e);
        }
        s.outstanding.fetch_sub(1, Ordering::AcqRel);
    }
}

fn run_stream_op(inner: &Arc<Inner>, s: &Arc<Stream>, task: TaskId, op: StreamOp) -> Result<(), BackendError> {
    inner.sched.yield_now(task).map_err(host_err)?;
    let writer = Writer { task: s.tag, launch: 0, rank: s.rank as u32, program: [0; 3] };
    let buf_err =
        |e: crate::memory::AccessError| BackendError::Host(format!("rank {} stream {}: {}", s.rank, s.id, e.0));
    match op {
        StreamOp::Copy { dst, src, bytes } => {
            {
                let clock = lock(&s.clock);
                inner.race_bytes(src, bytes, false, s.tag, &clock)?;
                inner.race_bytes(dst, bytes, true, s.tag, &clock)?;
            }
            let mut data = vec![0u8; bytes];
            inner.mem.read_bytes(src, &mut data).map_err(buf_err)?;
            inner.mem.publish_bytes(dst, &data, writer).map_err(buf_err)
        }
        StreamOp::WriteSignal { addr, value } => {
            if let Some(r) = &inner.races {
                r.release(addr, s.tag, &mut lock(&s.clock));
            }
            inner.mem.publish_bytes(addr, &value.to_le_bytes(), writer).map_err(buf_err)?;
            inner.record_signal(addr, value, format!("rank {} stream {}", s.rank, s.id));
            Ok(())
        }
        StreamOp::WaitSignal { addr, cmp, value } => {
            let acquired = |()| {
                if let Some(r) = &inner.races {
                    r.acquire(addr, &mut lock(&s.clock));
                }
            };
            if Inner::signals_ready(&inner.mem, &[addr], WordTest::Cmp(cmp, value)) {
                acquired(());
                return Ok(());
            }
            let (m1, m2) = (inner.mem.clone(), inner.mem.clone());
            let place = inner.describe_addr(addr);
            let (rank, id) = (s.rank, s.id);
            inner
                .sched
                .park(
                    task,
                    Blocker {
                        bounded: true,
                        ready: Box::new(move || Inner::signals_ready(&m1, &[addr], WordTest::Cmp(cmp, value))),
                        describe: Box::new(move || {
                            let seen = m2.view().locate(addr, 8).map(|(r, o)| r.load(o, 8)).unwrap_or(0);
                            format!(
                                "rank {rank} stream {id}: stream wait on {place}: expected {cmp} {value}, seen {seen}"
                            )
                        }),
                    },
                )
                .map(acquired)
                .map_err(host_err)
        }
        StreamOp::Launch { kernel, grid, args } => run_launch(inner, s, task, kernel, grid, args),
    }
}

struct LaunchState {
    id: u64,
    rank: usize,
    kernel: Artifact,
    grid: [u32; 3],
    args: Vec<KernelArg>,
    order: Vec<[u32; 3]>,
    next: AtomicUsize,
    finished: Arc<AtomicUsize>,
    start_time: u64,
    error: Mutex<Option<BackendError>>,
    barrier_calls: Mutex<HashMap<[u32; 3], u64>>,
    /// The stream's clock at launch (programs start from it) and the join of finished programs.
    clock_start: VClock,
    clock_end: Mutex<VClock>,
}

impl LaunchState {
    /// Threads that own tile elements (the store-buffer split of delayed visibility).
    fn threads(&self) -> usize {
        match self.kernel.payload.downcast_ref::<Kernel>() {
            Some(k) => k.threads() as usize,
            None => self.kernel.attrs.warps as usize * 32,
        }
    }

    fn cooperative(&self) -> bool {
        self.kernel.attrs.cooperative
    }

    fn fail(&self, e: BackendError) {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e);
    }
}

fn run_launch(
    inner: &Arc<Inner>,
    s: &Arc<Stream>,
    task: TaskId,
    kernel: Artifact,
    grid: [u32; 3],
    args: Vec<KernelArg>,
) -> Result<(), BackendError> {
    let grid = crate::device::launch_grid(&kernel, grid);
    let id = inner.next_launch.fetch_add(1, Ordering::Relaxed);
    let order = crate::device::program_order(grid, inner.opts.seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let total = order.len();
    inner.mem.view_started();
    let launch = Arc::new(LaunchState {
        id,
        rank: s.rank,
        kernel,
        grid,
        args,
        order,
        next: AtomicUsize::new(0),
        finished: Arc::new(AtomicUsize::new(0)),
        start_time: inner.mem.now(),
        error: Mutex::new(None),
        barrier_calls: Mutex::new(HashMap::new()),
        clock_start: lock(&s.clock).clone(),
        clock_end: Mutex::new(VClock::default()),
    });
    let result = spawn_worker(inner, &launch).and_then(|_| {
        let (f1, f2) = (launch.finished.clone(), launch.finished.clone());
        let (name, rank) = (launch.kernel.kernel.clone(), s.rank);
        inner
            .sched
            .park(
                task,
                Blocker {
                    bounded: false,
                    ready: Box::new(move || f1.load(Ordering::Acquire) == total),
                    describe: Box::new(move || {
                        format!(
                            "rank {rank}: launch `{name}` ({} of {total} programs finished)",
                            f2.load(Ordering::Acquire)
                        )
                    }),
                },
            )
            .map_err(host_err)
    });
    inner.mem.view_ended();
    lock(&s.clock).join(&lock(&launch.clock_end));
    let launch_error = launch.error.lock().unwrap_or_else(|e| e.into_inner()).take();
    match launch_error {
        Some(e) => Err(e),
        None => result,
    }
}

fn spawn_worker(inner: &Arc<Inner>, launch: &Arc<LaunchState>) -> Result<(), BackendError> {
    let (inner2, launch2) = (inner.clone(), launch.clone());
    inner
        .sched
        .spawn(format!("rank{}-{}", launch.rank, launch.kernel.kernel), move |task| worker(inner2, launch2, task))
        .map(|_| ())
        .map_err(host_err)
}

/// Claims programs of a launch one after another; a program that parks leaves the rest to a new
/// worker, so every program of a launch can be resident at once.
fn worker(inner: Arc<Inner>, launch: Arc<LaunchState>, task: TaskId) {
    let threads = launch.threads();
    loop {
        let i = launch.next.fetch_add(1, Ordering::AcqRel);
        if i >= launch.order.len() {
            return;
        }
        let pid = launch.order[i];
        let failed = launch.error.lock().unwrap_or_else(|e| e.into_inner()).is_some();
        if !failed {
            if let Err(e) = inner.sched.yield_now(task) {
                launch.fail(BackendError::Host(e));
            } else {
                let tag = inner.tag();
                let writer = Writer { task: tag, launch: launch.id, rank: launch.rank as u32, program: pid };
                let seed = inner.opts.seed ^ tag.wrapping_mul(0xD1B5_4A32_D192_ED03);
                let mut view = ProgramView::delayed(writer, launch.start_time, threads, seed, inner.opts.chaos);
                if let Some(races) = &inner.races {
                    races.label(tag, format!("rank {} program {pid:?} of `{}`", launch.rank, launch.kernel.kernel));
                    let mut clock = launch.clock_start.clone();
                    clock.tick(tag);
                    let inner3 = inner.clone();
                    view = view.with_race(RaceCtx {
                        races: races.clone(),
                        clock,
                        fenced: None,
                        relaxed_reads: Vec::new(),
                        place: Arc::new(move |a| inner3.describe_byte(a)),
                    });
                }
                let hooks = WorldHooks { inner: &inner, launch: &launch, task, spawned: AtomicBool::new(false) };
                let ctx =
                    ProgramCtx { pid, grid: launch.grid, rank: launch.rank as u32, num_ranks: inner.opts.ranks as u32 };
                let run = match (
                    launch.kernel.payload.downcast_ref::<Function>(),
                    launch.kernel.payload.downcast_ref::<Kernel>(),
                ) {
                    (Some(func), _) => Program::run(func, &inner.mem, ctx, &launch.args, view, &hooks)
                        .map_err(|f| f.into_error(func, pid, ctx.rank)),
                    (None, Some(k)) => {
                        // Hidden parameters: rank and world size; the CPU resolves `symm_at`
                        // through its own symmetric-heap map, and waits never time out here.
                        let mut args = launch.args.clone();
                        let hidden = trident_core::abi::HiddenArgs {
                            rank: ctx.rank as usize,
                            ranks: ctx.num_ranks as usize,
                            heap_bases: 0,
                            diag: 0,
                            wait_bound: std::time::Duration::ZERO,
                            barrier: inner.barrier_words[ctx.rank as usize],
                        };
                        args.extend(hidden.args());
                        crate::simt_exec::run_program(k, &inner.mem, pid, launch.grid, &args, view, &hooks)
                            .map_err(|f| f.into_error(format!("{} on rank {}", k.name, ctx.rank), pid))
                    }
                    _ => Err(BackendError::Host("unknown kernel payload".into())),
                };
                if let Err(e) = run {
                    launch.fail(e);
                }
            }
        }
        launch.finished.fetch_add(1, Ordering::AcqRel);
    }
}

struct WorldHooks<'a> {
    inner: &'a Arc<Inner>,
    launch: &'a Arc<LaunchState>,
    task: TaskId,
    /// Whether this program already handed the launch's remaining programs to a new worker.
    spawned: AtomicBool,
}

impl WorldHooks<'_> {
    fn park(&self, blocker: Blocker) -> R<()> {
        let unclaimed = self.launch.next.load(Ordering::Acquire) < self.launch.order.len();
        if unclaimed && !self.spawned.swap(true, Ordering::AcqRel) {
            if let Err(e) = spawn_worker(self.inner, self.launch) {
                return fault(e.to_string());
            }
        }
        self.inner.sched.park(self.task, blocker).or_else(fault)
    }
}

impl Hooks for WorldHooks<'_> {
    /// Virtual time: a microsecond per hand-over of the scheduler's baton, so that a timeline
    /// of the world (`trident_core::trace`) shows the order of events, not the host's speed.
    fn clock_ns(&self) -> u64 {
        self.inner.sched.switches() * 1000
    }

    fn yield_point(&self, view: &mut ProgramView) -> R<()> {
        view.perturb(&self.inner.mem).or_else(|e| fault(e.0))?;
        self.inner.sched.yield_now(self.task).or_else(fault)
    }

    fn wait(&self, view: &ProgramView, addrs: &[u64], test: WordTest) -> R<()> {
        let mem = &self.inner.mem;
        {
            let v = mem.view();
            for &a in addrs {
                v.locate(a, 8).or_else(|e| fault(e.0))?;
            }
        }
        if !Inner::signals_ready(mem, addrs, test) {
            let (m1, m2) = (mem.clone(), mem.clone());
            let (a1, a2) = (addrs.to_vec(), addrs.to_vec());
            let places: Vec<String> = addrs.iter().map(|a| self.inner.describe_addr(*a)).collect();
            let (rank, kernel, launch, pid) =
                (self.launch.rank, self.launch.kernel.kernel.clone(), self.launch.id, view.writer.program);
            self.park(Blocker {
                bounded: true,
                ready: Box::new(move || Inner::signals_ready(&m1, &a1, test)),
                describe: Box::new(move || {
                    let v = m2.view();
                    let pending: Vec<String> = a2
                        .iter()
                        .zip(&places)
                        .filter_map(|(a, place)| {
                            let seen = v.locate(*a, 8).map(|(r, o)| r.load(o, 8)).unwrap_or(0);
                            (!test.holds(seen)).then(|| format!("{place}: {}", test.describe(seen)))
                        })
                        .collect();
                    format!("rank {rank}, launch #{launch} `{kernel}`, program {pid:?}: wait on {}", pending.join("; "))
                }),
            })?;
        }
        // Whatever order the programs ran in, a signal written by a sibling program of an
        // independent launch means the launch relied on two of its programs running together.
        let v = mem.view();
        for &a in addrs {
            let (r, o) = v.locate(a, 8).or_else(|e| fault(e.0))?;
            let w = r.writer_of(o);
            if !self.launch.cooperative() && w.launch == self.launch.id && w.task != view.writer.task {
                return fault(format!(
                    "contract violation: program {:?} of the independent launch `{}` on rank {} waited on {} written by program {:?} of the same launch; programs of an independent launch may not wait on each other (make the launch cooperative)",
                    view.writer.program,
                    self.launch.kernel.kernel,
                    self.launch.rank,
                    self.inner.describe_addr(a),
                    w.program
                ));
            }
            if self.inner.opts.trace {
                if let Some((buffer, rank, off)) = self.inner.symmetric_place(a) {
                    self.inner.record(TraceEvent::WaitDone {
                        time: mem.now(),
                        rank,
                        kernel: self.launch.kernel.kernel.clone(),
                        program: view.writer.program,
                        buffer,
                        index: (off / 8) as usize,
                    });
                }
            }
        }
        Ok(())
    }

    fn translate(&self, addr: u64, rank: i64) -> R<u64> {
        let n = self.inner.opts.ranks;
        if rank < 0 || rank as usize >= n {
            return fault(format!("rank {rank} is outside the world of {n} ranks"));
        }
        let s = self.inner.symm.lock().unwrap_or_else(|e| e.into_inner());
        let Some(&(a, r)) = s.by_slot.get(&Memory::slot_of(addr)) else {
            return fault(format!(
                "symm_at on {addr:#x}, which is not in the symmetric heap (allocate it with symm_alloc)"
            ));
        };
        let alloc = &s.allocs[a];
        Ok(alloc.addrs[rank as usize] + (addr - alloc.addrs[r]))
    }

    fn barrier_all(&self, view: &ProgramView) -> R<()> {
        let total = self.launch.order.len() as u64;
        if !self.launch.cooperative() && total > 1 {
            return fault(format!(
                "contract violation: `barrier_all` in the independent launch `{}` of {total} programs makes its programs wait on each other (make the launch cooperative)",
                self.launch.kernel.kernel
            ));
        }
        let k = {
            let mut calls = self.launch.barrier_calls.lock().unwrap_or_else(|e| e.into_inner());
            let c = calls.entry(view.writer.program).or_insert(0);
            *c += 1;
            *c
        };
        // Ranks launch the same kernels in the same order: the n-th launch of a kernel on one
        // rank meets the n-th launch of it on every other rank.
        let key = (self.launch.kernel.kernel.clone(), k, 0);
        let counter =
            self.inner.kernel_barriers.lock().unwrap_or_else(|e| e.into_inner()).entry(key).or_default().clone();
        let want = total * self.inner.opts.ranks as u64;
        let arrived = counter.fetch_add(1, Ordering::AcqRel) + 1;
        let target = want * arrived.div_ceil(want);
        let (c1, c2) = (counter.clone(), counter.clone());
        let (rank, pid) = (self.launch.rank, view.writer.program);
        self.park(Blocker {
            bounded: true,
            ready: Box::new(move || c1.load(Ordering::Acquire) >= target),
            describe: Box::new(move || {
                format!(
                    "rank {rank}, program {pid:?}: barrier_all ({} of {target} arrived)",
                    c2.load(Ordering::Acquire)
                )
            }),
        })
    }

    fn program_done(&self, view: &mut ProgramView) {
        if let Some(c) = view.take_clock() {
            lock(&self.launch.clock_end).join(&c);
        }
    }

    fn signal_written(&self, view: &ProgramView, addr: u64, value: u64) {
        self.inner.record_signal(addr, value, format!("rank {} program {:?}", view.writer.rank, view.writer.program));
    }
}
