//! Runtime values of the interpreter: whole tiles in one of four storage classes.
//!
//! f16/bf16/f32 elements are stored as `f32` (f16/bf16 rounded to their type after every op, as
//! `EXECUTION.md` prescribes); f64 as `f64`; every integer type as `i64` normalised to its type
//! (sign- or zero-extended; `u64` as its bit pattern); pointers as `u64` addresses.

use half::{bf16, f16};
use trident_core::ir::{DType, Elem, Literal, Type};

#[derive(Clone, Debug)]
pub enum Data {
    F(Vec<f32>),
    D(Vec<f64>),
    I(Vec<i64>),
    P(Vec<u64>),
    Token,
}

impl Data {
    /// The elements at `idx` (gather), in the same storage class.
    pub fn gather(&self, idx: &[usize]) -> Data {
        match self {
            Data::F(v) => Data::F(idx.iter().map(|&i| v[i]).collect()),
            Data::D(v) => Data::D(idx.iter().map(|&i| v[i]).collect()),
            Data::I(v) => Data::I(idx.iter().map(|&i| v[i]).collect()),
            Data::P(v) => Data::P(idx.iter().map(|&i| v[i]).collect()),
            Data::Token => Data::Token,
        }
    }

    /// `n` copies of element 0.
    pub fn splat(&self, n: usize) -> Data {
        self.gather(&vec![0; n])
    }
}

/// A value: its IR type and its elements in row-major order.
#[derive(Clone, Debug)]
pub struct Val {
    pub ty: Type,
    pub data: Data,
}

impl Val {
    pub fn scalar_i64(&self) -> i64 {
        match &self.data {
            Data::I(v) => v[0],
            Data::F(v) => v[0] as i64,
            Data::D(v) => v[0] as i64,
            Data::P(v) => v[0] as i64,
            Data::Token => 0,
        }
    }

    pub fn ints(&self) -> &[i64] {
        match &self.data {
            Data::I(v) => v,
            _ => &[],
        }
    }

    pub fn floats(&self) -> &[f32] {
        match &self.data {
            Data::F(v) => v,
            _ => &[],
        }
    }

    pub fn ptrs(&self) -> &[u64] {
        match &self.data {
            Data::P(v) => v,
            _ => &[],
        }
    }
}

/// Rounds an f32 to the precision of a 16/32-bit float type.
#[inline]
pub fn round_f(d: DType, x: f32) -> f32 {
    match d {
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::BF16 => bf16::from_f32(x).to_f32(),
        DType::F8E4M3FN | DType::F8E5M2 => round_f64(d, x as f64) as f32,
        _ => x,
    }
}

/// Rounds an f64 to an 8-bit float's value (`trident_core::fp8`: nearest even, saturating), in
/// one step: an f64 is not rounded to f32 first, which could land on a tie of the 8-bit
/// format and round twice.
#[inline]
pub fn round_f64(d: DType, x: f64) -> f64 {
    match d.fp8() {
        Some(f) => f.decode(f.encode(x)),
        None => x,
    }
}

/// Rounds every element in place to `d`'s precision (no-op for f32).
pub fn round_all(d: DType, v: &mut [f32]) {
    if matches!(d, DType::F16 | DType::BF16) || d.is_fp8() {
        for x in v {
            *x = round_f(d, *x);
        }
    }
}

/// Normalises an integer to type `d` (wraps to the width, then sign- or zero-extends).
#[inline]
pub fn norm_i(d: DType, x: i64) -> i64 {
    match d {
        DType::I1 => x & 1,
        DType::I8 => x as i8 as i64,
        DType::I16 => x as i16 as i64,
        DType::I32 => x as i32 as i64,
        DType::U8 => x as u8 as i64,
        DType::U16 => x as u16 as i64,
        DType::U32 => x as u32 as i64,
        _ => x,
    }
}

/// Integer value as f64 honouring unsignedness (`u64` is stored as its bit pattern).
#[inline]
pub fn int_to_f64(d: DType, x: i64) -> f64 {
    if d == DType::U64 {
        x as u64 as f64
    } else {
        x as f64
    }
}

