//! Expert parallelism's low-latency all-to-all (`trident_kernels::ep_all_to_all`). Variants:
//! `dispatch` (its results, exactly) and `combine` (dispatch, each expert scaling its rows by
//! its global id + 1, combine: the weighted sums), each in one launch per operation or, with
//! `-split`, as separate send and receive launches.
//!
//! Shapes: `[T, H, E_local, k, routing]` with `T_max = T + 2`; routing 0 draws min(k, E)
//! distinct experts per token and drops some to -1, 1 sends every token to expert 0 only, 2
//! draws only rank 0's experts (every other rank receives nothing).
//!
//! Dispatch's order of a source's rows is the order the pairs took their slots (atomics), so
//! its result is put in a canonical order first: per local expert, its count, then its rows'
//! source codes sorted, then the rows in that order.

use crate::dist_bench::{sampled, upload_with, value, DistCase, Timer};
use crate::distributed::{download, upload};
use crate::host::{poison, random};
use crate::registry::{Benchmark, Operation, RankOp, Registered, WorldData};
use crate::suite::Case;
use rand::{Rng, SeedableRng};
use trident_core::backend::{Artifact, BackendError, Buffer, KernelArg};
use trident_core::ir::{DType, LaunchAttrs};
use trident_core::world::RankCtx;
use trident_core::{Function, KernelBuilder, VerifyError};
use trident_kernels::ep_all_to_all::{EpBuffers, EpShape, LowLatencyAllToAll, Part, QUANT_BLOCK};
use trident_kernels::ep_high_throughput::{HighThroughputAllToAll, HtBuffers};

pub(crate) struct EpCase;

/// A case's `[T, H, E_local, k, routing]`: the tokens per rank, the routing and the all-to-all's
/// shape (T_max two above T; H rounded up to whole 128-channel blocks where the case sends FP8).
pub(crate) fn shape_of(case: &Case) -> (usize, usize, EpShape) {
    let s = &case.shape;
    let (t, mut h, el, k) = (s[0], s[1], s[2], s[3]);
    // FP8 quantizes blocks of 128 channels: the next multiple.
    if fp8(case) {
        h = h.next_multiple_of(QUANT_BLOCK);
    }
    (t, s[4], EpShape { t_max: t + 2, hidden: h, experts: el * case.world, top_k: k })
}

/// Whether the case's dispatch sends FP8.
fn fp8(case: &Case) -> bool {
    case.variant.contains("e4m3")
}

/// A row quantized as the FP8 dispatch does it: its scales (one per 128 channels), then its
/// E4M3FN values.
fn quantized(x: &[f64]) -> Vec<f64> {
    let (mut scales, q) = crate::host::quantize_row(x);
    scales.extend(q);
    scales
}

/// Every rank's `topk [T, k]` for `routing` (see the module's text).
pub(crate) fn route(t: usize, w: usize, shape: EpShape, routing: usize, rng: &mut rand::rngs::StdRng) -> Vec<Vec<i64>> {
    let (e, k, el) = (shape.experts, shape.top_k, shape.experts / w);
    (0..w)
        .map(|_| {
            let mut all = Vec::new();
            for _ in 0..t {
                let pool: Vec<usize> = match routing {
                    1 => vec![0],
                    2 => (0..el).collect(),
                    _ => (0..e).collect(),
                };
                let mut pool = pool;
                let mut row = vec![-1i64; k];
                for slot in row.iter_mut().take(k.min(pool.len())) {
                    let pick = pool.swap_remove(rng.gen_range(0..pool.len()));
                    // Routing 0 leaves about one entry in six empty.
                    if routing != 0 || rng.gen_range(0..6) != 0 {
                        *slot = pick as i64;
                    }
                }
                all.extend(row);
            }
            all
        })
        .collect()
}

