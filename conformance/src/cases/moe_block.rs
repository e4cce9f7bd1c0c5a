//! The expert-parallel MoE block (`trident_kernels::moe_block`): dispatch, grouped GEMM gate/up
//! with SwiGLU, grouped GEMM down, combine, against an f64 reference of the whole MoE
//! computation with the router's output given: for each token `sum_j w_j y_j`, where expert
//! `e`'s output is `y = W2_e (silu(W_gate,e x) * (W_up,e x))`, rounded to the element type
//! where the block stores it (the SwiGLU output and `y`, as the grouped GEMMs write them).
//!
//! Shapes `[T, H, E_local, k, routing]` as the all-to-all's (its routings), the intermediate
//! size one SwiGLU block (128). Variants: `ep` (the low-latency exchange, masked layout),
//! `ep-ht` (the high-throughput exchange, contiguous layout), `ep-e4m3` (the FP8 block: the
//! tokens quantized by dispatch and the SwiGLU output by the gate/up GEMM, as
//! `docs/SEMANTICS.md` says and the reference emulates; experts E4M3FN with 128 x 128 block
//! scales; H rounded up to whole 128-channel blocks), `ep-ht-e4m3` (the same over the
//! high-throughput exchange), `tp-e4m3` (the tensor-parallel block in FP8: rows quantized by
//! the route, each shard's SwiGLU output by its gate/up epilogue), `tp` (the tensor-parallel block,
//! `trident_kernels::moe_tp`: every rank a 128-wide shard of every expert's intermediate size,
//! so `F = 128 W`, and the shape's `E_local` experts in all; each shard's down product is added
//! unrounded, the sum rounded once).

use crate::dist_bench::{read_entry, upload_with, value, DistCase, Timer};
use crate::distributed::{download, upload};
use crate::host::{fake_quantized, poison, random, round_to};
use crate::registry::{Benchmark, Operation, RankOp, Registered, WorldData};
use crate::suite::Case;
use super::ep_all_to_all::{route, shape_of};
use rand::{Rng, SeedableRng};
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::DType;
use trident_core::world::RankCtx;
use trident_kernels::ep_all_to_all::EpShape;
use trident_kernels::grouped_gemm::{swiglu_gate_row, SWIGLU_BLOCK};
use crate::host::QUANT_BLOCK;
use trident_kernels::moe_block::{EpMoeBlock, EpMoeBuffers, Experts};
use trident_kernels::moe_tp::{TpGemm, TpMoeBlock, TpMoeBuffers, TpReduce, TpSteps};

/// The experts' intermediate size in the cases.
const FFN: usize = SWIGLU_BLOCK as usize;

struct MoeBlockCase;

/// Expert `l`'s output for row `x` (`h` values) with its `w1` (`[2F, H]`, gate/up interleaved)
/// and `w2` (`[H, F]`), the SwiGLU output rounded to `d` (or quantized, `d` FP8), and the
/// output too with `round_y` (to bf16 where `d` is FP8). With `d` FP8 also what a correct
/// kernel's roundings of the SwiGLU output may do to it ([`flip_reach`]; zeros otherwise).
fn expert(x: &[f64], w1: &[f64], w2: &[f64], h: usize, d: DType, round_y: bool) -> (Vec<f64>, Reach) {
    // Each row of w1 times x, and the sum of its terms' magnitudes.
    let products: Vec<(f64, f64)> = (0..2 * FFN)
        .map(|row| (0..h).fold((0.0, 0.0), |(v, a), c| (v + w1[row * h + c] * x[c], a + (w1[row * h + c] * x[c]).abs())))
        .collect();
    let act = swiglu(FFN, &|row| products[row].0);
    let reach = if d.is_fp8() { flip_reach(&products, w2, h, &act) } else { (vec![0.0; h], vec![0.0; h]) };
    let act = if d.is_fp8() { fake_quantized(&act) } else { round_to(&act, d) };
    let y: Vec<f64> = (0..h).map(|i| (0..FFN).map(|j| w2[i * FFN + j] * act[j]).sum()).collect();
    match round_y {
        true => (round_to(&y, if d.is_fp8() { DType::BF16 } else { d }), reach),
        false => (y, reach),
    }
}

/// Per output column, the mean and the variance of what legitimate FP8 rounding flips move
/// ([`flip_reach`]).
type Reach = (Vec<f64>, Vec<f64>);

/// The standard deviation of a gate/up product's error on the tensor cores, as a fraction of
/// its absolute sum: their FP8 accumulation keeps about 14 bits within each 128 of K.
const FP8_ACCUMULATION: f64 = 1.0 / 16384.0;

/// What a correct kernel's E4M3 roundings of one expert's SwiGLU output `act` (before
/// quantization; `products` each row of the expert's `w1` times the token, with its terms'
/// absolute sum, and `w2` as [`expert`] takes it) may do to its output, when it computes the products less exactly than the f64 reference (the
/// tensor cores: Gaussian error of `FP8_ACCUMULATION` of each product's absolute sum, carried
/// through SwiGLU, and through the block maximum into the scale): element j rounds the other
/// way with probability p_j (the chance its error crosses the nearer rounding midpoint), which
/// moves output column c by `w2[c, j]` times the distance between the roundings. Returns, per
/// output column, the mean of that move over the elements and its variance (independent
/// elements). About one SwiGLU output in 200 flips on an H100, which moves a single token's
/// output by up to a few percent; `WorldData::slack` of the FP8 blocks comes from these.
fn flip_reach(products: &[(f64, f64)], w2: &[f64], h: usize, act: &[f64]) -> Reach {
    // Each SwiGLU output's error (one standard deviation), from its gate's and up's.
    let sigma: Vec<f64> = (0..FFN)
        .map(|j| {
            let gate_row = swiglu_gate_row(j);
            let ((g, ag), (u, au)) = (products[gate_row], products[gate_row + SWIGLU_BLOCK as usize]);
            let sig = 1.0 / (1.0 + (-g).exp());
            let dsilu = sig * (1.0 + g * (1.0 - sig));
            FP8_ACCUMULATION * ((dsilu * u * ag).powi(2) + (g * sig * au).powi(2)).sqrt()
        })
        .collect();
    // The non-negative E4M3FN values (codes 0 to 126), in order.
    let e4m3 = &e4m3_values()[..127];
    let (mut mean, mut var) = (vec![0.0; h], vec![0.0; h]);
    for (b, block) in act.chunks(QUANT_BLOCK).enumerate() {
        let at = b * QUANT_BLOCK;
        let (top, amax) = block.iter().enumerate().fold((0, 0.0f64), |m, (i, v)| if v.abs() > m.1 { (i, v.abs()) } else { m });
        if amax == 0.0 {
            continue;
        }
        let (inv, scale) = (448.0 / amax, amax / 448.0);
        let scale_sigma = sigma[at + top] / amax;
        for (i, &v) in block.iter().enumerate() {
            // |v| scaled, its rounding, and the neighbour on its side.
            let s = (v * inv).abs();
            let r = round_to(&[s], DType::F8E4M3FN)[0];
            let k = e4m3.iter().position(|&e| e == r).unwrap_or(0);
            let neighbour = match s > r {
                true => e4m3.get(k + 1),
                false => k.checked_sub(1).and_then(|k| e4m3.get(k)),
            };
            let Some(&nb) = neighbour else { continue };
            let sd = inv * sigma[at + i] + s * scale_sigma;
            if sd <= 0.0 {
                continue;
            }
            let distance = ((r + nb) / 2.0 - s).abs();
            let p = 0.5 * (1.0 - crate::reference::erf(distance / (sd * std::f64::consts::SQRT_2)));
            let step = (nb - r) * scale * v.signum();
            for (col, (m, q)) in mean.iter_mut().zip(var.iter_mut()).enumerate() {
                let e = w2[col * FFN + at + i] * step;
                *m += p * e;
                *q += p * (1.0 - p) * e * e;
            }
        }
    }
    (mean, var)
}

