//! The CPU backend end to end: op semantics against host computations, program order, and the
//! errors a user sees for faulty kernels and launches.

use rand::{Rng, SeedableRng};
use trident_backend_cpu::CpuBackend;
use trident_core::backend::{Backend, BackendError, Buffer, Device, KernelArg, LaunchOptions};
use trident_core::ir::*;
use trident_core::{text, KernelBuilder};

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn read_f32(dev: &dyn Device, b: &Buffer) -> Vec<f32> {
    let mut bytes = vec![0u8; b.bytes];
    dev.read(b, 0, &mut bytes).unwrap();
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn read_i32(dev: &dyn Device, b: &Buffer) -> Vec<i32> {
    let mut bytes = vec![0u8; b.bytes];
    dev.read(b, 0, &mut bytes).unwrap();
    bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn upload(dev: &dyn Device, name: &str, v: &[f32]) -> Buffer {
    let b = dev.alloc(v.len() * 4, name).unwrap();
    dev.write(&b, 0, &f32_bytes(v)).unwrap();
    b
}

#[test]
fn out_of_bounds_load_names_the_op_and_buffer() {
    let src = "kernel @oob(%x: !ptr<f32>, %y: !ptr<f32>) {
  %0 = arange 0, 64 : tile<64xi32>
  %1 = splat %x : tile<64x!ptr<f32>>
  %2 = addptr %1, %0 : tile<64x!ptr<f32>>
  %3 = load %2 : tile<64xf32>
  %4 = splat %y : tile<64x!ptr<f32>>
  %5 = addptr %4, %0 : tile<64x!ptr<f32>>
  store %5, %3
  return
}";
    let f = text::parse(src).unwrap();
    let backend = CpuBackend;
    let k = backend.compile(&f, None).unwrap();
    let dev = backend.open_device(0).unwrap();
    let x = upload(dev.as_ref(), "x_small", &[1.0; 32]);
    let y = dev.alloc(64 * 4, "y").unwrap();
    let err = dev.launch(&k, [1, 1, 1], &[x.arg(), y.arg()], &LaunchOptions::default()).unwrap_err();
    match &err {
        BackendError::Execution { op, loc, message, program, .. } => {
            assert!(op.starts_with("load"), "{op}");
            assert_eq!(loc.map(|l| l.line), Some(5));
            assert_eq!(*program, [0, 0, 0]);
            assert!(message.contains("out of bounds") && message.contains("x_small"), "{message}");
        }
        other => panic!("expected an execution error, got {other}"),
    }
    assert!(err.to_string().contains("line 5"), "{err}");
}

#[test]
fn launch_arguments_are_checked() {
    let b = KernelBuilder::new("k", LaunchAttrs::default());
    let x = b.arg_ptr("x", DType::F32);
    let n = b.arg("n", DType::I32);
    b.store(x + b.arange(0, 4), 1.0f32, Some(b.arange(0, 4).lt(n)));
    let f = b.finish().unwrap();
    let k = CpuBackend.compile(&f, None).unwrap();
    let dev = CpuBackend.open_device(0).unwrap();
    let buf = dev.alloc(16, "x").unwrap();
    let e = dev.launch(&k, [1, 1, 1], &[buf.arg(), KernelArg::f32(1.0)], &LaunchOptions::default()).unwrap_err();
    assert!(matches!(&e, BackendError::Argument { index: 1, param, .. } if param == "n"), "{e}");
    let e = dev.launch(&k, [1, 1, 1], &[buf.arg()], &LaunchOptions::default()).unwrap_err();
    assert!(e.to_string().contains("1 arguments given, the kernel takes 2"), "{e}");
    let e = dev.launch(&k, [0, 1, 1], &[buf.arg(), KernelArg::i32(4)], &LaunchOptions::default()).unwrap_err();
    assert!(matches!(e, BackendError::Launch { .. }), "{e}");
    let e = CpuBackend.compile(&f, Some("sm_90")).unwrap_err();
    assert!(e.to_string().contains("does not support target `sm_90`"), "{e}");
}

#[test]
fn unsatisfiable_wait_is_a_diagnostic_not_a_hang() {
    let b = KernelBuilder::new("waits", LaunchAttrs::default());
    let sig = b.arg_ptr("sig", DType::U64);
    let t = b.wait(sig, 1, CmpOp::Ge, 5u64, Scope::Sys, MemSemantic::Acquire);
    let _ = b.rank().consume_token(t);
    let f = b.finish().unwrap();
    let k = CpuBackend.compile(&f, None).unwrap();
    let dev = CpuBackend.open_device(0).unwrap();
    let s = dev.alloc(8, "sig").unwrap();
    dev.write(&s, 0, &3u64.to_le_bytes()).unwrap();
    let e = dev.launch(&k, [1, 1, 1], &[s.arg()], &LaunchOptions::default()).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("wait") && msg.contains("is 3") && msg.contains("ge 5"), "{msg}");
    // Once the signal holds, the same launch completes.
    dev.write(&s, 0, &5u64.to_le_bytes()).unwrap();
    dev.launch(&k, [1, 1, 1], &[s.arg()], &LaunchOptions::default()).unwrap();
}

