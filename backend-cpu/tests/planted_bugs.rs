//! Planted protocol bugs are caught by the CPU world (`EXECUTION.md`): each buggy kernel fails
//! under some schedule (or every schedule, where the bug is deterministic), and its corrected
//! twin passes under every schedule, so the failures are the bug's and not the harness's.

use std::time::{Duration, Instant};
use trident_backend_cpu::world::{CpuWorld, WorldOptions};
use trident_core::backend::{BackendError, KernelArg};
use trident_core::ir::*;
use trident_core::world::RankCtx;
use trident_core::{Function, KernelBuilder};

const N: usize = 256;
const SCHEDULES: u64 = 24;

/// Rank 0 runs `writer`, rank 1 runs `reader`; both get (data, signal, out) symmetric buffers.
/// The reader copies what it sees of `data` into `out`; returns rank 1's `out`.
fn two_rank_protocol(writer: &Function, reader: &Function, seed: u64) -> Result<Vec<f32>, BackendError> {
    protocol_with(writer, reader, WorldOptions::new(2, seed))
}

fn protocol_with(writer: &Function, reader: &Function, opts: WorldOptions) -> Result<Vec<f32>, BackendError> {
    let (writer, reader) = (writer.clone(), reader.clone());
    let run = CpuWorld::run(opts, move |ctx: &dyn RankCtx| {
        let data = ctx.symm_alloc(N * 4, "data")?;
        let signal = ctx.symm_alloc(8, "signal")?;
        let out = ctx.symm_alloc(N * 4, "out")?;
        let src = ctx.alloc(N * 4, "src")?;
        let values: Vec<u8> = (0..N).flat_map(|i| (i as f32 + 1.0).to_le_bytes()).collect();
        ctx.write(&src, 0, &values)?;
        ctx.barrier()?;
        let k = if ctx.rank() == 0 { &writer } else { &reader };
        let artifact = ctx.compile(&k.name, &|| Ok(k.clone()))?;
        ctx.launch(0, &artifact, [1, 1, 1], &[src.arg(), data.arg(), signal.arg(), out.arg(), KernelArg::i32(1)])?;
        ctx.synchronize()?;
        let mut bytes = vec![0u8; N * 4];
        ctx.read(&out, 0, &mut bytes)?;
        Ok(bytes.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect::<Vec<f32>>())
    })?;
    Ok(run.results[1].clone())
}

fn params(b: &KernelBuilder) -> [trident_core::Tile<'_>; 5] {
    [
        b.arg_ptr("src", DType::F32),
        b.arg_ptr("data", DType::F32),
        b.arg_ptr("signal", DType::U64),
        b.arg_ptr("out", DType::F32),
        b.arg("peer", DType::I32),
    ]
}

enum Publish {
    Notify,
    ReleaseWithoutBarrier,
    BarrierThenRelease,
    /// A barrier, then a relaxed store of the signal: nothing orders the data before it.
    BarrierThenRelaxed,
}

/// Rank 0 stores a tile into rank 1's `data`, then publishes the signal.
fn writer(how: Publish) -> Function {
    let b = KernelBuilder::new("writer", LaunchAttrs::default());
    let [src, data, signal, _, peer] = params(&b);
    let offs = b.arange(0, N as i64);
    b.store(b.symm_at(data, peer) + offs, b.load(src + offs, None, None), None);
    match how {
        Publish::Notify => b.notify(signal, peer, 1u64, SignalOp::Set, CommScope::IntraNode),
        Publish::ReleaseWithoutBarrier | Publish::BarrierThenRelease | Publish::BarrierThenRelaxed => {
            if !matches!(how, Publish::ReleaseWithoutBarrier) {
                b.barrier();
            }
            let sem =
                if matches!(how, Publish::BarrierThenRelaxed) { MemSemantic::Relaxed } else { MemSemantic::Release };
            let remote = b.symm_at(signal, peer);
            b.atomic(AtomicOp::Xchg, remote, 1u64, None, sem, Scope::Sys);
        }
    }
    b.finish().unwrap()
}

/// Rank 1 waits for the signal with `sem`, then copies `data` to `out`.
fn reader(sem: MemSemantic) -> Function {
    let b = KernelBuilder::new("reader", LaunchAttrs::default());
    let [_, data, signal, out, _] = params(&b);
    let t = b.wait(signal, 1, CmpOp::Ge, 1u64, Scope::Sys, sem);
    let offs = b.arange(0, N as i64);
    b.store(out + offs, b.load(data.consume_token(t) + offs, None, None), None);
    b.finish().unwrap()
}

fn correct(out: &[f32]) -> bool {
    out.iter().enumerate().all(|(i, v)| *v == i as f32 + 1.0)
}

