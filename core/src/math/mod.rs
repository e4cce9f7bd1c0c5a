//! Elementary functions, defined once for every backend.
//!
//! Each function of the tile IR that no GPU computes exactly in one instruction (`exp`, `log`,
//! `sin`, `erf`, `pow`, float remainder, ..) is written here as a *branch-free sequence of
//! IEEE operations*: range reduction and polynomials evaluated with fused multiply-add, with
//! special cases chosen by selects, so that every lane of a warp runs the same instructions.
//! The sequences are generic over an [`Arith`] evaluator:
//!
//! * the SIMT lowering (`core::simt::lower`) instantiates them with an evaluator that *emits*
//!   SIMT instructions, so the PTX writer and the AMD writer inherit the same code;
//! * [`native::Native`] evaluates them with Rust's own `f32`/`f64`/integer arithmetic: the CPU
//!   interpreter uses it, and so do the exhaustive accuracy runs (`cargo xtask math`).
//!
//! Because the primitives are correctly rounded everywhere (add, sub, mul, div, sqrt, fma,
//! conversions), every backend returns *bit-identical* results for these functions, and the
//! accuracy measured once on the host over all 2^32 f32 inputs holds on every GPU.
//!
//! Accuracy (f32, default mode; `docs/ACCURACY.md`): the bound is 2 ulp of the correctly
//! rounded result over the whole f32 domain; measured over every f32 input, each function is
//! within 1 ulp. `sqrt` and float remainder are exact; `pow` is evaluated in f64 internally
//! (within 1 ulp). f16/bf16 results are these f32 results rounded once more.
//!
//! Polynomial coefficients come from `scripts/fit_math.py` (weighted minimax, Remez exchange,
//! rounded to f32).

pub mod native;

mod exp;
mod fast;
mod fmod;
mod log;
mod pow;
mod special;
mod trig;

pub use exp::{exp, exp2, expm1};
pub use fast::fast_unary;
pub use fmod::fmod;
pub use log::{log, log1p, log2};
pub use pow::pow;
pub use special::{erf, rsqrt, sigmoid, tanh};
pub use trig::{cos, sin};

use crate::ir::{BinaryOp, CmpOp, UnaryOp};

/// The operations the function definitions are written in.
///
/// Every float operation rounds to nearest even and keeps subnormals (no flush to zero). Shift
/// amounts are below the operand width; integer arithmetic wraps. `F` is f32, `D` f64, `I` i32,
/// `L` u64 and `B` a predicate.
pub trait Arith {
    type F: Copy;
    type D: Copy;
    type I: Copy;
    type L: Copy;
    type B: Copy;

