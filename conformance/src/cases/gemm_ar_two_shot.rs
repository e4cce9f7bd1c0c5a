//! GEMM + AllReduce in two shots: GEMM-RS, then the AllGather of the reduced rows; every rank
//! ends with the sum over ranks of `A_r B_r` (K sharded), in the gather's buffer of the call.

use crate::distributed::download;
use crate::host::poison;
use crate::registry::{Operation, RankOp, Registered, WorldData};
use crate::suite::Case;
use trident_core::backend::{BackendError, Buffer};
use trident_core::world::RankCtx;
use trident_kernels::gemm_ar_two_shot::{GemmArTwoShot, TwoShotBuffers};

struct TwoShotCase;

impl Operation for TwoShotCase {
    fn name(&self) -> &'static str {
        "gemm_ar_two_shot"
    }

    fn distributed(&self) -> bool {
        true
    }

    /// M (a multiple of the world: GEMM-RS's shards), N, K per rank: shards of 16 rows, of 24
    /// and of one row (each rank's GEMM tile masked at its shard's end), N not a multiple of the
    /// column tile.
    fn shapes(&self, world: usize) -> Vec<Vec<usize>> {
        vec![vec![16 * world, 64, 32], vec![24 * world, 40, 24], vec![world, 48, 16]]
    }

    fn prepare(&self, case: &Case, rng: &mut rand::rngs::StdRng) -> WorldData {
        let (inputs, total) = super::gemm_ar::k_sharded_products(case, rng);
        WorldData { inputs, expected: vec![total; case.world], reduction_len: case.shape[2] * case.world, slack: 0.0 }
    }

    fn setup_rank(
        &self,
        case: &Case,
        ctx: &dyn RankCtx,
        _inputs: &[Vec<f64>],
        ins: &[Buffer],
        out_len: usize,
    ) -> Result<Box<dyn RankOp>, BackendError> {
        let (m, n, k) = (case.shape[0], case.shape[1], case.shape[2]);
        let op = GemmArTwoShot::for_world(ctx, case.dtype);
        let bufs = op.buffers(ctx, m, n)?;
        Ok(Box::new(TwoShotRank { op, bufs, a: ins[0].clone(), b: ins[1].clone(), k, out_len }))
    }
}

struct TwoShotRank {
    op: GemmArTwoShot,
    bufs: TwoShotBuffers,
    a: Buffer,
    b: Buffer,
    k: usize,
    out_len: usize,
}

impl RankOp for TwoShotRank {
    /// The half the call gathers into (the shard has no halves: an earlier call's gather may
    /// still read it).
    fn poison(&self, ctx: &dyn RankCtx, call: u64) -> Result<(), BackendError> {
        ctx.fill(&self.bufs.gather.result(call), &poison(self.op.rs.gemm.dtype))
    }

    fn enqueue(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.op.enqueue(ctx, &mut self.bufs, (&self.a, &self.b), self.k)
    }

    fn result(&self, ctx: &dyn RankCtx, call: u64) -> Result<Vec<f64>, BackendError> {
        download(ctx, &self.bufs.gather.result(call), self.out_len, self.op.rs.gemm.dtype)
    }

    fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.bufs.rearm(ctx)
    }
}

inventory::submit! { Registered(&TwoShotCase) }
