//! The loopback world: N ranks on one GPU, one host thread and one set of streams per rank.
//!
//! It runs the same SPMD host code as the CPU world (`RankCtx`) on real hardware, so signal
//! protocols are tested with the PTX that multi-GPU runs use (every cross-rank op is `.sys`).
//! Each rank has its own symmetric heap (one allocation, bump-allocated identically on every
//! rank), and `__heap_bases` holds their addresses for `symm_at`. Modules are loaded eagerly
//! (`CUDA_MODULE_LOADING=EAGER`) and every rank loads a kernel before any rank launches it (a
//! host barrier after the first compile of each kernel), because a lazy load cannot happen while
//! another rank's kernel spins (`probes/loopback-signals`). Kernel waits are bounded by
//! `%globaltimer`; a timed-out wait stops its launch and `synchronize` reports the diagnostic.
//! Stream waits (`cuStreamWaitValue64`) have no timeout of their own: `synchronize` is their
//! watchdog. It polls the rank's streams up to `stream_wait_bound`; a stream still blocked then
//! has its unsatisfied waits named (rank, stream, signal buffer and index, expected, seen) and
//! released (the host writes the awaited value from a helper stream, so the GPU drains and the
//! process can go on), and the call fails with that diagnostic. A kernel that waits (or a
//! cooperative one) is refused when its grid times the ranks sharing the GPU cannot be resident at
//! once (`runtime::launch_raw`), so concurrently launched rank kernels are co-resident.

use crate::runtime::{launch_raw, CudaDevice};
use crate::{NvidiaBackend, PtxModule};
use cudarc::driver::{result, sys};
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use trident_core::backend::{check_launch, Artifact, Backend, BackendError, Buffer, Device, KernelArg};
use trident_core::ir::CmpOp;
use trident_core::simt::diag;
use trident_core::simt::hidden_args;
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
        GpuWorldOptions {
            ranks,
            wait_bound: trident_core::backend::default_wait_bound(),
            // Stream waits outlast the kernels they wait for (at least 5 kernel wait bounds).
            stream_wait_bound: Duration::from_secs(10).max(trident_core::backend::default_wait_bound() * 5),
            heap_bytes: 64 << 20,
        }
    }
}

struct Shared {
    dev: Arc<CudaDevice>,
    opts: GpuWorldOptions,
    heaps: Vec<Buffer>,
    table: Buffer,
    diags: Vec<Buffer>,
    /// Count and generation words of `barrier_all`, shared by every rank.
    barrier_all: Buffer,
    /// Next free byte of every rank's heap (identical on all ranks in SPMD code).
    next: Mutex<Vec<usize>>,
    barrier: HostBarrier,
}

/// A host barrier that a failing rank breaks, so that the others return an error instead of
/// waiting forever for a rank that will not come.
struct HostBarrier {
    n: usize,
    state: Mutex<(usize, u64, Option<String>)>,
    cv: Condvar,
}

impl HostBarrier {
    fn new(n: usize) -> HostBarrier {
        HostBarrier { n, state: Mutex::new((0, 0, None)), cv: Condvar::new() }
    }

    fn wait(&self, rank: usize) -> Result<(), BackendError> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = &st.2 {
            return Err(BackendError::Host(format!("rank {rank}: barrier abandoned: {why}")));
        }
        let generation = st.1;
        st.0 += 1;
        if st.0 == self.n {
            st.0 = 0;
            st.1 += 1;
            self.cv.notify_all();
            return Ok(());
        }
        while st.1 == generation {
            if let Some(why) = &st.2 {
                return Err(BackendError::Host(format!("rank {rank}: barrier abandoned: {why}")));
            }
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        Ok(())
    }

    fn abandon(&self, why: String) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.2.get_or_insert(why);
        self.cv.notify_all();
    }
}

