//! The expert-parallel MoE block (`trident_kernels::moe_block`): dispatch, grouped GEMM gate/up
//! with SwiGLU, grouped GEMM down, combine, against an f64 reference of the whole MoE
//! computation with the router's output given: for each token `sum_j w_j y_j`, where expert
//! `e`'s output is `y = W2_e (silu(W_gate,e x) * (W_up,e x))`, rounded to the element type
//! where the block stores it (the SwiGLU output and `y`, as the grouped GEMMs write them).
//!
//! Shapes `[T, H, E_local, k, routing]` as the all-to-all's (its routings), the intermediate
//! size one SwiGLU block (128). Variants: `ep` (the low-latency exchange, masked layout),
//! `ep-ht` (the high-throughput exchange, contiguous layout).

use crate::distributed::{download, upload};
use crate::host::{poison, random, round_to};
use crate::registry::{Operation, RankOp, Registered, WorldData};
use crate::suite::Case;
use rand::Rng;
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::DType;
use trident_core::world::RankCtx;
use trident_kernels::ep_all_to_all::EpShape;
use trident_kernels::grouped_gemm::{swiglu_gate_row, SWIGLU_BLOCK};
use trident_kernels::moe_block::{EpMoeBlock, EpMoeBuffers};

/// The experts' intermediate size in the cases.
const FFN: usize = SWIGLU_BLOCK as usize;

struct MoeBlockCase;

fn shape_of(case: &Case) -> (usize, usize, EpShape) {
    let s = &case.shape;
    let (t, h, el, k) = (s[0], s[1], s[2], s[3]);
    (t, s[4], EpShape { t_max: t + 2, hidden: h, experts: el * case.world, top_k: k })
}

/// Expert `l`'s output for row `x` (`h` values) with its `w1` (`[2F, H]`, gate/up interleaved)
/// and `w2` (`[H, F]`), each stored value rounded to `d`.
fn expert(x: &[f64], w1: &[f64], w2: &[f64], h: usize, d: DType) -> Vec<f64> {
    let dot = |row: usize| -> f64 { (0..h).map(|c| w1[row * h + c] * x[c]).sum() };
    let act: Vec<f64> = (0..FFN)
        .map(|j| {
            let gate_row = swiglu_gate_row(j);
            let (g, u) = (dot(gate_row), dot(gate_row + SWIGLU_BLOCK as usize));
            g / (1.0 + (-g).exp()) * u
        })
        .collect();
    let act = round_to(&act, d);
    let y: Vec<f64> = (0..h).map(|i| (0..FFN).map(|j| w2[i * FFN + j] * act[j]).sum()).collect();
    round_to(&y, d)
}

