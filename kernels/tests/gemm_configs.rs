//! The GEMM's sm_90a configurations that the conformance suite's default does not reach (four
//! and five `wgmma` stages, one warpgroup or two), executed by `cpu-simt` for sm_90a against an
//! f64 reference on fresh inputs with a poisoned output, on shapes that are and are not
//! multiples of the tile (the divisible specialization and the masked one), with A and B read
//! through pointers (`cp.async`) and through tensor descriptors (TMA on an mbarrier ring).

mod gemm_check;

use gemm_check::check;
use rand::SeedableRng;
use trident_backend_cpu::simt_exec::SimtBackend;
use trident_core::backend::{Backend, LaunchOptions};
use trident_core::ir::DType;
use trident_kernels::gemm::Gemm;
use trident_kernels::DeviceCtx;

#[test]
fn wgmma_pipelines_of_four_and_five_stages() {
    trident_backend_nvidia::link();
    let dev = SimtBackend.open_device(0).unwrap();
    let mut l = DeviceCtx::new(&SimtBackend, dev.as_ref(), LaunchOptions::default());
    l.target = Some("sm_90a".into());
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    for (bm, bn, warps, stages) in [(64, 128, 4, 4), (128, 128, 8, 5)] {
        let g = Gemm { block_m: bm, block_n: bn, block_k: 64, warps, stages, ..Gemm::new(DType::BF16) };
        check(&l, g, &[(128, 128, 384), (70, 136, 200)], &mut rng);
    }
}

/// Descriptor blocks copied by TMA: rows and columns past M, N and K read zeros from the
/// copy itself (the shapes are not multiples of the tile), stages 2 to 5 (both refill schemes),
/// one warpgroup and two, with the copies issued by the consumers themselves or by a producer
/// warp (warp specialization: `cpu-simt` interleaves the two sides' loops), and persistent
/// (three programs walking every tile, the copies running on across tiles), with C stored
/// element by element or by a TMA store.
#[test]
fn tma_pipelines_through_descriptors() {
    trident_backend_nvidia::link();
    let dev = SimtBackend.open_device(0).unwrap();
    let mut l = DeviceCtx::new(&SimtBackend, dev.as_ref(), LaunchOptions::default());
    l.target = Some("sm_90a".into());
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    for (bm, bn, bk, warps, stages) in
        [(64, 64, 32, 4, 2), (64, 128, 64, 4, 3), (64, 128, 64, 4, 4), (128, 128, 64, 8, 5), (64, 128, 128, 4, 4)]
    {
        for (warp_specialize, persistent, tma_store) in [
            (false, false, false),
            (true, false, false),
            (false, true, false),
            (false, false, true),
            (true, false, true),
            (false, true, true),
        ] {
            let g = Gemm {
                block_m: bm,
                block_n: bn,
                block_k: bk,
                warps,
                stages,
                descriptors: true,
                warp_specialize,
                persistent,
                tma_store,
                ..Gemm::new(DType::BF16)
            };
            check(&l, g, &[(128, 128, 384), (70, 144, 208), (16, 48, 16)], &mut rng);
        }
    }
}

/// A TMA-pipelined kernel launched with arguments TMA cannot read (no divisibility facts to
/// refuse them first): a typed launch error naming the tensor and the broken rule, no run.
#[test]
fn arguments_tma_cannot_read_are_a_typed_error() {
    use trident_core::backend::KernelArg;
    use trident_core::ir::{InputPrecision, LaunchAttrs, Literal};
    trident_backend_nvidia::link();
    let b = trident_core::KernelBuilder::new("tma_dot", LaunchAttrs { warps: 4, stages: 3, ..LaunchAttrs::default() });
    let (a, bp, c) = (b.arg_ptr("a", DType::BF16), b.arg_ptr("b", DType::BF16), b.arg_ptr("c", DType::F32));
    let (m, n, k) = (b.arg("m", DType::I32), b.arg("n", DType::I32), b.arg("k", DType::I32));
    let one = b.constant(Literal::Int(1), DType::I32);
    let (da, db) = (b.make_desc(a, [m, k], [k, one], [64, 64]), b.make_desc(bp, [k, n], [n, one], [64, 64]));
    let zero = b.constant(Literal::Int(0), DType::I32);
    let acc = b.zeros(&[64, 64], DType::F32);
    let out = b.for_range(0, k, 64, &[acc], |k0, carried| {
        let (ta, tb) = (b.desc_load(da, [zero, k0]), b.desc_load(db, [k0, zero]));
        vec![b.dot(ta, tb, carried[0], InputPrecision::Ieee)]
    });
    let (rows, cols) = (b.arange(0, 64).expand_dims(1), b.arange(0, 64).expand_dims(0));
    b.store(c + rows * n + cols, out[0], Some(rows.lt(m) & cols.lt(n)));
    let f = b.finish().unwrap();
    let kernel = SimtBackend.compile(&f, Some("sm_90a")).unwrap();
    assert!(kernel.text.contains("tma.load"), "the loop is copied by TMA:\n{}", kernel.text);
    let dev = SimtBackend.open_device(0).unwrap();
    let (ab, bb, cb) = (
        dev.alloc(2 * 64 * 72, "a").unwrap(),
        dev.alloc(2 * 72 * 64, "b").unwrap(),
        dev.alloc(4 * 64 * 64, "c").unwrap(),
    );
    // k = 12: A's rows are 24 bytes apart, not a multiple of 16.
    let args = [ab.arg(), bb.arg(), cb.arg(), KernelArg::i32(64), KernelArg::i32(64), KernelArg::i32(12)];
    let e = dev.launch(&kernel, [1, 1, 1], &args, &LaunchOptions::default()).unwrap_err().to_string();
    assert!(e.contains("tensor map of %a") && e.contains("row stride 12 elements (24 bytes)"), "{e}");
}

