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
//! This form is the portable one: its `dot` runs on every backend (on GPUs on the f16 matrix
//! atoms, FP8 operands converted up in registers); the tensor cores' native FP8 forms (sm_90a's
//! `wgmma ... .e4m3`, read by TMA) come with their lowering.

use crate::{cdiv, require_bytes, require_i32, DeviceCtx};
use trident_core::backend::{BackendError, Buffer, KernelArg};
use trident_core::ir::{DType, InputPrecision, LaunchAttrs};
use trident_core::{Function, KernelBuilder, VerifyError};

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
    pub warps: u32,
}

impl ScaledGemm {
    pub fn new(dtype: DType, scaling: Scaling) -> ScaledGemm {
        ScaledGemm { dtype, scaling, block_m: 32, block_n: 64, warps: 4 }
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
        let (bm, bn, bk) = (self.block_m, self.block_n, SCALE_BLOCK);
        let name = format!("scaled_gemm_{}_{:?}_{bm}x{bn}", self.dtype, self.scaling).to_lowercase();
        let b = KernelBuilder::new(&name, LaunchAttrs { warps: self.warps, ..LaunchAttrs::default() });
        let (a, bp) = (b.arg_ptr("a", self.dtype), b.arg_ptr("b", self.dtype));
        let c = b.arg_ptr("c", DType::BF16);
        let (sa, sb) = (b.arg_ptr("scale_a", DType::F32), b.arg_ptr("scale_b", DType::F32));
        let (m, n, k) = (b.arg("m", DType::I32), b.arg("n", DType::I32), b.arg("k", DType::I32));

        let tile = b.program_id_x();
        let tiles_n = (n + (bn as i32 - 1)) / bn as i32;
        let (tm, tn) = (tile / tiles_n, tile % tiles_n);
        let rm = tm * bm as i32 + b.arange(0, bm as i64);
        let rn = tn * bn as i32 + b.arange(0, bn as i64);
        let (rows, cols) = (rm.expand_dims(1), rn.expand_dims(0));
        let k_blocks = (k + (bk as i32 - 1)) / bk as i32;
        let acc = b.zeros(&[bm, bn], DType::F32);
        let done = b.for_range(0, k_blocks, 1, &[acc], |kb, carried| {
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
        b.store(c + rows * n + cols, out.cast(DType::BF16), Some(rows.lt(m) & cols.lt(n)));
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
        let args = vec![
            a.arg(),
            b.arg(),
            c.arg(),
            scale_a.arg(),
            scale_b.arg(),
            KernelArg::i32(m32),
            KernelArg::i32(n32),
            KernelArg::i32(k32),
        ];
        let tiles = cdiv(m, self.block_m as usize) * cdiv(n, self.block_n as usize);
        Ok(Some(([tiles as u32, 1, 1], args)))
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
        let Some((grid, args)) = self.plan(a, b, c, scale_a, scale_b, mnk)? else { return Ok(()) };
        let kernel = l.compile(format!("{self:?}"), || self.build())?;
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
