//! The low-latency AllGather (the LL protocol: flags inside the data): every rank ends with
//! every rank's chunk, in rank order. Variants: from the first epoch, one gather per call of
//! the suite (`ll`); and `wrap`: ten gathers back to back per call (no host synchronisation
//! between them: a fast rank runs ahead into the other half of the words), each of its own
//! chunk into its own output, from epoch 2^32 - 5, so that the sixth gather's flag wraps past
//! 2^32 - 1 to 1 (and, with the suite's calls re-poisoned, recorded and replayed, re-armed,
//! later ones again from the start).

use crate::distributed::download;
use crate::host::{poison, random};
use crate::registry::{Operation, RankOp, Registered, WorldData};
use crate::suite::Case;
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::DType;
use trident_core::world::RankCtx;
use trident_kernels::allgather_ll::{AllGatherLl, LlBuffers};

struct AllGatherLlCase;

/// The epoch of the `wrap` variant's first gather.
const WRAP_FIRST: u64 = 0xffff_fffb;
/// Gathers per call of the `wrap` variant.
const BACK_TO_BACK: usize = 10;

/// Elements per rank of one gather: the case's, or an eighth of it (even) for `wrap`, whose
/// calls make ten.
fn chunk_of(case: &Case) -> usize {
    match case.variant {
        "wrap" => (case.shape[0] / 8).next_multiple_of(2),
        _ => case.shape[0],
    }
}

/// Gathers per call of the suite: [`BACK_TO_BACK`] for `wrap`, else 1.
fn gathers_of(case: &Case) -> usize {
    if case.variant == "wrap" {
        BACK_TO_BACK
    } else {
        1
    }
}

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

    /// Each rank's input: its chunk of every back-to-back gather, one after the other; its
    /// output: gather g's every chunk in rank order, for each gather g.
    fn prepare(&self, case: &Case, rng: &mut rand::rngs::StdRng) -> WorldData {
        let (chunk, gathers) = (chunk_of(case), gathers_of(case));
        let inputs: Vec<Vec<Vec<f64>>> =
            (0..case.world).map(|_| vec![random(chunk * gathers, case.dtype, rng)]).collect();
        let all: Vec<f64> = (0..gathers)
            .flat_map(|g| inputs.iter().flat_map(move |i| i[0][g * chunk..(g + 1) * chunk].to_vec()))
            .collect();
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
        let chunk = chunk_of(case);
        let bufs = LlBuffers::starting_at(ctx, case.dtype, chunk, first)?;
        let gathers = gathers_of(case);
        let out = ctx.alloc(out_len * case.dtype.size_bytes() as usize, "allgather_ll_results")?;
        Ok(Box::new(LlRank { bufs, src: ins[0].clone(), out, out_len, gathers }))
    }
}

/// A rank's low-latency AllGather: its buffers, its chunks and where every gather of a call
/// lands.
struct LlRank {
    bufs: LlBuffers,
    src: Buffer,
    out: Buffer,
    out_len: usize,
    gathers: usize,
}

/// `bytes` bytes of `b` from `offset` on.
fn part(b: &Buffer, offset: usize, bytes: usize) -> Buffer {
    Buffer { name: b.name.clone(), address: b.address + offset as u64, bytes }
}

impl RankOp for LlRank {
    fn poison(&self, ctx: &dyn RankCtx, _call: u64) -> Result<(), BackendError> {
        ctx.fill(&self.out, &poison(self.bufs.dtype))
    }

    /// The call's gathers back to back on one stream, each from its chunk into its part of the
    /// output (kernel launches only: recordable).
    fn enqueue(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        let es = self.bufs.dtype.size_bytes() as usize;
        let (chunk, w) = (self.bufs.chunk * es, ctx.world_size());
        for g in 0..self.gathers {
            let (src, out) = (part(&self.src, g * chunk, chunk), part(&self.out, g * w * chunk, w * chunk));
            AllGatherLl::default().enqueue_into(ctx, 0, &mut self.bufs, &src, &out)?;
        }
        Ok(())
    }

    fn result(&self, ctx: &dyn RankCtx, _call: u64) -> Result<Vec<f64>, BackendError> {
        download(ctx, &self.out, self.out_len, self.bufs.dtype)
    }

    fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.bufs.rearm(ctx)
    }
}

inventory::submit! { Registered(&AllGatherLlCase) }