/// The `f` SwiGLU outputs `silu(gate) * up` of a row whose product with B's row `r` (gate and
/// up rows interleaved by [`SWIGLU_BLOCK`]) is `dot(r)`, in f64.
fn swiglu(f: usize, dot: &dyn Fn(usize) -> f64) -> Vec<f64> {
    (0..f)
        .map(|j| {
            let gate_row = swiglu_gate_row(j);
            let (g, u) = (dot(gate_row), dot(gate_row + SWIGLU_BLOCK as usize));
            g / (1.0 + (-g).exp()) * u
        })
        .collect()
}

/// Whether the case runs the tensor-parallel block.
fn tensor_parallel(case: &Case) -> bool {
    case.variant.starts_with("tp")
}

/// Whether the case runs the FP8 block.
fn fp8(case: &Case) -> bool {
    case.variant.ends_with("e4m3")
}

/// FP8 weights of `experts` matrices of `rows x cols` (fan-in `cols`): E4M3FN values over
/// their whole range, one f32 scale per 128 x 128 block (`[experts, ceil(rows / 128),
/// ceil(cols / 128)]`) near `2 / (400 sqrt(fan_in))`, and the values they stand for.
fn fp8_weights(experts: usize, (rows, cols): (usize, usize), rng: &mut rand::rngs::StdRng) -> [Vec<f64>; 3] {
    let blk = SWIGLU_BLOCK as usize;
    let (rb, cb) = (rows.div_ceil(blk), cols.div_ceil(blk));
    let q: Vec<f64> = random(experts * rows * cols, DType::F32, rng).iter().map(|v| v * 400.0).collect();
    let q = round_to(&q, DType::F8E4M3FN);
    let s = 2.0 / (400.0 * (cols as f64).sqrt());
    let scales: Vec<f64> = (0..experts * rb * cb).map(|_| rng.gen_range(0.5..2.0) * s).collect();
    let scales = round_to(&scales, DType::F32);
    let values = (0..q.len())
        .map(|i| {
            let (e, r, c) = (i / (rows * cols), (i / cols) % rows, i % cols);
            q[i] * scales[(e * rb + r / blk) * cb + c / blk]
        })
        .collect();
    [q, scales, values]
}

/// The case's tokens, routing and shape: the all-to-all's, except that the tensor-parallel
/// block's experts in all are the shape's `E_local` (every one on every rank): its grouped
/// GEMMs walk `W x E` groups, which `E_local W` experts would make 256 at world 8 (80 s of
/// cpu-simt for one case).
fn moe_shape(case: &Case) -> (usize, usize, EpShape) {
    let (t, routing, shape) = shape_of(case);
    match tensor_parallel(case) {
        true => (t, routing, EpShape { experts: shape.experts / case.world, ..shape }),
        false => (t, routing, shape),
    }
}

