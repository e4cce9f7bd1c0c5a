//! FP8 GEMMs with scales, as FP8 models are served: `C = (A * sa) @ (B * sb)^T`, A `[M, K]` and
//! B `[N, K]` in FP8 (both K-major, the layout FP8 tensor cores read), C bf16, the products
//! accumulated in f32.
//!
//! Three scalings (`KERNELS.md`):
//! * [`Scaling::Tensor`]: one f32 scale for A and one for B.
//! * [`Scaling::Row`]: one per row of A (`[M]`) and one per row of B (`[N]`), as
//!   `torch._scaled_mm`'s row-wise mode; applied once, in the epilogue.
//! * [`Scaling::Block`]: DeepSeek-V3's: A has one per row per 128 of K (`[M, ceil(K/128)]`), B
//!   one per 128 x 128 block (`[ceil(N/128), ceil(K/128)]`); each 128 of K is multiplied into
//!   a fresh f32 partial and added to the accumulator with its two scales (the promotion the
//!   tensor cores' limited FP8 accumulation needs).
//!
//! Two forms:
//! * the portable one: pointer loads with edge masks; its `dot` runs on every backend (on GPUs
//!   on the f16 matrix atoms, FP8 operands converted up in registers);
//! * with [`ScaledGemm::descriptors`] (where the target has TMA and `wgmma`:
//!   [`ScaledGemm::for_target`]): A and B read as `[M, K]` and `[N, K]` blocks through tensor
//!   descriptors, B transposed into the `dot`, which the lowering pipelines as TMA copies into
//!   K-major stages read by `wgmma ... .e4m3` (`.e5m2`) with no conversion; block scales
//!   promote each K block's fresh partial into the f32 accumulator as it is added. Used when
//!   [`ScaledGemm::specialized`] finds the operands 16-byte aligned and K a multiple of 16.

use crate::splitk_gemm::{split_epilogue, SplitKWorkspace};
use crate::{cdiv, require_bytes, require_i32, DeviceCtx};
use trident_core::backend::{BackendError, Buffer, KernelArg};
use trident_core::ir::{DType, InputPrecision, LaunchAttrs};
use trident_core::{Function, KernelBuilder, Tile, VerifyError};

/// The elements of K (and of N, for B's block scales) one scale covers in [`Scaling::Block`].
pub const SCALE_BLOCK: u32 = 128;

/// A launch's grid and arguments.
pub type Launch = ([u32; 3], Vec<KernelArg>);

/// How the scales apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scaling {
    Tensor,
    Row,
    Block,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ScaledGemm {
    /// `f8e4m3fn` or `f8e5m2` (A and B alike).
    pub dtype: DType,
    pub scaling: Scaling,
    pub block_m: u32,
    /// Divides [`SCALE_BLOCK`] (a tile never straddles two of B's scale blocks).
    pub block_n: u32,
    /// The K step; always [`SCALE_BLOCK`] in the block-scaled form (one scale per step).
    pub block_k: u32,
    pub warps: u32,
    /// Pipeline stages of the descriptor form.
    pub stages: u32,
    /// The descriptor form where [`ScaledGemm::specialized`] allows it.
    pub descriptors: bool,
    /// With descriptors: a producer warp issues the TMA copies (`LaunchAttrs::warp_specialize`;
    /// tensor and row scaling: the lowering keeps a promotion in the consumers' loop).
    pub warp_specialize: bool,
    /// With descriptors: one program per multiprocessor walking the tiles, the next tile's
    /// copies during this one's epilogue (`LaunchAttrs::persistent`; tensor and row scaling).
    pub persistent: bool,
    /// With descriptors, tensor and row scaling: each K step's product made in a fresh
    /// accumulator and added in f32 (as the block-scaled form does, and as `torch._scaled_mm`
    /// does without `use_fast_accum`), instead of accumulating the whole K in the tensor
    /// cores, whose FP8 accumulation keeps about 14 bits. Neither producer warp nor persistent
    /// loop then.
    pub promote: bool,
    /// Set by [`ScaledGemm::specialized`]: the operands are 16-byte aligned and K a multiple of
    /// 16 (a tensor map's row stride is whole 16-byte chunks).
    pub divisible: bool,
    /// With descriptors: C written by a TMA store of each tile (the accumulator through a
    /// swizzled shared tile; the bf16 GEMM's fastest epilogue on the H200). Kept by
    /// [`ScaledGemm::specialized`] only when C is 16-byte aligned and N a multiple of 8.
    pub tma_store: bool,
    /// Split-K (tensor and row scaling): `splits` programs per output tile, each over its
    /// share of the K blocks, adding its scaled partial tile into an f32 workspace; the last
    /// to arrive writes C and clears the workspace (`crate::splitk_gemm`'s protocol; the sum's
    /// order across splits is not deterministic). For small M, whose tiles alone leave SMs
    /// idle (M = 128: 56 tiles of 128 x 128 on 132 SMs). 1: none. Without a producer warp,
    /// persistent loop or TMA store.
    pub splits: u32,
    /// Consumer ping-pong (`LaunchAttrs::pingpong`, with the producer warp and the persistent
    /// loop): two groups of `warps` consumer warps take the tiles in turn (128 x 128 on 4 warps).
    pub pingpong: bool,
}

