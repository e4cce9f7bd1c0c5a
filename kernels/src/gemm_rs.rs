//! GEMM-RS: rank r ends with rows chunk r of `sum_p A_p @ B_p`.
//!
//! `A_r` is `[M, K_r]`, `B_r` is `[K_r, N]` (K split over ranks). Each output tile of the partial
//! product belongs to the rank t that owns its rows; the GEMM's epilogue stores the tile into
//! `partial[r]` on rank t (`symm_at`) and adds 1 to `arrived[row block][r]` there (`notify`
//! carries the program barrier). Tiles for rank r+1 are computed first and rank r's own last. A
//! reduction kernel on rank t runs over smaller tiles ([`ReduceTiles`], 32 x 256 by default);
//! each waits until all W partials of its row block arrived (`epoch x column tiles` each) and
//! sums them in f32. Both kernels keep their epochs on the device and call e uses half e mod 2
//! of `partial` (`crate::epoch`): recorded once, a call replays.

use crate::gemm::Gemm;
use crate::{cdiv, require_bytes, require_i32};
use trident_core::backend::{BackendError, Buffer, KernelArg};
use trident_core::ir::{Axis, CmpOp, CommScope, DType, LaunchAttrs, MemSemantic, Scope, SignalOp};
use trident_core::world::RankCtx;
use trident_core::{Function, KernelBuilder, VerifyError};

/// The reduction's tiles: `rows` (fewer where the GEMM's row block is shorter) x `cols`, with
/// `warps` warps; persistent (programs walk the tiles, the grid capped at what the GPU holds)
/// where ranks share the GPU, since its programs wait; one program per tile otherwise.
///
/// The reduction's first form summed whole GEMM tiles (128 x 256) with 4 warps: 256 f32
/// accumulators per thread, 255 registers, 190 us for 8192 x 4096 bf16 at world 1 on the H200
/// (18% of memory throughput under Nsight Compute), a sixth of the GEMM's time; persistent over
/// 32 x 256 tiles with 4 warps: 141 registers, 123 us; the default (32 x 256, 8 warps, a program
/// per tile with a GPU per rank): 101 registers, 98 us (`results/h200-issue13/reduce-*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReduceTiles {
    pub rows: u32,
    pub cols: u32,
    pub warps: u32,
    pub persistent: bool,
}

