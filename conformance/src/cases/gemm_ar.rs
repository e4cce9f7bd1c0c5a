//! GEMM + AllReduce: each rank computes `A_r B_r` (K sharded) and every rank ends with the sum
//! over ranks: the GEMM's epilogue pushes each tile to every rank and signals it there, and a
//! reduction on every rank sums the arrived tiles.

use crate::dist_bench::{sampled, shard_error, upload, value, DistCase, Timer};
use crate::distributed::download;
use crate::host::{poison, random};
use crate::reference;
use crate::registry::{faster, Benchmark, Operation, RankOp, Registered, WorldData};
use crate::suite::Case;
use rand::SeedableRng;
use trident_core::backend::{BackendError, Buffer};
use trident_kernels::allreduce::{AllReduce, AllReduceBuffers};
use trident_kernels::gemm::Gemm;
use trident_core::world::RankCtx;
use trident_kernels::gemm_ar::GemmAr;
use trident_kernels::gemm_ar_two_shot::GemmArTwoShot;
use trident_kernels::gemm_rs::GemmRsBuffers;

struct GemmArCase;

/// Every rank's random `A_r` (`M x K`) and `B_r` (`K x N`) of a case of shape `[M, N, K]`, and
/// the f64 sum over ranks of `A_r B_r` (`M x N`): what GEMM-RS and both GEMM + AllReduce forms
/// compute.
pub(crate) fn k_sharded_products(case: &Case, rng: &mut rand::rngs::StdRng) -> (Vec<Vec<Vec<f64>>>, Vec<f64>) {
    let (w, d, s) = (case.world, case.dtype, &case.shape);
    let (m, n, k) = (s[0], s[1], s[2]);
    let inputs: Vec<Vec<Vec<f64>>> = (0..w).map(|_| vec![random(m * k, d, rng), random(k * n, d, rng)]).collect();
    let mut total = vec![0.0; m * n];
    for x in &inputs {
        for (t, v) in total.iter_mut().zip(reference::gemm(&x[0], &x[1], m, n, k)) {
            *t += v;
        }
    }
    (inputs, total)
}

/// The benchmark's GEMM then AllReduce, one after the other.
const SEQUENTIAL: &str = "gemm+allreduce";

/// The benchmark's two-shot form (GEMM-RS, then the AllGather of the sums).
const TWO_SHOT: &str = "gemm_ar/two-shot";

/// The largest M the benchmark runs the one-shot form at: above it every rank would receive W
/// copies of an `M x N` partial product (prefill-sized M is the two-shot form's).
const ONE_SHOT_MAX_M: usize = 1024;

impl Operation for GemmArCase {
    fn name(&self) -> &'static str {
        "gemm_ar"
    }

    fn distributed(&self) -> bool {
        true
    }

    /// M, N, K per rank: decode-sized M (16, 48: row tiles of 16; 128; M not a multiple of 16:
    /// 1, 7 and 40, the last row block's rows past M masked), N not a multiple of the column
    /// tile.
    fn shapes(&self, _world: usize) -> Vec<Vec<usize>> {
        // The last three: a long K, split into slices (`GemmAr::for_problem`), through pointers
        // with a short last slice (N = 40, K = 520; M = 7 too) and through descriptors where the
        // target has them (N = 48, K = 1024: two slices of 128-wide K tiles on sm_90a).
        vec![
            vec![16, 64, 32],
            vec![48, 80, 24],
            vec![128, 48, 40],
            vec![1, 40, 24],
            vec![40, 48, 32],
            vec![32, 40, 520],
            vec![7, 40, 520],
            vec![32, 48, 1024],
        ]
    }

    fn prepare(&self, case: &Case, rng: &mut rand::rngs::StdRng) -> WorldData {
        let (inputs, total) = k_sharded_products(case, rng);
        WorldData { inputs, expected: vec![total; case.world], reduction_len: case.shape[2] * case.world, slack: 0.0 }
    }

    fn setup_rank(
        &self,
        case: &Case,
        ctx: &dyn RankCtx,
        _inputs: &[Vec<f64>],
        ins: &[Buffer],
        out_len: usize,
    ) -> Result<Box<dyn RankOp>, BackendError> {
        let (m, n, k) = (case.shape[0], case.shape[1], case.shape[2]);
        let op = GemmAr::for_problem(ctx, case.dtype, (m, n, k));
        let bufs = op.buffers(ctx, m, n)?;
        let out = ctx.alloc(out_len * case.dtype.size_bytes() as usize, "out")?;
        Ok(Box::new(GemmArRank { op, bufs, a: ins[0].clone(), b: ins[1].clone(), out, k, out_len }))
    }

    fn benchmark(&self) -> Option<&dyn Benchmark> {
        Some(self)
    }
}

