//! `cargo xtask demo`: one GEMM through the whole path (build the kernel from its
//! meta-parameters, verify it, print its IR, run it on the CPU backend, check it against f64),
//! then AG-GEMM on a world of 4 CPU ranks, checked, with the order in which each rank's chunks of
//! A arrived and were consumed.

use std::process::ExitCode;
use std::time::Instant;
use trident_conformance::host::{decode, encode, poison, random};
use trident_conformance::reference;
use trident_core::backend::{self, LaunchOptions};
use trident_core::ir::{DType, InputPrecision};
use trident_core::{text, verify};
use trident_kernels::gemm::Gemm;

/// `trident demo`.
pub fn main() -> ExitCode {
    match demo().and_then(|_| ag_gemm_demo()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn demo() -> Result<(), Box<dyn std::error::Error>> {
    let (m, n, k) = (256, 256, 256);
    let gemm = Gemm::new(DType::F32).with_precision(InputPrecision::Ieee);
    println!("1. build   {gemm:?}");
    let func = gemm.build()?;
    println!("2. verify  ok ({} ops, {} values)", func.ops.len(), func.values.len());
    verify(&func)?;
    let printed = text::print(&func);
    println!("3. print   the tile IR:\n");
    println!("{printed}");
    let reparsed = text::parse(&printed)?;
    verify(&reparsed)?;
    assert_eq!(text::print(&reparsed), printed, "the text format must round-trip");
    println!("   (parsed back and printed again: identical)");

    let backend = (backend::lookup("cpu")?.create)();
    let device = backend.open_device(0)?;
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64;
    let mut rng = trident_conformance::host::case_rng(seed, 0);
    let (a, b) = (random(m * k, DType::F32, &mut rng), random(k * n, DType::F32, &mut rng));
    let (da, db) = (device.alloc(m * k * 4, "a")?, device.alloc(k * n * 4, "b")?);
    let dc = device.alloc(m * n * 4, "c")?;
    device.write(&da, 0, &encode(&a, DType::F32))?;
    device.write(&db, 0, &encode(&b, DType::F32))?;
    device.fill(&dc, &poison(DType::F32))?;
    let start = Instant::now();
    let launcher = trident_kernels::DeviceCtx::new(
        backend.as_ref(),
        device.as_ref(),
        LaunchOptions { seed, ..LaunchOptions::default() },
    );
    gemm.run(&launcher, &da, &db, &dc, (m, n, k))?;
    let elapsed = start.elapsed();
    println!(
        "4. run     {m}x{n}x{k} f32 on backend `cpu`, {} programs: {:.1} ms",
        gemm.grid(m, n)[0],
        elapsed.as_secs_f64() * 1e3
    );
    let mut bytes = vec![0u8; m * n * 4];
    device.read(&dc, 0, &mut bytes)?;
    let err = reference::normwise_error(&decode(&bytes, DType::F32), &reference::gemm(&a, &b, m, n, k))
        .map_err(|i| format!("element {i} not written"))?;
    let bound = 1e-6;
    println!(
        "5. check   |C - C_f64| / |C_f64| = {err:.2e} (bound {bound:.0e}, seed {seed:#x}): {}",
        if err <= bound { "PASS" } else { "FAIL" }
    );
    if err > bound {
        return Err("GEMM result outside its bound".into());
    }
    Ok(())
}

fn ag_gemm_demo() -> Result<(), Box<dyn std::error::Error>> {
    use std::sync::Arc;
    use trident_backend_cpu::world::{CpuWorld, TraceEvent, WorldOptions};
    use trident_kernels::ag_gemm::{AgGemm, GatherMode};

    let (world, m, n, k, d) = (4usize, 256usize, 128usize, 128usize, DType::BF16);
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64;
    let mut rng = trident_conformance::host::case_rng(seed, 1);
    let a = random(m * k, d, &mut rng);
    let bs: Vec<Vec<f64>> = (0..world).map(|_| random(k * n, d, &mut rng)).collect();
    let expected: Vec<Vec<f64>> = bs.iter().map(|b| reference::gemm(&a, b, m, n, k)).collect();
    let inputs = Arc::new((a, bs));
    println!(
        "\nAG-GEMM on {world} CPU ranks: A {m}x{k} sharded by rows, B_r {k}x{n} per rank, {d}, copy-engine gather"
    );
    let opts = WorldOptions { trace: true, ..WorldOptions::new(world, seed) };
    let run = CpuWorld::run(opts, move |ctx| {
        let (a, bs) = &*inputs;
        let (r, rows) = (ctx.rank(), m / world);
        let shard = ctx.alloc(rows * k * 2, "a_shard")?;
        ctx.write(&shard, 0, &encode(&a[r * rows * k..(r + 1) * rows * k], d))?;
        let b = ctx.alloc(k * n * 2, "b")?;
        ctx.write(&b, 0, &encode(&bs[r], d))?;
        let c = ctx.alloc(m * n * 2, "c")?;
        ctx.fill(&c, &poison(d))?;
        let op = AgGemm::new(d, GatherMode::CopyEngine);
        let mut bufs = op.buffers(ctx, m, n, k)?;
        ctx.barrier()?;
        op.run(ctx, &mut bufs, &shard, &b, &c)?;
        let mut bytes = vec![0u8; m * n * 2];
        ctx.read(&c, 0, &mut bytes)?;
        Ok(decode(&bytes, d))
    })?;
    let mut worst = 0.0f64;
    for (r, out) in run.results.iter().enumerate() {
        let err =
            reference::normwise_error(out, &expected[r]).map_err(|i| format!("rank {r}: element {i} not written"))?;
        worst = worst.max(err);
    }
    for r in 0..world {
        let mut arrived: Vec<(u64, usize)> = Vec::new();
        let mut consumed: Vec<(u64, usize)> = Vec::new();
        let mut by_program: Vec<(u32, usize)> = Vec::new();
        for e in &run.trace {
            match e {
                TraceEvent::Signal { time, rank, buffer, index, .. } if *rank == r && buffer == "allgather_ready" => {
                    arrived.push((*time, *index))
                }
                TraceEvent::WaitDone { time, rank, kernel, index, program, .. }
                    if *rank == r && kernel.starts_with("ag_gemm") =>
                {
                    by_program.push((program[0], *index));
                    if !consumed.iter().any(|(_, c)| c == index) {
                        consumed.push((*time, *index));
                    }
                }
                _ => {}
            }
        }
        arrived.sort();
        consumed.sort();
        by_program.sort();
        let mut swizzle: Vec<usize> = Vec::new();
        for (_, c) in &by_program {
            if !swizzle.contains(c) {
                swizzle.push(*c);
            }
        }
        let show = |v: &[(u64, usize)]| v.iter().map(|(_, c)| c.to_string()).collect::<Vec<_>>().join(" ");
        let plan = swizzle.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(" ");
        println!(
            "   rank {r}: chunks arrived [{}]; GEMM tiles in program-id order need chunks [{plan}]; consumed (programs run in a random order) [{}]",
            show(&arrived),
            show(&consumed)
        );
    }
    let bound = 1e-2;
    println!(
        "   check: worst |C_r - C_r,f64| / |C_r,f64| over ranks = {worst:.2e} (bound {bound:.0e}, seed {seed:#x}, {} task switches): {}",
        run.switches,
        if worst <= bound { "PASS" } else { "FAIL" }
    );
    if worst > bound {
        return Err("AG-GEMM result outside its bound".into());
    }
    Ok(())
}