impl Operation for MoeBlockCase {
    fn name(&self) -> &'static str {
        "moe_block"
    }

    fn variants(&self, dtype: DType) -> &'static [&'static str] {
        match dtype {
            DType::BF16 => &["ep", "ep-ht", "tp", "tp-rows", "ep-e4m3", "ep-ht-e4m3", "tp-e4m3", "tp-rows-e4m3"],
            _ => &[],
        }
    }

    fn distributed(&self) -> bool {
        true
    }

    /// T = 1 with k = 1, every token to one expert, only rank 0's experts (the other ranks'
    /// experts get nothing; to world 4), uniform routing with empty entries at k = 8. (Each
    /// shape runs two grouped GEMMs per variant on cpu-simt at every world, a large share of
    /// CI's time; at 8 ranks the tensor-parallel variants' grouped GEMMs walk 8 chunks of a
    /// 1024-wide F, so the rank-0-only routing, which world 4 already sends from every rank to
    /// one, is left out there, and the k = 8 routing has 2 experts a rank instead of 4: 16 in
    /// all, still twice k, and half the groups: its tensor-parallel variants took 33 s of
    /// cpu-simt's sm_90a pass with 4.)
    fn shapes(&self, world: usize) -> Vec<Vec<usize>> {
        match world {
            ..=7 => vec![vec![1, 24, 1, 1, 0], vec![7, 16, 3, 3, 1], vec![3, 16, 2, 3, 2], vec![4, 8, 4, 8, 0]],
            _ => vec![vec![1, 24, 1, 1, 0], vec![7, 16, 3, 3, 1], vec![4, 8, 2, 8, 0]],
        }
    }

    /// bf16's over the intermediate size, FP8 too. What the FP8 blocks' roundings of the
    /// SwiGLU output add on the tensor cores comes from the data (`WorldData::slack`, from
    /// [`flip_reach`]): their FP8 accumulation keeps about 14 bits, so a SwiGLU output close
    /// enough to an E4M3 rounding midpoint rounds one step (1/16 to 1/8) the other way than
    /// the f64 reference's, which moves a single token's output by up to a few percent (the
    /// H100 measured up to 2.6e-2, at 27c6c97, on a case of one token).
    fn bound(&self, case: &Case, _reduction_len: usize) -> f64 {
        let f = if tensor_parallel(case) { FFN * case.world } else { FFN };
        crate::suite::bound(case.dtype, case.variant, f)
    }

    fn prepare(&self, case: &Case, rng: &mut rand::rngs::StdRng) -> WorldData {
        let (d, w) = (case.dtype, case.world);
        let (t, routing, shape) = moe_shape(case);
        let tp = tensor_parallel(case);
        let (h, k) = (shape.hidden, shape.top_k);
        // Experts per rank (expert parallelism), or in all (tensor parallelism: each rank
        // routes as a world of one would, over every expert).
        let (el, topk) = match tp {
            false => (shape.experts / w, route(t, w, shape, routing, rng)),
            true => (shape.experts, (0..w).map(|_| route(t, 1, shape, routing, rng).remove(0)).collect()),
        };
        let xs: Vec<Vec<f64>> = (0..w).map(|_| random(t * h, d, rng)).collect();
        // What the experts multiply: the FP8 block's tokens as dispatch quantizes them.
        let quantized: Vec<Vec<f64>> = match fp8(case) {
            true => xs.iter().map(|x| x.chunks(h).flat_map(fake_quantized).collect()).collect(),
            false => xs.clone(),
        };
        let weights: Vec<Vec<f64>> =
            (0..w).map(|_| (0..t * k).map(|_| rng.gen_range(0.0..1.0f32) as f64).collect()).collect();
        // Weights scaled so that the products stay near 1: gate/up over H, down over F.
        let scaled = |n: usize, fan_in: usize, rng: &mut rand::rngs::StdRng| -> Vec<f64> {
            let s = 2.0 / (fan_in as f64).sqrt();
            round_to(&random(n, DType::F32, rng).iter().map(|v| v * s).collect::<Vec<_>>(), d)
        };
        // Expert parallelism: each rank its `el` experts whole; tensor parallelism: each rank a
        // shard of every expert (all `el` of them), the down weights over the full F.
        let fan = if tp { FFN * w } else { FFN };
        let held = el;
        // FP8: each rank's E4M3FN values and block scales of w1 and w2, and the values they
        // stand for (what the reference multiplies).
        let fp8w: Vec<[[Vec<f64>; 3]; 2]> = match fp8(case) {
            true => (0..w).map(|_| [fp8_weights(held, (2 * FFN, h), rng), fp8_weights(held, (h, FFN), rng)]).collect(),
            false => Vec::new(),
        };
        let (w1, w2): (Vec<Vec<f64>>, Vec<Vec<f64>>) = match fp8(case) {
            true => fp8w.iter().map(|[a, b]| (a[2].clone(), b[2].clone())).unzip(),
            false => (0..w).map(|_| (scaled(held * 2 * FFN * h, h, rng), scaled(held * h * FFN, fan, rng))).unzip(),
        };
        let d = if fp8(case) { DType::F8E4M3FN } else { d };
        // Expert `e`'s output for a token: its own rank's whole expert, or every rank's shard
        // added unrounded and the sum rounded by the caller; and what legitimate FP8 rounding
        // flips may do to it (`flip_reach`; zeros without FP8).
        let expert_out = |x: &[f64], e: usize| -> (Vec<f64>, Reach) {
            let part = |r: usize, l: usize, round_y: bool| {
                let w1e = &w1[r][l * 2 * FFN * h..(l + 1) * 2 * FFN * h];
                let w2e = &w2[r][l * h * FFN..(l + 1) * h * FFN];
                expert(x, w1e, w2e, h, d, round_y)
            };
            if !tp {
                return part(e / el, e % el, true);
            }
            let (mut sum, mut mean, mut var) = (vec![0.0; h], vec![0.0; h], vec![0.0; h]);
            for r in 0..w {
                let (y, (m, v)) = part(r, e, false);
                for c in 0..h {
                    (sum[c], mean[c], var[c]) = (sum[c] + y[c], mean[c] + m[c], var[c] + v[c]);
                }
            }
            (sum, (mean, var))
        };
        let mut flips = (0.0, 0.0);
        let expected = (0..w)
            .map(|s| {
                let (mut out, mut mean, mut var) = (vec![0.0; t * h], vec![0.0; t * h], vec![0.0; t * h]);
                for tok in 0..t {
                    for j in 0..k {
                        let e = topk[s][tok * k + j];
                        if e < 0 {
                            continue;
                        }
                        let (y, (m, v)) = expert_out(&quantized[s][tok * h..(tok + 1) * h], e as usize);
                        let wt = weights[s][tok * k + j];
                        for c in 0..h {
                            let o = tok * h + c;
                            (out[o], mean[o], var[o]) = (out[o] + wt * y[c], mean[o] + wt * m[c], var[o] + wt * wt * v[c]);
                        }
                    }
                }
                flips.0 += mean.iter().map(|m| m * m).sum::<f64>();
                flips.1 += var.iter().sum::<f64>();
                match tp {
                    true => round_to(&out, case.dtype),
                    false => out,
                }
            })
            .collect::<Vec<_>>();
        // The FP8 blocks' bound grows by what legitimate rounding flips can do, normwise as the
        // suite measures: their mean move plus three standard deviations. About 0 where no
        // SwiGLU output lies near a rounding midpoint.
        let norm = expected.iter().flatten().map(|x| x * x).sum::<f64>().sqrt().max(1e-30);
        let slack = (flips.0.sqrt() + 3.0 * flips.1.sqrt()) / norm;
        let inputs = (0..w)
            .map(|s| {
                let routes = topk[s].iter().map(|&e| e as f64).collect();
                match fp8w.get(s) {
                    // The E4M3FN values, then their scales.
                    Some([a, b]) => {
                        vec![xs[s].clone(), routes, weights[s].clone(), a[0].clone(), b[0].clone(), a[1].clone(), b[1].clone()]
                    }
                    None => vec![xs[s].clone(), routes, weights[s].clone(), w1[s].clone(), w2[s].clone()],
                }
            })
            .collect();
        WorldData { inputs, expected, reduction_len: FFN, slack }
    }

    fn benchmark(&self) -> Option<&dyn Benchmark> {
        Some(self)
    }

    fn setup_rank(
        &self,
        case: &Case,
        ctx: &dyn RankCtx,
        inputs: &[Vec<f64>],
        _ins: &[Buffer],
        out_len: usize,
    ) -> Result<Box<dyn RankOp>, BackendError> {
        let (t, _, shape) = moe_shape(case);
        let block = if tensor_parallel(case) {
            let block = TpMoeBlock::new(case.dtype, FFN);
            let block = if fp8(case) { block.fp8() } else { block };
            // `tp-rows`: the down GEMM's rows stored to their owner, added by its finish.
            let block = if case.variant.contains("rows") { block.reduced_by(TpReduce::Rows) } else { block };
            Block::Tp(block, Box::new(block.buffers(ctx, shape)?))
        } else {
            let block = EpMoeBlock::new(case.dtype, FFN);
            // `ep-ht`: the high-throughput exchange and the contiguous layout (prefill).
            let block = if case.variant.starts_with("ep-ht") { block.high_throughput() } else { block };
            let block = if fp8(case) { block.fp8() } else { block };
            Block::Ep(block, Box::new(block.buffers(ctx, shape)?))
        };
        let wd = if fp8(case) { DType::F8E4M3FN } else { case.dtype };
        Ok(Box::new(MoeRank {
            dtype: case.dtype,
            block,
            x: upload(ctx, "moe_x", &inputs[0], case.dtype)?,
            topk: upload(ctx, "moe_topk", &inputs[1], DType::I32)?,
            weights: upload(ctx, "moe_weights", &inputs[2], DType::F32)?,
            w1: upload(ctx, "moe_w1", &inputs[3], wd)?,
            w2: upload(ctx, "moe_w2", &inputs[4], wd)?,
            scales: match fp8(case) {
                true => Some((upload(ctx, "moe_s1", &inputs[5], DType::F32)?, upload(ctx, "moe_s2", &inputs[6], DType::F32)?)),
                false => None,
            },
            tokens: t,
            out_len,
        }))
    }
}

/// A rank's MoE block (expert- or tensor-parallel) and its buffers.
enum Block {
    Ep(EpMoeBlock, Box<EpMoeBuffers>),
    Tp(TpMoeBlock, Box<TpMoeBuffers>),
}

impl Block {
    fn out(&self) -> &Buffer {
        match self {
            Block::Ep(_, b) => b.out(),
            Block::Tp(_, b) => &b.out,
        }
    }

    /// What a call writes before its result, all this rank's own: poisoned before each call.
    fn written(&self) -> Vec<&Buffer> {
        match self {
            Block::Ep(_, b) => [&b.act, &b.y, b.out()].into_iter().chain(&b.act_scales).collect(),
            Block::Tp(_, b) => [&b.act, &b.out].into_iter().chain(&b.act_scales).collect(),
        }
    }
}

/// A rank's MoE block and its inputs.
struct MoeRank {
    dtype: DType,
    block: Block,
    x: Buffer,
    topk: Buffer,
    weights: Buffer,
    w1: Buffer,
    w2: Buffer,
    /// The FP8 experts' block scales.
    scales: Option<(Buffer, Buffer)>,
    tokens: usize,
    out_len: usize,
}

