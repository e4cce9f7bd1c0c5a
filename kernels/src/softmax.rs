//! Row-wise softmax (fused: one program per row, the row held in one tile).
//!
//! `out[r, :] = exp(x[r, :] - max(x[r, :])) / sum(exp(x[r, :] - max(x[r, :])))`, computed in f32
//! whatever the storage type, with masked-off columns loaded as `-inf` so they vanish in `exp`.
//! The quotient is `e * (1 / sum)`: one reciprocal per row.

use crate::{require_bytes, require_i32, DeviceCtx};
use trident_core::backend::{BackendError, Buffer, KernelArg};
use trident_core::ir::{DType, LaunchAttrs};
use trident_core::{Function, KernelBuilder, VerifyError};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Softmax {
    pub dtype: DType,
    /// Columns per program: a power of two at least the row length.
    pub block: u32,
    pub warps: u32,
    /// `exp` through the hardware's approximation (`LaunchAttrs::fast_math`).
    pub fast_math: bool,
}

impl Softmax {
    /// The specialization for rows of `cols` elements.
    pub fn for_cols(dtype: DType, cols: usize) -> Softmax {
        let block = cols.max(1).next_power_of_two() as u32;
        Softmax { dtype, block, warps: if block >= 2048 { 8 } else { 4 }, fast_math: false }
    }

    pub fn build(&self) -> Result<Function, VerifyError> {
        let attrs = LaunchAttrs { warps: self.warps, fast_math: self.fast_math, ..LaunchAttrs::default() };
        let b = KernelBuilder::new(&format!("softmax_{}_{}", self.dtype, self.block), attrs);
        let (x, out) = (b.arg_ptr("x", self.dtype), b.arg_ptr("out", self.dtype));
        let (cols, stride) = (b.arg("cols", DType::I32), b.arg("row_stride", DType::I32));
        let row_start = b.program_id_x() * stride;
        let offs = b.arange(0, self.block as i64);
        let mask = offs.lt(cols);
        let v = b.load_or(x + row_start + offs, mask, f64::NEG_INFINITY).cast(DType::F32);
        let shifted = v - v.max_along(0);
        let e = shifted.exp();
        // One correctly rounded reciprocal per row, then products (within an ulp of the
        // quotients; a division per element costs more than the whole exp).
        let y = e * (b.f32(1.0) / e.sum(0));
        b.store(out + row_start + offs, y.cast(self.dtype), Some(mask));
        b.finish()
    }

    /// Softmax of each of `rows` rows of `cols` elements (row-major, contiguous).
    pub fn run(&self, l: &DeviceCtx, x: &Buffer, out: &Buffer, rows: usize, cols: usize) -> Result<(), BackendError> {
        if cols > self.block as usize {
            return Err(BackendError::Host(format!("rows of {cols} columns exceed the block of {}", self.block)));
        }
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let bytes = rows * cols * self.dtype.size_bytes() as usize;
        require_bytes(x, bytes, "x")?;
        require_bytes(out, bytes, "out")?;
        let (c, r) = (require_i32(cols, "cols")?, require_i32(rows, "rows")?);
        let k = l.compile(format!("{self:?}"), || self.build())?;
        l.launch(&k, [r as u32, 1, 1], &[x.arg(), out.arg(), KernelArg::i32(c), KernelArg::i32(c)])
    }
}

inventory::submit! {
    crate::Catalogued { name: "softmax", operation: "softmax", distributed: false, build: |d| Softmax::for_cols(d, 1024).build() }
}
