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
//! With `high_throughput` (prefill) the exchange is [`HighThroughputAllToAll`]'s instead: each
//! token sent once per rank, received packed per local expert (`recv [capacity, H]` with the
//! segments' ends `offs`), which the grouped GEMMs read in their contiguous layout; combine
//! applies the routing weights on the expert's rank and sums the partials at home.
//!
//! The FP8 block ([`EpMoeBlock::fp8`], either exchange), as DeepSeek-V3 serves: dispatch
//! quantizes each token to E4M3FN with a scale per 128 channels; both grouped GEMMs are
//! block-scaled FP8 (weights E4M3FN with a scale per 128 x 128 block, [`Experts::fp8`]); the
//! gate/up GEMM's epilogue quantizes the SwiGLU output the same way ([`Epilogue::quantize`]:
//! `act` E4M3FN and its scales, the down GEMM's A); `y` and the combine stay in the block's
//! element type.
//!
//! Each rank holds its own experts' weights. Rows past an expert's count are never read or
//! written by the GEMMs (the masked layout), so the buffers need no clearing between calls.
//! The dispatch's buffer-reuse invariant covers the block: `act` and `y` are this rank's own,
//! written and read in stream order within the call.

use crate::ep_all_to_all::{EpBuffers, EpShape, LowLatencyAllToAll, Part};
use crate::ep_high_throughput::{HighThroughputAllToAll, HtBuffers};
use crate::grouped_gemm::{BLayout, Epilogue, GroupedGemm, Groups, Layout, Operands, Scales, SWIGLU_BLOCK};
use crate::scaled_gemm::SCALE_BLOCK;
use crate::require_bytes;
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::DType;
use trident_core::world::RankCtx;

/// The block's meta-parameters: the element type (bf16 or f16: activations, weights and
/// output; with `fp8`, the tokens' and the output's), the experts' intermediate size `F` (a
/// multiple of [`SWIGLU_BLOCK`]) and the exchange (low-latency, or high-throughput for
/// prefill).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpMoeBlock {
    pub dtype: DType,
    pub ffn: usize,
    pub high_throughput: bool,
    /// FP8 experts (see the module's text): hidden size a multiple of 128.
    pub fp8: bool,
}

/// A rank's experts: `w1` (`[E, 2F, H]`, each expert's gate and up rows interleaved by
/// [`SWIGLU_BLOCK`]) and `w2` (`[E, H, F]`), in the block's element type; or, for an FP8
/// block, E4M3FN with their block scales (f32, one per 128 x 128 block of each expert's
/// matrix: `[E, 2F / 128, ceil(H / 128)]` and `[E, ceil(H / 128), F / 128]`).
#[derive(Clone, Copy)]
pub struct Experts<'a> {
    pub w1: &'a Buffer,
    pub w2: &'a Buffer,
    pub scales: Option<(&'a Buffer, &'a Buffer)>,
}

impl<'a> Experts<'a> {
    /// FP8 experts: `w1` and `w2` E4M3FN, `s1` and `s2` their block scales.
    pub fn fp8((w1, s1): (&'a Buffer, &'a Buffer), (w2, s2): (&'a Buffer, &'a Buffer)) -> Experts<'a> {
        Experts { w1, w2, scales: Some((s1, s2)) }
    }
}

/// Experts in the block's element type.
impl<'a> From<(&'a Buffer, &'a Buffer)> for Experts<'a> {
    fn from((w1, w2): (&'a Buffer, &'a Buffer)) -> Experts<'a> {
        Experts { w1, w2, scales: None }
    }
}

/// The exchange's buffers.
pub enum Exchange {
    LowLatency(EpBuffers),
    HighThroughput(HtBuffers),
}

/// A rank's buffers of the block: the exchange's, and the experts' intermediate `act` and
/// output `y` in the grouped GEMMs' layout (masked, or contiguous after the high-throughput
/// exchange).
pub struct EpMoeBuffers {
    pub exchange: Exchange,
    pub act: Buffer,
    /// `act`'s scales in an FP8 block (`[rows, F / 128]` f32).
    pub act_scales: Option<Buffer>,
    pub y: Buffer,
}

impl EpMoeBuffers {
    /// The block's result `[T, H]` of the last call.
    pub fn out(&self) -> &Buffer {
        match &self.exchange {
            Exchange::LowLatency(b) => &b.out,
            Exchange::HighThroughput(b) => &b.out,
        }
    }

    /// Where the block's result goes (a caller may put its own tensor there for a call).
    pub fn out_mut(&mut self) -> &mut Buffer {
        match &mut self.exchange {
            Exchange::LowLatency(b) => &mut b.out,
            Exchange::HighThroughput(b) => &mut b.out,
        }
    }

