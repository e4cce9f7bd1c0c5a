//! AllGather: every rank ends with every rank's chunk, in rank order. Variants: the in-kernel
//! push (`push`) and the copy engine with stream signals (`ce`).

use crate::dist_bench::{upload, value, DistCase, Timer};
use crate::distributed::download;
use crate::host::{poison, random};
use crate::registry::{Benchmark, Operation, Registered, WorldData};
use crate::suite::Case;
use trident_core::backend::{BackendError, Buffer};
use trident_core::world::RankCtx;
use trident_kernels::allgather::{AllGather, AllGatherCe, GatherBuffers};

struct AllGatherCase;

impl Operation for AllGatherCase {
    fn name(&self) -> &'static str {
        "allgather"
    }

    fn variants(&self, _dtype: trident_core::ir::DType) -> &'static [&'static str] {
        &["push", "ce"]
    }

    fn distributed(&self) -> bool {
        true
    }

    /// Elements per rank.
    fn shapes(&self, _world: usize) -> Vec<Vec<usize>> {
        vec![vec![777], vec![4096]]
    }

    fn prepare(&self, case: &Case, rng: &mut rand::rngs::StdRng) -> WorldData {
        let inputs: Vec<Vec<Vec<f64>>> = (0..case.world).map(|_| vec![random(case.shape[0], case.dtype, rng)]).collect();
        let all: Vec<f64> = inputs.iter().flat_map(|i| i[0].clone()).collect();
        WorldData { expected: vec![all; case.world], inputs, reduction_len: 1 }
    }

    /// A copy: exact.
    fn bound(&self, case: &Case, reduction_len: usize) -> f64 {
        crate::suite::bound(case.dtype, "exact", reduction_len)
    }

    fn run_rank(
        &self,
        case: &Case,
        ctx: &dyn RankCtx,
        _inputs: &[Vec<f64>],
        ins: &[Buffer],
        out_len: usize,
    ) -> Result<Vec<f64>, BackendError> {
        let d = case.dtype;
        let mut bufs = GatherBuffers::new(ctx, d, case.shape[0])?;
        ctx.fill(&bufs.out, &poison(d))?;
        ctx.barrier()?;
        if case.variant == "push" {
            AllGather::new(d).run(ctx, &mut bufs, &ins[0])?;
        } else {
            AllGatherCe { dtype: d }.run(ctx, &mut bufs, &ins[0])?;
        }
        download(ctx, &bufs.out, out_len, d)
    }

    fn benchmark(&self) -> Option<&dyn Benchmark> {
        Some(self)
    }
}

/// AllGather of `dims[0]` elements per rank, copy engine and in-kernel push; checked exactly.
impl Benchmark for AllGatherCase {
    /// 64 KB to 32 MB gathered.
    fn shapes(&self, world: usize) -> Vec<Vec<usize>> {
        [64usize, 1024, 8192, 32768].map(|kb| vec![(kb * 1024 / 2 / world).max(1)]).to_vec()
    }

    fn small_shape(&self, _world: usize) -> Vec<usize> {
        vec![100]
    }

    fn heap_bytes(&self, case: &DistCase) -> usize {
        2 * case.world * case.dims[0] * case.dtype.size_bytes() as usize
    }

    fn bus_bytes(&self, case: &DistCase) -> f64 {
        let (w, es) = (case.world as f64, case.dtype.size_bytes() as f64);
        case.dims[0] as f64 * w * es * (w - 1.0) / w
    }

    fn run(&self, t: &mut Timer, case: &DistCase, seed: u64) -> Result<(), BackendError> {
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
}

inventory::submit! { Registered(&AllGatherCase) }
