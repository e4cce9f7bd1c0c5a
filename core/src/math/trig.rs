//! `sin` and `cos` over the whole f32 domain: `|x| = q pi/2 + r` with `r` kept as a pair
//! `rh + rl` (`|r| <= pi/4`), then a polynomial for `sin(r)` or `cos(r)` picked by `q mod 4`.
//!
//! The reduction is Cody and Waite's for `|x| < 2^16` (three parts of pi/2, the first product
//! exact) and Payne and Hanek's beyond (the bits of 2/pi that matter for `x`, multiplied in
//! integer arithmetic: 24 x 96 bits, of which the integer part mod 4 and 62 fraction bits are
//! kept). Both are computed and one is selected, so every lane runs the same instructions.

use super::*;

/// `sin(r) = r + r^3 S(r^2)` for `|r| <= pi/4`.
const SIN_S: [f32; 4] = [2.7244114e-06, -0.0001984004, 0.008333332, -0.16666667];
/// `cos(r) = 1 - r^2/2 + r^4 C(r^2)` for `|r| <= pi/4`.
const COS_C: [f32; 4] = [-2.7296267e-07, 2.4800564e-05, -0.0013888888, 0.041666668];

/// `pi/2 = PIO2_1 + PIO2_2 + PIO2_3` (each the nearest f32 to what is left).
const PIO2_1: f32 = 1.570_796_4;
const PIO2_2: f32 = -4.371_139e-8;
const PIO2_3: f32 = -1.715_124_5e-15;
const TWO_OVER_PI: f32 = std::f32::consts::FRAC_2_PI;

/// Below this, Cody and Waite's reduction is accurate.
const SMALL: f32 = 65_536.0;

/// The bits of 2/pi after the binary point, 32 per word, behind one word of zeros.
const TWO_OVER_PI_BITS: [u32; 8] =
    [0, 0xA2F9_836E, 0x4E44_1529, 0xFC27_57D1, 0xF534_DDC0, 0xDB62_9599, 0x3C43_9041, 0xFE51_63AB];

/// `pi/2 * 2^-62 = C_HI + C_LO`.
const C_HI: f32 = 3.406_121_7e-19;
const C_LO: f32 = -9.478_396_4e-27;

/// `(q, rh, rl)` for `ax = |x|` below [`SMALL`].
fn reduce_small<M: Arith>(m: &mut M, ax: M::F) -> (M::I, M::F, M::F) {
    let t = m.f(TWO_OVER_PI);
    let t = m.mul(ax, t);
    let k = rne(m, t);
    let nk = m.neg(k);
    let p1 = m.f(PIO2_1);
    // Exact: both terms are multiples of 2^-24 and the difference is below 1.
    let r1 = m.fma(nk, p1, ax);
    let p2 = m.f(PIO2_2);
    let ph = m.mul(k, p2);
    let nph = m.neg(ph);
    let pl = m.fma(k, p2, nph);
    let (rh, e1) = two_sum(m, r1, nph);
    let p3 = m.f(PIO2_3);
    let t = m.sub(e1, pl);
    let rl = m.fma(nk, p3, t);
    let (rh, rl) = fast_two_sum(m, rh, rl);
    (m.f2i(k), rh, rl)
}

/// Word `w + j` of [`TWO_OVER_PI_BITS`] for `w` in `0..=4`, as a u64.
fn word<M: Arith>(m: &mut M, w: M::I, j: usize) -> M::L {
    let mut v = m.l(TWO_OVER_PI_BITS[j] as u64);
    for i in 1..=4 {
        let c = m.i(i as i32);
        let is = m.icmp(CmpOp::Eq, w, c);
        let x = m.l(TWO_OVER_PI_BITS[i + j] as u64);
        v = m.lsel(is, x, v);
    }
    v
}

