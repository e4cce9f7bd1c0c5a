//! `trident selftest`: runtime checks that need a GPU (run by scripts/gpu-check.sh).
//!
//! 1. A planted wait that nothing satisfies ends within its bound with a diagnostic naming rank,
//!    program, signal, expected and seen, and every program of the launch stops (no trap).
//! 2. The next launch in the same process still works and is correct.
//! 3. A cooperative launch whose programs wait on each other completes; an oversized one is
//!    refused before it starts.
//! 4. CUDA events time a kernel.
//! 5. Loopback world: a stream wait that nothing satisfies is reported by the `synchronize`
//!    watchdog (rank, stream, signal, expected, seen) and released; the world's next launch works.
//! 6. Loopback world: a waiting kernel whose grid x ranks cannot be co-resident is refused.
//! 7. A loopback world of 32 ranks (64 streams on a GPU of at most 32 hardware queues) is
//!    refused at once with a typed error that says what fits.
//! 8. A timed-out wait names its kernel and the buffer now at the signal's offset, where an
//!    earlier world had another buffer at the same offset.
//! 9. Last (it leaves the GPU unusable for the process): a kernel that never ends on stream 1
//!    of rank 3 in a world of 16 ends the world within its bounds, naming rank, stream and
//!    kernel, and a later world is refused at once. The process then exits without the
//!    driver's exit handlers.

use std::process::ExitCode;
use std::time::{Duration, Instant};
use trident_backend_nvidia::event::Event;
use trident_backend_nvidia::world::{GpuWorld, GpuWorldOptions};
use trident_core::backend::{self, LaunchOptions};
use trident_core::ir::{CmpOp, DType, LaunchAttrs, MemSemantic, Scope};
use trident_core::KernelBuilder;