/// Transpose, reductions, casts, compares, select and math on random data, against the host.
#[test]
fn tile_ops_match_host_computation() {
    const R: usize = 8;
    const C: usize = 16;
    let b = KernelBuilder::new("ops", LaunchAttrs::default());
    let (x, out, idx) = (b.arg_ptr("x", DType::F32), b.arg_ptr("out", DType::F32), b.arg_ptr("idx", DType::I32));
    let rows = b.arange(0, R as i64).expand_dims(1);
    let cols = b.arange(0, C as i64).expand_dims(0);
    let t = b.load(x + (rows * C as i32 + cols), None, None); // [R, C]
    let tt = t.t(); // [C, R]
    let colmax = tt.max_along(1); // [C]: max over rows of column c
    let rowmin = t.min_along(1); // [R]
    let rowarg = t.argmax(1); // [R]
    let pos = t.gt(0.0).select(t.exp(), t * 0.5).sum(1); // [R]
    let half_round = t.cast(DType::BF16).cast(DType::F32).sum(0); // [C]
    let o = b.arange(0, C as i64);
    b.store(out + o, colmax, None);
    b.store(out + (b.arange(0, R as i64) + C as i32), rowmin, None);
    b.store(out + (b.arange(0, R as i64) + (C + R) as i32), pos, None);
    b.store(out + (o + (C + 2 * R) as i32), half_round, None);
    b.store(idx + b.arange(0, R as i64), rowarg, None);
    let f = b.finish().unwrap();

    let mut rng = rand::rngs::StdRng::seed_from_u64(0xC0FFEE ^ std::process::id() as u64);
    let xs: Vec<f32> = (0..R * C).map(|_| rng.gen_range(-2.0..2.0)).collect();
    let dev = CpuBackend.open_device(0).unwrap();
    let xb = upload(dev.as_ref(), "x", &xs);
    let ob = dev.alloc((2 * C + 2 * R) * 4, "out").unwrap();
    let ib = dev.alloc(R * 4, "idx").unwrap();
    let k = CpuBackend.compile(&f, None).unwrap();
    dev.launch(&k, [1, 1, 1], &[xb.arg(), ob.arg(), ib.arg()], &LaunchOptions::default()).unwrap();
    let got = read_f32(dev.as_ref(), &ob);
    let arg = read_i32(dev.as_ref(), &ib);
    let at = |r: usize, c: usize| xs[r * C + c] as f64;
    for c in 0..C {
        let want = (0..R).map(|r| at(r, c)).fold(f64::MIN, f64::max);
        assert_eq!(got[c] as f64, want, "column max {c}");
        let want: f64 = (0..R).map(|r| half::bf16::from_f64(at(r, c)).to_f64()).sum();
        assert!((got[C + 2 * R + c] as f64 - want).abs() < 1e-5, "bf16 column sum {c}");
    }
    for r in 0..R {
        let row: Vec<f64> = (0..C).map(|c| at(r, c)).collect();
        assert_eq!(got[C + r] as f64, row.iter().cloned().fold(f64::MAX, f64::min), "row min {r}");
        let am = row.iter().enumerate().fold(0, |best, (i, v)| if *v > row[best] { i } else { best });
        assert_eq!(arg[r] as usize, am, "row argmax {r}");
        let want: f64 = row.iter().map(|v| if *v > 0.0 { v.exp() } else { v * 0.5 }).sum();
        assert!((got[C + R + r] as f64 - want).abs() <= 1e-5 * want.abs().max(1.0), "select/exp row {r}");
    }
}