/// GEMM + AllReduce: rank r holds A_r (`M x K/W`) and B_r (`K/W x N`) and ends with all of
/// `sum_p A_p B_p`. Variants: the fused operation and its GEMM alone (the all-reduce alone is
/// the baseline's NCCL figure).
impl Benchmark for GemmArCase {
    /// M, N, K (all ranks): decode-sized M through Qwen-32B-like layers (N 5120, K 25600),
    /// M 128 at 8192 x 3584, and the prefill-sized 28000 x 7168 x 4096 (issue 31's shapes), the
    /// last in the two-shot form only (one shot would send W copies of a 400 MB partial product).
    fn shapes(&self, _world: usize) -> Vec<Vec<usize>> {
        vec![
            vec![32, 5120, 25600],
            vec![64, 5120, 25600],
            vec![128, 5120, 25600],
            vec![256, 5120, 25600],
            vec![128, 8192, 3584],
            vec![28000, 7168, 4096],
        ]
    }

    fn small_shape(&self, world: usize) -> Vec<usize> {
        vec![32, 48, 32 * world]
    }

    /// The one-shot form's partial products of every rank and K slice (at most `MAX_SPLITS`, a
    /// double buffer; none above [`ONE_SHOT_MAX_M`]), then for the two-shot form and for the
    /// sequential AllReduce two double buffers of `M x N` each.
    fn heap_bytes(&self, case: &DistCase) -> usize {
        let es = case.dtype.size_bytes() as usize;
        let (m, n) = (case.dims[0], case.dims[1]);
        let slices = trident_kernels::gemm_ar::MAX_SPLITS;
        let one_shot =
            if m <= ONE_SHOT_MAX_M { trident_kernels::epoch::halves_bytes(case.world * slices * m * n, es) } else { 0 };
        one_shot + 4 * trident_kernels::epoch::halves_bytes(m * n, es) + (1 << 20)
    }

    /// An all-reduce's bus bytes (nccl-tests): `2 (W - 1) / W` of the result.
    fn bus_bytes(&self, case: &DistCase) -> f64 {
        let w = case.world as f64;
        case.dims[0] as f64 * case.dims[1] as f64 * case.dtype.size_bytes() as f64 * 2.0 * (w - 1.0) / w
    }

    fn rank_flops(&self, case: &DistCase) -> f64 {
        2.0 * case.dims[0] as f64 * case.dims[1] as f64 * case.dims[2] as f64 / case.world as f64
    }

    fn is_fused(&self, variant: &str) -> bool {
        variant == "gemm_ar" || variant == TWO_SHOT
    }