impl Operation for MoeBlockCase {
    fn name(&self) -> &'static str {
        "moe_block"
    }

    fn variants(&self, dtype: DType) -> &'static [&'static str] {
        match dtype {
            DType::BF16 => &["ep", "ep-ht"],
            _ => &[],
        }
    }

    fn distributed(&self) -> bool {
        true
    }

    /// Uniform routing with empty entries, T = 1 with k = 1, every token to one expert, only
    /// rank 0's experts, k = 8.
    fn shapes(&self, _world: usize) -> Vec<Vec<usize>> {
        vec![vec![5, 40, 2, 2, 0], vec![1, 24, 1, 1, 0], vec![7, 16, 3, 3, 1], vec![3, 72, 2, 3, 2], vec![4, 8, 4, 8, 0]]
    }

    fn bound(&self, case: &Case, _reduction_len: usize) -> f64 {
        crate::suite::bound(case.dtype, case.variant, FFN)
    }

    fn prepare(&self, case: &Case, rng: &mut rand::rngs::StdRng) -> WorldData {
        let (d, w) = (case.dtype, case.world);
        let (t, routing, shape) = shape_of(case);
        let (h, k, el) = (shape.hidden, shape.top_k, shape.experts / w);
        let topk = super::ep_all_to_all::route(t, w, shape, routing, rng);
        let xs: Vec<Vec<f64>> = (0..w).map(|_| random(t * h, d, rng)).collect();
        let weights: Vec<Vec<f64>> =
            (0..w).map(|_| (0..t * k).map(|_| rng.gen_range(0.0..1.0f32) as f64).collect()).collect();
        // Weights scaled so that the products stay near 1: gate/up over H, down over F.
        let scaled = |n: usize, fan_in: usize, rng: &mut rand::rngs::StdRng| -> Vec<f64> {
            let s = 2.0 / (fan_in as f64).sqrt();
            round_to(&random(n, DType::F32, rng).iter().map(|v| v * s).collect::<Vec<_>>(), d)
        };
        let w1: Vec<Vec<f64>> = (0..w).map(|_| scaled(el * 2 * FFN * h, h, rng)).collect();
        let w2: Vec<Vec<f64>> = (0..w).map(|_| scaled(el * h * FFN, FFN, rng)).collect();
        let expected = (0..w)
            .map(|s| {
                let mut out = vec![0.0; t * h];
                for tok in 0..t {
                    for j in 0..k {
                        let e = topk[s][tok * k + j];
                        if e < 0 {
                            continue;
                        }
                        let (r, l) = (e as usize / el, e as usize % el);
                        let w1e = &w1[r][l * 2 * FFN * h..(l + 1) * 2 * FFN * h];
                        let w2e = &w2[r][l * h * FFN..(l + 1) * h * FFN];
                        let y = expert(&xs[s][tok * h..(tok + 1) * h], w1e, w2e, h, d);
                        let wt = weights[s][tok * k + j];
                        for (o, v) in out[tok * h..(tok + 1) * h].iter_mut().zip(y) {
                            *o += wt * v;
                        }
                    }
                }
                out
            })
            .collect();
        let inputs = (0..w)
            .map(|s| {
                let routes = topk[s].iter().map(|&e| e as f64).collect();
                vec![xs[s].clone(), routes, weights[s].clone(), w1[s].clone(), w2[s].clone()]
            })
            .collect();
        WorldData { inputs, expected, reduction_len: FFN }
    }

    fn setup_rank(
        &self,
        case: &Case,
        ctx: &dyn RankCtx,
        inputs: &[Vec<f64>],
        _ins: &[Buffer],
        out_len: usize,
    ) -> Result<Box<dyn RankOp>, BackendError> {
        let (t, _, shape) = shape_of(case);
        let block = EpMoeBlock::new(case.dtype, FFN);
        // `ep-ht`: the high-throughput exchange and the contiguous layout (prefill).
        let block = if case.variant == "ep-ht" { block.high_throughput() } else { block };
        let bufs = block.buffers(ctx, shape)?;
        Ok(Box::new(MoeRank {
            block,
            bufs,
            x: upload(ctx, "moe_x", &inputs[0], case.dtype)?,
            topk: upload(ctx, "moe_topk", &inputs[1], DType::I32)?,
            weights: upload(ctx, "moe_weights", &inputs[2], DType::F32)?,
            w1: upload(ctx, "moe_w1", &inputs[3], case.dtype)?,
            w2: upload(ctx, "moe_w2", &inputs[4], case.dtype)?,
            tokens: t,
            out_len,
        }))
    }
}

/// A rank's MoE block and its inputs.
struct MoeRank {
    block: EpMoeBlock,
    bufs: EpMoeBuffers,
    x: Buffer,
    topk: Buffer,
    weights: Buffer,
    w1: Buffer,
    w2: Buffer,
    tokens: usize,
    out_len: usize,
}

impl RankOp for MoeRank {
    fn poison(&self, ctx: &dyn RankCtx, _call: u64) -> Result<(), BackendError> {
        let d = self.block.dtype;
        for b in [&self.bufs.act, &self.bufs.y, self.bufs.out()] {
            ctx.fill(b, &poison(d))?;
        }
        Ok(())
    }

    fn enqueue(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        let experts = (&self.w1, &self.w2);
        self.block.enqueue(ctx, &mut self.bufs, &self.x, &self.topk, &self.weights, experts, self.tokens)
    }

    fn result(&self, ctx: &dyn RankCtx, _call: u64) -> Result<Vec<f64>, BackendError> {
        download(ctx, self.bufs.out(), self.out_len, self.block.dtype)
    }

    fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.bufs.rearm(ctx)
    }
}

inventory::submit! { Registered(&MoeBlockCase) }
