//! The distributed benchmark of a world (`trident-bench --world W`): AG-GEMM, GEMM-RS,
//! AllGather and AllReduce on every rank, each checked against an f64 reference and timed with
//! the protocol `bench/baseline_dist.py` uses for NCCL and cuBLAS, so the two compare.
//!
//! Timing: every repetition evicts L2 (a copy of [`FLUSH_BYTES`] on the rank's device), waits
//! for it, meets the other ranks at a host barrier, then reads the clock, runs the whole
//! operation to completion on this rank and reads the clock again. A collective ends when its
//! slowest rank does, so a repetition's figure is the slowest rank's time, and a variant's
//! figure the median over repetitions ([`combine`]). Host clocks, not device events: the
//! operations span several streams and devices, and the baseline's NCCL calls are timed the
//! same way (the launch and synchronization costs count alike on both sides).
//!
//! Inputs are generated per element from the seed ([`value`]), so every rank can compute the
//! reference of any entry without holding other ranks' inputs (8 ranks of LLaMA-70B's shapes
//! would otherwise hold gigabytes of f64 each).

use crate::host::poison;
use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use std::time::Instant;
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::DType;
use trident_core::world::RankCtx;
use trident_kernels::ag_gemm::{AgGemm, GatherMode};
use trident_kernels::allgather::{AllGather, AllGatherCe, GatherBuffers};
use trident_kernels::allreduce::{Algorithm, AllReduce};
use trident_kernels::gemm::Gemm;
use trident_kernels::gemm_rs::{GemmRs, ReduceTiles};

/// Bytes copied before every timed repetition to evict L2 (50 MB on the H200), as
/// `triton.testing.do_bench` does.
pub const FLUSH_BYTES: usize = 256 << 20;

/// A case of the distributed benchmark.
#[derive(Clone, Debug, PartialEq)]
pub struct DistCase {
    /// `ag_gemm`, `gemm_rs`, `allgather` or `allreduce`.
    pub name: &'static str,
    pub dtype: DType,
    /// `ag_gemm`: M, N (all ranks), K; `gemm_rs`: M, N, K (all ranks); `allgather`: elements
    /// per rank; `allreduce`: elements.
    pub dims: Vec<usize>,
    pub world: usize,
}

impl DistCase {
    /// The case's line for the baseline script: `name dtype dims... world`.
    pub fn key(&self) -> String {
        let dims: Vec<String> = self.dims.iter().map(|d| d.to_string()).collect();
        format!("{} {} {} w{}", self.name, self.dtype, dims.join(" "), self.world)
    }

    /// Symmetric heap bytes a rank needs (every variant has its own buffers), with margin for
    /// signals.
    pub fn heap_bytes(&self) -> usize {
        let (es, w, d) = (self.dtype.size_bytes() as usize, self.world, &self.dims);
        let data = match self.name {
            // A gathered per gather mode.
            "ag_gemm" => 2 * d[0] * d[2] * es,
            // The partial tiles of every rank.
            "gemm_rs" => d[0] * d[1] * es,
            "allgather" => 2 * w * d[0] * es,
            // Stage and result per algorithm.
            _ => 4 * d[0] * es,
        };
        data + (16 << 20)
    }

    /// The bytes each rank sends over its links in the communication alone (the collective's
    /// bus bytes, as nccl-tests counts them): the floor of a link-bound collective.
    pub fn bus_bytes(&self) -> f64 {
        let (es, w, d) = (self.dtype.size_bytes() as f64, self.world as f64, &self.dims);
        let frac = (w - 1.0) / w;
        match self.name {
            "ag_gemm" => d[0] as f64 * d[2] as f64 * es * frac,
            "gemm_rs" => d[0] as f64 * d[1] as f64 * es * frac,
            "allgather" => d[0] as f64 * w * es * frac,
            _ => 2.0 * d[0] as f64 * es * frac,
        }
    }

