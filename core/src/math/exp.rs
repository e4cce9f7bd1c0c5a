//! `exp2`, `exp` and `expm1`: `x = n + f` (or `n ln2 + r`), a polynomial for the fraction, and
//! a scaling by `2^n` in two exact power-of-two factors (one rounding, subnormals included).

use super::*;

/// `2^f = 1 + f q(f)` on `[-1/2, 1/2]`.
const EXP2_Q: [f32; 7] =
    [1.525272e-05, 0.0001546133, 0.001333367, 0.009618057, 0.055504106, 0.2402265, std::f32::consts::LN_2];

/// `e^r = 1 + r + r^2 q(r)` on `[-ln2/2, ln2/2]`.
const EXP_Q: [f32; 6] = [0.00019857803, 0.0013933604, 0.008333361, 0.041666467, 0.16666667, 0.5];

pub(super) const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln 2 = LN2_HI + LN2_LO`, `LN2_HI` the nearest f32.
const LN2_HI: f32 = std::f32::consts::LN_2;
const LN2_LO: f32 = -1.904_654_2e-9;

/// `2^x`.
pub fn exp2<M: Arith>(m: &mut M, x: M::F) -> M::F {
    let xc = clamp(m, x, -151.0, 129.0);
    let n = rne(m, xc);
    let f = m.sub(xc, n);
    let q = horner(m, f, &EXP2_Q);
    let one = m.f(1.0);
    let p = m.fma(f, q, one);
    let ni = m.f2i(n);
    let r = scale(m, p, ni);
    let nan = is_nan(m, x);
    m.sel(nan, x, r)
}

/// `x = k ln2 + r` with `|r| <= ln2/2` (Cody and Waite; the first step is exact): `(k, r)`.
fn reduce<M: Arith>(m: &mut M, x: M::F) -> (M::F, M::F) {
    let l2e = m.f(LOG2E);
    let t = m.mul(x, l2e);
    let k = rne(m, t);
    let nk = m.neg(k);
    let (hi, lo) = (m.f(LN2_HI), m.f(LN2_LO));
    let r = m.fma(nk, hi, x);
    let r = m.fma(nk, lo, r);
    (k, r)
}

/// `e^r - 1` for `|r| <= ln2/2`: `r + r^2 q(r)`.
fn expm1_reduced<M: Arith>(m: &mut M, r: M::F) -> M::F {
    let q = horner(m, r, &EXP_Q);
    let r2 = m.mul(r, r);
    m.fma(r2, q, r)
}

/// `e^x`.
pub fn exp<M: Arith>(m: &mut M, x: M::F) -> M::F {
    let xc = clamp(m, x, -104.0, 89.0);
    let (k, r) = reduce(m, xc);
    let p = expm1_reduced(m, r);
    let one = m.f(1.0);
    let e = m.add(one, p);
    let ki = m.f2i(k);
    let y = scale(m, e, ki);
    let nan = is_nan(m, x);
    m.sel(nan, x, y)
}

/// `e^x` for `x <= 0` as an unevaluated pair `hi + lo` (the rounding of `1 + p` kept), for
/// callers that need more than one rounding's accuracy. NaN gives NaN in `hi`.
pub(super) fn exp_pair<M: Arith>(m: &mut M, x: M::F) -> (M::F, M::F) {
    let xc = clamp(m, x, -104.0, 89.0);
    let (k, r) = reduce(m, xc);
    let p = expm1_reduced(m, r);
    let one = m.f(1.0);
    let (h, l) = fast_two_sum(m, one, p);
    let ki = m.f2i(k);
    let hi = scale(m, h, ki);
    let lo = scale(m, l, ki);
    let nan = is_nan(m, x);
    (m.sel(nan, x, hi), lo)
}

/// `e^x - 1`, accurate near 0: `2^k (1 + p) - 1 = 2^k p + (2^k - 1)` with `2^k - 1` kept exact
/// as a pair.
pub fn expm1<M: Arith>(m: &mut M, x: M::F) -> M::F {
    let xc = clamp(m, x, -30.0, 89.0);
    let (k, r) = reduce(m, xc);
    let p = expm1_reduced(m, r);
    let ki = m.f2i(k);
    // Moderate k: s = 2^k exactly, (hi, lo) = s - 1 exactly.
    let cap = m.i(63);
    let kc = m.ibin(BinaryOp::Min, ki, cap);
    let s = pow2i(m, kc);
    let m1 = m.f(-1.0);
    let (hi, lo) = two_sum(m, s, m1);
    let t = m.fma(s, p, lo);
    let moderate = m.add(t, hi);
    // Large k: the -1 is far below an ulp.
    let one = m.f(1.0);
    let e = m.add(one, p);
    let large = scale(m, e, ki);
    let big = m.icmp(CmpOp::Gt, ki, cap);
    let y = m.sel(big, large, moderate);
    let nan = is_nan(m, x);
    m.sel(nan, x, y)
}
