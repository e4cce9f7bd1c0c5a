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
//! **Split K.** At decode-sized M an output of `M x N` has few tiles (M = 32, N = 5120: 40 tiles
//! of 64 x 128) for a long K (25600), so the GEMM would run on a third of the GPU's
//! multiprocessors; [`GemmAr::for_problem`] splits K into `splits` slices of whole K tiles, so
//! that about two waves of programs fill the GPU, and each slice's partial product is sent like
//! a rank's: `partial` holds `[world][splits][M][N]`, a row block's counter gets `splits` per
//! column tile, and the reduction sums the `world x splits` partials in order (every rank the
//! same bits). Each slice's partial is rounded to the element type before the f32 sum, as a
//! rank's always was.
//!
//! Any M: the row block (the GEMM's row tile, and what a signal counts) is the largest power of
//! two dividing M rounded up to 16, at most the GEMM's own tile; the last row block's rows past
//! M are masked in the GEMM and in the reduction. Epochs on the device and call `e` in half
//! `e mod 2` of `partial` (`crate::epoch`): recorded once, a call replays.

use crate::gemm::Gemm;
use crate::gemm_rs::{GemmRs, GemmRsBuffers, ReduceTiles};
use crate::{cdiv, require_bytes, require_i32};
use trident_core::backend::{BackendError, Buffer, KernelArg};
use trident_core::ir::{Axis, CommScope, DType, LaunchAttrs, SignalOp};
use trident_core::world::RankCtx;
use trident_core::{Function, KernelBuilder, VerifyError};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmAr {
    pub gemm: Gemm,
    pub reduce: ReduceTiles,
    /// Slices of K, each a partial product of its own (1: none).
    pub splits: u32,
}

/// Programs the split GEMM aims for: two waves over the 132 multiprocessors of an H100 or
/// H200.
const TARGET_PROGRAMS: usize = 2 * 132;

/// The most slices of K: each one's partial crosses the links and is summed.
pub const MAX_SPLITS: usize = 8;

impl GemmAr {
    pub fn new(dtype: DType) -> GemmAr {
        let rs = GemmRs::new(dtype);
        GemmAr { gemm: rs.gemm, reduce: rs.reduce, splits: 1 }
    }

    /// GEMM-RS's choices for this rank's world ([`GemmRs::for_world`]): the GEMM's tiles of
    /// the target, the reduction persistent where ranks share the GPU; K not split.
    pub fn for_world(ctx: &dyn RankCtx, dtype: DType) -> GemmAr {
        let rs = GemmRs::for_world(ctx, dtype);
        GemmAr { gemm: rs.gemm, reduce: rs.reduce, splits: 1 }
    }

    /// For an `m x n x k` problem in this rank's world: the GEMM's tiles for M
    /// (`Gemm::for_problem`, pointer operands: its epilogue stores into other ranks' buffers),
    /// and K split into slices of whole K tiles until about [`TARGET_PROGRAMS`] programs run
    /// (at most [`MAX_SPLITS`], each slice at least 4 K tiles).
    pub fn for_problem(ctx: &dyn RankCtx, dtype: DType, mnk: (usize, usize, usize)) -> GemmAr {
        GemmAr::for_world(ctx, dtype).split_for(ctx.gpu_target(), mnk)
    }

    /// This op with the GEMM's tiles and the K slices of [`GemmAr::for_problem`] on `target`.
    pub fn split_for(self, target: Option<&trident_core::target::TargetDesc>, (m, n, k): (usize, usize, usize)) -> GemmAr {
        // One program per tile, no TMA store (the epilogue stores into other ranks' buffers).
        let gemm = Gemm::for_problem(self.gemm.dtype, target, m);
        let gemm = Gemm { tma_store: false, warp_specialize: false, persistent: false, ..gemm };
        let bm = row_block(m.max(1), gemm.block_m) as usize;
        let tiles = cdiv(m, bm).max(1) * cdiv(n, gemm.block_n as usize);
        let k_tiles = cdiv(k, gemm.block_k as usize);
        let want = TARGET_PROGRAMS.div_ceil(tiles).min(MAX_SPLITS).min((k_tiles / 4).max(1));
        let op = GemmAr { gemm, splits: 1, ..self };
        GemmAr { splits: op.slices(k, want.max(1) as u32), ..op }
    }

    /// Elements of K per slice for `splits` slices: whole K tiles.
    fn k_chunk(&self, k: usize, splits: u32) -> usize {
        let bk = self.gemm.block_k as usize;
        cdiv(cdiv(k.max(1), splits.max(1) as usize), bk) * bk
    }