    /// Collective: the exchange's signals and epochs back to zero on every rank.
    pub fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        match &mut self.exchange {
            Exchange::LowLatency(b) => b.rearm(ctx),
            Exchange::HighThroughput(b) => b.rearm(ctx),
        }
    }
}

impl EpMoeBlock {
    /// The low-latency block (decode).
    pub fn new(dtype: DType, ffn: usize) -> EpMoeBlock {
        EpMoeBlock { dtype, ffn, high_throughput: false, fp8: false }
    }

    /// This block with FP8 experts (see the module's text).
    pub fn fp8(self) -> EpMoeBlock {
        EpMoeBlock { fp8: true, ..self }
    }

    /// The low-latency exchange of this block.
    fn low_latency(&self) -> LowLatencyAllToAll {
        LowLatencyAllToAll { quantize: self.fp8, ..LowLatencyAllToAll::new(self.dtype) }
    }

    /// The high-throughput exchange of this block.
    fn high_throughput_exchange(&self) -> HighThroughputAllToAll {
        HighThroughputAllToAll { quantize: self.fp8, ..HighThroughputAllToAll::new(self.dtype) }
    }

    /// This block with the high-throughput exchange (prefill).
    pub fn high_throughput(self) -> EpMoeBlock {
        EpMoeBlock { high_throughput: true, ..self }
    }

    fn problem(&self, message: String) -> BackendError {
        BackendError::Problem { kernel: "moe_block".into(), message }
    }

    /// Collective: this rank's buffers for calls of `shape`.
    pub fn buffers(&self, ctx: &dyn RankCtx, shape: EpShape) -> Result<EpMoeBuffers, BackendError> {
        check_block(self.dtype, ("intermediate size", self.ffn)).map_err(|m| self.problem(m))?;
        // Each exchange's `buffers` checks `shape` against the world (and an FP8 one the hidden
        // size against its 128-channel blocks).
        let exchange = match self.high_throughput {
            false => Exchange::LowLatency(self.low_latency().buffers(ctx, shape)?),
            true => Exchange::HighThroughput(self.high_throughput_exchange().buffers(ctx, shape)?),
        };
        let rows = match &exchange {
            Exchange::LowLatency(_) => (shape.experts / ctx.world_size()) * ctx.world_size() * shape.t_max,
            Exchange::HighThroughput(b) => b.capacity(ctx.world_size()),
        };
        let es = self.dtype.size_bytes() as usize;
        let (act, act_scales) = match self.fp8 {
            false => (ctx.alloc(rows * self.ffn * es, "moe_act")?, None),
            true => {
                let blocks = self.ffn / SCALE_BLOCK as usize;
                (ctx.alloc(rows * self.ffn, "moe_act")?, Some(ctx.alloc(rows * blocks * 4, "moe_act_scales")?))
            }
        };
        let y = ctx.alloc(rows * shape.hidden * es, "moe_y")?;
        Ok(EpMoeBuffers { exchange, act, act_scales, y })
    }

    /// The two grouped GEMMs for this rank's target and the exchange's layout: gate/up with
    /// SwiGLU, and down.
    fn gemms(&self, ctx: &dyn RankCtx) -> (GroupedGemm, GroupedGemm) {
        let layout = if self.high_throughput { Layout::Contiguous } else { Layout::Masked };
        let dtype = if self.fp8 { DType::F8E4M3FN } else { self.dtype };
        let base = GroupedGemm::for_target(dtype, layout, BLayout::NK, ctx.gpu_target());
        // The device-made schedule needs a scratch buffer; bf16 walks its groups itself.
        let base = GroupedGemm { scheduled: false, fp8_out: self.dtype, ..base };
        let base = if self.fp8 { base.with_scales(Scales::Block, false) } else { base };
        let up = Epilogue { swiglu: true, quantize: self.fp8, ..Epilogue::default() };
        (base.with_epilogue(up), base)
    }

