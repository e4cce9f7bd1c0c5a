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
//! GPU cannot be resident at once (`Driver::launch_on`). Kernel waits are bounded on the device
//! and reported by `synchronize` from the rank's diagnostics record; stream waits are bounded by
//! the watchdog (`watchdog`). A rank that fails breaks the host barrier, so no rank waits for it.

use crate::barrier::HostBarrier;
use crate::diagnostics::wait_error;
use crate::driver::{Driver, RawStream};
use crate::watchdog::{self, StreamWait};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use trident_core::backend::{check_launch, Artifact, Backend, BackendError, Buffer, KernelArg};
use trident_core::ir::CmpOp;
use trident_core::simt::{diag, hidden_args};
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
    /// Bytes of symmetric heap per rank.
    pub heap_bytes: usize,
}

impl GpuWorldOptions {
    pub fn new(ranks: usize) -> GpuWorldOptions {
        let bound = trident_core::backend::default_wait_bound();
        GpuWorldOptions {
            ranks,
            wait_bound: bound,
            // Stream waits outlast the kernels they wait for (at least 5 kernel wait bounds).
            stream_wait_bound: Duration::from_secs(10).max(bound * 5),
            heap_bytes: 64 << 20,
        }
    }
}

/// Symmetric heaps are carved in units of this many bytes (any access of the heap is aligned).
pub(crate) const HEAP_GRAIN: usize = 256;

/// Bytes at the start of every rank's heap kept from symmetric allocations: `barrier_all`'s
/// words (`trident_core::simt::BARRIER_WORDS`), at the same offset on every rank.
pub(crate) const RESERVED: usize = HEAP_GRAIN;

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
    /// Next free byte of the heaps of the ranks this process runs (identical on all ranks in
    /// SPMD code).
    pub(crate) next: Mutex<Vec<usize>>,
    /// Ranks sharing each local rank's device (a waiting launch must fit beside theirs).
    pub(crate) sharing: Vec<u32>,
    /// Every allocation above with the index of the device that owns it (freed at the end).
    pub(crate) owned: Vec<(usize, Buffer)>,
    pub(crate) sync: HostSync,
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
}

impl<D: Driver> Shared<D> {
    fn device(&self, rank: usize) -> &Arc<D> {
        &self.devices[rank % self.devices.len()]
    }

    fn local(&self, rank: usize) -> usize {
        rank - self.first
    }
}

/// Frees `owned` (buffers with their device's index); the names of the symmetric buffers carved
/// from a heap go with it.
pub(crate) fn free_owned<D: Driver>(devices: &[Arc<D>], owned: &[(usize, Buffer)]) {
    for (d, b) in owned {
        devices[*d].allocations().remove_within(b.address, b.bytes);
        let _ = devices[*d].free(b);
    }
}

/// Runs SPMD host code on the ranks of a world of GPUs.
pub struct GpuWorld;