/// Dispatch's canonical result on rank `r`: per local expert, its count, its rows' source codes
/// sorted, then those rows.
fn canonical(
    r: usize,
    w: usize,
    shape: EpShape,
    rows: &[(usize, i64, Vec<f64>)],
) -> Vec<f64> {
    let el = shape.experts / w;
    let mut out = Vec::new();
    for l in 0..el {
        let mut mine: Vec<&(usize, i64, Vec<f64>)> = rows.iter().filter(|(e, _, _)| *e == r * el + l).collect();
        mine.sort_by_key(|(_, code, _)| *code);
        out.push(mine.len() as f64);
        out.extend(mine.iter().map(|(_, code, _)| *code as f64));
        for (_, _, x) in mine {
            out.extend(x);
        }
    }
    out
}

/// One local expert's received rows (`rows` of `recv`, `h` values each, their source codes in
/// `codes`, with FP8 `scales` of `sb` per row first) appended in [`canonical`]'s order: the
/// count, the codes sorted, then the rows in that order.
fn append_expert(
    got: &mut Vec<f64>,
    rows: std::ops::Range<usize>,
    codes: &[f64],
    (recv, h): (&[f64], usize),
    scales: Option<(&[f64], usize)>,
) {
    let mut idx: Vec<usize> = rows.collect();
    idx.sort_by(|&a, &b| codes[a].total_cmp(&codes[b]));
    got.push(idx.len() as f64);
    got.extend(idx.iter().map(|&i| codes[i]));
    for i in idx {
        if let Some((s, sb)) = scales {
            got.extend(&s[i * sb..(i + 1) * sb]);
        }
        got.extend(&recv[i * h..(i + 1) * h]);
    }
}

/// The test's experts: local expert `l` of rank `r` scales its rows by `r E_local + l + 1` (so
/// that combine's sums tell the experts apart), in the element type. Low latency: `counts[l]`
/// rows from row `l rows`; high throughput (`ht`): rows `offs[l - 1] .. offs[l]` (`counts` is
/// `offs`).
fn expert_scale(d: DType, ht: bool) -> Result<Function, VerifyError> {
    let b = KernelBuilder::new(&format!("ep_test_expert_scale_{d}_{ht}"), LaunchAttrs::default());
    let (recv, counts, y) = (b.arg_ptr("recv", d), b.arg_ptr("counts", DType::I32), b.arg_ptr("y", d));
    let (rows, hidden, first) = (b.arg("rows", DType::I32), b.arg("hidden", DType::I32), b.arg("first", DType::I32));
    let l = b.program_id_x();
    let factor = (first + l + 1).cast(DType::F32);
    let lanes = b.arange(0, 256);
    let (start, count) = match ht {
        false => (l * rows, b.load(counts + l, None, None)),
        true => {
            let from = b.load_or(counts + (l - 1).max(0), l.gt(0), 0i32);
            (from, b.load(counts + l, None, None) - from)
        }
    };
    b.for_range(0, count, 1, &[], |r, _| {
        let row = (start + r) * hidden;
        b.for_range(0, (hidden + 255) / 256, 1, &[], |blk, _| {
            let at = blk * 256 + lanes;
            let m = at.lt(hidden);
            let x = b.load(recv + (row + at), Some(m), None).cast(DType::F32);
            b.store(y + (row + at), (x * factor).cast(d), Some(m));
            vec![]
        });
        vec![]
    });
    b.finish()
}

