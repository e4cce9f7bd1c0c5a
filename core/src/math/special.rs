//! `tanh`, `sigmoid`, `erf` (the GELU, SiLU and softplus epilogues) and `rsqrt`.

use super::exp::{exp, exp_pair, expm1};
use super::*;

/// `tanh(x) = x + x^3 T(x^2)` for `|x| < 0.55`.
const TANH_T: [f32; 7] = [-0.0009655463, 0.0034047307, -0.008826124, 0.021865645, -0.05396806, 0.13333333, -0.33333334];
/// `erf(x) = x + x E(x^2)` for `|x| < 0.875`.
const ERF_E: [f32; 8] =
    [-1.0697875e-05, 0.000115613526, -0.00085173437, 0.0052228877, -0.026865961, 0.112837896, -0.37612638, 0.12837917];
/// `erfc(x) = exp(-x^2) R(x - ERFC_C)` for `0.875 <= x < 4`.
const ERFC_C: f32 = 2.4375;
const ERFC_R: [f32; 15] = [
    3.256616e-08,
    6.00331e-08,
    8.353933e-08,
    -6.132315e-07,
    9.587956e-07,
    -4.7856697e-06,
    1.9063056e-05,
    -6.72789e-05,
    0.00023840278,
    -0.0008179507,
    0.0027091638,
    -0.00864802,
    0.026497958,
    -0.077560835,
    0.21555248,
];

/// Hyperbolic tangent: an odd polynomial near 0, else `em / (em + 2)` with `em = expm1(2|x|)`.
pub fn tanh<M: Arith>(m: &mut M, x: M::F) -> M::F {
    let z = m.mul(x, x);
    let t = horner(m, z, &TANH_T);
    let xz = m.mul(x, z);
    let small = m.fma(xz, t, x);
    let ax = m.abs(x);
    let two = m.f(2.0);
    let a2 = m.mul(ax, two);
    let em = expm1(m, a2);
    let den = m.add(em, two);
    let big = m.div(em, den);
    let big = copysign(m, big, x);
    let lim = m.f(9.1);
    let sat = m.cmp(CmpOp::Ge, ax, lim);
    let one = m.f(1.0);
    let one = copysign(m, one, x);
    let big = m.sel(sat, one, big);
    let cut = m.f(0.55);
    let is_small = m.cmp(CmpOp::Lt, ax, cut);
    m.sel(is_small, small, big)
}

/// The logistic function `1 / (1 + e^-x)`, written `e^x / (1 + e^x)` for negative `x` so that
/// small results keep their relative accuracy. `e = e^-|x|` is a pair `eh + el`, `1 + eh` is
/// kept exact as `s + t`, and the quotients by `s` are corrected for `t + el`.
pub fn sigmoid<M: Arith>(m: &mut M, x: M::F) -> M::F {
    let ax = m.abs(x);
    let nax = m.neg(ax);
    let (eh, el) = exp_pair(m, nax);
    let one = m.f(1.0);
    let (s, t) = fast_two_sum(m, one, eh);
    let u = m.add(t, el);
    // 1 / (s + u) = q (1 - u q) with q = 1 / s.
    let q = m.div(one, s);
    let uq = m.mul(u, q);
    let nuq = m.neg(uq);
    let pos = m.fma(nuq, q, q);
    // (eh + el) / (s + u) = r + q (el - r u) with r = eh / s.
    let r = m.div(eh, s);
    let nr = m.neg(r);
    let v = m.fma(nr, u, el);
    let neg = m.fma(q, v, r);
    let zero = m.f(0.0);
    let is_neg = m.cmp(CmpOp::Lt, x, zero);
    m.sel(is_neg, neg, pos)
}

/// The error function: `x + x E(x^2)` near 0, `1 - exp(-x^2) R(x)` up to 4 (the square kept
/// exact as a pair), 1 beyond; odd.
pub fn erf<M: Arith>(m: &mut M, x: M::F) -> M::F {
    let z = m.mul(x, x);
    let e = horner(m, z, &ERF_E);
    let small = m.fma(x, e, x);
    let ax = m.abs(x);
    let z = m.mul(ax, ax);
    let nz = m.neg(z);
    let zl = m.fma(ax, ax, nz);
    let ez = exp(m, nz);
    let nzl = m.neg(zl);
    let ez = m.fma(ez, nzl, ez);
    let c = m.f(ERFC_C);
    let t = m.sub(ax, c);
    let r = horner(m, t, &ERFC_R);
    let erfc = m.mul(ez, r);
    let one = m.f(1.0);
    let mid = m.sub(one, erfc);
    let four = m.f(4.0);
    let below = m.cmp(CmpOp::Lt, ax, four);
    let mid = m.sel(below, mid, one);
    let mid = copysign(m, mid, x);
    let cut = m.f(0.875);
    let is_small = m.cmp(CmpOp::Lt, ax, cut);
    let y = m.sel(is_small, small, mid);
    let nan = is_nan(m, x);
    m.sel(nan, x, y)
}

/// `1 / sqrt(x)`: the quotient of two correctly rounded operations (neither can overflow or
/// underflow for f32 inputs; `rsqrt(-0) = -inf`).
pub fn rsqrt<M: Arith>(m: &mut M, x: M::F) -> M::F {
    let s = m.sqrt(x);
    let one = m.f(1.0);
    m.div(one, s)
}