impl GpuWorld {
    /// Runs `host` on `opts.ranks` ranks, rank `r` on `devices[r % devices.len()]`, and returns
    /// every rank's result, or the first rank's error.
    pub fn run<D: Driver, T: Send + 'static>(
        devices: Vec<Arc<D>>,
        opts: GpuWorldOptions,
        host: impl Fn(&dyn RankCtx) -> Result<T, BackendError> + Send + Sync + 'static,
    ) -> Result<Vec<T>, BackendError> {
        let n = opts.ranks;
        if n == 0 || n > 64 {
            return Err(BackendError::Host(format!("a GPU world has 1..=64 ranks, not {n}")));
        }
        if devices.is_empty() {
            return Err(BackendError::Host("a GPU world needs at least one device".into()));
        }
        for (i, a) in devices.iter().enumerate() {
            for (j, b) in devices.iter().enumerate() {
                if i != j {
                    a.enable_peer(b)?;
                }
            }
        }
        let mut made: Vec<(usize, Buffer)> = Vec::new();
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
            let nd = devices.len();
            let heaps: Vec<Buffer> = (0..n)
                .map(|r| {
                    let bytes = RESERVED + opts.heap_bytes.next_multiple_of(HEAP_GRAIN);
                    alloc(r % nd, bytes, format!("heap@rank{r}"))
                })
                .collect::<Result<_, _>>()?;
            let diags: Vec<Buffer> = (0..n)
                .map(|r| alloc(r % nd, 8 * diag::WORDS, format!("__wait_diagnostics@rank{r}")))
                .collect::<Result<_, _>>()?;
            let tables: Vec<Buffer> =
                (0..nd).map(|d| alloc(d, 8 * n, format!("__heap_bases@device{d}"))).collect::<Result<_, _>>()?;
            let bases: Vec<u8> = heaps.iter().flat_map(|h| h.address.to_le_bytes()).collect();
            for (d, t) in tables.iter().enumerate() {
                devices[d].write(t, 0, &bases)?;
            }
            Ok((heaps, tables, diags))
        })();
        let (heaps, tables, diags) = match parts {
            Ok(p) => p,
            Err(e) => {
                free_owned(&devices, &made);
                return Err(e);
            }
        };
        let nd = devices.len();
        let shared = Arc::new(Shared {
            devices: devices.clone(),
            opts: opts.clone(),
            first: 0,
            heaps,
            reserved: RESERVED,
            tables,
            diags,
            next: Mutex::new(vec![RESERVED; n]),
            sharing: (0..n).map(|r| (0..n).filter(|q| q % nd == r % nd).count() as u32).collect(),
            sync: HostSync::Threads(HostBarrier::new(n)),
            owned: made,
        });
        let host = Arc::new(host);
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let (shared, host) = (shared.clone(), host.clone());
                std::thread::spawn(move || {
                    let ctx = GpuRank::new(shared, rank);
                    let r = ctx.run(&*host);
                    if let Err(e) = &r {
                        ctx.shared.sync.abandon(format!("rank {rank} failed: {e}"));
                    }
                    r
                })
            })
            .collect();
        let mut out = Vec::with_capacity(n);
        let mut first_err = None;
        for (rank, h) in handles.into_iter().enumerate() {
            match h.join() {
                Ok(Ok(v)) => out.push(v),
                Ok(Err(e)) => {
                    first_err.get_or_insert(BackendError::Rank { rank, error: Box::new(e) });
                }
                Err(_) => {
                    first_err.get_or_insert(BackendError::Rank {
                        rank,
                        error: Box::new(BackendError::Host("host thread panicked".into())),
                    });
                }
            }
        }
        free_owned(&shared.devices, &shared.owned);
        match first_err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
}

