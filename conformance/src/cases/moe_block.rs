//! The expert-parallel MoE block (`trident_kernels::moe_block`): dispatch, grouped GEMM gate/up
//! with SwiGLU, grouped GEMM down, combine, against an f64 reference of the whole MoE
//! computation with the router's output given: for each token `sum_j w_j y_j`, where expert
//! `e`'s output is `y = W2_e (silu(W_gate,e x) * (W_up,e x))`, rounded to the element type
//! where the block stores it (the SwiGLU output and `y`, as the grouped GEMMs write them).
//!
//! Shapes `[T, H, E_local, k, routing]` as the all-to-all's (its routings), the intermediate
//! size one SwiGLU block (128). Variants: `ep` (the low-latency exchange, masked layout),
//! `ep-ht` (the high-throughput exchange, contiguous layout).

use crate::dist_bench::{read_entry, upload_with, value, DistCase, Timer};
use crate::distributed::{download, upload};
use crate::host::{poison, random, round_to};
use crate::registry::{Benchmark, Operation, RankOp, Registered, WorldData};
use crate::suite::Case;
use super::ep_all_to_all::{route, shape_of};
use rand::{Rng, SeedableRng};
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::DType;
use trident_core::world::RankCtx;
use trident_kernels::ep_all_to_all::EpShape;
use trident_kernels::grouped_gemm::{swiglu_gate_row, SWIGLU_BLOCK};
use trident_kernels::moe_block::{EpMoeBlock, EpMoeBuffers};

/// The experts' intermediate size in the cases.
const FFN: usize = SWIGLU_BLOCK as usize;

struct MoeBlockCase;

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

    /// T = 1 with k = 1, every token to one expert, only rank 0's experts (the other ranks'
    /// experts get nothing), uniform routing with empty entries at k = 8. (Four shapes: each
    /// runs two grouped GEMMs on cpu-simt at every world, a large share of CI's time.)
    fn shapes(&self, _world: usize) -> Vec<Vec<usize>> {
        vec![vec![1, 24, 1, 1, 0], vec![7, 16, 3, 3, 1], vec![3, 16, 2, 3, 2], vec![4, 8, 4, 8, 0]]
    }

    fn bound(&self, case: &Case, _reduction_len: usize) -> f64 {
        crate::suite::bound(case.dtype, case.variant, FFN)
    }

    fn prepare(&self, case: &Case, rng: &mut rand::rngs::StdRng) -> WorldData {
        let (d, w) = (case.dtype, case.world);
        let (t, routing, shape) = shape_of(case);
        let (h, k, el) = (shape.hidden, shape.top_k, shape.experts / w);
        let topk = route(t, w, shape, routing, rng);
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

    fn small_shape(&self, world: usize) -> Vec<usize> {
        vec![4, 64, 2 * world, 2, FFN]
    }

    /// The two exchanges' symmetric buffers (the all-to-all benchmark's).
    fn heap_bytes(&self, case: &DistCase) -> usize {
        let ep = DistCase { dims: case.dims[..4].to_vec(), ..case.clone() };
        super::ep_all_to_all::EpCase.heap_bytes(&ep)
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
            let act: Vec<f64> = (0..f)
                .map(|j| {
                    let gate_row = swiglu_gate_row(j);
                    let (g, u) = (dot(gate_row), dot(gate_row + SWIGLU_BLOCK as usize));
                    g / (1.0 + (-g).exp()) * u
                })
                .collect();
            round_to(&act, d)
        };
        // Two sampled tokens, 16 columns each.
        let picks: Vec<usize> = (0..2).map(|_| rng.gen_range(0..tokens)).collect();
        let acts: Vec<Vec<Vec<f64>>> = picks.iter().map(|&tok| topk[tok].iter().map(|&e| act_of(tok, e)).collect()).collect();
        let cols: Vec<usize> = (0..16).map(|_| rng.gen_range(0..h)).collect();
        let check = |out: &Buffer| -> Result<f64, BackendError> {
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
                    let e = (read_entry(ctx, out, tok * h + c, d)? - want).abs() / mag.max(1e-30);
                    worst = worst.max(if e.is_nan() { f64::INFINITY } else { e });
                }
            }
            Ok(worst)
        };
        let mut blocks = vec![("moe-ep-ht/block", EpMoeBlock::new(d, f).high_throughput())];
        if tokens <= LOW_LATENCY_TOKENS {
            blocks.insert(0, ("moe-ep/block", EpMoeBlock::new(d, f)));
        }
        for (name, block) in blocks {
            let mut bufs = block.buffers(ctx, shape)?;
            ctx.fill(bufs.out(), &poison(d))?;
            ctx.barrier()?;
            let call = |bufs: &mut EpMoeBuffers| -> Result<(), BackendError> {
                block.enqueue(ctx, bufs, &x, &topk_b, &weights, (&w1, &w2), tokens)?;
                ctx.synchronize()?;
                ctx.barrier()
            };
            call(&mut bufs)?;
            t.error(check(bufs.out())?);
            t.time(name, &mut || call(&mut bufs))?;
        }
        Ok(())
    }
}

inventory::submit! { Registered(&MoeBlockCase) }