impl Operation for EpCase {
    fn name(&self) -> &'static str {
        "ep_all_to_all"
    }

    fn variants(&self, dtype: DType) -> &'static [&'static str] {
        match dtype {
            DType::BF16 => &[
                "dispatch",
                "dispatch-split",
                "dispatch-e4m3",
                "dispatch-e4m3-split",
                "combine",
                "combine-split",
                "ht-dispatch",
                "ht-combine",
            ],
            _ => &[],
        }
    }

    fn distributed(&self) -> bool {
        true
    }

    /// `[T, H, E_local, k, routing]`: uniform with empty entries, T = 1 with k = 1, every token
    /// to one expert, only rank 0's experts with rows of two blocks, k = 8.
    fn shapes(&self, _world: usize) -> Vec<Vec<usize>> {
        vec![vec![5, 40, 2, 2, 0], vec![1, 24, 1, 1, 0], vec![7, 16, 3, 3, 1], vec![3, 1100, 2, 3, 2], vec![4, 8, 4, 8, 0]]
    }

    /// Dispatch copies exactly; combine rounds once after f32 sums of k terms.
    fn bound(&self, case: &Case, _reduction_len: usize) -> f64 {
        match case.variant.contains("dispatch") {
            true => 0.0,
            false => crate::suite::bound(case.dtype, case.variant, case.shape[3]),
        }
    }

    fn prepare(&self, case: &Case, rng: &mut rand::rngs::StdRng) -> WorldData {
        let (d, w) = (case.dtype, case.world);
        let (t, routing, shape) = shape_of(case);
        let (h, k) = (shape.hidden, shape.top_k);
        let topk = route(t, w, shape, routing, rng);
        let xs: Vec<Vec<f64>> = (0..w).map(|_| random(t * h, d, rng)).collect();
        let weights: Vec<Vec<f64>> =
            (0..w).map(|_| (0..t * k).map(|_| rng.gen_range(0.0..1.0f32) as f64).collect()).collect();
        let inputs = (0..w)
            .map(|s| vec![xs[s].clone(), topk[s].iter().map(|&e| e as f64).collect(), weights[s].clone()])
            .collect();
        let expected = if case.variant.contains("dispatch") {
            // Every (source, token, j) pair with an expert: (expert, code, row).
            let mut pairs = Vec::new();
            for (s, routes) in topk.iter().enumerate() {
                for (i, &e) in routes.iter().enumerate() {
                    if e >= 0 {
                        let code = (s * shape.t_max * k + i) as i64;
                        let row = &xs[s][(i / k) * h..(i / k + 1) * h];
                        pairs.push((e as usize, code, if fp8(case) { quantized(row) } else { row.to_vec() }));
                    }
                }
            }
            (0..w).map(|r| canonical(r, w, shape, &pairs)).collect()
        } else {
            (0..w)
                .map(|s| {
                    let mut out = vec![0.0; t * h];
                    for tok in 0..t {
                        for j in 0..k {
                            let e = topk[s][tok * k + j];
                            if e < 0 {
                                continue;
                            }
                            let (wt, factor) = (weights[s][tok * k + j], (e + 1) as f64);
                            for c in 0..h {
                                let y = crate::host::round_to(&[xs[s][tok * h + c] * factor], d)[0];
                                out[tok * h + c] += wt * y;
                            }
                        }
                    }
                    out
                })
                .collect()
        };
        WorldData { inputs, expected, reduction_len: k, slack: 0.0 }
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
        if case.variant.starts_with("ht-") {
            let op = HighThroughputAllToAll::new(case.dtype);
            let bufs = op.buffers(ctx, shape)?;
            let y = ctx.alloc(bufs.capacity(ctx.world_size()) * shape.hidden * case.dtype.size_bytes() as usize, "ep_y")?;
            let combine = case.variant.ends_with("combine");
            return Ok(Box::new(HtRank {
                op,
                bufs,
                scale: if combine { Some(compile_expert_scale(ctx, case.dtype, true)?) } else { None },
                x: upload(ctx, "ep_x", &inputs[0], case.dtype)?,
                topk: upload(ctx, "ep_topk", &inputs[1], DType::I32)?,
                weights: upload(ctx, "ep_weights", &inputs[2], DType::F32)?,
                y,
                tokens: t,
                out_len,
            }));
        }
        let op = LowLatencyAllToAll::new(case.dtype);
        let op = if fp8(case) { op.fp8() } else { op };
        let bufs = op.buffers(ctx, shape)?;
        let el = shape.experts / ctx.world_size();
        let y = ctx.alloc(el * ctx.world_size() * shape.t_max * shape.hidden * case.dtype.size_bytes() as usize, "ep_y")?;
        let combine = case.variant.starts_with("combine");
        Ok(Box::new(EpRank {
            op,
            bufs,
            scale: if combine { Some(compile_expert_scale(ctx, case.dtype, false)?) } else { None },
            part: if case.variant.ends_with("-split") { None } else { Some(Part::Whole) },
            x: upload(ctx, "ep_x", &inputs[0], case.dtype)?,
            topk: upload(ctx, "ep_topk", &inputs[1], DType::I32)?,
            weights: upload(ctx, "ep_weights", &inputs[2], DType::F32)?,
            y,
            tokens: t,
            out_len,
        }))
    }

    fn benchmark(&self) -> Option<&dyn Benchmark> {
        Some(self)
    }
}

