//! The distributed benchmark of a world (`trident bench --world W`): every registered
//! operation's benchmark (`crate::registry::Benchmark`) on every rank, each variant checked
//! against an f64 reference and timed with the protocol `bench/baseline_dist.py` uses for NCCL
//! and cuBLAS, so the two compare.
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

use crate::registry::Benchmark;
use half::{bf16, f16};
use rand::Rng;
use std::time::Instant;
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::DType;
use trident_core::world::RankCtx;
use trident_kernels::trace::{Launch, Traced};

/// Bytes copied before every timed repetition to evict L2 (50 MB on the H200), as
/// `triton.testing.do_bench` does.
pub const FLUSH_BYTES: usize = 256 << 20;

/// A case of the distributed benchmark.
#[derive(Clone, Debug, PartialEq)]
pub struct DistCase {
    /// The registered operation's name (`crate::registry`).
    pub name: &'static str,
    pub dtype: DType,
    /// The operation's dimensions (its `Benchmark::shapes`).
    pub dims: Vec<usize>,
    pub world: usize,
}

impl DistCase {
    /// The case's line for the baseline script: `name dtype dims... world`.
    pub fn key(&self) -> String {
        let dims: Vec<String> = self.dims.iter().map(|d| d.to_string()).collect();
        format!("{} {} {} w{}", self.name, self.dtype, dims.join(" "), self.world)
    }

    /// The registered operation's benchmark.
    pub fn benchmark(&self) -> Result<&'static dyn Benchmark, BackendError> {
        crate::registry::find(self.name)
            .and_then(|op| op.benchmark())
            .ok_or_else(|| BackendError::Host(format!("{}: no distributed benchmark `{}`", self.key(), self.name)))
    }

    /// Symmetric heap bytes a rank needs, with margin for signals.
    pub fn heap_bytes(&self) -> usize {
        self.benchmark().map_or(0, |b| b.heap_bytes(self)) + (16 << 20)
    }

    /// The bytes each rank sends over its links in the communication alone.
    pub fn bus_bytes(&self) -> f64 {
        self.benchmark().map_or(0.0, |b| b.bus_bytes(self))
    }

    /// FLOPs of one rank's computation (0 for the collectives).
    pub fn rank_flops(&self) -> f64 {
        self.benchmark().map_or(0.0, |b| b.rank_flops(self))
    }
}

/// The cases of `trident bench --world W`: every registered operation's benchmark shapes
/// (`Benchmark::shapes`), bf16.
pub fn cases(world: usize) -> Vec<DistCase> {
    let mut v = Vec::new();
    for op in crate::registry::operations() {
        if let Some(b) = op.benchmark() {
            for dims in b.shapes(world) {
                v.push(DistCase { name: op.name(), dtype: DType::BF16, dims, world });
            }
        }
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
pub fn upload_with(
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
pub fn upload(ctx: &dyn RankCtx, seed: u64, tag: u64, n: usize, d: DType, name: &str) -> Result<Buffer, BackendError> {
    upload_with(ctx, n, d, name, &|i| value(seed, tag, i, d))
}

/// Element `idx` of `buf`, decoded from `d` (one small read: a check of a few sampled entries
/// of a large output reads only those).
pub fn read_entry(ctx: &dyn RankCtx, buf: &Buffer, idx: usize, d: DType) -> Result<f64, BackendError> {
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
pub struct Timer<'a> {
    pub ctx: &'a dyn RankCtx,
    flush: Buffer,
    reps: usize,
    out: RankTimes,
    /// Where the timed repetition's launches are traced ([`run_traced`]), and each variant's.
    trace: Option<&'a Traced<'a>>,
    traces: Vec<(String, Vec<Launch>)>,
}

impl<'a> Timer<'a> {
    fn new(ctx: &'a dyn RankCtx, reps: usize) -> Result<Timer<'a>, BackendError> {
        // The CPU world has no L2 to speak of: a token copy keeps the protocol's steps.
        let bytes = if ctx.backend().descriptor().name.starts_with("cpu") { 1 << 16 } else { FLUSH_BYTES };
        let flush = ctx.alloc(bytes, "bench.l2_flush")?;
        Ok(Timer { ctx, flush, reps: reps.max(1), out: RankTimes::default(), trace: None, traces: Vec::new() })
    }

    /// Runs `op` once more to warm up (its checked run went first), then times it.
    pub fn time(&mut self, name: &str, op: &mut dyn FnMut() -> Result<(), BackendError>) -> Result<(), BackendError> {
        let ctx = self.ctx;
        op()?;
        let half = self.flush.bytes / 2;
        let mut ms = Vec::with_capacity(self.reps);
        for _ in 0..self.reps {
            ctx.copy(0, &self.flush, half, &self.flush, 0, half)?;
            ctx.synchronize()?;
            if let Some(tr) = self.trace {
                // Each repetition records from the pool's first buffer on.
                tr.reset()?;
            }
            ctx.barrier()?;
            let t = Instant::now();
            op()?;
            ms.push(t.elapsed().as_secs_f64() * 1e3);
            if let Some(tr) = self.trace {
                // The last repetition's launches are the variant's trace, with the ranks' clocks
                // measured against rank 0's where they are on different GPUs.
                ctx.synchronize()?;
                tr.sync_clocks()?;
                let launches = tr.collect()?;
                self.traces.retain(|(n, _)| n != name);
                self.traces.push((name.to_string(), launches));
            }
        }
        self.out.variants.push((name.to_string(), ms));
        Ok(())
    }

    /// Notes the normwise error of a checked run.
    pub fn error(&mut self, e: f64) {
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
    let benchmark = case.benchmark()?;
    let mut t = Timer::new(ctx, reps)?;
    benchmark.run(&mut t, case, seed)?;
    Ok(t.out)
}

/// A run of [`run_traced`] on one rank: each variant's last timed repetition's launches, in
/// the order the variants ran, and the times of the traced repetitions.
pub struct RankTraces {
    pub variants: Vec<(String, Vec<Launch>)>,
    pub times: RankTimes,
}

/// Runs `case` on this rank as [`run`] does, every kernel compiled with tracing
/// (`trident_kernels::trace`: `capacity` events per launch, `launches` launches per
/// repetition, buffers made before any work and reset between repetitions): `trident bench
/// --trace`.
pub fn run_traced(
    ctx: &dyn RankCtx,
    case: &DistCase,
    (reps, seed): (usize, u64),
    (capacity, launches): (usize, usize),
) -> Result<RankTraces, BackendError> {
    let traced = Traced::new(ctx, capacity, launches)?;
    let benchmark = case.benchmark()?;
    let mut t = Timer::new(&traced, reps)?;
    t.trace = Some(&traced);
    benchmark.run(&mut t, case, seed)?;
    Ok(RankTraces { variants: t.traces, times: t.out })
}

/// The error of a case whose `what` does not split over its ranks.
pub fn shard_error(case: &DistCase, what: &str) -> BackendError {
    BackendError::Host(format!("{}: {what} does not split evenly over {} ranks", case.key(), case.world))
}

/// The worst of `samples` sampled entries of `c` (`rows x cols`) against `want(i, j)`, which
/// returns the f64 value and the sum of its terms' magnitudes.
pub fn sampled(
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
