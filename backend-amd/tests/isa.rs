//! Golden checks on the AMDGCN of the instructions that carry meaning: the MFMA of a `dot`,
//! `s_barrier`, and the cache bits of acquire and release at system and agent scope (gfx942:
//! `sc0 sc1` for the system, `sc1` for the agent; `SHMEM.md`). Needs LLVM 19 (CI installs it);
//! without it the test says so and passes.

use trident_backend_amd::{codeobj, AmdBackend};
use trident_core::ir::*;
use trident_core::KernelBuilder;

fn kernel() -> trident_core::Function {
    let b = KernelBuilder::new("golden", LaunchAttrs::default());
    let (x, y, c) = (b.arg_ptr("x", DType::BF16), b.arg_ptr("y", DType::BF16), b.arg_ptr("c", DType::F32));
    let (sig, cnt) = (b.arg_ptr("sig", DType::U64), b.arg_ptr("cnt", DType::I32));
    let t = b.wait(sig, 1, CmpOp::Ge, 1u64, Scope::Sys, MemSemantic::Acquire);
    let (i, k) = (b.arange(0, 64), b.arange(0, 32));
    let xa = b.load(x.consume_token(t) + i.expand_dims(1) * 32i32 + k.expand_dims(0), None, None);
    let ya = b.load(y + k.expand_dims(1) * 64i32 + i.expand_dims(0), None, None);
    let acc = b.dot(xa, ya, b.zeros(&[64, 64], DType::F32), InputPrecision::Ieee);
    b.store(c + i.expand_dims(1) * 64i32 + i.expand_dims(0), acc, None);
    b.atomic(AtomicOp::Add, cnt, 1i32, None, MemSemantic::Release, Scope::Gpu);
    b.notify(sig, 0, 1u64, SignalOp::Add, CommScope::IntraNode);
    b.finish().unwrap()
}

#[test]
fn mfma_barriers_and_scoped_cache_bits() {
    trident_backend_amd::link();
    let tools = match codeobj::tools() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    let f = kernel();
    for (target, want) in [
        (
            &trident_core::target::GFX942,
            &["v_mfma_f32_32x32x8_bf16", "s_barrier", "buffer_inv sc0 sc1", "buffer_wbl2 sc0 sc1", "buffer_wbl2 sc1"][..],
        ),
        (&trident_core::target::GFX90A, &["v_mfma_f32_32x32x8bf16_1k", "s_barrier"][..]),
    ] {
        let m = AmdBackend::compile_checked(&f, target).unwrap_or_else(|e| panic!("{}: {e}", target.name));
        let asm = codeobj::disassemble(&tools, &m.code_object, target.name).unwrap();
        for w in want {
            assert!(asm.contains(w), "{}: no `{w}` in the disassembly", target.name);
        }
        assert_eq!(m.meta.wavefront_size, 64);
        assert_eq!(m.meta.max_flat_workgroup_size, 256);
        assert_eq!(m.meta.private_segment_fixed_size, 0, "{}: the GEMM spills", target.name);
    }
}

/// The typed errors: a kernel whose code object cannot be made says what failed, in words.
#[test]
fn tool_errors_are_typed() {
    let e = codeobj::CodeObjectError::NoTools("no llc-19".into()).to_string();
    assert!(e.contains("install Debian's llvm-19 and lld-19") && e.contains("TRIDENT_LLVM_DIR"), "{e}");
}

/// Threads of one process building the same kernel at once (`trident test --jobs`) each get
/// their code object: every build works in files of its own (one build's clean-up once removed
/// another's object before its link: "ld.lld: target emulation unknown").
#[test]
fn the_same_kernel_builds_on_several_threads_at_once() {
    let tools = match codeobj::tools() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    let (_, ir) = AmdBackend::llvm_ir(&kernel(), &trident_core::target::GFX942).unwrap_or_else(|e| panic!("{e}"));
    let codes: Vec<Vec<u8>> = std::thread::scope(|s| {
        let builds: Vec<_> =
            (0..6).map(|_| s.spawn(|| codeobj::code_object_uncached(&tools, &ir, "same_kernel", "gfx942"))).collect();
        builds.into_iter().map(|b| b.join().unwrap().unwrap_or_else(|e| panic!("{e}"))).collect()
    });
    assert!(codes.iter().all(|c| c == &codes[0] && c.starts_with(b"\x7fELF")));
}