    /// The slices `splits` asks for once each is whole K tiles (none empty).
    fn slices(&self, k: usize, splits: u32) -> u32 {
        cdiv(k.max(1), self.k_chunk(k, splits)) as u32
    }

    fn problem(&self, message: String) -> BackendError {
        BackendError::Problem { kernel: "gemm_ar".into(), message }
    }

    /// The reduction: GEMM-RS's over all `m` rows.
    fn reduction(&self) -> GemmRs {
        GemmRs { gemm: self.gemm, reduce: self.reduce }
    }

    /// Collective: buffers for an `m x n` result (GEMM-RS's, every rank keeping all `m` rows:
    /// `partial` two halves of `[world][splits][m][n]`, `arrived` `[m / block_m][world]`).
    pub fn buffers(&self, ctx: &dyn RankCtx, m: usize, n: usize) -> Result<GemmRsBuffers, BackendError> {
        let w = ctx.world_size();
        if m == 0 {
            return Err(self.problem("M = 0 rows: nothing to reduce".into()));
        }
        let block_m = row_block(m, self.gemm.block_m);
        let es = self.gemm.dtype.size_bytes() as usize;
        let s = self.splits.max(1) as usize;
        require_i32(2 * w * s * m * n, "the partial products of every rank")?;
        Ok(GemmRsBuffers {
            partial: ctx.symm_alloc(crate::epoch::halves_bytes(w * s * m * n, es), "gemm_ar_partial")?,
            arrived: ctx.symm_alloc(cdiv(m, block_m as usize) * w * 8, "gemm_ar_arrived")?,
            epochs: crate::epoch::words(ctx, 2, "gemm_ar_epochs")?,
            m,
            n,
            calls: 0,
            block_m,
            splits: s,
        })
    }

