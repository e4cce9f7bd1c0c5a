//! Element values of every dtype as exact bit patterns, and the inputs the differential test
//! draws: each type's edge values first, then random ones.

use half::{bf16, f16};
use rand::Rng;
use trident_core::ir::DType;

/// An element as the host reference sees it: a float's exact value, an integer's exact value
/// (`i1` as 0 or 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum V {
    F(f64),
    I(i128),
}

impl V {
    pub fn f(self) -> f64 {
        match self {
            V::F(x) => x,
            V::I(i) => i as f64,
        }
    }

    pub fn i(self) -> i128 {
        match self {
            V::I(i) => i,
            V::F(x) => x as i128,
        }
    }
}

/// The value of the low `size` bytes of `bits` as a `d`.
pub fn decode(bits: u64, d: DType) -> V {
    match d {
        DType::F16 => V::F(f16::from_bits(bits as u16).to_f64()),
        DType::BF16 => V::F(bf16::from_bits(bits as u16).to_f64()),
        DType::F32 => V::F(f32::from_bits(bits as u32) as f64),
        DType::F64 => V::F(f64::from_bits(bits)),
        DType::F8E4M3FN | DType::F8E5M2 => {
            let b = bits as u8;
            let m = fp8_magnitudes(d).get(usize::from(b & 0x7F)).copied().unwrap_or(f64::NAN);
            V::F(if b & 0x80 != 0 { -m } else { m })
        }
        DType::I1 => V::I((bits & 1) as i128),
        DType::I8 => V::I(bits as u8 as i8 as i128),
        DType::U8 => V::I(bits as u8 as i128),
        DType::I16 => V::I(bits as u16 as i16 as i128),
        DType::U16 => V::I(bits as u16 as i128),
        DType::I32 => V::I(bits as u32 as i32 as i128),
        DType::U32 => V::I(bits as u32 as i128),
        DType::I64 => V::I(bits as i64 as i128),
        DType::U64 => V::I(bits as i128),
    }
}

/// The OCP 8-bit formats as (significand bits with the hidden one, smallest normal exponent,
/// largest exponent, largest finite value), written from the OCP specification independently of
/// `trident_core::fp8`, which the backends use.
fn fp8_format(d: DType) -> (i32, i32, i32, f64) {
    match d {
        DType::F8E4M3FN => (4, -6, 8, 448.0),
        _ => (3, -14, 15, 57344.0),
    }
}

/// The value of an 8-bit float's bits (E4M3FN: S.1111.111 is NaN, no infinities; E5M2:
/// IEEE-like).
fn fp8_value(b: u8, d: DType) -> f64 {
    let (p, emin, _, _) = fp8_format(d);
    let man_bits = p - 1;
    let exp_bits = 7 - man_bits;
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((b & 0x7F) >> man_bits) as i32;
    let m = (b & ((1 << man_bits) - 1)) as f64;
    let top = (1 << exp_bits) - 1;
    match d {
        DType::F8E4M3FN if b & 0x7F == 0x7F => f64::NAN,
        DType::F8E5M2 if e == top && m == 0.0 => sign * f64::INFINITY,
        DType::F8E5M2 if e == top => f64::NAN,
        _ if e == 0 => sign * m * 2f64.powi(emin - man_bits),
        _ => sign * (1.0 + m / 2f64.powi(man_bits)) * 2f64.powi(e - 1 + emin),
    }
}

/// The values of the codes 0x00..=0x7E of `d` (increasing; 0x7F is E4M3FN's NaN, E5M2's
/// largest NaN), computed once by [`fp8_value`]: host data of a large benchmark converts
/// hundreds of millions of values.
fn fp8_magnitudes(d: DType) -> &'static [f64] {
    static TABLES: std::sync::OnceLock<[Vec<f64>; 2]> = std::sync::OnceLock::new();
    let t =
        TABLES.get_or_init(|| [DType::F8E4M3FN, DType::F8E5M2].map(|d| (0u8..0x7F).map(|c| fp8_value(c, d)).collect()));
    let t = &t[usize::from(d == DType::F8E5M2)];
    // E5M2's codes past infinity (0x7C) are NaNs: the search stops at infinity.
    if d == DType::F8E5M2 {
        &t[..=0x7C]
    } else {
        t
    }
}

/// The bits of `x` as an 8-bit float: rounded to nearest even, saturated to the largest finite
/// value (infinities included), NaN to 0x7F.
fn fp8_bits(x: f64, d: DType) -> u64 {
    if x.is_nan() {
        return 0x7F;
    }
    if x.is_infinite() && d == DType::F8E5M2 {
        // A value of the type: E5M2 has infinities (conversions saturate before, in `cast`).
        return if x < 0.0 { 0xFC } else { 0x7C };
    }
    let y = round_to(x, d);
    // The codes are ordered like the magnitudes: search the one of |y| (exact by now).
    let magnitudes = fp8_magnitudes(d);
    let code = magnitudes.partition_point(|&v| v < y.abs());
    let code = if magnitudes.get(code) == Some(&y.abs()) { code as u8 } else { 0x7F };
    (code | if y.is_sign_negative() { 0x80 } else { 0 }) as u64
}