/// Tokens per rank up to which the benchmark also times the low-latency form (decode).
const LOW_LATENCY_TOKENS: usize = 256;

/// Dispatch and combine of `[T, H, E, k]` (tokens per rank, hidden, experts, top-k) with
/// uniform routing (k distinct experts per token) and the identity as every expert (`recv` is
/// combine's `y`), so that the sum of a token's k rows is its row times its weights' sum: the
/// high-throughput form at every shape, the low-latency one (bf16 and FP8) up to 256 tokens.
impl Benchmark for EpCase {
    /// DeepSeek-V3's decode step: 128 tokens per rank, H = 7168, 256 experts, top-8.
    fn shapes(&self, world: usize) -> Vec<Vec<usize>> {
        if 256 % world != 0 {
            return Vec::new();
        }
        // Decode (the low-latency and high-throughput forms) and prefill (high-throughput).
        vec![vec![128, 7168, 256, 8], vec![4096, 7168, 256, 8]]
    }

    fn small_shape(&self, world: usize) -> Vec<usize> {
        vec![4, 256, 2 * world, 2]
    }

    /// The receive buffer and the combine buffer, each a double buffer, and the signals.
    fn heap_bytes(&self, case: &DistCase) -> usize {
        let (t, h, e, k, es) = (case.dims[0], case.dims[1], case.dims[2], case.dims[3], case.dtype.size_bytes() as usize);
        let rows = e * (t + 1);
        // The bf16 operation's buffers and the FP8 one's (rows of bytes and their scales).
        let one = |ps: usize| {
            trident_kernels::epoch::halves_bytes(rows * h, ps)
                + trident_kernels::epoch::halves_bytes(rows, 4)
                + trident_kernels::epoch::halves_bytes((t + 1) * k * h, es)
                + 16 * e
        };
        let low_latency = match t <= LOW_LATENCY_TOKENS {
            true => one(es) + one(1) + trident_kernels::epoch::halves_bytes(rows * h.div_ceil(QUANT_BLOCK), 4),
            false => 0,
        };
        // The high-throughput form: rows from each source and partials home, each a double
        // buffer, and the rows' metadata.
        let ht_rows = case.world * t;
        low_latency
            + 2 * trident_kernels::epoch::halves_bytes(ht_rows * h, es)
            + trident_kernels::epoch::halves_bytes(ht_rows * (2 * k + 1), 4)
            + 16 * case.world
    }

    /// Each (token, expert) row out and back, less what stays on the rank.
    fn bus_bytes(&self, case: &DistCase) -> f64 {
        let (t, h, k, w) = (case.dims[0] as f64, case.dims[1] as f64, case.dims[3] as f64, case.world as f64);
        2.0 * t * k * h * case.dtype.size_bytes() as f64 * (w - 1.0) / w
    }

