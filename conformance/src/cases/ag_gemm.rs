//! AG-GEMM: the rows of A are sharded over the ranks and gathered chunk by chunk while each
//! rank's GEMM `C_r = A B_r` waits per tile for its chunk. Variants: the copy engine gathering
//! (`ce`) and the in-kernel gather (`kernel`).

use crate::dist_bench::{sampled, shard_error, upload, upload_with, value, DistCase, Timer};
use crate::distributed::download;
use crate::host::{poison, random};
use crate::reference;
use crate::registry::{faster, Benchmark, Operation, RankOp, Registered, WorldData};
use crate::suite::Case;
use rand::SeedableRng;
use trident_core::backend::{BackendError, Buffer};
use trident_core::world::RankCtx;
use trident_kernels::ag_gemm::{AgGemm, AgGemmBuffers, GatherMode};
use trident_kernels::allgather::{AllGatherCe, GatherBuffers};
use trident_kernels::gemm::Gemm;

struct AgGemmCase;

impl Operation for AgGemmCase {
    fn name(&self) -> &'static str {
        "ag_gemm"
    }

    fn variants(&self, _dtype: trident_core::ir::DType) -> &'static [&'static str] {
        &["ce", "kernel"]
    }

    fn distributed(&self) -> bool {
        true
    }

    /// M (over all ranks, a multiple of the world), N (per rank), K. The third has more rows of
    /// tiles than a group of the grouped raster order holds, at 64- and 128-row tiles, the last
    /// group partial.
    fn shapes(&self, world: usize) -> Vec<Vec<usize>> {
        vec![
            vec![128usize.next_multiple_of(world), 96, 64],
            vec![64usize.next_multiple_of(world), 40, 72],
            vec![1152usize.next_multiple_of(world), 48, 32],
        ]
    }

    fn prepare(&self, case: &Case, rng: &mut rand::rngs::StdRng) -> WorldData {
        let (w, d, s) = (case.world, case.dtype, &case.shape);
        let (m, n, k) = (s[0], s[1], s[2]);
        let a = random(m * k, d, rng);
        let rows = m / w.max(1);
        let mut inputs = Vec::new();
        let mut expected = Vec::new();
        for r in 0..w {
            let b = random(k * n, d, rng);
            expected.push(reference::gemm(&a, &b, m, n, k));
            inputs.push(vec![a[r * rows * k..(r + 1) * rows * k].to_vec(), b]);
        }
        WorldData { inputs, expected, reduction_len: k, slack: 0.0 }
    }

    fn setup_rank(
        &self,
        case: &Case,
        ctx: &dyn RankCtx,
        _inputs: &[Vec<f64>],
        ins: &[Buffer],
        out_len: usize,
    ) -> Result<Box<dyn RankOp>, BackendError> {
        let mode = if case.variant == "ce" { GatherMode::CopyEngine } else { GatherMode::Kernel };
        let (m, n, k) = (case.shape[0], case.shape[1], case.shape[2]);
        let op = AgGemm::for_world(ctx, case.dtype, mode);
        let bufs = op.buffers(ctx, m, n, k)?;
        let c = ctx.alloc(m * n * case.dtype.size_bytes() as usize, "c")?;
        Ok(Box::new(AgGemmRank { op, bufs, a: ins[0].clone(), b: ins[1].clone(), c, out_len }))
    }

    fn benchmark(&self) -> Option<&dyn Benchmark> {
        Some(self)
    }
}

/// AG-GEMM: rank r holds rows `r M/W ..` of A (`M x K`) and B_r (`K x N/W`), and computes
/// `C_r = A B_r`. Variants: the fused operation with the copy engine gathering (one program
/// per tile, and persistent where the target has TMA) and with the in-kernel gather, the gather
/// to completion and then the GEMM, and the two parts alone.
impl Benchmark for AgGemmCase {
    /// M, N (all ranks), K: the per-rank shapes of LLaMA-3.1-70B and 8B (M = 8192 tokens; N the
    /// MLP's intermediate size, split over the ranks).
    fn shapes(&self, _world: usize) -> Vec<Vec<usize>> {
        vec![vec![8192, 28672, 8192], vec![8192, 14336, 4096]]
    }

    fn small_shape(&self, world: usize) -> Vec<usize> {
        vec![64 * world, 48 * world, 64]
    }

    /// A gathered once per gather mode (one half: TMA descriptors), and a double buffer for
    /// the gather-then-GEMM pipeline.
    fn heap_bytes(&self, case: &DistCase) -> usize {
        let (mk, es) = (case.dims[0] * case.dims[2], case.dtype.size_bytes() as usize);
        2 * mk * es + trident_kernels::epoch::halves_bytes(mk, es)
    }

    fn bus_bytes(&self, case: &DistCase) -> f64 {
        let w = case.world as f64;
        case.dims[0] as f64 * case.dims[2] as f64 * case.dtype.size_bytes() as f64 * (w - 1.0) / w
    }

