//! `Gemm::tuned` takes the tuning cache's choice for the device and shape (as `trident-bench`
//! records it) and the heuristic elsewhere; the tuned kernel computes the product (cpu-simt for
//! sm_90a against an f64 reference, output poisoned).

use rand::{Rng, SeedableRng};
use trident_backend_cpu::simt_exec::SimtBackend;
use trident_core::backend::{Backend, LaunchOptions};
use trident_core::ir::DType;
use trident_kernels::gemm::Gemm;
use trident_kernels::tuning::{key, GemmChoice, TuningCache};
use trident_kernels::Launcher;

#[test]
fn tuned_gemms_come_from_the_cache_or_the_heuristic() {
    trident_backend_nvidia::link();
    let dir = std::env::temp_dir().join(format!("trident-tuned-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // Before any `Gemm::tuned` in this process (the cache is read once).
    std::env::set_var("TRIDENT_CACHE_DIR", &dir);
    let dev = SimtBackend.open_device(0).unwrap();
    let mut l = Launcher::new(&SimtBackend, dev.as_ref(), LaunchOptions::default());
    l.target = Some("sm_90a".into());
    let (m, n, k) = (96, 80, 144);
    let chosen = Gemm {
        block_m: 64,
        block_n: 64,
        block_k: 64,
        warps: 4,
        stages: 3,
        descriptors: true,
        warp_specialize: true,
        ..Gemm::new(DType::BF16)
    };
    let mut cache = TuningCache::load(TuningCache::default_path());
    cache.record(key(&dev.name(), DType::BF16, (m, n, k)), GemmChoice::of(&chosen, 1.0)).unwrap();
    let g = Gemm::tuned(&l, DType::BF16, (m, n, k));
    assert_eq!(g, chosen);
    let other = Gemm::tuned(&l, DType::BF16, (m, n, 2 * k));
    assert_eq!(other, Gemm::for_problem(DType::BF16, l.gpu_target(), m));

    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    let a: Vec<half::bf16> = (0..m * k).map(|_| half::bf16::from_f64(rng.gen_range(-1.0..1.0))).collect();
    let b: Vec<half::bf16> = (0..k * n).map(|_| half::bf16::from_f64(rng.gen_range(-1.0..1.0))).collect();
    let bytes = |v: &[half::bf16]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (ab, bb, cb) =
        (dev.alloc(2 * m * k, "a").unwrap(), dev.alloc(2 * k * n, "b").unwrap(), dev.alloc(2 * m * n, "c").unwrap());
    dev.write(&ab, 0, &bytes(&a)).unwrap();
    dev.write(&bb, 0, &bytes(&b)).unwrap();
    dev.write(&cb, 0, &vec![0xff; 2 * m * n]).unwrap();
    g.run(&l, &ab, &bb, &cb, (m, n, k)).unwrap();
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
            assert!((got - want).abs() <= 1e-2 * scale.max(1e-3), "c[{i},{j}] = {got}, want {want}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