    fn run(&self, t: &mut Timer, case: &DistCase, seed: u64) -> Result<(), BackendError> {
        let ctx = t.ctx;
        let (d, w, r) = (case.dtype, case.world, ctx.rank());
        let (tokens, h, experts, k) = (case.dims[0], case.dims[1], case.dims[2], case.dims[3]);
        if experts % w != 0 || k > experts {
            return Err(crate::dist_bench::shard_error(case, "the experts"));
        }
        let shape = EpShape { t_max: tokens, hidden: h, experts, top_k: k };
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0xE9 ^ r as u64);
        let mut topk = Vec::new();
        for _ in 0..tokens {
            let mut pool: Vec<usize> = (0..experts).collect();
            for _ in 0..k {
                topk.push(pool.swap_remove(rng.gen_range(0..pool.len())) as f64);
            }
        }
        let x = upload_with(ctx, tokens * h, d, "ep_x", &|i| value(seed, 700 + r as u64, i, d))?;
        let topk_b = upload(ctx, "ep_topk", &topk, DType::I32)?;
        let weights = upload_with(ctx, tokens * k, DType::F32, "ep_weights", &|i| value(seed, 800 + r as u64, i, DType::F32).abs())?;
        let want = |tok: usize, i: usize| {
            let xv = value(seed, 700 + r as u64, tok * h + i, d);
            let ws: f64 = (0..k).map(|j| value(seed, 800 + r as u64, tok * k + j, DType::F32).abs()).sum();
            (ws * xv, ws * xv.abs())
        };
        // The high-throughput form, identity experts (`recv` is `y`).
        let ht = HighThroughputAllToAll::new(d);
        let mut hbufs = ht.buffers(ctx, shape)?;
        ctx.fill(&hbufs.out, &poison(d))?;
        ctx.barrier()?;
        let hrecv = hbufs.recv.clone();
        let h_round = |bufs: &mut HtBuffers, dispatch: bool, combine: bool| -> Result<(), BackendError> {
            if dispatch {
                ht.dispatch(ctx, bufs, &x, &topk_b, &weights, tokens)?;
            }
            if combine {
                ht.combine(ctx, bufs, &hrecv, tokens)?;
            }
            ctx.synchronize()?;
            ctx.barrier()
        };
        h_round(&mut hbufs, true, true)?;
        t.error(sampled(ctx, &hbufs.out, (tokens, h), d, 4096.min(tokens * h), &mut rng, &want)?);
        t.time("ep-ht/dispatch+combine", &mut || h_round(&mut hbufs, true, true))?;
        t.time("ep-ht/dispatch", &mut || h_round(&mut hbufs, true, false))?;
        t.time("ep-ht/combine", &mut || h_round(&mut hbufs, false, true))?;
        drop(hbufs);
        if tokens > LOW_LATENCY_TOKENS {
            return Ok(());
        }
        let op = LowLatencyAllToAll::new(d);
        let mut bufs = op.buffers(ctx, shape)?;
        ctx.fill(&bufs.out, &poison(d))?;
        ctx.barrier()?;
        let recv = bufs.recv.clone();
        let round = |bufs: &mut EpBuffers, dispatch: bool, combine: bool| -> Result<(), BackendError> {
            if dispatch {
                op.dispatch(ctx, bufs, &x, &topk_b, tokens, Part::Whole)?;
            }
            if combine {
                op.combine(ctx, bufs, &recv, &topk_b, &weights, tokens, Part::Whole)?;
            }
            ctx.synchronize()?;
            ctx.barrier()
        };
        round(&mut bufs, true, true)?;
        t.error(sampled(ctx, &bufs.out, (tokens, h), d, 4096.min(tokens * h), &mut rng, &want)?);
        t.time("ep/dispatch+combine", &mut || round(&mut bufs, true, true))?;
        t.time("ep/dispatch", &mut || round(&mut bufs, true, false))?;
        t.time("ep/combine", &mut || round(&mut bufs, false, true))?;
        // FP8 dispatch (quantized by the sender), then combine of bf16 rows (the experts'
        // outputs; here the bf16 dispatch's rows): its sampled scales and values are checked
        // by the conformance cases, the times are these.
        let fp8 = op.fp8();
        let mut qbufs = fp8.buffers(ctx, shape)?;
        let q_round = |bufs: &mut EpBuffers, combine: bool| -> Result<(), BackendError> {
            fp8.dispatch(ctx, bufs, &x, &topk_b, tokens, Part::Whole)?;
            if combine {
                fp8.combine(ctx, bufs, &recv, &topk_b, &weights, tokens, Part::Whole)?;
            }
            ctx.synchronize()?;
            ctx.barrier()
        };
        t.time("ep/dispatch-e4m3+combine", &mut || q_round(&mut qbufs, true))?;
        t.time("ep/dispatch-e4m3", &mut || q_round(&mut qbufs, false))?;
        Ok(())
    }
}