    /// FLOPs of one rank's GEMM (0 for the collectives).
    pub fn rank_flops(&self) -> f64 {
        let (w, d) = (self.world as f64, &self.dims);
        match self.name {
            "ag_gemm" | "gemm_rs" => 2.0 * d[0] as f64 * d[1] as f64 * d[2] as f64 / w,
            _ => 0.0,
        }
    }
}

/// The cases of `trident-bench --world W`: AG-GEMM and GEMM-RS on the per-rank shapes of
/// LLaMA-3.1-70B and LLaMA-3.1-8B (M = 8192 tokens; AG-GEMM's N and GEMM-RS's K are the MLP's
/// intermediate size split over the ranks), AllReduce from 8 KB to 64 MB and AllGather from
/// 64 KB to 32 MB gathered, all bf16.
pub fn cases(world: usize) -> Vec<DistCase> {
    let c = |name, dims: &[usize]| DistCase { name, dtype: DType::BF16, dims: dims.to_vec(), world };
    let mut v = vec![
        c("ag_gemm", &[8192, 28672, 8192]),
        c("ag_gemm", &[8192, 14336, 4096]),
        c("gemm_rs", &[8192, 8192, 28672]),
        c("gemm_rs", &[8192, 4096, 14336]),
    ];
    for kb in [8usize, 32, 128, 512, 2048, 8192, 32768, 65536] {
        v.push(c("allreduce", &[kb * 1024 / 2]));
    }
    for kb in [64usize, 1024, 8192, 32768] {
        v.push(c("allgather", &[(kb * 1024 / 2 / world).max(1)]));
    }
    v
}