/// Consumer ping-pong where the lowering cannot run it (a kernel without a persistent tile
/// loop of TMA and `wgmma` steps) is a typed error naming it, not a kernel whose two consumer
/// groups would both run everything.
#[test]
fn pingpong_without_its_loop_is_refused() {
    let sm90a = trident_core::target::lookup("sm_90a").unwrap();
    let text = r#"
kernel @copy(%x: !ptr<f32>, %out: !ptr<f32>) attributes {warps = 4, stages = 2, cooperative = false, warp_specialize = true, persistent = true, pingpong = true} {
  %lanes = arange 0, 128 : tile<128xi32>
  %xs = splat %x : tile<128x!ptr<f32>>
  %xp = addptr %xs, %lanes : tile<128x!ptr<f32>>
  %v = load %xp : tile<128xf32>
  %os = splat %out : tile<128x!ptr<f32>>
  %op = addptr %os, %lanes : tile<128x!ptr<f32>>
  store %op, %v
  return
}
"#;
    let f = trident_core::text::parse(text).unwrap();
    assert!(f.attrs.pingpong);
    assert!(trident_core::text::print(&f).contains("pingpong = true"));
    let e = trident_core::simt::lower(&f, sm90a).unwrap_err().to_string();
    assert!(e.contains("ping-pong") && e.contains("producer warp"), "{e}");
    // Where the target has no TMA and `wgmma`, the attribute changes nothing.
    let sm80 = trident_core::target::lookup("sm_80").unwrap();
    assert_eq!(trident_core::simt::lower(&f, sm80).unwrap().threads(), 128);
}

/// A planted ping-pong bug ends with cpu-simt's diagnostic rather than a hang: the stages'
/// "empty" mbarriers count both groups' warps (8) where one group consumes each stage (4
/// arrivals), so the producer waits for arrivals that never come. The same kernel unplanted
/// runs (its values are checked by the conformance case `gemm f32acc-pingpong`).
#[test]
fn a_pingpong_ring_that_counts_both_groups_deadlocks_with_a_diagnostic() {
    use std::sync::Arc;
    use trident_core::backend::{Artifact, KernelArg};
    use trident_core::simt::Inst;
    let sm90a = trident_core::target::lookup("sm_90a").unwrap();
    let g = Gemm { tma_store: true, divisible: true, ..Gemm::new(DType::BF16).with_pingpong(4) };
    let f = g.build().unwrap();
    let dev = SimtBackend.open_device(0).unwrap();
    let (m, n, k) = (512usize, 512usize, 256usize);
    let (ab, bb, cb) =
        (dev.alloc(2 * m * k, "a").unwrap(), dev.alloc(2 * k * n, "b").unwrap(), dev.alloc(2 * m * n, "c").unwrap());
    let i = |x: usize| KernelArg::i32(x as i32);
    let args = [ab.arg(), bb.arg(), cb.arg(), i(m), i(n), i(k), i(k), i(n), i(n)];
    let launch = |plant: bool| {
        let mut kernel = trident_core::simt::lower(&f, sm90a).unwrap();
        let mut planted = 0;
        fn walk(body: &mut [Inst], plant: bool, planted: &mut u32) {
            for inst in body {
                if let Inst::MbarrierInit { count, .. } = inst {
                    if plant && *count == 4 {
                        *count = 8;
                        *planted += 1;
                    }
                }
                for b in inst.bodies_mut() {
                    walk(b, plant, planted);
                }
            }
        }
        walk(&mut kernel.body, plant, &mut planted);
        assert_eq!(planted > 0, plant);
        let art = Artifact::new(&f, "cpu-simt", "sm_90a", kernel.to_string(), Arc::new(kernel));
        dev.launch(&art, g.grid(m, n), &args, &LaunchOptions::default())
    };
    launch(false).unwrap();
    let e = launch(true).unwrap_err().to_string();
    assert!(e.contains("pingpong") && e.contains("mbarrier") && e.contains("never completes"), "{e}");
}
