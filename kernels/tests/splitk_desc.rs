//! The split-K GEMM's descriptor form on sm_90a (cpu-simt): TMA boxes of each split's K range
//! and `wgmma`, the partial tiles added into the workspace; against float64 on fresh inputs with
//! a poisoned output, on shapes that are and are not multiples of the tile, twice on the same
//! workspace (the last split of each tile resets it).

use rand::{Rng, SeedableRng};
use trident_backend_cpu::simt_exec::SimtBackend;
use trident_core::backend::{Backend, LaunchOptions};
use trident_core::ir::DType;
use trident_kernels::splitk_gemm::SplitKGemm;
use trident_kernels::DeviceCtx;

fn bf16_bytes(v: &[f64]) -> Vec<u8> {
    v.iter().flat_map(|&x| half::bf16::from_f64(x).to_le_bytes()).collect()
}

#[test]
fn the_descriptor_form_matches_float64() {
    trident_backend_cpu::link();
    let sm90a = trident_core::target::lookup("sm_90a").unwrap();
    let dev = SimtBackend.open_device(0).unwrap();
    let mut l = DeviceCtx::new(&SimtBackend, dev.as_ref(), LaunchOptions::default());
    l.target = Some("sm_90a".into());
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    for (splits, (m, n, k)) in [(2, (128, 128, 256)), (3, (150, 136, 392)), (4, (64, 256, 200))] {
        let g = SplitKGemm::for_target(DType::BF16, splits, Some(sm90a));
        assert!(g.descriptors);
        let text = trident_core::simt::lower(&g.build().unwrap(), sm90a).unwrap().to_string();
        assert!(text.contains("tma.load") && text.contains("wgmma.m64n128k16.bf16"));
        let ws = g.workspace(dev.as_ref(), m, n).unwrap();
        for _ in 0..2 {
            let a: Vec<f64> = (0..m * k).map(|_| half::bf16::from_f64(rng.gen_range(-1.0..1.0)).to_f64()).collect();
            let b: Vec<f64> = (0..k * n).map(|_| half::bf16::from_f64(rng.gen_range(-1.0..1.0)).to_f64()).collect();
            let (ab, bb, cb) = (
                dev.alloc(m * k * 2, "a").unwrap(),
                dev.alloc(k * n * 2, "b").unwrap(),
                dev.alloc(m * n * 2, "c").unwrap(),
            );
            dev.write(&ab, 0, &bf16_bytes(&a)).unwrap();
            dev.write(&bb, 0, &bf16_bytes(&b)).unwrap();
            dev.fill(&cb, &[0xFF]).unwrap();
            g.run(&l, &ab, &bb, &cb, &ws, (m, n, k)).unwrap();
            let mut raw = vec![0u8; m * n * 2];
            dev.read(&cb, 0, &mut raw).unwrap();
            for i in 0..m {
                for j in 0..n {
                    let got = half::bf16::from_le_bytes([raw[2 * (i * n + j)], raw[2 * (i * n + j) + 1]]).to_f64();
                    let (want, mag) = (0..k).fold((0.0, 0.0), |(s, t), p| {
                        let x = a[i * k + p] * b[p * n + j];
                        (s + x, t + f64::abs(x))
                    });
                    let tol = want.abs() * 2f64.powi(-7) + mag * 1e-5;
                    assert!(
                        (got - want).abs() <= tol,
                        "{splits} splits {m}x{n}x{k}: ({i}, {j}) got {got}, want {want}"
                    );
                }
            }
        }
    }
}