impl RankOp for MoeRank {
    fn poison(&self, ctx: &dyn RankCtx, _call: u64) -> Result<(), BackendError> {
        for b in self.block.written() {
            ctx.fill(b, &poison(self.dtype))?;
        }
        Ok(())
    }

    fn enqueue(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        let (experts, (x, topk, weights)) = ((&self.w1, &self.w2), (&self.x, &self.topk, &self.weights));
        match &mut self.block {
            Block::Ep(block, bufs) => {
                let experts = match &self.scales {
                    Some((s1, s2)) => Experts::fp8((experts.0, s1), (experts.1, s2)),
                    None => experts.into(),
                };
                block.enqueue(ctx, bufs, x, topk, weights, experts, self.tokens)
            }
            Block::Tp(block, bufs) => {
                let experts = match &self.scales {
                    Some((s1, s2)) => Experts::fp8((experts.0, s1), (experts.1, s2)),
                    None => experts.into(),
                };
                block.enqueue(ctx, bufs, x, topk, weights, experts, self.tokens)
            }
        }
    }

    fn result(&self, ctx: &dyn RankCtx, _call: u64) -> Result<Vec<f64>, BackendError> {
        download(ctx, self.block.out(), self.out_len, self.dtype)
    }

    fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        match &mut self.block {
            Block::Ep(_, bufs) => bufs.rearm(ctx),
            Block::Tp(_, bufs) => bufs.rearm(ctx),
        }
    }
}

/// Tokens per rank up to which the benchmark also times the low-latency block (decode).
const LOW_LATENCY_TOKENS: usize = 256;

/// The expert weights of the benchmark: `w1` of expert-local index `l` is input 910 + rank,
/// `w2` 920 + rank, each uniform over its fan-in's `[-1, 1) / sqrt(fan_in)`, in bf16.
fn weight(seed: u64, tag: u64, idx: usize, fan_in: usize) -> f64 {
    half::bf16::from_f64(value(seed, tag, idx, DType::F64) / (fan_in as f64).sqrt()).to_f64()
}

/// The MoE block of `[T, H, E, k, F]` (tokens per rank, hidden, experts in all, top-k,
/// intermediate size) with uniform routing (k distinct experts per token): the low-latency
/// block up to 256 tokens per rank, the high-throughput one at every shape. Per rank at 8-way
/// expert parallelism (the grouped GEMM issue's): DeepSeek-V3 (32 local experts, H 7168, F
/// 2048, top-8), Qwen3-30B-A3B (16, 2048, 768, top-8), Mixtral-8x7B (8 experts, H 4096, F
/// 3584 as its tensor-parallel shard, top-2); decode about 32 tokens per expert, prefill about
/// 1024. PyTorch's pipeline of the same math is the baseline (`bench/baseline_dist.py`).
impl Benchmark for MoeBlockCase {
    fn shapes(&self, world: usize) -> Vec<Vec<usize>> {
        let mut v = Vec::new();
        for (local, h, f, k) in [(32, 7168, 2048, 8), (16, 2048, 768, 8), (8, 4096, 3584, 2)] {
            for per_expert in [32, 1024] {
                v.push(vec![per_expert * local / k, h, local * world, k, f]);
            }
        }
        v
    }

    /// F a 128-wide shard per rank, so that the tensor-parallel block runs too; H one FP8
    /// scale block, so that the FP8 block does.
    fn small_shape(&self, world: usize) -> Vec<usize> {
        vec![4, QUANT_BLOCK, 2 * world, 2, FFN * world]
    }

    /// The two exchanges' symmetric buffers (the all-to-all benchmark's) and the
    /// tensor-parallel blocks' (their gathered rows, ends, tokens and weights, the accumulator
    /// or the rows form's `parts`, signals and epoch words).
    fn heap_bytes(&self, case: &DistCase) -> usize {
        let ep = DistCase { dims: case.dims[..4].to_vec(), ..case.clone() };
        let (t, h, e, k, w) = (case.dims[0], case.dims[1], case.dims[2], case.dims[3], case.world);
        let rows = w * (t * k + trident_kernels::moe_tp::CHUNK_PAD);
        let es = case.dtype.size_bytes() as usize;
        let tp = rows * h * es + w * e * 4 + 2 * rows * 4 + 4 * t * h + 8 * (2 * w + 1) + 32;
        // The rows form's block: its own gathered rows and `parts` of the same size, no
        // accumulator to speak of.
        let tp_rows = 2 * rows * h * es + w * e * 4 + 2 * rows * 4 + 8 * (2 * w + 1) + 32 + 256;
        // The exchanges of the bf16 blocks and of the FP8 ones (each exchange's FP8 form takes
        // at most its bf16 form's bytes: rows of one byte plus their scales, partials in bf16);
        // the heap is a bump allocator, so every block's buffers are counted. The same for the
        // tensor-parallel blocks (FP8 rows of one byte, a scale per 128 of them).
        2 * super::ep_all_to_all::EpCase.heap_bytes(&ep) + 2 * tp + tp_rows + (1 << 20)
    }

    /// Each (token, expert) row out and back, less what stays on the rank.
    fn bus_bytes(&self, case: &DistCase) -> f64 {
        let (t, h, k, w) = (case.dims[0] as f64, case.dims[1] as f64, case.dims[3] as f64, case.world as f64);
        2.0 * t * k * h * case.dtype.size_bytes() as f64 * (w - 1.0) / w
    }

    /// Each (token, expert) pair's gate/up and down products.
    fn rank_flops(&self, case: &DistCase) -> f64 {
        let (t, h, k, f) = (case.dims[0] as f64, case.dims[1] as f64, case.dims[3] as f64, case.dims[4] as f64);
        6.0 * t * k * f * h
    }

