//! AG-GEMM against "gather, then GEMM" in a world: the overlap benchmark of the Hopper GEMM
//! issue, run by `trident bench` in the loopback world (ranks sharing one GPU) and by the tests
//! in the CPU world. Every rank times both pipelines with the host clock between barriers (the
//! same way for both, so launch costs count alike) and checks both outputs against an f64
//! reference of sampled entries.

use rand::SeedableRng;
use std::time::Instant;
use trident_conformance::host::{decode, encode, poison, random};
use trident_conformance::reference::sampled_gemm_error;
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::DType;
use trident_core::world::RankCtx;
use trident_kernels::ag_gemm::{AgGemm, GatherMode};
use trident_kernels::allgather::{AllGatherCe, GatherBuffers};
use trident_kernels::gemm::Gemm;

/// One rank's medians (ms) and the worst normwise error of the two outputs.
#[derive(Clone, Copy, Debug)]
pub struct OverlapTimes {
    /// AG-GEMM: the copy-engine gather on stream 1 while the GEMM's programs wait per chunk.
    pub overlapped_ms: f64,
    /// The same gather to completion, then the library's GEMM for the target.
    pub sequential_ms: f64,
    pub error: f64,
}

/// This rank's A shard (`m / w x k`) and B (`k x n`), from `seed` (every rank can make every
/// other rank's shard, which the reference needs).
fn inputs(seed: u64, rank: usize, (m, n, k, w): (usize, usize, usize, usize), d: DType) -> (Vec<f64>, Vec<f64>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (rank as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    (random(m / w * k, d, &mut rng), random(k * n, d, &mut rng))
}

/// The worst of 128 sampled entries of `c = A_full b` ([`sampled_gemm_error`]).
fn worst_error(
    ctx: &dyn RankCtx,
    c: &Buffer,
    (a_full, b): (&[f64], &[f64]),
    mnk: (usize, usize, usize),
    d: DType,
    rng: &mut rand::rngs::StdRng,
) -> Result<f64, BackendError> {
    let es = d.size_bytes() as usize;
    let entry = |idx: usize| -> Result<f64, BackendError> {
        let mut raw = vec![0u8; es];
        ctx.read(c, idx * es, &mut raw)?;
        Ok(decode(&raw, d)[0])
    };
    sampled_gemm_error(&entry, (a_full, b), mnk, 128, rng)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Times AG-GEMM (`C = A_full B_r`, `A` `m x k` sharded by rows over the ranks, `B_r` `k x n`)
/// and the gather followed by the GEMM, `reps` times each after a checked warm-up run; every
/// rank returns its own medians.
pub fn ag_gemm_vs_sequential(
    ctx: &dyn RankCtx,
    d: DType,
    (m, n, k): (usize, usize, usize),
    reps: usize,
    seed: u64,
) -> Result<OverlapTimes, BackendError> {
    let (r, w) = (ctx.rank(), ctx.world_size());
    let es = d.size_bytes() as usize;
    let (shard, b) = inputs(seed, r, (m, n, k, w), d);
    let a_full: Vec<f64> = (0..w).flat_map(|q| inputs(seed, q, (m, n, k, w), d).0).collect();
    let upload = |v: &[f64], name: &str| -> Result<Buffer, BackendError> {
        let buf = ctx.alloc(v.len() * es, name)?;
        ctx.write(&buf, 0, &encode(v, d))?;
        Ok(buf)
    };
    let (a_buf, b_buf) = (upload(&shard, "a_shard")?, upload(&b, "b")?);
    let c = ctx.alloc(m * n * es, "c")?;
    // The copy engine gathers in both: AG-GEMM is then persistent where the target has TMA and
    // ranks share the GPU (a program per multiprocessor and rank), and the sequential
    // pipeline's GEMM is the library's default for the target.
    let op = AgGemm::for_world(ctx, d, GatherMode::CopyEngine);
    let gemm = Gemm::for_target(d, ctx.gpu_target());
    let mut bufs = op.buffers(ctx, m, n, k)?;
    // The sequential pipeline gathers into buffers of its own: a buffer set counts the calls of
    // one operation (`trident_kernels::epoch`). One half: its calls end on every rank (a
    // synchronize and a barrier) before the next starts.
    let mut seq = GatherBuffers::single(ctx, d, (m / w) * k)?;
    let gather = AllGatherCe { dtype: d };
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0xC0FF_EE00 ^ r as u64);
    let fresh = |c: &Buffer| ctx.fill(c, &poison(d));

    let mut overlapped = || op.run(ctx, &mut bufs, &a_buf, &b_buf, &c);
    // The sequential pipeline: the gather to completion on every rank, then the GEMM reading
    // the gathered A (no waits in it).
    let mut sequential = || -> Result<(), BackendError> {
        gather.run(ctx, &mut seq, &a_buf)?;
        gemm.enqueue(ctx, 0, (&seq.result(seq.calls), &b_buf, &c), (m, n, k))?;
        ctx.synchronize()?;
        ctx.barrier()
    };

    let mut error = 0.0f64;
    fresh(&c)?;
    overlapped()?;
    error = error.max(worst_error(ctx, &c, (&a_full, &b), (m, n, k), d, &mut rng)?);
    fresh(&c)?;
    sequential()?;
    error = error.max(worst_error(ctx, &c, (&a_full, &b), (m, n, k), d, &mut rng)?);

    let time = |f: &mut dyn FnMut() -> Result<(), BackendError>| {
        let mut ms = Vec::with_capacity(reps.max(1));
        for _ in 0..reps.max(1) {
            ctx.barrier()?;
            let t = Instant::now();
            f()?;
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        Ok::<f64, BackendError>(median(ms))
    };
    let overlapped_ms = time(&mut overlapped)?;
    let sequential_ms = time(&mut sequential)?;
    Ok(OverlapTimes { overlapped_ms, sequential_ms, error })
}
