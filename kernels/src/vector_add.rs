//! `out = x + y` over `n` elements: the smallest complete kernel (masked loads and stores).

use crate::{cdiv, require_bytes, require_i32, DeviceCtx};
use trident_core::backend::{BackendError, Buffer, KernelArg};
use trident_core::ir::{DType, LaunchAttrs};
use trident_core::{Function, KernelBuilder, VerifyError};

/// Meta-parameters of one specialization.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VectorAdd {
    pub dtype: DType,
    /// Elements per program (a power of two).
    pub block: u32,
}

impl VectorAdd {
    pub fn build(&self) -> Result<Function, VerifyError> {
        let b = KernelBuilder::new(&format!("vector_add_{}_{}", self.dtype, self.block), LaunchAttrs::default());
        let (x, y, out) = (b.arg_ptr("x", self.dtype), b.arg_ptr("y", self.dtype), b.arg_ptr("out", self.dtype));
        let n = b.arg("n", DType::I32);
        let offs = b.program_id_x() * self.block as i32 + b.arange(0, self.block as i64);
        let mask = offs.lt(n);
        let sum = b.load(x + offs, Some(mask), None) + b.load(y + offs, Some(mask), None);
        b.store(out + offs, sum, Some(mask));
        b.finish()
    }

    /// `out[..n] = x[..n] + y[..n]` on `device`.
    pub fn run(&self, l: &DeviceCtx, x: &Buffer, y: &Buffer, out: &Buffer, n: usize) -> Result<(), BackendError> {
        let bytes = n * self.dtype.size_bytes() as usize;
        for (buf, role) in [(x, "x"), (y, "y"), (out, "out")] {
            require_bytes(buf, bytes, role)?;
        }
        let n32 = require_i32(n, "n")?;
        let k = l.compile(format!("{self:?}"), || self.build())?;
        let grid = [cdiv(n.max(1), self.block as usize) as u32, 1, 1];
        l.launch(&k, grid, &[x.arg(), y.arg(), out.arg(), KernelArg::i32(n32)])
    }
}

inventory::submit! {
    crate::Catalogued { name: "vector_add", operation: "vector_add", distributed: false, build: |d| VectorAdd { dtype: d, block: 1024 }.build() }
}
