//! f64 references, written independently of the IR: plain loops on the host.

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
    }
}
