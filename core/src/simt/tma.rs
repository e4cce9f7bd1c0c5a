//! Tensor maps: what a TMA copy (`cp.async.bulk.tensor`) reads a global tensor through. The
//! lowering turns a `make_desc` whose parts are kernel parameters or constants into a
//! [`TensorMap`]: which parameters give the address, the extents and the row stride, and the box
//! one copy moves with its swizzle. At launch the runtime evaluates it against the arguments
//! ([`TensorMap::evaluate`]) and encodes the 128-byte map the driver defines
//! (`cuTensorMapEncodeTiled`), passed as an extra kernel parameter; `cpu-simt` executes copies
//! from the evaluated form. The rules a map must meet (`TensorMap::evaluate`'s errors) are the
//! driver's, checked here so that every backend reports them the same way, before a launch.

use crate::backend::KernelArg;
use crate::ir::{DType, Literal};

/// A scalar of a tensor map: a kernel parameter's value or a constant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MapScalar {
    Param(u32),
    Const(i64),
}

/// A 2-D tiled tensor map: the tensor at parameter `ptr` of `rows x cols` elements of `dtype`,
/// rows `row_stride` elements apart, columns contiguous; one copy moves a box of `box_rows x
/// box_cols` elements into shared memory, rows `box_cols` elements apart, swizzled at `swizzle`
/// bytes (`super::smem::swizzle`; 0: none). Elements outside the tensor read 0.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorMap {
    /// The parameter whose name diagnostics use (the tensor's pointer).
    pub ptr: u32,
    pub dtype: DType,
    pub rows: MapScalar,
    pub cols: MapScalar,
    pub row_stride: MapScalar,
    pub box_rows: u32,
    pub box_cols: u32,
    pub swizzle: u32,
}

/// A tensor map evaluated against launch arguments: what the driver's encoder takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapValues {
    pub address: u64,
    pub rows: u64,
    pub cols: u64,
    /// Bytes between rows.
    pub row_stride_bytes: u64,
    pub box_rows: u32,
    pub box_cols: u32,
    pub elem_bytes: u32,
    pub swizzle: u32,
}

impl MapValues {
    /// Bytes one copy moves (the whole box: elements outside the tensor count, as zeros).
    pub fn box_bytes(&self) -> u32 {
        self.box_rows * self.box_cols * self.elem_bytes
    }

    /// The alignment the box's shared-memory copy needs: a swizzle pattern's 8 rows, else 128.
    pub fn shared_align(&self) -> usize {
        if self.swizzle > 0 {
            8 * self.swizzle as usize
        } else {
            128
        }
    }

    /// Every element of the box whose first element is tensor element (`row`, `col`), copied at
    /// shared byte `shared`: its shared address (rows one after the other, swizzled) and its
    /// global address when it lies inside the tensor.
    pub fn box_elements(&self, shared: usize, row: i64, col: i64) -> impl Iterator<Item = (usize, Option<u64>)> + '_ {
        let es = self.elem_bytes as usize;
        (0..self.box_rows as i64).flat_map(move |rr| {
            (0..self.box_cols as i64).map(move |cc| {
                let (gr, gc) = (row + rr, col + cc);
                let inside = gr >= 0 && gc >= 0 && (gr as u64) < self.rows && (gc as u64) < self.cols;
                let global = inside.then(|| self.address + gr as u64 * self.row_stride_bytes + gc as u64 * es as u64);
                let logical = shared + (rr as usize * self.box_cols as usize + cc as usize) * es;
                (super::smem::swizzle(logical as u32, self.swizzle) as usize, global)
            })
        })
    }
}

impl TensorMap {
    /// Bytes one copy through this map moves.
    pub fn box_bytes(&self) -> u32 {
        self.box_rows * self.box_cols * self.dtype.size_bytes()
    }