/// The process's device 0, opened once: worlds share its context and its loaded modules (a
/// module is JIT-compiled once per process, not once per world).
fn device() -> Result<Arc<CudaDevice>, BackendError> {
    static DEVICE: Mutex<Option<Arc<CudaDevice>>> = Mutex::new(None);
    let mut d = DEVICE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(dev) = d.as_ref() {
        return Ok(dev.clone());
    }
    let dev = Arc::new(CudaDevice::open(0)?);
    *d = Some(dev.clone());
    Ok(dev)
}

/// Runs SPMD host code on N ranks of one GPU.
pub struct GpuWorld;

impl GpuWorld {
    pub fn run<T: Send + 'static>(
        opts: GpuWorldOptions,
        host: impl Fn(&dyn RankCtx) -> Result<T, BackendError> + Send + Sync + 'static,
    ) -> Result<Vec<T>, BackendError> {
        let n = opts.ranks;
        if n == 0 || n > 64 {
            return Err(BackendError::Host(format!("a loopback world has 1..=64 ranks, not {n}")));
        }
        // SAFETY: set before the driver is initialised in this process by CudaDevice::open, and
        // the tests and binaries that use the world do not read the environment concurrently.
        unsafe { std::env::set_var("CUDA_MODULE_LOADING", "EAGER") };
        let dev = device()?;
        let heaps: Vec<Buffer> =
            (0..n).map(|r| dev.alloc(opts.heap_bytes, &format!("heap@rank{r}"))).collect::<Result<_, _>>()?;
        for h in &heaps {
            dev.fill(h, &[0])?;
        }
        let table = dev.alloc(8 * n, "__heap_bases")?;
        let bases: Vec<u8> = heaps.iter().flat_map(|h| h.address.to_le_bytes()).collect();
        dev.write(&table, 0, &bases)?;
        let diags: Vec<Buffer> =
            (0..n).map(|r| dev.alloc(8 * diag::WORDS, &format!("__diag@rank{r}"))).collect::<Result<_, _>>()?;
        // Fresh allocations may hold an earlier world's bytes: a stale flag would abort every wait.
        for d in &diags {
            dev.fill(d, &[0])?;
        }
        let barrier_all = dev.alloc(16, "__barrier_all")?;
        dev.fill(&barrier_all, &[0])?;
        let shared = Arc::new(Shared {
            barrier_all,
            dev,
            opts,
            heaps,
            table,
            diags,
            next: Mutex::new(vec![0; n]),
            barrier: HostBarrier::new(n),
        });
        let host = Arc::new(host);
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let (shared, host) = (shared.clone(), host.clone());
                std::thread::spawn(move || {
                    let ctx = GpuRank {
                        shared,
                        rank,
                        streams: Mutex::new(Vec::new()),
                        compiled: Mutex::new(HashMap::new()),
                        pending: Mutex::new(Vec::new()),
                    };
                    let r = host(&ctx);
                    let done = ctx.synchronize();
                    ctx.destroy_streams();
                    let r = r.and_then(|v| done.map(|_| v));
                    if let Err(e) = &r {
                        ctx.shared.barrier.abandon(format!("rank {rank} failed: {e}"));
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
        for h in shared.heaps.iter().chain(shared.diags.iter()).chain([&shared.table, &shared.barrier_all]) {
            let _ = shared.dev.free(h);
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
}

struct GpuRank {
    shared: Arc<Shared>,
    rank: usize,
    streams: Mutex<Vec<(StreamId, sys::CUstream)>>,
    compiled: Mutex<HashMap<String, Artifact>>,
    /// Stream waits enqueued since the last `synchronize`.
    pending: Mutex<Vec<StreamWait>>,
}

/// A `wait_signal` as the watchdog needs it.
#[derive(Clone, Debug)]
struct StreamWait {
    stream: StreamId,
    signal: String,
    index: usize,
    addr: u64,
    cmp: CmpOp,
    value: u64,
}

impl StreamWait {
    fn satisfied(&self, seen: u64) -> bool {
        self.cmp.holds(seen, self.value)
    }
}

fn driver(what: &str, e: result::DriverError) -> BackendError {
    BackendError::Host(format!("{what}: {e:?}"))
}

impl GpuRank {
    fn stream(&self, id: StreamId) -> Result<sys::CUstream, BackendError> {
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, s)) = streams.iter().find(|(i, _)| *i == id) {
            return Ok(*s);
        }
        self.shared.dev.current()?;
        let s =
            result::stream::create(result::stream::StreamKind::NonBlocking).map_err(|e| driver("cuStreamCreate", e))?;
        streams.push((id, s));
        Ok(s)
    }

    fn destroy_streams(&self) {
        for (_, s) in self.streams.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            // SAFETY: the stream was created by this rank and synchronised before.
            let _ = unsafe { result::stream::destroy(s) };
        }
    }

    /// Polls `s` until it is idle (true) or `deadline` passed (false).
    fn drain(&self, s: sys::CUstream, deadline: std::time::Instant) -> Result<bool, BackendError> {
        let mut nap = Duration::from_micros(20);
        loop {
            // SAFETY: a stream created by this rank.
            match unsafe { sys::cuStreamQuery(s) } {
                sys::CUresult::CUDA_SUCCESS => return Ok(true),
                sys::CUresult::CUDA_ERROR_NOT_READY => {}
                other => return Err(BackendError::Host(format!("cuStreamQuery: {other:?}"))),
            }
            if std::time::Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(2));
        }
    }

    /// The watchdog's verdict on a stream still blocked at the deadline: names its unsatisfied
    /// waits, releases them (writing the awaited value from a helper stream) and drains.
    fn release_stuck(&self, id: StreamId, streams: &[(StreamId, sys::CUstream)]) -> BackendError {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        let mut blocked = Vec::new();
        for w in pending.iter().filter(|w| w.stream == id) {
            let mut raw = [0u8; 8];
            // SAFETY: 8 bytes inside a device buffer checked when the wait was enqueued; a
            // synchronous copy does not wait for the (non-blocking) stuck stream.
            let seen = unsafe { result::memcpy_dtoh_sync(&mut raw, w.addr) }.map(|_| u64::from_le_bytes(raw));
            match seen {
                Ok(v) if w.satisfied(v) => {}
                Ok(v) => blocked.push((w.clone(), v)),
                Err(e) => return driver("cuMemcpyDtoH (watchdog)", e),
            }
        }
        let bound = self.shared.opts.stream_wait_bound;
        let what = match blocked.first() {
            Some((w, seen)) => format!(
                "stream wait timed out after {bound:?} on rank {}, stream {id}: signal `{}`[{}] expected {} {}, seen {seen}; the wait was released and the stream drained",
                self.rank, w.signal, w.index, w.cmp, w.value
            ),
            None => format!(
                "rank {}, stream {id} still busy after {bound:?} with no unsatisfied stream wait (a kernel longer than the bound?)",
                self.rank
            ),
        };
        if let Ok(helper) = result::stream::create(result::stream::StreamKind::NonBlocking) {
            for (w, _) in &blocked {
                // SAFETY: as above; the helper stream is ours and destroyed below.
                let _ = unsafe { sys::cuStreamWriteValue64_v2(helper, w.addr, w.value, 0) }.result();
            }
            // SAFETY: the helper stream, then the rank's own streams.
            unsafe {
                let _ = result::stream::synchronize(helper);
                let _ = result::stream::destroy(helper);
            }
            let later = std::time::Instant::now() + bound;
            for (_, s) in streams {
                let _ = self.drain(*s, later);
            }
        }
        BackendError::Execution {
            kernel: format!("stream {id} of rank {}", self.rank),
            program: [0; 3],
            op: "wait_signal".into(),
            loc: None,
            message: what,
        }
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
}

impl RankCtx for GpuRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.opts.ranks
    }

    fn backend(&self) -> &dyn Backend {
        &NvidiaBackend
    }

    fn compile(&self, key: &str, build: &dyn Fn() -> Result<Function, VerifyError>) -> Result<Artifact, BackendError> {
        if let Some(a) = self.compiled.lock().unwrap_or_else(|e| e.into_inner()).get(key) {
            return Ok(a.clone());
        }
        let a = NvidiaBackend.compile(&build()?, None)?;
        let module = a.payload_for::<PtxModule>(crate::NAME)?;
        self.shared.dev.current()?;
        self.shared.dev.function(&a, module)?;
        // Every rank has loaded the module before any rank launches it (SPMD: all compile it).
        self.shared.barrier.wait(self.rank)?;
        self.compiled.lock().unwrap_or_else(|e| e.into_inner()).insert(key.to_string(), a.clone());
        Ok(a)
    }

    fn alloc(&self, bytes: usize, name: &str) -> Result<Buffer, BackendError> {
        self.shared.dev.alloc(bytes.max(1), &format!("{name}@rank{}", self.rank))
    }

    fn symm_alloc(&self, bytes: usize, name: &str) -> Result<Buffer, BackendError> {
        let mut next = self.shared.next.lock().unwrap_or_else(|e| e.into_inner());
        let off = next[self.rank];
        let end = off + bytes.max(1).div_ceil(256) * 256;
        if end > self.shared.opts.heap_bytes {
            return Err(BackendError::Buffer {
                buffer: name.to_string(),
                message: format!("symmetric heap of {} bytes exhausted", self.shared.opts.heap_bytes),
            });
        }
        next[self.rank] = end;
        drop(next);
        let b = Buffer {
            name: format!("{name}@rank{}", self.rank),
            address: self.shared.heaps[self.rank].address + off as u64,
            bytes,
        };
        // Symmetric buffers start zeroed on every rank, as in the CPU world.
        self.shared.dev.fill(&b, &[0])?;
        Ok(b)
    }

    fn peer(&self, buffer: &Buffer, rank: usize) -> Result<Buffer, BackendError> {
        let mine = &self.shared.heaps[self.rank];
        if rank >= self.world_size()
            || buffer.address < mine.address
            || buffer.address >= mine.address + mine.bytes as u64
        {
            return Err(BackendError::Buffer {
                buffer: buffer.name.clone(),
                message: format!("not a symmetric buffer, or rank {rank} out of range"),
            });
        }
        let off = buffer.address - mine.address;
        Ok(Buffer {
            name: format!("{}@rank{rank}", buffer.name),
            address: self.shared.heaps[rank].address + off,
            bytes: buffer.bytes,
        })
    }

    fn write(&self, buffer: &Buffer, offset: usize, data: &[u8]) -> Result<(), BackendError> {
        self.shared.dev.write(buffer, offset, data)
    }

    fn read(&self, buffer: &Buffer, offset: usize, out: &mut [u8]) -> Result<(), BackendError> {
        self.shared.dev.read(buffer, offset, out)
    }

    fn launch(
        &self,
        stream: StreamId,
        kernel: &Artifact,
        grid: [u32; 3],
        args: &[KernelArg],
    ) -> Result<(), BackendError> {
        let module = kernel.payload_for::<PtxModule>(crate::NAME)?;
        check_launch(kernel, grid, args, u64::MAX)?;
        let s = self.stream(stream)?;
        self.shared.dev.current()?;
        let f = self.shared.dev.function(kernel, module)?;
        let (sh, r) = (&self.shared, self.rank);
        let hidden = hidden_args(
            r,
            self.world_size(),
            sh.table.address,
            sh.diags[r].address,
            sh.opts.wait_bound,
            sh.barrier_all.address,
        );
        launch_raw(kernel, module, f, grid, s, args, hidden, sh.dev.sms, self.world_size() as u32)
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
        let (d, s) = (Self::in_buffer(dst, dst_offset, bytes)?, Self::in_buffer(src, src_offset, bytes)?);
        let st = self.stream(stream)?;
        self.shared.dev.current()?;
        // SAFETY: both ranges were checked against their buffers.
        unsafe { sys::cuMemcpyDtoDAsync_v2(d, s, bytes, st) }.result().map_err(|e| driver("cuMemcpyDtoDAsync", e))
    }

    fn write_signal(&self, stream: StreamId, signal: &Buffer, offset: usize, value: u64) -> Result<(), BackendError> {
        let a = Self::in_buffer(signal, offset, 8)?;
        let st = self.stream(stream)?;
        self.shared.dev.current()?;
        // SAFETY: `a` is 8 bytes inside a device buffer.
        unsafe { sys::cuStreamWriteValue64_v2(st, a, value, 0) }.result().map_err(|e| driver("cuStreamWriteValue64", e))
    }

    fn wait_signal(
        &self,
        stream: StreamId,
        signal: &Buffer,
        offset: usize,
        cmp: CmpOp,
        value: u64,
    ) -> Result<(), BackendError> {
        let flags = match cmp {
            CmpOp::Ge => 0, // CU_STREAM_WAIT_VALUE_GEQ
            CmpOp::Eq => 1, // CU_STREAM_WAIT_VALUE_EQ
            other => return Err(BackendError::Host(format!("stream waits support ge and eq, not {other}"))),
        };
        let a = Self::in_buffer(signal, offset, 8)?;
        let st = self.stream(stream)?;
        self.shared.dev.current()?;
        // SAFETY: `a` is 8 bytes inside a device buffer.
        unsafe { sys::cuStreamWaitValue64_v2(st, a, value, flags) }
            .result()
            .map_err(|e| driver("cuStreamWaitValue64", e))?;
        let w = StreamWait { stream, signal: signal.name.clone(), index: offset / 8, addr: a, cmp, value };
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).push(w);
        Ok(())
    }

    fn synchronize(&self) -> Result<(), BackendError> {
        self.shared.dev.current()?;
        let streams: Vec<(StreamId, sys::CUstream)> = self.streams.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let deadline = std::time::Instant::now() + self.shared.opts.stream_wait_bound;
        let mut stuck = None;
        for (id, s) in &streams {
            if !self.drain(*s, deadline)? {
                stuck = Some(*id);
                break;
            }
        }
        if let Some(id) = stuck {
            return Err(self.release_stuck(id, &streams));
        }
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let d = &self.shared.diags[self.rank];
        let r = self.shared.dev.check_waits(&format!("a kernel of rank {}", self.rank), d, self.shared.opts.wait_bound);
        if r.is_err() {
            self.shared.dev.write(d, 0, &[0u8; 8 * diag::WORDS])?;
        }
        r
    }

    fn barrier(&self) -> Result<(), BackendError> {
        self.shared.barrier.wait(self.rank)
    }
}

#[cfg(test)]
mod tests {
    use super::HostBarrier;
    use std::sync::Arc;

    #[test]
    fn barrier_releases_all_ranks_and_a_failing_rank_breaks_it() {
        let b = Arc::new(HostBarrier::new(3));
        let hs: Vec<_> = (0..3)
            .map(|r| {
                let b = b.clone();
                std::thread::spawn(move || b.wait(r).is_ok())
            })
            .collect();
        assert!(hs.into_iter().all(|h| h.join().unwrap()));
        // Two ranks wait, the third fails instead of arriving: both get an error, no hang.
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let b = b.clone();
                std::thread::spawn(move || b.wait(r).unwrap_err().to_string())
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(50));
        b.abandon("rank 2 failed: test".into());
        for h in hs {
            assert!(h.join().unwrap().contains("rank 2 failed"));
        }
    }
}
