//! The expert-parallel MoE block (decode): the library's kernels composed on the host, one
//! stream, no host synchronisation:
//!
//! 1. low-latency dispatch ([`LowLatencyAllToAll`]): each token to the ranks of its top-k
//!    experts, received as `recv [E_local, W T_max, H]` with a count per local expert;
//! 2. grouped GEMM gate/up with SwiGLU ([`GroupedGemm`], masked layout: it reads `recv` and the
//!    counts as dispatch left them): `act [E_local, W T_max, F] = silu(x W_gate^T) * (x W_up^T)`
//!    with `w1 [E_local, 2F, H]` holding each expert's gate and up rows interleaved by
//!    [`SWIGLU_BLOCK`] ([`crate::grouped_gemm::swiglu_gate_row`]);
//! 3. grouped GEMM down: `y [E_local, W T_max, H] = act w2^T` with `w2 [E_local, H, F]`;
//! 4. low-latency combine: `y`'s rows back to their tokens' ranks, summed there with the
//!    routing weights into `[T, H]`.
//!
//! Each rank holds its own experts' weights. Rows past an expert's count are never read or
//! written by the GEMMs (the masked layout), so the buffers need no clearing between calls.
//! The dispatch's buffer-reuse invariant covers the block: `act` and `y` are this rank's own,
//! written and read in stream order within the call.

use crate::ep_all_to_all::{EpBuffers, EpShape, LowLatencyAllToAll, Part};
use crate::grouped_gemm::{BLayout, Epilogue, GroupedGemm, Groups, Layout, Operands, SWIGLU_BLOCK};
use crate::require_bytes;
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::DType;
use trident_core::world::RankCtx;

/// The block's meta-parameters: the element type (bf16 or f16: activations, weights and
/// output) and the experts' intermediate size `F` (a multiple of [`SWIGLU_BLOCK`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpMoeBlock {
    pub dtype: DType,
    pub ffn: usize,
}

/// A rank's buffers of the block: the all-to-all's, and the experts' intermediate `act` and
/// output `y` in the masked layout.
pub struct EpMoeBuffers {
    pub ep: EpBuffers,
    pub act: Buffer,
    pub y: Buffer,
}

impl EpMoeBlock {
    pub fn new(dtype: DType, ffn: usize) -> EpMoeBlock {
        EpMoeBlock { dtype, ffn }
    }

    fn all_to_all(&self) -> LowLatencyAllToAll {
        LowLatencyAllToAll::new(self.dtype)
    }

    fn problem(&self, message: String) -> BackendError {
        BackendError::Problem { kernel: "moe_block".into(), message }
    }

    /// Collective: this rank's buffers for calls of `shape`.
    pub fn buffers(&self, ctx: &dyn RankCtx, shape: EpShape) -> Result<EpMoeBuffers, BackendError> {
        if !matches!(self.dtype, DType::BF16 | DType::F16) {
            return Err(self.problem(format!("element type `{}`: bf16 or f16", self.dtype)));
        }
        if self.ffn == 0 || !self.ffn.is_multiple_of(SWIGLU_BLOCK as usize) {
            return Err(self.problem(format!(
                "intermediate size {}: a positive multiple of {SWIGLU_BLOCK} (SwiGLU's gate/up blocks)",
                self.ffn
            )));
        }
        shape.check(ctx.world_size())?;
        let ep = self.all_to_all().buffers(ctx, shape)?;
        let (rows, es) = (self.rows(shape, ctx.world_size()), self.dtype.size_bytes() as usize);
        let act = ctx.alloc(rows * self.ffn * es, "moe_act")?;
        let y = ctx.alloc(rows * shape.hidden * es, "moe_y")?;
        Ok(EpMoeBuffers { ep, act, y })
    }

    /// Rows of the masked layout on a rank: every local expert's capacity `W T_max`.
    fn rows(&self, shape: EpShape, world: usize) -> usize {
        (shape.experts / world) * world * shape.t_max
    }

    /// The two grouped GEMMs for this rank's target: gate/up with SwiGLU, and down.
    fn gemms(&self, ctx: &dyn RankCtx) -> (GroupedGemm, GroupedGemm) {
        let base = GroupedGemm::for_target(self.dtype, Layout::Masked, BLayout::NK, ctx.gpu_target());
        // The device-made schedule needs a scratch buffer; bf16 walks its groups itself.
        let base = GroupedGemm { scheduled: false, ..base };
        (base.with_epilogue(Epilogue { swiglu: true, row_weights: false }), base)
    }

    /// Enqueues the block for `tokens` rows of `x` (`[tokens, H]`) routed by `topk` (`[tokens,
    /// k]` i32, -1 none) with `weights` (`[tokens, k]` f32), through this rank's experts `w1`
    /// (`[E_local, 2F, H]`, gate/up interleaved) and `w2` (`[E_local, H, F]`): the result in
    /// `bufs.ep.out` (`[tokens, H]`), valid until the next call is enqueued.
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue(
        &self,
        ctx: &dyn RankCtx,
        bufs: &mut EpMoeBuffers,
        x: &Buffer,
        topk: &Buffer,
        weights: &Buffer,
        (w1, w2): (&Buffer, &Buffer),
        tokens: usize,
    ) -> Result<(), BackendError> {
        let (shape, w) = (bufs.ep.shape, ctx.world_size());
        let (el, h, f, es) = (shape.experts / w, shape.hidden, self.ffn, self.dtype.size_bytes() as usize);
        require_bytes(w1, el * 2 * f * h * es, "w1")?;
        require_bytes(w2, el * h * f * es, "w2")?;
        let (up, down) = self.gemms(ctx);
        // Every kernel compiled before the first launch (the world's compiles are collective).
        let all = self.all_to_all();
        let capacity = w * shape.t_max;
        let recv_count = bufs.ep.recv_count.clone();
        let gate_up = (up, Operands::new(&bufs.ep.recv, w1, &bufs.act, &recv_count), Groups::new(el, 2 * f, h, capacity));
        let out = (down, Operands::new(&bufs.act, w2, &bufs.y, &recv_count), Groups::new(el, h, f, capacity));
        let gate_up = prepare(ctx, gate_up)?;
        let out = prepare(ctx, out)?;
        all.dispatch(ctx, &mut bufs.ep, x, topk, tokens, Part::Whole)?;
        for (kernel, launch) in [gate_up, out].into_iter().flatten() {
            let (grid, args) = launch;
            ctx.launch(0, &kernel, grid, &args)?;
        }
        let y = bufs.y.clone();
        all.combine(ctx, &mut bufs.ep, &y, topk, weights, tokens, Part::Whole)
    }
}

/// A grouped GEMM specialized for its operands, compiled, and its launch planned (`None`: no
/// tiles).
type Prepared = Option<(trident_core::backend::Artifact, crate::grouped_gemm::Launch)>;

fn prepare(ctx: &dyn RankCtx, (op, ops, p): (GroupedGemm, Operands<'_>, Groups)) -> Result<Prepared, BackendError> {
    let op = op.specialized(ops.a, ops.b, p.n, p.k);
    let Some(launch) = op.plan(ops, p)? else { return Ok(None) };
    let kernel = ctx.compile(&format!("{op:?}"), &|| op.build())?;
    Ok(Some((kernel, launch)))
}
