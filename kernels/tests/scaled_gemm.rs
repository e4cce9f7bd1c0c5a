//! The FP8 GEMMs with tensor, row and block scales against a float64 reference on fresh random
//! inputs (every finite FP8 value can occur), output poisoned first, on edge shapes (M = 1, K
//! not a multiple of 128, N not a multiple of the tile), on the interpreter and on the SIMT
//! lowering for sm_90a and gfx942.

use rand::{Rng, SeedableRng};
use trident_backend_cpu::simt_exec::SimtBackend;
use trident_backend_cpu::CpuBackend;
use trident_core::backend::{Backend, Device, LaunchOptions};
use trident_core::ir::DType;
use trident_kernels::scaled_gemm::{ScaledGemm, Scaling, SCALE_BLOCK};
use trident_kernels::DeviceCtx;

fn upload(dev: &dyn Device, name: &str, bytes: &[u8]) -> trident_core::backend::Buffer {
    let b = dev.alloc(bytes.len().max(4), name).unwrap();
    dev.write(&b, 0, bytes).unwrap();
    b
}

/// The reference: per 128 of K, the f64 sum of the decoded products times the scales.
#[allow(clippy::too_many_arguments)]
fn reference(
    op: &ScaledGemm,
    a: &[u8],
    b: &[u8],
    sa: &[f32],
    sb: &[f32],
    m: usize,
    n: usize,
    k: usize,
) -> Vec<(f64, f64)> {
    let f = op.dtype.fp8().unwrap();
    let (kb, blk) = (k.div_ceil(SCALE_BLOCK as usize), SCALE_BLOCK as usize);
    let mut out = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            let (mut sum, mut mag) = (0.0, 0.0);
            for q in 0..kb {
                let (mut part, mut part_mag) = (0.0, 0.0);
                for kk in q * blk..((q + 1) * blk).min(k) {
                    let t = f.decode(a[i * k + kk]) * f.decode(b[j * k + kk]);
                    part += t;
                    part_mag += t.abs();
                }
                let s = match op.scaling {
                    Scaling::Tensor => sa[0] as f64 * sb[0] as f64,
                    Scaling::Row => sa[i] as f64 * sb[j] as f64,
                    Scaling::Block => sa[i * kb + q] as f64 * sb[(j / blk) * kb + q] as f64,
                };
                sum += part * s;
                mag += part_mag * s.abs();
            }
            out.push((sum, mag));
        }
    }
    out
}

/// Runs `op` on `m x n x k` with fresh FP8 operands (every finite code can occur) and scales,
/// the output poisoned first, and checks it against [`reference`].
fn check(op: &ScaledGemm, l: &DeviceCtx, (m, n, k): (usize, usize, usize), rng: &mut rand::rngs::StdRng) {
    let dev = l.device;
    let (dtype, scaling, target) = (op.dtype, op.scaling, &l.target);
    let f = dtype.fp8().unwrap();
    let finite: Vec<u8> = (0..=255u8).filter(|&c| f.decode(c).is_finite()).collect();
    let mut codes = |len: usize| -> Vec<u8> { (0..len).map(|_| finite[rng.gen_range(0..finite.len())]).collect() };
    let (a, b) = (codes(m * k), codes(n * k));
    let (la, lb) = op.scale_lens(m, n, k);
    let sa: Vec<f32> = (0..la).map(|_| rng.gen_range(0.25..4.0)).collect();
    let sb: Vec<f32> = (0..lb).map(|_| rng.gen_range(0.25..4.0)).collect();
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (ba, bb) = (upload(dev, "a", &a), upload(dev, "b", &b));
    let (bsa, bsb) = (upload(dev, "scale_a", &f32s(&sa)), upload(dev, "scale_b", &f32s(&sb)));
    let c = upload(dev, "c", &vec![0xFF; m * n * 2]); // bf16 NaN
    op.run(l, &ba, &bb, &c, &bsa, &bsb, (m, n, k)).unwrap();
    let mut raw = vec![0u8; m * n * 2];
    dev.read(&c, 0, &mut raw).unwrap();
    let want = reference(op, &a, &b, &sa, &sb, m, n, k);
    for (idx, (ch, &(r, mag))) in raw.chunks_exact(2).zip(&want).enumerate() {
        let got = half::bf16::from_le_bytes([ch[0], ch[1]]).to_f64();
        // bf16's rounding of the result, and f32 sums over K.
        let tol = r.abs() * 2f64.powi(-8) + mag * k as f64 * f32::EPSILON as f64;
        assert!(
            (got - r).abs() <= tol,
            "{dtype} {scaling:?} {m}x{n}x{k} on {target:?}: element {idx}: got {got}, want {r} (tolerance {tol})"
        );
    }
}