impl ScaledGemm {
    pub fn new(dtype: DType, scaling: Scaling) -> ScaledGemm {
        ScaledGemm {
            dtype,
            scaling,
            block_m: 32,
            block_n: 64,
            block_k: SCALE_BLOCK,
            warps: 4,
            stages: 1,
            descriptors: false,
            warp_specialize: false,
            persistent: false,
            promote: false,
            divisible: false,
            tma_store: false,
            splits: 1,
            pingpong: false,
        }
    }

    /// Whether the launch splits K (see [`ScaledGemm::splits`]).
    fn split(&self) -> bool {
        self.splits > 1 && self.scaling != Scaling::Block
    }

    /// The zeroed workspace of a split-K launch for an `m x n` output.
    pub fn workspace(
        &self,
        device: &dyn trident_core::backend::Device,
        m: usize,
        n: usize,
    ) -> Result<SplitKWorkspace, BackendError> {
        SplitKWorkspace::new(device, m * n, self.tiles(m, n))
    }

    /// Output tiles of an `m x n` output (the grid's x).
    fn tiles(&self, m: usize, n: usize) -> usize {
        cdiv(m, self.block_m as usize) * cdiv(n, self.block_n as usize)
    }

    /// The meta-parameters for `target`: on targets with TMA and `wgmma` (sm_90a) the
    /// descriptor form, two warpgroups on 128 x 128 tiles with K steps of 128 (one 128-byte
    /// swizzle row of FP8) over 4 stages, for tensor and row scaling with a producer warp and
    /// persistent (as the bf16 GEMM's fastest form on the H200); everything else the portable
    /// form.
    pub fn for_target(
        dtype: DType,
        scaling: Scaling,
        target: Option<&trident_core::target::TargetDesc>,
    ) -> ScaledGemm {
        let base = ScaledGemm::new(dtype, scaling);
        let fast = target.is_some_and(|t| t.has_tma_wgmma());
        if fast {
            let overlapped = scaling != Scaling::Block;
            ScaledGemm {
                block_m: 128,
                block_n: 128,
                block_k: 128,
                warps: 8,
                stages: 4,
                descriptors: true,
                warp_specialize: overlapped,
                persistent: overlapped,
                tma_store: true,
                ..base
            }
        } else {
            base
        }
    }

    /// This GEMM as consumer ping-pong runs it (`ScaledGemm::pingpong`): 128 x 128 tiles on two
    /// groups of 4 consumer warps over 4 stages (K steps as set), with the producer warp and the
    /// persistent loop.
    pub fn with_pingpong(self) -> ScaledGemm {
        ScaledGemm {
            block_m: 128,
            block_n: 128,
            warps: 4,
            stages: 4,
            warp_specialize: true,
            persistent: true,
            pingpong: true,
            ..self
        }
    }

