//! Float remainder (`fmod`: `x - trunc(x / y) y` computed exactly, the sign of `x`), by long
//! division of the integer significands: `x = mx 2^ex`, `y = my 2^ey` with `ex >= ey`, and
//! `mx 2^(ex - ey) mod my` in steps of at most 40 bits (seven steps cover every f32).

use super::*;

/// Bits of quotient per step: `r < 2^24`, so `r << 40` fits a u64.
const STEP: i32 = 40;
const STEPS: i32 = 7;

/// `(biased exponent, at least 1; integer significand)` of `|x|`.
fn split<M: Arith>(m: &mut M, bits: M::I) -> (M::I, M::I) {
    let n23 = m.i(23);
    let be = m.ibin(BinaryOp::Shr, bits, n23);
    let one = m.i(1);
    let normal = m.icmp(CmpOp::Ge, be, one);
    let frac = m.i(0x7f_ffff);
    let mant = m.ibin(BinaryOp::And, bits, frac);
    let lead = m.i(0x80_0000);
    let with = m.ibin(BinaryOp::Or, mant, lead);
    let mant = m.isel(normal, with, mant);
    let be = m.ibin(BinaryOp::Max, be, one);
    (be, mant)
}

/// `x mod y` with the sign of `x` (exact).
pub fn fmod<M: Arith>(m: &mut M, x: M::F, y: M::F) -> M::F {
    let (ax, ay) = (m.abs(x), m.abs(y));
    let (ix, iy) = (m.bits(ax), m.bits(ay));
    let (ex, mx) = split(m, ix);
    let (ey, my) = split(m, iy);
    let d = m.ibin(BinaryOp::Sub, ex, ey);
    let (mxl, myl) = (m.i2l(mx), m.i2l(my));
    // A zero divisor is replaced (its result is NaN anyway) so no division by zero happens.
    let zero_l = m.l(0);
    let one_l = m.l(1);
    let my_zero = m.lcmp(CmpOp::Eq, myl, zero_l);
    let myl = m.lsel(my_zero, one_l, myl);
    let mut r = m.lbin(BinaryOp::Rem, mxl, myl);
    let (zero, step) = (m.i(0), m.i(STEP));
    let mut left = d;
    for _ in 0..STEPS {
        let s = m.ibin(BinaryOp::Min, left, step);
        let s = m.ibin(BinaryOp::Max, s, zero);
        let sl = m.i2l(s);
        let sh = m.lbin(BinaryOp::Shl, r, sl);
        r = m.lbin(BinaryOp::Rem, sh, myl);
        left = m.ibin(BinaryOp::Sub, left, s);
    }
    // r 2^(ey - 150), exact (the true remainder is representable).
    let rf = m.l2f(r);
    let k150 = m.i(150);
    let n = m.ibin(BinaryOp::Sub, ey, k150);
    let res = scale(m, rf, n);
    let res = copysign(m, res, x);
    // |x| < |y| (or y infinite): x itself.
    let less = m.cmp(CmpOp::Lt, ax, ay);
    let res = m.sel(less, x, res);
    // y = 0, x infinite, or a NaN: NaN.
    let fzero = m.f(0.0);
    let yz = m.cmp(CmpOp::Eq, ay, fzero);
    let inf = m.f(f32::INFINITY);
    let xi = m.cmp(CmpOp::Eq, ax, inf);
    let bad = m.or(yz, xi);
    let (xn, yn) = (is_nan(m, x), is_nan(m, y));
    let bad = m.or(bad, xn);
    let bad = m.or(bad, yn);
    sel_c(m, bad, f32::NAN, res)
}