/// How many of the schedules give a wrong result (the runs themselves must succeed: a bug shows
/// as stale data, not as an error of the harness).
fn failures(w: &Function, r: &Function) -> u64 {
    let f = (0..SCHEDULES)
        .filter(|s| !correct(&two_rank_protocol(w, r, 0xB06 + s).unwrap_or_else(|e| panic!("schedule {s}: {e}"))))
        .count() as u64;
    eprintln!("{} / {}: {f} of {SCHEDULES} schedules wrong", w.name, r.name);
    f
}

#[test]
fn correct_protocol_passes_every_schedule() {
    assert_eq!(failures(&writer(Publish::Notify), &reader(MemSemantic::Acquire)), 0);
    assert_eq!(failures(&writer(Publish::BarrierThenRelease), &reader(MemSemantic::Acquire)), 0);
}

#[test]
fn notify_without_program_barrier_is_caught() {
    let f = failures(&writer(Publish::ReleaseWithoutBarrier), &reader(MemSemantic::Acquire));
    assert!(f > 0, "a single-thread release without a barrier was never caught in {SCHEDULES} schedules");
}

#[test]
fn missing_acquire_is_caught() {
    let f = failures(&writer(Publish::Notify), &reader(MemSemantic::Relaxed));
    assert!(f > 0, "a relaxed wait followed by data reads was never caught in {SCHEDULES} schedules");
}

#[test]
fn race_detector_reports_missing_acquire_in_every_schedule() {
    let race = |seed: u64| WorldOptions { race: true, ..WorldOptions::new(2, seed) };
    for seed in 0..SCHEDULES {
        let e =
            protocol_with(&writer(Publish::Notify), &reader(MemSemantic::Relaxed), race(seed)).unwrap_err().to_string();
        assert!(
            e.contains("data race on `data`") && e.contains("rank 0 program") && e.contains("rank 1 program"),
            "{e}"
        );
        let out = protocol_with(&writer(Publish::Notify), &reader(MemSemantic::Acquire), race(seed)).unwrap();
        assert!(correct(&out));
    }
}

/// The same detector over the lowered kernels (cpu-simt, the sm_90a lowering): `notify`'s
/// barrier, fence and relaxed signal write order the data before the reader's acquiring wait,
/// and a signal stored relaxed after a barrier, with no fence, is reported.
#[test]
fn simt_race_detector_orders_fenced_signals_and_reports_a_relaxed_publish() {
    trident_backend_nvidia::link();
    let race = |seed: u64| WorldOptions { race: true, simt_target: Some("sm_90a"), ..WorldOptions::new(2, seed) };
    for seed in 0..4 {
        let out = protocol_with(&writer(Publish::Notify), &reader(MemSemantic::Acquire), race(seed)).unwrap();
        assert!(correct(&out));
        let out = protocol_with(&writer(Publish::BarrierThenRelease), &reader(MemSemantic::Acquire), race(seed));
        assert!(correct(&out.unwrap()));
        let e = protocol_with(&writer(Publish::BarrierThenRelaxed), &reader(MemSemantic::Acquire), race(seed))
            .unwrap_err()
            .to_string();
        assert!(e.contains("data race on `data`") && e.contains("rank 1 program"), "{e}");
    }
}

/// Rank 0 puts the tile with `put nbi` and signals, with or without `quiet` in between.
fn nbi_writer(quiet: bool) -> Function {
    let b = KernelBuilder::new("nbi_writer", LaunchAttrs::default());
    let [src, data, signal, _, peer] = params(&b);
    b.put(data, src, (N * 4) as i64, peer, Group::Block, true);
    if quiet {
        b.quiet();
    }
    b.notify(signal, peer, 1u64, SignalOp::Set, CommScope::IntraNode);
    b.finish().unwrap()
}

#[test]
fn signal_before_quiet_of_nbi_put_is_caught() {
    assert_eq!(failures(&nbi_writer(true), &reader(MemSemantic::Acquire)), 0);
    let f = failures(&nbi_writer(false), &reader(MemSemantic::Acquire));
    assert!(f > 0, "nbi data read before the writer's quiet was never caught in {SCHEDULES} schedules");
}

