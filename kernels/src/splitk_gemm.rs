//! Split-K GEMM with atomic accumulation: exercises `while`, atomics and `if`.
//!
//! Program `(t, s)` computes output tile `t` over the K range of split `s` with a `while` loop,
//! adds its partial tile into an f32 workspace with relaxed `atomic add`s, meets at a `barrier`,
//! then increments the tile's arrival counter with `acq_rel`. The last of the `splits` programs to arrive (the one
//! that saw `splits - 1`) reads the workspace, writes the output tile in the element type, and
//! resets the workspace tile and the counter to zero, so the workspace stays ready for the next
//! call without a memset. Summation order across splits is not deterministic.
//!
//! With [`SplitKGemm::descriptors`] (targets with TMA and `wgmma`), A and B are read through
//! tensor descriptors in a `for` K loop that the lowering pipelines on a TMA ring, as the dense
//! GEMM's descriptor form: the split-K form of the Hopper GEMM, for small M, where the output
//! tiles alone (M = 256, N = 8192: 64 tiles of 128 x 256) leave most multiprocessors idle.
//!
//! With [`SplitReduction::Slots`] the splits meet without atomics on the partial sums: each
//! split stores its partial tile into its own slot of the workspace (`[splits, m, n]` f32, plain
//! stores from the accumulator registers), then counts its arrival; the last to arrive adds the
//! slots in split order and writes the output tile. The sum is then the same bits on every call
//! (the order no longer depends on which split arrives last), the workspace needs no clearing
//! (only the counter is reset), and the end of each split is a burst of plain stores rather than
//! one read-modify-write per element at the L2 (which cost the atomic form 8 us more than the
//! 64-program unsplit GEMM at M = 256 x 8192 x 8192 on an H100: DECISIONS, issue 28).

use crate::{cdiv, require_bytes, require_i32, DeviceCtx};
use trident_core::backend::{BackendError, Buffer, Device, KernelArg};
use trident_core::ir::{AtomicOp, DType, InputPrecision, LaunchAttrs, MemSemantic, Scope};
use trident_core::{Function, KernelBuilder, Tile, VerifyError};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SplitKGemm {
    pub dtype: DType,
    pub block_m: u32,
    pub block_n: u32,
    pub block_k: u32,
    pub splits: u32,
    pub warps: u32,
    pub stages: u32,
    /// A and B through tensor descriptors (TMA and `wgmma` on sm_90a); `run` keeps it only
    /// when A and B are 16-byte aligned and K and N whole 16-byte rows, else the pointer form.
    pub descriptors: bool,
    /// How the splits' partial tiles meet.
    pub reduction: SplitReduction,
    /// With descriptors on a target with TMA: a producer warp issues the copies while the
    /// `warps` run `wgmma` (`LaunchAttrs::warp_specialize`, as the dense GEMM's `_ws` forms).
    pub warp_specialize: bool,
}

/// How the partial tiles of a split-K GEMM's splits are summed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SplitReduction {
    /// Added into one f32 tile with relaxed atomics; the last split writes C and clears it.
    /// Summation order follows arrival.
    #[default]
    Atomic,
    /// Each split stores into its own f32 slot; the last split adds the slots in split order
    /// and writes C. Deterministic; a workspace of `splits` partial outputs.
    Slots,
}

/// The zero-initialised state a split-K GEMM needs between calls.
pub struct SplitKWorkspace {
    /// f32 partial sums, `[m, n]`.
    pub partial: Buffer,
    /// One i32 arrival counter per output tile.
    pub counters: Buffer,
}

impl SplitKWorkspace {
    /// Allocated and zeroed: `partials` f32 partial sums and the counters of `tiles` tiles.
    pub fn new(device: &dyn Device, partials: usize, tiles: usize) -> Result<SplitKWorkspace, BackendError> {
        let partial = device.alloc((partials * 4).max(4), "splitk_partial")?;
        let counters = device.alloc((tiles * 4).max(4), "splitk_counters")?;
        device.fill(&partial, &[0])?;
        device.fill(&counters, &[0])?;
        Ok(SplitKWorkspace { partial, counters })
    }

    /// A typed error unless it holds `partials` f32 partial sums and `tiles` counters.
    pub fn check(&self, partials: usize, tiles: usize) -> Result<(), BackendError> {
        require_bytes(&self.partial, partials * 4, "partial")?;
        require_bytes(&self.counters, tiles * 4, "counters")
    }
}

