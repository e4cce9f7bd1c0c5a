//! GEMM + AllReduce (one-shot): every rank ends with `sum_p A_p @ B_p`.
//!
//! `A_r` is `[M, K_r]`, `B_r` is `[K_r, N]` (K split over ranks, as a tensor-parallel layer's
//! second GEMM is). Each output tile of the partial product, once computed, is stored into
//! `partial[r]` on every rank (`symm_at`, starting with rank r+1 so that the links are used
//! evenly) and signalled there per tile (`notify` adds 1 to `arrived[row block][r]`); the same
//! reduction kernel as GEMM-RS's ([`crate::gemm_rs::GemmRs::build_reduce`]) then runs on every
//! rank over all M rows: each of its tiles waits for its row block's W partials and sums them
//! in f32, in rank order, so every rank's result is the same bits. The reduction overlaps the
//! rest of the GEMM: a row block is summed as soon as every rank computed it. For the
//! decode-sized M this targets (32 to 256 rows) the W copies of the partial product are small.
//!
//! M must be a multiple of 16 (the GEMM's row tile is the largest power of two dividing it, at
//! most the GEMM's own): a typed error otherwise. Epochs on the device and call `e` in half
//! `e mod 2` of `partial` (`crate::epoch`): recorded once, a call replays.

use crate::gemm::Gemm;
use crate::gemm_rs::{GemmRs, GemmRsBuffers, ReduceTiles};
use crate::{cdiv, require_bytes, require_i32};
use trident_core::backend::{BackendError, Buffer, KernelArg};
use trident_core::ir::{CommScope, DType, LaunchAttrs, SignalOp};
use trident_core::world::RankCtx;
use trident_core::{Function, KernelBuilder, VerifyError};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmAr {
    pub gemm: Gemm,
    pub reduce: ReduceTiles,
}

impl GemmAr {
    pub fn new(dtype: DType) -> GemmAr {
        let rs = GemmRs::new(dtype);
        GemmAr { gemm: rs.gemm, reduce: rs.reduce }
    }

    /// GEMM-RS's choices for this rank's world ([`GemmRs::for_world`]): the GEMM's tiles of
    /// the target, the reduction persistent where ranks share the GPU.
    pub fn for_world(ctx: &dyn RankCtx, dtype: DType) -> GemmAr {
        let rs = GemmRs::for_world(ctx, dtype);
        GemmAr { gemm: rs.gemm, reduce: rs.reduce }
    }

    fn problem(&self, message: String) -> BackendError {
        BackendError::Problem { kernel: "gemm_ar".into(), message }
    }

    /// The reduction: GEMM-RS's over all `m` rows.
    fn reduction(&self) -> GemmRs {
        GemmRs { gemm: self.gemm, reduce: self.reduce }
    }

    /// Collective: buffers for an `m x n` result (GEMM-RS's, every rank keeping all `m` rows:
    /// `partial` two halves of `[world][m][n]`, `arrived` `[m / block_m][world]`).
    pub fn buffers(&self, ctx: &dyn RankCtx, m: usize, n: usize) -> Result<GemmRsBuffers, BackendError> {
        let w = ctx.world_size();
        if m == 0 || !m.is_multiple_of(16) {
            return Err(self.problem(format!("M = {m} rows: a positive multiple of 16 is needed")));
        }
        let block_m = (1u32 << m.trailing_zeros().min(31)).min(self.gemm.block_m);
        let es = self.gemm.dtype.size_bytes() as usize;
        require_i32(2 * w * m * n, "the partial products of every rank")?;
        Ok(GemmRsBuffers {
            partial: ctx.symm_alloc(crate::epoch::halves_bytes(w * m * n, es), "gemm_ar_partial")?,
            arrived: ctx.symm_alloc((m / block_m as usize) * w * 8, "gemm_ar_arrived")?,
            epochs: crate::epoch::words(ctx, 2, "gemm_ar_epochs")?,
            m,
            n,
            calls: 0,
            block_m,
        })
    }