#[test]
fn read_of_nbi_get_data_before_quiet_is_caught() {
    // Rank 0 fills its symmetric `data`; rank 1 fetches it into its own `out`.
    let filler = {
        let b = KernelBuilder::new("filler", LaunchAttrs::default());
        let [src, data, _, _, _] = params(&b);
        let offs = b.arange(0, N as i64);
        b.store(data + offs, b.load(src + offs, None, None), None);
        b.finish().unwrap()
    };
    let getter = |quiet: bool| {
        let b = KernelBuilder::new("getter", LaunchAttrs::default());
        let [_, data, _, out, _] = params(&b);
        b.get(out, data, (N * 4) as i64, 0, Group::Block, true);
        if quiet {
            b.quiet();
        }
        // Reads its own `out` right after the get: before `quiet` it may still hold zeros.
        let offs = b.arange(0, N as i64);
        let v = b.load(out + offs, None, None);
        b.store(out + offs, v, None);
        b.finish().unwrap()
    };
    let run = |quiet: bool, seed: u64| -> bool {
        let (f, g) = (filler.clone(), getter(quiet));
        let r = CpuWorld::run(WorldOptions::new(2, seed), move |ctx: &dyn RankCtx| {
            let data = ctx.symm_alloc(N * 4, "data")?;
            let out = ctx.symm_alloc(N * 4, "out")?;
            let src = ctx.alloc(N * 4, "src")?;
            let signal = ctx.symm_alloc(8, "signal")?;
            let values: Vec<u8> = (0..N).flat_map(|i| (i as f32 + 1.0).to_le_bytes()).collect();
            ctx.write(&src, 0, &values)?;
            if ctx.rank() == 0 {
                let k = ctx.compile("filler", &|| Ok(f.clone()))?;
                ctx.launch(0, &k, [1, 1, 1], &[src.arg(), data.arg(), signal.arg(), out.arg(), KernelArg::i32(0)])?;
                ctx.synchronize()?;
            }
            ctx.barrier()?;
            if ctx.rank() == 1 {
                let k = ctx.compile("getter", &|| Ok(g.clone()))?;
                ctx.launch(0, &k, [1, 1, 1], &[src.arg(), data.arg(), signal.arg(), out.arg(), KernelArg::i32(0)])?;
                ctx.synchronize()?;
            }
            let mut bytes = vec![0u8; N * 4];
            ctx.read(&out, 0, &mut bytes)?;
            Ok(bytes.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect::<Vec<f32>>())
        });
        correct(&r.unwrap_or_else(|e| panic!("seed {seed}: {e}")).results[1])
    };
    assert!((0..SCHEDULES).all(|s| run(true, s)), "get + quiet + read must always see the data");
    assert!((0..SCHEDULES).any(|s| !run(false, s)), "get nbi + read before quiet was never caught");
}

#[test]
fn wait_that_nothing_satisfies_ends_with_the_diagnostic() {
    let start = Instant::now();
    let never = {
        let b = KernelBuilder::new("waits_forever", LaunchAttrs::default());
        let [_, _, signal, _, _] = params(&b);
        b.wait(signal, 1, CmpOp::Ge, 42u64, Scope::Sys, MemSemantic::Acquire);
        b.finish().unwrap()
    };
    let e = two_rank_protocol(&never, &reader(MemSemantic::Acquire), 5).unwrap_err().to_string();
    assert!(start.elapsed() < Duration::from_secs(5), "took {:?}", start.elapsed());
    for needle in [
        "deadlock",
        "rank 0",
        "`waits_forever`",
        "program [0, 0, 0]",
        "`signal`[0] on rank 0",
        "expected ge 42",
        "seen 0",
    ] {
        assert!(e.contains(needle), "diagnostic lacks `{needle}`:\n{e}");
    }
    // The reader on rank 1 is reported too: it waits for a signal nobody writes.
    assert!(e.contains("rank 1") && e.contains("expected ge 1"), "{e}");
}

/// Program 0 waits for a signal that program 1 of the same launch writes.
fn sibling_wait(cooperative: bool) -> Function {
    let b = KernelBuilder::new("siblings", LaunchAttrs { cooperative, ..LaunchAttrs::default() });
    let [_, _, signal, _, _] = params(&b);
    let pid = b.program_id_x();
    b.if_else(
        pid.eq(0),
        || {
            b.wait(signal, 1, CmpOp::Ge, 1u64, Scope::Gpu, MemSemantic::Acquire);
            vec![]
        },
        || {
            b.notify(signal, b.rank(), 1u64, SignalOp::Set, CommScope::Gpu);
            vec![]
        },
    );
    b.finish().unwrap()
}

fn run_siblings(k: &Function, seed: u64) -> Result<(), BackendError> {
    let k = k.clone();
    CpuWorld::run(WorldOptions::new(1, seed), move |ctx: &dyn RankCtx| {
        let signal = ctx.symm_alloc(8, "signal")?;
        let a = ctx.compile(&k.name, &|| Ok(k.clone()))?;
        let dummy = ctx.alloc(N * 4, "dummy")?;
        ctx.launch(0, &a, [2, 1, 1], &[dummy.arg(), dummy.arg(), signal.arg(), dummy.arg(), KernelArg::i32(0)])?;
        ctx.synchronize()
    })
    .map(|_| ())
}

#[test]
fn independent_launch_whose_programs_wait_on_each_other_is_a_contract_violation() {
    for seed in 0..SCHEDULES {
        let e = run_siblings(&sibling_wait(false), seed).unwrap_err().to_string();
        assert!(e.contains("contract violation") && e.contains("same launch"), "seed {seed}: {e}");
    }
    for seed in 0..SCHEDULES {
        run_siblings(&sibling_wait(true), seed).unwrap();
    }
}
