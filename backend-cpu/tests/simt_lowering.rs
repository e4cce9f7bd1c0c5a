//! The SIMT lowering (layouts, shuffle reductions, vector accesses, puts/gets, barrier_all)
//! executed by `cpu-simt` for an NVIDIA (warp 32) and an AMD (wave 64) target, against host
//! references on fresh inputs.

use rand::{Rng, SeedableRng};
use trident_backend_cpu::simt_exec::SimtBackend;
use trident_backend_cpu::world::{CpuWorld, WorldOptions};
use trident_core::backend::{Backend, KernelArg, LaunchOptions};
use trident_core::ir::*;
use trident_core::world::RankCtx;
use trident_core::{Function, KernelBuilder};

const TARGETS: [&str; 2] = ["sm_90a", "gfx942"];

/// Registers the targets (the vendor crates own them).
fn link() {
    trident_backend_nvidia::link();
    trident_backend_amd::link();
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn words(bytes: &[u8]) -> Vec<[u8; 4]> {
    bytes.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]).collect()
}

/// `out[i] = reduce(x[M, N], axis)[i]`, the whole tile in one program.
fn reduction(op: ReduceOp, axis: u32, m: u32, n: u32, warps: u32) -> Function {
    let b = KernelBuilder::new("reduce", LaunchAttrs { warps, ..LaunchAttrs::default() });
    let x = b.arg_ptr("x", DType::F32);
    let out_t = if matches!(op, ReduceOp::Argmax | ReduceOp::Argmin) { DType::I32 } else { DType::F32 };
    let out = b.arg_ptr("out", out_t);
    let rows = b.arange(0, m as i64).expand_dims(1);
    let cols = b.arange(0, n as i64).expand_dims(0);
    let v = b.load(x + rows * n as i32 + cols, None, None);
    let r = v.reduce(op, axis);
    let len = if axis == 0 { n } else { m };
    b.store(out + b.arange(0, len as i64), r, None);
    b.finish().unwrap()
}

/// Host reference: value (or first index of the extreme) along the axis.
fn reference(op: ReduceOp, axis: u32, m: usize, n: usize, x: &[f32]) -> Vec<f64> {
    let (outer, len) = if axis == 0 { (n, m) } else { (m, n) };
    (0..outer)
        .map(|o| {
            let at = |k: usize| if axis == 0 { x[k * n + o] as f64 } else { x[o * n + k] as f64 };
            let mut best = (at(0), 0usize);
            let mut sum = 0.0;
            for k in 0..len {
                sum += at(k);
                let better = match op {
                    ReduceOp::Max | ReduceOp::Argmax => at(k) > best.0,
                    _ => at(k) < best.0,
                };
                if better {
                    best = (at(k), k);
                }
            }
            match op {
                ReduceOp::Sum => sum,
                ReduceOp::Max | ReduceOp::Min => best.0,
                _ => best.1 as f64,
            }
        })
        .collect()
}

#[test]
fn shuffle_reductions_match_the_host_along_both_axes() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    let ops = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Argmax, ReduceOp::Argmin];
    link();
    for target in TARGETS {
        let dev = SimtBackend.open_device(0).unwrap();
        for (m, n) in [(4, 64), (64, 4), (16, 256), (128, 32), (2, 2), (1, 512), (512, 1)] {
            for warps in [1, 4] {
                for axis in [0, 1] {
                    for op in ops {
                        // Small integers: sums are exact and extremes tie often (first index wins).
                        let x: Vec<f32> = (0..m * n).map(|_| rng.gen_range(-8..8) as f32).collect();
                        let k = SimtBackend.compile(&reduction(op, axis, m, n, warps), Some(target)).unwrap();
                        let xb = dev.alloc(x.len() * 4, "x").unwrap();
                        dev.write(&xb, 0, &f32_bytes(&x)).unwrap();
                        let len = if axis == 0 { n } else { m } as usize;
                        let out = dev.alloc(len * 4, "out").unwrap();
                        dev.write(&out, 0, &vec![0xff; len * 4]).unwrap();
                        dev.launch(&k, [1, 1, 1], &[xb.arg(), out.arg()], &LaunchOptions::default()).unwrap();
                        let mut bytes = vec![0u8; len * 4];
                        dev.read(&out, 0, &mut bytes).unwrap();
                        let got: Vec<f64> = words(&bytes)
                            .into_iter()
                            .map(|w| match op {
                                ReduceOp::Argmax | ReduceOp::Argmin => i32::from_le_bytes(w) as f64,
                                _ => f32::from_le_bytes(w) as f64,
                            })
                            .collect();
                        let want = reference(op, axis, m as usize, n as usize, &x);
                        assert_eq!(got, want, "{op:?} axis {axis} of {m}x{n}, {warps} warps, {target}");
                    }
                }
            }
        }
    }
}