/// The end of a split program (`splits` per output tile `tile` of `bm` rows from `row0` and
/// columns `cols`): its partial tile `value` (f32) added into the workspace `ws` with relaxed
/// atomics, then the tile's arrival counted (acq_rel); the last to arrive writes the sums to
/// `c` in `out_type` and clears the workspace and the counter for the next call.
#[allow(clippy::too_many_arguments)]
pub fn split_epilogue<'b>(
    b: &'b KernelBuilder,
    (ws, counters): (Tile<'b>, Tile<'b>),
    c: Tile<'b>,
    (tile, splits): (Tile<'b>, u32),
    value: Tile<'b>,
    (row0, bm): (Tile<'b>, u32),
    cols: Tile<'b>,
    (m, n): (Tile<'b>, Tile<'b>),
    out_type: DType,
) {
    let rows = (row0 + b.arange(0, bm as i64)).expand_dims(1);
    let inside = rows.lt(m) & cols.lt(n);
    b.atomic(AtomicOp::Add, ws + (rows * n + cols), value, Some(inside), MemSemantic::Relaxed, Scope::Gpu);
    count_in(b, counters + tile, splits, || finish_tile(b, (ws, c), (row0, bm), cols, (m, n), out_type));
}

/// A split's arrival at its tile's counter `counter`, after its partial sums: a barrier (every
/// thread's writes before the release), the acq_rel increment, and for the last of `splits`
/// to arrive `last`, then the counter reset for the next call.
fn count_in<'b>(b: &'b KernelBuilder, counter: Tile<'b>, splits: u32, last: impl FnOnce()) {
    b.barrier();
    let arrived = b.atomic(AtomicOp::Add, counter, 1, None, MemSemantic::AcqRel, Scope::Gpu);
    b.if_then(arrived.eq(splits as i32 - 1), || {
        last();
        b.atomic(AtomicOp::Xchg, counter, 0, None, MemSemantic::Relaxed, Scope::Gpu);
    });
}

/// The end of a split program in the slot form ([`SplitReduction::Slots`]): split `split` of
/// `splits` stores its partial tile `value` (f32) into its own slot of `slots` (`[splits, m, n]`),
/// then counts the tile's arrival (acq_rel); the last to arrive adds the slots in split order,
/// writes the sums to `c` in `out_type` and resets the counter. The slots need no clearing: every
/// split overwrites its own on the next call before it counts itself in.
#[allow(clippy::too_many_arguments)]
pub fn slot_epilogue<'b>(
    b: &'b KernelBuilder,
    (slots, counters): (Tile<'b>, Tile<'b>),
    c: Tile<'b>,
    (tile, split, splits): (Tile<'b>, Tile<'b>, u32),
    value: Tile<'b>,
    (row0, bm): (Tile<'b>, u32),
    cols: Tile<'b>,
    (m, n): (Tile<'b>, Tile<'b>),
    out_type: DType,
) {
    let rows = (row0 + b.arange(0, bm as i64)).expand_dims(1);
    let inside = rows.lt(m) & cols.lt(n);
    b.store(slots + split * (m * n) + (rows * n + cols), value, Some(inside));
    count_in(b, counters + tile, splits, || {
        each_slice(b, (row0, bm), cols, (m, n), |offsets, inside| {
            let total = (1..splits).fold(b.load_or(slots + offsets, inside, 0.0), |sum, s| {
                sum + b.load_or(slots + (m * n) * s as i32 + offsets, inside, 0.0)
            });
            b.store(c + offsets, total.cast(out_type), Some(inside));
        });
    });
}

/// Rows of the output tile the last split finishes at a time: a slice's addresses and values
/// stay few in registers (the whole 128 x 128 tile at once took every register and spilled).
const FINISH_ROWS: u32 = 16;

/// The last split's work on the output tile of `bm` rows from `row0` and columns `cols`
/// (`[1, bn]`): the sums in the workspace `ws` (f32, `[m, n]`) to `c` in `out_type`, and the
/// workspace cleared for the next call; slice by slice of [`FINISH_ROWS`] rows.
pub fn finish_tile<'b>(
    b: &'b KernelBuilder,
    (ws, c): (Tile<'b>, Tile<'b>),
    (row0, bm): (Tile<'b>, u32),
    cols: Tile<'b>,
    (m, n): (Tile<'b>, Tile<'b>),
    out_type: DType,
) {
    each_slice(b, (row0, bm), cols, (m, n), |offsets, inside| {
        let total = b.load_or(ws + offsets, inside, 0.0);
        b.store(c + offsets, total.cast(out_type), Some(inside));
        b.store(ws + offsets, 0.0f32, Some(inside));
    });
}