    /// [`ScaledGemm::for_target`] for a problem of `m` rows, with each K block's product added
    /// in f32 when `promote`: tensor and row scaling without the promotion (whose second
    /// accumulator does not fit beside a wide one) above 256 rows on 128 x 256 tiles (on an
    /// H100, `results/h100-issue27/c0bce89`: 0.111 against 0.116 ms at 4096^3 and 0.848
    /// against 1.031 ms at 8192^3 for tensor scaling, 0.114 against 0.125 and 0.845 against
    /// 1.041 for row scaling) over 4 stages (`results/h100-session41/7175555/i27`, row
    /// scaling: 0.102 against 0.111 ms over 3 at 4096^3, 0.732 against 0.780 at 8192^3, where
    /// `torch._scaled_mm` took 0.102 and 0.826), 128 x 128 below (0.036 against 0.052 ms at
    /// M = 128, N = K = 7168).
    pub fn for_problem(
        dtype: DType,
        scaling: Scaling,
        target: Option<&trident_core::target::TargetDesc>,
        m: usize,
        promote: bool,
    ) -> ScaledGemm {
        let g = ScaledGemm { promote, ..ScaledGemm::for_target(dtype, scaling, target) };
        match g.descriptors && scaling != Scaling::Block && !promote && m > 256 {
            true => ScaledGemm { block_n: 256, stages: 4, ..g },
            false => g,
        }
    }

    /// This GEMM specialized for its operands: the descriptor form (where chosen) only when A
    /// and B are 16-byte aligned and K is a positive multiple of 16, else the portable form at
    /// its own meta-parameters.
    pub fn specialized(self, a: &Buffer, b: &Buffer, c: &Buffer, n: usize, k: usize) -> ScaledGemm {
        let aligned = a.address.is_multiple_of(16) && b.address.is_multiple_of(16);
        let store = self.tma_store && c.address.is_multiple_of(16) && n.is_multiple_of(8);
        match self.descriptors && aligned && k.is_multiple_of(16) && k > 0 {
            true => ScaledGemm { divisible: true, tma_store: store, ..self },
            false if self.descriptors => ScaledGemm { splits: self.splits, ..ScaledGemm::new(self.dtype, self.scaling) },
            false => self,
        }
    }

    /// Whether the descriptor form runs with a producer warp and persistent, as built: a K loop
    /// with a promotion (promoted or block-scaled) runs one program per tile without a producer
    /// warp, whatever the fields say (the lowering keeps a promotion on `wgmma` in a plain K
    /// loop only). The promoted forms took `for_target`'s persistent loop before, whose stage
    /// ring then shared its bytes with the TMA store's staging tile across tiles (wrong values
    /// on cpu-simt).
    pub fn overlapped(&self) -> (bool, bool) {
        let plain_loop = self.promote || self.scaling == Scaling::Block || self.split();
        (self.warp_specialize && !plain_loop, self.persistent && !plain_loop)
    }

    fn uses_descriptors(&self) -> bool {
        self.descriptors && self.divisible
    }

    fn problem(&self, message: String) -> BackendError {
        BackendError::Problem { kernel: "scaled_gemm".into(), message }
    }

    /// The scale elements A and B need for `m x n x k`.
    pub fn scale_lens(&self, m: usize, n: usize, k: usize) -> (usize, usize) {
        let kb = cdiv(k, SCALE_BLOCK as usize);
        match self.scaling {
            Scaling::Tensor => (1, 1),
            Scaling::Row => (m, n),
            Scaling::Block => (m * kb, cdiv(n, SCALE_BLOCK as usize) * kb),
        }
    }