/// `out[i] = x[off + i]` for `i < n`: vector groups take the scalar path when `off` misaligns
/// them or the mask cuts them.
#[test]
fn vector_accesses_fall_back_when_misaligned_or_masked() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    let b = KernelBuilder::new("shifted_copy", LaunchAttrs::default());
    let (x, out) = (b.arg_ptr("x", DType::F32), b.arg_ptr("out", DType::F32));
    let (off, n) = (b.arg("off", DType::I32), b.arg("n", DType::I32));
    let i = b.arange(0, 1024);
    let mask = i.lt(n);
    let v = b.load_or(x + off + i, mask, -1.0);
    b.store(out + off + i, v * 2.0f32, Some(mask));
    let f = b.finish().unwrap();
    link();
    for target in TARGETS {
        let k = SimtBackend.compile(&f, Some(target)).unwrap();
        let text = &k.text;
        assert!(text.contains(" = vload [") && text.contains("vstore ["), "the copy is not vectorized");
        let dev = SimtBackend.open_device(0).unwrap();
        for (off, n) in [(0usize, 1024usize), (1, 1024), (2, 1000), (3, 7), (0, 513)] {
            let x: Vec<f32> = (0..1040).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let xb = dev.alloc(x.len() * 4, "x").unwrap();
            dev.write(&xb, 0, &f32_bytes(&x)).unwrap();
            let out = dev.alloc(x.len() * 4, "out").unwrap();
            dev.write(&out, 0, &f32_bytes(&vec![f32::NAN; x.len()])).unwrap();
            let args = [xb.arg(), out.arg(), KernelArg::i32(off as i32), KernelArg::i32(n as i32)];
            dev.launch(&k, [1, 1, 1], &args, &LaunchOptions::default()).unwrap();
            let mut bytes = vec![0u8; x.len() * 4];
            dev.read(&out, 0, &mut bytes).unwrap();
            let got: Vec<f32> = words(&bytes).into_iter().map(f32::from_le_bytes).collect();
            for (j, g) in got.iter().enumerate() {
                if j >= off && j < off + n {
                    assert_eq!(*g, x[j] * 2.0, "element {j}, off {off}, n {n}, {target}");
                } else {
                    assert!(g.is_nan(), "element {j} outside the mask was written ({g}), off {off}, n {n}");
                }
            }
        }
    }
}

/// Compare-and-swap on a tile (each lane its own word) and on a scalar (one thread, result
/// shared), against the host.
#[test]
fn compare_and_swap_matches_the_host() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    let b = KernelBuilder::new("cas", LaunchAttrs::default());
    let (cells, olds, counter) =
        (b.arg_ptr("words", DType::I32), b.arg_ptr("olds", DType::I32), b.arg_ptr("counter", DType::I64));
    let i = b.arange(0, 256);
    let old = b.atomic_cas(cells + i, b.zeros(&[256], DType::I32), i + 100, MemSemantic::AcqRel, Scope::Gpu);
    b.store(olds + i, old, None);
    // Scalar: every program claims the counter once; its old value lands in the program's slot.
    let prev = b.atomic_cas(counter, 0i64, 1i64, MemSemantic::AcqRel, Scope::Gpu);
    b.store(olds + 256 + b.program_id_x(), prev.cast(DType::I32), None);
    let f = b.finish().unwrap();
    link();
    for target in TARGETS {
        let k = SimtBackend.compile(&f, Some(target)).unwrap();
        let dev = SimtBackend.open_device(0).unwrap();
        let init: Vec<i32> = (0..256).map(|_| rng.gen_range(0..2)).collect();
        let w = dev.alloc(256 * 4, "words").unwrap();
        dev.write(&w, 0, &init.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
        let o = dev.alloc(258 * 4, "olds").unwrap();
        dev.write(&o, 0, &[0xff; 258 * 4]).unwrap();
        let c = dev.alloc(8, "counter").unwrap();
        dev.write(&c, 0, &[0; 8]).unwrap();
        dev.launch(&k, [2, 1, 1], &[w.arg(), o.arg(), c.arg()], &LaunchOptions::default()).unwrap();
        let read = |b: &trident_core::backend::Buffer, n: usize| {
            let mut bytes = vec![0u8; n * 4];
            dev.read(b, 0, &mut bytes).unwrap();
            words(&bytes).into_iter().map(i32::from_le_bytes).collect::<Vec<i32>>()
        };
        let (words_after, olds) = (read(&w, 256), read(&o, 258));
        for j in 0..256 {
            // Program 0 swaps the zeros; program 1 sees the swapped values and changes nothing.
            let want = if init[j] == 0 { 100 + j as i32 } else { init[j] };
            assert_eq!(words_after[j], want, "word {j}, {target}");
        }
        let mut claims = olds[256..].to_vec();
        claims.sort();
        assert_eq!(claims, [0, 1], "exactly one program claims the counter, {target}");
    }
}