/// Programs of an independent launch run in an order that depends on the seed, replayably.
#[test]
fn program_order_is_seeded_and_replayable() {
    let b = KernelBuilder::new("tickets", LaunchAttrs::default());
    let (counter, out) = (b.arg_ptr("counter", DType::I32), b.arg_ptr("out", DType::I32));
    let ticket = b.atomic(AtomicOp::Add, counter, 1, None, MemSemantic::AcqRel, Scope::Gpu);
    b.store(out + b.program_id_x(), ticket, None);
    let f = b.finish().unwrap();
    let k = CpuBackend.compile(&f, None).unwrap();
    let dev = CpuBackend.open_device(0).unwrap();
    let run = |seed: u64| {
        let c = dev.alloc(4, "counter").unwrap();
        dev.fill(&c, &[0]).unwrap();
        let o = dev.alloc(64 * 4, "out").unwrap();
        dev.launch(&k, [64, 1, 1], &[c.arg(), o.arg()], &LaunchOptions { seed, ..LaunchOptions::default() }).unwrap();
        read_i32(dev.as_ref(), &o)
    };
    let (a, a2, b2) = (run(1), run(1), run(2));
    let mut sorted = a.clone();
    sorted.sort();
    assert_eq!(sorted, (0..64).collect::<Vec<_>>(), "every program ran once");
    assert_eq!(a, a2, "same seed, same order");
    assert_ne!(a, b2, "another seed, another order");
    assert_ne!(a, (0..64).collect::<Vec<_>>(), "not launch order");
}

#[test]
fn while_loop_and_compare_and_swap() {
    // Collatz steps of n, computed with `while`; then a CAS that succeeds and one that fails.
    let b = KernelBuilder::new("collatz", LaunchAttrs::default());
    let (n, out, word) = (b.arg("n", DType::I64), b.arg_ptr("out", DType::I64), b.arg_ptr("word", DType::I32));
    let zero = b.constant(Literal::Int(0), DType::I64);
    let r = b.while_loop(
        &[n, zero],
        |c| c[0].ne(1),
        |c| {
            let odd = (c[0] % 2).eq(1);
            vec![odd.select(c[0] * 3 + 1, c[0] / 2), c[1] + 1]
        },
    );
    b.store(out, r[1], None);
    let old1 = b.atomic_cas(word, 7, 9, MemSemantic::AcqRel, Scope::Gpu);
    let old2 = b.atomic_cas(word, 7, 11, MemSemantic::AcqRel, Scope::Gpu);
    b.store(word + 1, old1, None);
    b.store(word + 2, old2, None);
    let f = b.finish().unwrap();
    let k = CpuBackend.compile(&f, None).unwrap();
    let dev = CpuBackend.open_device(0).unwrap();
    let o = dev.alloc(8, "out").unwrap();
    let w = dev.alloc(12, "word").unwrap();
    dev.write(&w, 0, &7i32.to_le_bytes()).unwrap();
    dev.launch(&k, [1, 1, 1], &[KernelArg::i64(27), o.arg(), w.arg()], &LaunchOptions::default()).unwrap();
    let mut bytes = [0u8; 8];
    dev.read(&o, 0, &mut bytes).unwrap();
    let host_steps =
        std::iter::successors(Some(27u64), |&x| (x != 1).then(|| if x % 2 == 1 { 3 * x + 1 } else { x / 2 })).count()
            - 1;
    assert_eq!(i64::from_le_bytes(bytes) as usize, host_steps);
    assert_eq!(read_i32(dev.as_ref(), &w), vec![9, 7, 9]);
}

