//! Divisibility facts: declared on parameters, kept by the text format, used by the lowering
//! to drop alignment tests it proves, and checked at every launch.

use trident_core::backend::{BackendError, KernelArg, LaunchOptions};
use trident_core::ir::{DType, LaunchAttrs};
use trident_core::simt::{lower, Inst};
use trident_core::{text, KernelBuilder};
use trident_kernels::gemm::Gemm;

#[test]
fn a_gemm_specialized_for_divisible_arguments_tests_no_alignment() {
    let aligned = |divisible: bool| {
        let f = Gemm { divisible, stages: 3, ..Gemm::new(DType::BF16) }.build().unwrap();
        let k = lower(&f, &trident_core::target::SM_90A).unwrap();
        trident_core::simt::count(&k.body, &|i| matches!(i, Inst::IsAligned { .. }))
    };
    let (general, divisible) = (aligned(false), aligned(true));
    assert!(general > 0, "the general GEMM tests alignment");
    assert_eq!(divisible, 0, "every alignment test is proven by the facts");
}

#[test]
fn facts_survive_the_text_format_and_bad_ones_are_refused() {
    let f = Gemm { divisible: true, ..Gemm::new(DType::F16) }.build().unwrap();
    let t = text::print(&f);
    assert!(t.contains("%a: !ptr<f16> {align = 16}") && t.contains("%k: i32 {multiple_of = 16}"), "{t}");
    let back = text::parse(&t).unwrap();
    let facts: Vec<Option<u32>> = back.params.iter().map(|p| p.divisibility).collect();
    assert_eq!(facts, f.params.iter().map(|p| p.divisibility).collect::<Vec<_>>());
    for (bad, why) in [
        ("%k: i32 {multiple_of = 12}", "not a power of two"),
        ("%k: i32 {align = 16}", "takes `multiple_of`"),
        ("%k: f32 {multiple_of = 16}", "pointers and integers"),
    ] {
        let src =
            format!("kernel @k({bad}) attributes {{warps = 1, stages = 2, cooperative = false}} {{\n  return\n}}\n");
        let e = text::parse(&src).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains(why) || e.contains("divisibility"), "{bad}: {e}");
    }
}

#[test]
fn launches_check_the_declared_facts() {
    trident_backend_cpu::link();
    trident_backend_nvidia::link();
    let b = KernelBuilder::new("copy", LaunchAttrs::default());
    let (x, out) = (b.arg_ptr_aligned("x", DType::F32, 16), b.arg_ptr("out", DType::F32));
    let n = b.arg_multiple_of("n", DType::I32, 8);
    let i = b.arange(0, 64);
    b.store(out + i, b.load(x + i, Some(i.lt(n)), None), Some(i.lt(n)));
    let f = b.finish().unwrap();
    for backend in ["cpu", "cpu-simt"] {
        let be = (trident_core::backend::lookup(backend).unwrap().create)();
        let k = be.compile(&f, None).unwrap();
        let dev = be.open_device(0).unwrap();
        let (xb, ob) = (dev.alloc(4 * 80, "x").unwrap(), dev.alloc(4 * 64, "out").unwrap());
        let run = |x: KernelArg, n: i32| {
            dev.launch(&k, [1, 1, 1], &[x, ob.arg(), KernelArg::i32(n)], &LaunchOptions::default())
        };
        run(xb.arg(), 64).unwrap();
        let misaligned = KernelArg::Ptr(xb.address + 4);
        let e = run(misaligned, 64).unwrap_err();
        assert!(matches!(&e, BackendError::Argument { param, .. } if param == "x"), "{backend}: {e}");
        assert!(e.to_string().contains("not aligned to 16 bytes"), "{e}");
        let e = run(xb.arg(), 60).unwrap_err();
        assert!(e.to_string().contains("60 is not a multiple of 8"), "{backend}: {e}");
    }
}

/// A GEMM's meta-parameters depend on the target: the same kernel source lowers to MFMA with
/// register-staged prefetch on gfx942, to `wgmma` with four `cp.async` stages on sm_90a and to
/// `mma.sync` on sm_80.
#[test]
fn gemm_meta_parameters_depend_on_the_target() {
    use trident_core::target::{GFX942, SM_90A};
    let (amd, nv) = (Gemm::for_target(DType::BF16, Some(&GFX942)), Gemm::for_target(DType::BF16, Some(&SM_90A)));
    assert_eq!((amd.stages, nv.stages), (2, 4));
    let ampere = Gemm::for_target(DType::BF16, Some(&trident_core::target::SM_80));
    for (g, t, atom) in [
        (amd, &GFX942, "mfma.32x32x8"),
        (nv, &SM_90A, "wgmma"),
        (ampere, &trident_core::target::SM_80, "mma.sync.m16n8k16"),
    ] {
        let k = lower(&g.build().unwrap(), t).unwrap();
        let n = trident_core::simt::count(&k.body, &|i| match i {
            Inst::Matmul { atom: a, .. } => a.name == atom,
            Inst::Wgmma { .. } => atom == "wgmma",
            _ => false,
        });
        assert!(n > 0, "{}: no {atom}", t.name);
        let copies = trident_core::simt::count(&k.body, &|i| matches!(i, Inst::AsyncCopy { .. }));
        assert_eq!(copies > 0, t.name.starts_with("sm_"), "{}", t.name);
    }
}

