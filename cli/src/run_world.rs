//! `trident run K.tile --world N` (and `--processes`): a `.tile` kernel run SPMD on the ranks of
//! a world, so that a porter can try a protocol without writing host code.
//!
//! Every rank allocates the kernel's buffers in parameter order (`:symm` ones in the symmetric
//! heap, collectively), writes its first bytes (random values seeded by the seed and the rank),
//! meets the others, then makes `1 + --repeat` calls on the same buffers, each ended on every
//! rank (streams synchronized, a host barrier) before the next starts; scalars may be the
//! rank, the world size or the call's number. Every buffer whose bytes changed goes to
//! `OUT/rank<r>/NAME.npy`. The CPU world runs under `--chaos N` schedules, each of which must
//! succeed and leave the same bytes (a protocol whose result depends on the schedule is wrong),
//! optionally with its race detector; `nvidia` runs the loopback world (every rank on GPU 0),
//! the peer world, or, under `trident launch`, this process's rank of an NVSHMEM world.

use crate::run::{write_npy, ArgValue, Args};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;
use trident_backend_cpu::world::{CpuWorld, WorldOptions};
use trident_conformance::cli::usage;
use trident_core::backend::{BackendDescriptor, BackendError, Buffer};
use trident_core::ir::DType;
use trident_core::world::RankCtx;
use trident_core::Function;

/// What every rank runs.
struct Plan {
    func: Function,
    grid: [u32; 3],
    values: Vec<ArgValue>,
    calls: usize,
    seed: u64,
    /// Every call traced (`--trace`).
    trace: bool,
}

/// One rank's outcome: each buffer's name, type, first and last bytes; each call's host time;
/// with `--trace`, every call's launch and its events.
struct RankOut {
    buffers: Vec<(String, DType, Vec<u8>, Vec<u8>)>,
    call_ms: Vec<f64>,
    launches: Vec<trident_kernels::trace::Launch>,
}

fn host(e: String) -> BackendError {
    BackendError::Host(e)
}

/// The plan on one rank (traced with `--trace`).
fn rank_main(ctx: &dyn RankCtx, plan: &Plan) -> Result<RankOut, BackendError> {
    if !plan.trace {
        return rank_calls(ctx, plan);
    }
    let traced = trident_kernels::trace::Traced::new(ctx, TRACE_CAPACITY, plan.calls)?;
    let mut out = rank_calls(&traced, plan)?;
    traced.sync_clocks()?;
    out.launches = traced.collect()?;
    Ok(out)
}

/// Events per traced call (`--trace`).
const TRACE_CAPACITY: usize = 1 << 16;

