//! `pow(x, y)` for f32, computed in f64: `|x|^y = 2^(y log2|x|)` needs `log2|x|` to about 40
//! bits for a result within half an ulp or so, which f64 arithmetic gives without extended
//! f32 tricks; the sign and the special values of IEEE `pow` are applied by selects.

use super::*;

/// `log1p(f) = s (2 + s^2 P(s^2))`, `s = f / (2 + f)`: the series of `2 atanh(s)`.
const ATANH_P: [f64; 9] =
    [2.0 / 19.0, 2.0 / 17.0, 2.0 / 15.0, 2.0 / 13.0, 2.0 / 11.0, 2.0 / 9.0, 2.0 / 7.0, 2.0 / 5.0, 2.0 / 3.0];
/// `2^f = sum (f ln2)^k / k!`, k = 12 down to 0, for `|f| <= 1/2`.
const EXP2_TAYLOR: [f64; 13] = [
    2.5678435993488196e-11,
    4.44553827187081e-10,
    7.054911620801121e-09,
    1.0178086009239696e-07,
    1.3215486790144305e-06,
    1.5252733804059838e-05,
    0.00015403530393381606,
    0.0013333558146428441,
    0.009618129107628477,
    0.055504108664821576,
    0.2402265069591007,
    std::f64::consts::LN_2,
    1.0,
];
/// Bits of the f64 nearest `sqrt(1/2)`.
const SQRT_HALF_BITS: u64 = 0x3fe6_a09e_667f_3bcd;

/// `log2(a)` in f64 for a finite f32 `a > 0`.
fn log2_d<M: Arith>(m: &mut M, a: M::F) -> M::D {
    let dx = m.f2d(a);
    let ib = m.dbits(dx);
    // e with dx = 2^e mm, mm in [sqrt(1/2), sqrt(2)); biased by 1024 so the shift is logical.
    let bias = m.l((1024u64 << 52).wrapping_sub(SQRT_HALF_BITS));
    let t = m.lbin(BinaryOp::Add, ib, bias);
    let s52 = m.l(52);
    let e = m.lbin(BinaryOp::Shr, t, s52);
    let e = m.l2i(e);
    let k1024 = m.i(1024);
    let e = m.ibin(BinaryOp::Sub, e, k1024);
    let el = m.i2l(e);
    let eb = m.lbin(BinaryOp::Shl, el, s52);
    let mb = m.lbin(BinaryOp::Sub, ib, eb);
    let mm = m.dof_bits(mb);
    let one = m.d(1.0);
    let f = m.dsub(mm, one);
    let two = m.d(2.0);
    let den = m.dadd(two, f);
    let s = m.ddiv(f, den);
    let s2 = m.dmul(s, s);
    let p = dhorner(m, s2, &ATANH_P);
    let p = m.dfma(s2, p, two);
    let ln = m.dmul(s, p);
    let l2e = m.d(std::f64::consts::LOG2_E);
    let ed = {
        let ef = m.i2f(e);
        m.f2d(ef)
    };
    m.dfma(ln, l2e, ed)
}

/// `2^t` in f64 for `|t| <= 200`.
fn exp2_d<M: Arith>(m: &mut M, t: M::D) -> M::D {
    let magic = m.d(6_755_399_441_055_744.0); // 1.5 * 2^52
    let n = m.dadd(t, magic);
    let n = m.dsub(n, magic);
    let f = m.dsub(t, n);
    let p = dhorner(m, f, &EXP2_TAYLOR);
    let ni = m.d2i(n);
    let bias = m.i(1023);
    let nb = m.ibin(BinaryOp::Add, ni, bias);
    let nl = m.i2l(nb);
    let s52 = m.l(52);
    let sb = m.lbin(BinaryOp::Shl, nl, s52);
    let s = m.dof_bits(sb);
    m.dmul(p, s)
}

/// `x^y` with the special values of IEEE 754 `pow` (C's `powf`).
pub fn pow<M: Arith>(m: &mut M, x: M::F, y: M::F) -> M::F {
    let ax = m.abs(x);
    let l = log2_d(m, ax);
    let zero = m.f(0.0);
    let inf = m.f(f32::INFINITY);
    let (dzero, dinf, dninf) = (m.d(0.0), m.d(f64::INFINITY), m.d(f64::NEG_INFINITY));
    let _ = dzero;
    let is_zero = m.cmp(CmpOp::Eq, ax, zero);
    let l = m.dsel(is_zero, dninf, l);
    let is_inf = m.cmp(CmpOp::Eq, ax, inf);
    let l = m.dsel(is_inf, dinf, l);
    let yd = m.f2d(y);
    let t = m.dmul(yd, l);
    let (lo, hi) = (m.d(-200.0), m.d(200.0));
    let below = m.dcmp(CmpOp::Lt, t, lo);
    let t = m.dsel(below, lo, t);
    let above = m.dcmp(CmpOp::Gt, t, hi);
    let t = m.dsel(above, hi, t);
    let r = exp2_d(m, t);
    let r = m.d2f(r);
    // Sign: negative x (or -0) to an odd integer power.
    let fy = m.floor(y);
    let yint = m.cmp(CmpOp::Eq, fy, y);
    let ay = m.abs(y);
    let lim = m.f(16_777_216.0);
    let small = m.cmp(CmpOp::Lt, ay, lim);
    let yi = m.f2i(y);
    let one_i = m.i(1);
    let low = m.ibin(BinaryOp::And, yi, one_i);
    let zero_i = m.i(0);
    let odd = m.icmp(CmpOp::Ne, low, zero_i);
    let yodd = m.and(yint, small);
    let yodd = m.and(yodd, odd);
    let xb = m.bits(x);
    let xsign = m.icmp(CmpOp::Lt, xb, zero_i);
    let flip = m.and(xsign, yodd);
    let nr = m.neg(r);
    let r = m.sel(flip, nr, r);
    // A finite negative x to a non-integer power has no real value.
    let neg = m.cmp(CmpOp::Lt, x, zero);
    let finite = m.cmp(CmpOp::Lt, ax, inf);
    let nonint = m.not(yint);
    let bad = m.and(neg, finite);
    let bad = m.and(bad, nonint);
    let r = sel_c(m, bad, f32::NAN, r);
    let (xn, yn) = (is_nan(m, x), is_nan(m, y));
    let anynan = m.or(xn, yn);
    let r = sel_c(m, anynan, f32::NAN, r);
    // pow(+-1, +-inf) = 1, pow(1, y) = 1, pow(x, +-0) = 1 (NaN operands included).
    let one = m.f(1.0);
    let unit = m.cmp(CmpOp::Eq, ax, one);
    let yinf = m.cmp(CmpOp::Eq, ay, inf);
    let c = m.and(unit, yinf);
    let r = m.sel(c, one, r);
    let x1 = m.cmp(CmpOp::Eq, x, one);
    let r = m.sel(x1, one, r);
    let y0 = m.cmp(CmpOp::Eq, y, zero);
    m.sel(y0, one, r)
}