/// Each rank puts its `n` floats to the next rank with `put_signal`, gets the previous rank's
/// input with `get`, and meets every rank at `barrier_all` before reading what it received.
#[test]
fn puts_gets_and_barrier_all_in_a_world() {
    const N: usize = 300; // not a multiple of the program's threads
    let b = KernelBuilder::new("ring", LaunchAttrs { cooperative: true, ..LaunchAttrs::default() });
    let src = b.arg_ptr("src", DType::F32);
    let (inbox, fetched) = (b.arg_ptr("inbox", DType::F32), b.arg_ptr("fetched", DType::F32));
    let (sig, out) = (b.arg_ptr("sig", DType::U64), b.arg_ptr("out", DType::F32));
    let (me, world) = (b.rank(), b.num_ranks());
    let next = (me + 1) % world;
    let prev = (me + world - 1) % world;
    let bytes = (N * 4) as i64;
    b.put_signal(inbox, src, bytes, sig, 1u64, SignalOp::Add, next, Group::Block, false);
    b.get(fetched, src, bytes, prev, Group::Block, false);
    b.signal_wait_until(sig, CmpOp::Ge, 1u64);
    b.barrier_all(Group::Block);
    // After the barrier every rank's put landed: out = inbox + fetched (both the previous rank's).
    let i = b.arange(0, 512);
    let m = i.lt(N as i32);
    let v = b.load_or(inbox + i, m, 0.0) + b.load_or(fetched + i, m, 0.0);
    b.store(out + i, v, Some(m));
    let f = b.finish().unwrap();
    link();
    for target in TARGETS {
        for ranks in [1, 2, 4] {
            let seed: u64 = rand::random();
            let mut opts = WorldOptions::new(ranks, seed);
            opts.simt_target = Some(target);
            let f2 = f.clone();
            let run = CpuWorld::run(opts, move |ctx: &dyn RankCtx| {
                let inputs: Vec<f32> = (0..N).map(|i| (ctx.rank() * 1000 + i) as f32).collect();
                let src = ctx.symm_alloc(N * 4, "src")?;
                ctx.write(&src, 0, &f32_bytes(&inputs))?;
                let inbox = ctx.symm_alloc(N * 4, "inbox")?;
                let fetched = ctx.symm_alloc(N * 4, "fetched")?;
                let sig = ctx.symm_alloc(8, "sig")?;
                let out = ctx.symm_alloc(N * 4, "out")?;
                ctx.write(&out, 0, &f32_bytes(&[f32::NAN; N]))?;
                ctx.barrier()?;
                let k = ctx.compile("ring", &|| Ok(f2.clone()))?;
                ctx.launch(0, &k, [1, 1, 1], &[src.arg(), inbox.arg(), fetched.arg(), sig.arg(), out.arg()])?;
                ctx.synchronize()?;
                let mut bytes = vec![0u8; N * 4];
                ctx.read(&out, 0, &mut bytes)?;
                Ok(words(&bytes).into_iter().map(f32::from_le_bytes).collect::<Vec<f32>>())
            })
            .unwrap_or_else(|e| panic!("{target}, {ranks} ranks, seed {seed:#x}: {e}"));
            for (r, got) in run.results.iter().enumerate() {
                let prev = (r + ranks - 1) % ranks;
                for (i, g) in got.iter().enumerate() {
                    assert_eq!(*g, 2.0 * (prev * 1000 + i) as f32, "rank {r} element {i}, {target}, {ranks} ranks");
                }
            }
        }
    }
}