/// One rank's context (`RankCtx`) in either world.
pub(crate) struct GpuRank<D: Driver> {
    pub(crate) shared: Arc<Shared<D>>,
    rank: usize,
    streams: Mutex<Vec<(StreamId, RawStream)>>,
    compiled: Mutex<HashMap<String, Artifact>>,
    /// Stream waits enqueued since the last `synchronize`.
    pending: Mutex<Vec<StreamWait>>,
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
        GpuRank {
            shared,
            rank,
            streams: Mutex::new(Vec::new()),
            compiled: Mutex::new(HashMap::new()),
            pending: Mutex::new(Vec::new()),
        }
    }

    /// Runs `host` on this rank, then waits for its streams (whatever `host` returned) and
    /// destroys them.
    pub(crate) fn run<T>(&self, host: &dyn Fn(&dyn RankCtx) -> Result<T, BackendError>) -> Result<T, BackendError> {
        let r = self.device().bind().and_then(|()| host(self));
        let done = self.synchronize();
        self.destroy_streams();
        r.and_then(|v| done.map(|_| v))
    }

    fn device(&self) -> &D {
        self.shared.device(self.rank)
    }

    fn stream(&self, id: StreamId) -> Result<RawStream, BackendError> {
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, s)) = streams.iter().find(|(i, _)| *i == id) {
            return Ok(*s);
        }
        let s = self.device().stream_create()?;
        streams.push((id, s));
        Ok(s)
    }

    fn destroy_streams(&self) {
        for (_, s) in self.streams.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            self.device().stream_destroy(s);
        }
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
        self.shared.sharing[self.shared.local(self.rank)] as usize
    }

    fn backend(&self) -> &dyn Backend {
        self.device().compiler()
    }

    fn target(&self) -> Option<String> {
        self.device().target()
    }

    fn compile(&self, key: &str, build: &dyn Fn() -> Result<Function, VerifyError>) -> Result<Artifact, BackendError> {
        if let Some(a) = self.compiled.lock().unwrap_or_else(|e| e.into_inner()).get(key) {
            return Ok(a.clone());
        }
        let dev = self.device();
        let a = dev.compiler().compile(&build()?, dev.target().as_deref())?;
        dev.load(&a)?;
        // Every rank has loaded the module before any rank launches it (SPMD: all compile it).
        self.shared.sync.wait(self.rank, &format!("load_{key}"))?;
        self.compiled.lock().unwrap_or_else(|e| e.into_inner()).insert(key.to_string(), a.clone());
        Ok(a)
    }

    fn alloc(&self, bytes: usize, name: &str) -> Result<Buffer, BackendError> {
        self.device().alloc(bytes.max(1), &format!("{name}@rank{}", self.rank))
    }

    fn symm_alloc(&self, bytes: usize, name: &str) -> Result<Buffer, BackendError> {
        let mut next = self.shared.next.lock().unwrap_or_else(|e| e.into_inner());
        let here = self.shared.local(self.rank);
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
        // name into wait diagnostics.
        self.device().fill(&b, &[0])?;
        self.device().allocations().insert(&b);
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
        self.device().write(buffer, offset, data)
    }

    fn read(&self, buffer: &Buffer, offset: usize, out: &mut [u8]) -> Result<(), BackendError> {
        self.device().read(buffer, offset, out)
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
        let hidden =
            hidden_args(r, self.world_size(), table.address, sh.diags[here].address, sh.opts.wait_bound, words);
        self.device().launch_on(s, kernel, grid, args, hidden, sh.sharing[here])
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
        self.device().copy_async(st, d, s, bytes)
    }

    fn write_signal(&self, stream: StreamId, signal: &Buffer, offset: usize, value: u64) -> Result<(), BackendError> {
        let a = in_buffer(signal, offset, 8)?;
        let st = self.stream(stream)?;
        self.device().write_value(st, a, value)
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
        self.device().wait_value(st, a, cmp, value)?;
        let w = StreamWait { stream, signal: signal.name.clone(), index: offset / 8, address: a, cmp, value };
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).push(w);
        Ok(())
    }

    fn synchronize(&self) -> Result<(), BackendError> {
        let dev = self.device();
        let streams: Vec<(StreamId, RawStream)> = self.streams.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let bound = self.shared.opts.stream_wait_bound;
        let deadline = Instant::now() + bound;
        for (id, s) in &streams {
            if !watchdog::drain(dev, *s, deadline)? {
                let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
                return Err(watchdog::release_stuck(dev, self.rank, *id, &pending, &streams, bound));
            }
        }
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let d = &self.shared.diags[self.shared.local(self.rank)];
        let mut raw = vec![0u8; d.bytes];
        dev.read(d, 0, &mut raw)?;
        let r = wait_error(
            &format!("a kernel of rank {}", self.rank),
            &raw,
            dev.allocations(),
            self.shared.opts.wait_bound,
        );
        if r.is_err() {
            dev.write(d, 0, &vec![0u8; d.bytes])?;
        }
        r
    }

    fn barrier(&self) -> Result<(), BackendError> {
        self.shared.sync.wait(self.rank, "barrier")
    }
}