/// `(q, rh, rl)` for any finite `ax = |x| >= 2^-126` (used from [`SMALL`] up).
fn reduce_large<M: Arith>(m: &mut M, ax: M::F) -> (M::I, M::F, M::F) {
    let ix = m.bits(ax);
    let n23 = m.i(23);
    let be = m.ibin(BinaryOp::Shr, ix, n23);
    let frac = m.i(0x7f_ffff);
    let lead = m.i(0x80_0000);
    let mant = m.ibin(BinaryOp::And, ix, frac);
    let mant = m.ibin(BinaryOp::Or, mant, lead);
    // ax = mant * 2^ex with ex = be - 150; the first bit of 2/pi that matters is ex - 1, at
    // position p = ex + 30 of the padded table (clamped for the unused small inputs).
    let off = m.i(-120);
    let p = m.ibin(BinaryOp::Add, be, off);
    let zero = m.i(0);
    let p = m.ibin(BinaryOp::Max, p, zero);
    let n5 = m.i(5);
    let w = m.ibin(BinaryOp::Shr, p, n5);
    let n31 = m.i(31);
    let b = m.ibin(BinaryOp::And, p, n31);
    let bl = m.i2l(b);
    let words: Vec<M::L> = (0..4).map(|j| word(m, w, j)).collect();
    let (s32, mask32) = (m.l(32), m.l(0xffff_ffff));
    // Three 32-bit windows starting at bit b of word j.
    let win: Vec<M::L> = (0..3)
        .map(|j| {
            let hi = m.lbin(BinaryOp::Shl, words[j], s32);
            let pair = m.lbin(BinaryOp::Or, hi, words[j + 1]);
            let sh = m.lbin(BinaryOp::Shl, pair, bl);
            m.lbin(BinaryOp::Shr, sh, s32)
        })
        .collect();
    let ml = m.i2l(mant);
    let (p0, p1, p2) =
        (m.lbin(BinaryOp::Mul, ml, win[0]), m.lbin(BinaryOp::Mul, ml, win[1]), m.lbin(BinaryOp::Mul, ml, win[2]));
    // The 120-bit product hi:lo = p0 * 2^64 + p1 * 2^32 + p2.
    let p1_lo = m.lbin(BinaryOp::Shl, p1, s32);
    let lo = m.lbin(BinaryOp::Add, p2, p1_lo);
    let carry = m.lcmp(CmpOp::Lt, lo, p1_lo);
    let (one, zero_l) = (m.l(1), m.l(0));
    let carry = m.lsel(carry, one, zero_l);
    let p1_hi = m.lbin(BinaryOp::Shr, p1, s32);
    let hi = m.lbin(BinaryOp::Add, p0, p1_hi);
    let hi = m.lbin(BinaryOp::Add, hi, carry);
    // Bits 94..96 are the quadrant, the 62 below them the fraction.
    let s30 = m.l(30);
    let q = m.lbin(BinaryOp::Shr, hi, s30);
    let fmask = m.l((1 << 30) - 1);
    let fh = m.lbin(BinaryOp::And, hi, fmask);
    let fh = m.lbin(BinaryOp::Shl, fh, s32);
    let fl = m.lbin(BinaryOp::Shr, lo, s32);
    let fl = m.lbin(BinaryOp::And, fl, mask32);
    let fr = m.lbin(BinaryOp::Or, fh, fl);
    // Round to the nearest quadrant: a fraction of one half or more counts from the next.
    let half = m.l(1 << 61);
    let up = m.lcmp(CmpOp::Ge, fr, half);
    let whole = m.l(1 << 62);
    let fr_up = m.lbin(BinaryOp::Sub, fr, whole);
    let fr = m.lsel(up, fr_up, fr);
    let q1 = m.lbin(BinaryOp::Add, q, one);
    let q = m.lsel(up, q1, q);
    let q = m.l2i(q);
    // r = fr * 2^-62 * pi/2, fr as the pair (h + l) first.
    let h = m.l2f_signed(fr);
    let hl = m.f2l_signed(h);
    let rest = m.lbin(BinaryOp::Sub, fr, hl);
    let l = m.l2f_signed(rest);
    let (ch, cl) = (m.f(C_HI), m.f(C_LO));
    let rh = m.mul(h, ch);
    let nrh = m.neg(rh);
    let e = m.fma(h, ch, nrh);
    let t = m.mul(l, ch);
    let t = m.fma(h, cl, t);
    let rl = m.add(e, t);
    let (rh, rl) = fast_two_sum(m, rh, rl);
    (q, rh, rl)
}