/// Float to integer type `d`: truncation toward zero, saturating, NaN to 0 (PTX `cvt.rzi.sat`).
pub fn f64_to_int(d: DType, x: f64) -> i64 {
    match d {
        DType::I1 => (x != 0.0) as i64,
        DType::I8 => x as i8 as i64,
        DType::I16 => x as i16 as i64,
        DType::I32 => x as i32 as i64,
        DType::I64 => x as i64,
        DType::U8 => x as u8 as i64,
        DType::U16 => x as u16 as i64,
        DType::U32 => x as u32 as i64,
        _ => x as u64 as i64,
    }
}

/// Storage bits of one element of type `d` → runtime element.
pub enum Elt {
    F(f32),
    D(f64),
    I(i64),
}

#[inline]
pub fn from_bits(d: DType, b: u64) -> Elt {
    match d {
        DType::F16 => Elt::F(f16::from_bits(b as u16).to_f32()),
        DType::BF16 => Elt::F(bf16::from_bits(b as u16).to_f32()),
        DType::F8E4M3FN | DType::F8E5M2 => Elt::F(d.fp8().map_or(0.0, |f| f.decode(b as u8)) as f32),
        DType::F32 => Elt::F(f32::from_bits(b as u32)),
        DType::F64 => Elt::D(f64::from_bits(b)),
        DType::I1 => Elt::I((b != 0) as i64),
        _ => Elt::I(norm_i(d, b as i64)),
    }
}

#[inline]
pub fn f32_bits(d: DType, x: f32) -> u64 {
    match d {
        DType::F16 => f16::from_f32(x).to_bits() as u64,
        DType::BF16 => bf16::from_f32(x).to_bits() as u64,
        // The bits of a value of the type (an E5M2 infinity stays one: conversions saturate
        // before a value reaches memory).
        DType::F8E5M2 if x.is_infinite() => {
            if x < 0.0 {
                0xFC
            } else {
                0x7C
            }
        }
        DType::F8E4M3FN | DType::F8E5M2 => d.fp8().map_or(0, |f| f.encode(x as f64)) as u64,
        _ => x.to_bits() as u64,
    }
}

/// Bit mask of an element of `size` bytes.
#[inline]
pub fn size_mask(size: usize) -> u64 {
    if size == 8 {
        u64::MAX
    } else {
        (1u64 << (size * 8)) - 1
    }
}

/// An empty container of the storage class of `elem`, with capacity `n`.
pub fn empty_for(elem: Elem, n: usize) -> Data {
    match elem {
        Elem::Num(DType::F64) => Data::D(Vec::with_capacity(n)),
        Elem::Num(d) if d.is_float() => Data::F(Vec::with_capacity(n)),
        Elem::Num(_) => Data::I(Vec::with_capacity(n)),
        Elem::Ptr(_) => Data::P(Vec::with_capacity(n)),
        Elem::Token | Elem::Desc { .. } => Data::Token,
    }
}

/// A scalar value from a literal of type `d`.
pub fn literal(lit: Literal, d: DType) -> Data {
    match d {
        DType::F64 => Data::D(vec![lit.as_f64()]),
        d if d.is_fp8() => Data::F(vec![round_f64(d, lit.as_f64()) as f32]),
        d if d.is_float() => Data::F(vec![round_f(d, lit.as_f64() as f32)]),
        d => Data::I(vec![norm_i(
            d,
            match lit {
                Literal::Int(i) => i,
                Literal::Float(f) => f as i64,
            },
        )]),
    }
}

/// What a masked-off lane of a load holds: lane `i` of `other`, or NaN (floats) / `0x5A..`
/// (integers), so a kernel that uses it anyway is caught.
pub fn masked_off(d: DType, other: Option<&Data>, i: usize) -> Elt {
    match other {
        Some(Data::F(v)) => Elt::F(v[i]),
        Some(Data::D(v)) => Elt::D(v[i]),
        Some(Data::I(v)) => Elt::I(v[i]),
        _ if d == DType::F64 => Elt::D(f64::NAN),
        _ if d.is_float() => Elt::F(f32::NAN),
        _ => Elt::I(norm_i(d, 0x5A5A_5A5A_5A5A_5A5A)),
    }
}