    /// The GEMM whose epilogue pushes each tile to every rank (with [`GemmAr::splits`] > 1,
    /// program `(t, s)` computes tile t over K slice s, of `k_chunk` elements, and sends it as
    /// partial `me x splits + s`).
    pub fn build_gemm(&self, block_m: u32) -> Result<Function, VerifyError> {
        let g = Gemm { block_m, ..self.gemm };
        let (bm, bn, splits) = (g.block_m, g.block_n, self.splits.max(1));
        let split = if splits > 1 { format!("_k{splits}") } else { String::new() };
        let b = KernelBuilder::new(
            &format!("gemm_ar_gemm_{}_{bm}x{bn}x{}{split}", g.dtype, g.block_k),
            LaunchAttrs { warps: g.warps, stages: g.stages, ..LaunchAttrs::default() },
        );
        // With `divisible` (`Gemm::specialized`): 16-byte facts, and A and B through
        // descriptors where the target has them (TMA copies on sm_90a), as GEMM-RS's GEMM.
        let ptr =
            |name: &str| if g.divisible { b.arg_ptr_aligned(name, g.dtype, 16) } else { b.arg_ptr(name, g.dtype) };
        let int =
            |name: &str| if g.divisible { b.arg_multiple_of(name, DType::I32, 16) } else { b.arg(name, DType::I32) };
        let (a, bp, partials) = (ptr("a"), ptr("b"), ptr("partial"));
        let (arrived, epochs) = (b.arg_ptr("arrived", DType::U64), b.arg_ptr("epochs", DType::U64));
        let (m, n, k) = (b.arg("m", DType::I32), int("n"), int("k"));
        // The K slice's length, whole K tiles (split only).
        let chunk = (splits > 1).then(|| b.arg_multiple_of("k_chunk", DType::I32, g.block_k));
        let call = crate::epoch::Epoch::begin(&b, epochs);
        let (me, world, pid) = (b.rank(), b.num_ranks(), b.program_id_x());
        let partial = match splits {
            1 => call.half(partials, world * m * n),
            s => call.half(partials, world * s as i32 * m * n),
        };
        let tiles_n = (n + (bn as i32 - 1)) / bn as i32;
        // Row tiles: `m / bm`, or one where M is a single row block below the tile (rows past M
        // masked, A's read as zeros).
        let (block, tile_n) = crate::gemm::grouped_tile(pid, (m + (bm as i32 - 1)) / bm as i32, tiles_n);
        let rows = (block * bm as i32 + b.arange(0, bm as i64)).expand_dims(1);
        let cols = (tile_n * bn as i32 + b.arange(0, bn as i64)).expand_dims(0);
        // This program's slice of K: `k0 .. k0 + len`.
        let (k0, len, source) = match chunk {
            None => (None, k, me),
            Some(c) => {
                let s = b.program_id(Axis::Y);
                let k0 = s * c;
                (Some(k0), c.min(k - k0), me * splits as i32 + s)
            }
        };
        let acc = if g.divisible && g.descriptors {
            // The whole A and B as descriptors (parameters: TMA copies), the K loop over the
            // slice.
            let one = b.constant(trident_core::ir::Literal::Int(1), DType::I32);
            let da = b.make_desc(a, [m, k], [k, one], [bm, g.block_k]);
            let db = b.make_desc(bp, [k, n], [n, one], [g.block_k, bn]);
            let at = (block * bm as i32, tile_n * bn as i32);
            match k0 {
                None => g.desc_product(&b, (da, db), at, k),
                Some(k0) => g.desc_product_over(&b, (da, db), at, (k0, k0 + len)),
            }
        } else {
            match k0 {
                None => g.tile_product(&b, (a, k), (bp, n), rows, cols, (m, n, k)),
                Some(k0) => g.tile_product(&b, (a + k0, k), (bp + k0 * n, n), rows, cols, (m, n, len)),
            }
        }
        .cast(g.dtype);
        let mask = rows.lt(m) & cols.lt(n);
        b.for_range(0, world, 1, &[], |i, _| {
            let p = (me + 1 + i) % world;
            b.store(b.symm_at(partial, p) + ((source * m + rows) * n + cols), acc, Some(mask));
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
        // The buffers say how many slices (made for this op's `splits`); the GEMM specialized
        // for its arguments' divisibility.
        let op = GemmAr { splits: bufs.splits as u32, gemm: self.gemm.specialized([a, b, &bufs.partial], n, k), ..*self };
        if op.splits > 1 && op.slices(k, op.splits) != op.splits {
            return Err(self.problem(format!(
                "K = {k} does not make {} slices of whole {}-element K tiles (make the buffers with GemmAr::for_problem for this K)",
                op.splits, self.gemm.block_k
            )));
        }
        // M a single row block below 64 rows (1 to 32): the GEMM's tile of 64 rows over it
        // (`wgmma`'s smallest; its one row block counted as M's), rows past M masked.
        let tile = if m <= bm as usize && bm < 64 && self.gemm.block_m >= 64 { 64 } else { bm };
        let gemm = ctx.compile(&format!("{op:?}/gemm/{tile}"), &|| op.build_gemm(tile))?;
        let mut gemm_args = vec![
            a.arg(),
            b.arg(),
            bufs.partial.arg(),
            bufs.arrived.arg(),
            crate::epoch::state_arg(&bufs.epochs, 0),
            KernelArg::i32(m32),
            KernelArg::i32(n32),
            KernelArg::i32(k32),
        ];
        if op.splits > 1 {
            gemm_args.push(KernelArg::i32(require_i32(op.k_chunk(k, op.splits), "the K slice")?));
        }
        let grid = [(cdiv(m, tile as usize) * tiles_n) as u32, op.splits, 1];
        ctx.launch(0, &gemm, grid, &gemm_args)?;
        // The reduction over all M rows (GEMM-RS's with one "rank's rows" = M).
        self.reduction().enqueue_reduce(ctx, &format!("{self:?}"), bufs, out, m)?;
        bufs.calls += 1;
        Ok(())
    }
}

/// The row block of an `m`-row GEMM + AllReduce: the largest power of two dividing `m` rounded
/// up to 16, at most `tile`.
fn row_block(m: usize, tile: u32) -> u32 {
    let padded = m.div_ceil(16) * 16;
    (1u32 << padded.trailing_zeros().min(31)).min(tile)
}

inventory::submit! {
    crate::Catalogued { name: "gemm_ar_gemm", operation: "gemm_ar", distributed: true, build: |d| GemmAr::new(d).build_gemm(64) }
}

#[cfg(test)]
mod tests {
    use super::GemmAr;
    use trident_core::ir::DType;

    /// Decode-sized M on the H100/H200 splits K until about two waves of programs run; a short
    /// K or a large M is not split; the conformance case's long K is split on the CPU too.
    #[test]
    fn k_is_split_where_the_tiles_are_few() {
        let h = trident_core::target::lookup("sm_90a").ok();
        let split = |mnk| GemmAr::new(DType::BF16).split_for(h, mnk).splits;
        assert_eq!(split((32, 5120, 25600)), 7);
        assert_eq!(split((128, 5120, 25600)), 4);
        assert_eq!(split((128, 8192, 3584)), 3);
        assert_eq!(split((4096, 8192, 8192)), 1);
        assert_eq!(split((32, 5120, 256)), 1);
        assert!(GemmAr::new(DType::F32).split_for(None, (32, 40, 1000)).splits > 1);
    }
}
