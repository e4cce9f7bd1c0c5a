//! Fast math: the elementary functions through the hardware approximations ([`ApproxFn`]),
//! as a kernel with `fast_math = true` gets them. Functions without a cheap approximation
//! (`erf`, `log1p`, `expm1`, `pow`, float remainder) keep their accurate definitions.

use super::exp::LOG2E;
use super::*;

/// `tanh(x) = x + x^3 T(x^2)` near 0 (the accurate definition's polynomial, cheap enough).
const TANH_T: [f32; 4] = [0.021865645, -0.05396806, 0.13333333, -0.33333334];

/// The fast-math definition of a unary op (`None`: use the accurate one).
pub fn fast_unary<M: Arith>(m: &mut M, op: UnaryOp, x: M::F) -> Option<M::F> {
    Some(match op {
        UnaryOp::Exp => {
            let l = m.f(LOG2E);
            let t = m.mul(x, l);
            m.approx(ApproxFn::Exp2, t)
        }
        UnaryOp::Exp2 => m.approx(ApproxFn::Exp2, x),
        UnaryOp::Log => {
            let l = m.approx(ApproxFn::Log2, x);
            let ln2 = m.f(std::f32::consts::LN_2);
            m.mul(l, ln2)
        }
        UnaryOp::Log2 => m.approx(ApproxFn::Log2, x),
        UnaryOp::Sin => m.approx(ApproxFn::Sin, x),
        UnaryOp::Cos => m.approx(ApproxFn::Cos, x),
        UnaryOp::Rsqrt => m.approx(ApproxFn::Rsqrt, x),
        UnaryOp::Sigmoid => {
            let l = m.f(-LOG2E);
            let t = m.mul(x, l);
            let e = m.approx(ApproxFn::Exp2, t);
            let one = m.f(1.0);
            let d = m.add(one, e);
            m.approx(ApproxFn::Rcp, d)
        }
        UnaryOp::Tanh => {
            // 1 - 2 / (e^(2|x|) + 1) with the sign of x; a short polynomial below 0.125 where
            // the formula cancels.
            let ax = m.abs(x);
            let l = m.f(2.0 * LOG2E);
            let t = m.mul(ax, l);
            let e = m.approx(ApproxFn::Exp2, t);
            let one = m.f(1.0);
            let d = m.add(e, one);
            let r = m.approx(ApproxFn::Rcp, d);
            let m2 = m.f(-2.0);
            let big = m.fma(m2, r, one);
            let big = copysign(m, big, x);
            let z = m.mul(x, x);
            let p = horner(m, z, &TANH_T);
            let xz = m.mul(x, z);
            let small = m.fma(xz, p, x);
            let cut = m.f(0.125);
            let is_small = m.cmp(CmpOp::Lt, ax, cut);
            m.sel(is_small, small, big)
        }
        _ => return None,
    })
}
