//! `cargo xtask demo`: one GEMM through the whole path: build the kernel from its
//! meta-parameters, verify it, print its IR, run it on the CPU backend, check it against f64.

use std::process::ExitCode;
use std::time::Instant;
use trident_conformance::host::{decode, encode, poison, random};
use trident_conformance::reference;
use trident_core::backend::{self, LaunchOptions};
use trident_core::ir::{DType, InputPrecision};
use trident_core::{text, verify};
use trident_kernels::gemm::Gemm;

fn main() -> ExitCode {
    match demo() {
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
    let launcher = trident_kernels::Launcher::new(backend.as_ref(), device.as_ref(), LaunchOptions { seed });
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