impl Default for ReduceTiles {
    fn default() -> ReduceTiles {
        ReduceTiles { rows: 32, cols: 256, warps: 8, persistent: true }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmRs {
    pub gemm: Gemm,
    pub reduce: ReduceTiles,
}

/// Symmetric state for an `m x n` result (GEMM-RS's, and GEMM + AllReduce's:
/// [`crate::gemm_ar`], whose every rank keeps all `m` rows).
pub struct GemmRsBuffers {
    /// Two halves of `[world][rows kept per rank][n]` partial tiles, written by every rank
    /// (symmetric): `m / world` rows for GEMM-RS, `m` for GEMM + AllReduce.
    pub partial: Buffer,
    /// `[row blocks kept per rank][world]` u64 arrival counters (symmetric).
    pub arrived: Buffer,
    /// The GEMM's and the reduction's epoch words (`crate::epoch`).
    pub epochs: Buffer,
    pub m: usize,
    pub n: usize,
    /// Calls enqueued from this host.
    pub calls: u64,
    /// The GEMM's tile height: a power of two dividing the rows kept per rank, so no tile spans
    /// two owners.
    pub block_m: u32,
    /// Partial products each rank sends of every tile: 1, or GEMM + AllReduce's K splits (the
    /// partial buffer then holds `[world][splits][rows][n]`).
    pub splits: usize,
}

impl GemmRsBuffers {
    /// Collective: arrival counters and epochs back to zero on every rank (after a timed-out
    /// wait).
    pub fn rearm(&mut self, ctx: &dyn RankCtx) -> Result<(), BackendError> {
        self.calls = 0;
        crate::epoch::rearm(ctx, &[&self.arrived, &self.epochs])
    }
}

impl GemmRs {
    pub fn new(dtype: DType) -> GemmRs {
        GemmRs { gemm: Gemm::new(dtype), reduce: ReduceTiles::default() }
    }

    /// The GEMM tiles of `target` (`Gemm::for_target`), one program per tile, A and B through
    /// descriptors where the target has TMA and the arguments are divisible; the owner's tile
    /// through a pointer (its epilogue stores into another rank's buffer).
    pub fn for_target(dtype: DType, target: Option<&trident_core::target::TargetDesc>) -> GemmRs {
        GemmRs {
            gemm: Gemm { tma_store: false, ..Gemm::for_target(dtype, target).single_tile() },
            reduce: ReduceTiles::default(),
        }
    }

    /// [`GemmRs::for_target`] for this rank's world: the reduction persistent only where ranks
    /// share the GPU (its waiting programs must all be resident then).
    pub fn for_world(ctx: &dyn RankCtx, dtype: DType) -> GemmRs {
        let op = GemmRs::for_target(dtype, ctx.gpu_target());
        GemmRs { reduce: ReduceTiles { persistent: ctx.ranks_sharing_device() > 1, ..op.reduce }, ..op }
    }

    fn problem(&self, message: String) -> BackendError {
        BackendError::Problem { kernel: "gemm_rs".into(), message }
    }

    /// The GEMM's row tile for `rows` rows per rank: the largest power of two dividing them (at
    /// most the GEMM's own), so that tiles are whole; where that is below 16 rows (`wgmma`'s and
    /// the atoms' least), or short of the GEMM's tile while the shard is long (M = 28000 over 8
    /// ranks: 3500 rows, whose largest power-of-two divisor is 4), the GEMM's tile (or the
    /// power of two covering a shorter shard), its last tile per rank masked at the shard's
    /// end: a tile never spans two owners either way.
    pub fn row_block(&self, rows: usize) -> u32 {
        let tile = self.gemm.block_m.max(16);
        let exact = (1u32 << rows.max(1).trailing_zeros().min(31)).min(tile);
        if exact == tile || (exact >= 16 && rows < 4 * tile as usize) {
            exact
        } else {
            (rows.max(16).next_power_of_two().min(tile as usize)) as u32
        }
    }

    /// Collective: buffers for an `m x n` result; `m` must split evenly over the ranks.
    pub fn buffers(&self, ctx: &dyn RankCtx, m: usize, n: usize) -> Result<GemmRsBuffers, BackendError> {
        let w = ctx.world_size();
        if !m.is_multiple_of(w) || m == 0 {
            return Err(self.problem(format!("M = {m} rows cannot be split evenly over {w} ranks")));
        }
        let rows = m / w;
        let block_m = self.row_block(rows);
        let es = self.gemm.dtype.size_bytes() as usize;
        Ok(GemmRsBuffers {
            partial: ctx.symm_alloc(crate::epoch::halves_bytes(m * n, es), "gemm_rs_partial")?,
            arrived: ctx.symm_alloc(cdiv(rows, block_m as usize) * w * 8, "gemm_rs_arrived")?,
            epochs: crate::epoch::words(ctx, 2, "gemm_rs_epochs")?,
            m,
            n,
            calls: 0,
            block_m,
            splits: 1,
        })
    }

    /// This operation with its GEMM specialized for its arguments (`Gemm::specialized`).
    pub fn specialized(&self, ptrs: [&Buffer; 3], n: usize, k: usize) -> GemmRs {
        GemmRs { gemm: self.gemm.specialized(ptrs, n, k), ..*self }
    }

    fn gemm(&self, block_m: u32) -> Gemm {
        Gemm { block_m, ..self.gemm }
    }

    pub fn build_gemm(&self, block_m: u32) -> Result<Function, VerifyError> {
        let g = self.gemm(block_m);
        let (bm, bn) = (g.block_m, g.block_n);
        let b = KernelBuilder::new(
            &format!("gemm_rs_gemm_{}_{bm}x{bn}x{}", g.dtype, g.block_k),
            LaunchAttrs { warps: g.warps, stages: g.stages, ..LaunchAttrs::default() },
        );
        // With `divisible`, the facts that let the copies be 16-byte vectors without alignment
        // tests (as `Gemm::run` specializes the plain GEMM).
        let ptr =
            |name: &str| if g.divisible { b.arg_ptr_aligned(name, g.dtype, 16) } else { b.arg_ptr(name, g.dtype) };
        let int =
            |name: &str| if g.divisible { b.arg_multiple_of(name, DType::I32, 16) } else { b.arg(name, DType::I32) };
        let (a, bp, partials) = (ptr("a"), ptr("b"), ptr("partial"));
        let (arrived, epochs) = (b.arg_ptr("arrived", DType::U64), b.arg_ptr("epochs", DType::U64));
        let (m, n, k) = (b.arg("m", DType::I32), int("n"), int("k"));
        let rows_per_rank = b.arg("rows_per_rank", DType::I32);
        let call = crate::epoch::Epoch::begin(&b, epochs);
        let partial = call.half(partials, m * n);
        let (me, world, pid) = (b.rank(), b.num_ranks(), b.program_id_x());
        let tiles_n = (n + (bn as i32 - 1)) / bn as i32;
        // Row tiles per owner: the last one masked at the shard's end where `bm` does not
        // divide it (`GemmRs::row_block`).
        let blocks_per_rank = (rows_per_rank + (bm as i32 - 1)) / bm as i32;
        // Tiles in the grouped raster order ([`crate::gemm::grouped_tile`]) over the rows of
        // tiles in owner order; swizzle: tiles owned by rank r+1 first, this rank's own last.
        let (t, tile_n) = crate::gemm::grouped_tile(pid, world * blocks_per_rank, tiles_n);
        let owner = (me + 1 + t / blocks_per_rank) % world;
        let local_block = t % blocks_per_rank;
        let local_rows = (local_block * bm as i32 + b.arange(0, bm as i64)).expand_dims(1);
        let rows = local_rows + owner * rows_per_rank;
        let cols = (tile_n * bn as i32 + b.arange(0, bn as i64)).expand_dims(0);
        let acc = if g.divisible && g.descriptors {
            // A and B through descriptors (TMA copies on sm_90a); the tile still goes to the
            // owner's buffer through a pointer.
            let one = b.constant(trident_core::ir::Literal::Int(1), DType::I32);
            let da = b.make_desc(a, [m, k], [k, one], [bm, g.block_k]);
            let db = b.make_desc(bp, [k, n], [n, one], [g.block_k, bn]);
            let row0 = owner * rows_per_rank + local_block * bm as i32;
            g.desc_product(&b, (da, db), (row0, tile_n * bn as i32), k)
        } else {
            g.tile_product(&b, (a, k), (bp, n), rows, cols, (m, n, k))
        };
        let dst = b.symm_at(partial, owner) + ((me * rows_per_rank + local_rows) * n + cols);
        b.store(dst, acc.cast(g.dtype), Some(local_rows.lt(rows_per_rank) & cols.lt(n)));
        b.notify(arrived + (local_block * world + me), owner, 1u64, SignalOp::Add, CommScope::IntraNode);
        call.end(&b);
        b.finish()
    }

    /// The reduction: programs walk tiles of [`ReduceTiles`] (one each unless persistent); each
    /// waits until every rank's partial of its GEMM row block arrived, then sums the W partial
    /// tiles in f32.
    pub fn build_reduce(&self, block_m: u32) -> Result<Function, VerifyError> {
        self.build_reduce_of(block_m, 1)
    }

    /// [`GemmRs::build_reduce`] over `splits` partial products from each rank (GEMM + AllReduce's
    /// K splits): every row block's `world x splits` partials summed in order.
    pub fn build_reduce_of(&self, block_m: u32, splits: u32) -> Result<Function, VerifyError> {
        let dt = self.gemm.dtype;
        let r = self.reduce;
        let (rb, rn) = (r.rows.min(block_m), r.cols);
        let split = if splits > 1 { format!("_x{splits}") } else { String::new() };
        let b = KernelBuilder::new(
            &format!("gemm_rs_reduce_{dt}_{rb}x{rn}_of_{block_m}{split}{}", if r.persistent { "_persistent" } else { "" }),
            LaunchAttrs { warps: r.warps, persistent: r.persistent, ..LaunchAttrs::default() },
        );
        let (partials, arrived, out) =
            (b.arg_ptr("partial", dt), b.arg_ptr("arrived", DType::U64), b.arg_ptr("out", dt));
        let epochs = b.arg_ptr("epochs", DType::U64);
        let (n, rows_per_rank, per_call) =
            (b.arg("n", DType::I32), b.arg("rows_per_rank", DType::I32), b.arg("per_call", DType::U64));
        let call = crate::epoch::Epoch::begin(&b, epochs);
        let sources = if splits > 1 { b.num_ranks() * splits as i32 } else { b.num_ranks() };
        let (partial, target) = (call.half(partials, rows_per_rank * sources * n), call.times(per_call));
        let (world, pid, programs) = (b.num_ranks(), b.program_id_x(), b.num_programs(Axis::X));
        let tiles_n = (n + (rn as i32 - 1)) / rn as i32;
        // Row tiles of `rb` rows over `rows_per_rank` (GEMM-RS: a multiple of the GEMM's row
        // block, which `rb` divides; GEMM + AllReduce: any M, the last tile's rows past M masked).
        let tiles = ((rows_per_rank + (rb as i32 - 1)) / rb as i32) * tiles_n;
        b.for_range(pid, tiles, programs, &[], |t, _| {
            let sub = t / tiles_n;
            let block = sub / (block_m / rb) as i32;
            let tok = b.wait(arrived + block * world, world, CmpOp::Ge, target, Scope::Sys, MemSemantic::Acquire);
            let partial = partial.consume_token(tok);
            let rows = (sub * rb as i32 + b.arange(0, rb as i64)).expand_dims(1);
            let cols = ((t % tiles_n) * rn as i32 + b.arange(0, rn as i64)).expand_dims(0);
            let mask = rows.lt(rows_per_rank) & cols.lt(n);
            let acc = b.zeros(&[rb, rn], DType::F32);
            // (The same IR as before splits existed where there are none.)
            let count = if splits > 1 { sources } else { world };
            let sum = b.for_range(0, count, 1, &[acc], |src, c| {
                let tile = b.load_or(partial + ((src * rows_per_rank + rows) * n + cols), mask, 0.0);
                vec![c[0] + tile.cast(DType::F32)]
            })[0];
            b.store(out + rows * n + cols, sum.cast(dt), Some(mask));
            Vec::new()
        });
        call.end(&b);
        b.finish()
    }

    /// Programs of the reduction for `rows` rows per rank of `n` columns (before the runtime
    /// caps a persistent grid at what the GPU holds).
    fn reduce_grid(&self, rows: usize, n: usize, block_m: u32) -> u32 {
        let rb = self.reduce.rows.min(block_m) as usize;
        (cdiv(rows, rb) * cdiv(n, self.reduce.cols as usize)).max(1) as u32
    }

    /// Enqueues the reduction of `rows` rows per rank into `out` (after the GEMM whose every
    /// call adds one to a row block's counter per column tile); GEMM + AllReduce's too, with
    /// `rows` = M. `key` names the compiled specialization's owner.
    pub(crate) fn enqueue_reduce(
        &self,
        ctx: &dyn RankCtx,
        key: &str,
        bufs: &GemmRsBuffers,
        out: &Buffer,
        rows: usize,
    ) -> Result<(), BackendError> {
        let (n, bm) = (bufs.n, bufs.block_m);
        let splits = bufs.splits as u32;
        let reduce = ctx.compile(&format!("{key}/reduce/{bm}/{splits}"), &|| self.build_reduce_of(bm, splits))?;
        let reduce_args = [
            bufs.partial.arg(),
            bufs.arrived.arg(),
            out.arg(),
            crate::epoch::state_arg(&bufs.epochs, 1),
            KernelArg::i32(require_i32(n, "n")?),
            KernelArg::i32(require_i32(rows, "rows_per_rank")?),
            KernelArg::u64((cdiv(n, self.gemm.block_n as usize) * bufs.splits) as u64),
        ];
        ctx.launch(0, &reduce, [self.reduce_grid(rows, n, bm), 1, 1], &reduce_args)
    }

    /// `out` (`m/W x n`, this rank's rows) = rows of `sum_p a_p @ b_p`; `a` is `m x k_r`, `b`
    /// `k_r x n`. Returns when every rank finished.
    pub fn run(
        &self,
        ctx: &dyn RankCtx,
        bufs: &mut GemmRsBuffers,
        a: &Buffer,
        b: &Buffer,
        out: &Buffer,
        k: usize,
    ) -> Result<(), BackendError> {
        self.enqueue(ctx, bufs, a, b, out, k)?;
        ctx.synchronize()?;
        ctx.barrier()
    }

    /// Enqueues the next call (two kernel launches: it can be recorded).
    pub fn enqueue(
        &self,
        ctx: &dyn RankCtx,
        bufs: &mut GemmRsBuffers,
        a: &Buffer,
        b: &Buffer,
        out: &Buffer,
        k: usize,
    ) -> Result<(), BackendError> {
        let (m, n, w) = (bufs.m, bufs.n, ctx.world_size());
        let es = self.gemm.dtype.size_bytes() as usize;
        require_bytes(a, m * k * es, "a")?;
        require_bytes(b, k * n * es, "b")?;
        require_bytes(out, (m / w) * n * es, "out")?;
        let (m32, n32, k32) = (require_i32(m, "m")?, require_i32(n, "n")?, require_i32(k, "k")?);
        if n == 0 {
            return Ok(());
        }
        let bm = bufs.block_m;
        let tiles_n = cdiv(n, self.gemm.block_n as usize);
        let rows = require_i32(m / w, "rows_per_rank")?;
        let spec = self.specialized([a, b, &bufs.partial], n, k);
        let gemm = ctx.compile(&format!("{spec:?}/gemm/{bm}"), &|| spec.build_gemm(bm))?;
        let gemm_args = [
            a.arg(),
            b.arg(),
            bufs.partial.arg(),
            bufs.arrived.arg(),
            crate::epoch::state_arg(&bufs.epochs, 0),
            KernelArg::i32(m32),
            KernelArg::i32(n32),
            KernelArg::i32(k32),
            KernelArg::i32(rows),
        ];
        ctx.launch(0, &gemm, [(w * cdiv(m / w, bm as usize) * tiles_n) as u32, 1, 1], &gemm_args)?;
        self.enqueue_reduce(ctx, &format!("{self:?}"), bufs, out, m / w)?;
        bufs.calls += 1;
        Ok(())
    }
}

inventory::submit! {
    crate::Catalogued { name: "gemm_rs_gemm", operation: "gemm_rs", distributed: true, build: |d| GemmRs::new(d).build_gemm(64) }
}

inventory::submit! {
    crate::Catalogued { name: "gemm_rs_reduce", operation: "gemm_rs", distributed: true, build: |d| GemmRs::new(d).build_reduce(64) }
}

#[cfg(test)]
mod tests {
    use super::GemmRs;
    use trident_core::ir::DType;

    /// Shards that the GEMM's tile or a power of two of at least 16 divides keep whole tiles;
    /// others (and long shards whose largest power-of-two divisor is a small tile) take the
    /// GEMM's tile, or the power of two covering a short shard, masked at the shard's end.
    #[test]
    fn row_tiles_are_whole_or_masked_never_below_16() {
        let op = GemmRs::for_target(DType::BF16, trident_core::target::lookup("sm_90a").ok());
        let tile = op.gemm.block_m;
        assert_eq!(tile, 128);
        let rb = |rows| op.row_block(rows);
        assert_eq!(rb(1024), 128);
        assert_eq!(rb(48), 16);
        assert_eq!(rb(64), 64);
        assert_eq!(rb(3500), 128, "M 28000 over 8 ranks");
        assert_eq!(rb(14000), 128, "M 28000 over 2 ranks: 16-row tiles would be slow");
        assert_eq!(rb(24), 32);
        assert_eq!(rb(7), 16);
        for rows in 1..2000 {
            let b = rb(rows);
            assert!(b.is_power_of_two() && (16..=tile).contains(&b), "{rows}: {b}");
        }
    }
}