    /// The GEMM whose epilogue pushes each tile to every rank.
    pub fn build_gemm(&self, block_m: u32) -> Result<Function, VerifyError> {
        let g = Gemm { block_m, ..self.gemm };
        let (bm, bn) = (g.block_m, g.block_n);
        let b = KernelBuilder::new(
            &format!("gemm_ar_gemm_{}_{bm}x{bn}x{}", g.dtype, g.block_k),
            LaunchAttrs { warps: g.warps, stages: g.stages, ..LaunchAttrs::default() },
        );
        let (a, bp, partials) = (b.arg_ptr("a", g.dtype), b.arg_ptr("b", g.dtype), b.arg_ptr("partial", g.dtype));
        let (arrived, epochs) = (b.arg_ptr("arrived", DType::U64), b.arg_ptr("epochs", DType::U64));
        let (m, n, k) = (b.arg("m", DType::I32), b.arg("n", DType::I32), b.arg("k", DType::I32));
        let call = crate::epoch::Epoch::begin(&b, epochs);
        let (me, world, pid) = (b.rank(), b.num_ranks(), b.program_id_x());
        let partial = call.half(partials, world * m * n);
        let tiles_n = (n + (bn as i32 - 1)) / bn as i32;
        let (block, tile_n) = crate::gemm::grouped_tile(pid, m / bm as i32, tiles_n);
        let rows = (block * bm as i32 + b.arange(0, bm as i64)).expand_dims(1);
        let cols = (tile_n * bn as i32 + b.arange(0, bn as i64)).expand_dims(0);
        let acc = g.tile_product(&b, (a, k), (bp, n), rows, cols, (m, n, k)).cast(g.dtype);
        let mask = rows.lt(m) & cols.lt(n);
        b.for_range(0, world, 1, &[], |i, _| {
            let p = (me + 1 + i) % world;
            b.store(b.symm_at(partial, p) + ((me * m + rows) * n + cols), acc, Some(mask));
            b.notify(arrived + (block * world + me), p, 1u64, SignalOp::Add, CommScope::IntraNode);
            vec![]
        });
        call.end(&b);
        b.finish()
    }

    /// `out` (`m x n`, on every rank) = `sum_p a_p @ b_p`; `a` is `m x k_r`, `b` `k_r x n`.
    /// Returns when every rank finished.
    pub fn run(
        &self,
        ctx: &dyn RankCtx,
        bufs: &mut GemmRsBuffers,
        (a, b): (&Buffer, &Buffer),
        out: &Buffer,
        k: usize,
    ) -> Result<(), BackendError> {
        self.enqueue(ctx, bufs, (a, b), out, k)?;
        ctx.synchronize()?;
        ctx.barrier()
    }

    /// Enqueues the next call (two kernel launches: it can be recorded).
    pub fn enqueue(
        &self,
        ctx: &dyn RankCtx,
        bufs: &mut GemmRsBuffers,
        (a, b): (&Buffer, &Buffer),
        out: &Buffer,
        k: usize,
    ) -> Result<(), BackendError> {
        let (m, n) = (bufs.m, bufs.n);
        let es = self.gemm.dtype.size_bytes() as usize;
        require_bytes(a, m * k * es, "a")?;
        require_bytes(b, k * n * es, "b")?;
        require_bytes(out, m * n * es, "out")?;
        let (m32, n32, k32) = (require_i32(m, "m")?, require_i32(n, "n")?, require_i32(k, "k")?);
        if n == 0 {
            return Ok(());
        }
        let bm = bufs.block_m;
        let tiles_n = cdiv(n, self.gemm.block_n as usize);
        let gemm = ctx.compile(&format!("{self:?}/gemm/{bm}"), &|| self.build_gemm(bm))?;
        let gemm_args = [
            a.arg(),
            b.arg(),
            bufs.partial.arg(),
            bufs.arrived.arg(),
            crate::epoch::state_arg(&bufs.epochs, 0),
            KernelArg::i32(m32),
            KernelArg::i32(n32),
            KernelArg::i32(k32),
        ];
        ctx.launch(0, &gemm, [((m / bm as usize) * tiles_n) as u32, 1, 1], &gemm_args)?;
        // The reduction over all M rows (GEMM-RS's with one "rank's rows" = M).
        self.reduction().enqueue_reduce(ctx, &format!("{self:?}"), bufs, out, m)?;
        bufs.calls += 1;
        Ok(())
    }
}

inventory::submit! {
    crate::Catalogued { name: "gemm_ar_gemm", operation: "gemm_ar", distributed: true, build: |d| GemmAr::new(d).build_gemm(64) }
}