    /// The map's values for a launch with `args` (the kernel's parameters in order), or what
    /// rule of the hardware they break: a 16-byte aligned address, extents from 1 to 2^32, a row
    /// stride that is a multiple of 16 bytes below 2^40, boxes of 1 to 256 elements per side
    /// whose rows are whole 16-byte chunks and fit the swizzle width.
    pub fn evaluate(&self, args: &[KernelArg]) -> Result<MapValues, String> {
        let scalar = |s: MapScalar, what: &str| -> Result<i64, String> {
            match s {
                MapScalar::Const(c) => Ok(c),
                MapScalar::Param(i) => match args.get(i as usize) {
                    Some(KernelArg::Scalar(Literal::Int(v), _)) => Ok(*v),
                    Some(KernelArg::Ptr(p)) => Ok(*p as i64),
                    other => Err(format!("{what} (parameter {i}) is {other:?}, not an integer")),
                },
            }
        };
        let address = match args.get(self.ptr as usize) {
            Some(KernelArg::Ptr(p)) => *p,
            other => return Err(format!("the tensor (parameter {}) is {other:?}, not a pointer", self.ptr)),
        };
        let es = self.dtype.size_bytes();
        let (rows, cols) = (scalar(self.rows, "the row count")?, scalar(self.cols, "the column count")?);
        let stride = scalar(self.row_stride, "the row stride")?;
        if !address.is_multiple_of(16) {
            return Err(format!("address {address:#x} is not 16-byte aligned"));
        }
        for (what, v) in [("row count", rows), ("column count", cols)] {
            if !(1..=1 << 32).contains(&v) {
                return Err(format!("{what} {v} is outside 1..=2^32"));
            }
        }
        let stride_bytes = stride * es as i64;
        if stride_bytes <= 0 || stride_bytes % 16 != 0 || stride_bytes >= 1 << 40 {
            return Err(format!(
                "row stride {stride} elements ({stride_bytes} bytes) is not a positive multiple of 16 bytes below 2^40"
            ));
        }
        let row_bytes = self.box_cols * es;
        if !(1..=256).contains(&self.box_rows) || !(1..=256).contains(&self.box_cols) {
            return Err(format!("box {}x{} has a side outside 1..=256", self.box_rows, self.box_cols));
        }
        if !row_bytes.is_multiple_of(16) || (self.swizzle > 0 && row_bytes > self.swizzle) {
            return Err(format!(
                "box rows of {row_bytes} bytes are not whole 16-byte chunks within the {}-byte swizzle",
                self.swizzle
            ));
        }
        Ok(MapValues {
            address,
            rows: rows as u64,
            cols: cols as u64,
            row_stride_bytes: stride_bytes as u64,
            box_rows: self.box_rows,
            box_cols: self.box_cols,
            elem_bytes: es,
            swizzle: self.swizzle,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> TensorMap {
        TensorMap {
            ptr: 0,
            dtype: DType::BF16,
            rows: MapScalar::Param(1),
            cols: MapScalar::Param(2),
            row_stride: MapScalar::Param(2),
            box_rows: 128,
            box_cols: 64,
            swizzle: 128,
        }
    }

    #[test]
    fn maps_evaluate_against_arguments_and_name_the_broken_rule() {
        let args = |p: u64, r: i32, c: i32| [KernelArg::Ptr(p), KernelArg::i32(r), KernelArg::i32(c)];
        let v = map().evaluate(&args(0x1000, 100, 72)).unwrap();
        assert_eq!((v.rows, v.cols, v.row_stride_bytes, v.box_bytes()), (100, 72, 144, 128 * 64 * 2));
        let e = map().evaluate(&args(0x1008, 100, 72)).unwrap_err();
        assert!(e.contains("not 16-byte aligned"), "{e}");
        let e = map().evaluate(&args(0x1000, 100, 12)).unwrap_err();
        assert!(e.contains("row stride 12 elements (24 bytes)"), "{e}");
        let e = map().evaluate(&args(0x1000, 0, 72)).unwrap_err();
        assert!(e.contains("row count 0"), "{e}");
        let wide = TensorMap { box_cols: 128, ..map() };
        let e = wide.evaluate(&args(0x1000, 100, 72)).unwrap_err();
        assert!(e.contains("256 bytes"), "{e}");
    }
}
