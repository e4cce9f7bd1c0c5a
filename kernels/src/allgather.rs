//! AllGather: every rank ends with every rank's chunk, `out[c]` = rank c's input.
//!
//! Two ways to move the data (`KERNELS.md`):
//! * [`AllGather`], in kernel (low latency): each program of rank r stores its slice of the chunk
//!   into `out[r]` on every rank through `symm_at` (a grid of at most 128 programs, each looping
//!   over its blocks) and then adds 1 to `ready[r]` there with `notify`;
//!   program 0 then waits until every peer's `ready[p]` reached `epoch * programs`.
//! * [`AllGatherCe`], copy engine: rank r's copy stream copies its chunk into `out[r]` on each
//!   peer (starting at r+1, so links are used evenly) and then writes `ready[r] = epoch` there,
//!   a stream write ordered after the copy.
//!
//! Signals carry the call's epoch and waits compare with `>=`, so nothing is ever reset and a
//! stale signal cannot satisfy a later call. The in-kernel gather keeps its epoch on the device
//! and writes half `epoch mod 2` of `out` (`crate::epoch`): recorded once, it replays. The copy
//! engine's stream writes carry values fixed when enqueued: its epoch is the host's count of
//! calls (the same number), and it cannot be recorded. A buffer set serves one of the two.

use crate::{cdiv, require_bytes, require_i32};
use trident_core::backend::{BackendError, Buffer, KernelArg};
use trident_core::ir::{Axis, CmpOp, CommScope, DType, LaunchAttrs, MemSemantic, Scope, SignalOp};
use trident_core::world::{RankCtx, StreamId};
use trident_core::{Function, KernelBuilder, VerifyError};

/// Symmetric state of an AllGather of `chunk` elements per rank.
pub struct GatherBuffers {
    /// Two halves of `[world][chunk]` gathered elements (symmetric): call e fills half e mod 2
    /// (one half for AG-GEMM's gather: [`GatherBuffers::single`]).
    pub out: Buffer,
    /// `[world]` u64 arrival signals (symmetric).
    pub ready: Buffer,
    /// The in-kernel gather's epoch words (`crate::epoch`, symmetric).
    pub epochs: Buffer,
    pub chunk: usize,
    pub dtype: DType,
    /// Calls enqueued from this host (the copy engine's epoch; the number of the last call).
    pub calls: u64,
    /// Halves of `out`: 2, or 1 where the consumer reads it through a TMA descriptor, which
    /// the host encodes from a kernel argument and so cannot move to the other half on the
    /// device (AG-GEMM).
    pub halves: usize,
}

impl GatherBuffers {
    /// Collective: allocates the symmetric buffers on every rank, `out` in two halves.
    pub fn new(ctx: &dyn RankCtx, dtype: DType, chunk: usize) -> Result<GatherBuffers, BackendError> {
        Self::with_halves(ctx, dtype, chunk, 2)
    }

    /// Collective: as [`GatherBuffers::new`] with `out` in one piece: the caller sees to it that
    /// every rank finished consuming call e before any rank starts call e+1.
    pub fn single(ctx: &dyn RankCtx, dtype: DType, chunk: usize) -> Result<GatherBuffers, BackendError> {
        Self::with_halves(ctx, dtype, chunk, 1)
    }

    fn with_halves(ctx: &dyn RankCtx, dtype: DType, chunk: usize, halves: usize) -> Result<GatherBuffers, BackendError> {
        let w = ctx.world_size();
        require_i32(halves * w * chunk, "the gathered elements")?;
        let es = dtype.size_bytes() as usize;
        let bytes = if halves == 2 { crate::epoch::halves_bytes(w * chunk, es) } else { w * chunk * es };
        let out = ctx.symm_alloc(bytes, "allgather_out")?;
        let ready = ctx.symm_alloc(w * 8, "allgather_ready")?;
        let epochs = crate::epoch::words(ctx, 1, "allgather_epochs")?;
        Ok(GatherBuffers { out, ready, epochs, chunk, dtype, calls: 0, halves })
    }

    /// The gathered elements of call `call` (numbered from 1): valid until call `call + 2` is
    /// enqueued (`crate::epoch`), or `call + 1` with one half.
    pub fn result(&self, call: u64) -> Buffer {
        if self.halves == 2 {
            crate::epoch::half_of(&self.out, call)
        } else {
            self.out.clone()
        }
    }

