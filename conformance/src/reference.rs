//! f64 references, written independently of the IR: plain loops on the host.

use trident_core::ir::{BinaryOp, DType, UnaryOp};

/// The worst of `samples` random entries of `c = a b` (`a` `m x k`, `b` `k x n`, row-major)
/// against f64 dot products, relative to `sum_p |a_ip b_pj|`; `entry` reads the output at a
/// flat index (from a device, a rank's buffer).
pub fn sampled_gemm_error(
    entry: &dyn Fn(usize) -> Result<f64, trident_core::backend::BackendError>,
    (a, b): (&[f64], &[f64]),
    (m, n, k): (usize, usize, usize),
    samples: usize,
    rng: &mut dyn rand::RngCore,
) -> Result<f64, trident_core::backend::BackendError> {
    use rand::Rng;
    let mut worst = 0.0f64;
    for _ in 0..samples {
        let (i, j) = (rng.gen_range(0..m), rng.gen_range(0..n));
        let got = entry(i * n + j)?;
        let (mut want, mut scale) = (0.0, 0.0);
        for p in 0..k {
            want += a[i * k + p] * b[p * n + j];
            scale += (a[i * k + p] * b[p * n + j]).abs();
        }
        worst = worst.max((got - want).abs() / scale.max(1e-30));
    }
    Ok(worst)
}

/// `x + y`.
pub fn vector_add(x: &[f64], y: &[f64]) -> Vec<f64> {
    x.iter().zip(y).map(|(a, b)| a + b).collect()
}

/// Row-wise softmax of a `rows x cols` row-major matrix.
pub fn softmax(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = row.iter().map(|v| (v - max).exp()).collect();
        let s: f64 = e.iter().sum();
        out.extend(e.iter().map(|v| v / s));
    }
    out
}

/// `a[m, k] @ b[k, n]`, row-major.
pub fn gemm(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for kk in 0..k {
            let x = a[i * k + kk];
            for j in 0..n {
                c[i * n + j] += x * b[kk * n + j];
            }
        }
    }
    c
}

/// Normwise relative error `|out - ref|_2 / |ref|_2` (absolute when the reference is zero);
/// `None` when `out` holds a NaN or an infinity (an unwritten or broken element), with its index.
pub fn normwise_error(out: &[f64], reference: &[f64]) -> Result<f64, usize> {
    if let Some(i) = out.iter().position(|v| !v.is_finite()) {
        return Err(i);
    }
    let diff: f64 = out.iter().zip(reference).map(|(o, r)| (o - r) * (o - r)).sum::<f64>().sqrt();
    let norm: f64 = reference.iter().map(|r| r * r).sum::<f64>().sqrt();
    Ok(if norm > 0.0 { diff / norm } else { diff })
}

