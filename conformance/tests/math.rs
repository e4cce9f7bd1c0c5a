//! Sampled accuracy of core's elementary functions (host evaluation) against f64; the
//! exhaustive measurement over every f32 is `cargo xtask math`.

use trident_conformance::reference::{binary_f64, ulps, unary_f64};
use trident_core::ir::{BinaryOp, DType, UnaryOp};
use trident_core::math::{self, native::Native};

/// Edge values and a pseudo-random sample spread over every binade.
fn inputs() -> Vec<f32> {
    let mut v: Vec<f32> = trident_conformance::ops::float_edges(DType::F32).into_iter().map(|x| x as f32).collect();
    let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..300_000 {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.push(f32::from_bits(s as u32));
    }
    v
}

#[test]
fn accurate_functions_are_within_two_ulp() {
    let xs = inputs();
    for op in UnaryOp::ALL.iter().copied().filter(|o| math::is_expanded(*o)) {
        let mut worst = (0, 0.0f32);
        for &x in &xs {
            let y = math::unary(&mut Native, op, x).expect("expanded");
            let d = ulps(y as f64, unary_f64(op, x as f64), DType::F32);
            if d > worst.0 {
                worst = (d, x);
            }
        }
        assert!(worst.0 <= 2, "{op}: {} ulp at x = {:e} ({:#010x})", worst.0, worst.1, worst.1.to_bits());
    }
}

#[test]
fn pow_is_within_one_ulp_and_fmod_is_exact() {
    let xs = inputs();
    let mut worst = (0, 0.0f32, 0.0f32);
    for (i, &x) in xs.iter().enumerate() {
        let y = xs[(i * 7919 + 13) % xs.len()];
        // Also small integer and half-integer exponents, where signs and special cases live.
        let y = if i % 3 == 0 { ((i % 41) as f32 - 20.0) * 0.5 } else { y };
        let got = math::pow(&mut Native, x, y);
        let d = ulps(got as f64, binary_f64(BinaryOp::Pow, x as f64, y as f64), DType::F32);
        if d > worst.0 {
            worst = (d, x, y);
        }
        let r = math::fmod(&mut Native, x, y);
        let want = x % y;
        assert!(
            r.to_bits() == want.to_bits() || (r.is_nan() && want.is_nan()),
            "fmod({x:e}, {y:e}) = {r:e}, want {want:e}"
        );
    }
    assert!(worst.0 <= 1, "pow: {} ulp at ({:e}, {:e})", worst.0, worst.1, worst.2);
}
