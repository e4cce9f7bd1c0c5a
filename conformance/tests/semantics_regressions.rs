//! One regression test per class of wrong answers found by running kernels outside the
//! catalogue (issue 8). Each failed on the commit before the fix; the differential test
//! (`trident ops`) covers every op x type, these pin the specific findings.

use trident_core::backend::{self, Backend, KernelArg, LaunchOptions};
use trident_core::ir::{AtomicOp, BinaryOp, DType, LaunchAttrs, Literal, MemSemantic, Scope, UnaryOp};
use trident_core::simt::{lower, Inst, SType};
use trident_core::{Function, KernelBuilder};

fn backend(name: &str) -> Box<dyn Backend> {
    trident_conformance::link_backends();
    (backend::lookup(name).expect("linked").create)()
}

fn ptx(f: &Function) -> String {
    backend("nvidia").compile(f, Some("sm_90a")).expect("compiles for sm_90a").text
}

/// `out[i] = op(x[i])` over a 128-element tile (4 warps).
fn unary_kernel(name: &str, d: DType, op: impl Fn(trident_core::Tile<'_>) -> trident_core::Tile<'_>) -> Function {
    let b = KernelBuilder::new(name, LaunchAttrs::default());
    let (x, out) = (b.arg_ptr("x", d), b.arg_ptr("out", d));
    let offs = b.arange(0, 128);
    let v = b.load(x + offs, None, None);
    b.store(out + offs, op(v), None);
    b.finish().expect("valid")
}

/// Runs a one-program kernel over byte buffers on a backend; returns the buffers after.
fn run(
    backend_name: &str,
    target: Option<&str>,
    f: &Function,
    bufs: &[Vec<u8>],
    scalars: &[KernelArg],
) -> Vec<Vec<u8>> {
    let b = backend(backend_name);
    let art = b.compile(f, target).expect("compiles");
    let dev = b.open_device(0).expect("a host device");
    let handles: Vec<_> = bufs
        .iter()
        .enumerate()
        .map(|(i, data)| {
            let h = dev.alloc(data.len(), &format!("b{i}")).expect("alloc");
            dev.write(&h, 0, data).expect("write");
            h
        })
        .collect();
    let mut args: Vec<KernelArg> = handles.iter().map(|h| h.arg()).collect();
    args.extend_from_slice(scalars);
    dev.launch(&art, [1, 1, 1], &args, &LaunchOptions::default()).expect("runs");
    handles
        .iter()
        .zip(bufs)
        .map(|(h, data)| {
            let mut out = vec![0u8; data.len()];
            dev.read(h, 0, &mut out).expect("read");
            out
        })
        .collect()
}

/// Narrow integers: a cast from i32 to i8 truncates (300 -> 44) in the code the GPU runs, and
/// no narrow-integer arithmetic reaches a writer (it used to be computed on 32-bit registers
/// without wrapping, so division, shifts and compares saw 300).
#[test]
fn narrow_integers_wrap_in_gpu_code() {
    let b = KernelBuilder::new("narrow", LaunchAttrs::default());
    let (x, out) = (b.arg_ptr("x", DType::I32), b.arg_ptr("out", DType::I8));
    let offs = b.arange(0, 128);
    let v = b.load(x + offs, None, None).cast(DType::I8);
    let q = v.binary(BinaryOp::Div, b.constant(Literal::Int(3), DType::I8));
    b.store(out + offs, q, None);
    let f = b.finish().expect("valid");
    let k = lower(&f, &trident_core::target::SM_90A).expect("lowers");
    fn narrow_arith(body: &[Inst], k: &trident_core::simt::Kernel) -> bool {
        body.iter().any(|i| match i {
            Inst::Binary { dst, .. } | Inst::Unary { dst, .. } => matches!(k.ty(*dst), SType::Int { bits: 8 | 16, .. }),
            Inst::Loop { body, .. } => narrow_arith(body, k),
            _ => false,
        })
    }
    assert!(!narrow_arith(&k.body, &k), "8-bit arithmetic reached the writer");
    let text = ptx(&f);
    assert!(text.contains("cvt.s8."), "no truncating conversion to s8 in:\n{text}");
    // And on the host execution of the same lowering: 300 -> 44, 44 / 3 = 14.
    let mut x = vec![0u8; 512];
    x[..4].copy_from_slice(&300i32.to_le_bytes());
    x[4..8].copy_from_slice(&(-129i32).to_le_bytes());
    let outs = run("cpu-simt", None, &f, &[x, vec![0; 128]], &[]);
    assert_eq!(outs[1][0] as i8, 14);
    assert_eq!(outs[1][1] as i8, 42);
}

/// Atomics on a tile smaller than the program's threads act once per element: 32 tickets from
/// a 32-element tile with 4 warps, not 128.
#[test]
fn tile_atomics_act_once_per_element() {
    for target in ["sm_90a", "gfx942"] {
        let b = KernelBuilder::new("tickets", LaunchAttrs::default());
        let (counter, out) = (b.arg_ptr("counter", DType::I32), b.arg_ptr("out", DType::I32));
        let offs = b.arange(0, 32);
        let ptrs = (counter + b.i32(0)).splat(&[32]);
        let one = b.full(&[32], 1.0, DType::I32);
        let old = b.atomic(AtomicOp::Add, ptrs, one, None, MemSemantic::Relaxed, Scope::Gpu);
        b.store(out + offs, old, None);
        let f = b.finish().expect("valid");
        let outs = run("cpu-simt", Some(target), &f, &[vec![0; 4], vec![0xff; 128]], &[]);
        assert_eq!(i32::from_le_bytes(outs[0][..4].try_into().unwrap()), 32, "{target}: counter");
        let mut tickets: Vec<i32> = outs[1].chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect();
        tickets.sort();
        assert_eq!(tickets, (0..32).collect::<Vec<_>>(), "{target}: every element gets its own ticket");
    }
}

/// Transcendentals are accurate by default: no hardware approximation in the PTX of `exp`,
/// `log`, `log2`, `sin`, `cos`, `tanh`, `rsqrt` (it used to be `ex2.approx` and friends:
/// `log2` 816 ulp off near 1.0).
#[test]
fn default_math_uses_no_hardware_approximation() {
    for op in [UnaryOp::Exp, UnaryOp::Log, UnaryOp::Log2, UnaryOp::Sin, UnaryOp::Cos, UnaryOp::Tanh, UnaryOp::Rsqrt] {
        let f = unary_kernel("math", DType::F32, |v| v.apply(op));
        let text = ptx(&f);
        assert!(
            !text.contains(".approx"),
            "`{op}` uses an approximation:\n{}",
            text.lines().find(|l| l.contains(".approx")).unwrap_or("")
        );
    }
}

/// Float remainder compiles for the GPU (it was a typed error) and is exact on the host
/// execution of the same lowering.
#[test]
fn float_remainder_is_emitted_and_exact() {
    let b = KernelBuilder::new("frem", LaunchAttrs::default());
    let (x, y, out) = (b.arg_ptr("x", DType::F32), b.arg_ptr("y", DType::F32), b.arg_ptr("out", DType::F32));
    let offs = b.arange(0, 128);
    let r = b.load(x + offs, None, None).binary(BinaryOp::Rem, b.load(y + offs, None, None));
    b.store(out + offs, r, None);
    let f = b.finish().expect("valid");
    assert!(ptx(&f).contains(".entry frem"));
    let xs: Vec<f32> = (0..128).map(|i| (i as f32 - 64.0) * 1.37e7 + 0.25).collect();
    let ys: Vec<f32> = (0..128).map(|i| 0.3 + i as f32 * 0.01).collect();
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let outs = run("cpu-simt", None, &f, &[bytes(&xs), bytes(&ys), vec![0; 512]], &[]);
    for i in 0..128 {
        let got = f32::from_le_bytes(outs[2][4 * i..4 * i + 4].try_into().unwrap());
        assert_eq!(got.to_bits(), (xs[i] % ys[i]).to_bits(), "{} % {}", xs[i], ys[i]);
    }
}

/// Integer division by zero has a value (RISC-V's), so a division in masked-off lanes (a load
/// with `other = 0`) does not abort the kernel on the CPU, and every backend agrees.
#[test]
fn division_by_zero_in_masked_lanes_is_defined() {
    let b = KernelBuilder::new("div", LaunchAttrs::default());
    let (x, y, out) = (b.arg_ptr("x", DType::I32), b.arg_ptr("y", DType::I32), b.arg_ptr("out", DType::I32));
    let n = b.arg("n", DType::I32);
    let offs = b.arange(0, 128);
    let m = offs.lt(n);
    let zero = b.constant(Literal::Int(0), DType::I32);
    let q = b.load(x + offs, Some(m), Some(zero)).binary(BinaryOp::Div, b.load(y + offs, Some(m), Some(zero)));
    b.store(out + offs, q, Some(m));
    let f = b.finish().expect("valid");
    let ints = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let xs: Vec<i32> = (0..128).map(|i| i * 7 - 300).collect();
    let ys: Vec<i32> = (0..128).map(|i| if i == 5 { 0 } else { i % 9 - 4 }).collect();
    for be in ["cpu", "cpu-simt"] {
        let outs = run(be, None, &f, &[ints(&xs), ints(&ys), vec![0xee; 512]], &[KernelArg::i32(100)]);
        let got: Vec<i32> = outs[2].chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect();
        for i in 0..128 {
            let want = if i >= 100 {
                i32::from_le_bytes([0xee; 4])
            } else if ys[i] == 0 {
                -1
            } else {
                xs[i] / ys[i]
            };
            assert_eq!(got[i], want, "{be}: element {i}");
        }
    }
}

/// A literal that does not fit its type is a verifier error naming the line.
#[test]
fn out_of_range_literals_are_rejected() {
    for (lit, ty) in [("300", "i8"), ("4294967297", "i32"), ("1e39", "f32"), ("-1", "u8"), ("70000", "f16")] {
        let text = format!("kernel @k() attributes {{warps = 4, stages = 2, cooperative = false}} {{\n  %0 = const {lit} : {ty}\n  return\n}}\n");
        let f = trident_core::text::parse(&text).expect("parses");
        let e = trident_core::verify(&f).expect_err(&format!("`const {lit} : {ty}` must not verify"));
        let msg = e.to_string();
        assert!(msg.contains("line 2") && msg.contains("does not fit"), "{msg}");
    }
}

/// A masked `i1` load keeps `other` in masked-off lanes (the PTX writer used to read false).
#[test]
fn masked_i1_loads_keep_other() {
    let b = KernelBuilder::new("bits", LaunchAttrs::default());
    let (x, out) = (b.arg_ptr("x", DType::I1), b.arg_ptr("out", DType::I1));
    let offs = b.arange(0, 128);
    let m = offs.lt(b.i32(64));
    let t = b.constant(Literal::Int(1), DType::I1);
    let v = b.load(x + offs, Some(m), Some(t));
    b.store(out + offs, v, None);
    let f = b.finish().expect("valid");
    let text = ptx(&f);
    // The byte a guarded-off load leaves is the predicate's current value (`other`), not 0.
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let loads: Vec<usize> =
        (1..lines.len()).filter(|&i| lines[i].starts_with('@') && lines[i].contains("ld.global.u8")).collect();
    assert!(!loads.is_empty(), "{text}");
    for i in loads {
        assert!(lines[i - 1].starts_with("selp.u32"), "a masked i1 load starts from `{}`", lines[i - 1]);
    }
    let outs = run("cpu-simt", None, &f, &[vec![0; 128], vec![7; 128]], &[]);
    assert!(outs[1][..64].iter().all(|&b| b == 0) && outs[1][64..].iter().all(|&b| b == 1), "{:?}", outs[1]);
}

/// 16-bit integers loaded by vector accesses are sign- (or zero-) extended into their 32-bit
/// registers (a `b16` vector load left a negative i16's upper bits clear on the H200:
/// -26700 compared greater than 9405).
#[test]
fn sixteen_bit_vector_loads_extend() {
    for (d, want) in [(DType::I16, ".s16"), (DType::U16, ".u16")] {
        let b = KernelBuilder::new("widen", LaunchAttrs::default());
        let (x, out) = (b.arg_ptr("x", d), b.arg_ptr("out", DType::I32));
        let offs = b.arange(0, 1024);
        let v = b.load(x + offs, None, None).cast(DType::I32);
        b.store(out + offs, v, None);
        let text = ptx(&b.finish().expect("valid"));
        let loads: Vec<&str> = text.lines().filter(|l| l.contains("ld.global.v")).collect();
        assert!(!loads.is_empty() && loads.iter().all(|l| l.contains(want)), "{d}: {loads:?}");
    }
}
