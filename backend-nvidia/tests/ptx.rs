//! PTX snapshots, the "no CUDA driver" path, and a GPU run when a GPU is present.

use trident_backend_nvidia::runtime::CudaDevice;
use trident_backend_nvidia::NvidiaBackend;
use trident_core::backend::{Backend, BackendError, Device, KernelArg, LaunchOptions};
use trident_core::ir::{DType, LaunchAttrs};
use trident_core::target::SM_90A;
use trident_core::{Function, KernelBuilder};

fn vector_add(d: DType) -> Function {
    let b = KernelBuilder::new(&format!("vadd_{d}"), LaunchAttrs::default());
    let (x, y, out) = (b.arg_ptr("x", d), b.arg_ptr("y", d), b.arg_ptr("out", d));
    let n = b.arg("n", DType::I32);
    let offs = b.program_id_x() * 256 + b.arange(0, 256);
    let m = offs.lt(n);
    b.store(out + offs, b.load(x + offs, Some(m), None) + b.load(y + offs, Some(m), None), Some(m));
    b.finish().unwrap()
}

#[test]
fn vector_add_ptx_snapshots() {
    for d in [DType::F32, DType::BF16] {
        let m = NvidiaBackend::ptx(&vector_add(d), &SM_90A).unwrap();
        insta::assert_snapshot!(format!("vadd_{d}_sm_90a"), m.ptx);
    }
}

/// A programmatic dependent waits for the kernel before it (`griddepcontrol.wait`) before its
/// first load, on the targets with programmatic dependent launch (sm_90, sm_90a); elsewhere the
/// attribute lowers to nothing, and an ordinary kernel's PTX has no such wait.
#[test]
fn a_programmatic_dependent_waits_for_the_kernel_before_it_first() {
    use trident_core::target::{SM_80, SM_90};
    let programmatic = |on: bool| {
        let mut f = vector_add(DType::F32);
        f.attrs.programmatic = on;
        f
    };
    for target in [&SM_90A, &SM_90] {
        let module = NvidiaBackend::ptx(&programmatic(true), target).unwrap();
        // The runtime launches it as a programmatic dependent (`cuLaunchKernelEx`).
        assert!(module.programmatic, "{}", target.name);
        let ptx = module.ptx;
        let (wait, load) = (ptx.find("griddepcontrol.wait;"), ptx.find("ld.global"));
        assert!(wait.is_some() && wait < load, "{}: {ptx}", target.name);
        assert_eq!(ptx.matches("griddepcontrol").count(), 1, "{}", target.name);
        assert!(!NvidiaBackend::ptx(&programmatic(false), target).unwrap().ptx.contains("griddepcontrol"));
    }
    let sm80 = NvidiaBackend::ptx(&programmatic(true), &SM_80).unwrap();
    assert!(!sm80.programmatic && !sm80.ptx.contains("griddepcontrol"));
    assert!(!NvidiaBackend::ptx(&programmatic(false), &SM_90A).unwrap().programmatic);
    // The attribute round-trips through the text format.
    let text = trident_core::text::print(&programmatic(true));
    assert!(text.contains("programmatic = true"), "{text}");
    let back = trident_core::text::parse(&text).unwrap();
    assert!(back.attrs.programmatic);
}

#[test]
fn unsupported_ops_are_a_typed_compile_error() {
    let b = KernelBuilder::new("who", LaunchAttrs::default());
    let x = b.arg_ptr("x", DType::F32);
    use trident_core::ir::{AtomicOp, MemSemantic, Scope};
    b.atomic(AtomicOp::Max, x, 1.0f32, None, MemSemantic::Relaxed, Scope::Gpu);
    let e = NvidiaBackend.compile(&b.finish().unwrap(), Some("sm_90")).unwrap_err();
    assert!(matches!(&e, BackendError::Compile { kernel, .. } if kernel == "who"), "{e}");
    assert!(e.to_string().contains("atomic `max`"), "{e}");
    // Tiles whose staging overflows the target's shared memory (227 KiB on Hopper) are a compile error.
    let big = {
        let b = KernelBuilder::new("big_dot", LaunchAttrs::default());
        let c = b.arg_ptr("c", DType::F32);
        let (x, y) = (b.zeros(&[256, 256], DType::F32), b.zeros(&[256, 256], DType::F32));
        let acc = b.dot(x, y, b.zeros(&[256, 256], DType::F32), trident_core::ir::InputPrecision::Ieee);
        let offs = b.arange(0, 256).expand_dims(1) * 256i32 + b.arange(0, 256).expand_dims(0);
        b.store(c + offs, acc, None);
        b
    };
    let e = NvidiaBackend.compile(&big.finish().unwrap(), Some("sm_90")).unwrap_err();
    assert!(e.to_string().contains("bytes of shared memory") && e.to_string().contains("232448"), "{e}");
    let e = NvidiaBackend.compile(&vector_add(DType::F32), Some("sm_70")).unwrap_err();
    assert!(e.to_string().contains("does not support target `sm_70`"), "{e}");
}

/// Runs on a GPU machine; elsewhere it must fail with the typed "no CUDA driver" error, never panic.
#[test]
fn vector_add_on_the_gpu_or_no_device() {
    let dev = match CudaDevice::open(0) {
        Ok(d) => d,
        Err(BackendError::NoDevice { reason, .. }) => {
            eprintln!("skipped: {reason}");
            assert!(reason.contains("no CUDA driver") || reason.contains("device"), "{reason}");
            return;
        }
        Err(e) => panic!("unexpected error: {e}"),
    };
    let n = 1000usize;
    let k = NvidiaBackend.compile(&vector_add(DType::F32), None).unwrap();
    let xs: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let ys: Vec<f32> = (0..n).map(|i| 3.0 - i as f32).collect();
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (x, y, out) =
        (dev.alloc(n * 4, "x").unwrap(), dev.alloc(n * 4, "y").unwrap(), dev.alloc(n * 4, "out").unwrap());
    dev.write(&x, 0, &bytes(&xs)).unwrap();
    dev.write(&y, 0, &bytes(&ys)).unwrap();
    dev.fill(&out, &f32::NAN.to_le_bytes()).unwrap();
    dev.launch(&k, [4, 1, 1], &[x.arg(), y.arg(), out.arg(), KernelArg::i32(n as i32)], &LaunchOptions::default())
        .unwrap();
    let mut raw = vec![0u8; n * 4];
    dev.read(&out, 0, &mut raw).unwrap();
    for (i, c) in raw.chunks(4).enumerate() {
        assert_eq!(f32::from_le_bytes([c[0], c[1], c[2], c[3]]), xs[i] + ys[i], "element {i}");
    }
}
