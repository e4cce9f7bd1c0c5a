//! The low-latency AllGather (the LL protocol: flags inside the data): every rank ends with
//! every rank's chunk, in rank order. Variants: from the first epoch (`ll`), and from epoch
//! 2^32 - 2 (`wrap`), whose third call's flag wraps past 2^32 - 1 to 1 (the suite makes several
//! calls of each case: re-poisoned, recorded and replayed, re-armed).

use crate::distributed::download;
use crate::host::{poison, random};
use crate::registry::{Operation, RankOp, Registered, WorldData};
use crate::suite::Case;
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::DType;
use trident_core::world::RankCtx;
use trident_kernels::allgather_ll::{AllGatherLl, LlBuffers};

struct AllGatherLlCase;

/// The epoch of the `wrap` variant's first call.
const WRAP_FIRST: u64 = 0xffff_fffe;

impl Operation for AllGatherLlCase {
    fn name(&self) -> &'static str {
        "allgather_ll"
    }

    fn variants(&self, _dtype: DType) -> &'static [&'static str] {
        &["ll", "wrap"]
    }

    fn distributed(&self) -> bool {
        true
    }

    /// Elements per rank: 4-byte words of 16-bit types (even counts), not a multiple of the
    /// block, and several blocks.
    fn shapes(&self, _world: usize) -> Vec<Vec<usize>> {
        vec![vec![778], vec![4096]]
    }

    fn prepare(&self, case: &Case, rng: &mut rand::rngs::StdRng) -> WorldData {
        let inputs: Vec<Vec<Vec<f64>>> = (0..case.world).map(|_| vec![random(case.shape[0], case.dtype, rng)]).collect();
        let all: Vec<f64> = inputs.iter().flat_map(|i| i[0].clone()).collect();
        WorldData { expected: vec![all; case.world], inputs, reduction_len: 1, slack: 0.0 }
    }

    /// A copy: exact.
    fn bound(&self, case: &Case, reduction_len: usize) -> f64 {
        crate::suite::bound(case.dtype, "exact", reduction_len)
    }

    fn setup_rank(
        &self,
        case: &Case,
        ctx: &dyn RankCtx,
        _inputs: &[Vec<f64>],
        ins: &[Buffer],
        out_len: usize,
    ) -> Result<Box<dyn RankOp>, BackendError> {
        let first = if case.variant == "wrap" { WRAP_FIRST } else { 1 };
        let bufs = LlBuffers::starting_at(ctx, case.dtype, case.shape[0], first)?;
        Ok(Box::new(LlRank { bufs, src: ins[0].clone(), out_len }))
    }
}

/// A rank's low-latency AllGather: its buffers and chunk.
struct LlRank {
    bufs: LlBuffers,
    src: Buffer,
    out_len: usize,
}

impl RankOp for LlRank {
    fn poison(&self, ctx: &dyn RankCtx, _call: u64) -> Result<(), BackendError> {
        ctx.fill(&self.bufs.out, &poison(self.bufs.dtype))
    }

    fn enqueue(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        AllGatherLl::default().enqueue(ctx, 0, &mut self.bufs, &self.src)
    }

    fn result(&self, ctx: &dyn RankCtx, _call: u64) -> Result<Vec<f64>, BackendError> {
        download(ctx, &self.bufs.out, self.out_len, self.bufs.dtype)
    }

    fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.bufs.rearm(ctx)
    }
}

inventory::submit! { Registered(&AllGatherLlCase) }