/// On sm_90a small M gets narrower tiles (more programs) and deeper K tiles (with a producer
/// warp at M <= 128), large M the 128x256 wgmma tile, persistent with a producer warp; all read
/// and write through descriptors (TMA loads and stores); other targets keep their `for_target`
/// choice.
#[test]
fn gemm_tiles_follow_m_on_hopper() {
    use trident_core::target::{GFX942, SM_90A};
    let tile = |m| {
        let g = Gemm::for_problem(DType::BF16, Some(&SM_90A), m);
        (
            g.block_m,
            g.block_n,
            g.block_k,
            g.warps,
            g.stages,
            g.descriptors,
            g.tma_store,
            g.warp_specialize,
            g.persistent,
        )
    };
    assert_eq!(tile(128), (64, 128, 128, 4, 4, true, true, true, false));
    assert_eq!(tile(256), (128, 128, 128, 8, 3, true, true, false, false));
    assert_eq!(tile(8192), (128, 256, 64, 8, 4, true, true, true, true));
    let amd = Gemm::for_problem(DType::BF16, Some(&GFX942), 128);
    assert_eq!((amd.block_m, amd.block_n, amd.stages, amd.descriptors, amd.tma_store), (64, 64, 2, false, false));
    // f32 has no wgmma: the generic choice whatever M.
    assert_eq!(Gemm::for_problem(DType::F32, Some(&SM_90A), 128).block_n, 64);
}

/// The overlap kernels compute on the target's GEMM tiles (on sm_90a the 128x256x64 `wgmma`
/// tile with 4 stages the benchmark chose, not the generic 64x64): the suite runs them so on
/// cpu-simt, the GPU worlds and the NVSHMEM world.
#[test]
fn ag_gemm_and_gemm_rs_use_the_targets_matrix_instructions() {
    use trident_core::target::SM_90A;
    use trident_kernels::ag_gemm::{AgGemm, GatherMode};
    use trident_kernels::gemm_rs::GemmRs;
    let wgmmas = |f: trident_core::Function| {
        let k = lower(&f, &SM_90A).unwrap();
        trident_core::simt::count(&k.body, &|i| matches!(i, Inst::Wgmma { .. }))
    };
    let ag = AgGemm::for_target(DType::BF16, GatherMode::Kernel, Some(&SM_90A));
    assert_eq!((ag.gemm.block_m, ag.gemm.block_n, ag.gemm.descriptors), (128, 256, true));
    assert!(!ag.gemm.persistent && !ag.gemm.warp_specialize, "a program per tile: it waits first");
    assert!(wgmmas(ag.build().unwrap()) > 0, "AG-GEMM on wgmma");
    let rs = GemmRs::for_target(DType::BF16, Some(&SM_90A));
    assert_eq!((rs.gemm.block_m, rs.gemm.block_n, rs.gemm.stages), (128, 256, 4));
    assert!(wgmmas(rs.build_gemm(128).unwrap()) > 0, "GEMM-RS on wgmma");
    // With descriptors and divisible arguments GEMM-RS reads A and B by TMA.
    let tma = |f: trident_core::Function| {
        let k = lower(&f, &SM_90A).unwrap();
        trident_core::simt::count(&k.body, &|i| matches!(i, Inst::TmaLoad { .. }))
    };
    let divisible =
        GemmRs { gemm: trident_kernels::gemm::Gemm { divisible: true, descriptors: true, ..rs.gemm }, ..rs };
    assert!(tma(divisible.build_gemm(128).unwrap()) > 0, "GEMM-RS on TMA");
    assert_eq!(tma(rs.build_gemm(128).unwrap()), 0, "no facts, no TMA");
    // AG-GEMM with divisible arguments reads the gathered A (and B) by TMA after its wait, the
    // async proxy ordered after the wait's acquire, and stores C by TMA.
    let ag_div = AgGemm { gemm: trident_kernels::gemm::Gemm { divisible: true, ..ag.gemm }, ..ag };
    let k = lower(&ag_div.build().unwrap(), &SM_90A).unwrap();
    fn walk(body: &[Inst], order: &mut Vec<&'static str>) {
        for i in body {
            match i {
                Inst::WaitSignals { .. } => order.push("wait"),
                Inst::FenceProxyAsyncGlobal => order.push("fence"),
                Inst::TmaLoad { .. } => order.push("tma"),
                Inst::TmaStore { .. } => order.push("store"),
                _ => {}
            }
            for b in i.bodies() {
                walk(b, order);
            }
        }
    }
    let mut order = Vec::new();
    walk(&k.body, &mut order);
    assert_eq!(order[..3], ["wait", "fence", "tma"], "{order:?}");
    assert!(order.contains(&"store"), "{order:?}");
}