/// `dot` of FP8 tiles (every finite code, in random order) with an f32 accumulator, against
/// float64 on the host, on the interpreter and on the SIMT lowering for four targets: FP8
/// products are exact in f32, so only the f32 summation rounds. The 16 x 16 tile takes the
/// FMA loop, the 64 x 64 one the targets' matrix atoms (operands converted up to f16).
#[test]
fn fp8_dot_accumulates_in_f32() {
    let simt = trident_backend_cpu::simt_exec::SimtBackend;
    let runs: [(&dyn Backend, Option<&str>); 5] = [
        (&CpuBackend, None),
        (&simt, Some("sm_80")),
        (&simt, Some("sm_90a")),
        (&simt, Some("gfx942")),
        (&simt, Some("gfx90a")),
    ];
    let cases = runs
        .iter()
        .flat_map(|r| [(*r, DType::F8E4M3FN), (*r, DType::F8E5M2)])
        .flat_map(|c| [(c, (16u32, 64u32, 16u32)), (c, (64, 32, 64))]);
    for (((backend, target), d), (m, k, n)) in cases {
        let f = d.fp8().unwrap();
        let b = KernelBuilder::new("fp8_dot", LaunchAttrs::default());
        let (pa, pb, pc) = (b.arg_ptr("a", d), b.arg_ptr("b", d), b.arg_ptr("c", DType::F32));
        let idx = |rows: u32, cols: u32| {
            b.arange(0, rows as i64).expand_dims(1) * cols as i32 + b.arange(0, cols as i64).expand_dims(0)
        };
        let ta = b.load(pa + idx(m, k), None, None);
        let tb = b.load(pb + idx(k, n), None, None);
        let acc = b.dot(ta, tb, b.zeros(&[m, n], DType::F32), InputPrecision::Ieee);
        b.store(pc + idx(m, n), acc, None);
        let func = b.finish().unwrap();
        if let Some(t) = target {
            let simt = trident_core::simt::lower(&func, trident_core::target::lookup(t).unwrap()).unwrap();
            let atoms = simt.to_string().contains("matmul");
            assert_eq!(atoms, m == 64, "{d} {m}x{k}x{n} on {t}: matrix atoms used: {atoms}");
        }
        let art = backend.compile(&func, target).unwrap();
        let dev = backend.open_device(0).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(27);
        let finite: Vec<u8> = (0..=255u8).filter(|&c| f.decode(c).is_finite()).collect();
        let mut codes = |len: usize| -> Vec<u8> { (0..len).map(|_| finite[rng.gen_range(0..finite.len())]).collect() };
        let (a, bb) = (codes((m * k) as usize), codes((k * n) as usize));
        let (ba, bbuf) = (dev.alloc(a.len(), "a").unwrap(), dev.alloc(bb.len(), "b").unwrap());
        dev.write(&ba, 0, &a).unwrap();
        dev.write(&bbuf, 0, &bb).unwrap();
        let c = upload(dev.as_ref(), "c", &vec![f32::NAN; (m * n) as usize]);
        dev.launch(&art, [1, 1, 1], &[ba.arg(), bbuf.arg(), c.arg()], &LaunchOptions::default()).unwrap();
        let got = read_f32(dev.as_ref(), &c);
        for i in 0..m as usize {
            for j in 0..n as usize {
                let terms: Vec<f64> = (0..k as usize)
                    .map(|kk| f.decode(a[i * k as usize + kk]) * f.decode(bb[kk * n as usize + j]))
                    .collect();
                let want: f64 = terms.iter().sum();
                let scale: f64 = terms.iter().map(|t| t.abs()).sum();
                let g = got[i * n as usize + j] as f64;
                assert!(
                    (g - want).abs() <= k as f64 * f32::EPSILON as f64 * scale,
                    "{d} on {target:?} [{i},{j}]: {g} vs {want}"
                );
            }
        }
    }
}
