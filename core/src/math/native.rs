//! The function definitions evaluated with the host's own arithmetic (IEEE, round to nearest
//! even, subnormals kept): the CPU interpreter's math, and the reference the GPU results match
//! bit for bit.

use super::{ApproxFn, Arith};
use crate::ir::{BinaryOp, CmpOp};

/// Host evaluation: `F = f32`, `D = f64`, `I = i32`, `L = u64`, `B = bool`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Native;

impl Arith for Native {
    type F = f32;
    type D = f64;
    type I = i32;
    type L = u64;
    type B = bool;

    #[inline(always)]
    fn f(&mut self, c: f32) -> f32 {
        c
    }
    #[inline(always)]
    fn add(&mut self, a: f32, b: f32) -> f32 {
        a + b
    }
    #[inline(always)]
    fn sub(&mut self, a: f32, b: f32) -> f32 {
        a - b
    }
    #[inline(always)]
    fn mul(&mut self, a: f32, b: f32) -> f32 {
        a * b
    }
    #[inline(always)]
    fn div(&mut self, a: f32, b: f32) -> f32 {
        a / b
    }
    #[inline(always)]
    fn fma(&mut self, a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
    #[inline(always)]
    fn sqrt(&mut self, a: f32) -> f32 {
        a.sqrt()
    }
    #[inline(always)]
    fn floor(&mut self, a: f32) -> f32 {
        a.floor()
    }
    #[inline(always)]
    fn abs(&mut self, a: f32) -> f32 {
        a.abs()
    }
    #[inline(always)]
    fn fmin(&mut self, a: f32, b: f32) -> f32 {
        a.min(b)
    }
    #[inline(always)]
    fn fmax(&mut self, a: f32, b: f32) -> f32 {
        a.max(b)
    }
    #[inline(always)]
    fn neg(&mut self, a: f32) -> f32 {
        -a
    }
    #[inline(always)]
    fn cmp(&mut self, op: CmpOp, a: f32, b: f32) -> bool {
        op.holds(a, b)
    }
    #[inline(always)]
    fn sel(&mut self, c: bool, a: f32, b: f32) -> f32 {
        if c {
            a
        } else {
            b
        }
    }
    #[inline(always)]
    fn bits(&mut self, a: f32) -> i32 {
        a.to_bits() as i32
    }
    #[inline(always)]
    fn of_bits(&mut self, a: i32) -> f32 {
        f32::from_bits(a as u32)
    }
    #[inline(always)]
    fn f2i(&mut self, a: f32) -> i32 {
        a as i32
    }
    #[inline(always)]
    fn i2f(&mut self, a: i32) -> f32 {
        a as f32
    }
    #[inline(always)]
    fn l2f(&mut self, a: u64) -> f32 {
        a as f32
    }
    #[inline(always)]
    fn l2f_signed(&mut self, a: u64) -> f32 {
        a as i64 as f32
    }
    #[inline(always)]
    fn f2l_signed(&mut self, a: f32) -> u64 {
        a as i64 as u64
    }

    #[inline(always)]
    fn d(&mut self, c: f64) -> f64 {
        c
    }
    #[inline(always)]
    fn dadd(&mut self, a: f64, b: f64) -> f64 {
        a + b
    }
    #[inline(always)]
    fn dsub(&mut self, a: f64, b: f64) -> f64 {
        a - b
    }
    #[inline(always)]
    fn dmul(&mut self, a: f64, b: f64) -> f64 {
        a * b
    }
    #[inline(always)]
    fn ddiv(&mut self, a: f64, b: f64) -> f64 {
        a / b
    }
    #[inline(always)]
    fn dfma(&mut self, a: f64, b: f64, c: f64) -> f64 {
        a.mul_add(b, c)
    }
    #[inline(always)]
    fn dcmp(&mut self, op: CmpOp, a: f64, b: f64) -> bool {
        op.holds(a, b)
    }
    #[inline(always)]
    fn dsel(&mut self, c: bool, a: f64, b: f64) -> f64 {
        if c {
            a
        } else {
            b
        }
    }
    #[inline(always)]
    fn dbits(&mut self, a: f64) -> u64 {
        a.to_bits()
    }
    #[inline(always)]
    fn dof_bits(&mut self, a: u64) -> f64 {
        f64::from_bits(a)
    }
    #[inline(always)]
    fn f2d(&mut self, a: f32) -> f64 {
        a as f64
    }
    #[inline(always)]
    fn d2f(&mut self, a: f64) -> f32 {
        a as f32
    }
    #[inline(always)]
    fn d2i(&mut self, a: f64) -> i32 {
        a as i32
    }

    #[inline(always)]
    fn i(&mut self, c: i32) -> i32 {
        c
    }
    #[inline(always)]
    fn ibin(&mut self, op: BinaryOp, a: i32, b: i32) -> i32 {
        match op {
            BinaryOp::Add => a.wrapping_add(b),
            BinaryOp::Sub => a.wrapping_sub(b),
            BinaryOp::Mul => a.wrapping_mul(b),
            BinaryOp::And => a & b,
            BinaryOp::Or => a | b,
            BinaryOp::Xor => a ^ b,
            BinaryOp::Shl => a.wrapping_shl(b as u32),
            BinaryOp::Shr => a.wrapping_shr(b as u32),
            BinaryOp::Min => a.min(b),
            BinaryOp::Max => a.max(b),
            BinaryOp::Div => a.wrapping_div(b),
            BinaryOp::Rem => a.wrapping_rem(b),
            BinaryOp::Pow => unreachable!("no integer pow"),
        }
    }
    #[inline(always)]
    fn icmp(&mut self, op: CmpOp, a: i32, b: i32) -> bool {
        op.holds(a, b)
    }
    #[inline(always)]
    fn isel(&mut self, c: bool, a: i32, b: i32) -> i32 {
        if c {
            a
        } else {
            b
        }
    }
    #[inline(always)]
    fn i2l(&mut self, a: i32) -> u64 {
        a as u32 as u64
    }
    #[inline(always)]
    fn l2i(&mut self, a: u64) -> i32 {
        a as u32 as i32
    }

    #[inline(always)]
    fn l(&mut self, c: u64) -> u64 {
        c
    }
    #[inline(always)]
    fn lbin(&mut self, op: BinaryOp, a: u64, b: u64) -> u64 {
        match op {
            BinaryOp::Add => a.wrapping_add(b),
            BinaryOp::Sub => a.wrapping_sub(b),
            BinaryOp::Mul => a.wrapping_mul(b),
            BinaryOp::And => a & b,
            BinaryOp::Or => a | b,
            BinaryOp::Xor => a ^ b,
            BinaryOp::Shl => a.wrapping_shl(b as u32),
            BinaryOp::Shr => a.wrapping_shr(b as u32),
            BinaryOp::Min => a.min(b),
            BinaryOp::Max => a.max(b),
            BinaryOp::Div => a / b,
            BinaryOp::Rem => a % b,
            BinaryOp::Pow => unreachable!("no integer pow"),
        }
    }
    #[inline(always)]
    fn lcmp(&mut self, op: CmpOp, a: u64, b: u64) -> bool {
        op.holds(a, b)
    }
    #[inline(always)]
    fn lsel(&mut self, c: bool, a: u64, b: u64) -> u64 {
        if c {
            a
        } else {
            b
        }
    }

    #[inline(always)]
    fn and(&mut self, a: bool, b: bool) -> bool {
        a & b
    }
    #[inline(always)]
    fn or(&mut self, a: bool, b: bool) -> bool {
        a | b
    }
    #[inline(always)]
    fn not(&mut self, a: bool) -> bool {
        !a
    }
    fn approx(&mut self, f: ApproxFn, a: f32) -> f32 {
        approx_f32(f, a)
    }
}

/// An approximation evaluated correctly rounded (from f64).
pub fn approx_f32(f: ApproxFn, a: f32) -> f32 {
    let x = a as f64;
    (match f {
        ApproxFn::Exp2 => x.exp2(),
        ApproxFn::Log2 => x.log2(),
        ApproxFn::Sin => x.sin(),
        ApproxFn::Cos => x.cos(),
        ApproxFn::Rsqrt => 1.0 / x.sqrt(),
        ApproxFn::Rcp => 1.0 / x,
    }) as f32
}