/// A scalar atomic (its result shared through shared memory) followed by a pipelined GEMM K loop
/// whose first copies land on the same shared bytes: the lowering must separate them with a
/// barrier (cpu-simt reports any shared-memory hazard). The same missing barrier, behind a wait,
/// made `ag_gemm` read its stage as a wait's abort flag on the H200 (racecheck, NaN outputs).
#[test]
fn shared_memory_phases_are_separated_by_barriers() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    let (m, n, kk) = (64usize, 64usize, 96usize);
    let b = KernelBuilder::new("ticket_gemm", LaunchAttrs { warps: 4, stages: 3, ..LaunchAttrs::default() });
    let (x, y, c) = (b.arg_ptr("x", DType::BF16), b.arg_ptr("y", DType::BF16), b.arg_ptr("c", DType::F32));
    let counter = b.arg_ptr("counter", DType::I32);
    let k = b.arg("k", DType::I32);
    let ticket = b.atomic(AtomicOp::Add, counter, 1i32, None, MemSemantic::Relaxed, Scope::Gpu);
    let (i, kr) = (b.arange(0, m as i64), b.arange(0, 32));
    let out = b.for_range(
        0,
        k,
        32,
        &[b.zeros(&[m as u32, n as u32], DType::F32)],
        |k0, acc: &[trident_core::builder::Tile]| {
            let kc = kr + k0;
            let xa = b.load_or(x + i.expand_dims(1) * k + kc.expand_dims(0), kc.expand_dims(0).lt(k), 0.0);
            let ya = b.load_or(y + kc.expand_dims(1) * n as i32 + i.expand_dims(0), kc.expand_dims(1).lt(k), 0.0);
            vec![b.dot(xa, ya, acc[0], InputPrecision::Ieee)]
        },
    );
    b.store(c + i.expand_dims(1) * n as i32 + i.expand_dims(0), out[0] + ticket.cast(DType::F32), None);
    let f = b.finish().unwrap();
    link();
    for target in ["sm_90a", "sm_80"] {
        let kern = SimtBackend.compile(&f, Some(target)).unwrap();
        let dev = SimtBackend.open_device(0).unwrap();
        let bf = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()).collect() };
        let round = |x: f32| half::bf16::from_f32(x).to_f32() as f64;
        let xs: Vec<f32> = (0..m * kk).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let ys: Vec<f32> = (0..kk * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let (xb, yb) = (dev.alloc(xs.len() * 2, "x").unwrap(), dev.alloc(ys.len() * 2, "y").unwrap());
        dev.write(&xb, 0, &bf(&xs)).unwrap();
        dev.write(&yb, 0, &bf(&ys)).unwrap();
        let cb = dev.alloc(m * n * 4, "c").unwrap();
        dev.write(&cb, 0, &f32_bytes(&vec![f32::NAN; m * n])).unwrap();
        let cnt = dev.alloc(4, "counter").unwrap();
        dev.write(&cnt, 0, &5i32.to_le_bytes()).unwrap();
        let args = [xb.arg(), yb.arg(), cb.arg(), cnt.arg(), KernelArg::i32(kk as i32)];
        dev.launch(&kern, [1, 1, 1], &args, &LaunchOptions::default()).unwrap();
        let mut bytes = vec![0u8; m * n * 4];
        dev.read(&cb, 0, &mut bytes).unwrap();
        let got: Vec<f32> = words(&bytes).into_iter().map(f32::from_le_bytes).collect();
        for r in 0..m {
            for col in 0..n {
                let want: f64 = (0..kk).map(|q| round(xs[r * kk + q]) * round(ys[q * n + col])).sum::<f64>() + 5.0;
                let g = got[r * n + col] as f64;
                assert!((g - want).abs() <= 1e-3 * (1.0 + want.abs()), "{target} c[{r}][{col}] = {g}, want {want}");
            }
        }
    }
}

