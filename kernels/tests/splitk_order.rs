//! The split-K GEMM's slot form gives the same bits whatever order its splits arrive in; the
//! atomic form's sums follow the arrival order. On the CPU interpreter, whose program order is
//! drawn from the launch's seed, over f32 products with K split 8 ways.

use rand::{Rng, SeedableRng};
use trident_backend_cpu::CpuBackend;
use trident_core::backend::{Backend, LaunchOptions};
use trident_core::ir::DType;
use trident_kernels::splitk_gemm::{SplitKGemm, SplitReduction};
use trident_kernels::DeviceCtx;

/// The output bits of `reduction` under each program order of `seeds`, on one set of inputs.
fn outputs(reduction: SplitReduction, seeds: &[u64]) -> Vec<Vec<u8>> {
    trident_backend_cpu::link();
    let (m, n, k, splits) = (16, 16, 512, 8);
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    let f32_bytes = |len: usize, rng: &mut rand::rngs::StdRng| -> Vec<u8> {
        (0..len).flat_map(|_| rng.gen_range(-1.0f32..1.0).to_le_bytes()).collect()
    };
    let (a, b) = (f32_bytes(m * k, &mut rng), f32_bytes(k * n, &mut rng));
    let dev = CpuBackend.open_device(0).unwrap();
    let g = SplitKGemm { reduction, ..SplitKGemm::new(DType::F32, splits) };
    let (ab, bb, cb) =
        (dev.alloc(a.len(), "a").unwrap(), dev.alloc(b.len(), "b").unwrap(), dev.alloc(m * n * 4, "c").unwrap());
    dev.write(&ab, 0, &a).unwrap();
    dev.write(&bb, 0, &b).unwrap();
    let ws = g.workspace(dev.as_ref(), m, n).unwrap();
    seeds
        .iter()
        .map(|&seed| {
            let l = DeviceCtx::new(&CpuBackend, dev.as_ref(), LaunchOptions { seed, ..LaunchOptions::default() });
            dev.fill(&cb, &[0xFF]).unwrap();
            g.run(&l, &ab, &bb, &cb, &ws, (m, n, k)).unwrap();
            let mut raw = vec![0u8; m * n * 4];
            dev.read(&cb, 0, &mut raw).unwrap();
            raw
        })
        .collect()
}

#[test]
fn slots_give_the_same_bits_in_any_arrival_order() {
    let seeds: Vec<u64> = (0..6).map(|i| 0x5eed + 7919 * i).collect();
    let slots = outputs(SplitReduction::Slots, &seeds);
    assert!(slots.iter().all(|o| o == &slots[0]), "the slot form's output changed with the program order");
    // The check can fail: the atomic form's sums, in arrival order, differ between these orders.
    let atomic = outputs(SplitReduction::Atomic, &seeds);
    assert!(atomic.iter().any(|o| o != &atomic[0]), "every program order gave the atomic form the same bits");
}
