//! Conversions to and from the 8-bit floats as integer and f32 instructions every SIMT writer
//! has: an FP8 value lives in a `u8` register (its bits), and no SIMT instruction computes on
//! one (the verifier refuses FP8 arithmetic), so converting is all a target needs. The meaning
//! is `crate::fp8`'s (`docs/SEMANTICS.md`): round to nearest even once, saturating, NaN to
//! 0x7F; decoding exact. Targets with conversion instructions (`TargetDesc::fp8_convert`:
//! sm_89+'s `cvt ... e4m3x2`) use them ([`Inst::Fp8Convert`]); the integer form runs
//! everywhere else, sm_80 and AMD included.

use super::*;
use crate::fp8::Fp8;

const U32: SType = SType::Int { bits: 32, signed: false };
const U8: SType = SType::Int { bits: 8, signed: false };

impl Lowering<'_> {
    fn u32c(&mut self, v: u32) -> Reg {
        self.konst(U32, Literal::Int(v as i64))
    }

    fn u32op(&mut self, op: BinaryOp, a: Reg, v: u32) -> Reg {
        let b = self.u32c(v);
        self.bin(op, a, b)
    }

    /// `r` (a value of `from`) converted to `to`, where either is an 8-bit float.
    pub(super) fn fp8_convert(&mut self, r: Reg, from: DType, to: DType) -> Reg {
        if from == to {
            return r;
        }
        if let Some(f) = from.fp8() {
            if to == DType::F16 {
                // Exact in one step where the target converts (not through f32).
                return self.fp8_to_half(r, f);
            }
            let x = self.fp8_decode(r, f);
            return match to.fp8() {
                Some(g) => self.fp8_encode(x, g),
                None => self.convert(x, SType::of(to)),
            };
        }
        let g = to.fp8().expect("one side is FP8");
        let x = if from == DType::F64 { self.f64_to_f32_odd(r) } else { self.convert(r, SType::F32) };
        self.fp8_encode(x, g)
    }

    /// The f16 value of FP8 bits `r` (exact: f16 holds every FP8 value).
    pub(super) fn fp8_to_half(&mut self, r: Reg, f: Fp8) -> Reg {
        if self.target.fp8_convert {
            let dst = self.reg(SType::F16);
            self.emit(Inst::Fp8Convert { dst, src: r, format: format_of(f) });
            return dst;
        }
        let x = self.fp8_decode(r, f);
        self.convert(x, SType::F16)
    }

    /// The f32 value of FP8 bits `r` (exact).
    pub(super) fn fp8_decode(&mut self, r: Reg, f: Fp8) -> Reg {
        if self.target.fp8_convert {
            let h = self.fp8_to_half(r, f);
            return self.cast(h, SType::F32);
        }
        let (man, bias) = (f.man, f.bias);
        let b = self.cast(r, U32);
        let sign = self.u32op(BinaryOp::And, b, 0x80);
        let sign = self.u32op(BinaryOp::Shl, sign, 24);
        let e = self.u32op(BinaryOp::Shr, b, man);
        let e = self.u32op(BinaryOp::And, e, (1 << f.exp) - 1);
        let m = self.u32op(BinaryOp::And, b, (1 << man) - 1);
        // Normal: the f32 exponent rebiased, the mantissa moved to the top.
        let ne = self.u32op(BinaryOp::Add, e, (127 - bias) as u32);
        let ne = self.u32op(BinaryOp::Shl, ne, 23);
        let nm = self.u32op(BinaryOp::Shl, m, 23 - man);
        let normal = self.bin(BinaryOp::Or, ne, nm);
        let normal = self.bin(BinaryOp::Or, normal, sign);
        // Subnormal: m units of the smallest subnormal, exact in f32.
        let mf = self.cast(m, SType::F32);
        let unit = self.konst(SType::F32, Literal::Float(2f64.powi(1 - bias - man as i32)));
        let sub = self.bin(BinaryOp::Mul, mf, unit);
        let sub = self.bitcast(sub, U32);
        let sub = self.bin(BinaryOp::Or, sub, sign);
        let zero = self.u32c(0);
        let is_sub = self.cmp_raw(CmpOp::Eq, e, zero);
        let mut bits = self.select_raw(is_sub, sub, normal);
        let nan = self.u32c(0x7FC0_0000);
        if f.ieee {
            // Exponent all ones: infinity (mantissa 0) or NaN.
            let top = self.u32c((1 << f.exp) - 1);
            let special = self.cmp_raw(CmpOp::Eq, e, top);
            let inf = self.u32op(BinaryOp::Or, sign, 0x7F80_0000);
            let m_zero = self.cmp_raw(CmpOp::Eq, m, zero);
            let special_bits = self.select_raw(m_zero, inf, nan);
            bits = self.select_raw(special, special_bits, bits);
        } else {
            let mag = self.u32op(BinaryOp::And, b, 0x7F);
            let seven_f = self.u32c(0x7F);
            let is_nan = self.cmp_raw(CmpOp::Eq, mag, seven_f);
            bits = self.select_raw(is_nan, nan, bits);
        }
        self.bitcast(bits, SType::F32)
    }

    /// The FP8 bits of f32 `x`: round to nearest even, saturate, NaN to 0x7F.
    fn fp8_encode(&mut self, x: Reg, f: Fp8) -> Reg {
        if self.target.fp8_convert {
            let code = self.reg(U8);
            self.emit(Inst::Fp8Convert { dst: code, src: x, format: format_of(f) });
            let is_nan = self.cmp_raw(CmpOp::Ne, x, x);
            let nan = self.konst(U8, Literal::Int(crate::fp8::NAN_CODE as i64));
            return self.select_raw(is_nan, nan, code);
        }
        let (man, bias) = (f.man, f.bias);
        let u = self.bitcast(x, U32);
        let sign = self.u32op(BinaryOp::Shr, u, 24);
        let sign = self.u32op(BinaryOp::And, sign, 0x80);
        let a = self.u32op(BinaryOp::And, u, 0x7FFF_FFFF);
        // Normal: round the f32 bits to `man` mantissa bits (ties to even), then rebias.
        let shift = 23 - man;
        let lsb = self.u32op(BinaryOp::Shr, a, shift);
        let lsb = self.u32op(BinaryOp::And, lsb, 1);
        let r = self.u32op(BinaryOp::Add, a, (1 << (shift - 1)) - 1);
        let r = self.bin(BinaryOp::Add, r, lsb);
        let r = self.u32op(BinaryOp::Shr, r, shift);
        let normal = self.u32op(BinaryOp::Sub, r, ((127 - bias) as u32) << man);
        // Subnormal: |x| in units of the smallest subnormal (below 2^man, exact), rounded to
        // an integer, ties to even, by adding and subtracting 2^23.
        let ax = self.bitcast(a, SType::F32);
        let scale = self.konst(SType::F32, Literal::Float(2f64.powi(bias - 1 + man as i32)));
        let scaled = self.bin(BinaryOp::Mul, ax, scale);
        let magic = self.konst(SType::F32, Literal::Float(8_388_608.0));
        let n = self.bin(BinaryOp::Add, scaled, magic);
        let n = self.bin(BinaryOp::Sub, n, magic);
        let sub = self.convert(n, U32);
        let min_normal = self.u32c((2f32.powi(1 - bias)).to_bits());
        let is_normal = self.cmp_raw(CmpOp::Ge, a, min_normal);
        let code = self.select_raw(is_normal, normal, sub);
        let max = f.decode(f.max_code) as f32;
        let max_bits = self.u32c(max.to_bits());
        let over = self.cmp_raw(CmpOp::Ge, a, max_bits);
        let max_code = self.u32c(f.max_code as u32);
        let code = self.select_raw(over, max_code, code);
        let code = self.bin(BinaryOp::Or, code, sign);
        let inf = self.u32c(0x7F80_0000);
        let is_nan = self.cmp_raw(CmpOp::Gt, a, inf);
        let nan = self.u32c(crate::fp8::NAN_CODE as u32);
        let code = self.select_raw(is_nan, nan, code);
        self.cast(code, U8)
    }

    /// f64 `x` as an f32 rounded to odd (toward zero, with the last bit set when inexact): an
    /// FP8 rounding of that f32 equals the FP8 rounding of `x` itself (f32 has more than
    /// FP8's precision plus two bits), where rounding to nearest twice could land on a tie.
    fn f64_to_f32_odd(&mut self, x: Reg) -> Reg {
        let y = self.cast(x, SType::F32);
        let back = self.cast(y, SType::F64);
        let yb = self.bitcast(y, U32);
        let inexact = self.cmp_raw(CmpOp::Ne, back, x);
        let (ab, ax) = (self.unary_value(UnaryOp::Abs, back), self.unary_value(UnaryOp::Abs, x));
        let away = self.cmp_raw(CmpOp::Gt, ab, ax);
        let toward = self.u32op(BinaryOp::Sub, yb, 1);
        let t = self.select_raw(away, toward, yb);
        let odd = self.u32op(BinaryOp::Or, t, 1);
        let t = self.select_raw(inexact, odd, t);
        self.bitcast(t, SType::F32)
    }
}

/// The element type of FP8 format `f`.
fn format_of(f: Fp8) -> DType {
    if f == crate::fp8::E4M3FN {
        DType::F8E4M3FN
    } else {
        DType::F8E5M2
    }
}
