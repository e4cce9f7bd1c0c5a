//! The two OCP 8-bit floats, as exact conversions every backend and every reference shares.
//!
//! * `f8e4m3fn`: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; the one NaN
//!   per sign is S.1111.111; the largest finite value is 448 (S.1111.110); subnormals down to
//!   2^-9.
//! * `f8e5m2`: sign, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like: exponent 11111 is
//!   infinity (mantissa 0) or NaN; the largest finite value is 57344; subnormals down to 2^-16.
//!
//! From a wider float: round to nearest, ties to even, then saturate to the largest finite
//! value of the sign (infinities included), as PTX's `cvt.rn.satfinite` does; NaN becomes the
//! canonical NaN 0x7F. To a wider float: exact.

/// An 8-bit float format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fp8 {
    /// Exponent bits.
    pub exp: u32,
    /// Mantissa bits.
    pub man: u32,
    pub bias: i32,
    /// The largest finite magnitude's code (without the sign).
    pub max_code: u8,
    /// Whether the all-ones exponent is infinity and NaN (IEEE-like) rather than ordinary
    /// values with one NaN code.
    pub ieee: bool,
}

pub const E4M3FN: Fp8 = Fp8 { exp: 4, man: 3, bias: 7, max_code: 0x7E, ieee: false };
pub const E5M2: Fp8 = Fp8 { exp: 5, man: 2, bias: 15, max_code: 0x7B, ieee: true };

/// The canonical NaN both formats produce.
pub const NAN_CODE: u8 = 0x7F;

impl Fp8 {
    /// The value of `code`, exactly.
    pub fn decode(self, code: u8) -> f64 {
        let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
        let mag = code & 0x7F;
        let e = (mag >> self.man) as i32;
        let m = (mag & ((1 << self.man) - 1)) as f64;
        let all_ones = (1 << self.exp) - 1;
        if self.ieee && e == all_ones {
            return if m == 0.0 { sign * f64::INFINITY } else { f64::NAN };
        }
        if !self.ieee && mag == 0x7F {
            return f64::NAN;
        }
        let scale = |p: i32| 2f64.powi(p);
        if e == 0 {
            sign * m * scale(1 - self.bias - self.man as i32)
        } else {
            sign * (1.0 + m / scale(self.man as i32)) * scale(e - self.bias)
        }
    }

    /// The code of `x` rounded to nearest even and saturated (see the module's comment).
    pub fn encode(self, x: f64) -> u8 {
        if x.is_nan() {
            return NAN_CODE;
        }
        let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
        let a = x.abs();
        if a == 0.0 {
            return sign;
        }
        let max = self.decode(self.max_code);
        if a >= max {
            return sign | self.max_code;
        }
        let man = self.man as i32;
        let emin = 1 - self.bias;
        // The exponent of `a` (a is finite, positive, below max).
        let e = a.log2().floor() as i32;
        // Correct for log2's rounding at powers of two.
        let e = if 2f64.powi(e) > a {
            e - 1
        } else if 2f64.powi(e + 1) <= a {
            e + 1
        } else {
            e
        };
        let code = if e < emin {
            // Subnormal: units of the smallest subnormal; 2^man of them is the smallest normal,
            // whose code is the same number.
            (a / 2f64.powi(emin - man)).round_ties_even() as u32
        } else {
            let n = (a / 2f64.powi(e - man)).round_ties_even() as u32;
            // `n` in [2^man, 2^(man+1)]: the top carries into the exponent, which the code's
            // arithmetic does by itself.
            (((e + self.bias) as u32) << man) + (n - (1 << man))
        };
        sign | (code.min(self.max_code as u32) as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code decodes to a value that encodes back to it (NaNs to the canonical NaN,
    /// infinities to the largest finite value), and the decoded values are ordered.
    #[test]
    fn every_code_round_trips() {
        for f in [E4M3FN, E5M2] {
            let mut last = -1.0;
            for code in 0..=0x7Fu8 {
                for sign in [0u8, 0x80] {
                    let c = code | sign;
                    let v = f.decode(c);
                    let back = f.encode(v);
                    if v.is_nan() {
                        assert_eq!(back, NAN_CODE, "{f:?} {c:#04x}");
                    } else if v.is_infinite() {
                        assert_eq!(back, sign | f.max_code, "{f:?} {c:#04x}");
                    } else {
                        assert_eq!(back, c, "{f:?} {c:#04x} = {v}");
                    }
                }
                let v = f.decode(code);
                if v.is_finite() {
                    assert!(v > last || code == 0, "{f:?} {code:#04x}: {v} after {last}");
                    last = v;
                }
            }
        }
    }

    #[test]
    fn the_formats_extremes() {
        assert_eq!(E4M3FN.decode(0x7E), 448.0);
        assert!(E4M3FN.decode(0x7F).is_nan() && E4M3FN.decode(0xFF).is_nan());
        assert_eq!(E4M3FN.decode(0x01), 2f64.powi(-9));
        assert_eq!(E4M3FN.decode(0x08), 2f64.powi(-6));
        assert_eq!(E5M2.decode(0x7B), 57344.0);
        assert_eq!(E5M2.decode(0x7C), f64::INFINITY);
        assert_eq!(E5M2.decode(0xFC), f64::NEG_INFINITY);
        assert!(E5M2.decode(0x7D).is_nan());
        assert_eq!(E5M2.decode(0x01), 2f64.powi(-16));
    }

    #[test]
    fn rounding_is_to_nearest_even_and_saturates() {
        let e4 = |x: f64| E4M3FN.decode(E4M3FN.encode(x));
        assert_eq!(e4(448.0), 448.0);
        assert_eq!(e4(464.0), 448.0, "the tie between 448 and 480 goes to even (448)");
        assert_eq!(e4(465.0), 448.0, "above the tie: 480, which saturates");
        assert_eq!(e4(1e9), 448.0);
        assert_eq!(e4(f64::INFINITY), 448.0);
        assert_eq!(e4(f64::NEG_INFINITY), -448.0);
        // Ties between neighbours 1.0 (0x38) and 1.125 (0x39): 1.0625 goes to even 1.0;
        // 1.1875 (between 1.125 and 1.25) goes to 1.25.
        assert_eq!(e4(1.0625), 1.0);
        assert_eq!(e4(1.1875), 1.25);
        // Subnormals: half the smallest goes to 0 (even), three halves to 2 units.
        assert_eq!(e4(2f64.powi(-10)), 0.0);
        assert_eq!(e4(3.0 * 2f64.powi(-10)), 2.0 * 2f64.powi(-9));
        // The largest subnormal rounds up into the smallest normal.
        assert_eq!(e4(7.5 * 2f64.powi(-9)), 2f64.powi(-6));
        assert_eq!(E4M3FN.encode(-0.0), 0x80);
        assert_eq!(E4M3FN.encode(f64::NAN), NAN_CODE);
        let e5 = |x: f64| E5M2.decode(E5M2.encode(x));
        assert_eq!(e5(57344.0), 57344.0);
        assert_eq!(e5(61440.0), 57344.0, "the tie with 65536 goes to even, and saturates");
        assert_eq!(e5(f64::INFINITY), 57344.0);
        assert_eq!(e5(2f64.powi(-17)), 0.0);
        assert_eq!(e5(3.0 * 2f64.powi(-17)), 2.0 * 2f64.powi(-16));
    }
}