    /// Elements the kernel moves `out` by for the other half (0 with one half).
    fn half_elements(&self, world: usize) -> usize {
        if self.halves == 2 {
            world * self.chunk
        } else {
            0
        }
    }

    /// Collective: signals and epochs back to zero on every rank (after a timed-out wait).
    pub fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.calls = 0;
        crate::epoch::rearm(ctx, &[&self.ready, &self.epochs])
    }
}

/// In-kernel push AllGather.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AllGather {
    pub dtype: DType,
    /// Elements per program and loop step.
    pub block: u32,
    /// The grid cap ([`AllGather::programs`]).
    pub max_programs: u32,
}

impl AllGather {
    pub fn new(dtype: DType) -> AllGather {
        AllGather { dtype, block: 1024, max_programs: Self::MAX_PROGRAMS }
    }

    /// Programs per rank for a chunk (each adds 1 to every peer's signal): one per block of
    /// the chunk, at most `max_programs` (each then loops over its blocks).
    pub fn programs(&self, chunk: usize) -> u32 {
        cdiv(chunk.max(1), self.block as usize).min(self.max_programs.max(1) as usize) as u32
    }

    /// The form to run for a chunk of `chunk` elements of `dtype` per rank in `ctx`'s world:
    /// low-latency, push or copy engine, by the gathered bytes and the crossovers measured for
    /// this device, transport and world (`crate::allgather_auto`).
    pub fn auto(ctx: &dyn RankCtx, dtype: DType, chunk: usize) -> crate::allgather_auto::GatherForm {
        crate::allgather_auto::auto(ctx, dtype, chunk)
    }

    /// The default grid cap: 8 ranks sharing one H200 (12 resident programs per multiprocessor, 132
    /// of them) can all be resident, as a waiting kernel must be.
    pub const MAX_PROGRAMS: u32 = 128;

    pub fn build(&self) -> Result<Function, VerifyError> {
        let b = KernelBuilder::new(&format!("allgather_push_{}_{}", self.dtype, self.block), LaunchAttrs::default());
        let (src, out_halves) = (b.arg_ptr("src", self.dtype), b.arg_ptr("out", self.dtype));
        let (ready, epochs) = (b.arg_ptr("ready", DType::U64), b.arg_ptr("epochs", DType::U64));
        let (chunk, half) = (b.arg("chunk", DType::I32), b.arg("half", DType::I32));
        let (me, world, pid) = (b.rank(), b.num_ranks(), b.program_id_x());
        let epoch = crate::epoch::Epoch::begin(&b, epochs);
        let out = epoch.half(out_halves, half);
        // Every program adds 1 to each rank's `ready[me]` per call.
        let target = epoch.times(b.num_programs(Axis::X));
        // Blocks pid, pid + programs, ...: the grid is capped ([`AllGather::programs`]) so that
        // every program of a waiting kernel can be resident, also with several ranks sharing
        // one GPU.
        let blocks = (chunk + (self.block as i32 - 1)) / self.block as i32;
        b.for_range(pid, blocks, b.num_programs(Axis::X), &[], |blk, _| {
            let offs = blk * self.block as i32 + b.arange(0, self.block as i64);
            let mask = offs.lt(chunk);
            let x = b.load(src + offs, Some(mask), None);
            let dst = me * chunk + offs;
            b.for_range(0, world, 1, &[], |p, _| {
                b.store(b.symm_at(out, p) + dst, x, Some(mask));
                vec![]
            });
            vec![]
        });
        b.for_range(0, world, 1, &[], |p, _| {
            b.notify(ready + me, p, 1u64, SignalOp::Add, CommScope::IntraNode);
            vec![]
        });
        b.if_then(pid.eq(0), || {
            b.for_range(0, world, 1, &[], |p, _| {
                b.if_then(p.ne(me), || {
                    b.wait(ready + p, 1, CmpOp::Ge, target, Scope::Sys, MemSemantic::Acquire);
                });
                vec![]
            });
        });
        epoch.end(&b);
        b.finish()
    }