#[test]
fn scaled_fp8_gemms_match_float64() {
    trident_backend_cpu::link();
    let simt = SimtBackend;
    let runs: [(&dyn Backend, Option<&str>); 3] =
        [(&CpuBackend, None), (&simt, Some("sm_90a")), (&simt, Some("gfx942"))];
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    for (backend, target) in runs {
        let dev = backend.open_device(0).unwrap();
        let mut l = DeviceCtx::new(backend, dev.as_ref(), LaunchOptions::default());
        l.target = target.map(str::to_string);
        for (dtype, scaling, mnk) in [
            (DType::F8E4M3FN, Scaling::Block, (1, 200, 300)),
            (DType::F8E4M3FN, Scaling::Row, (33, 64, 129)),
            (DType::F8E5M2, Scaling::Tensor, (40, 70, 256)),
            (DType::F8E5M2, Scaling::Block, (64, 130, 128)),
        ] {
            check(&ScaledGemm::new(dtype, scaling), &l, mnk, &mut rng);
        }
    }
}

/// The descriptor form on sm_90a (cpu-simt): TMA copies into K-major stages and `wgmma` on the
/// FP8 bytes (`k32`, B K-major), checked to be what the lowering made, then run against float64
/// on edge shapes (M = 1, M and N beyond a tile, K not a multiple of the K step).
#[test]
fn the_descriptor_form_runs_wgmma_on_fp8() {
    trident_backend_cpu::link();
    let sm90a = trident_core::target::lookup("sm_90a").unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    let dev = SimtBackend.open_device(0).unwrap();
    let mut l = DeviceCtx::new(&SimtBackend, dev.as_ref(), LaunchOptions::default());
    l.target = Some("sm_90a".into());
    for (dtype, scaling, mnk) in [
        (DType::F8E4M3FN, Scaling::Row, (1, 200, 256)),
        (DType::F8E5M2, Scaling::Tensor, (130, 136, 144)),
        (DType::F8E4M3FN, Scaling::Tensor, (64, 128, 384)),
        // Block scales: each K block's partial promoted with its scales (B's blocks change at
        // N = 128, the last K block is partial).
        (DType::F8E4M3FN, Scaling::Block, (1, 200, 400)),
        (DType::F8E5M2, Scaling::Block, (130, 256, 272)),
    ] {
        let op = ScaledGemm::for_target(dtype, scaling, Some(sm90a));
        assert!(op.descriptors, "{dtype} {scaling:?}");
        let f = ScaledGemm { divisible: true, ..op }.build().unwrap();
        let k = trident_core::simt::lower(&f, sm90a).unwrap();
        let text = k.to_string();
        let fmt = if dtype == DType::F8E4M3FN { "f8e4m3fn" } else { "f8e5m2" };
        assert!(text.contains(&format!("k32.{fmt} a")), "{dtype}: no FP8 wgmma in\n{text}");
        assert!(!text.contains(".trans_b") && !text.contains("fp8.convert"), "{dtype}: B transposed or converted");
        assert!(text.contains("tma.load"), "{dtype}: no TMA copies");
        assert!(text.contains("tma.store"), "{dtype}: C not by a TMA store");
        // Tensor and row scaling with a producer warp (the lowering's specialized region).
        assert_eq!(text.contains("specialized producer"), scaling != Scaling::Block, "{dtype} {scaling:?}");
        check(&op, &l, mnk, &mut rng);
    }
    // Without the producer warp and the persistent loop, and with either alone.
    for (warp_specialize, persistent) in [(false, false), (true, false), (false, true)] {
        let base = ScaledGemm::for_target(DType::F8E5M2, Scaling::Row, Some(sm90a));
        check(&ScaledGemm { warp_specialize, persistent, ..base }, &l, (136, 200, 272), &mut rng);
    }
    // Each K step's product added in f32 (a promotion without scales).
    for scaling in [Scaling::Tensor, Scaling::Row] {
        let promoted = ScaledGemm { promote: true, ..ScaledGemm::for_target(DType::F8E4M3FN, scaling, Some(sm90a)) };
        let k = trident_core::simt::lower(&ScaledGemm { divisible: true, ..promoted }.build().unwrap(), sm90a).unwrap();
        assert!(k.to_string().contains("k32.f8e4m3fn a") && !k.to_string().contains("specialized producer"));
        check(&promoted, &l, (130, 200, 400), &mut rng);
    }
    // One warpgroup (64-row tiles), as the benchmark's small-M configuration.
    for scaling in [Scaling::Row, Scaling::Block] {
        let base = ScaledGemm::for_target(DType::F8E4M3FN, scaling, Some(sm90a));
        let small = ScaledGemm { block_m: 64, warps: 4, warp_specialize: false, persistent: false, ..base };
        check(&small, &l, (100, 136, 272), &mut rng);
    }
    // Two `wgmma` row bands per warp: 128 rows on one warpgroup (K steps of 64, the
    // benchmark's two-programs-per-SM configuration) and 256 rows on two, with the producer
    // warp, the persistent loop and the TMA store, and block scales' promotion on one
    // warpgroup's 128 rows. The fourth is the flat persistent loop without a producer warp,
    // whose row scales pass through shared memory in each tile's epilogue: that object once
    // took bytes of the TMA store's staging tile, which the last tile's bulk read may still be
    // reading (16 elements of C came out zero).
    let row = ScaledGemm::for_target(DType::F8E4M3FN, Scaling::Row, Some(sm90a));
    let block = ScaledGemm::for_target(DType::F8E4M3FN, Scaling::Block, Some(sm90a));
    for (bands, mnk) in [
        (ScaledGemm { warps: 4, block_k: 64, ..row }, (200, 264, 400)),
        (ScaledGemm { block_m: 256, stages: 3, ..row }, (300, 136, 272)),
        (ScaledGemm { warps: 4, ..block }, (130, 200, 400)),
        (ScaledGemm { block_m: 256, stages: 3, warp_specialize: false, ..row }, (300, 136, 272)),
    ] {
        let k = trident_core::simt::lower(&ScaledGemm { divisible: true, ..bands }.build().unwrap(), sm90a).unwrap();
        let per_step = (bands.block_m / (16 * bands.warps) * bands.block_k / 32) as usize;
        assert_eq!(k.to_string().matches("wgmma.m64n128k32").count(), per_step, "{bands:?}");
        check(&bands, &l, mnk, &mut rng);
    }
    // Consumer ping-pong: two groups of 4 consumer warps take 128 x 128 tiles in turn (each
    // group's epilogue, its barriers and its TMA store staging its own), on more tiles than
    // cpu-simt's persistent programs so that both groups run several.
    let pingpong = row.with_pingpong();
    let k = trident_core::simt::lower(&ScaledGemm { divisible: true, ..pingpong }.build().unwrap(), sm90a).unwrap();
    assert!(
        k.to_string().contains("two groups taking turns")
            && k.threads() == 384
            && k.to_string().contains("setmaxnreg 40 / 232"),
        "{pingpong:?}"
    );
    // The row scales' layout conversion in the epilogue has a copy per group (512 bytes each):
    // one copy would let a group overwrite the scales the other is still reading. cpu-simt's
    // round-robin groups cannot show that race, so the lowering's objects are checked here.
    let relayouts: Vec<u32> = k.shared_objects.iter().filter(|o| o.name == "relayout").map(|o| o.bytes).collect();
    assert!(!relayouts.is_empty() && relayouts.iter().all(|&b| b == 2 * 512), "{relayouts:?}");
    check(&pingpong, &l, (520, 392, 272), &mut rng);
    // `for_problem`'s wide tiles above 256 rows (128 x 256, 4 stages), not with a promotion.
    let wide = ScaledGemm::for_problem(DType::F8E5M2, Scaling::Tensor, Some(sm90a), 300, false);
    assert_eq!((wide.block_n, wide.stages), (256, 4));
    assert_eq!(ScaledGemm::for_problem(DType::F8E5M2, Scaling::Tensor, Some(sm90a), 300, true).block_n, 128);
    assert_eq!(ScaledGemm::for_problem(DType::F8E5M2, Scaling::Row, Some(sm90a), 256, false).block_n, 128);
    check(&wide, &l, (300, 520, 272), &mut rng);
    // The benchmark's small-M tiles: 128 x 64 and 64 x 128 over 6 stages, producer warp and
    // persistent loop.
    let row = ScaledGemm::for_target(DType::F8E4M3FN, Scaling::Row, Some(sm90a));
    check(&ScaledGemm { block_n: 64, stages: 6, ..row }, &l, (130, 200, 272), &mut rng);
    check(&ScaledGemm { block_m: 64, warps: 4, block_n: 128, stages: 6, ..row }, &l, (130, 200, 272), &mut rng);
    // K steps of 256 bytes: two swizzle atoms along K in each stage.
    let wide =
        ScaledGemm { block_k: 256, stages: 2, ..ScaledGemm::for_target(DType::F8E4M3FN, Scaling::Row, Some(sm90a)) };
    check(&wide, &l, (72, 130, 512), &mut rng);
    // Operands TMA cannot read (K not a multiple of 16) keep the portable form.
    check(&ScaledGemm::for_target(DType::F8E4M3FN, Scaling::Row, Some(sm90a)), &l, (16, 32, 40), &mut rng);
}