    fn run(&self, t: &mut Timer, case: &DistCase, seed: u64) -> Result<(), BackendError> {
        let ctx = t.ctx;
        let (d, w, r) = (case.dtype, case.world, ctx.rank());
        let (tokens, h, experts, k, f) = (case.dims[0], case.dims[1], case.dims[2], case.dims[3], case.dims[4]);
        if experts % w != 0 || k > experts {
            return Err(crate::dist_bench::shard_error(case, "the experts"));
        }
        let (el, shape) = (experts / w, EpShape { t_max: tokens, hidden: h, experts, top_k: k });
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x30 ^ r as u64);
        let topk: Vec<Vec<usize>> = (0..tokens)
            .map(|_| {
                let mut pool: Vec<usize> = (0..experts).collect();
                (0..k).map(|_| pool.swap_remove(rng.gen_range(0..pool.len()))).collect()
            })
            .collect();
        let flat: Vec<f64> = topk.iter().flatten().map(|&e| e as f64).collect();
        let x = upload_with(ctx, tokens * h, d, "moe_x", &|i| value(seed, 900 + r as u64, i, d))?;
        let topk_b = upload(ctx, "moe_topk", &flat, DType::I32)?;
        let wt = |tok: usize, j: usize| value(seed, 800 + r as u64, tok * k + j, DType::F32).abs();
        let weights = upload_with(ctx, tokens * k, DType::F32, "moe_weights", &|i| wt(i / k, i % k))?;
        let w1 = upload_with(ctx, el * 2 * f * h, d, "moe_w1", &|i| weight(seed, 910 + r as u64, i, h))?;
        let w2 = upload_with(ctx, el * h * f, d, "moe_w2", &|i| weight(seed, 920 + r as u64, i, f))?;
        // The reference of output (token, column) on this rank: each expert's SwiGLU row for
        // the token (memoized), then the sampled column of its down product.
        let act_of = |tok: usize, e: usize| -> Vec<f64> {
            let (owner, l) = (e / el, e % el);
            let xv: Vec<f64> = (0..h).map(|c| value(seed, 900 + r as u64, tok * h + c, d)).collect();
            let dot = |row: usize| -> f64 {
                (0..h).map(|c| weight(seed, 910 + owner as u64, (l * 2 * f + row) * h + c, h) * xv[c]).sum()
            };
            round_to(&swiglu(f, &dot), d)
        };
        // Two sampled tokens, 16 columns each.
        let picks: Vec<usize> = (0..2).map(|_| rng.gen_range(0..tokens)).collect();
        let acts: Vec<Vec<Vec<f64>>> = picks.iter().map(|&tok| topk[tok].iter().map(|&e| act_of(tok, e)).collect()).collect();
        let cols: Vec<usize> = (0..16).map(|_| rng.gen_range(0..h)).collect();
        // The normwise error of the sampled outputs, each read by `get(token, column)`.
        let check_with = |get: &Reader| -> Result<f64, BackendError> {
            let mut worst = 0.0f64;
            for (p, &tok) in picks.iter().enumerate() {
                for &c in &cols {
                    let (mut want, mut mag) = (0.0, 0.0);
                    for (j, &e) in topk[tok].iter().enumerate() {
                        let (owner, l) = (e / el, e % el);
                        let terms: Vec<f64> = (0..f)
                            .map(|q| weight(seed, 920 + owner as u64, (l * h + c) * f + q, f) * acts[p][j][q])
                            .collect();
                        let y = round_to(&[terms.iter().sum::<f64>()], d)[0];
                        want += wt(tok, j) * y;
                        mag += wt(tok, j) * terms.iter().map(|v| v.abs()).sum::<f64>();
                    }
                    let e = (get(tok, c)? - want).abs() / mag.max(1e-30);
                    worst = worst.max(if e.is_nan() { f64::INFINITY } else { e });
                }
            }
            Ok(worst)
        };
        let check = |out: &Buffer| check_with(&|tok, c| read_entry(ctx, out, tok * h + c, d));
        let mut blocks = vec![("moe-ep-ht/block", EpMoeBlock::new(d, f).high_throughput())];
        if tokens <= LOW_LATENCY_TOKENS {
            blocks.insert(0, ("moe-ep/block", EpMoeBlock::new(d, f)));
        }
        for (name, block) in blocks {
            let mut bufs = block.buffers(ctx, shape)?;
            let enqueue = |b: &mut EpMoeBuffers| block.enqueue(ctx, b, &x, &topk_b, &weights, (&w1, &w2), tokens);
            checked_and_timed(t, name, (&mut bufs, EpMoeBuffers::out), d, &enqueue, &check)?;
        }
        // The FP8 blocks where H is whole 128-channel blocks (the tensor-parallel one also
        // needs whole 128-column blocks of each rank's shard of F).
        let fp8 = Fp8Run {
            case,
            seed,
            shape,
            inputs: (&x, &topk_b, &weights),
            topk: &topk,
            picks: &picks,
            cols: &cols,
            wt: &wt,
        };
        let place = Fp8Place { rank: r, shards: 1, el, experts, h, f };
        if h.is_multiple_of(QUANT_BLOCK) {
            let experts_fp8 = Fp8Experts::upload(ctx, seed, &place)?;
            if tokens <= LOW_LATENCY_TOKENS {
                fp8.expert_parallel(t, &experts_fp8, EP_FP8)?;
            }
            fp8.expert_parallel(t, &experts_fp8, EP_HT_FP8)?;
            if f.is_multiple_of(w * SWIGLU_BLOCK as usize) {
                match w {
                    1 => fp8.tensor_parallel(t, &experts_fp8)?,
                    _ => fp8.tensor_parallel(t, &Fp8Experts::upload(ctx, seed, &Fp8Place { shards: w, ..place })?)?,
                }
            }
        }
        // The tensor-parallel block: rank r holds shard r of every expert (the same experts:
        // rows `r 2F_l ..` of each interleaved w1, columns `r F_l ..` of each w2); at world 1
        // that is the expert-parallel block's weights.
        let fl = f / w;
        if !f.is_multiple_of(w) || !fl.is_multiple_of(SWIGLU_BLOCK as usize) {
            println!("bench: moe-tp/block skipped: F = {f} is not {w} shards of whole {SWIGLU_BLOCK}-column blocks");
            return Ok(());
        }
        let shards = match w {
            1 => None,
            _ => {
                let w1 = upload_with(ctx, experts * 2 * fl * h, d, "moe_tp_w1", &|i| {
                    let (e, q, c) = (i / (2 * fl * h), (i / h) % (2 * fl), i % h);
                    weight(seed, 910 + (e / el) as u64, ((e % el) * 2 * f + r * 2 * fl + q) * h + c, h)
                })?;
                let w2 = upload_with(ctx, experts * h * fl, d, "moe_tp_w2", &|i| {
                    let (e, row, q) = (i / (h * fl), (i / fl) % h, i % fl);
                    weight(seed, 920 + (e / el) as u64, ((e % el) * h + row) * f + r * fl + q, f)
                })?;
                Some((w1, w2))
            }
        };
        let (tw1, tw2) = shards.as_ref().map_or((&w1, &w2), |(a, b)| (a, b));
        let block = TpMoeBlock::new(d, fl);
        let mut bufs = block.buffers(ctx, shape)?;
        let enqueue = |b: &mut TpMoeBuffers| block.enqueue(ctx, b, &x, &topk_b, &weights, (tw1, tw2), tokens);
        checked_and_timed(t, "moe-tp/block", (&mut bufs, tp_out), d, &enqueue, &check)?;
        // The same block with the down GEMM's rows stored to their owner and added there.
        let rows = block.reduced_by(TpReduce::Rows);
        let mut rows_bufs = rows.buffers(ctx, shape)?;
        let enqueue = |b: &mut TpMoeBuffers| rows.enqueue(ctx, b, &x, &topk_b, &weights, (tw1, tw2), tokens);
        checked_and_timed(t, TP_ROWS, (&mut rows_bufs, tp_out), d, &enqueue, &check)?;
        // The same work one stage after the other (the host meets the ranks in between).
        let inputs = (&x, &topk_b, &weights);
        let sequential =
            |b: &mut TpMoeBuffers| block.enqueue_as(ctx, b, inputs, (tw1, tw2), tokens, TpSteps::Sequential);
        checked_and_timed(t, TP_SEQUENTIAL, (&mut bufs, tp_out), d, &sequential, &check)?;
        if w == 1 {
            tp_machinery(t, [(&block, &mut bufs), (&rows, &mut rows_bufs)], (tw1, tw2), &check_with)?;
        }
        Ok(())
    }

    /// The three blocks; the rest are their stages or the same work without overlap.
    fn is_fused(&self, variant: &str) -> bool {
        variant.ends_with("/block")
    }

    fn compared_with(&self, variant: &str) -> Option<&'static str> {
        match variant {
            "moe-tp/block" => Some(TP_SEQUENTIAL),
            TP_ROWS => Some("moe-tp/block"),
            EP_FP8 => Some("moe-ep/block"),
            EP_HT_FP8 => Some("moe-ep-ht/block"),
            TP_FP8 => Some("moe-tp/block"),
            TP_AG_GATE_UP => Some("grouped/gate-up"),
            TP_DOWN_RS => Some("grouped/down"),
            TP_DOWN_ROWS => Some("grouped/down"),
            v if v.starts_with(TP_DOWN_RS) => Some("grouped/down"),
            _ => None,
        }
    }
}

