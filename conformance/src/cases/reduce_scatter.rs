//! ReduceScatter (sum): rank r ends with chunk r of the sum over ranks of their inputs (W
//! chunks each). Variants: the ring (`ring`) and the one-shot read of every stage (`oneshot`).

use crate::dist_bench::{sampled, upload, value, DistCase, Timer};
use crate::distributed::download;
use crate::host::{poison, random};
use crate::registry::{Benchmark, Operation, RankOp, Registered, WorldData};
use crate::suite::Case;
use rand::SeedableRng;
use trident_core::backend::{BackendError, Buffer};
use trident_core::world::RankCtx;
use trident_kernels::reduce_scatter::{ReduceScatter, ScatterAlgorithm, ScatterBuffers};

struct ReduceScatterCase;

fn algorithm(variant: &str) -> ScatterAlgorithm {
    if variant.contains("ring") {
        ScatterAlgorithm::Ring
    } else {
        ScatterAlgorithm::OneShot
    }
}

impl Operation for ReduceScatterCase {
    fn name(&self) -> &'static str {
        "reduce_scatter"
    }

    fn variants(&self, _dtype: trident_core::ir::DType) -> &'static [&'static str] {
        &["ring", "oneshot"]
    }

    fn distributed(&self) -> bool {
        true
    }

    /// Elements per rank of the result (each input holds W of them); the second spans several
    /// blocks of 1024 per program.
    fn shapes(&self, _world: usize) -> Vec<Vec<usize>> {
        vec![vec![777], vec![4099]]
    }

    fn prepare(&self, case: &Case, rng: &mut rand::rngs::StdRng) -> WorldData {
        let (w, chunk) = (case.world, case.shape[0]);
        let inputs: Vec<Vec<Vec<f64>>> = (0..w).map(|_| vec![random(w * chunk, case.dtype, rng)]).collect();
        let expected = (0..w)
            .map(|r| (0..chunk).map(|i| inputs.iter().map(|x| x[0][r * chunk + i]).sum()).collect())
            .collect();
        WorldData { inputs, expected, reduction_len: w, slack: 0.0 }
    }

    fn setup_rank(
        &self,
        case: &Case,
        ctx: &dyn RankCtx,
        _inputs: &[Vec<f64>],
        ins: &[Buffer],
        out_len: usize,
    ) -> Result<Box<dyn RankOp>, BackendError> {
        let op = ReduceScatter::new(case.dtype, algorithm(case.variant));
        let bufs = op.buffers(ctx, case.shape[0])?;
        Ok(Box::new(ScatterRank { op, bufs, input: ins[0].clone(), out_len }))
    }

    fn benchmark(&self) -> Option<&dyn Benchmark> {
        Some(self)
    }
}

/// ReduceScatter of `dims[0]` result elements per rank (`W dims[0]` input elements), ring and
/// one-shot; sampled entries against the f64 sum.
impl Benchmark for ReduceScatterCase {
    /// 64 KB to 32 MB of input per rank.
    fn shapes(&self, world: usize) -> Vec<Vec<usize>> {
        [64usize, 1024, 8192, 32768].map(|kb| vec![(kb * 1024 / 2 / world).max(1)]).to_vec()
    }

    fn small_shape(&self, _world: usize) -> Vec<usize> {
        vec![1000]
    }

    /// The receive slots or stage, per variant.
    fn heap_bytes(&self, case: &DistCase) -> usize {
        2 * trident_kernels::epoch::halves_bytes(case.world * case.dims[0], case.dtype.size_bytes() as usize)
    }

    /// nccl-tests' count: the input's bytes times (W-1)/W.
    fn bus_bytes(&self, case: &DistCase) -> f64 {
        let (w, es) = (case.world as f64, case.dtype.size_bytes() as f64);
        case.dims[0] as f64 * w * es * (w - 1.0) / w
    }

    fn run(&self, t: &mut Timer, case: &DistCase, seed: u64) -> Result<(), BackendError> {
        let ctx = t.ctx;
        let (d, w, r, chunk) = (case.dtype, case.world, ctx.rank(), case.dims[0]);
        let input = upload(ctx, seed, 600 + r as u64, w * chunk, d, "input")?;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x25C ^ r as u64);
        let want = |_: usize, j: usize| {
            (0..w).fold((0.0, 0.0), |(s, mag), p| {
                let x = value(seed, 600 + p as u64, r * chunk + j, d);
                (s + x, mag + x.abs())
            })
        };
        for name in ["reduce_scatter/ring", "reduce_scatter/one_shot"] {
            let op = ReduceScatter::new(d, algorithm(name));
            let mut bufs = op.buffers(ctx, chunk)?;
            ctx.fill(&bufs.out, &poison(d))?;
            ctx.barrier()?;
            op.run(ctx, &mut bufs, &input)?;
            let e = sampled(ctx, &bufs.out, (1, chunk), d, 4096.min(chunk * 4), &mut rng, &want)?;
            t.error(e);
            t.time(name, &mut || op.run(ctx, &mut bufs, &input))?;
        }
        Ok(())
    }
}

/// A rank's ReduceScatter: the operation, its buffers and input.
struct ScatterRank {
    op: ReduceScatter,
    bufs: ScatterBuffers,
    input: Buffer,
    out_len: usize,
}

impl RankOp for ScatterRank {
    fn poison(&self, ctx: &dyn RankCtx, _call: u64) -> Result<(), BackendError> {
        ctx.fill(&self.bufs.out, &poison(self.op.dtype))
    }

    fn enqueue(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.op.enqueue(ctx, &mut self.bufs, &self.input)
    }

    fn result(&self, ctx: &dyn RankCtx, _call: u64) -> Result<Vec<f64>, BackendError> {
        download(ctx, &self.bufs.out, self.out_len, self.op.dtype)
    }

    fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.bufs.rearm(ctx)
    }
}

inventory::submit! { Registered(&ReduceScatterCase) }