/// `(q mod 4, sin(r), cos(r))` for `|x|`.
fn kernel<M: Arith>(m: &mut M, x: M::F) -> (M::I, M::F, M::F) {
    let ax = m.abs(x);
    let (qs, hs, ls) = reduce_small(m, ax);
    let (ql, hl, ll) = reduce_large(m, ax);
    let lim = m.f(SMALL);
    let large = m.cmp(CmpOp::Ge, ax, lim);
    let q = m.isel(large, ql, qs);
    let rh = m.sel(large, hl, hs);
    let rl = m.sel(large, ll, ls);
    let three = m.i(3);
    let q = m.ibin(BinaryOp::And, q, three);
    // sin(rh + rl) = sin(rh) + rl cos(rh); cos(rh + rl) = cos(rh) - rl sin(rh).
    let z = m.mul(rh, rh);
    let nz = m.neg(z);
    let zl = m.fma(rh, rh, nz);
    let s = horner(m, z, &SIN_S);
    let rz = m.mul(rh, z);
    let (mhalf, one) = (m.f(-0.5), m.f(1.0));
    let w = m.fma(mhalf, z, one);
    let lw = m.mul(rl, w);
    let t = m.fma(rz, s, lw);
    let sin = m.add(rh, t);
    let c = horner(m, z, &COS_C);
    let half = m.f(0.5);
    let hz = m.mul(half, z);
    let w = m.sub(one, hz);
    let back = m.sub(one, w);
    let corr = m.sub(back, hz);
    let corr = m.fma(mhalf, zl, corr);
    let z2 = m.mul(z, z);
    let tail = m.fma(z2, c, corr);
    let nrl = m.neg(rl);
    let tail = m.fma(nrl, rh, tail);
    let cos = m.add(w, tail);
    (q, sin, cos)
}

/// The value for quadrant `q` (`0..4`) out of `[v0, v1, -v0, -v1]`.
fn quadrant<M: Arith>(m: &mut M, q: M::I, v0: M::F, v1: M::F) -> M::F {
    let one = m.i(1);
    let zero = m.i(0);
    let odd = m.ibin(BinaryOp::And, q, one);
    let odd = m.icmp(CmpOp::Ne, odd, zero);
    let v = m.sel(odd, v1, v0);
    let two = m.i(2);
    let neg = m.ibin(BinaryOp::And, q, two);
    let neg = m.icmp(CmpOp::Ne, neg, zero);
    let nv = m.neg(v);
    m.sel(neg, nv, v)
}

/// NaN for infinite or NaN `x`, else `y`.
fn finite_or_nan<M: Arith>(m: &mut M, x: M::F, y: M::F) -> M::F {
    let ax = m.abs(x);
    let inf = m.f(f32::INFINITY);
    let finite = m.cmp(CmpOp::Lt, ax, inf);
    let nan = nan(m);
    m.sel(finite, y, nan)
}

/// Sine.
pub fn sin<M: Arith>(m: &mut M, x: M::F) -> M::F {
    let (q, s, c) = kernel(m, x);
    let y = quadrant(m, q, s, c);
    // The sign of x, -0 included.
    let xb = m.bits(x);
    let zero = m.i(0);
    let neg = m.icmp(CmpOp::Lt, xb, zero);
    let ny = m.neg(y);
    let y = m.sel(neg, ny, y);
    finite_or_nan(m, x, y)
}

/// Cosine.
pub fn cos<M: Arith>(m: &mut M, x: M::F) -> M::F {
    let (q, s, c) = kernel(m, x);
    let ns = m.neg(s);
    let y = quadrant(m, q, c, ns);
    finite_or_nan(m, x, y)
}
