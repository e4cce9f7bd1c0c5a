//! `trident-gpu-selftest`: runtime checks that need a GPU (run by scripts/gpu-check.sh).
//!
//! 1. A planted wait that nothing satisfies ends within its bound with a diagnostic naming rank,
//!    program, signal, expected and seen, and every program of the launch stops (no trap).
//! 2. The next launch in the same process still works and is correct.

use std::process::ExitCode;
use std::time::{Duration, Instant};
use trident_core::backend::{self, LaunchOptions};
use trident_core::ir::{CmpOp, DType, LaunchAttrs, MemSemantic, Scope};
use trident_core::KernelBuilder;

fn main() -> ExitCode {
    trident_conformance::link_backends();
    match run() {
        Ok(()) => {
            println!("gpu selftest: PASS");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("gpu selftest: FAIL: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let backend = (backend::lookup("nvidia")?.create)();
    let dev = match backend.open_device(0) {
        Ok(d) => d,
        Err(e) => {
            println!("gpu selftest: skipped: {e}");
            return Ok(());
        }
    };
    // 1. 8 programs wait for a signal that is never written.
    let b = KernelBuilder::new("planted_wait", LaunchAttrs::default());
    let (sig, out) = (b.arg_ptr("sig", DType::U64), b.arg_ptr("out", DType::I32));
    let t = b.wait(sig, 1, CmpOp::Ge, 7u64, Scope::Sys, MemSemantic::Acquire);
    b.store(out.consume_token(t) + b.program_id_x(), 1, None);
    let k = backend.compile(&b.finish()?, None)?;
    let s = dev.alloc(8, "never_signalled")?;
    dev.fill(&s, &[0])?;
    let o = dev.alloc(32, "out")?;
    dev.fill(&o, &[0])?;
    let bound = Duration::from_millis(500);
    let start = Instant::now();
    let r = dev.launch(
        &k,
        [8, 1, 1],
        &[s.arg(), o.arg()],
        &LaunchOptions { wait_bound: bound, ..LaunchOptions::default() },
    );
    let took = start.elapsed();
    let e = match r {
        Ok(()) => return Err("the planted wait completed".into()),
        Err(e) => e.to_string(),
    };
    println!("planted wait ended after {took:?} (bound {bound:?}): {e}");
    for needle in ["timed out", "rank 0", "`never_signalled`[0]", "expected ge 7", "seen 0", "program ["] {
        if !e.contains(needle) {
            return Err(format!("diagnostic lacks `{needle}`").into());
        }
    }
    if took > bound * 4 {
        return Err(format!("the wait took {took:?}, bound {bound:?}").into());
    }
    let mut raw = [0u8; 32];
    dev.read(&o, 0, &mut raw)?;
    if raw.iter().any(|b| *b != 0) {
        return Err("a program continued past its failed wait".into());
    }
    // 2. The same process keeps working: the signal is set, then the same kernel completes.
    dev.write(&s, 0, &7u64.to_le_bytes())?;
    dev.launch(&k, [8, 1, 1], &[s.arg(), o.arg()], &LaunchOptions::default())?;
    dev.read(&o, 0, &mut raw)?;
    let ones = raw.chunks(4).all(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) == 1);
    if !ones {
        return Err("after the signal was set, the next launch did not write its output".into());
    }
    println!("next launch in the same process: correct");

    // 3. A cooperative launch whose programs wait on each other completes; one that cannot be
    //    resident is refused with a typed error before it starts.
    let b = KernelBuilder::new("siblings", LaunchAttrs { cooperative: true, ..LaunchAttrs::default() });
    let (sig, out) = (b.arg_ptr("sig", DType::U64), b.arg_ptr("out", DType::I32));
    let pid = b.program_id_x();
    b.if_else(
        pid.eq(0),
        || {
            let t = b.wait(sig, 1, CmpOp::Ge, 1u64, Scope::Gpu, MemSemantic::Acquire);
            b.store(out.consume_token(t), 42, None);
            vec![]
        },
        || {
            b.notify(sig, b.rank(), 1u64, trident_core::ir::SignalOp::Set, trident_core::ir::CommScope::Gpu);
            vec![]
        },
    );
    let k = backend.compile(&b.finish()?, None)?;
    dev.fill(&s, &[0])?;
    dev.fill(&o, &[0])?;
    dev.launch(&k, [2, 1, 1], &[s.arg(), o.arg()], &LaunchOptions::default())?;
    dev.read(&o, 0, &mut raw)?;
    if i32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]) != 42 {
        return Err("cooperative sibling wait did not complete correctly".into());
    }
    let e = dev.launch(&k, [1 << 20, 1, 1], &[s.arg(), o.arg()], &LaunchOptions::default());
    match e {
        Err(e) if e.to_string().contains("can be resident") => println!("oversized cooperative launch refused: {e}"),
        other => return Err(format!("oversized cooperative launch was not refused: {other:?}").into()),
    }
    println!("cooperative launch: correct");
    Ok(())
}