/// The output tile of `bm` rows from `row0` and columns `cols`, [`FINISH_ROWS`] rows at a
/// time: `body` gets each slice's element offsets in the `[m, n]` output and its mask.
fn each_slice<'b>(
    b: &'b KernelBuilder,
    (row0, bm): (Tile<'b>, u32),
    cols: Tile<'b>,
    (m, n): (Tile<'b>, Tile<'b>),
    body: impl FnOnce(Tile<'b>, Tile<'b>),
) {
    let slice = FINISH_ROWS.min(bm);
    b.for_range(0, bm as i32, slice as i32, &[], |r, _| {
        let rs = (row0 + r + b.arange(0, slice as i64)).expand_dims(1);
        let inside = rs.lt(m) & cols.lt(n);
        body(rs * n + cols, inside);
        Vec::new()
    });
}

impl SplitKGemm {
    pub fn new(dtype: DType, splits: u32) -> SplitKGemm {
        SplitKGemm {
            dtype,
            block_m: 32,
            block_n: 32,
            block_k: 32,
            splits,
            warps: 4,
            stages: 2,
            descriptors: false,
            reduction: SplitReduction::Atomic,
            warp_specialize: false,
        }
    }

    /// The descriptor form on sm_90a-class targets: two warpgroups' 128 x 128 tiles, K steps
    /// of 64 over 4 stages; [`SplitKGemm::new`]'s elsewhere.
    pub fn for_target(dtype: DType, splits: u32, target: Option<&trident_core::target::TargetDesc>) -> SplitKGemm {
        let base = SplitKGemm::new(dtype, splits);
        match target.is_some_and(|t| t.has_tma_wgmma()) && dtype.size_bytes() == 2 {
            true => SplitKGemm { block_m: 128, block_n: 128, block_k: 64, warps: 8, stages: 4, descriptors: true, ..base },
            false => base,
        }
    }

    pub fn build(&self) -> Result<Function, VerifyError> {
        let (bm, bn, bk) = (self.block_m, self.block_n, self.block_k);
        let desc = if self.descriptors { "_desc" } else { "" };
        let ws = self.warp_specialize && self.descriptors;
        let slots = if self.reduction == SplitReduction::Slots { "_slots" } else { "" };
        let name = format!("splitk_gemm_{}_{bm}x{bn}x{bk}{desc}{}{slots}", self.dtype, if ws { "_ws" } else { "" });
        let attrs =
            LaunchAttrs { warps: self.warps, stages: self.stages, warp_specialize: ws, ..LaunchAttrs::default() };
        let b = KernelBuilder::new(&name, attrs);
        // The descriptor form's facts: A and B 16-byte aligned, K and N whole 16-byte rows.
        let ptr = |name: &str| match self.descriptors {
            true => b.arg_ptr_aligned(name, self.dtype, 16),
            false => b.arg_ptr(name, self.dtype),
        };
        let (a, bp, c) = (ptr("a"), ptr("b"), b.arg_ptr("c", self.dtype));
        let (ws, counters) = (b.arg_ptr("partial", DType::F32), b.arg_ptr("counters", DType::I32));
        let whole = |name: &str| match self.descriptors {
            true => b.arg_multiple_of(name, DType::I32, 16 / self.dtype.size_bytes()),
            false => b.arg(name, DType::I32),
        };
        let (m, n, k) = (b.arg("m", DType::I32), whole("n"), whole("k"));
        let k_per_split = b.arg("k_per_split", DType::I32);

        let (tile, split) = (b.program_id_x(), b.program_id(trident_core::ir::Axis::Y));
        let tiles_n = (n + (bn as i32 - 1)) / bn as i32;
        let rm = (tile / tiles_n) * bm as i32 + b.arange(0, bm as i64);
        let rn = (tile % tiles_n) * bn as i32 + b.arange(0, bn as i64);
        let rk = b.arange(0, bk as i64);
        let (rows, cols) = (rm.expand_dims(1), rn.expand_dims(0));
        let k_lo = split * k_per_split;
        let k_hi = (k_lo + k_per_split).min(k);

        let acc = b.zeros(&[bm, bn], DType::F32);
        let product = if self.descriptors {
            // Boxes of the split's K range (a multiple of the K step, so no box reaches into the
            // next split's; past K they read zeros), on a TMA ring with `wgmma` on sm_90a.
            let one = b.constant(trident_core::ir::Literal::Int(1), DType::I32);
            let da = b.make_desc(a, [m, k], [k, one], [bm, bk]);
            let db = b.make_desc(bp, [k, n], [n, one], [bk, bn]);
            let (row0, col0) = ((tile / tiles_n) * bm as i32, (tile % tiles_n) * bn as i32);
            let done = b.for_range(k_lo, k_hi, bk as i32, &[acc], |k0, carried: &[Tile]| {
                let (ta, tb) = (b.desc_load(da, [row0, k0]), b.desc_load(db, [k0, col0]));
                vec![b.dot(ta, tb, carried[0], InputPrecision::Ieee)]
            });
            done[0]
        } else {
            let done = b.while_loop(
                &[k_lo, acc],
                |c: &[Tile]| c[0].lt(k_hi),
                |c: &[Tile]| {
                    let kk = rk + c[0];
                    let ta =
                        b.load_or(a + rows * k + kk.expand_dims(0), rows.lt(m) & kk.expand_dims(0).lt(k_hi), 0.0);
                    let tb =
                        b.load_or(bp + kk.expand_dims(1) * n + cols, kk.expand_dims(1).lt(k_hi) & cols.lt(n), 0.0);
                    vec![c[0] + bk as i32, b.dot(ta, tb, c[1], InputPrecision::Ieee)]
                },
            );
            done[1]
        };
        let row0 = (tile / tiles_n) * bm as i32;
        match self.reduction {
            SplitReduction::Atomic => {
                split_epilogue(&b, (ws, counters), c, (tile, self.splits), product, (row0, bm), cols, (m, n), self.dtype)
            }
            SplitReduction::Slots => slot_epilogue(
                &b,
                (ws, counters),
                c,
                (tile, split, self.splits),
                product,
                (row0, bm),
                cols,
                (m, n),
                self.dtype,
            ),
        }
        b.finish()
    }

