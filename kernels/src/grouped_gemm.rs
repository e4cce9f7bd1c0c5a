//! The grouped GEMM of mixture-of-experts layers: `C_e = A_e B_e` for experts `e`, with each
//! expert's row count known only on the device (it comes from routing), so one launch serves
//! any routing without a host synchronisation.
//!
//! Layouts of A (and C alike):
//! * [`Layout::Contiguous`]: rows grouped by expert, `groups[e]` the end of expert `e`'s rows
//!   (cumulative int32, PyTorch's `offs` of `torch._grouped_mm`): A `[T, K]`, C `[T, N]`;
//! * [`Layout::Masked`]: `[E, t_max, K]` with `groups[e]` expert `e`'s row count (the
//!   low-latency dispatch's output): C `[E, t_max, N]`, rows past the count untouched.
//!
//! B is `[E, N, K]` ([`BLayout::NK`], K contiguous, as the FP8 tensor cores read it and
//! `torch._grouped_mm` takes it transposed) or `[E, K, N]` ([`BLayout::KN`]).
//!
//! The schedule: programs walk the (expert, tile) pairs with a stride of the grid: each program
//! goes through the experts once, reading their counts, and computes the tiles of each that are
//! its own (tile numbers `pid, pid + P, ...` over all experts' tiles in order). An empty
//! expert costs each program one load; the grid needs no bound from the host's view of the
//! counts (`LaunchAttrs::persistent`: the runtime runs as many programs as are resident).
//!
//! This is the portable form: pointer loads with edge masks, the K loop on the target's matrix
//! atoms; the TMA and `wgmma` form with per-expert tensor maps comes next.

use crate::{cdiv, require_bytes, require_i32, DeviceCtx};
use trident_core::backend::{BackendError, Buffer, KernelArg};
use trident_core::ir::{Axis, DType, InputPrecision, LaunchAttrs};
use trident_core::{Function, KernelBuilder, Tile, VerifyError};

/// A launch's grid and arguments.
pub type Launch = ([u32; 3], Vec<KernelArg>);

/// How A's (and C's) rows are grouped by expert.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// `[T, K]`, `groups[e]` the end of expert `e`'s rows.
    Contiguous,
    /// `[E, t_max, K]`, `groups[e]` expert `e`'s row count.
    Masked,
}

/// How each expert's B is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BLayout {
    /// `[E, N, K]`: K contiguous.
    NK,
    /// `[E, K, N]`: N contiguous.
    KN,
}

/// A grouped GEMM problem: experts, the extents of every expert's GEMM, and the rows of A.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Groups {
    pub experts: usize,
    pub n: usize,
    pub k: usize,
    /// Contiguous: A's rows (every expert's together); masked: each expert's capacity.
    pub rows: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupedGemm {
    /// A, B and C (bf16 or f16; f32 accumulation).
    pub dtype: DType,
    pub layout: Layout,
    pub b_layout: BLayout,
    pub block_m: u32,
    pub block_n: u32,
    pub block_k: u32,
    pub warps: u32,
    pub stages: u32,
}

impl GroupedGemm {
    pub fn new(dtype: DType, layout: Layout, b_layout: BLayout) -> GroupedGemm {
        GroupedGemm { dtype, layout, b_layout, block_m: 64, block_n: 64, block_k: 32, warps: 4, stages: 2 }
    }

    fn problem(&self, message: String) -> BackendError {
        BackendError::Problem { kernel: "grouped_gemm".into(), message }
    }

    pub fn build(&self) -> Result<Function, VerifyError> {
        let (bm, bn, bk) = (self.block_m, self.block_n, self.block_k);
        let name = format!("grouped_gemm_{}_{:?}_{:?}_{bm}x{bn}x{bk}", self.dtype, self.layout, self.b_layout)
            .to_lowercase();
        let attrs = LaunchAttrs { warps: self.warps, stages: self.stages, persistent: true, ..LaunchAttrs::default() };
        let b = KernelBuilder::new(&name, attrs);
        let (a, bp, c) = (b.arg_ptr("a", self.dtype), b.arg_ptr("b", self.dtype), b.arg_ptr("c", self.dtype));
        let groups = b.arg_ptr("groups", DType::I32);
        let experts = b.arg("experts", DType::I32);
        let (n, k) = (b.arg("n", DType::I32), b.arg("k", DType::I32));
        let t_max = b.arg("t_max", DType::I32);

        let (pid, programs) = (b.program_id_x(), b.num_programs(Axis::X));
        let tiles_n = (n + (bn as i32 - 1)) / bn as i32;
        let zero = b.constant(trident_core::ir::Literal::Int(0), DType::I32);
        // Carried over the experts: this program's next tile number, where the expert's rows
        // start (contiguous), and the number of the expert's first tile.
        b.for_range(0, experts, 1, &[pid, zero, zero], |e, st| {
            let (next, start, tile_base) = (st[0], st[1], st[2]);
            let g = b.load(groups + e, None, None);
            let (first, rows) = match self.layout {
                Layout::Contiguous => (start, g - start),
                Layout::Masked => (e * t_max, g),
            };
            let tiles = ((rows + (bm as i32 - 1)) / bm as i32) * tiles_n;
            let end = tile_base + tiles;
            let after = b.while_loop(
                &[next],
                |s| s[0].lt(end),
                |s| {
                    let local = s[0] - tile_base;
                    self.tile(&b, (a, bp, c), e, (first, rows), (local / tiles_n, local % tiles_n), (n, k));
                    vec![s[0] + programs]
                },
            );
            let start = match self.layout {
                Layout::Contiguous => g,
                Layout::Masked => start,
            };
            vec![after[0], start, end]
        });
        b.finish()
    }