/// `x` rounded to nearest even in a binary format of `p` significand bits whose normal
/// exponents span `emin..=emax` (subnormals below, infinity beyond).
fn round_format(x: f64, p: i32, emin: i32, emax: i32) -> f64 {
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    // The binary exponent from the bits, 2^e <= |x| < 2^(e+1) (f64 subnormals, far below every
    // target format, count as the smallest exponent); powers of two by their bits (large
    // benchmark inputs round hundreds of millions of values).
    let e = ((x.to_bits() >> 52) & 0x7FF) as i32 - 1023;
    let pow2 = |n: i32| f64::from_bits(((n + 1023) as u64) << 52);
    let q = e.max(emin) - (p - 1);
    let y = (x * pow2(-q)).round_ties_even() * pow2(q);
    let max = (2.0 - pow2(1 - p)) * pow2(emax);
    if y.abs() > max {
        f64::INFINITY.copysign(x)
    } else if y == 0.0 {
        0f64.copysign(x)
    } else {
        y
    }
}

/// `x` rounded to nearest even to a float type (the `half` crate's f64 conversions are not
/// always correctly rounded, so the reference rounds itself and converts exact values only).
pub fn round_to(x: f64, d: DType) -> f64 {
    match d {
        DType::F16 => round_format(x, 11, -14, 15),
        DType::BF16 => round_format(x, 8, -126, 127),
        DType::F32 => x as f32 as f64,
        DType::F8E4M3FN | DType::F8E5M2 => {
            let (p, emin, emax, max) = fp8_format(d);
            let y = round_format(x, p, emin, emax);
            if y.is_nan() {
                y
            } else {
                y.clamp(-max, max)
            }
        }
        _ => x,
    }
}

/// The bits of `v` as a `d`: floats rounded to nearest even, integers wrapped.
pub fn encode(v: V, d: DType) -> u64 {
    match (v, d) {
        (V::F(x), DType::F16) => f16::from_f64(round_to(x, d)).to_bits() as u64,
        (V::F(x), DType::BF16) => bf16::from_f64(round_to(x, d)).to_bits() as u64,
        (V::F(x), DType::F32) => (x as f32).to_bits() as u64,
        (V::F(x), DType::F64) => x.to_bits(),
        (V::F(x), d) if d.is_fp8() => fp8_bits(x, d),
        (V::I(i), d) if d.is_fp8() => fp8_bits(i as f64, d),
        (V::I(i), d) => wrap(i, d) as u64 & size_mask(d),
        (V::F(x), d) => wrap(x as i128, d) as u64 & size_mask(d),
    }
}

/// The bits an element of `d` occupies in memory.
pub fn size_mask(d: DType) -> u64 {
    let bits = d.size_bytes() * 8;
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

/// `i` wrapped to the width of integer type `d` (two's complement), as a value of `d`.
pub fn wrap(i: i128, d: DType) -> i128 {
    let bits = d.bits();
    let m = (i as u128) & ((1u128 << bits) - 1);
    if d.is_signed_int() && bits < 128 && m >> (bits - 1) & 1 == 1 {
        m as i128 - (1i128 << bits)
    } else {
        m as i128
    }
}

/// The smallest and largest value of integer type `d`.
pub fn int_range(d: DType) -> (i128, i128) {
    let bits = d.bits();
    if d.is_signed_int() {
        (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
    } else {
        (0, (1i128 << bits) - 1)
    }
}

/// Little-endian bytes of elements given as bit patterns.
pub fn to_bytes(bits: &[u64], d: DType) -> Vec<u8> {
    let size = d.size_bytes() as usize;
    bits.iter().flat_map(|b| b.to_le_bytes()[..size].to_vec()).collect()
}

/// Bit patterns of the elements in little-endian bytes.
pub fn from_bytes(bytes: &[u8], d: DType) -> Vec<u64> {
    let size = d.size_bytes() as usize;
    bytes
        .chunks_exact(size)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..size].copy_from_slice(c);
            u64::from_le_bytes(b)
        })
        .collect()
}