    fn rank_flops(&self, case: &DistCase) -> f64 {
        2.0 * case.dims[0] as f64 * case.dims[1] as f64 * case.dims[2] as f64 / case.world as f64
    }

    fn is_fused(&self, variant: &str) -> bool {
        variant.starts_with("ag_gemm/")
    }

    /// The GEMM (trident's or cuBLAS's) and the gather (trident's or NCCL's).
    fn parts(
        &self,
        time_of: &dyn Fn(&str) -> Option<f64>,
        cublas: Option<f64>,
        nccl: Option<f64>,
        _link_floor: f64,
    ) -> (Option<f64>, Option<f64>) {
        (faster(time_of("gemm"), cublas), faster(time_of("gather"), nccl))
    }

    fn run(&self, t: &mut Timer, case: &DistCase, seed: u64) -> Result<(), BackendError> {
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
        // The copy engine gathering, one program per tile, and persistent (the library's
        // choice where the target has TMA: `AgGemm::for_world`).
        let ce = AgGemm::for_target(d, GatherMode::CopyEngine, target);
        let ce_tiles = AgGemm { gemm: Gemm { persistent: false, ..ce.gemm }, ..ce };
        let mut ce_bufs = ce.buffers(ctx, m, n, k)?;
        let mut kernel_bufs = kernel.buffers(ctx, m, n, k)?;
        // The gather-then-GEMM pipeline on buffers of its own: a buffer set counts the calls
        // of one operation (`trident_kernels::epoch`).
        let mut seq_bufs = GatherBuffers::new(ctx, d, rows * k)?;
        let gather = AllGatherCe { dtype: d };
        let check = |t: &mut Timer, rng: &mut rand::rngs::StdRng| -> Result<(), BackendError> {
            let e = sampled(ctx, &c, (m, n), d, 128, rng, &want)?;
            t.error(e);
            Ok(())
        };
        // Each variant: a checked run on poisoned C, then the timed runs. One program per tile
        // only where this rank has its device to itself: its programs wait for chunks, and with
        // ranks sharing a GPU they cannot all be resident (the runtime refuses the launch).
        let mut fused = Vec::new();
        if ctx.ranks_sharing_device() == 1 || !ce.gemm.persistent {
            fused.push(("ag_gemm/ce", ce_tiles, GatherMode::CopyEngine));
        }
        if ce.gemm.persistent {
            fused.push(("ag_gemm/ce-persistent", ce, GatherMode::CopyEngine));
        }
        fused.push(("ag_gemm/kernel", kernel, GatherMode::Kernel));
        for (name, op, mode) in fused {
            let bufs = if mode == GatherMode::CopyEngine { &mut ce_bufs } else { &mut kernel_bufs };
            ctx.fill(&c, &poison(d))?;
            op.run(ctx, bufs, &shard, &b, &c)?;
            check(t, &mut rng)?;
            t.time(name, &mut || op.run(ctx, bufs, &shard, &b, &c))?;
        }
        let sequential = |bufs: &mut GatherBuffers| -> Result<(), BackendError> {
            gather.run(ctx, bufs, &shard)?;
            gemm.enqueue(ctx, 0, (&bufs.result(bufs.calls), &b, &c), (m, n, k))?;
            ctx.synchronize()?;
            ctx.barrier()
        };
        ctx.fill(&c, &poison(d))?;
        sequential(&mut seq_bufs)?;
        check(t, &mut rng)?;
        t.time("gather+gemm", &mut || sequential(&mut seq_bufs))?;
        // The parts: the GEMM on the gathered A (in place from the last run), the gather alone.
        let gathered = seq_bufs.result(seq_bufs.calls);
        t.time("gemm", &mut || {
            gemm.enqueue(ctx, 0, (&gathered, &b, &c), (m, n, k))?;
            ctx.synchronize()
        })?;
        t.time("gather", &mut || gather.run(ctx, &mut seq_bufs, &shard))?;
        Ok(())
    }
}

/// A rank's AG-GEMM: the operation, its buffers, operands and output.
struct AgGemmRank {
    op: AgGemm,
    bufs: AgGemmBuffers,
    a: Buffer,
    b: Buffer,
    c: Buffer,
    out_len: usize,
}

impl RankOp for AgGemmRank {
    fn poison(&self, ctx: &dyn RankCtx, _call: u64) -> Result<(), BackendError> {
        ctx.fill(&self.c, &poison(self.op.gemm.dtype))
    }

    fn enqueue(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.op.enqueue(ctx, &mut self.bufs, &self.a, &self.b, &self.c)
    }

    fn result(&self, ctx: &dyn RankCtx, _call: u64) -> Result<Vec<f64>, BackendError> {
        download(ctx, &self.c, self.out_len, self.op.gemm.dtype)
    }

    fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.bufs.rearm(ctx)
    }
}

inventory::submit! { Registered(&AgGemmCase) }
