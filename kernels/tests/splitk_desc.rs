//! The split-K GEMM's descriptor form on sm_90a (cpu-simt): TMA boxes of each split's K range
//! and `wgmma`, the partial tiles added into the workspace; against float64 on fresh inputs with
//! a poisoned output, on shapes that are and are not multiples of the tile, twice on the same
//! workspace (the last split of each tile resets it), in both reductions (atomics, slots).

mod ptxas;

use rand::{Rng, SeedableRng};
use trident_backend_cpu::simt_exec::SimtBackend;
use trident_core::backend::{Backend, LaunchOptions};
use trident_core::ir::DType;
use trident_kernels::splitk_gemm::{SplitKGemm, SplitReduction};
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
    let cases = [(2, (128, 128, 256)), (3, (150, 136, 392)), (4, (64, 256, 200))];
    let forms = [(SplitReduction::Atomic, false), (SplitReduction::Slots, false), (SplitReduction::Slots, true)];
    for ((reduction, warp_specialize), (splits, (m, n, k))) in forms.into_iter().flat_map(|r| cases.map(|c| (r, c))) {
        let base = SplitKGemm::for_target(DType::BF16, splits, Some(sm90a));
        let g = SplitKGemm { reduction, warp_specialize, ..base };
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
                        "{reduction:?} ws {warp_specialize} {splits} splits {m}x{n}x{k}: ({i}, {j}) got {got}, want {want}"
                    );
                }
            }
        }
    }
}

/// The slot form stores each split's partial tile from the accumulator's registers in pairs
/// (no conversion through shared memory, no atomics), and the benchmark's forms assemble without
/// spills (with `PTXAS` set).
#[test]
fn the_slot_form_stores_pairs_and_assembles_without_spills() {
    let sm90a = trident_core::target::lookup("sm_90a").unwrap();
    let base = SplitKGemm { reduction: SplitReduction::Slots, ..SplitKGemm::for_target(DType::BF16, 2, Some(sm90a)) };
    let tiles = [(128, 128, 8), (128, 256, 8), (64, 128, 4)];
    for ((bm, bn, warps), ws) in tiles.into_iter().flat_map(|t| [(t, false), (t, true)]) {
        let g = SplitKGemm { block_m: bm, block_n: bn, warps, warp_specialize: ws, ..base };
        let m = trident_backend_nvidia::NvidiaBackend::ptx(&g.build().unwrap(), sm90a).unwrap();
        assert!(m.ptx.contains("st.global.v2.f32"), "{g:?}: the partial tile is not stored in pairs");
        assert!(!m.ptx.contains("red.global.add.f32") && !m.ptx.contains("atom.global.add.f32"), "{g:?}");
        // The specialized form has its producer warp: 32 threads beyond the consumers.
        let threads = warps * 32 + if ws { 32 } else { 0 };
        assert!(m.ptx.contains(&format!(".maxntid {threads}, 1, 1")), "{g:?}: not {threads} threads");
        let test = "the_slot_form_stores_pairs_and_assembles_without_spills";
        if let Some(log) = ptxas::assemble_clean(test, &format!("{g:?}"), &m.ptx) {
            eprintln!("{g:?}: {}", log.lines().find(|l| l.contains("registers")).unwrap_or(""));
        }
    }
}