    /// Output tile (`tm`, `tn`) of expert `e`, whose rows are `first ..` (`rows` of them).
    #[allow(clippy::too_many_arguments)]
    fn tile<'b>(
        &self,
        b: &'b KernelBuilder,
        (a, bp, c): (Tile<'b>, Tile<'b>, Tile<'b>),
        e: Tile<'b>,
        (first, rows): (Tile<'b>, Tile<'b>),
        (tm, tn): (Tile<'b>, Tile<'b>),
        (n, k): (Tile<'b>, Tile<'b>),
    ) {
        let (bm, bn, bk) = (self.block_m, self.block_n, self.block_k);
        let local = tm * bm as i32 + b.arange(0, bm as i64);
        let rn = tn * bn as i32 + b.arange(0, bn as i64);
        let (rows_ok, cols) = (local.lt(rows).expand_dims(1), rn.expand_dims(0));
        let rm = (first + local).expand_dims(1);
        let b_e = bp + e * n * k;
        let acc = b.zeros(&[bm, bn], DType::F32);
        let done = b.for_range(0, k, bk as i32, &[acc], |k0, carried| {
            let kk = k0 + b.arange(0, bk as i64);
            let (kr, kc) = (kk.expand_dims(1), kk.expand_dims(0));
            let ta = b.load_or(a + rm * k + kc, rows_ok & kc.lt(k), 0.0);
            let in_b = kr.lt(k) & cols.lt(n);
            let tb = match self.b_layout {
                BLayout::NK => b.load_or(b_e + cols * k + kr, in_b, 0.0),
                BLayout::KN => b.load_or(b_e + kr * n + cols, in_b, 0.0),
            };
            vec![b.dot(ta, tb, carried[0], InputPrecision::Ieee)]
        });
        b.store(c + rm * n + cols, done[0].cast(self.dtype), Some(rows_ok & cols.lt(n)));
    }

    /// The launch's grid and arguments, checked against the buffers (`None`: nothing to do).
    /// The grid covers the most tiles any routing can make (contiguous: every row in one
    /// expert's tiles, plus a partial tile per expert; masked: every expert full); the runtime
    /// runs as many of them as are resident.
    pub fn plan(
        &self,
        (a, b, c, groups): (&Buffer, &Buffer, &Buffer, &Buffer),
        p: Groups,
    ) -> Result<Option<Launch>, BackendError> {
        if !matches!(self.dtype, DType::BF16 | DType::F16) {
            return Err(self.problem(format!("operands of `{}`: bf16 or f16", self.dtype)));
        }
        let es = self.dtype.size_bytes() as usize;
        let Groups { experts, n, k, rows } = p;
        let a_rows = match self.layout {
            Layout::Contiguous => rows,
            Layout::Masked => experts * rows,
        };
        require_bytes(a, a_rows * k * es, "a")?;
        require_bytes(b, experts * n * k * es, "b")?;
        require_bytes(c, a_rows * n * es, "c")?;
        require_bytes(groups, experts * 4, "groups")?;
        // Every element offset is computed in i32.
        require_i32(a_rows * k.max(n), "rows x max(n, k)")?;
        require_i32(experts * n * k, "experts x n x k")?;
        if experts == 0 || n == 0 || a_rows == 0 {
            return Ok(None);
        }
        let (bm, bn) = (self.block_m as usize, self.block_n as usize);
        let tiles = match self.layout {
            Layout::Contiguous => (cdiv(rows, bm) + experts) * cdiv(n, bn),
            Layout::Masked => experts * cdiv(rows, bm) * cdiv(n, bn),
        };
        let args = vec![
            a.arg(),
            b.arg(),
            c.arg(),
            groups.arg(),
            KernelArg::i32(require_i32(experts, "experts")?),
            KernelArg::i32(require_i32(n, "n")?),
            KernelArg::i32(require_i32(k, "k")?),
            KernelArg::i32(require_i32(rows, "t_max")?),
        ];
        Ok(Some(([require_i32(tiles, "tiles")? as u32, 1, 1], args)))
    }

    /// [`GroupedGemm::plan`], launched on `l`'s device.
    pub fn run(&self, l: &DeviceCtx, bufs: (&Buffer, &Buffer, &Buffer, &Buffer), p: Groups) -> Result<(), BackendError> {
        let Some((grid, args)) = self.plan(bufs, p)? else { return Ok(()) };
        let kernel = l.compile(format!("{self:?}"), || self.build())?;
        l.launch(&kernel, grid, &args)
    }
}

inventory::submit! {
    crate::Catalogued {
        name: "grouped_gemm",
        operation: "grouped_gemm",
        distributed: false,
        build: |d| GroupedGemm::new(d, Layout::Contiguous, BLayout::NK).build(),
    }
}
