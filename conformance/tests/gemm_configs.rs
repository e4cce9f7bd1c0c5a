//! GEMM configurations like the benchmark's sweep (tensor-core tiles of 32 to 256, 4 or 8 warps,
//! K steps of 16 to 64, 2 to 4 pipeline stages) are correct through the SIMT lowering
//! (`cpu-simt`, warp 32 runs the MMA and cp.async paths), on a ragged problem, against f64.

use rand::SeedableRng;
use trident_backend_cpu::simt_exec::SimtBackend;
use trident_conformance::host::{decode, encode, poison, random};
use trident_conformance::reference;
use trident_core::backend::{Backend, LaunchOptions};
use trident_core::ir::DType;
use trident_kernels::{gemm::Gemm, DeviceCtx};

#[test]
fn swept_gemm_configurations_match_f64() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    let (m, n, k) = (136, 200, 96);
    for d in [DType::BF16, DType::F16] {
        let (a, b) = (random(m * k, d, &mut rng), random(k * n, d, &mut rng));
        let want = reference::gemm(&a, &b, m, n, k);
        for (bm, bn, bk, warps, stages) in
            [(64, 64, 32, 4, 2), (128, 128, 32, 8, 3), (128, 256, 64, 8, 3), (32, 32, 16, 4, 4)]
        {
            let backend = SimtBackend;
            let dev = backend.open_device(0).unwrap();
            let mut l = DeviceCtx::new(&backend, dev.as_ref(), LaunchOptions::default());
            l.target = Some("sm_90a".into());
            let es = d.size_bytes() as usize;
            let ab = dev.alloc(m * k * es, "a").unwrap();
            dev.write(&ab, 0, &encode(&a, d)).unwrap();
            let bb = dev.alloc(k * n * es, "b").unwrap();
            dev.write(&bb, 0, &encode(&b, d)).unwrap();
            let c = dev.alloc(m * n * es, "c").unwrap();
            dev.fill(&c, &poison(d)).unwrap();
            let g = Gemm { block_m: bm, block_n: bn, block_k: bk, warps, stages, ..Gemm::new(d) };
            g.run(&l, &ab, &bb, &c, (m, n, k)).unwrap();
            let mut raw = vec![0u8; m * n * es];
            dev.read(&c, 0, &mut raw).unwrap();
            let got = decode(&raw, d);
            let (num, den) =
                got.iter().zip(&want).fold((0.0f64, 0.0f64), |(x, y), (g, w)| (x + (g - w).powi(2), y + w * w));
            let err = (num / den).sqrt();
            let bound = if d == DType::BF16 { 1e-2 } else { 2e-3 };
            assert!(err < bound, "{d} {bm}x{bn}x{bk}/{warps}w/{stages}s: normwise error {err:.2e} over {bound:.0e}");
        }
    }
}