/// The plan's calls on one rank.
fn rank_calls(ctx: &dyn RankCtx, plan: &Plan) -> Result<RankOut, BackendError> {
    let (rank, world) = (ctx.rank(), ctx.world_size());
    let kernel = ctx.compile(&format!("run:{}", plan.func.name), &|| Ok(plan.func.clone()))?;
    let mut bufs: Vec<Option<(Buffer, Vec<u8>)>> = Vec::new();
    for v in &plan.values {
        bufs.push(match v {
            ArgValue::Buffer { name, dtype, len, symmetric, .. } => {
                let first = v.bytes(rank, plan.seed).map_err(host)?;
                let bytes = (len * dtype.size_bytes() as usize).max(first.len());
                let b = if *symmetric { ctx.symm_alloc(bytes, name)? } else { ctx.alloc(bytes, name)? };
                ctx.write(&b, 0, &first)?;
                Some((b, first))
            }
            ArgValue::Scalar { .. } => None,
        });
    }
    // Every rank's buffers hold their first bytes before any kernel reads a peer's.
    ctx.barrier()?;
    let mut call_ms = Vec::new();
    for call in 1..=plan.calls {
        let args = plan
            .values
            .iter()
            .zip(&bufs)
            .map(|(v, b)| match b {
                Some((b, _)) => Ok(b.arg()),
                None => v.scalar(rank, world, call).map_err(host),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let t = Instant::now();
        ctx.launch(0, &kernel, plan.grid, &args)?;
        ctx.synchronize()?;
        call_ms.push(t.elapsed().as_secs_f64() * 1e3);
        ctx.barrier()?;
    }
    let mut buffers = Vec::new();
    for (v, b) in plan.values.iter().zip(bufs) {
        if let (ArgValue::Buffer { name, dtype, .. }, Some((b, first))) = (v, b) {
            let mut last = vec![0u8; first.len()];
            ctx.read(&b, 0, &mut last)?;
            buffers.push((name.clone(), *dtype, first, last));
        }
    }
    Ok(RankOut { buffers, call_ms, launches: Vec::new() })
}

/// The first difference between two runs' outcomes: rank and buffer.
fn first_difference(a: &[RankOut], b: &[RankOut]) -> Option<(usize, String)> {
    a.iter().zip(b).enumerate().find_map(|(r, (x, y))| {
        x.buffers.iter().zip(&y.buffers).find(|(p, q)| p.3 != q.3).map(|(p, _)| (r, p.0.clone()))
    })
}

/// `trident run --world N` / `--processes`.
pub fn main(
    a: &Args,
    desc: &'static BackendDescriptor,
    func: Function,
    grid: [u32; 3],
    values: Vec<ArgValue>,
) -> ExitCode {
    let plan = Arc::new(Plan { func, grid, values, calls: a.repeat + 1, seed: a.seed, trace: a.trace.is_some() });
    let cpu = matches!(desc.name, "cpu" | "cpu-simt");
    if (a.chaos != 1 || a.race) && !cpu {
        return usage(format!("--chaos and --race run in the CPU world (cpu, cpu-simt), not on {}", desc.name));
    }
    if a.chaos == 0 {
        return usage("--chaos 0: give the number of schedules, at least 1");
    }
    if a.processes && desc.name != "nvidia" {
        return usage(format!("--processes: worlds of processes run on nvidia (NVSHMEM), not {}", desc.name));
    }
    if a.peer && desc.name != "nvidia" {
        return usage(format!("--peer: the peer world runs on nvidia, not {}", desc.name));
    }
    let simt_target = match desc.name {
        "cpu-simt" => desc.resolve_target(a.target.as_deref()).ok(),
        _ => None,
    };
    let started = Instant::now();
    let outcome: Result<(Vec<RankOut>, usize, String), BackendError> = (|| {
        if a.processes {
            use trident_backend_nvidia::nvshmem_world::NvshmemWorld;
            let world = NvshmemWorld::join(trident_backend_nvidia::world::GpuWorldOptions::new(0))?;
            let rank = world.rank();
            let out = world.run(&|ctx| rank_main(ctx, &plan))?;
            // This process writes its own rank's buffers; the others theirs.
            let mut all: Vec<RankOut> =
                (0..rank).map(|_| RankOut { buffers: Vec::new(), call_ms: Vec::new(), launches: Vec::new() }).collect();
            all.push(out);
            return Ok((
                all,
                rank,
                format!("rank {rank} of a world of {} processes ({})", world.size(), world.provider()),
            ));
        }
        let Some(n) = a.world else { return Err(host("--world N is needed".into())) };
        if cpu {
            let mut first: Option<Vec<RankOut>> = None;
            for k in 0..a.chaos {
                let schedule = a.seed ^ (k as u64).wrapping_mul(0xA076_1D64_78BD_642F);
                let opts = WorldOptions { race: a.race, simt_target, ..WorldOptions::new(n, schedule) };
                let p = plan.clone();
                let run = CpuWorld::run(opts, move |ctx| rank_main(ctx, &p))
                    .map_err(|e| host(format!("schedule {k} (seed {schedule:#x}): {e}")))?;
                match &first {
                    None => first = Some(run.results),
                    Some(f) => {
                        if let Some((r, buf)) = first_difference(f, &run.results) {
                            return Err(host(format!(
                                "schedule {k} (seed {schedule:#x}) left other bytes in `{buf}` on rank {r} than schedule 0: the result depends on the schedule"
                            )));
                        }
                    }
                }
            }
            let how = format!(
                "the CPU world of {n} ranks{}, {} schedule(s){}",
                simt_target.map(|t| format!(" (SIMT lowering for {t})")).unwrap_or_default(),
                a.chaos,
                if a.race { ", race detector on" } else { "" }
            );
            return Ok((first.unwrap_or_default(), 0, how));
        }
        if desc.name != "nvidia" {
            return Err(host(format!("backend `{}` has no world of ranks yet", desc.name)));
        }
        use trident_backend_nvidia::world::{GpuWorld, GpuWorldOptions};
        let opts = GpuWorldOptions::new(n);
        let p = plan.clone();
        let (outs, how) = if a.peer {
            let g = GpuWorld::peer_devices(n)?;
            (
                GpuWorld::run_peer(opts, move |ctx| rank_main(ctx, &p))?,
                format!("the peer world of {n} ranks on {g} GPU(s)"),
            )
        } else {
            (GpuWorld::run(opts, move |ctx| rank_main(ctx, &p))?, format!("the loopback world of {n} ranks on GPU 0"))
        };
        Ok((outs, 0, how))
    })();
    let (outs, first_rank, how) = match outcome {
        Ok(x) => x,
        Err(e) => {
            eprintln!("error: {e}");
            trident_gpu_runtime::health::exit_if_wedged(1);
            return ExitCode::FAILURE;
        }
    };
    for (r, out) in outs.iter().enumerate().skip(first_rank) {
        let dir = a.out.join(format!("rank{r}"));
        for (name, dtype, first, last) in &out.buffers {
            if first != last {
                if let Err(e) = write_npy(&dir, name, *dtype, last) {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    if let Some(path) = &a.trace {
        use trident_kernels::trace::{perfetto, svg, Timeline};
        let timeline = Timeline::of(outs.iter().map(|o| o.launches.clone()));
        let json = serde_json::to_string(&perfetto::to_json(&timeline)).unwrap_or_default();
        let svg_path = path.with_extension("svg");
        let title = format!("@{} in {how}", plan.func.name);
        if let Err(e) =
            std::fs::write(path, json).and_then(|_| std::fs::write(&svg_path, svg::render(&timeline, &title)))
        {
            eprintln!("error: writing the trace {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!(
            "trace: {} ({} launches, {} programs, {} events dropped) and {}",
            path.display(),
            timeline.launches.len(),
            timeline.programs().0.len(),
            timeline.dropped(),
            svg_path.display()
        );
        for c in &timeline.clocks {
            println!(
                "trace: rank {}'s clock is {} ns from rank 0's (within {} ns)",
                c.rank, c.offset_ns, c.uncertainty_ns
            );
        }
    }
    let slowest: Vec<f64> = (0..plan.calls)
        .map(|c| outs.iter().filter_map(|o| o.call_ms.get(c)).fold(0.0, |m: f64, x| m.max(*x)))
        .collect();
    println!(
        "kernel @{} in {how}: {} call(s), grid {:?}, the first {:.3} ms (slowest rank, host clock, launch to completion); {:.1} s in all",
        plan.func.name,
        plan.calls,
        plan.grid,
        slowest.first().copied().unwrap_or_default(),
        started.elapsed().as_secs_f64()
    );
    ExitCode::SUCCESS
}