/// A value of input `tag` at flat index `idx`: uniform in [-1, 1), rounded to `d`; the same on
/// every rank for the same seed.
pub fn value(seed: u64, tag: u64, idx: usize, d: DType) -> f64 {
    let mut x = seed ^ tag.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (idx as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    let u = (x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
    match d {
        DType::BF16 => bf16::from_f64(u).to_f64(),
        DType::F16 => f16::from_f64(u).to_f64(),
        DType::F32 => u as f32 as f64,
        _ => u,
    }
}

/// A new buffer of this rank holding `n` values `f(i)` encoded in `d`.
fn upload_with(
    ctx: &dyn RankCtx,
    n: usize,
    d: DType,
    name: &str,
    f: &dyn Fn(usize) -> f64,
) -> Result<Buffer, BackendError> {
    let es = d.size_bytes() as usize;
    let buf = ctx.alloc(n * es, name)?;
    // In pieces: a 235 MB input would otherwise be a 1.9 GB Vec<f64> per rank.
    let piece = 1 << 22;
    for start in (0..n).step_by(piece) {
        let v: Vec<f64> = (start..(start + piece).min(n)).map(f).collect();
        ctx.write(&buf, start * es, &crate::host::encode(&v, d))?;
    }
    Ok(buf)
}

/// `n` values of input `tag` ([`value`]) in a new buffer of this rank.
fn upload(ctx: &dyn RankCtx, seed: u64, tag: u64, n: usize, d: DType, name: &str) -> Result<Buffer, BackendError> {
    upload_with(ctx, n, d, name, &|i| value(seed, tag, i, d))
}

fn read_entry(ctx: &dyn RankCtx, buf: &Buffer, idx: usize, d: DType) -> Result<f64, BackendError> {
    let es = d.size_bytes() as usize;
    let mut raw = vec![0u8; es];
    ctx.read(buf, idx * es, &mut raw)?;
    Ok(crate::host::decode(&raw, d)[0])
}

/// One rank's results: per variant, its time (ms) in every repetition; the worst error of the
/// checked outputs (normwise: relative to the sum of magnitudes of each entry's terms).
#[derive(Clone, Debug, Default)]
pub struct RankTimes {
    pub variants: Vec<(String, Vec<f64>)>,
    pub error: f64,
}

/// Per variant, the median over repetitions of the slowest rank's time, in the order the
/// variants ran.
pub fn combine(ranks: &[RankTimes]) -> Vec<(String, f64)> {
    let Some(first) = ranks.first() else { return Vec::new() };
    first
        .variants
        .iter()
        .enumerate()
        .map(|(i, (name, reps))| {
            let mut slowest: Vec<f64> = (0..reps.len())
                .map(|r| ranks.iter().map(|t| t.variants.get(i).map_or(f64::NAN, |v| v.1[r])).fold(0.0, f64::max))
                .collect();
            slowest.sort_by(f64::total_cmp);
            (name.clone(), slowest[slowest.len() / 2])
        })
        .collect()
}

/// Times operations of one rank by the protocol of the module's head.
struct Timer<'a> {
    ctx: &'a dyn RankCtx,
    flush: Buffer,
    reps: usize,
    out: RankTimes,
}

impl<'a> Timer<'a> {
    fn new(ctx: &'a dyn RankCtx, reps: usize) -> Result<Timer<'a>, BackendError> {
        // The CPU world has no L2 to speak of: a token copy keeps the protocol's steps.
        let bytes = if ctx.backend().descriptor().name.starts_with("cpu") { 1 << 16 } else { FLUSH_BYTES };
        let flush = ctx.alloc(bytes, "bench.l2_flush")?;
        Ok(Timer { ctx, flush, reps: reps.max(1), out: RankTimes::default() })
    }

    /// Runs `op` once more to warm up (its checked run went first), then times it.
    fn time(&mut self, name: &str, op: &mut dyn FnMut() -> Result<(), BackendError>) -> Result<(), BackendError> {
        let ctx = self.ctx;
        op()?;
        let half = self.flush.bytes / 2;
        let mut ms = Vec::with_capacity(self.reps);
        for _ in 0..self.reps {
            ctx.copy(0, &self.flush, half, &self.flush, 0, half)?;
            ctx.synchronize()?;
            ctx.barrier()?;
            let t = Instant::now();
            op()?;
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        self.out.variants.push((name.to_string(), ms));
        Ok(())
    }

    fn error(&mut self, e: f64) {
        self.out.error = self.out.error.max(e);
    }
}

/// Runs `case` on this rank: every variant checked on poisoned outputs, then timed `reps` times.
pub fn run(ctx: &dyn RankCtx, case: &DistCase, reps: usize, seed: u64) -> Result<RankTimes, BackendError> {
    if ctx.world_size() != case.world {
        return Err(BackendError::Host(format!(
            "{}: a world of {} ranks, not {}",
            case.key(),
            ctx.world_size(),
            case.world
        )));
    }
    let mut t = Timer::new(ctx, reps)?;
    match case.name {
        "ag_gemm" => ag_gemm(&mut t, case, seed)?,
        "gemm_rs" => gemm_rs(&mut t, case, seed)?,
        "allgather" => allgather(&mut t, case, seed)?,
        "allreduce" => allreduce(&mut t, case, seed)?,
        other => return Err(BackendError::Host(format!("no distributed benchmark `{other}`"))),
    }
    Ok(t.out)
}

fn shard_error(case: &DistCase, what: &str) -> BackendError {
    BackendError::Host(format!("{}: {what} does not split evenly over {} ranks", case.key(), case.world))
}

/// The worst of `samples` sampled entries of `c` (`rows x cols`) against `want(i, j)`, which
/// returns the f64 value and the sum of its terms' magnitudes.
fn sampled(
    ctx: &dyn RankCtx,
    c: &Buffer,
    (rows, cols): (usize, usize),
    d: DType,
    samples: usize,
    rng: &mut rand::rngs::StdRng,
    want: &dyn Fn(usize, usize) -> (f64, f64),
) -> Result<f64, BackendError> {
    let mut worst = 0.0f64;
    for _ in 0..samples {
        let (i, j) = (rng.gen_range(0..rows), rng.gen_range(0..cols));
        let got = read_entry(ctx, c, i * cols + j, d)?;
        let (w, scale) = want(i, j);
        let e = (got - w).abs() / scale.max(1e-30);
        worst = worst.max(if e.is_nan() { f64::INFINITY } else { e });
    }
    Ok(worst)
}

/// AG-GEMM: rank r holds rows `r M/W ..` of A (`M x K`) and B_r (`K x N/W`), and computes
/// `C_r = A B_r`. Variants: the fused operation with the copy engine gathering (one program
/// per tile, and persistent where the target has TMA) and with the in-kernel gather, the gather
/// to completion and then the GEMM, and the two parts alone.
fn ag_gemm(t: &mut Timer, case: &DistCase, seed: u64) -> Result<(), BackendError> {
    let ctx = t.ctx;
    let (d, w, r) = (case.dtype, case.world, ctx.rank());
    let (m, n_all, k) = (case.dims[0], case.dims[1], case.dims[2]);
    if !m.is_multiple_of(w) || !n_all.is_multiple_of(w) {
        return Err(shard_error(case, "M or N"));
    }
    let (n, rows) = (n_all / w, m / w);
    let es = d.size_bytes() as usize;
    // A's rows are tag 1 over the whole matrix: rank r's shard is rows r*rows.. of it.
    let a_at = |i: usize, p: usize| value(seed, 1, i * k + p, d);
    let b_tag = 100 + r as u64;
    let shard = upload_with(ctx, rows * k, d, "a_shard", &|i| a_at(r * rows + i / k, i % k))?;
    let b = upload(ctx, seed, b_tag, k * n, d, "b")?;
    let c = ctx.alloc(m * n * es, "c")?;
    let want = |i: usize, j: usize| {
        (0..k).fold((0.0, 0.0), |(s, a), p| {
            let x = a_at(i, p) * value(seed, b_tag, p * n + j, d);
            (s + x, a + x.abs())
        })
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0xA6 ^ r as u64);
    let target = ctx.gpu_target();
    let kernel = AgGemm::for_world(ctx, d, GatherMode::Kernel);
    let gemm = Gemm::for_target(d, target);
    // The copy engine gathering, one program per tile (the library's choice where every rank
    // has its own GPU), and persistent (its choice where ranks share one).
    let ce = AgGemm::for_target(d, GatherMode::CopyEngine, target);
    let ce_tiles = AgGemm { gemm: Gemm { persistent: false, ..ce.gemm }, ..ce };
    let mut ce_bufs = ce.buffers(ctx, m, k)?;
    let mut kernel_bufs = kernel.buffers(ctx, m, k)?;
    let gather = AllGatherCe { dtype: d };
    let check = |t: &mut Timer, rng: &mut rand::rngs::StdRng| -> Result<(), BackendError> {
        let e = sampled(ctx, &c, (m, n), d, 128, rng, &want)?;
        t.error(e);
        Ok(())
    };
    // Each variant: a checked run on poisoned C, then the timed runs.
    let mut fused = vec![("ag_gemm/ce", ce_tiles, GatherMode::CopyEngine)];
    if ce != ce_tiles {
        fused.push(("ag_gemm/ce-persistent", ce, GatherMode::CopyEngine));
    }
    fused.push(("ag_gemm/kernel", kernel, GatherMode::Kernel));
    for (name, op, mode) in fused {
        let bufs = if mode == GatherMode::CopyEngine { &mut ce_bufs } else { &mut kernel_bufs };
        ctx.fill(&c, &poison(d))?;
        op.run(ctx, bufs, &shard, &b, &c, n)?;
        check(t, &mut rng)?;
        t.time(name, &mut || op.run(ctx, bufs, &shard, &b, &c, n))?;
    }
    let sequential = |bufs: &mut GatherBuffers| -> Result<(), BackendError> {
        gather.run(ctx, bufs, &shard)?;
        gemm.enqueue(ctx, 0, (&bufs.out, &b, &c), (m, n, k))?;
        ctx.synchronize()?;
        ctx.barrier()
    };
    ctx.fill(&c, &poison(d))?;
    sequential(&mut ce_bufs.gather)?;
    check(t, &mut rng)?;
    t.time("gather+gemm", &mut || sequential(&mut ce_bufs.gather))?;
    // The parts: the GEMM on the gathered A (in place from the last run), the gather alone.
    t.time("gemm", &mut || {
        gemm.enqueue(ctx, 0, (&ce_bufs.gather.out, &b, &c), (m, n, k))?;
        ctx.synchronize()
    })?;
    t.time("gather", &mut || gather.run(ctx, &mut ce_bufs.gather, &shard))?;
    Ok(())
}

/// GEMM-RS: rank r holds A_r (`M x K/W`) and B_r (`K/W x N`) and ends with rows `r M/W ..` of
/// `sum_p A_p B_p`. Variants: the fused operation (the library's choice, then other reduction
/// tiles) and its GEMM alone (the reduce-scatter alone is the baseline's NCCL figure).
fn gemm_rs(t: &mut Timer, case: &DistCase, seed: u64) -> Result<(), BackendError> {
    let ctx = t.ctx;
    let (d, w, r) = (case.dtype, case.world, ctx.rank());
    let (m, n, k_all) = (case.dims[0], case.dims[1], case.dims[2]);
    if !m.is_multiple_of(w) || !k_all.is_multiple_of(w) {
        return Err(shard_error(case, "M or K"));
    }
    let (k, rows) = (k_all / w, m / w);
    let es = d.size_bytes() as usize;
    let (a_tag, b_tag) = (|p: usize| 200 + p as u64, |p: usize| 300 + p as u64);
    let a = upload(ctx, seed, a_tag(r), m * k, d, "a")?;
    let b = upload(ctx, seed, b_tag(r), k * n, d, "b")?;
    let out = ctx.alloc(rows * n * es, "out")?;
    let c = ctx.alloc(m * n * es, "c")?;
    let want = |i: usize, j: usize| {
        let row = r * rows + i;
        (0..w * k).fold((0.0, 0.0), |(s, mag), q| {
            let (p, kk) = (q / k, q % k);
            let x = value(seed, a_tag(p), row * k + kk, d) * value(seed, b_tag(p), kk * n + j, d);
            (s + x, mag + x.abs())
        })
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x25 ^ r as u64);
    let op = GemmRs::for_world(ctx, d);
    let gemm = Gemm::for_target(d, ctx.gpu_target());
    let mut bufs = op.buffers(ctx, m, n)?;
    // The library's choice, then other reduction tiles (rows x 256 columns, warps; persistent
    // or a program per tile): the reduction is memory-bound and its first form took a sixth of
    // the GEMM's time.
    let mut variants = vec![("gemm_rs".to_string(), op)];
    let other = |rows, warps, persistent| GemmRs { reduce: ReduceTiles { rows, warps, persistent, ..op.reduce }, ..op };
    let same_grid = [(32, 4), (16, 4), (64, 8)].map(|(rows, warps)| other(rows, warps, op.reduce.persistent));
    for alt in same_grid
        .into_iter()
        .chain((ctx.ranks_sharing_device() == 1).then(|| other(op.reduce.rows, op.reduce.warps, true)))
    {
        let r = alt.reduce;
        let name = format!(
            "gemm_rs/reduce-{}x{}w{}{}",
            r.rows,
            r.cols,
            r.warps,
            if r.persistent { "-persistent" } else { "" }
        );
        variants.push((name, alt));
    }
    for (name, op) in variants {
        ctx.fill(&out, &poison(d))?;
        op.run(ctx, &mut bufs, &a, &b, &out, k)?;
        let e = sampled(ctx, &out, (rows, n), d, 128, &mut rng, &want)?;
        t.error(e);
        t.time(&name, &mut || op.run(ctx, &mut bufs, &a, &b, &out, k))?;
    }
    t.time("gemm", &mut || {
        gemm.enqueue(ctx, 0, (&a, &b, &c), (m, n, k))?;
        ctx.synchronize()
    })?;
    Ok(())
}

/// AllGather of `dims[0]` elements per rank, copy engine and in-kernel push; checked exactly.
fn allgather(t: &mut Timer, case: &DistCase, seed: u64) -> Result<(), BackendError> {
    let ctx = t.ctx;
    let (d, w, r, chunk) = (case.dtype, case.world, ctx.rank(), case.dims[0]);
    let es = d.size_bytes() as usize;
    let src = upload(ctx, seed, 400 + r as u64, chunk, d, "src")?;
    let check = |t: &mut Timer, out: &Buffer| -> Result<(), BackendError> {
        let mut raw = vec![0u8; w * chunk * es];
        ctx.read(out, 0, &mut raw)?;
        let got = crate::host::decode(&raw, d);
        for p in 0..w {
            if let Some(i) =
                (0..chunk).find(|&i| got[p * chunk + i].to_bits() != value(seed, 400 + p as u64, i, d).to_bits())
            {
                return Err(BackendError::Host(format!(
                    "{}: rank {r}'s gathered element {i} of rank {p}'s chunk is {}, not {}",
                    case.key(),
                    got[p * chunk + i],
                    value(seed, 400 + p as u64, i, d)
                )));
            }
        }
        t.error(0.0);
        Ok(())
    };
    let ce = AllGatherCe { dtype: d };
    let mut ce_bufs = GatherBuffers::new(ctx, d, chunk)?;
    ctx.fill(&ce_bufs.out, &poison(d))?;
    ctx.barrier()?;
    ce.run(ctx, &mut ce_bufs, &src)?;
    check(t, &ce_bufs.out)?;
    t.time("allgather/ce", &mut || ce.run(ctx, &mut ce_bufs, &src))?;
    let push = AllGather::new(d);
    let mut push_bufs = GatherBuffers::new(ctx, d, chunk)?;
    ctx.fill(&push_bufs.out, &poison(d))?;
    ctx.barrier()?;
    push.run(ctx, &mut push_bufs, &src)?;
    check(t, &push_bufs.out)?;
    t.time("allgather/kernel", &mut || push.run(ctx, &mut push_bufs, &src))?;
    Ok(())
}

/// AllReduce (sum) of `dims[0]` elements, one-shot and two-shot; sampled entries against the
/// f64 sum.
fn allreduce(t: &mut Timer, case: &DistCase, seed: u64) -> Result<(), BackendError> {
    let ctx = t.ctx;
    let (d, w, r, n) = (case.dtype, case.world, ctx.rank(), case.dims[0]);
    let input = upload(ctx, seed, 500 + r as u64, n, d, "input")?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0xA4 ^ r as u64);
    let want = |_: usize, j: usize| {
        (0..w).fold((0.0, 0.0), |(s, mag), p| {
            let x = value(seed, 500 + p as u64, j, d);
            (s + x, mag + x.abs())
        })
    };
    for (algorithm, name) in [(Algorithm::OneShot, "allreduce/one_shot"), (Algorithm::TwoShot, "allreduce/two_shot")] {
        let op = AllReduce::new(d, algorithm);
        let mut bufs = op.buffers(ctx, n)?;
        ctx.fill(&bufs.out, &poison(d))?;
        ctx.barrier()?;
        op.run(ctx, &mut bufs, &input)?;
        let e = sampled(ctx, &bufs.out, (1, n), d, 4096.min(n * 4), &mut rng, &want)?;
        t.error(e);
        t.time(name, &mut || op.run(ctx, &mut bufs, &input))?;
    }
    Ok(())
}
