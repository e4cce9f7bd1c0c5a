//! AllGather: every rank ends with every rank's chunk, in rank order. Variants: the in-kernel
//! push (`push`) and the copy engine with stream signals (`ce`).

use crate::dist_bench::{upload, value, DistCase, Timer};
use crate::distributed::download;
use crate::host::{poison, random};
use crate::registry::{Benchmark, Operation, RankOp, Registered, WorldData};
use crate::suite::Case;
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::CmpOp;
use trident_core::world::RankCtx;
use trident_kernels::allgather::{AllGather, AllGatherCe, GatherBuffers};
use trident_kernels::allgather_ll::{AllGatherLl, LlBuffers};

/// The largest gathered message the benchmark times the low-latency form at (its words double
/// the bytes moved: it is for messages up to about a megabyte).
const LL_UP_TO: usize = 1 << 20;

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
        WorldData { expected: vec![all; case.world], inputs, reduction_len: 1, slack: 0.0 }
    }

    /// A copy: exact.
    fn bound(&self, case: &Case, reduction_len: usize) -> f64 {
        crate::suite::bound(case.dtype, "exact", reduction_len)
    }

    fn setup_rank(
        &self,
        case: &Case,
        ctx: &dyn RankCtx,
        _inputs: &[Vec<f64>],
        ins: &[Buffer],
        out_len: usize,
    ) -> Result<Box<dyn RankOp>, BackendError> {
        let bufs = GatherBuffers::new(ctx, case.dtype, case.shape[0])?;
        Ok(Box::new(GatherRank { push: case.variant == "push", bufs, src: ins[0].clone(), out_len }))
    }

    fn benchmark(&self) -> Option<&dyn Benchmark> {
        Some(self)
    }
}

/// AllGather of `dims[0]` elements per rank, copy engine, in-kernel push and, up to
/// [`LL_UP_TO`] gathered, the low-latency protocol; checked exactly.
impl Benchmark for AllGatherCase {
    /// 8 KB to 32 MB gathered.
    fn shapes(&self, world: usize) -> Vec<Vec<usize>> {
        [8usize, 64, 1024, 8192, 32768].map(|kb| vec![(kb * 1024 / 2 / world).max(1)]).to_vec()
    }

    fn small_shape(&self, _world: usize) -> Vec<usize> {
        vec![100]
    }

    /// The copy engine's and the push kernel's double buffers, and the low-latency form's
    /// flagged words (8 bytes per 4 of data, two halves) where it runs.
    fn heap_bytes(&self, case: &DistCase) -> usize {
        let bytes = case.dims[0] * case.dtype.size_bytes() as usize;
        let ll = if LL_UP_TO >= bytes * case.world && bytes.is_multiple_of(4) {
            trident_kernels::epoch::halves_bytes(case.world * bytes / 4, 8) + 4096
        } else {
            0
        };
        2 * trident_kernels::epoch::halves_bytes(case.world * case.dims[0], case.dtype.size_bytes() as usize) + ll
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
        ctx.fill(&ce_bufs.result(1), &poison(d))?;
        ctx.barrier()?;
        ce.run(ctx, &mut ce_bufs, &src)?;
        check(t, &ce_bufs.result(ce_bufs.calls))?;
        t.time("allgather/ce", &mut || ce.run(ctx, &mut ce_bufs, &src))?;
        let push = AllGather::new(d);
        let mut push_bufs = GatherBuffers::new(ctx, d, chunk)?;
        ctx.fill(&push_bufs.result(1), &poison(d))?;
        ctx.barrier()?;
        push.run(ctx, &mut push_bufs, &src)?;
        check(t, &push_bufs.result(push_bufs.calls))?;
        t.time("allgather/kernel", &mut || push.run(ctx, &mut push_bufs, &src))?;
        if LL_UP_TO >= chunk * es * w && (chunk * es).is_multiple_of(4) {
            let ll = AllGatherLl::default();
            let mut ll_bufs = LlBuffers::new(ctx, d, chunk)?;
            ctx.fill(&ll_bufs.out, &poison(d))?;
            ctx.barrier()?;
            ll.run(ctx, &mut ll_bufs, &src)?;
            check(t, &ll_bufs.out)?;
            t.time("allgather/ll", &mut || ll.run(ctx, &mut ll_bufs, &src))?;
        }
        Ok(())
    }
}

/// A rank's AllGather: its buffers and chunk.
struct GatherRank {
    push: bool,
    bufs: GatherBuffers,
    src: Buffer,
    out_len: usize,
}

impl RankOp for GatherRank {
    fn poison(&self, ctx: &dyn RankCtx, call: u64) -> Result<(), BackendError> {
        ctx.fill(&self.bufs.result(call), &poison(self.src_dtype()))
    }

    fn enqueue(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        let d = self.src_dtype();
        if self.push {
            AllGather::new(d).enqueue(ctx, 0, &mut self.bufs, &self.src)?;
        } else {
            AllGatherCe { dtype: d }.enqueue(ctx, 1, &mut self.bufs, &self.src)?;
            for c in 0..ctx.world_size() {
                ctx.wait_signal(0, &self.bufs.ready, c * 8, CmpOp::Ge, self.bufs.calls)?;
            }
        }
        Ok(())
    }

    fn result(&self, ctx: &dyn RankCtx, call: u64) -> Result<Vec<f64>, BackendError> {
        download(ctx, &self.bufs.result(call), self.out_len, self.src_dtype())
    }

    fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.bufs.rearm(ctx)
    }
}

impl GatherRank {
    fn src_dtype(&self) -> trident_core::ir::DType {
        self.bufs.dtype
    }
}

inventory::submit! { Registered(&AllGatherCase) }
