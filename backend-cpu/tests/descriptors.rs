//! Tensor descriptors (`make_desc`, `desc_load`, `desc_store`): blocks read 0 outside the
//! tensor and stores leave outside elements alone, on the tile-IR interpreter and on the SIMT
//! lowering (`cpu-simt`, warp 32 and wave 64), against a host reference on fresh inputs with
//! poisoned outputs; the text format round-trips them and the verifier rejects misuse.

use rand::{Rng, SeedableRng};
use trident_backend_cpu::simt_exec::SimtBackend;
use trident_backend_cpu::CpuBackend;
use trident_core::backend::{Backend, KernelArg, LaunchOptions};
use trident_core::ir::*;
use trident_core::{Function, KernelBuilder};

const BM: u32 = 16;
const BN: u32 = 32;

/// `y[i, j] = 2 x[i, j] + (row block number)`, one block per program through descriptors; the
/// block reads 0 outside `x`, so the last row and column blocks see zeros there (and do not
/// write outside `y`).
fn scale_kernel() -> Function {
    let b = KernelBuilder::new("desc_scale", LaunchAttrs { warps: 2, ..LaunchAttrs::default() });
    let (x, y) = (b.arg_ptr("x", DType::F32), b.arg_ptr("y", DType::F32));
    let (m, n, ld) = (b.arg("m", DType::I32), b.arg("n", DType::I32), b.arg("ld", DType::I32));
    let one = b.constant(Literal::Int(1), DType::I32);
    let (dx, dy) = (b.make_desc(x, [m, n], [ld, one], [BM, BN]), b.make_desc(y, [m, n], [ld, one], [BM, BN]));
    let (pm, pn) = (b.program_id_x(), b.program_id(Axis::Y));
    let (r0, c0) = (pm * BM as i32, pn * BN as i32);
    let t = b.desc_load(dx, [r0, c0]);
    let bias = pm.cast(DType::F32);
    b.desc_store(dy, [r0, c0], t * 2.0f32 + bias);
    b.finish().unwrap()
}

fn run(backend: &dyn Backend, target: Option<&str>, m: usize, n: usize, ld: usize, seed: u64) {
    let f = scale_kernel();
    let k = backend.compile(&f, target).unwrap();
    let dev = backend.open_device(0).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let x: Vec<f32> = (0..m * ld).map(|_| rng.gen_range(-4.0f32..4.0)).collect();
    let bytes = |v: &[f32]| v.iter().flat_map(|e| e.to_le_bytes()).collect::<Vec<u8>>();
    let (xb, yb) = (dev.alloc(4 * m * ld, "x").unwrap(), dev.alloc(4 * m * ld, "y").unwrap());
    dev.write(&xb, 0, &bytes(&x)).unwrap();
    let poison = f32::from_bits(0x7fc0_dead);
    dev.write(&yb, 0, &bytes(&vec![poison; m * ld])).unwrap();
    let grid = [m.div_ceil(BM as usize) as u32, n.div_ceil(BN as usize) as u32, 1];
    let args = [xb.arg(), yb.arg(), KernelArg::i32(m as i32), KernelArg::i32(n as i32), KernelArg::i32(ld as i32)];
    dev.launch(&k, grid, &args, &LaunchOptions::default()).unwrap();
    let mut raw = vec![0u8; 4 * m * ld];
    dev.read(&yb, 0, &mut raw).unwrap();
    let y: Vec<f32> = raw.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let who = format!("{} {target:?} {m}x{n} ld {ld}", backend.descriptor().name);
    for i in 0..m {
        for j in 0..ld {
            let got = y[i * ld + j];
            if j < n {
                let want = 2.0 * x[i * ld + j] as f64 + (i / BM as usize) as f64;
                assert!(
                    (got as f64 - want).abs() <= 1e-6 * want.abs().max(1.0),
                    "{who}: y[{i},{j}] = {got}, want {want}"
                );
            } else {
                assert_eq!(got.to_bits(), poison.to_bits(), "{who}: y[{i},{j}] outside the tensor was written");
            }
        }
    }
}

#[test]
fn descriptor_blocks_read_zero_outside_and_store_inside_only() {
    trident_backend_nvidia::link();
    trident_backend_amd::link();
    // Shapes that are and are not multiples of the block; a row stride wider than the tensor
    // (the columns beyond `n` belong to no one and stay poisoned).
    for (i, (m, n, ld)) in [(32, 64, 64), (37, 45, 50), (5, 3, 7)].into_iter().enumerate() {
        run(&CpuBackend, None, m, n, ld, 11 + i as u64);
        for t in ["sm_90a", "gfx942"] {
            run(&SimtBackend, Some(t), m, n, ld, 23 + i as u64);
        }
    }
}

#[test]
fn descriptors_in_text_and_the_verifier() {
    let f = scale_kernel();
    let text = trident_core::text::print(&f);
    assert!(text.contains("make_desc") && text.contains("!desc<f32, 16x32>") && text.contains("desc_store"), "{text}");
    let back = trident_core::text::parse(&text).unwrap();
    assert_eq!(trident_core::text::print(&back), text);
    // A descriptor carried by a parameter is refused: backends must see its parts.
    let b = KernelBuilder::new("bad", LaunchAttrs::default());
    let x = b.arg_ptr("x", DType::F32);
    let d = b.arg_typed("d", Type::scalar(Elem::Desc { dtype: DType::F32, block: [16, 32] }));
    let _ = b.desc_load(d, [0i32, 0i32]);
    let _ = x;
    let e = b.finish().unwrap_err().to_string();
    assert!(e.contains("must be the result of `make_desc`"), "{e}");
    // A block that is not a power of two.
    let b = KernelBuilder::new("bad", LaunchAttrs::default());
    let x = b.arg_ptr("x", DType::F32);
    let _ = b.make_desc(x, [4i32, 4i32], [4i32, 1i32], [3, 4]);
    let e = b.finish().unwrap_err().to_string();
    assert!(e.contains("not powers of two"), "{e}");
}

/// The same kernel for the GPU writers (compiled here; run on the GPU machine's suite later).
#[test]
fn descriptors_compile_for_gpu_targets() {
    trident_backend_nvidia::link();
    trident_backend_amd::link();
    let f = scale_kernel();
    let ptx = trident_backend_nvidia::NvidiaBackend.compile(&f, Some("sm_90a")).unwrap();
    assert!(ptx.text.contains("ld.global"), "{}", ptx.text);
    let ll = trident_backend_amd::AmdBackend::llvm_ir(&f, trident_core::target::lookup("gfx942").unwrap()).unwrap().1;
    assert!(ll.contains("load"), "{ll}");
}