/// A fault in cpu-simt names the tile-IR op and its line in the text form (the lowering marks
/// every op's instructions with `Inst::Origin`), and the PTX carries the same lines (`.loc`).
#[test]
fn faults_and_line_information_point_at_the_tile_ir() {
    let text = "kernel @oob(%x: !ptr<f32>, %out: !ptr<f32>) attributes {warps = 1, stages = 2, cooperative = false} {
  %0 = arange 0, 64 : tile<64xi32>
  %1 = splat %x : tile<64x!ptr<f32>>
  %2 = addptr %1, %0 : tile<64x!ptr<f32>>
  %3 = load %2 : tile<64xf32>
  %4 = splat %out : tile<64x!ptr<f32>>
  %5 = addptr %4, %0 : tile<64x!ptr<f32>>
  store %5, %3
  return
}
";
    let f = trident_core::text::parse(text).unwrap();
    link();
    for target in TARGETS {
        let k = SimtBackend.compile(&f, Some(target)).unwrap();
        let dev = SimtBackend.open_device(0).unwrap();
        // `x` holds 16 elements: the load (line 5) reads past its end.
        let (x, out) = (dev.alloc(16 * 4, "x").unwrap(), dev.alloc(64 * 4, "out").unwrap());
        let e = dev.launch(&k, [1, 1, 1], &[x.arg(), out.arg()], &LaunchOptions::default()).unwrap_err();
        match &e {
            trident_core::backend::BackendError::Execution { op, loc, .. } => {
                assert!(op.starts_with("load"), "{target}: {e}");
                assert_eq!(loc.map(|l| l.line), Some(5), "{target}: {e}");
            }
            other => panic!("{target}: {other}"),
        }
    }
    let ptx = trident_backend_nvidia::NvidiaBackend::ptx(&f, &trident_core::target::SM_90A).unwrap().ptx;
    assert!(ptx.contains(".file 1 \"oob.tile\"") && ptx.contains(".loc 1 5 "), "{ptx}");
}

/// The writers branch on `If` conditions and loop bounds as uniform (`bra.uni` in PTX), so
/// cpu-simt checks that claim: a condition whose lanes differ is a contract fault.
#[test]
fn a_condition_that_differs_across_lanes_is_a_contract_fault() {
    use std::sync::Arc;
    use trident_core::simt::{Inst, Reg, SType, Special};
    link();
    let b = KernelBuilder::new("branchy", LaunchAttrs::default());
    let y = b.arg_ptr("y", DType::F32);
    b.store(y + b.arange(0, 128), b.full(&[128], 1.0, DType::F32), None);
    let f = b.finish().unwrap();
    let mut k = trident_core::simt::lower::lower(&f, trident_core::target::lookup("sm_90a").unwrap()).unwrap();
    let mut reg = |t: SType| {
        k.regs.push(t);
        Reg(k.regs.len() as u32 - 1)
    };
    let i32t = SType::Int { bits: 32, signed: true };
    let (tid, one, odd) = (reg(i32t), reg(i32t), reg(i32t));
    let prefix = vec![
        Inst::Special { dst: tid, which: Special::ThreadId },
        Inst::Const { dst: one, value: Literal::Int(1) },
        Inst::Binary { dst: odd, op: BinaryOp::And, a: tid, b: one },
        Inst::If {
            cond: odd,
            then_body: Vec::new(),
            then_yields: Vec::new(),
            else_body: Vec::new(),
            else_yields: Vec::new(),
            results: Vec::new(),
        },
    ];
    k.body.splice(0..0, prefix);
    let text = k.to_string();
    let art = trident_core::backend::Artifact::new(&f, "cpu-simt", "sm_90a", text, Arc::new(k));
    let dev = SimtBackend.open_device(0).unwrap();
    let out = dev.alloc(128 * 4, "y").unwrap();
    let e = dev.launch(&art, [1, 1, 1], &[out.arg()], &LaunchOptions::default()).unwrap_err().to_string();
    assert!(e.contains("SIMT contract broken") && e.contains("differs across lanes"), "{e}");
}

