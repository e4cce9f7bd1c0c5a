//! GEMM-RS: each rank computes `A_r B_r` (K sharded) and the sum over ranks is scattered by
//! rows: the GEMM's epilogue stores each tile into its owner rank's buffer and signals it, and
//! a reduction sums the arrived tiles. Variants: operands through pointers (`-`) and A and B
//! read by TMA where the target has it and the arguments are divisible (`tma`).

use crate::dist_bench::{sampled, shard_error, upload, value, DistCase, Timer};
use crate::distributed::download;
use crate::host::poison;
use crate::registry::{faster, Benchmark, Operation, RankOp, Registered, WorldData};
use crate::suite::Case;
use rand::SeedableRng;
use trident_core::backend::{BackendError, Buffer};
use trident_core::world::RankCtx;
use trident_kernels::gemm::Gemm;
use trident_kernels::gemm_rs::{GemmRs, GemmRsBuffers, ReduceTiles};

struct GemmRsCase;

impl Operation for GemmRsCase {
    fn name(&self) -> &'static str {
        "gemm_rs"
    }

    fn variants(&self, _dtype: trident_core::ir::DType) -> &'static [&'static str] {
        &["-", "tma"]
    }

    fn distributed(&self) -> bool {
        true
    }

    /// M (over all ranks), N, K. GEMM-RS splits M over the ranks in power-of-two tiles, so M
    /// stays as it is where `M / world` is a power of two and becomes a multiple of `16 world`
    /// otherwise; the last two shapes' shards (24 and 40 rows a rank) are no multiple of 16,
    /// so each rank's last row tile is masked at its shard's end (`GemmRs::row_block`).
    fn shapes(&self, world: usize) -> Vec<Vec<usize>> {
        let split = |m: usize| {
            if m.is_multiple_of(world) && (m / world).is_power_of_two() {
                m
            } else {
                m.next_multiple_of(16 * world)
            }
        };
        vec![
            vec![split(128), 64, 32],
            vec![split(64), 80, 24],
            vec![split(1152), 48, 32],
            vec![24 * world, 40, 24],
            vec![40 * world, 48, 32],
        ]
    }

    fn prepare(&self, case: &Case, rng: &mut rand::rngs::StdRng) -> WorldData {
        let (w, s) = (case.world, &case.shape);
        let (m, n, k) = (s[0], s[1], s[2]);
        let (inputs, total) = super::gemm_ar::k_sharded_products(case, rng);
        let rows = m / w;
        let expected = (0..w).map(|r| total[r * rows * n..(r + 1) * rows * n].to_vec()).collect();
        WorldData { inputs, expected, reduction_len: k * w, slack: 0.0 }
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
        // The library's choice for this world: the reduction persistent where ranks share a
        // device (the CPU world above one rank, loopback), a program per tile elsewhere.
        let mut op = GemmRs::for_world(ctx, case.dtype);
        op.gemm.descriptors = case.variant == "tma";
        let bufs = op.buffers(ctx, m, n)?;
        let out = ctx.alloc(out_len * case.dtype.size_bytes() as usize, "out")?;
        Ok(Box::new(GemmRsRank { op, bufs, a: ins[0].clone(), b: ins[1].clone(), out, k, out_len }))
    }

    fn benchmark(&self) -> Option<&dyn Benchmark> {
        Some(self)
    }
}

/// GEMM-RS: rank r holds A_r (`M x K/W`) and B_r (`K/W x N`) and ends with rows `r M/W ..` of
/// `sum_p A_p B_p`. Variants: the fused operation (the library's choice, then other reduction
/// tiles) and its GEMM alone (the reduce-scatter alone is the baseline's NCCL figure).
impl Benchmark for GemmRsCase {
    /// M, N, K (all ranks): the per-rank shapes of LLaMA-3.1-70B and 8B (K the MLP's
    /// intermediate size, split over the ranks).
    fn shapes(&self, _world: usize) -> Vec<Vec<usize>> {
        vec![vec![8192, 8192, 28672], vec![8192, 4096, 14336]]
    }

    fn small_shape(&self, world: usize) -> Vec<usize> {
        vec![64 * world, 48, 32 * world]
    }

    /// The partial tiles of every rank, a double buffer.
    fn heap_bytes(&self, case: &DistCase) -> usize {
        trident_kernels::epoch::halves_bytes(case.dims[0] * case.dims[1], case.dtype.size_bytes() as usize)
    }

    fn bus_bytes(&self, case: &DistCase) -> f64 {
        let w = case.world as f64;
        case.dims[0] as f64 * case.dims[1] as f64 * case.dtype.size_bytes() as f64 * (w - 1.0) / w
    }

    fn rank_flops(&self, case: &DistCase) -> f64 {
        2.0 * case.dims[0] as f64 * case.dims[1] as f64 * case.dims[2] as f64 / case.world as f64
    }

    fn is_fused(&self, variant: &str) -> bool {
        variant == "gemm_rs" || variant.starts_with("gemm_rs/")
    }

    /// The GEMM (trident's or cuBLAS's) and NCCL's reduce-scatter.
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
}

/// A rank's GEMM-RS: the operation, its buffers, operands and output.
struct GemmRsRank {
    op: GemmRs,
    bufs: GemmRsBuffers,
    a: Buffer,
    b: Buffer,
    out: Buffer,
    k: usize,
    out_len: usize,
}

impl RankOp for GemmRsRank {
    fn poison(&self, ctx: &dyn RankCtx, _call: u64) -> Result<(), BackendError> {
        ctx.fill(&self.out, &poison(self.op.gemm.dtype))
    }

    fn enqueue(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.op.enqueue(ctx, &mut self.bufs, &self.a, &self.b, &self.out, self.k)
    }

    fn result(&self, ctx: &dyn RankCtx, _call: u64) -> Result<Vec<f64>, BackendError> {
        download(ctx, &self.out, self.out_len, self.op.gemm.dtype)
    }

    fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.bufs.rearm(ctx)
    }
}

inventory::submit! { Registered(&GemmRsCase) }
