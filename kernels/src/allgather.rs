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
//! Signals carry an epoch that the host increments per call and waits compare with `>=`, so
//! nothing is ever reset and a stale signal cannot satisfy a later call.

use crate::{cdiv, require_bytes, require_i32};
use trident_core::backend::{BackendError, Buffer, KernelArg};
use trident_core::ir::{Axis, CmpOp, CommScope, DType, LaunchAttrs, MemSemantic, Scope, SignalOp};
use trident_core::world::{RankCtx, StreamId};
use trident_core::{Function, KernelBuilder, VerifyError};

/// Symmetric state of an AllGather of `chunk` elements per rank.
pub struct GatherBuffers {
    /// `[world][chunk]` gathered elements (symmetric).
    pub out: Buffer,
    /// `[world]` u64 arrival signals (symmetric).
    pub ready: Buffer,
    pub chunk: usize,
    /// The last call's epoch.
    pub epoch: u64,
}

impl GatherBuffers {
    /// Collective: allocates the symmetric buffers on every rank.
    pub fn new(ctx: &dyn RankCtx, dtype: DType, chunk: usize) -> Result<GatherBuffers, BackendError> {
        let w = ctx.world_size();
        let out = ctx.symm_alloc(w * chunk * dtype.size_bytes() as usize, "allgather_out")?;
        let ready = ctx.symm_alloc(w * 8, "allgather_ready")?;
        Ok(GatherBuffers { out, ready, chunk, epoch: 0 })
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

    /// The default grid cap: 8 ranks sharing one H200 (12 resident programs per multiprocessor, 132
    /// of them) can all be resident, as a waiting kernel must be.
    pub const MAX_PROGRAMS: u32 = 128;

    pub fn build(&self) -> Result<Function, VerifyError> {
        let b = KernelBuilder::new(&format!("allgather_push_{}_{}", self.dtype, self.block), LaunchAttrs::default());
        let (src, out) = (b.arg_ptr("src", self.dtype), b.arg_ptr("out", self.dtype));
        let ready = b.arg_ptr("ready", DType::U64);
        let (chunk, target) = (b.arg("chunk", DType::I32), b.arg("target", DType::U64));
        let (me, world, pid) = (b.rank(), b.num_ranks(), b.program_id_x());
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
        b.finish()
    }

    /// Enqueues the gather of `src` (this rank's chunk) on `stream` for call `epoch`; returns the
    /// signal value that marks a chunk as arrived.
    pub fn enqueue(
        &self,
        ctx: &dyn RankCtx,
        stream: StreamId,
        bufs: &GatherBuffers,
        src: &Buffer,
        epoch: u64,
    ) -> Result<u64, BackendError> {
        require_bytes(src, bufs.chunk * self.dtype.size_bytes() as usize, "src")?;
        let chunk = require_i32(bufs.chunk, "chunk")?;
        let kernel = ctx.compile(&format!("{self:?}"), &|| self.build())?;
        let programs = self.programs(bufs.chunk);
        let target = epoch * programs as u64;
        let args = [src.arg(), bufs.out.arg(), bufs.ready.arg(), KernelArg::i32(chunk), KernelArg::u64(target)];
        ctx.launch(stream, &kernel, [programs, 1, 1], &args)?;
        Ok(target)
    }

    /// Gathers every rank's `src` into `bufs.out`; returns when this rank has every chunk and
    /// every rank finished the call.
    pub fn run(&self, ctx: &dyn RankCtx, bufs: &mut GatherBuffers, src: &Buffer) -> Result<(), BackendError> {
        bufs.epoch += 1;
        self.enqueue(ctx, 0, bufs, src, bufs.epoch)?;
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
    /// Enqueues this rank's pushes on `stream`: its own chunk first, then peers r+1, r+2, ...;
    /// each copy is followed by the stream write of `ready[r] = epoch` on its destination.
    pub fn enqueue(
        &self,
        ctx: &dyn RankCtx,
        stream: StreamId,
        bufs: &GatherBuffers,
        src: &Buffer,
        epoch: u64,
    ) -> Result<u64, BackendError> {
        let bytes = bufs.chunk * self.dtype.size_bytes() as usize;
        require_bytes(src, bytes, "src")?;
        let (r, w) = (ctx.rank(), ctx.world_size());
        for k in 0..w {
            let p = (r + k) % w;
            let (out, ready) = (ctx.peer(&bufs.out, p)?, ctx.peer(&bufs.ready, p)?);
            ctx.copy(stream, &out, r * bytes, src, 0, bytes)?;
            ctx.write_signal(stream, &ready, r * 8, epoch)?;
        }
        Ok(epoch)
    }

    /// Gathers every rank's `src` into `bufs.out` (waits on stream 0 for every peer's signal).
    pub fn run(&self, ctx: &dyn RankCtx, bufs: &mut GatherBuffers, src: &Buffer) -> Result<(), BackendError> {
        bufs.epoch += 1;
        self.enqueue(ctx, 1, bufs, src, bufs.epoch)?;
        for c in 0..ctx.world_size() {
            ctx.wait_signal(0, &bufs.ready, c * 8, CmpOp::Ge, bufs.epoch)?;
        }
        ctx.synchronize()?;
        ctx.barrier()
    }
}

inventory::submit! {
    crate::Catalogued { name: "allgather", operation: "allgather", distributed: true, build: |d| AllGather::new(d).build() }
}