#[test]
fn a_scaled_gemm_refuses_bad_problems() {
    trident_backend_cpu::link();
    let dev = CpuBackend.open_device(0).unwrap();
    let l = DeviceCtx::new(&CpuBackend, dev.as_ref(), LaunchOptions::default());
    let buf = dev.alloc(64, "small").unwrap();
    let e = ScaledGemm::new(DType::BF16, Scaling::Row).run(&l, &buf, &buf, &buf, &buf, &buf, (2, 2, 2)).unwrap_err();
    assert!(e.to_string().contains("an FP8 type is needed"), "{e}");
    let e =
        ScaledGemm::new(DType::F8E4M3FN, Scaling::Row).run(&l, &buf, &buf, &buf, &buf, &buf, (8, 8, 8)).unwrap_err();
    assert!(e.to_string().contains("scale_a") || e.to_string().contains("has 64 bytes"), "{e}");
    let op = ScaledGemm { block_n: 48, ..ScaledGemm::new(DType::F8E4M3FN, Scaling::Block) };
    let e = op.run(&l, &buf, &buf, &buf, &buf, &buf, (1, 1, 1)).unwrap_err();
    assert!(e.to_string().contains("does not divide 128"), "{e}");
}

/// The row-scaled epilogue multiplies the accumulator where `wgmma` left it, reading each
/// element's row and column scales, rather than converting the f32 tile through shared memory
/// to the scales' layout: the 128 x 256 tile with three 48 KB stages fits sm_90a's shared
/// memory beside its TMA store's 64 KB tile (it needed 272 KB with the conversion and was
/// refused).
#[test]
fn the_row_scaled_epilogue_stays_in_the_accumulator_layout() {
    use trident_kernels::scaled_gemm::{ScaledGemm, Scaling};
    let sm90a = trident_core::target::lookup("sm_90a").unwrap();
    let op = ScaledGemm::for_target(DType::F8E4M3FN, Scaling::Row, Some(sm90a));
    let wide = ScaledGemm { block_n: 256, stages: 3, divisible: true, ..op };
    let k = trident_core::simt::lower(&wide.build().unwrap(), sm90a).unwrap();
    let (stages, store) = (3 * (128 + 256) * 128, 128 * 256 * 2);
    assert!(k.shared_bytes <= stages + store + 4096, "{} bytes of shared memory", k.shared_bytes);
}