/// The exact value of a float unary op at `x`, to f64 precision (std's f64 functions, and
/// [`erf`] and [`sigmoid`] below).
pub fn unary_f64(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Exp2 => x.exp2(),
        UnaryOp::Expm1 => x.exp_m1(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Log2 => x.log2(),
        UnaryOp::Log1p => x.ln_1p(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => sigmoid(x),
        UnaryOp::Erf => erf(x),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Not => f64::NAN,
    }
}

/// The exact value of a float binary op (`pow`, ..) at `(x, y)`, to f64 precision.
pub fn binary_f64(op: BinaryOp, x: f64, y: f64) -> f64 {
    match op {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        BinaryOp::Rem => x % y,
        BinaryOp::Pow => x.powf(y),
        BinaryOp::Min => x.min(y),
        BinaryOp::Max => x.max(y),
        _ => f64::NAN,
    }
}

/// The logistic function in f64.
pub fn sigmoid(x: f64) -> f64 {
    if x < 0.0 {
        let e = x.exp();
        e / (1.0 + e)
    } else {
        1.0 / (1.0 + (-x).exp())
    }
}

/// The error function in f64 (relative error below 3e-15, 13 ulp): a series without cancellation below
/// 2, Laplace's continued fraction for erfc above (where erfc < 0.005, so its own error
/// hardly shows).
pub fn erf(x: f64) -> f64 {
    let a = x.abs();
    if a.is_nan() {
        return x;
    }
    // erfc(6) < 2^-55: erf rounds to 1 in f64 from here on.
    if a >= 6.0 {
        return 1f64.copysign(x);
    }
    let v = if a < 2.0 {
        // erf(a) = 2/sqrt(pi) exp(-a^2) sum 2^n a^(2n+1) / (1 3 5 .. (2n+1)).
        let (mut term, mut sum, mut n) = (a, a, 0.0);
        while term > sum * 1e-18 {
            n += 1.0;
            term *= 2.0 * a * a / (2.0 * n + 1.0);
            sum += term;
        }
        2.0 / std::f64::consts::PI.sqrt() * exp_minus_square(a) * sum
    } else {
        // erfc(a) = exp(-a^2) / sqrt(pi) / (a + (1/2)/(a + 1/(a + (3/2)/(a + ..)))).
        let mut t = a;
        let terms = if a < 3.0 { 400 } else { 120 };
        for k in (1..terms).rev() {
            t = a + (k as f64 / 2.0) / t;
        }
        1.0 - exp_minus_square(a) / std::f64::consts::PI.sqrt() / t
    };
    v.copysign(x)
}

/// `exp(-a^2)` with the square kept exact (`a^2 = h + l`): `exp(-h) (1 - l)`.
fn exp_minus_square(a: f64) -> f64 {
    let h = a * a;
    if h.is_infinite() {
        return 0.0;
    }
    let l = a.mul_add(a, -h);
    (-h).exp() * (1.0 - l)
}

/// Distance in ulps of the result type between `y` and the value of that type nearest `r`
/// (0 when both are NaN or the same infinity, `u64::MAX` when only one is NaN). `bits` is the
/// significand precision: 24 for f32, 11 for f16, 8 for bf16.
pub fn ulps(y: f64, r: f64, d: DType) -> u64 {
    let cr = crate::ops::values::round_to(r, d);
    if y.is_nan() || cr.is_nan() {
        return if y.is_nan() && cr.is_nan() { 0 } else { u64::MAX };
    }
    // Ordinal of a value among the type's values: sign-magnitude bits made monotonic.
    let key = |x: f64| -> i128 {
        let b: i128 = match d {
            DType::F16 => half::f16::from_f64(crate::ops::values::round_to(x, d)).to_bits() as i16 as i128,
            DType::BF16 => half::bf16::from_f64(crate::ops::values::round_to(x, d)).to_bits() as i16 as i128,
            DType::F32 => (x as f32).to_bits() as i32 as i128,
            DType::F8E4M3FN | DType::F8E5M2 => {
                crate::ops::values::encode(crate::ops::values::V::F(x), d) as u8 as i8 as i128
            }
            _ => x.to_bits() as i64 as i128,
        };
        let width: u32 = match d {
            DType::F8E4M3FN | DType::F8E5M2 => 8,
            DType::F16 | DType::BF16 => 16,
            DType::F32 => 32,
            _ => 64,
        };
        if b < 0 {
            -(b + (1i128 << (width - 1)))
        } else {
            b
        }
    };
    (key(y) - key(cr)).unsigned_abs() as u64
}

/// Decoding attention (`trident_kernels::flash_decode`'s definition) in f64: `q [B, Nq, Hq, D]`,
/// the cache's key and value of sequence `b`'s key `j` at `kv(b, j)` (an element offset of a
/// `D`-vector, per KV head `h` added as `h D`), `lens [B]`; query token `i` of sequence `b`
/// attends to the keys `0 ..= lens[b] - Nq + i` with scores `q . k / sqrt(D)`; zeros where it
/// sees none. Returns `out [B, Nq, Hq, D]`.
#[allow(clippy::too_many_arguments)]
pub fn decode_attention(
    q: &[f64],
    (k, v): (&[f64], &[f64]),
    kv: &dyn Fn(usize, usize) -> usize,
    lens: &[usize],
    (nq, hq, hkv, d): (usize, usize, usize, usize),
) -> Vec<f64> {
    let g = hq / hkv;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0; lens.len() * nq * hq * d];
    for (b, &len) in lens.iter().enumerate() {
        for i in 0..nq {
            let Some(last) = (len + i).checked_sub(nq) else { continue };
            for h in 0..hq {
                let qv = &q[((b * nq + i) * hq + h) * d..][..d];
                let at = |j: usize| kv(b, j) + (h / g) * d;
                let scores: Vec<f64> = (0..=last)
                    .map(|j| scale * qv.iter().zip(&k[at(j)..][..d]).map(|(x, y)| x * y).sum::<f64>())
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let total: f64 = w.iter().sum();
                let o = &mut out[((b * nq + i) * hq + h) * d..][..d];
                for (j, wj) in w.iter().enumerate() {
                    for (x, y) in o.iter_mut().zip(&v[at(j)..][..d]) {
                        *x += wj / total * y;
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references() {
        assert_eq!(gemm(&[1.0, 2.0, 3.0, 4.0], &[5.0, 6.0, 7.0, 8.0], 2, 2, 2), vec![19.0, 22.0, 43.0, 50.0]);
        let s = softmax(&[0.0, 0.0, 1.0, 1.0], 2, 2);
        assert!(s.iter().all(|v| (v - 0.5).abs() < 1e-15));
        assert_eq!(normwise_error(&[1.0, f64::NAN], &[1.0, 1.0]), Err(1));
        assert!(normwise_error(&[3.0, 4.0], &[3.0, 4.0]).unwrap() == 0.0);
        assert_eq!(ulps(1.0, 1.0, DType::F32), 0);
        assert_eq!(ulps(f32::from_bits(0x3f80_0001) as f64, 1.0, DType::F32), 1);
        assert_eq!(ulps(-0.0, 1e-46, DType::F32), 0);
        assert_eq!(ulps(1e-45, 0.0, DType::F32), 1);
        assert_eq!(ulps(f64::NAN, f64::NAN, DType::BF16), 0);
        assert!((erf(0.5) - 0.520_499_877_813_046_5).abs() < 1e-15);
        assert!((erf(3.5) - 0.999_999_256_901_627_7).abs() < 1e-15);
        assert!((erf(-5.0) + 0.999_999_999_998_462_5).abs() < 1e-15);
    }
}