/// The test's experts compiled at set-up: a first compile inside a call would load the module
/// while this rank's dispatch is already running (the world keeps that safe, but a call's time
/// should not include a compile).
fn compile_expert_scale(ctx: &dyn RankCtx, d: DType, ht: bool) -> Result<Artifact, BackendError> {
    ctx.compile(&format!("ep_test_expert_scale_{d}_{ht}"), &|| expert_scale(d, ht))
}

/// A rank's all-to-all: dispatch (and the test's experts and combine), in one launch per
/// operation (`part` Whole) or as send and receive launches (`None`).
struct EpRank {
    op: LowLatencyAllToAll,
    bufs: EpBuffers,
    /// The test's experts, compiled with the rest at set-up (`compile_expert_scale`): set
    /// exactly in the combine variants.
    scale: Option<Artifact>,
    part: Option<Part>,
    x: Buffer,
    topk: Buffer,
    weights: Buffer,
    y: Buffer,
    tokens: usize,
    out_len: usize,
}

impl EpRank {
    fn parts(&self) -> Vec<Part> {
        match self.part {
            Some(p) => vec![p],
            None => vec![Part::Send, Part::Recv],
        }
    }
}

impl RankOp for EpRank {
    fn poison(&self, ctx: &dyn RankCtx, _call: u64) -> Result<(), BackendError> {
        let d = self.op.dtype;
        ctx.fill(&self.bufs.recv, &poison(self.op.payload()))?;
        ctx.fill(&self.bufs.recv_scales, &poison(DType::F32))?;
        ctx.fill(&self.bufs.recv_src, &poison(DType::I32))?;
        ctx.fill(&self.bufs.recv_count, &poison(DType::I32))?;
        ctx.fill(&self.y, &poison(d))?;
        ctx.fill(&self.bufs.out, &poison(d))
    }

    fn enqueue(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        for p in self.parts() {
            self.op.dispatch(ctx, &mut self.bufs, &self.x, &self.topk, self.tokens, p)?;
        }
        let Some(scale) = &self.scale else {
            return Ok(());
        };
        let (shape, w) = (self.bufs.shape, ctx.world_size());
        let el = shape.experts / w;
        let args = [
            self.bufs.recv.arg(),
            self.bufs.recv_count.arg(),
            self.y.arg(),
            KernelArg::i32((w * shape.t_max) as i32),
            KernelArg::i32(shape.hidden as i32),
            KernelArg::i32((ctx.rank() * el) as i32),
        ];
        ctx.launch(0, scale, [el as u32, 1, 1], &args)?;
        for p in self.parts() {
            self.op.combine(ctx, &mut self.bufs, &self.y, &self.topk, &self.weights, self.tokens, p)?;
        }
        Ok(())
    }

