//! The bf16 GEMM checked against an f64 reference: fresh inputs, the output poisoned before the
//! run, every element compared with a bound relative to the sum of |a||b| (shared by the GEMM
//! tests).

use rand::Rng;
use trident_kernels::gemm::Gemm;
use trident_kernels::DeviceCtx;

/// Runs `g` on `l` for each shape and checks every element of C.
pub fn check(l: &DeviceCtx, g: Gemm, shapes: &[(usize, usize, usize)], rng: &mut rand::rngs::StdRng) {
    let dev = l.device;
    let what = format!(
        "{}x{}/{}w/{}s desc {} ws {} persistent {} tma store {}",
        g.block_m, g.block_n, g.warps, g.stages, g.descriptors, g.warp_specialize, g.persistent, g.tma_store
    );
    for &(m, n, k) in shapes {
        let bf = |x: f64| half::bf16::from_f64(x);
        let a: Vec<half::bf16> = (0..m * k).map(|_| bf(rng.gen_range(-1.0..1.0))).collect();
        let b: Vec<half::bf16> = (0..k * n).map(|_| bf(rng.gen_range(-1.0..1.0))).collect();
        let bytes = |v: &[half::bf16]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let (ab, bb, cb) = (
            dev.alloc(2 * m * k, "a").unwrap(),
            dev.alloc(2 * k * n, "b").unwrap(),
            dev.alloc(2 * m * n, "c").unwrap(),
        );
        dev.write(&ab, 0, &bytes(&a)).unwrap();
        dev.write(&bb, 0, &bytes(&b)).unwrap();
        dev.write(&cb, 0, &vec![0xff; 2 * m * n]).unwrap();
        g.run(l, &ab, &bb, &cb, (m, n, k)).unwrap();
        let mut raw = vec![0u8; 2 * m * n];
        dev.read(&cb, 0, &mut raw).unwrap();
        for i in 0..m {
            for j in 0..n {
                let got = half::bf16::from_le_bytes([raw[2 * (i * n + j)], raw[2 * (i * n + j) + 1]]).to_f64();
                let (mut want, mut scale) = (0.0, 0.0);
                for p in 0..k {
                    let x = a[i * k + p].to_f64() * b[p * n + j].to_f64();
                    want += x;
                    scale += x.abs();
                }
                assert!(
                    (got - want).abs() <= 1e-2 * scale.max(1e-3),
                    "{what} {m}x{n}x{k}: c[{i},{j}] = {got}, want {want}"
                );
            }
        }
        for x in [ab, bb, cb] {
            dev.free(&x).unwrap();
        }
    }
}