    pub fn build(&self) -> Result<Function, VerifyError> {
        if self.uses_descriptors() {
            return self.build_descriptors();
        }
        let (bm, bn, bk) = (self.block_m, self.block_n, SCALE_BLOCK);
        let split = if self.split() { "_split" } else { "" };
        let name = format!("scaled_gemm_{}_{:?}_{bm}x{bn}{split}", self.dtype, self.scaling).to_lowercase();
        let b = KernelBuilder::new(&name, LaunchAttrs { warps: self.warps, ..LaunchAttrs::default() });
        let (a, bp) = (b.arg_ptr("a", self.dtype), b.arg_ptr("b", self.dtype));
        let c = b.arg_ptr("c", DType::BF16);
        let (sa, sb) = (b.arg_ptr("scale_a", DType::F32), b.arg_ptr("scale_b", DType::F32));
        let workspace = self.split().then(|| (b.arg_ptr("partial", DType::F32), b.arg_ptr("counters", DType::I32)));
        let (m, n, k) = (b.arg("m", DType::I32), b.arg("n", DType::I32), b.arg("k", DType::I32));

        let tile = b.program_id_x();
        let tiles_n = (n + (bn as i32 - 1)) / bn as i32;
        let (tm, tn) = (tile / tiles_n, tile % tiles_n);
        let rm = tm * bm as i32 + b.arange(0, bm as i64);
        let rn = tn * bn as i32 + b.arange(0, bn as i64);
        let (rows, cols) = (rm.expand_dims(1), rn.expand_dims(0));
        let k_blocks = (k + (bk as i32 - 1)) / bk as i32;
        let (kb_lo, kb_hi) = self.k_range(&b, k_blocks);
        let acc = b.zeros(&[bm, bn], DType::F32);
        let done = b.for_range(kb_lo, kb_hi, 1, &[acc], |kb, carried| {
            let kk = kb * bk as i32 + b.arange(0, bk as i64);
            let ta = b.load_or(a + rows * k + kk.expand_dims(0), rows.lt(m) & kk.expand_dims(0).lt(k), 0.0);
            let tb = b.load_or(bp + cols * k + kk.expand_dims(1), kk.expand_dims(1).lt(k) & cols.lt(n), 0.0);
            match self.scaling {
                Scaling::Block => {
                    let part = b.dot(ta, tb, b.zeros(&[bm, bn], DType::F32), InputPrecision::Ieee);
                    let s_a = b.load_or(sa + rm * k_blocks + kb, rm.lt(m), 0.0).expand_dims(1);
                    let s_b = b.load(sb + ((tn * bn as i32) / bk as i32) * k_blocks + kb, None, None);
                    vec![carried[0] + part * (s_a * s_b)]
                }
                Scaling::Tensor | Scaling::Row => vec![b.dot(ta, tb, carried[0], InputPrecision::Ieee)],
            }
        });
        let out = match self.scaling {
            Scaling::Block => done[0],
            Scaling::Row => {
                let s_a = b.load_or(sa + rm, rm.lt(m), 0.0).expand_dims(1);
                let s_b = b.load_or(sb + rn, rn.lt(n), 0.0).expand_dims(0);
                done[0] * s_a * s_b
            }
            Scaling::Tensor => done[0] * (b.load(sa, None, None) * b.load(sb, None, None)),
        };
        match workspace {
            Some(ws) => split_epilogue(&b, ws, c, (tile, self.splits), out, (tm * bm as i32, bm), cols, (m, n), DType::BF16),
            None => b.store(c + rows * n + cols, out.cast(DType::BF16), Some(rows.lt(m) & cols.lt(n))),
        }
        b.finish()
    }