    // f32
    fn f(&mut self, c: f32) -> Self::F;
    fn add(&mut self, a: Self::F, b: Self::F) -> Self::F;
    fn sub(&mut self, a: Self::F, b: Self::F) -> Self::F;
    fn mul(&mut self, a: Self::F, b: Self::F) -> Self::F;
    /// Correctly rounded division.
    fn div(&mut self, a: Self::F, b: Self::F) -> Self::F;
    /// `a * b + c` with one rounding.
    fn fma(&mut self, a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// Correctly rounded square root.
    fn sqrt(&mut self, a: Self::F) -> Self::F;
    fn floor(&mut self, a: Self::F) -> Self::F;
    fn abs(&mut self, a: Self::F) -> Self::F;
    /// IEEE minNum / maxNum: a NaN operand gives the other one; of two zeros, either.
    fn fmin(&mut self, a: Self::F, b: Self::F) -> Self::F;
    fn fmax(&mut self, a: Self::F, b: Self::F) -> Self::F;
    fn neg(&mut self, a: Self::F) -> Self::F;
    /// IEEE comparison: false when either side is NaN, except `ne`.
    fn cmp(&mut self, op: CmpOp, a: Self::F, b: Self::F) -> Self::B;
    fn sel(&mut self, c: Self::B, a: Self::F, b: Self::F) -> Self::F;
    fn bits(&mut self, a: Self::F) -> Self::I;
    fn of_bits(&mut self, a: Self::I) -> Self::F;
    /// Truncation toward zero, saturating; NaN gives 0.
    fn f2i(&mut self, a: Self::F) -> Self::I;
    fn i2f(&mut self, a: Self::I) -> Self::F;
    /// u64 (below 2^24, so exact) to f32.
    fn l2f(&mut self, a: Self::L) -> Self::F;
    /// The u64 bit pattern read as i64, to f32 (rounded).
    fn l2f_signed(&mut self, a: Self::L) -> Self::F;
    /// f32 (an integer below 2^62 in magnitude) to i64, as a u64 bit pattern.
    fn f2l_signed(&mut self, a: Self::F) -> Self::L;

    // f64
    fn d(&mut self, c: f64) -> Self::D;
    fn dadd(&mut self, a: Self::D, b: Self::D) -> Self::D;
    fn dsub(&mut self, a: Self::D, b: Self::D) -> Self::D;
    fn dmul(&mut self, a: Self::D, b: Self::D) -> Self::D;
    fn ddiv(&mut self, a: Self::D, b: Self::D) -> Self::D;
    fn dfma(&mut self, a: Self::D, b: Self::D, c: Self::D) -> Self::D;
    fn dcmp(&mut self, op: CmpOp, a: Self::D, b: Self::D) -> Self::B;
    fn dsel(&mut self, c: Self::B, a: Self::D, b: Self::D) -> Self::D;
    fn dbits(&mut self, a: Self::D) -> Self::L;
    fn dof_bits(&mut self, a: Self::L) -> Self::D;
    fn f2d(&mut self, a: Self::F) -> Self::D;
    fn d2f(&mut self, a: Self::D) -> Self::F;
    /// Truncation toward zero, saturating; NaN gives 0.
    fn d2i(&mut self, a: Self::D) -> Self::I;

    // i32
    fn i(&mut self, c: i32) -> Self::I;
    fn ibin(&mut self, op: BinaryOp, a: Self::I, b: Self::I) -> Self::I;
    /// Signed comparison.
    fn icmp(&mut self, op: CmpOp, a: Self::I, b: Self::I) -> Self::B;
    fn isel(&mut self, c: Self::B, a: Self::I, b: Self::I) -> Self::I;
    /// Zero-extends the 32-bit pattern.
    fn i2l(&mut self, a: Self::I) -> Self::L;
    /// The low 32 bits.
    fn l2i(&mut self, a: Self::L) -> Self::I;

    // u64
    fn l(&mut self, c: u64) -> Self::L;
    /// `Div`/`Rem` take a nonzero divisor; `Shr` is logical.
    fn lbin(&mut self, op: BinaryOp, a: Self::L, b: Self::L) -> Self::L;
    /// Unsigned comparison.
    fn lcmp(&mut self, op: CmpOp, a: Self::L, b: Self::L) -> Self::B;
    fn lsel(&mut self, c: Self::B, a: Self::L, b: Self::L) -> Self::L;

    // predicates
    fn and(&mut self, a: Self::B, b: Self::B) -> Self::B;
    fn or(&mut self, a: Self::B, b: Self::B) -> Self::B;
    fn not(&mut self, a: Self::B) -> Self::B;

    /// A hardware approximation (fast math).
    fn approx(&mut self, f: ApproxFn, a: Self::F) -> Self::F;
}

/// The f32 approximations GPUs compute in one instruction, which fast math may use
/// (PTX `ex2.approx.f32`, `lg2.approx.f32`, `sin.approx.f32`, `cos.approx.f32`,
/// `rsqrt.approx.f32`, `rcp.approx.f32`; AMD `v_exp_f32`, `v_log_f32`, `v_sin_f32`, `v_cos_f32`,
/// `v_rsq_f32`, `v_rcp_f32`). Their errors are the vendors' (measured ones in
/// `docs/ACCURACY.md`); the host evaluates them correctly rounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ApproxFn {
    Exp2,
    Log2,
    Sin,
    Cos,
    Rsqrt,
    Rcp,
}

/// The functions of one float argument this module defines (tile-IR unary ops).
pub fn is_expanded(op: UnaryOp) -> bool {
    matches!(
        op,
        UnaryOp::Exp
            | UnaryOp::Exp2
            | UnaryOp::Expm1
            | UnaryOp::Log
            | UnaryOp::Log2
            | UnaryOp::Log1p
            | UnaryOp::Sin
            | UnaryOp::Cos
            | UnaryOp::Tanh
            | UnaryOp::Sigmoid
            | UnaryOp::Erf
            | UnaryOp::Rsqrt
    )
}