    /// Enqueues the next call's gather of `src` (this rank's chunk) on `stream` (a kernel
    /// launch: it can be recorded); returns what each call adds to a chunk's `ready` signal.
    pub fn enqueue(
        &self,
        ctx: &dyn RankCtx,
        stream: StreamId,
        bufs: &mut GatherBuffers,
        src: &Buffer,
    ) -> Result<u64, BackendError> {
        require_bytes(src, bufs.chunk * self.dtype.size_bytes() as usize, "src")?;
        let chunk = require_i32(bufs.chunk, "chunk")?;
        let kernel = ctx.compile(&format!("{self:?}"), &|| self.build())?;
        let programs = self.programs(bufs.chunk);
        let half = KernelArg::i32(bufs.half_elements(ctx.world_size()) as i32);
        let args = [src.arg(), bufs.out.arg(), bufs.ready.arg(), bufs.epochs.arg(), KernelArg::i32(chunk), half];
        ctx.launch(stream, &kernel, [programs, 1, 1], &args)?;
        bufs.calls += 1;
        Ok(programs as u64)
    }

    /// Gathers every rank's `src` into `bufs.result(bufs.calls)`; returns when this rank has
    /// every chunk and every rank finished the call.
    pub fn run(&self, ctx: &dyn RankCtx, bufs: &mut GatherBuffers, src: &Buffer) -> Result<(), BackendError> {
        self.enqueue(ctx, 0, bufs, src)?;
        ctx.synchronize()?;
        ctx.barrier()
    }
}

/// Copy-engine AllGather.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AllGatherCe {
    pub dtype: DType,
}

impl AllGatherCe {
    /// Enqueues the next call's pushes on `stream`: its own chunk first, then peers r+1, r+2,
    /// ...; each copy is followed by the stream write of `ready[r] = epoch` on its destination
    /// (not recordable: the values are fixed when enqueued). Returns what each call adds to a
    /// chunk's `ready` signal (it is set to the call's number).
    pub fn enqueue(
        &self,
        ctx: &dyn RankCtx,
        stream: StreamId,
        bufs: &mut GatherBuffers,
        src: &Buffer,
    ) -> Result<u64, BackendError> {
        self.enqueue_on(ctx, (stream, stream), bufs, src)
    }

    /// [`AllGatherCe::enqueue`] with the rank's own chunk (and its signal) on stream `own` and
    /// the pushes to its peers on stream `peers`: a kernel enqueued on `own` after it then
    /// waits on its device only for work before it on its stream or for other devices' copies
    /// (`LaunchAttrs::signalled_before`, where the rank has its device to itself).
    pub fn enqueue_on(
        &self,
        ctx: &dyn RankCtx,
        (own, peers): (StreamId, StreamId),
        bufs: &mut GatherBuffers,
        src: &Buffer,
    ) -> Result<u64, BackendError> {
        let bytes = bufs.chunk * self.dtype.size_bytes() as usize;
        require_bytes(src, bytes, "src")?;
        let (r, w) = (ctx.rank(), ctx.world_size());
        let epoch = bufs.calls + 1;
        let out = bufs.result(epoch);
        for k in 0..w {
            let p = (r + k) % w;
            let (out, ready) = (ctx.peer(&out, p)?, ctx.peer(&bufs.ready, p)?);
            let stream = if k == 0 { own } else { peers };
            ctx.copy(stream, &out, r * bytes, src, 0, bytes)?;
            ctx.write_signal(stream, &ready, r * 8, epoch)?;
        }
        bufs.calls = epoch;
        Ok(1)
    }

    /// Gathers every rank's `src` into `bufs.result(bufs.calls)` (waits on stream 0 for every
    /// peer's signal).
    pub fn run(&self, ctx: &dyn RankCtx, bufs: &mut GatherBuffers, src: &Buffer) -> Result<(), BackendError> {
        self.enqueue(ctx, 1, bufs, src)?;
        for c in 0..ctx.world_size() {
            ctx.wait_signal(0, &bufs.ready, c * 8, CmpOp::Ge, bufs.calls)?;
        }
        ctx.synchronize()?;
        ctx.barrier()
    }
}

inventory::submit! {
    crate::Catalogued { name: "allgather", operation: "allgather", distributed: true, build: |d| AllGather::new(d).build() }
}