/// `trident selftest`.
pub fn main() -> ExitCode {
    let code = match run() {
        Ok(()) => {
            println!("gpu selftest: PASS");
            0
        }
        Err(e) => {
            println!("gpu selftest: FAIL: {e}");
            1
        }
    };
    trident_gpu_runtime::health::exit_if_wedged(code);
    ExitCode::from(code as u8)
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

    // 4. Events around a launch on the default stream.
    let cuda = trident_backend_nvidia::runtime::CudaDevice::open(0)?;
    let (e0, e1) = (Event::new(&cuda)?, Event::new(&cuda)?);
    let va = trident_kernels::vector_add::VectorAdd { dtype: DType::F32, block: 1024 };
    let kv = backend.compile(&va.build()?, None)?;
    let n = 1 << 24;
    let bufs: Vec<_> = ["x", "y", "z"].iter().map(|b| cuda.alloc(n * 4, b)).collect::<Result<_, _>>()?;
    for b in &bufs {
        cuda.fill(b, &[0])?;
    }
    let args = [bufs[0].arg(), bufs[1].arg(), bufs[2].arg(), trident_core::backend::KernelArg::i32(n as i32)];
    use trident_core::backend::Device;
    cuda.launch(&kv, [(n / 1024) as u32, 1, 1], &args, &LaunchOptions::default())?;
    e0.record_default()?;
    cuda.launch(&kv, [(n / 1024) as u32, 1, 1], &args, &LaunchOptions::default())?;
    e1.record_default()?;
    e1.synchronize()?;
    let t = e1.elapsed_since(&e0)?;
    let gbs = (3 * n * 4) as f64 / t.as_secs_f64() / 1e9;
    println!("events: vector_add of {n} f32 took {t:?} ({gbs:.0} GB/s, launch and sync included)");
    if t.is_zero() || t > Duration::from_secs(1) {
        return Err(format!("implausible event time {t:?}").into());
    }

    // 5. The stream-wait watchdog.
    let mut opts = GpuWorldOptions::new(2);
    opts.stream_wait_bound = Duration::from_millis(500);
    let start = Instant::now();
    let r = GpuWorld::run(opts.clone(), |ctx| {
        let sig = ctx.symm_alloc(8, "never_written")?;
        ctx.barrier()?;
        if ctx.rank() == 1 {
            ctx.wait_signal(0, &sig, 0, CmpOp::Ge, 3)?;
        }
        ctx.synchronize()
    });
    let took = start.elapsed();
    let e = match r {
        Ok(_) => return Err("the planted stream wait completed".into()),
        Err(e) => e.to_string(),
    };
    println!("planted stream wait ended after {took:?} (bound 500ms): {e}");
    for needle in ["stream wait timed out", "rank 1", "`never_written@rank1`[0]", "expected ge 3", "seen 0"] {
        if !e.contains(needle) {
            return Err(format!("stream-wait diagnostic lacks `{needle}`").into());
        }
    }
    let sums = GpuWorld::run(opts.clone(), move |ctx| {
        let x = ctx.alloc(1024 * 4, "x")?;
        let v: Vec<u8> = (0..1024).flat_map(|i| (i as f32 + ctx.rank() as f32).to_le_bytes()).collect();
        ctx.write(&x, 0, &v)?;
        let k = ctx.compile("vadd", &|| va.build())?;
        ctx.launch(0, &k, [1, 1, 1], &[x.arg(), x.arg(), x.arg(), trident_core::backend::KernelArg::i32(1024)])?;
        ctx.synchronize()?;
        let mut out = vec![0u8; 1024 * 4];
        ctx.read(&x, 0, &mut out)?;
        Ok(out.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).sum::<f32>())
    })?;
    let want = |r: f32| (0..1024).map(|i| 2.0 * (i as f32 + r)).sum::<f32>();
    if sums != [want(0.0), want(1.0)] {
        return Err(format!("after the watchdog, the next world computed {sums:?}").into());
    }
    println!("next world after the watchdog: correct");

    // 6. Co-residency of waiting kernels in the loopback world.
    let r = GpuWorld::run(GpuWorldOptions::new(4), move |ctx| {
        let sig = ctx.symm_alloc(8, "sig")?;
        let k = ctx.compile("planted_wait", &|| {
            let b = KernelBuilder::new("waits_for_peer", LaunchAttrs::default());
            let s = b.arg_ptr("sig", DType::U64);
            b.wait(s, 1, CmpOp::Ge, 1u64, Scope::Sys, MemSemantic::Acquire);
            b.finish()
        })?;
        ctx.launch(0, &k, [1 << 16, 1, 1], &[sig.arg()])
    });
    match r {
        Err(e) if e.to_string().contains("x 4 ranks sharing the GPU") => {
            println!("oversized waiting launch in a world of 4 refused: {e}")
        }
        other => return Err(format!("an oversized waiting launch was not refused: {other:?}").into()),
    }

    // 7. More streams than hardware queues: refused before anything starts.
    let start = Instant::now();
    match GpuWorld::run(GpuWorldOptions::new(32), |_| Ok(())) {
        Err(e) if e.to_string().contains("hardware queues") && start.elapsed() < Duration::from_secs(1) => {
            println!("world of 32 ranks on one GPU refused after {:?}: {e}", start.elapsed())
        }
        other => return Err(format!("a world of 32 ranks on one GPU was not refused at once: {other:?}").into()),
    }

    // 8. Names on a reused offset: `first_buffer`, then in the next world `second` at the same
    //    offset, on which a kernel's wait times out.
    let mut short = GpuWorldOptions::new(2);
    short.wait_bound = Duration::from_millis(300);
    GpuWorld::run(short.clone(), |ctx| ctx.symm_alloc(64, "first_buffer").map(|_| ()))?;
    let r = GpuWorld::run(short, |ctx| {
        let sig = ctx.symm_alloc(64, "second")?;
        let k = ctx.compile("planted_wait_second", &|| {
            let b = KernelBuilder::new("planted_wait_second", LaunchAttrs::default());
            let s = b.arg_ptr("sig", DType::U64);
            b.wait(s + 1, 1, CmpOp::Ge, 5u64, Scope::Sys, MemSemantic::Acquire);
            b.finish()
        })?;
        if ctx.rank() == 0 {
            ctx.launch(0, &k, [1, 1, 1], &[sig.arg()])?;
        }
        ctx.synchronize()
    });
    match r {
        Err(e)
            if e.to_string().contains("kernel `planted_wait_second`")
                && e.to_string().contains("`second@rank0`[1]") =>
        {
            println!("timed-out wait on a reused offset named: {e}")
        }
        other => return Err(format!("the wait on a reused offset was not named right: {other:?}").into()),
    }

    // 9. A kernel that never ends, on stream 1 of rank 3 of 16.
    let mut opts = GpuWorldOptions::new(16);
    opts.stream_wait_bound = Duration::from_secs(2);
    let start = Instant::now();
    let r = GpuWorld::run(opts, |ctx| {
        let flag = ctx.symm_alloc(8, "never_set")?;
        let k = ctx.compile("spin_forever", &|| {
            let b = KernelBuilder::new("spin_forever", LaunchAttrs::default());
            let f = b.arg_ptr("flag", DType::I32);
            let zero = b.constant(trident_core::ir::Literal::Int(0), DType::I32);
            let relaxed = |v| b.atomic(trident_core::ir::AtomicOp::Add, f, v, None, MemSemantic::Relaxed, Scope::Sys);
            let seen = b.while_loop(&[zero], |c| c[0].eq(0), |_| vec![relaxed(0)]);
            b.store(f, seen[0] + 1, None);
            b.finish()
        })?;
        if ctx.rank() == 3 {
            ctx.launch(1, &k, [1, 1, 1], &[flag.arg()])?;
        }
        ctx.synchronize()
    });
    let took = start.elapsed();
    let e = match r {
        Ok(_) => return Err("the kernel that never ends completed".into()),
        Err(e) => e.to_string(),
    };
    println!("stuck stream in a world of 16 ended after {took:?} (stream bound 2s): {e}");
    for needle in ["rank 3, stream 1 still busy", "kernel `spin_forever`"] {
        if !e.contains(needle) {
            return Err(format!("stuck-stream diagnostic lacks `{needle}`").into());
        }
    }
    if took > Duration::from_secs(8) {
        return Err(format!("the stuck stream took {took:?} to report").into());
    }
    match GpuWorld::run(GpuWorldOptions::new(2), |_| Ok(())) {
        Err(e) if e.to_string().contains("unusable") => println!("the next world is refused at once: {e}"),
        other => return Err(format!("a world after the stuck stream was not refused: {other:?}").into()),
    }
    Ok(())
}