    fn compared_with(&self, variant: &str) -> Option<&'static str> {
        self.is_fused(variant).then_some(SEQUENTIAL)
    }

    /// The GEMM (trident's or cuBLAS's) and NCCL's all-reduce.
    fn parts(
        &self,
        time_of: &dyn Fn(&str) -> Option<f64>,
        cublas: Option<f64>,
        nccl: Option<f64>,
        _link_floor: f64,
    ) -> (Option<f64>, Option<f64>) {
        (faster(time_of("gemm"), cublas), nccl)
    }

    fn run(&self, t: &mut Timer, case: &DistCase, seed: u64) -> Result<(), BackendError> {
        let ctx = t.ctx;
        let (d, w, r) = (case.dtype, case.world, ctx.rank());
        let (m, n, k_all) = (case.dims[0], case.dims[1], case.dims[2]);
        if !k_all.is_multiple_of(w) {
            return Err(shard_error(case, "K"));
        }
        let k = k_all / w;
        let es = d.size_bytes() as usize;
        let (a_tag, b_tag) = (|p: usize| 600 + p as u64, |p: usize| 700 + p as u64);
        let a = upload(ctx, seed, a_tag(r), m * k, d, "a")?;
        let b = upload(ctx, seed, b_tag(r), k * n, d, "b")?;
        let out = ctx.alloc(m * n * es, "out")?;
        let c = ctx.alloc(m * n * es, "c")?;
        let want = |i: usize, j: usize| {
            (0..w * k).fold((0.0, 0.0), |(s, mag), q| {
                let (p, kk) = (q / k, q % k);
                let x = value(seed, a_tag(p), i * k + kk, d) * value(seed, b_tag(p), kk * n + j, d);
                (s + x, mag + x.abs())
            })
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0xa4 ^ r as u64);
        if m <= ONE_SHOT_MAX_M {
            let op = GemmAr::for_problem(ctx, d, (m, n, k));
            let mut bufs = op.buffers(ctx, m, n)?;
            ctx.fill(&out, &poison(d))?;
            op.run(ctx, &mut bufs, (&a, &b), &out, k)?;
            t.error(sampled(ctx, &out, (m, n), d, 128, &mut rng, &want)?);
            t.time("gemm_ar", &mut || op.run(ctx, &mut bufs, (&a, &b), &out, k))?;
        }
        // Two shots where M splits over the ranks (GEMM-RS's shards).
        if m.is_multiple_of(w) {
            let op = GemmArTwoShot::for_world(ctx, d);
            let mut bufs = op.buffers(ctx, m, n)?;
            ctx.fill(&bufs.gather.result(bufs.gather.calls + 1), &poison(d))?;
            op.run(ctx, &mut bufs, (&a, &b), k)?;
            t.error(sampled(ctx, &bufs.result(), (m, n), d, 128, &mut rng, &want)?);
            t.time(TWO_SHOT, &mut || op.run(ctx, &mut bufs, (&a, &b), k))?;
        }
        let gemm = Gemm::for_target(d, ctx.gpu_target());
        t.time("gemm", &mut || {
            gemm.enqueue(ctx, 0, (&a, &b, &c), (m, n, k))?;
            ctx.synchronize()
        })?;
        // The same work one step after the other: the GEMM, then trident's AllReduce of its
        // product (the algorithm `auto` picks), every rank meeting the others in between.
        let reduce = AllReduce::auto(ctx, d, m * n);
        let mut reduce_bufs = reduce.buffers(ctx, m * n)?;
        let sequential = |bufs: &mut AllReduceBuffers| -> Result<(), BackendError> {
            gemm.enqueue(ctx, 0, (&a, &b, &c), (m, n, k))?;
            ctx.synchronize()?;
            ctx.barrier()?;
            reduce.run(ctx, bufs, &c)
        };
        ctx.fill(&reduce_bufs.result(reduce_bufs.calls + 1), &poison(d))?;
        sequential(&mut reduce_bufs)?;
        t.error(sampled(ctx, &reduce_bufs.result(reduce_bufs.calls), (m, n), d, 128, &mut rng, &want)?);
        t.time(SEQUENTIAL, &mut || sequential(&mut reduce_bufs))?;
        Ok(())
    }
}

/// A rank's GEMM + AllReduce: the operation, its buffers, operands and output.
struct GemmArRank {
    op: GemmAr,
    bufs: GemmRsBuffers,
    a: Buffer,
    b: Buffer,
    out: Buffer,
    k: usize,
    out_len: usize,
}

impl RankOp for GemmArRank {
    fn poison(&self, ctx: &dyn RankCtx, _call: u64) -> Result<(), BackendError> {
        ctx.fill(&self.out, &poison(self.op.gemm.dtype))
    }

    fn enqueue(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.op.enqueue(ctx, &mut self.bufs, (&self.a, &self.b), &self.out, self.k)
    }

    fn result(&self, ctx: &dyn RankCtx, _call: u64) -> Result<Vec<f64>, BackendError> {
        download(ctx, &self.out, self.out_len, self.op.gemm.dtype)
    }

    fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.bufs.rearm(ctx)
    }
}

inventory::submit! { Registered(&GemmArCase) }