    fn tiles(&self, m: usize, n: usize) -> usize {
        cdiv(m, self.block_m as usize) * cdiv(n, self.block_n as usize)
    }

    /// The f32 partial sums of its workspace for an `m x n` output: one output, or one per split
    /// in the slot form.
    fn partials(&self, m: usize, n: usize) -> usize {
        match self.reduction {
            SplitReduction::Atomic => m * n,
            SplitReduction::Slots => self.splits as usize * m * n,
        }
    }

    /// Allocates and zeroes the workspace for `m x n` outputs.
    pub fn workspace(&self, device: &dyn Device, m: usize, n: usize) -> Result<SplitKWorkspace, BackendError> {
        SplitKWorkspace::new(device, self.partials(m, n), self.tiles(m, n))
    }

    /// `c[m, n] = a[m, k] @ b[k, n]` (contiguous row-major) using `ws` from [`Self::workspace`].
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        l: &DeviceCtx,
        a: &Buffer,
        b: &Buffer,
        c: &Buffer,
        ws: &SplitKWorkspace,
        (m, n, k): (usize, usize, usize),
    ) -> Result<(), BackendError> {
        if self.splits == 0 {
            return Err(BackendError::Host("split-K GEMM needs at least one split".into()));
        }
        let es = self.dtype.size_bytes() as usize;
        require_bytes(a, m * k * es, "a")?;
        require_bytes(b, k * n * es, "b")?;
        require_bytes(c, m * n * es, "c")?;
        ws.check(self.partials(m, n), self.tiles(m, n))?;
        let (m32, n32, k32) = (require_i32(m, "m")?, require_i32(n, "n")?, require_i32(k, "k")?);
        // The kernel's offsets into the workspace are 32-bit.
        require_i32(self.partials(m, n), "the split-K workspace's partial sums")?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        let per_split = cdiv(cdiv(k, self.splits as usize), self.block_k as usize) * self.block_k as usize;
        let whole = |x: usize| (x * es).is_multiple_of(16);
        let fits = a.address.is_multiple_of(16) && b.address.is_multiple_of(16) && whole(k) && whole(n) && k > 0;
        // The pointer form at the same tiles otherwise (the workspace's counters are per tile).
        let g = SplitKGemm { descriptors: self.descriptors && fits, ..*self };
        let kernel = l.compile(format!("{g:?}"), || g.build())?;
        let args = [
            a.arg(),
            b.arg(),
            c.arg(),
            ws.partial.arg(),
            ws.counters.arg(),
            KernelArg::i32(m32),
            KernelArg::i32(n32),
            KernelArg::i32(k32),
            KernelArg::i32(require_i32(per_split.max(self.block_k as usize), "k_per_split")?),
        ];
        l.launch(&kernel, [g.tiles(m, n) as u32, g.splits, 1], &args)
    }
}

inventory::submit! {
    crate::Catalogued { name: "splitk_gemm", operation: "splitk_gemm", distributed: false, build: |d| SplitKGemm::new(d, 4).build() }
}