/// `cp.async` copies land when a wait completes their group, poison before: a staged loop
/// (`acc = (acc + x @ y[j..j+16]) / 2` over blocks of 16 rows of `y`) matches the host, and the
/// same SIMT program with its waits taken out does not: cpu-simt would catch a pipeline that
/// reads a stage before its copies are waited for.
#[test]
fn async_copies_land_only_when_waited_for() {
    use std::sync::Arc;
    use trident_core::simt::Inst;
    link();
    let (rows, n) = (64usize, 64usize);
    let b = KernelBuilder::new("staged_sum", LaunchAttrs { warps: 4, ..LaunchAttrs::default() });
    let x = b.arg_ptr_aligned("x", DType::BF16, 16);
    let y = b.arg_ptr_aligned("y", DType::BF16, 16);
    let out = b.arg_ptr("out", DType::F32);
    let (r, c, kk) = (b.arange(0, 16), b.arange(0, n as i64), b.arange(0, 16));
    let xt = b.load_or(x + (r * 16).expand_dims(1) + kk.expand_dims(0), r.lt(16).expand_dims(1), 0.0);
    let acc = b.for_range(0, rows as i32, 16, &[b.zeros(&[16, n as u32], DType::F32)], |j, v| {
        let at = j + b.arange(0, 16);
        let yt =
            b.load_or(y + (at * n as i32).expand_dims(1) + c.expand_dims(0), at.lt(rows as i32).expand_dims(1), 0.0);
        vec![b.dot(xt, yt, v[0], InputPrecision::Ieee) * 0.5f32]
    });
    b.store(out + (r * n as i32).expand_dims(1) + c.expand_dims(0), acc[0], None);
    let f = b.finish().unwrap();
    let k = trident_core::simt::lower::lower(&f, trident_core::target::lookup("sm_80").unwrap()).unwrap();
    assert!(k.to_string().contains("staged.ring"), "the loop is staged");
    fn strip_waits(body: &mut Vec<Inst>) {
        body.retain(|i| !matches!(i, Inst::AsyncWait { .. }));
        for i in body.iter_mut() {
            if let Inst::Loop { body, .. } = i {
                strip_waits(body);
            }
        }
    }
    let mut broken = k.clone();
    strip_waits(&mut broken.body);
    let mut rng = rand::rngs::StdRng::seed_from_u64(55);
    let small = |rng: &mut rand::rngs::StdRng, len: usize| -> Vec<f64> {
        (0..len).map(|_| rng.gen_range(-8i32..=8) as f64 / 8.0).collect()
    };
    let (xv, yv) = (small(&mut rng, 16 * 16), small(&mut rng, rows * n));
    let bf16 = |v: &[f64]| -> Vec<u8> { v.iter().flat_map(|&a| half::bf16::from_f64(a).to_le_bytes()).collect() };
    // The host: acc_{t+1} = (acc_t + x @ y_t) / 2, exact in f32 for these values.
    let mut want = vec![0.0f64; 16 * n];
    for t in 0..rows / 16 {
        for i in 0..16 {
            for col in 0..n {
                let s: f64 = (0..16).map(|p| xv[i * 16 + p] * yv[(t * 16 + p) * n + col]).sum();
                want[i * n + col] = (want[i * n + col] + s) * 0.5;
            }
        }
    }
    let dev = SimtBackend.open_device(0).unwrap();
    let run = |kernel: trident_core::simt::Kernel| -> Vec<f64> {
        let text = kernel.to_string();
        let art = trident_core::backend::Artifact::new(&f, "cpu-simt", "sm_80", text, Arc::new(kernel));
        let (xb, yb, ob) = (
            dev.alloc(16 * 16 * 2, "x").unwrap(),
            dev.alloc(rows * n * 2, "y").unwrap(),
            dev.alloc(16 * n * 4, "out").unwrap(),
        );
        dev.write(&xb, 0, &bf16(&xv)).unwrap();
        dev.write(&yb, 0, &bf16(&yv)).unwrap();
        dev.write(&ob, 0, &f32_bytes(&vec![f32::NAN; 16 * n])).unwrap();
        dev.launch(&art, [1, 1, 1], &[xb.arg(), yb.arg(), ob.arg()], &LaunchOptions::default()).unwrap();
        let mut raw = vec![0u8; 16 * n * 4];
        dev.read(&ob, 0, &mut raw).unwrap();
        words(&raw).into_iter().map(|w| f32::from_le_bytes(w) as f64).collect()
    };
    let got = run(k);
    assert!(got.iter().zip(&want).all(|(g, w)| (g - w).abs() <= 1e-6), "the staged loop matches the host");
    let early = run(broken);
    assert!(
        early.iter().zip(&want).any(|(g, w)| (g - w).abs().is_nan() || (g - w).abs() > 1e-6),
        "reads before the waits see poison"
    );
}
