//! The AG-GEMM's persistent form with a producer warp, whose producer alone waits for each
//! tile's chunks (`simt::protocol`: the warp's bounded wait), as the GPU runs it: cpu-simt's
//! single-device launch of the sm_90a kernel with the protocol expanded (the warp vote, the
//! clock, the diagnostics record). A chunk that never arrives ends the launch within its bound
//! with the diagnostic naming it (the consumers, released by the producer's copies, finish);
//! with every chunk signalled the product is right.

use half::bf16;
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};
use trident_backend_cpu::simt_exec::SimtBackend;
use trident_core::backend::{Backend, KernelArg, LaunchOptions};
use trident_core::ir::DType;
use trident_kernels::ag_gemm::{AgGemm, GatherMode};

fn bytes_u64(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn a_producer_warps_wait_times_out_with_its_diagnostic_and_passes_once_signalled() {
    trident_backend_nvidia::link();
    let target = trident_core::target::lookup("sm_90a").unwrap();
    let op = AgGemm::for_target(DType::BF16, GatherMode::CopyEngine, Some(target));
    assert!(op.gemm.persistent && op.gemm.warp_specialize, "the copy engine's AG-GEMM on sm_90a: {:?}", op.gemm);
    let (m, n, k) = (256usize, 256usize, 128usize);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let a: Vec<f64> = (0..m * k).map(|_| bf16::from_f64(rng.gen_range(-1.0..1.0)).to_f64()).collect();
    let b: Vec<f64> = (0..k * n).map(|_| bf16::from_f64(rng.gen_range(-1.0..1.0)).to_f64()).collect();
    let to_bf16 = |x: &[f64]| x.iter().flat_map(|v| bf16::from_f64(*v).to_le_bytes()).collect::<Vec<u8>>();
    let dev = SimtBackend.open_device(0).unwrap();
    let (ab, bb, cb) = (
        dev.alloc(2 * m * k, "a_full").unwrap(),
        dev.alloc(2 * k * n, "b").unwrap(),
        dev.alloc(2 * m * n, "c").unwrap(),
    );
    let (ready, epochs) = (dev.alloc(8 * 2, "ready").unwrap(), dev.alloc(8 * 2, "epochs").unwrap());
    let f = op.specialized([&ab, &bb, &cb], n, k).build().unwrap();
    let kernel = SimtBackend.compile(&f, Some("sm_90a")).unwrap();
    // The tile's wait is in the producer's side only; the consumers wait for their stages.
    let text = &kernel.text;
    let (p, c) = (text.find("specialized producer").unwrap(), text.find("} consumer").unwrap());
    assert!(text[p..c].contains("wait_signals") && !text[c..].contains("wait_signals"), "{text}");
    dev.write(&ab, 0, &to_bf16(&a)).unwrap();
    dev.write(&bb, 0, &to_bf16(&b)).unwrap();
    // Two chunks of 128 rows (one row of tiles each); the call waits for `ready[c] >= 1`.
    let args = [
        ab.arg(),
        bb.arg(),
        cb.arg(),
        ready.arg(),
        epochs.arg(),
        KernelArg::i32(m as i32),
        KernelArg::i32(n as i32),
        KernelArg::i32(k as i32),
        KernelArg::i32(128),
        KernelArg::u64(1),
    ];
    let bound = Duration::from_millis(100);
    let opts = LaunchOptions { wait_bound: bound, ..LaunchOptions::default() };
    let launch = |flags: [u64; 2]| {
        dev.write(&ready, 0, &bytes_u64(&flags)).unwrap();
        dev.write(&epochs, 0, &bytes_u64(&[0, 0])).unwrap();
        dev.fill(&cb, &[0xff, 0xff]).unwrap();
        dev.launch(&kernel, [2, 1, 1], &args, &opts)
    };

    // Chunk 1 never arrives: the launch ends (no consumer left waiting on a stage) with the
    // record naming the signal.
    let start = Instant::now();
    let e = launch([1, 0]).expect_err("a wait for an unsignalled chunk passed").to_string();
    assert!(start.elapsed() < bound * 50, "the launch took {:?}", start.elapsed());
    for needle in ["timed out", "`ready`[1]", "expected ge 1", "seen 0"] {
        assert!(e.contains(needle), "the diagnostic lacks `{needle}`: {e}");
    }

    // Every chunk signalled: C = A B (bf16 products, f32 accumulation; the f64 reference).
    launch([1, 1]).unwrap();
    let mut raw = vec![0u8; 2 * m * n];
    dev.read(&cb, 0, &mut raw).unwrap();
    let mut worst = 0f64;
    for i in 0..m {
        for j in 0..n {
            let want: f64 = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            let got = bf16::from_le_bytes([raw[2 * (i * n + j)], raw[2 * (i * n + j) + 1]]).to_f64();
            worst = worst.max((got - want).abs() / want.abs().max(1.0));
        }
    }
    assert!(worst < 1e-2, "C differs from the f64 reference by {worst:.3e}");
}