    /// The K blocks of this program's split (all of them without split-K): an equal share of
    /// `k_blocks` by `program_id(y)`.
    fn k_range<'b>(&self, b: &'b KernelBuilder, k_blocks: Tile<'b>) -> (Tile<'b>, Tile<'b>) {
        let zero = b.constant(trident_core::ir::Literal::Int(0), DType::I32);
        if !self.split() {
            return (zero, k_blocks);
        }
        let share = (k_blocks + (self.splits as i32 - 1)) / self.splits as i32;
        let lo = b.program_id(trident_core::ir::Axis::Y) * share;
        (lo, (lo + share).min(k_blocks))
    }

    /// The descriptor form: the K loop is a `dot` of A's `[bm, bk]` block and the transpose of
    /// B's `[bn, bk]` block, both read through tensor descriptors (zeros outside the tensors,
    /// so no masks); tensor and row scales are applied in the epilogue, block scales to each
    /// K block's fresh partial as it is added (which the lowering keeps on `wgmma`: a
    /// promotion).
    fn build_descriptors(&self) -> Result<Function, VerifyError> {
        // One K step per scale block in the block-scaled form.
        let bk = if self.scaling == Scaling::Block { SCALE_BLOCK } else { self.block_k };
        let (bm, bn) = (self.block_m, self.block_n);
        let promoted = self.promote && self.scaling != Scaling::Block;
        let (warp_specialize, persistent) = self.overlapped();
        let form = match (promoted, warp_specialize, persistent) {
            (true, _, _) => "_promoted",
            (_, true, true) => "_ws_persistent",
            (_, true, false) => "_ws",
            (_, false, true) => "_persistent",
            _ => "",
        };
        let split = self.split();
        let tma_store = self.tma_store && !split;
        let store = if tma_store { "_store" } else { "" };
        let split_name = if split { "_split" } else { "" };
        let pingpong = self.pingpong && warp_specialize && persistent;
        let pp = if pingpong { "_pingpong" } else { "" };
        let name =
            format!("scaled_gemm_{}_{:?}_{bm}x{bn}x{bk}_desc{form}{store}{split_name}{pp}", self.dtype, self.scaling)
                .to_lowercase();
        let attrs = LaunchAttrs {
            warps: self.warps,
            stages: self.stages,
            warp_specialize,
            persistent,
            pingpong,
            ..LaunchAttrs::default()
        };
        let b = KernelBuilder::new(&name, attrs);
        let (a, bp) = (b.arg_ptr_aligned("a", self.dtype, 16), b.arg_ptr_aligned("b", self.dtype, 16));
        // With the TMA store, C's facts: 16-byte aligned, rows of whole 16-byte chunks.
        let c = match tma_store {
            true => b.arg_ptr_aligned("c", DType::BF16, 16),
            false => b.arg_ptr("c", DType::BF16),
        };
        let (sa, sb) = (b.arg_ptr("scale_a", DType::F32), b.arg_ptr("scale_b", DType::F32));
        let workspace = split.then(|| (b.arg_ptr("partial", DType::F32), b.arg_ptr("counters", DType::I32)));
        let m = b.arg("m", DType::I32);
        let n = match tma_store {
            true => b.arg_multiple_of("n", DType::I32, 8),
            false => b.arg("n", DType::I32),
        };
        let k = b.arg_multiple_of("k", DType::I32, 16);
        let one = b.constant(trident_core::ir::Literal::Int(1), DType::I32);
        let da = b.make_desc(a, [m, k], [k, one], [bm, bk]);
        let db = b.make_desc(bp, [n, k], [k, one], [bn, bk]);
        let dc = tma_store.then(|| b.make_desc(c, [m, n], [n, one], [bm, bn]));

        let tiles_n = (n + (bn as i32 - 1)) / bn as i32;
        let tiles_m = (m + (bm as i32 - 1)) / bm as i32;
        let tiles = tiles_m * tiles_n;
        let k_blocks = (k + (bk as i32 - 1)) / bk as i32;
        let one_tile = |tile: Tile| {
            // The bf16 GEMM's grouped raster order: the programs running together share A's rows
            // and B's columns in L2 (row by row, each row of tiles streams all of B again: 64 MB
            // at 8192^3, more than L2).
            let (tm, tn) = crate::gemm::grouped_tile(tile, tiles_m, tiles_n);
            let (row0, col0) = (tm * bm as i32, tn * bn as i32);
            let rm = row0 + b.arange(0, bm as i64);
            let rn = col0 + b.arange(0, bn as i64);
            let (rows, cols) = (rm.expand_dims(1), rn.expand_dims(0));
            let acc = b.zeros(&[bm, bn], DType::F32);
            let (kb_lo, kb_hi) = self.k_range(&b, k_blocks);
            let done = b.for_range(kb_lo, kb_hi, 1, &[acc], |kb, carried| {
                let k0 = kb * bk as i32;
                let (ta, tb) = (b.desc_load(da, [row0, k0]), b.desc_load(db, [col0, k0]));
                if self.scaling == Scaling::Block {
                    let part = b.dot(ta, tb.t(), b.zeros(&[bm, bn], DType::F32), InputPrecision::Ieee);
                    let s_a = b.load_or(sa + rm * k_blocks + kb, rm.lt(m), 0.0).expand_dims(1);
                    let s_b = b.load(sb + (col0 / SCALE_BLOCK as i32) * k_blocks + kb, None, None);
                    vec![carried[0] + part * (s_a * s_b)]
                } else if self.promote {
                    let part = b.dot(ta, tb.t(), b.zeros(&[bm, bn], DType::F32), InputPrecision::Ieee);
                    vec![carried[0] + part]
                } else {
                    vec![b.dot(ta, tb.t(), carried[0], InputPrecision::Ieee)]
                }
            });
            let out = match self.scaling {
                Scaling::Row => {
                    let s_a = b.load_or(sa + rm, rm.lt(m), 0.0).expand_dims(1);
                    let s_b = b.load_or(sb + rn, rn.lt(n), 0.0).expand_dims(0);
                    done[0] * s_a * s_b
                }
                Scaling::Tensor => done[0] * (b.load(sa, None, None) * b.load(sb, None, None)),
                Scaling::Block => done[0],
            };
            match (dc, workspace) {
                (_, Some(ws)) => split_epilogue(&b, ws, c, (tile, self.splits), out, (row0, bm), cols, (m, n), DType::BF16),
                // The TMA store clips at C's edges.
                (Some(dc), None) => b.desc_store(dc, [row0, col0], out.cast(DType::BF16)),
                (None, None) => b.store(c + rows * n + cols, out.cast(DType::BF16), Some(rows.lt(m) & cols.lt(n))),
            }
        };
        let pid = b.program_id_x();
        if persistent {
            b.for_range(pid, tiles, b.num_programs(trident_core::ir::Axis::X), &[], |t, _| {
                one_tile(t);
                Vec::new()
            });
        } else {
            one_tile(pid);
        }
        b.finish()
    }

    /// The grid and arguments of `c[m, n]` (bf16) = the scaled product of `a[m, k]` and
    /// `b[n, k]` (FP8, row-major), with `scale_a` and `scale_b` as [`ScaledGemm::scale_lens`]
    /// sizes them, checked (`None`: nothing to do); for callers that launch on a stream of
    /// their own (the Python package).
    #[allow(clippy::too_many_arguments)]
    pub fn plan(
        &self,
        a: &Buffer,
        b: &Buffer,
        c: &Buffer,
        scale_a: &Buffer,
        scale_b: &Buffer,
        (m, n, k): (usize, usize, usize),
    ) -> Result<Option<Launch>, BackendError> {
        self.plan_with(a, b, c, (scale_a, scale_b), None, (m, n, k))
    }

    /// [`ScaledGemm::plan`] with the workspace a split-K launch needs
    /// ([`ScaledGemm::workspace`]; `None` without split-K).
    #[allow(clippy::too_many_arguments)]
    pub fn plan_with(
        &self,
        a: &Buffer,
        b: &Buffer,
        c: &Buffer,
        (scale_a, scale_b): (&Buffer, &Buffer),
        workspace: Option<&SplitKWorkspace>,
        (m, n, k): (usize, usize, usize),
    ) -> Result<Option<Launch>, BackendError> {
        let tiles = self.tiles(m, n);
        match (self.split(), workspace) {
            (true, Some(ws)) => ws.check(m * n, tiles)?,
            (true, None) => return Err(self.problem("split-K needs its workspace (`ScaledGemm::workspace`)".into())),
            (false, _) => {}
        }
        if !self.dtype.is_fp8() {
            return Err(self.problem(format!("operands of `{}`: an FP8 type is needed", self.dtype)));
        }
        if self.scaling == Scaling::Block && !SCALE_BLOCK.is_multiple_of(self.block_n) {
            return Err(self.problem(format!("block_n = {} does not divide {SCALE_BLOCK}", self.block_n)));
        }
        let (la, lb) = self.scale_lens(m, n, k);
        require_bytes(a, m * k, "a")?;
        require_bytes(b, n * k, "b")?;
        require_bytes(c, m * n * 2, "c")?;
        require_bytes(scale_a, la * 4, "scale_a")?;
        require_bytes(scale_b, lb * 4, "scale_b")?;
        let (m32, n32, k32) = (require_i32(m, "m")?, require_i32(n, "n")?, require_i32(k, "k")?);
        if m == 0 || n == 0 {
            return Ok(None);
        }
        let mut args = vec![a.arg(), b.arg(), c.arg(), scale_a.arg(), scale_b.arg()];
        if let Some(ws) = workspace.filter(|_| self.split()) {
            args.extend([ws.partial.arg(), ws.counters.arg()]);
        }
        args.extend([KernelArg::i32(m32), KernelArg::i32(n32), KernelArg::i32(k32)]);
        let splits = if self.split() { self.splits } else { 1 };
        Ok(Some(([tiles as u32, splits, 1], args)))
    }

    /// [`ScaledGemm::plan`], launched on `l`'s device.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        l: &DeviceCtx,
        a: &Buffer,
        b: &Buffer,
        c: &Buffer,
        scale_a: &Buffer,
        scale_b: &Buffer,
        mnk: (usize, usize, usize),
    ) -> Result<(), BackendError> {
        self.run_with(l, a, b, c, (scale_a, scale_b), None, mnk)
    }

    /// [`ScaledGemm::plan_with`], launched on `l`'s device; split-K without a workspace gets
    /// one for the call.
    #[allow(clippy::too_many_arguments)]
    pub fn run_with(
        &self,
        l: &DeviceCtx,
        a: &Buffer,
        b: &Buffer,
        c: &Buffer,
        scales: (&Buffer, &Buffer),
        workspace: Option<&SplitKWorkspace>,
        mnk: (usize, usize, usize),
    ) -> Result<(), BackendError> {
        let op = self.specialized(a, b, c, mnk.1, mnk.2);
        if op.split() && workspace.is_none() {
            let ws = op.workspace(l.device, mnk.0, mnk.1)?;
            let done = op.run_with(l, a, b, c, scales, Some(&ws), mnk);
            l.device.free(&ws.partial)?;
            l.device.free(&ws.counters)?;
            return done;
        }
        let Some((grid, args)) = op.plan_with(a, b, c, scales, workspace, mnk)? else { return Ok(()) };
        let kernel = l.compile(format!("{op:?}"), || op.build())?;
        l.launch(&kernel, grid, &args)
    }
}

