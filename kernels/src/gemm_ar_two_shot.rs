//! GEMM + AllReduce, two-shot: GEMM-RS, then an AllGather of the reduced rows.
//!
//! The one-shot form ([`crate::gemm_ar`]) pushes every tile of a rank's `M x N` partial product
//! to every rank: `(W - 1) M N` elements leave each rank, which suits decoding's small M and
//! not a prefill's (M = 28000, N = 7168 bf16 over 8 ranks: 2.8 GB a rank). Two shots move
//! `2 (W - 1) / W M N`, as a ring or two-shot AllReduce does: GEMM-RS ([`crate::gemm_rs`])
//! sends each tile only to the rank that owns its rows, overlapped with the GEMM, and reduces
//! them there; the in-kernel AllGather ([`crate::allgather::AllGather`]) then pushes each rank's
//! reduced rows to every rank. Both kernels keep their epochs on the device, so a call can be
//! recorded and replayed; the result is the gather's buffer of the call (two halves, as the
//! AllGather's: call e's stays valid until call e + 2 is enqueued).
//!
//! M must split evenly over the ranks (GEMM-RS's shards; any shard length: `GemmRs::row_block`).
//! Not yet fused: the gather starts when the reduction has finished on this rank, where a
//! reduction that pushed each summed tile to every rank would overlap the two.

use crate::allgather::{AllGather, GatherBuffers};
use crate::gemm_rs::{GemmRs, GemmRsBuffers};
use crate::require_bytes;
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::DType;
use trident_core::world::RankCtx;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmArTwoShot {
    pub rs: GemmRs,
    pub gather: AllGather,
}

/// A two-shot call's state: GEMM-RS's, this rank's reduced rows, the gather's.
pub struct TwoShotBuffers {
    pub rs: GemmRsBuffers,
    /// `[M / W, N]`: this rank's rows of the sum.
    pub shard: Buffer,
    pub gather: GatherBuffers,
}

impl TwoShotBuffers {
    /// The `M x N` sum of the last call (every rank's rows in rank order).
    pub fn result(&self) -> Buffer {
        self.gather.result(self.gather.calls)
    }

    /// Collective: every signal and epoch back to zero (after a timed-out wait).
    pub fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.rs.rearm(ctx)?;
        self.gather.rearm(ctx)
    }
}

impl GemmArTwoShot {
    /// GEMM-RS's choices for this rank's world, and the in-kernel gather.
    pub fn for_world(ctx: &dyn RankCtx, dtype: DType) -> GemmArTwoShot {
        GemmArTwoShot { rs: GemmRs::for_world(ctx, dtype), gather: AllGather::new(dtype) }
    }

    /// Collective: buffers for an `m x n` result (`m` a multiple of the world size).
    pub fn buffers(&self, ctx: &dyn RankCtx, m: usize, n: usize) -> Result<TwoShotBuffers, BackendError> {
        let rs = self.rs.buffers(ctx, m, n)?;
        let rows = m / ctx.world_size();
        let shard = ctx.alloc((rows * n).max(1) * self.rs.gemm.dtype.size_bytes() as usize, "gemm_ar_shard")?;
        let gather = GatherBuffers::new(ctx, self.rs.gemm.dtype, rows * n)?;
        Ok(TwoShotBuffers { rs, shard, gather })
    }

    /// Enqueues the next call: `bufs.result()` = `sum_p a_p @ b_p` once it has run; `a` is
    /// `m x k`, `b` `k x n` (this rank's slice of K). Three kernel launches (it can be recorded).
    pub fn enqueue(
        &self,
        ctx: &dyn RankCtx,
        bufs: &mut TwoShotBuffers,
        (a, b): (&Buffer, &Buffer),
        k: usize,
    ) -> Result<(), BackendError> {
        let es = self.rs.gemm.dtype.size_bytes() as usize;
        require_bytes(&bufs.shard, bufs.gather.chunk * es, "the shard")?;
        self.rs.enqueue(ctx, &mut bufs.rs, a, b, &bufs.shard, k)?;
        self.gather.enqueue(ctx, 0, &mut bufs.gather, &bufs.shard)?;
        Ok(())
    }

    /// [`GemmArTwoShot::enqueue`], then waits for this rank's streams and meets every rank.
    pub fn run(
        &self,
        ctx: &dyn RankCtx,
        bufs: &mut TwoShotBuffers,
        (a, b): (&Buffer, &Buffer),
        k: usize,
    ) -> Result<(), BackendError> {
        self.enqueue(ctx, bufs, (a, b), k)?;
        ctx.synchronize()?;
        ctx.barrier()
    }
}
