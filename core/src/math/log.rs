//! `log`, `log2` and `log1p`: `x = 2^e m` with `m` in `[sqrt(1/2), sqrt(2))`, `f = m - 1`
//! (exact), `log1p(f) = f + c` with `c = f^2 Q(f)` small next to `f`, so that the leading term
//! carries no rounding error.

use super::*;

/// `log1p(f) = f + f^2 Q(f)` on `[sqrt(1/2) - 1, sqrt(2) - 1]`.
const LOG1P_Q: [f32; 11] = [
    -0.0610983,
    0.10648257,
    -0.10759024,
    0.11026049,
    -0.12432241,
    0.14286414,
    -0.16669038,
    0.20000038,
    -0.2499997,
    0.33333334,
    -0.5,
];

/// `ln 2` split so that `e * LN2_HI` is exact for `|e| < 2^8`.
const LN2_HI: f32 = 0.693_145_75;
const LN2_LO: f32 = 1.428_606_8e-6;
/// `log2(e) = L2E_HI + L2E_LO`.
const L2E_HI: f32 = std::f32::consts::LOG2_E;
const L2E_LO: f32 = 1.925_963e-8;
/// Bits of the f32 nearest `sqrt(1/2)`.
const SQRT_HALF_BITS: i32 = 0x3f35_04f3;

/// `(e, f, c)` with `x = 2^e (1 + f)`, `log1p(f) = f + c`, for finite `x > 0`.
pub(super) fn parts<M: Arith>(m: &mut M, x: M::F) -> (M::F, M::F, M::F) {
    // Subnormals: scale by 2^23 first.
    let min_normal = m.f(f32::MIN_POSITIVE);
    let tiny = m.cmp(CmpOp::Lt, x, min_normal);
    let up = m.f(8_388_608.0);
    let xu = m.mul(x, up);
    let xs = m.sel(tiny, xu, x);
    let ix = m.bits(xs);
    let sh = m.i(SQRT_HALF_BITS);
    let t = m.ibin(BinaryOp::Sub, ix, sh);
    let n23 = m.i(23);
    let e = m.ibin(BinaryOp::Shr, t, n23);
    let eb = m.ibin(BinaryOp::Shl, e, n23);
    let mb = m.ibin(BinaryOp::Sub, ix, eb);
    let mm = m.of_bits(mb);
    let one = m.f(1.0);
    let f = m.sub(mm, one);
    let ef = m.i2f(e);
    let adj = m.f(23.0);
    let ef_tiny = m.sub(ef, adj);
    let ef = m.sel(tiny, ef_tiny, ef);
    let q = horner(m, f, &LOG1P_Q);
    let f2 = m.mul(f, f);
    let c = m.mul(f2, q);
    (ef, f, c)
}

/// The special values of a logarithm: `log(0) = -inf`, `log(x < 0) = NaN`, `log(inf) = inf`,
/// NaN stays NaN.
fn specials<M: Arith>(m: &mut M, x: M::F, y: M::F) -> M::F {
    let zero = m.f(0.0);
    let is_zero = m.cmp(CmpOp::Eq, x, zero);
    let y = sel_c(m, is_zero, f32::NEG_INFINITY, y);
    let neg = m.cmp(CmpOp::Lt, x, zero);
    let y = sel_c(m, neg, f32::NAN, y);
    let inf = m.f(f32::INFINITY);
    let is_inf = m.cmp(CmpOp::Eq, x, inf);
    let y = m.sel(is_inf, inf, y);
    let nan = is_nan(m, x);
    m.sel(nan, x, y)
}

/// `e ln2 + f + c + extra`, rounded once at the end but for the sum of the small terms.
fn combine_ln<M: Arith>(m: &mut M, e: M::F, f: M::F, c: M::F) -> M::F {
    let lo = m.f(LN2_LO);
    let tail = m.fma(e, lo, c);
    let s = m.add(f, tail);
    let hi = m.f(LN2_HI);
    m.fma(e, hi, s)
}

/// Natural logarithm.
pub fn log<M: Arith>(m: &mut M, x: M::F) -> M::F {
    let (e, f, c) = parts(m, x);
    let y = combine_ln(m, e, f, c);
    specials(m, x, y)
}

/// Base-2 logarithm: `e + (f + c) log2(e)`, the product kept to one rounding.
pub fn log2<M: Arith>(m: &mut M, x: M::F) -> M::F {
    let (e, f, c) = parts(m, x);
    let (hi, lo) = (m.f(L2E_HI), m.f(L2E_LO));
    let ch = m.mul(c, hi);
    let t = m.fma(f, lo, ch);
    let s = m.fma(f, hi, t);
    let y = m.add(e, s);
    specials(m, x, y)
}

/// `log(1 + x)`, accurate near 0: the polynomial directly where `1 + x` is in the reduced
/// range, else `log(u) + err / u` with `u + err = 1 + x` exactly.
pub fn log1p<M: Arith>(m: &mut M, x: M::F) -> M::F {
    // Direct.
    let q = horner(m, x, &LOG1P_Q);
    let x2 = m.mul(x, x);
    let direct = m.fma(x2, q, x);
    // Through log(u).
    let one = m.f(1.0);
    let (u, err) = two_sum(m, one, x);
    let (e, f, c) = parts(m, u);
    let corr = m.div(err, u);
    let c = m.add(c, corr);
    let general = combine_ln(m, e, f, c);
    let (lo, hi) = (m.f(-0.2928), m.f(0.4142));
    let above = m.cmp(CmpOp::Ge, x, lo);
    let below = m.cmp(CmpOp::Le, x, hi);
    let inside = m.and(above, below);
    let y = m.sel(inside, direct, general);
    // Specials in terms of u = 1 + x (x = -1 gives -inf, x < -1 NaN).
    let m1 = m.f(-1.0);
    let at = m.cmp(CmpOp::Eq, x, m1);
    let y = sel_c(m, at, f32::NEG_INFINITY, y);
    let under = m.cmp(CmpOp::Lt, x, m1);
    let y = sel_c(m, under, f32::NAN, y);
    let inf = m.f(f32::INFINITY);
    let is_inf = m.cmp(CmpOp::Eq, x, inf);
    let y = m.sel(is_inf, inf, y);
    let nan = is_nan(m, x);
    m.sel(nan, x, y)
}
