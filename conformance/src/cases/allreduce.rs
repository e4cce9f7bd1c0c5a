//! AllReduce (sum): every rank ends with the elementwise sum of every rank's input. Variants:
//! one-shot (every rank reads every peer's whole input) and two-shot (reduce-scatter, then
//! all-gather).

use crate::dist_bench::{sampled, upload, value, DistCase, Timer};
use crate::distributed::download;
use crate::host::{poison, random};
use crate::registry::{Benchmark, Operation, RankOp, Registered, WorldData};
use crate::suite::Case;
use rand::SeedableRng;
use trident_core::backend::{BackendError, Buffer};
use trident_core::world::RankCtx;
use trident_kernels::allreduce::{Algorithm, AllReduce, AllReduceBuffers};

struct AllReduceCase;

impl Operation for AllReduceCase {
    fn name(&self) -> &'static str {
        "allreduce"
    }

    fn variants(&self, _dtype: trident_core::ir::DType) -> &'static [&'static str] {
        &["oneshot", "twoshot"]
    }

    fn distributed(&self) -> bool {
        true
    }

    /// Elements.
    fn shapes(&self, _world: usize) -> Vec<Vec<usize>> {
        vec![vec![1000], vec![8197]]
    }

    fn prepare(&self, case: &Case, rng: &mut rand::rngs::StdRng) -> WorldData {
        let (w, n) = (case.world, case.shape[0]);
        let inputs: Vec<Vec<Vec<f64>>> = (0..w).map(|_| vec![random(n, case.dtype, rng)]).collect();
        let sum: Vec<f64> = (0..n).map(|i| inputs.iter().map(|x| x[0][i]).sum()).collect();
        WorldData { expected: vec![sum; w], inputs, reduction_len: w, slack: 0.0 }
    }

    fn setup_rank(
        &self,
        case: &Case,
        ctx: &dyn RankCtx,
        _inputs: &[Vec<f64>],
        ins: &[Buffer],
        out_len: usize,
    ) -> Result<Box<dyn RankOp>, BackendError> {
        let algo = if case.variant == "oneshot" { Algorithm::OneShot } else { Algorithm::TwoShot };
        // At most 4 programs: the larger shape's programs loop over several blocks, as every
        // program does at the benchmark's sizes (at most 128 programs by default).
        let op = AllReduce { max_programs: 4, ..AllReduce::new(case.dtype, algo) };
        let bufs = op.buffers(ctx, case.shape[0])?;
        Ok(Box::new(AllReduceRank { op, bufs, input: ins[0].clone(), out_len }))
    }

    fn benchmark(&self) -> Option<&dyn Benchmark> {
        Some(self)
    }
}

/// AllReduce (sum) of `dims[0]` elements, one-shot and two-shot; sampled entries against the
/// f64 sum.
impl Benchmark for AllReduceCase {
    /// 8 KB to 64 MB.
    fn shapes(&self, _world: usize) -> Vec<Vec<usize>> {
        [8usize, 32, 128, 512, 2048, 8192, 32768, 65536].map(|kb| vec![kb * 1024 / 2]).to_vec()
    }

    fn small_shape(&self, _world: usize) -> Vec<usize> {
        vec![1000]
    }

    /// Stage and result per algorithm, each a double buffer.
    fn heap_bytes(&self, case: &DistCase) -> usize {
        4 * trident_kernels::epoch::halves_bytes(case.dims[0], case.dtype.size_bytes() as usize)
    }

    fn bus_bytes(&self, case: &DistCase) -> f64 {
        let (w, es) = (case.world as f64, case.dtype.size_bytes() as f64);
        2.0 * case.dims[0] as f64 * es * (w - 1.0) / w
    }

    fn run(&self, t: &mut Timer, case: &DistCase, seed: u64) -> Result<(), BackendError> {
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
            ctx.fill(&bufs.result(1), &poison(d))?;
            ctx.barrier()?;
            op.run(ctx, &mut bufs, &input)?;
            let e = sampled(ctx, &bufs.result(bufs.calls), (1, n), d, 4096.min(n * 4), &mut rng, &want)?;
            t.error(e);
            t.time(name, &mut || op.run(ctx, &mut bufs, &input))?;
        }
        Ok(())
    }
}

/// A rank's AllReduce: the operation, its buffers and input.
struct AllReduceRank {
    op: AllReduce,
    bufs: AllReduceBuffers,
    input: Buffer,
    out_len: usize,
}

impl RankOp for AllReduceRank {
    fn poison(&self, ctx: &dyn RankCtx, call: u64) -> Result<(), BackendError> {
        ctx.fill(&self.bufs.result(call), &poison(self.op.dtype))
    }

    fn enqueue(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.op.enqueue(ctx, &mut self.bufs, &self.input)
    }

    fn result(&self, ctx: &dyn RankCtx, call: u64) -> Result<Vec<f64>, BackendError> {
        download(ctx, &self.bufs.result(call), self.out_len, self.op.dtype)
    }

    fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.bufs.rearm(ctx)
    }
}

inventory::submit! { Registered(&AllReduceCase) }