/// Float edge values: zeros, the smallest subnormal and normal, the largest finite value,
/// infinities, NaN, powers of two, values next to 1, and the domain ends of the elementary
/// functions (overflow and underflow of `exp`, the switch points of the definitions).
pub fn float_edges(d: DType) -> Vec<f64> {
    let (tiny, min_normal, max) = match d {
        DType::F16 => (f16::from_bits(1).to_f64(), f16::MIN_POSITIVE.to_f64(), f16::MAX.to_f64()),
        DType::BF16 => (bf16::from_bits(1).to_f64(), bf16::MIN_POSITIVE.to_f64(), bf16::MAX.to_f64()),
        DType::F32 => (f32::from_bits(1) as f64, f32::MIN_POSITIVE as f64, f32::MAX as f64),
        DType::F8E4M3FN => (2f64.powi(-9), 2f64.powi(-6), 448.0),
        DType::F8E5M2 => (2f64.powi(-16), 2f64.powi(-14), 57344.0),
        _ => (f64::from_bits(1), f64::MIN_POSITIVE, f64::MAX),
    };
    let mut v = vec![
        0.0,
        -0.0,
        tiny,
        -tiny,
        min_normal,
        -min_normal,
        max,
        -max,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        1.0,
        -1.0,
        0.5,
        2.0,
        -2.0,
        0.99999994,
        1.0000001,
        3.0,
        -3.5,
        88.72283,
        88.7229,
        -87.33655,
        -103.9721,
        -104.0,
        127.99999,
        128.0,
        -149.0,
        -150.0,
        65535.996,
        65536.0,
        1e20,
        3.0e38,
        0.875,
        3.9,
        9.0,
        9.1,
        0.55,
        0.41421354,
        -0.29289323,
        std::f64::consts::PI,
        std::f64::consts::FRAC_PI_2,
        -std::f64::consts::FRAC_PI_4,
        1e-30,
        12582912.0,
    ];
    v.extend((-8..8).map(|e| 2f64.powi(e * 4)));
    // Casts to the 8-bit floats: their largest values and the saturation ties (448, 464, 465,
    // 480; 57344, 61440, 65536), ties between neighbours (1.0625, 1.1875), subnormals and the
    // rounding around them.
    let p = |e: i32| 2f64.powi(e);
    v.extend([448.0, 464.0, 465.0, 480.0, -464.0, 57344.0, 61440.0, 61441.0, 65536.0, 1.0625, 1.1875, -1.0625]);
    v.extend([p(-9), p(-10), 3.0 * p(-10), 7.5 * p(-9), p(-6), p(-16), p(-17), 3.0 * p(-17), p(-14), -p(-10)]);
    v
}

/// Integer edge values of `d`: 0, +-1, the ends of the range and their neighbours, powers of
/// two and alternating bit patterns.
pub fn int_edges(d: DType) -> Vec<i128> {
    if d == DType::I1 {
        return vec![0, 1];
    }
    let (lo, hi) = int_range(d);
    let bits = d.bits();
    let mut v = vec![0, 1, -1, 2, -2, lo, lo + 1, hi, hi - 1, 7, -7, 100, -100];
    v.extend((0..bits).step_by(3).map(|k| 1i128 << k));
    v.push(0x5555_5555_5555_5555);
    v.push(0x2AAA_AAAA_AAAA_AAAA);
    v.into_iter().map(|i| wrap(i, d)).collect()
}

/// `n` inputs of type `d` as bit patterns: the edge values, then random ones (for floats half
/// random bit patterns, which cover every binade, NaNs and infinities, half uniform in
/// [-8, 8)). NaNs are the type's canonical quiet NaN: payloads are unspecified in the IR.
pub fn inputs(d: DType, n: usize, rng: &mut impl Rng) -> Vec<u64> {
    let mut out: Vec<u64> = if d.is_fp8() {
        // Every pattern, so that a case of 256 elements or more converts each one.
        (0..=255u64).collect()
    } else if d.is_float() {
        float_edges(d).into_iter().map(|x| encode(V::F(x), d)).collect()
    } else {
        int_edges(d).into_iter().map(|i| encode(V::I(i), d)).collect()
    };
    let size_mask = size_mask(d);
    while out.len() < n {
        let b = if d == DType::I1 {
            rng.gen_range(0..2)
        } else if d.is_float() && rng.gen_bool(0.5) {
            encode(V::F(rng.gen_range(-8.0..8.0)), d)
        } else {
            rng.gen::<u64>() & size_mask
        };
        out.push(b);
    }
    out.truncate(n);
    if d.is_float() {
        let nan = encode(V::F(f64::NAN), d);
        for b in out.iter_mut() {
            if decode(*b, d).f().is_nan() {
                *b = nan;
            }
        }
    }
    out
}

/// Shuffles `v` in place (so that edge values land in every lane and program).
pub fn shuffle<T>(v: &mut [T], rng: &mut impl Rng) {
    for i in (1..v.len()).rev() {
        let j = rng.gen_range(0..=i);
        v.swap(i, j);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tables agree with the format's definition on every code: each non-NaN value encodes
    /// back to its own code, and decoding reads the definition's value.
    #[test]
    fn fp8_tables_round_trip_every_code() {
        for d in [DType::F8E4M3FN, DType::F8E5M2] {
            for c in 0..=255u8 {
                let v = fp8_value(c, d);
                let got = decode(c as u64, d).f();
                assert!(got.to_bits() == v.to_bits() || (v.is_nan() && got.is_nan()), "{d} {c:#x}: {got} != {v}");
                if !v.is_nan() {
                    assert_eq!(fp8_bits(v, d), c as u64, "{d} {c:#x} ({v})");
                }
            }
        }
    }
}