/// An output entry of (token, column), however a variant leaves it.
type Reader<'a> = dyn Fn(usize, usize) -> Result<f64, BackendError> + 'a;

/// The FP8 expert-parallel blocks (low-latency, high-throughput), against the bf16 ones.
const EP_FP8: &str = "moe-ep-e4m3/block";
const EP_HT_FP8: &str = "moe-ep-ht-e4m3/block";
/// The FP8 tensor-parallel block, against the bf16 one.
const TP_FP8: &str = "moe-tp-e4m3/block";

/// The benchmark's FP8 experts of rank `owner`: the E4M3FN code of element `i` of `w1`
/// (`which` 0) or `w2` (1), any code but the NaNs (a random byte: values spread over the
/// binades); and the scale of each 128 x 128 block, near `1.5 / (100 sqrt(fan_in))`.
fn fp8_code(seed: u64, (owner, which): (usize, u64), i: usize) -> u8 {
    let u = value(seed, 930 + 10 * which + owner as u64, i, DType::F64);
    let code = ((u + 1.0) * 128.0) as u8;
    if code & 0x7F == 0x7F {
        code ^ 1
    } else {
        code
    }
}

/// The value of every E4M3FN code.
fn e4m3_values() -> Vec<f64> {
    (0..=255u64).map(|c| crate::ops::values::decode(c, DType::F8E4M3FN).f()).collect()
}

/// This rank's FP8 experts of the benchmark: `w1`, `w2` (E4M3FN codes, [`fp8_code`]) and
/// their block scales.
struct Fp8Experts {
    w1: Buffer,
    w2: Buffer,
    s1: Buffer,
    s2: Buffer,
}

impl Fp8Experts {
    /// Uploaded from their bytes (a DeepSeek-V3 `w1` is 940 M of them), as `place` lays them
    /// out on this rank.
    fn upload(ctx: &dyn RankCtx, seed: u64, place: &Fp8Place) -> Result<Fp8Experts, BackendError> {
        let codes = |which: u64, name: &str| -> Result<Buffer, BackendError> {
            let n = place.len(which);
            let buf = ctx.alloc(n, name)?;
            let piece = 1 << 24;
            for start in (0..n).step_by(piece) {
                let bytes: Vec<u8> =
                    (start..(start + piece).min(n)).map(|i| {
                        let (of, at) = place.element(which, i);
                        fp8_code(seed, of, at)
                    })
                    .collect();
                ctx.write(&buf, start, &bytes)?;
            }
            Ok(buf)
        };
        let scales = |which: u64, name: &str| {
            let fan_in = if which == 0 { place.h } else { place.f };
            upload_with(ctx, place.blocks(which), DType::F32, name, &|b| {
                let (owner, block) = place.block(which, b);
                fp8_scale(seed, (owner, which), block, fan_in)
            })
        };
        Ok(Fp8Experts { w1: codes(0, "moe_w1_e4m3")?, w2: codes(1, "moe_w2_e4m3")?, s1: scales(0, "moe_s1")?, s2: scales(1, "moe_s2")? })
    }
}

/// Where this rank's FP8 experts come from among the owners' (rank `o` owns experts
/// `o E_l ..`, `w1 [E_l, 2F, H]`, `w2 [E_l, H, F]`, block scales `[E_l, 2F/128, H/128]` and
/// `[E_l, H/128, F/128]`): its own (`shards` 1: the expert-parallel block), or shard `rank` of
/// `shards` of every expert's intermediate size (the tensor-parallel block: `w1 [E, 2F_l, H]`,
/// `w2 [E, H, F_l]`, their scales likewise).
struct Fp8Place {
    rank: usize,
    shards: usize,
    el: usize,
    experts: usize,
    h: usize,
    f: usize,
}

impl Fp8Place {
    /// Elements of `w1` (`which` 0) or `w2` (1) on this rank.
    fn len(&self, which: u64) -> usize {
        let e = if self.shards == 1 { self.el } else { self.experts };
        let rows = if which == 0 { 2 } else { 1 };
        e * rows * self.h * (self.f / self.shards)
    }

    /// Scale blocks of `w1` or `w2` on this rank.
    fn blocks(&self, which: u64) -> usize {
        self.len(which) / (QUANT_BLOCK * QUANT_BLOCK)
    }

    /// (owner, index in the owner's matrix) of element `i` of `w1` (`which` 0) or `w2` (1): a
    /// matrix of `rows x cols` per expert whose sharded dimension is its rows (`w1`) or its
    /// columns (`w2`); `unit` 1 for elements, 128 for scale blocks.
    fn place(&self, which: u64, i: usize, unit: usize) -> (usize, usize) {
        if self.shards == 1 {
            return (self.rank, i);
        }
        let (h, f, fl) = (self.h / unit, self.f / unit, self.f / self.shards / unit);
        let (rows, cols, shard_rows) = if which == 0 { (2 * f, h, true) } else { (h, f, false) };
        let (rows_l, cols_l) = if shard_rows { (2 * fl, cols) } else { (rows, fl) };
        let (e, row, col) = (i / (rows_l * cols_l), (i / cols_l) % rows_l, i % cols_l);
        let (row, col) = if shard_rows { (self.rank * 2 * fl + row, col) } else { (row, self.rank * fl + col) };
        (e / self.el, ((e % self.el) * rows + row) * cols + col)
    }

    /// The (owner, matrix) and index of element `i`, as [`fp8_code`] takes them.
    fn element(&self, which: u64, i: usize) -> ((usize, u64), usize) {
        let (owner, at) = self.place(which, i, 1);
        ((owner, which), at)
    }

    /// The owner and index of scale block `b`.
    fn block(&self, which: u64, b: usize) -> (usize, usize) {
        self.place(which, b, QUANT_BLOCK)
    }
}

fn fp8_scale(seed: u64, (owner, which): (usize, u64), block: usize, fan_in: usize) -> f64 {
    let u = value(seed, 950 + 10 * which + owner as u64, block, DType::F64);
    ((1.5 + 0.5 * u) / (100.0 * (fan_in as f64).sqrt())) as f32 as f64
}

/// What the FP8 blocks' runs share: the case, its seed and shape, the inputs (`x`, `topk`,
/// `weights`), the routing on the host, the sampled tokens and columns, and the routing weights.
struct Fp8Run<'a> {
    case: &'a DistCase,
    seed: u64,
    shape: EpShape,
    inputs: (&'a Buffer, &'a Buffer, &'a Buffer),
    topk: &'a [Vec<usize>],
    picks: &'a [usize],
    cols: &'a [usize],
    wt: &'a dyn Fn(usize, usize) -> f64,
}