    /// Enqueues the block for `tokens` rows of `x` (`[tokens, H]`) routed by `topk` (`[tokens,
    /// k]` i32, -1 none) with `weights` (`[tokens, k]` f32), through this rank's `experts`
    /// (`E_local` of them; FP8 with their scales in an FP8 block): the result in `bufs.out()`
    /// (`[tokens, H]`), valid until the next call is enqueued.
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue<'a>(
        &self,
        ctx: &dyn RankCtx,
        bufs: &mut EpMoeBuffers,
        x: &Buffer,
        topk: &Buffer,
        weights: &Buffer,
        experts: impl Into<Experts<'a>>,
        tokens: usize,
    ) -> Result<(), BackendError> {
        let w = ctx.world_size();
        let Experts { w1, w2, scales } = experts.into();
        let (shape, recv, groups, rows) = match &bufs.exchange {
            Exchange::LowLatency(b) => (b.shape, b.recv.clone(), b.recv_count.clone(), w * b.shape.t_max),
            Exchange::HighThroughput(b) => (b.shape, b.recv.clone(), b.offs.clone(), b.capacity(w)),
        };
        let (el, h, f) = (shape.experts / w, shape.hidden, self.ffn);
        let es = if self.fp8 { 1 } else { self.dtype.size_bytes() as usize };
        require_bytes(w1, el * 2 * f * h * es, "w1")?;
        require_bytes(w2, el * h * f * es, "w2")?;
        // Every kernel compiled before the first launch (the world's compiles are collective).
        let (up, down) = self.gemms(ctx);
        let mut up_ops = Operands::new(&recv, w1, &bufs.act, &groups);
        let mut down_ops = Operands::new(&bufs.act, w2, &bufs.y, &groups);
        let fp8_scales;
        match (self.fp8, scales, &bufs.exchange, &bufs.act_scales) {
            (true, Some((s1, s2)), exchange, Some(act_scales)) => {
                let recv_scales = match exchange {
                    Exchange::LowLatency(b) => &b.recv_scales,
                    Exchange::HighThroughput(b) => &b.recv_scales,
                };
                fp8_scales = (recv_scales.clone(), act_scales.clone());
                (up_ops.scales, up_ops.c_scales) = (Some((&fp8_scales.0, s1)), Some(&fp8_scales.1));
                down_ops.scales = Some((&fp8_scales.1, s2));
            }
            (false, None, _, _) => {}
            (true, None, ..) => return Err(self.problem("FP8 experts need their block scales (`Experts::fp8`)".into())),
            (false, Some(_), ..) => return Err(self.problem("scales given to experts of the block's element type".into())),
            (true, Some(_), ..) => return Err(self.problem("buffers made by a block without FP8".into())),
        }
        let gate_up = prepare(ctx, (up, up_ops, Groups::new(el, 2 * f, h, rows)))?;
        let out = prepare(ctx, (down, down_ops, Groups::new(el, h, f, rows)))?;
        let y = bufs.y.clone();
        let experts = |ctx: &dyn RankCtx| -> Result<(), BackendError> {
            for (kernel, (grid, args)) in [&gate_up, &out].into_iter().flatten() {
                ctx.launch(0, kernel, *grid, args)?;
            }
            Ok(())
        };
        match &mut bufs.exchange {
            Exchange::LowLatency(b) => {
                let all = self.low_latency();
                all.dispatch(ctx, b, x, topk, tokens, Part::Whole)?;
                experts(ctx)?;
                all.combine(ctx, b, &y, topk, weights, tokens, Part::Whole)
            }
            Exchange::HighThroughput(b) => {
                let all = self.high_throughput_exchange();
                all.dispatch(ctx, b, x, topk, weights, tokens)?;
                experts(ctx)?;
                all.combine(ctx, b, &y, tokens)
            }
        }
    }
}

/// What both MoE blocks take: bf16 or f16, and an intermediate size (`what`: the whole or a
/// rank's shard) of whole SwiGLU blocks. The message of the first thing wrong.
pub(crate) fn check_block(dtype: DType, (what, ffn): (&str, usize)) -> Result<(), String> {
    if !matches!(dtype, DType::BF16 | DType::F16) {
        return Err(format!("element type `{dtype}`: bf16 or f16"));
    }
    if ffn == 0 || !ffn.is_multiple_of(SWIGLU_BLOCK as usize) {
        return Err(format!("{what} {ffn}: a positive multiple of {SWIGLU_BLOCK} (SwiGLU's gate/up blocks)"));
    }
    Ok(())
}

/// A grouped GEMM specialized for its operands, compiled, and its launch planned (`None`: no
/// tiles).
pub(crate) type Prepared = Option<(trident_core::backend::Artifact, crate::grouped_gemm::Launch)>;

pub(crate) fn prepare(ctx: &dyn RankCtx, (op, ops, p): (GroupedGemm, Operands<'_>, Groups)) -> Result<Prepared, BackendError> {
    let op = op.specialized(ops.a, ops.b, ops.c, p.n, p.k);
    let Some(launch) = op.plan(ops, p)? else { return Ok(None) };
    let kernel = ctx.compile(&format!("{op:?}"), &|| op.build())?;
    Ok(Some((kernel, launch)))
}