/// The accurate f32 definition of a unary op (`None` for ops that are one primitive).
pub fn unary<M: Arith>(m: &mut M, op: UnaryOp, x: M::F) -> Option<M::F> {
    Some(match op {
        UnaryOp::Exp => exp(m, x),
        UnaryOp::Exp2 => exp2(m, x),
        UnaryOp::Expm1 => expm1(m, x),
        UnaryOp::Log => log(m, x),
        UnaryOp::Log2 => log2(m, x),
        UnaryOp::Log1p => log1p(m, x),
        UnaryOp::Sin => sin(m, x),
        UnaryOp::Cos => cos(m, x),
        UnaryOp::Tanh => tanh(m, x),
        UnaryOp::Sigmoid => sigmoid(m, x),
        UnaryOp::Erf => erf(m, x),
        UnaryOp::Rsqrt => rsqrt(m, x),
        _ => return None,
    })
}

// --- helpers shared by the definitions ---

/// Horner's rule with FMA; `cs` highest degree first.
fn horner<M: Arith>(m: &mut M, x: M::F, cs: &[f32]) -> M::F {
    let mut p = m.f(cs[0]);
    for &c in &cs[1..] {
        let c = m.f(c);
        p = m.fma(p, x, c);
    }
    p
}

fn dhorner<M: Arith>(m: &mut M, x: M::D, cs: &[f64]) -> M::D {
    let mut p = m.d(cs[0]);
    for &c in &cs[1..] {
        let c = m.d(c);
        p = m.dfma(p, x, c);
    }
    p
}

fn is_nan<M: Arith>(m: &mut M, x: M::F) -> M::B {
    m.cmp(CmpOp::Ne, x, x)
}

fn nan<M: Arith>(m: &mut M) -> M::F {
    m.f(f32::NAN)
}

/// `x` where `c`, else `y` (a constant).
fn sel_c<M: Arith>(m: &mut M, c: M::B, k: f32, y: M::F) -> M::F {
    let k = m.f(k);
    m.sel(c, k, y)
}

/// `x` clamped to `[lo, hi]` by minNum/maxNum (a NaN becomes `lo`: callers select NaN back).
fn clamp<M: Arith>(m: &mut M, x: M::F, lo: f32, hi: f32) -> M::F {
    let (l, h) = (m.f(lo), m.f(hi));
    let x = m.fmax(x, l);
    m.fmin(x, h)
}

/// Round to the nearest integer (ties to even) for `|x| < 2^22`, by the magic-number trick.
fn rne<M: Arith>(m: &mut M, x: M::F) -> M::F {
    let magic = m.f(12_582_912.0); // 1.5 * 2^23
    let t = m.add(x, magic);
    m.sub(t, magic)
}

/// `2^n` for an integer `n` in `[-126, 127]`.
fn pow2i<M: Arith>(m: &mut M, n: M::I) -> M::F {
    let bias = m.i(127);
    let e = m.ibin(BinaryOp::Add, n, bias);
    let sh = m.i(23);
    let b = m.ibin(BinaryOp::Shl, e, sh);
    m.of_bits(b)
}

/// `x * 2^n` for `n` in `[-252, 254]`, rounded once (two exact power-of-two factors).
fn scale<M: Arith>(m: &mut M, x: M::F, n: M::I) -> M::F {
    let one = m.i(1);
    let n1 = m.ibin(BinaryOp::Shr, n, one);
    let n2 = m.ibin(BinaryOp::Sub, n, n1);
    let (s1, s2) = (pow2i(m, n1), pow2i(m, n2));
    let t = m.mul(x, s1);
    m.mul(t, s2)
}

/// `a + b` as an unevaluated pair `(s, e)` with `s + e` exact (Knuth's TwoSum).
fn two_sum<M: Arith>(m: &mut M, a: M::F, b: M::F) -> (M::F, M::F) {
    let s = m.add(a, b);
    let bv = m.sub(s, a);
    let av = m.sub(s, bv);
    let eb = m.sub(b, bv);
    let ea = m.sub(a, av);
    (s, m.add(ea, eb))
}

/// `a + b` as `(s, e)`, exact when `|a| >= |b|` (Dekker's Fast2Sum).
fn fast_two_sum<M: Arith>(m: &mut M, a: M::F, b: M::F) -> (M::F, M::F) {
    let s = m.add(a, b);
    let z = m.sub(s, a);
    (s, m.sub(b, z))
}

/// `x` with the sign of `s` (`copysign`).
fn copysign<M: Arith>(m: &mut M, x: M::F, s: M::F) -> M::F {
    let (xb, sb) = (m.bits(x), m.bits(s));
    let (mag, sign) = (m.i(0x7fff_ffff), m.i(i32::MIN));
    let xb = m.ibin(BinaryOp::And, xb, mag);
    let sb = m.ibin(BinaryOp::And, sb, sign);
    let b = m.ibin(BinaryOp::Or, xb, sb);
    m.of_bits(b)
}