impl Fp8Run<'_> {
    /// The normwise error of `out` at the sampled outputs against the f64 reference of the
    /// same quantization (tokens as dispatch or the route quantizes them, the SwiGLU output as
    /// the gate/up epilogue does), from the owners' FP8 experts ([`Fp8Place`]). `round_y`: each
    /// expert's down product is rounded to bf16 (the expert-parallel block's `y`), else only the
    /// sum (the tensor-parallel block adds its shards' products unrounded).
    fn error(&self, ctx: &dyn RankCtx, out: &Buffer, round_y: bool) -> Result<f64, BackendError> {
        let (seed, case, shape) = (self.seed, self.case, self.shape);
        let (d, w, r) = (case.dtype, case.world, ctx.rank());
        let (h, f, el, blk) = (shape.hidden, case.dims[4], shape.experts / w, QUANT_BLOCK);
        let (hb, fb) = (h.div_ceil(blk), f / blk);
        // w1 `[E_l, 2F, H]` with scales `[E_l, 2F/128, H/128]`; w2 `[E_l, H, F]`, `[E_l, H/128, F/128]`.
        let scale1 = |owner: usize, i: usize| {
            let (e, row, c) = (i / (2 * f * h), (i / h) % (2 * f), i % h);
            fp8_scale(seed, (owner, 0), (e * (2 * f / blk) + row / blk) * hb + c / blk, h)
        };
        let scale2 = |owner: usize, i: usize| {
            let (e, row, c) = (i / (h * f), (i / f) % h, i % f);
            fp8_scale(seed, (owner, 1), (e * hb + row / blk) * fb + c / blk, f)
        };
        let table = e4m3_values();
        let fp8_weight = |seed, which, i| table[fp8_code(seed, which, i) as usize];
        // The reference at the sampled outputs: each expert's quantized SwiGLU row for the token.
        let act_of = |tok: usize, e: usize| -> Vec<f64> {
            let (owner, l) = (e / el, e % el);
            let xv: Vec<f64> = (0..h).map(|c| value(seed, 900 + r as u64, tok * h + c, d)).collect();
            let xq = fake_quantized(&xv);
            let dot = |row: usize| -> f64 {
                (0..h)
                    .map(|c| {
                        let i = (l * 2 * f + row) * h + c;
                        fp8_weight(seed, (owner, 0), i) * scale1(owner, i) * xq[c]
                    })
                    .sum()
            };
            fake_quantized(&swiglu(f, &dot))
        };
        let mut worst = 0.0f64;
        for &tok in self.picks {
            let acts: Vec<Vec<f64>> = self.topk[tok].iter().map(|&e| act_of(tok, e)).collect();
            for &c in self.cols {
                let (mut want, mut mag) = (0.0, 0.0);
                for (j, &e) in self.topk[tok].iter().enumerate() {
                    let (owner, l) = (e / el, e % el);
                    let terms: Vec<f64> = (0..f)
                        .map(|q| {
                            let i = (l * h + c) * f + q;
                            fp8_weight(seed, (owner, 1), i) * scale2(owner, i) * acts[j][q]
                        })
                        .collect();
                    let y: f64 = terms.iter().sum();
                    want += (self.wt)(tok, j) * if round_y { round_to(&[y], DType::BF16)[0] } else { y };
                    mag += (self.wt)(tok, j) * terms.iter().map(|v| v.abs()).sum::<f64>();
                }
                let e = (read_entry(ctx, out, tok * h + c, d)? - want).abs() / mag.max(1e-30);
                worst = worst.max(if e.is_nan() { f64::INFINITY } else { e });
            }
        }
        Ok(worst)
    }

    /// The expert-parallel FP8 block `name` ([`EP_FP8`] or [`EP_HT_FP8`]) on this rank's FP8
    /// experts: checked, then timed.
    fn expert_parallel(&self, t: &mut Timer, experts: &Fp8Experts, name: &'static str) -> Result<(), BackendError> {
        let ctx = t.ctx;
        let (x, topk_b, weights) = self.inputs;
        let Fp8Experts { w1, w2, s1, s2 } = experts;
        let block = EpMoeBlock::new(self.case.dtype, self.case.dims[4]).fp8();
        let block = if name == EP_HT_FP8 { block.high_throughput() } else { block };
        let mut bufs = block.buffers(ctx, self.shape)?;
        let enqueue =
            |b: &mut EpMoeBuffers| block.enqueue(ctx, b, x, topk_b, weights, Experts::fp8((w1, s1), (w2, s2)), self.case.dims[0]);
        let error = |out: &Buffer| self.error(ctx, out, true);
        checked_and_timed(t, name, (&mut bufs, EpMoeBuffers::out), self.case.dtype, &enqueue, &error)
    }

    /// The tensor-parallel FP8 block ([`TP_FP8`]) on this rank's shards of every expert
    /// (`shards`, [`Fp8Place`]): checked, then timed.
    fn tensor_parallel(&self, t: &mut Timer, shards: &Fp8Experts) -> Result<(), BackendError> {
        let ctx = t.ctx;
        let (x, topk_b, weights) = self.inputs;
        let Fp8Experts { w1, w2, s1, s2 } = shards;
        let block = TpMoeBlock::new(self.case.dtype, self.case.dims[4] / self.case.world).fp8();
        let mut bufs = block.buffers(ctx, self.shape)?;
        let enqueue =
            |b: &mut TpMoeBuffers| block.enqueue(ctx, b, x, topk_b, weights, Experts::fp8((w1, s1), (w2, s2)), self.case.dims[0]);
        let error = |out: &Buffer| self.error(ctx, out, false);
        checked_and_timed(t, TP_FP8, (&mut bufs, tp_out), self.case.dtype, &enqueue, &error)
    }
}

/// A variant of the benchmark on `bufs` (`out` its output): the output poisoned (`d`), one
/// call (`enqueue`, then the host waits and meets the ranks) checked by `error`, then the same
/// call timed as `name`.
fn checked_and_timed<B>(
    t: &mut Timer,
    name: &str,
    (bufs, out): (&mut B, fn(&B) -> &Buffer),
    d: DType,
    enqueue: &dyn Fn(&mut B) -> Result<(), BackendError>,
    error: &dyn Fn(&Buffer) -> Result<f64, BackendError>,
) -> Result<(), BackendError> {
    let ctx = t.ctx;
    ctx.fill(out(bufs), &poison(d))?;
    ctx.barrier()?;
    let call = |bufs: &mut B| -> Result<(), BackendError> {
        enqueue(bufs)?;
        ctx.synchronize()?;
        ctx.barrier()
    };
    call(bufs)?;
    t.error(error(out(bufs))?);
    t.time(name, &mut || call(bufs))
}

/// The tensor-parallel block's output.
fn tp_out(bufs: &TpMoeBuffers) -> &Buffer {
    &bufs.out
}

/// The benchmark's tensor-parallel variants beside the block.
const TP_SEQUENTIAL: &str = "moe-tp/sequential";
const TP_AG_GATE_UP: &str = "moe-tp/ag-gate-up";
const TP_DOWN_RS: &str = "moe-tp/down-rs";
/// The tensor-parallel block with [`TpReduce::Rows`], against the one with atomics.
const TP_ROWS: &str = "moe-tp-rows/block";
/// Its down GEMM, storing rows and announcing tiles, against the plain down GEMM.
const TP_DOWN_ROWS: &str = "moe-tp/down-rows";