inventory::submit! {
    crate::Catalogued {
        name: "scaled_gemm",
        operation: "scaled_gemm",
        distributed: false,
        // FP8 whatever the catalogue's type (its output is bf16): the block-scaled form.
        build: |_| ScaledGemm::new(DType::F8E4M3FN, Scaling::Block).build(),
    }
}

// The descriptor form (row scaling, e4m3) on one warpgroup's 64 x 64 tiles, which every
// target's shared memory holds: FP8 `wgmma` on TMA stages and C by a TMA store on sm_90a.
inventory::submit! {
    crate::Catalogued {
        name: "scaled_gemm_desc",
        operation: "scaled_gemm",
        distributed: false,
        build: |_| {
            let base = ScaledGemm::new(DType::F8E4M3FN, Scaling::Row);
            let form = ScaledGemm { block_m: 64, block_n: 64, stages: 2, descriptors: true, divisible: true, ..base };
            ScaledGemm { tma_store: true, ..form }.build()
        },
    }
}

// The block-scaled descriptor form (e4m3) on the same tiles: each K block's partial promoted
// with its scales as it is added (on sm_90a, a fresh `wgmma` group per block).
inventory::submit! {
    crate::Catalogued {
        name: "scaled_gemm_block_desc",
        operation: "scaled_gemm",
        distributed: false,
        build: |_| {
            let base = ScaledGemm::new(DType::F8E4M3FN, Scaling::Block);
            ScaledGemm { block_m: 64, block_n: 64, stages: 2, descriptors: true, divisible: true, ..base }.build()
        },
    }
}
