//! Element types, pointer types and tile shapes.

use serde::Serialize;
use std::fmt;

trident_shmem_abi::keyword_enum! {
    /// A numeric element type.
    DType {
        I1 = "i1",
        I8 = "i8",
        I16 = "i16",
        I32 = "i32",
        I64 = "i64",
        U8 = "u8",
        U16 = "u16",
        U32 = "u32",
        U64 = "u64",
        F16 = "f16",
        BF16 = "bf16",
        F8E4M3FN = "f8e4m3fn",
        F8E5M2 = "f8e5m2",
        F32 = "f32",
        F64 = "f64",
    }
}

impl DType {
    /// Width in bits (`i1` counts as 1 but occupies one byte in memory).
    pub fn bits(self) -> u32 {
        match self {
            DType::I1 => 1,
            DType::I8 | DType::U8 | DType::F8E4M3FN | DType::F8E5M2 => 8,
            DType::I16 | DType::U16 | DType::F16 | DType::BF16 => 16,
            DType::I32 | DType::U32 | DType::F32 => 32,
            DType::I64 | DType::U64 | DType::F64 => 64,
        }
    }

    /// Bytes one element occupies in memory.
    pub fn size_bytes(self) -> u32 {
        self.bits().div_ceil(8)
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64 | DType::F8E4M3FN | DType::F8E5M2)
    }

    /// The 8-bit floats (`crate::fp8`): values to load, store, convert and multiply in `dot`,
    /// with no arithmetic of their own (the verifier refuses it).
    pub fn is_fp8(self) -> bool {
        matches!(self, DType::F8E4M3FN | DType::F8E5M2)
    }

    /// The format of an 8-bit float type.
    pub fn fp8(self) -> Option<crate::fp8::Fp8> {
        match self {
            DType::F8E4M3FN => Some(crate::fp8::E4M3FN),
            DType::F8E5M2 => Some(crate::fp8::E5M2),
            _ => None,
        }
    }

    /// Integer types, `i1` included.
    pub fn is_int(self) -> bool {
        !self.is_float()
    }

    /// Signed integers (`i*`); `i1` is treated as unsigned (a boolean).
    pub fn is_signed_int(self) -> bool {
        matches!(self, DType::I8 | DType::I16 | DType::I32 | DType::I64)
    }
}

/// What one element of a value is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Elem {
    /// A number.
    Num(DType),
    /// A global-memory pointer to elements of the given type (`!ptr<f32>`).
    Ptr(DType),
    /// The ordering token produced by `wait` (`!token`); only ever a scalar.
    Token,
    /// A 2-D tensor descriptor (`!desc<bf16, 128x64>`): a global tensor of `dtype` read and
    /// written in blocks of `block` rows x columns (`make_desc`); only ever a scalar.
    Desc { dtype: DType, block: [u32; 2] },
}

impl Elem {
    pub fn dtype(self) -> Option<DType> {
        match self {
            Elem::Num(d) => Some(d),
            _ => None,
        }
    }

    /// A descriptor's element type and block shape.
    pub fn desc(self) -> Option<(DType, [u32; 2])> {
        match self {
            Elem::Desc { dtype, block } => Some((dtype, block)),
            _ => None,
        }
    }

    pub fn pointee(self) -> Option<DType> {
        match self {
            Elem::Ptr(d) => Some(d),
            _ => None,
        }
    }
}

impl fmt::Display for Elem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Elem::Num(d) => write!(f, "{d}"),
            Elem::Ptr(d) => write!(f, "!ptr<{d}>"),
            Elem::Token => f.write_str("!token"),
            Elem::Desc { dtype, block } => write!(f, "!desc<{dtype}, {}x{}>", block[0], block[1]),
        }
    }
}

/// The type of a value: a scalar (empty shape) or a tile of elements.
///
/// Tile dimensions are powers of two (the verifier checks it): layouts distribute them over
/// lanes, warps and registers, which only works for powers of two.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Type {
    pub elem: Elem,
    /// Row-major dimensions; empty for a scalar.
    pub shape: Vec<u32>,
}

impl Type {
    pub fn scalar(elem: Elem) -> Type {
        Type { elem, shape: Vec::new() }
    }

    pub fn num(d: DType) -> Type {
        Type::scalar(Elem::Num(d))
    }

    pub fn ptr(d: DType) -> Type {
        Type::scalar(Elem::Ptr(d))
    }

    pub fn token() -> Type {
        Type::scalar(Elem::Token)
    }

    pub fn tile(elem: Elem, shape: &[u32]) -> Type {
        Type { elem, shape: shape.to_vec() }
    }

    pub fn is_scalar(&self) -> bool {
        self.shape.is_empty()
    }

    /// Number of elements (1 for a scalar); saturates instead of overflowing on absurd shapes.
    pub fn numel(&self) -> u64 {
        self.shape.iter().fold(1u64, |n, &d| n.saturating_mul(d as u64))
    }

    /// The same shape with another element type.
    pub fn with_elem(&self, elem: Elem) -> Type {
        Type { elem, shape: self.shape.clone() }
    }

    pub fn dtype(&self) -> Option<DType> {
        self.elem.dtype()
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.shape.is_empty() {
            return write!(f, "{}", self.elem);
        }
        f.write_str("tile<")?;
        for d in &self.shape {
            write!(f, "{d}x")?;
        }
        write!(f, "{}>", self.elem)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display() {
        assert_eq!(Type::num(DType::BF16).to_string(), "bf16");
        assert_eq!(Type::tile(Elem::Num(DType::F32), &[128, 64]).to_string(), "tile<128x64xf32>");
        assert_eq!(Type::tile(Elem::Ptr(DType::F16), &[128]).to_string(), "tile<128x!ptr<f16>>");
        assert_eq!(Type::token().to_string(), "!token");
    }

    #[test]
    fn sizes() {
        assert_eq!(DType::I1.size_bytes(), 1);
        assert_eq!(DType::BF16.size_bytes(), 2);
        assert_eq!(Type::tile(Elem::Num(DType::F32), &[4, 8]).numel(), 32);
    }
}