    fn result(&self, ctx: &dyn RankCtx, _call: u64) -> Result<Vec<f64>, BackendError> {
        let (d, shape, w) = (self.op.dtype, self.bufs.shape, ctx.world_size());
        if self.scale.is_some() {
            return download(ctx, &self.bufs.out, self.out_len, d);
        }
        let el = shape.experts / w;
        let (rows, h) = (w * shape.t_max, shape.hidden);
        let counts = download(ctx, &self.bufs.recv_count, el, DType::I32)?;
        let codes = download(ctx, &self.bufs.recv_src, el * rows, DType::I32)?;
        let recv = download(ctx, &self.bufs.recv, el * rows * h, self.op.payload())?;
        let sb = h / QUANT_BLOCK;
        let scales = match self.op.quantize {
            true => download(ctx, &self.bufs.recv_scales, el * rows * sb, DType::F32)?,
            false => Vec::new(),
        };
        let mut got = Vec::new();
        for (l, &c) in counts.iter().enumerate() {
            if !(0.0..=rows as f64).contains(&c) {
                return Err(BackendError::Host(format!("rank {}: local expert {l} received {c} rows", ctx.rank())));
            }
            let first = l * rows;
            let scales = self.op.quantize.then_some((&scales[..], sb));
            append_expert(&mut got, first..first + c as usize, &codes, (&recv, h), scales);
        }
        Ok(got)
    }

    fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.bufs.rearm(ctx)
    }
}

/// A rank's high-throughput all-to-all: dispatch (and the test's experts and combine).
struct HtRank {
    op: HighThroughputAllToAll,
    bufs: HtBuffers,
    /// The test's experts, compiled with the rest at set-up (`compile_expert_scale`): set
    /// exactly in the combine variants.
    scale: Option<Artifact>,
    x: Buffer,
    topk: Buffer,
    weights: Buffer,
    y: Buffer,
    tokens: usize,
    out_len: usize,
}

impl RankOp for HtRank {
    fn poison(&self, ctx: &dyn RankCtx, _call: u64) -> Result<(), BackendError> {
        let d = self.op.dtype;
        ctx.fill(&self.bufs.recv, &poison(d))?;
        ctx.fill(&self.bufs.recv_src, &poison(DType::I32))?;
        ctx.fill(&self.bufs.offs, &poison(DType::I32))?;
        ctx.fill(&self.y, &poison(d))?;
        ctx.fill(&self.bufs.out, &poison(d))
    }

    fn enqueue(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.op.dispatch(ctx, &mut self.bufs, &self.x, &self.topk, &self.weights, self.tokens)?;
        let Some(scale) = &self.scale else {
            return Ok(());
        };
        let (shape, w) = (self.bufs.shape, ctx.world_size());
        let el = shape.experts / w;
        let args = [
            self.bufs.recv.arg(),
            self.bufs.offs.arg(),
            self.y.arg(),
            KernelArg::i32(0),
            KernelArg::i32(shape.hidden as i32),
            KernelArg::i32((ctx.rank() * el) as i32),
        ];
        ctx.launch(0, scale, [el as u32, 1, 1], &args)?;
        self.op.combine(ctx, &mut self.bufs, &self.y, self.tokens)
    }

    /// Dispatch in the canonical order of [`canonical`] (counts from the segments' ends).
    fn result(&self, ctx: &dyn RankCtx, _call: u64) -> Result<Vec<f64>, BackendError> {
        let (d, shape, w) = (self.op.dtype, self.bufs.shape, ctx.world_size());
        if self.scale.is_some() {
            return download(ctx, &self.bufs.out, self.out_len, d);
        }
        let (el, h, cap) = (shape.experts / w, shape.hidden, self.bufs.capacity(w));
        let offs = download(ctx, &self.bufs.offs, el, DType::I32)?;
        let codes = download(ctx, &self.bufs.recv_src, cap, DType::I32)?;
        let recv = download(ctx, &self.bufs.recv, cap * h, d)?;
        let mut got = Vec::new();
        let mut start = 0usize;
        for (l, &end) in offs.iter().enumerate() {
            if !(start as f64..=cap as f64).contains(&end) {
                return Err(BackendError::Host(format!("rank {}: local expert {l} ends at row {end}", ctx.rank())));
            }
            append_expert(&mut got, start..end as usize, &codes, (&recv, h), None);
            start = end as usize;
        }
        Ok(got)
    }

    fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.bufs.rearm(ctx)
    }
}

inventory::submit! { Registered(&EpCase) }