/// The error of a down GEMM's weighted rows (`[rows, H]` of type `d` in `c`, at world 1) summed
/// per token on the host, against the block's reference.
fn token_sums(
    ctx: &dyn RankCtx,
    bufs: &TpMoeBuffers,
    (c, d): (&Buffer, DType),
    check_with: &dyn Fn(&Reader) -> Result<f64, BackendError>,
) -> Result<f64, BackendError> {
    let h = bufs.shape.hidden;
    let tokens = download(ctx, &bufs.row_token, bufs.cap(), DType::I32)?;
    check_with(&|tok, col| {
        let mut sum = 0.0;
        for (row, _) in tokens.iter().enumerate().filter(|(_, &v)| v as usize == tok) {
            sum += read_entry(ctx, c, row * h + col, d)?;
        }
        Ok(sum)
    })
}

/// At world 1 (after the block's calls, its chunk signal set): the block's two grouped GEMMs
/// alone against the plain grouped GEMMs of the same rows, the cost of the overlap machinery
/// (the chunk walk and its waits; the down's top-k reduction by atomics and its signals against
/// storing each weighted row), and the rows form's down GEMM (its rows stored into `parts`, each
/// tile announced) after the rows-form block's calls (`rows`). Each checked on poisoned outputs:
/// the plain gate/up's `act` bitwise the waiting one's, the down's outputs summed per token
/// against the reference.
fn tp_machinery(
    t: &mut Timer,
    [(block, bufs), (rows_block, rows_bufs)]: [(&TpMoeBlock, &mut TpMoeBuffers); 2],
    experts_w: (&Buffer, &Buffer),
    check_with: &dyn Fn(&Reader) -> Result<f64, BackendError>,
) -> Result<(), BackendError> {
    let ctx = t.ctx;
    let (d, h) = (block.dtype, bufs.shape.hidden);
    // The rows of the chunk the pairs filled (the benchmark routes every pair).
    let rows = bufs.cap();
    let gemm = |bufs: &TpMoeBuffers, which: TpGemm<'_>| -> Result<(), BackendError> {
        block.enqueue_gemm(ctx, bufs, experts_w, which)?;
        ctx.synchronize()
    };
    let act_bytes = |bufs: &TpMoeBuffers| -> Result<Vec<u8>, BackendError> {
        let mut raw = vec![0u8; rows * block.ffn_shard * d.size_bytes() as usize];
        ctx.read(&bufs.act, 0, &mut raw)?;
        Ok(raw)
    };
    let mut acts = Vec::new();
    for which in [TpGemm::AgGateUp, TpGemm::GateUp] {
        ctx.fill(&bufs.act, &poison(d))?;
        gemm(bufs, which)?;
        acts.push(act_bytes(bufs)?);
    }
    if acts[0] != acts[1] {
        return Err(BackendError::Host("moe-tp: the plain gate/up GEMM's SwiGLU output differs from the waiting one's".into()));
    }
    // The plain one first: at 413c26d the waiting one, timed first, came out 0-10% slower
    // with the same main loop (the order is one suspect).
    t.time("grouped/gate-up", &mut || gemm(bufs, TpGemm::GateUp))?;
    t.time(TP_AG_GATE_UP, &mut || gemm(bufs, TpGemm::AgGateUp))?;
    // The reduce-scatter epilogue into a cleared accumulator (f32, each token's row), checked
    // then timed, with no bands (the block picks bands by the accumulator's size:
    // `TpMoeBlock::band_for`); then the same in column bands of 4 and 8 tiles (a token's
    // additions while its accumulator row's band is in L2; A read once per band).
    for band in [0, 4, 8] {
        let banded = TpMoeBlock { down_band: Some(band), ..*block };
        let run = |bufs: &TpMoeBuffers| -> Result<(), BackendError> {
            banded.enqueue_gemm(ctx, bufs, experts_w, TpGemm::DownReduceScatter)?;
            ctx.synchronize()
        };
        ctx.fill(&bufs.acc, &[0])?;
        ctx.fill(&bufs.done, &[0])?;
        run(bufs)?;
        t.error(check_with(&|tok, c| read_entry(ctx, &bufs.acc, tok * h + c, DType::F32))?);
        let name = match band {
            0 => TP_DOWN_RS.to_string(),
            _ => format!("{TP_DOWN_RS}-band{band}"),
        };
        t.time(&name, &mut || run(bufs))?;
    }
    // The rows form's down GEMM; `done` then holds the timed announcements: back to zero.
    let parts = rows_bufs.parts.clone().ok_or_else(|| BackendError::Host("moe-tp: the rows form has no `parts`".into()))?;
    let down_rows = |bufs: &TpMoeBuffers| -> Result<(), BackendError> {
        rows_block.enqueue_gemm(ctx, bufs, experts_w, TpGemm::DownReduceScatter)?;
        ctx.synchronize()
    };
    ctx.fill(&parts, &poison(d))?;
    down_rows(rows_bufs)?;
    t.error(token_sums(ctx, rows_bufs, (&parts, d), check_with)?);
    t.time(TP_DOWN_ROWS, &mut || down_rows(rows_bufs))?;
    rows_bufs.rearm(ctx)?;
    // The plain down: each row weighted and stored; a token's rows summed here.
    let c = ctx.alloc(bufs.chunk_rows() * h * d.size_bytes() as usize, "moe_tp_plain_down")?;
    ctx.fill(&c, &poison(d))?;
    gemm(bufs, TpGemm::Down(&c))?;
    t.error(token_sums(ctx, bufs, (&c, d), check_with)?);
    t.time("grouped/down", &mut || gemm(bufs, TpGemm::Down(&c)))?;
    // The accumulator and its count hold the timed additions: back to zero for a next call.
    bufs.rearm(ctx)
}

inventory::submit! { Registered(&MoeBlockCase) }

#[cfg(test)]
mod tests {
    use super::*;

    /// A SwiGLU output whose scaled value is a rounding midpoint (13.5, between the E4M3 values
    /// 13 and 14) flips with probability 1/2; one on an E4M3 value (12) and zeros do not.
    #[test]
    fn flip_reach_counts_the_outputs_at_rounding_midpoints() {
        let h = 4;
        // Each gate/up product's value and its terms' absolute sum.
        let products: Vec<(f64, f64)> = (0..2 * FFN).map(|r| (((r * 7919) % 13) as f64 / 13.0 - 0.5, 1.0)).collect();
        // w2 reads SwiGLU output 1 into column 0 and output 2 into column 1.
        let mut w2 = vec![0.0; h * FFN];
        (w2[1], w2[FFN + 2]) = (1.0, 1.0);
        let mut act = vec![0.0; FFN];
        (act[0], act[1], act[2]) = (1.0, 13.5 / 448.0, 12.0 / 448.0);
        let (mean, var) = flip_reach(&products, &w2, h, &act);
        // The move is one E4M3 step (1 at 13) times the scale 1/448; s = 13.5 sits on the
        // midpoint, so its rounding (to even: 14) goes to 13 with probability 1/2.
        let step = 1.0 / 448.0;
        assert!((mean[0].abs() - 0.5 * step).abs() < 1e-3 * step, "{mean:?}");
        assert!((var[0] - 0.25 * step * step).abs() < 1e-3 * step * step, "{var:?}");
        assert!(mean[1].abs() < 1e-12 && var[1] < 1e-20, "an E4M3 value does not flip: {mean:?} {var:?}");
        assert_eq!((mean[2], mean[3]), (0.0, 0.0));
    }
}
