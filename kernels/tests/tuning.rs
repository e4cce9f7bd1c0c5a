//! `Gemm::tuned` takes the tuning cache's choice for the device and shape (as `trident bench`
//! records it) and the heuristic elsewhere; the tuned kernel computes the product (cpu-simt for
//! sm_90a against an f64 reference, output poisoned).

mod gemm_check;

use gemm_check::check;
use rand::SeedableRng;
use trident_backend_cpu::simt_exec::SimtBackend;
use trident_core::backend::{Backend, LaunchOptions};
use trident_core::ir::DType;
use trident_kernels::gemm::{Gemm, GemmConfig};
use trident_kernels::tuning::{Tuned, TuningCache};
use trident_kernels::DeviceCtx;

#[test]
fn tuned_gemms_come_from_the_cache_or_the_heuristic() {
    trident_backend_nvidia::link();
    let dir = std::env::temp_dir().join(format!("trident-tuned-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // Before any `Gemm::tuned` in this process (the cache is read once).
    std::env::set_var("TRIDENT_CACHE_DIR", &dir);
    let dev = SimtBackend.open_device(0).unwrap();
    let mut l = DeviceCtx::new(&SimtBackend, dev.as_ref(), LaunchOptions::default());
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
    let key = Gemm::tuning_key(&dev.name(), DType::BF16, (m, n, k));
    cache.record(&key, &Tuned { config: GemmConfig::of(&chosen), ms: 1.0 }).unwrap();
    let g = Gemm::tuned(&l, DType::BF16, (m, n, k));
    assert_eq!(g, chosen);
    let other = Gemm::tuned(&l, DType::BF16, (m, n, 2 * k));
    assert_eq!(other, Gemm::for_problem(DType::BF16, l.gpu_target(), m));

    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    check(&l, g, &[(m, n, k)], &mut rng);
    let _ = std::fs::remove_dir_all(&dir);
}
