//! The schedule of a grouped GEMM's tiles, made on the device (no host synchronisation): which
//! group each row tile (M tile) belongs to, so the GEMM can walk its tiles with a plain
//! persistent loop `for t in range(pid, count x tiles_n, programs)` whose index math reads one
//! record per tile, which the lowering pipelines across tiles (a producer warp copying the next
//! tile's operands during this tile's epilogue: `core/src/simt/lower/persistent.rs`).
//!
//! One program, 128 groups at a time, over int32 tables in a scratch buffer:
//! * `tile_start[g]`: the number of the first row tile of group `g` (the prefix sum of every
//!   group's `ceil(rows / block_m)`, as a masked sum over a 128 x 128 triangle), and
//!   `tile_start[groups]`: the row tiles in all;
//! * `tile_group[mt]` for every row tile: its group, written by the group itself (a loop over
//!   the most row tiles any of the 128 groups has: stores only, no load waits).
//!
//! The scratch holds `groups + 1` then `capacity` int32 ([`schedule_words`]).

use crate::grouped_gemm::Layout;
use trident_core::ir::{DType, LaunchAttrs, ReduceOp};
use trident_core::{Function, KernelBuilder, VerifyError};

/// Groups (and row tiles) a step of the schedule handles at once.
const CHUNK: u32 = 128;

/// The most row tiles any routing can make: contiguous, every row in one group's tiles plus a
/// partial tile per group; masked, every group full.
pub fn capacity(layout: Layout, groups: usize, rows: usize, block_m: usize) -> usize {
    match layout {
        Layout::Contiguous => rows.div_ceil(block_m) + groups,
        Layout::Masked => groups * rows.div_ceil(block_m),
    }
}

/// The scratch's int32 words: `tile_start` (`groups + 1`), then `tile_group` (`capacity`).
pub fn schedule_words(groups: usize, capacity: usize) -> usize {
    groups + 1 + capacity
}

/// The most groups the schedule takes (each group's row tiles are a loop of its chunk).
pub const MAX_GROUPS: usize = 1 << 16;

/// The schedule kernel of row tiles of `block_m` rows for `layout` (see the module). Parameters:
/// `groups` (the GEMM's), `schedule` (the scratch), `groups_n`, `t_max` (the masked layout's
/// capacity per group), `capacity` (the scratch's `tile_group` words).
pub fn build(layout: Layout, block_m: u32) -> Result<Function, VerifyError> {
    let name = format!("grouped_gemm_schedule_{layout:?}_{block_m}").to_lowercase();
    let b = KernelBuilder::new(&name, LaunchAttrs { warps: 4, ..LaunchAttrs::default() });
    let groups = b.arg_ptr("groups", DType::I32);
    let schedule = b.arg_ptr("schedule", DType::I32);
    let groups_n = b.arg("groups_n", DType::I32);
    let t_max = b.arg("t_max", DType::I32);
    let capacity = b.arg("capacity", DType::I32);
    let bm = block_m as i32;
    let lanes = b.arange(0, CHUNK as i64);
    let tile_group = schedule + (groups_n + 1);
    // 128 groups at a time, carrying the row tiles so far: each group's first row tile (a
    // prefix sum), then each group writes its own row tiles' entries (no search, no load of
    // what this kernel wrote).
    let zero = b.constant(trident_core::ir::Literal::Int(0), DType::I32);
    let done = b.for_range(0, groups_n, CHUNK as i32, &[zero], |c, carried| {
        let g = c + lanes;
        let ok = g.lt(groups_n);
        let count = b.load_or(groups + g, ok, 0);
        let rows = match layout {
            Layout::Contiguous => count - b.load_or(groups + (g - 1), ok & g.gt(0), 0),
            Layout::Masked => count.min(t_max),
        };
        let tiles = ok.select((rows.max(0) + (bm - 1)) / bm, 0);
        // Inclusive prefix sum: row i of the triangle sums tiles 0..=i.
        let (i, j) = (lanes.expand_dims(1), lanes.expand_dims(0));
        let inclusive = j.le(i).select(tiles.expand_dims(0), 0).reduce(ReduceOp::Sum, 1);
        let first = carried[0] + inclusive - tiles;
        b.store(schedule + g, first, Some(ok));
        let most = tiles.reduce(ReduceOp::Max, 0);
        b.for_range(0, most, 1, &[], |t, _| {
            let at = first + t;
            b.store(tile_group + at, g, Some(ok & t.lt(tiles) & at.lt(capacity)));
            Vec::new()
        });
        vec![carried[0] + tiles.reduce(ReduceOp::Sum, 0)]
    });
    b.store(schedule + groups_n, done[0].min(capacity), None);
    b.finish()
}
