//! `trident test`: runs the conformance suite and prints a table; `--json` writes records.

use crate::cli::{self, usage};
use crate::suite::{all_cases, run_case, Case, Record, RunConfig};
use std::io::Write;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use trident_core::backend;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Backend to run on.
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// Backend target (default: the backend's first).
    #[arg(long)]
    target: Option<String>,
    /// Only kernels whose name contains this.
    #[arg(long)]
    kernel: Option<String>,
    /// Only this element type (f32, bf16, f16).
    #[arg(long)]
    dtype: Option<String>,
    /// Only cases at this world size (ranks).
    #[arg(long)]
    world: Option<usize>,
    /// Only cases at worlds of at most this many ranks (CI runs the SIMT lowering to 3: a
    /// kernel's code does not change with the world beyond that; the reference backend runs
    /// every world).
    #[arg(long, conflicts_with = "world")]
    max_world: Option<usize>,
    /// Run every distributed case under N different schedules and visibility delays.
    #[arg(long, default_value_t = 1)]
    chaos: usize,
    /// Every distributed case records one call (`trident_core::capture`) and replays it N
    /// times, each output checked, instead of making two calls from the host; copy-engine
    /// variants are skipped (not capturable).
    #[arg(long, conflicts_with = "rearm")]
    replay: Option<usize>,
    /// Plant a timeout in every distributed case: after one call, the last rank skips the
    /// second, so the others' waits time out with their diagnostics; every rank then re-arms
    /// the operation (signals and epochs to zero) and two more calls are checked. In the CPU
    /// world device waits time out where the world would deadlock; on a GPU after their bound
    /// (TRIDENT_WAIT_BOUND_MS, 2 s by default).
    #[arg(long)]
    rearm: bool,
    /// Run distributed cases under the happens-before race detector.
    #[arg(long)]
    race: bool,
    /// Replay a run: the seed it printed (decimal or 0x-hex).
    #[arg(long)]
    seed: Option<String>,
    /// Write one JSON record per case to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// List the registered backends and exit.
    #[arg(long)]
    list_backends: bool,
    /// List the cases and exit.
    #[arg(long)]
    list: bool,
    /// Check the options (backend, target, filters, world size, report path) and exit: what
    /// `cargo xtask test` does before any work.
    #[arg(long)]
    check: bool,
    /// Run the distributed cases as this process's rank of a world of processes (one per rank,
    /// started by `trident launch -n N`, torchrun, Slurm or mpirun), symmetric memory from
    /// NVSHMEM (`--backend nvidia`); only cases at that world size. Without CUDA, a GPU or
    /// NVSHMEM every case is skipped, visibly.
    #[arg(long)]
    processes: bool,
    /// With --processes: rank R exits just before its first kernel launch or copy, to show that
    /// every other rank ends with a diagnostic within its bounds.
    #[arg(long, value_name = "R")]
    plant_dead_rank: Option<usize>,
    /// Compile every distributed kernel with all its communication at inter-node scope: calls
    /// of NVSHMEM's device functions (nvidia with --processes), executed as the library defines
    /// them on cpu-simt. Only distributed cases.
    #[arg(long)]
    inter_node: bool,
    /// Run the distributed cases in the peer world (`--backend nvidia`): one process, rank r on
    /// GPU r (peer access between every pair of GPUs; with fewer GPUs than ranks, ranks share
    /// them as in the loopback world, which the header says).
    #[arg(long)]
    peer: bool,
    /// Cases run at once, each on its own host thread (default: the host's cores on cpu,
    /// cpu-simt and amd; one on nvidia, whose cases share the GPU). The table and the report
    /// keep the suite's order; a case's result does not depend on this (its inputs and
    /// schedules come from the seed and its index).
    #[arg(long)]
    jobs: Option<usize>,
}

/// Stack of a worker thread running cases (the main thread's size).
const WORKER_STACK_BYTES: usize = 8 << 20;

/// Ranks a world may have (the CPU and loopback worlds' limit).
const MAX_WORLD: usize = 64;

/// `--backend amd` without an AMD GPU: the target whose code objects are compiled and checked,
/// and what the device part of each line says.
struct Amd {
    target: &'static trident_core::target::TargetDesc,
    device: String,
}

impl Amd {
    /// cpu-simt for the target with every compile first checked as a code object, and the
    /// code objects (checked, failed) so far, counted for the one case that runs on it.
    fn backend(&self) -> (trident_core::backend::Checked, Arc<Mutex<(usize, usize)>>) {
        let counts = Arc::new(Mutex::new((0usize, 0usize)));
        let (counter, t) = (counts.clone(), self.target);
        let check =
            trident_core::backend::CompileCheck(Arc::new(move |f: &trident_core::Function, _: Option<&str>| {
                let r = trident_backend_amd::AmdBackend::compile_checked(f, t);
                let mut n = counter.lock().unwrap_or_else(|e| e.into_inner());
                if r.is_ok() {
                    n.0 += 1;
                } else {
                    n.1 += 1;
                }
                r.map(|_| ())
            }));
        let simt = trident_core::backend::lookup("cpu-simt").expect("cpu-simt is linked");
        (trident_core::backend::Checked { inner: (simt.create)(), check }, counts)
    }
}

/// `trident test`: runs the suite as `args` say.
pub fn main(args: Args) -> ExitCode {
    if args.list_backends {
        println!("devices: {}", trident_gpu_runtime::discovery::summary());
        for d in backend::registered() {
            println!("{:<8} targets: {:<24} {}", d.name, d.target_names().join(", "), d.description);
        }
        return ExitCode::SUCCESS;
    }
    let desc = match cli::backend(&args.backend, args.target.as_deref()) {
        Ok(d) => d,
        Err(e) => return usage(e),
    };
    if let Some(d) = &args.dtype {
        if !crate::suite::DTYPES.iter().any(|x| x.as_str() == d) {
            return usage(format!("--dtype {d}: the suite runs f32, bf16 and f16"));
        }
    }
    if let Some(w) = args.world {
        if w == 0 || w > MAX_WORLD {
            return usage(format!("--world {w}: a world has 1..={MAX_WORLD} ranks"));
        }
    }
    if args.replay == Some(0) {
        return usage("--replay 0: give the number of replays, at least 1");
    }
    if args.chaos == 0 {
        return usage("--chaos 0: give the number of schedules per distributed case, at least 1");
    }
    // Cases of the CPU backends run side by side; a GPU's, one at a time.
    let on_host = matches!(desc.name, "cpu" | "cpu-simt" | "amd");
    let jobs = match args.jobs {
        Some(0) => return usage("--jobs 0: give the number of cases run at once, at least 1"),
        Some(n) if n > 1 && !on_host => {
            return usage(format!("--jobs {n}: cases run one at a time on {} (they share the device)", desc.name))
        }
        Some(n) => n,
        None if on_host => std::thread::available_parallelism().map_or(1, |n| n.get()),
        None => 1,
    };
    if args.race && !matches!(desc.name, "cpu" | "cpu-simt") {
        return usage(format!("--race: the race detector runs in the CPU world (cpu, cpu-simt), not on {}", desc.name));
    }
    let mut seed = match cli::seed(args.seed.as_deref()) {
        Ok(s) => s,
        Err(e) => return usage(e),
    };
    if args.plant_dead_rank.is_some() && !args.processes {
        return usage("--plant-dead-rank: only with --processes");
    }
    if args.peer && (desc.name != "nvidia" || args.processes) {
        return usage(format!(
            "--peer: the peer world (one process, a rank per GPU) runs on nvidia without --processes, not on {}{}",
            desc.name,
            if args.processes { " with --processes" } else { "" }
        ));
    }
    if args.inter_node && !(desc.name == "cpu-simt" || (desc.name == "nvidia" && args.processes)) {
        return usage(format!(
            "--inter-node: the inter-node lowering runs on cpu-simt and on nvidia with --processes (NVSHMEM), not on {}{}",
            desc.name,
            if desc.name == "nvidia" { " without --processes" } else { "" }
        ));
    }
    // A world of processes: this process is one rank; the cases are those at its size.
    let place = if args.processes {
        if desc.name != "nvidia" {
            return usage(format!("--processes: the world of processes runs on nvidia (NVSHMEM), not {}", desc.name));
        }
        match trident_gpu_runtime::world_env::WorldEnv::from_env() {
            Ok(env) => {
                if args.world.is_some_and(|w| w != env.size) {
                    return usage(format!("--world {:?}: this process is in a world of {}", args.world, env.size));
                }
                Some(env)
            }
            Err(e) => {
                return usage(format!(
                    "--processes: {e}: start it with `trident launch -n N -- trident test --processes ...`"
                ))
            }
        }
    } else {
        None
    };
    let world_filter = args.world.or(place.as_ref().map(|p| p.size));
    // The report path must be writable before any case runs.
    if let Some(path) = &args.json {
        if let Err(e) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            return usage(format!("--json {}: {e}", path.display()));
        }
    }
    let selected: Vec<(usize, _)> = all_cases(world_filter)
        .into_iter()
        .enumerate()
        .filter(|(_, c)| args.kernel.as_ref().is_none_or(|k| c.kernel.contains(k.as_str())))
        .filter(|(_, c)| args.dtype.as_ref().is_none_or(|d| c.dtype.as_str() == d))
        .filter(|(_, c)| world_filter.is_none_or(|w| c.world == w))
        .filter(|(_, c)| args.max_world.is_none_or(|w| c.world <= w))
        .filter(|(_, c)| (place.is_none() && !args.inter_node) || c.distributed)
        .collect();
    if args.list {
        for (_, c) in &selected {
            println!("{} {} {} {} world {}", c.kernel, c.variant, c.dtype, c.shape_text(), c.world);
        }
        return ExitCode::SUCCESS;
    }
    if selected.is_empty() {
        return usage("no case matches the filters");
    }
    if args.check {
        println!("options ok: backend {}, {} cases", desc.name, selected.len());
        return ExitCode::SUCCESS;
    }
    let mut processes = None;
    if let Some(place) = &place {
        use trident_backend_nvidia::nvshmem_world::NvshmemWorld;
        let opts = trident_backend_nvidia::world::GpuWorldOptions::new(place.size);
        match NvshmemWorld::join(opts) {
            Ok(w) => {
                // Every rank runs the cases on rank 0's seed.
                match w.all_gather("seed", &seed.to_le_bytes()) {
                    Ok(all) => seed = u64::from_le_bytes(all[0].as_slice().try_into().unwrap_or_default()),
                    Err(e) => {
                        println!("trident conformance: rank {}: {e}", place.rank);
                        return ExitCode::FAILURE;
                    }
                }
                println!(
                    "trident conformance: rank {} of a world of {} processes ({}), symmetric heap from {}",
                    place.rank,
                    place.size,
                    place.source,
                    w.provider()
                );
                processes = Some(Arc::new(w));
            }
            Err(e @ trident_core::backend::BackendError::NoDevice { .. }) => {
                println!("trident conformance: rank {} of {}: NVSHMEM world: skipped: {e}", place.rank, place.size);
                println!("[rank {}] conformance: 0 passed, 0 failed, {} skipped", place.rank, selected.len());
                return ExitCode::SUCCESS;
            }
            Err(e) => {
                println!("trident conformance: rank {} of {}: NVSHMEM world: {e}", place.rank, place.size);
                return ExitCode::FAILURE;
            }
        }
    }
    let backend = (desc.create)();
    let mut target = args.target.clone();
    // `amd` without an AMD GPU: every kernel's code object is compiled and checked
    // (`trident_backend_amd::metadata::check`), and the same SIMT program runs on `cpu-simt`
    // for the target; each line says which of the three parts ran.
    let mut amd: Option<Amd> = None;
    if desc.name == "amd" {
        let present = trident_gpu_runtime::discovery::amd_targets();
        let device = match backend.open_device(0) {
            Ok(_) => "device: not run (HIP device runs are not wired into the suite yet)".to_string(),
            Err(e) => {
                println!("trident conformance: amd device: {e}");
                if present.is_empty() {
                    "device: not run (no AMD GPU)".to_string()
                } else {
                    format!("device: not run ({} present, no HIP runtime)", present.join(", "))
                }
            }
        };
        let name = desc.resolve_target(args.target.as_deref()).unwrap_or("gfx942");
        let Ok(t) = trident_core::target::lookup(name) else { return usage(format!("unknown target {name}")) };
        target = Some(name.to_string());
        amd = Some(Amd { target: t, device });
    } else if let Err(e @ trident_core::backend::BackendError::NoDevice { .. }) = backend.open_device(0) {
        // A backend whose driver or device is absent skips every case, visibly.
        println!("trident conformance: backend {}: skipped: {e}", desc.name);
        println!("conformance: 0 passed, 0 failed, {} skipped", selected.len());
        return ExitCode::SUCCESS;
    }
    let mut world = processes
        .clone()
        .map(|world| crate::distributed::WorldKind::Processes { world, plant_dead: args.plant_dead_rank });
    if args.peer {
        let sizes: std::collections::BTreeSet<usize> =
            selected.iter().filter(|(_, c)| c.distributed).map(|(_, c)| c.world).collect();
        for w in sizes {
            match trident_backend_nvidia::world::GpuWorld::peer_devices(w) {
                Ok(g) if g == w => println!("trident conformance: peer world of {w} ranks: one per GPU (0..{g})"),
                Ok(g) => println!(
                    "trident conformance: peer world of {w} ranks on {g} GPU(s): ranks share GPUs (loopback), not a peer run"
                ),
                Err(e) => println!("trident conformance: peer world of {w} ranks: {e}"),
            }
        }
        world = Some(crate::distributed::WorldKind::Gpu { peer: true });
    }
    if desc.name == "nvidia" && processes.is_none() {
        // A world this GPU cannot hold (more streams than hardware queues) is refused once, at
        // once, before any case runs.
        let sizes: std::collections::BTreeSet<usize> =
            selected.iter().filter(|(_, c)| c.distributed && c.world > 1).map(|(_, c)| c.world).collect();
        for w in sizes {
            let opts = trident_backend_nvidia::world::GpuWorldOptions::new(w);
            if let Err(e) = trident_backend_nvidia::world::GpuWorld::check(&opts, args.peer) {
                let kind = if args.peer { "peer" } else { "loopback" };
                println!("trident conformance: the {kind} world of {w} ranks is refused: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let calls = match (args.replay, args.rearm) {
        (Some(n), _) => crate::distributed::Calls::Replayed(n),
        (None, true) => crate::distributed::Calls::Rearmed(2),
        (None, false) => crate::distributed::Calls::Direct(2),
    };
    // One case: its record and, on `amd`, its code objects (checked, failed).
    let run_one = |case: &Case, index: usize| -> (Record, (usize, usize)) {
        let config = |backend, compile_check| RunConfig {
            backend,
            target: target.clone(),
            schedules: args.chaos,
            race: args.race,
            compile_check,
            world: world.clone(),
            inter_node: args.inter_node,
            calls,
        };
        match &amd {
            Some(a) => {
                let (checked, counts) = a.backend();
                let r = run_case(case, index, seed, &config(&checked, Some(checked.check.clone())));
                let n = *counts.lock().unwrap_or_else(|e| e.into_inner());
                (r, n)
            }
            None => (run_case(case, index, seed, &config(backend.as_ref(), None)), (0, 0)),
        }
    };
    // In a world of processes every rank judges every case; rank 0 prints the table, the others
    // their failures and their summary.
    let quiet = place.as_ref().is_some_and(|p| p.rank != 0);
    let tag = place.as_ref().map(|p| format!("[rank {}] ", p.rank)).unwrap_or_default();
    if !quiet {
        println!(
        "trident conformance: backend {}, {} cases, {} schedule(s) per distributed case{}{}, seed {seed:#x} (replay with --seed {seed:#x})",
        desc.name,
        selected.len(),
        args.chaos,
        if args.race { ", race detector on" } else { "" },
        if args.inter_node { ", communication at inter-node scope" } else { "" }
    );
        println!(
            "{:<12} {:<8} {:<5} {:<14} {:>5} {:>10} {:>8} {:>9}  result",
            "kernel", "variant", "dtype", "shape", "world", "error", "bound", "time ms"
        );
    }
    let mut records: Vec<Record> = Vec::new();
    let progress = crate::progress::Progress::new(selected.len(), "cases");
    let mut report = |case: &Case, mut r: Record, (compiled, failed): (usize, usize)| {
        let err = r.error.map(|e| format!("{e:.2e}")).unwrap_or_else(|| "-".into());
        let mut verdict = match (r.pass, r.skipped, r.schedules) {
            (_, true, _) => format!("skipped: {}", r.message),
            (true, _, 1) => "ok".to_string(),
            (true, _, n) => format!("ok ({n} schedules)"),
            (false, _, n) => format!("FAIL ({} of {n} schedules): {}", r.failed_schedules, r.message),
        };
        if let Some(a) = &amd {
            let code = if failed > 0 {
                format!("code objects: {failed} FAILED")
            } else if compiled > 0 {
                format!("compiled+checked ({compiled} kernel{})", if compiled == 1 { "" } else { "s" })
            } else {
                "compiled+checked (kernels cached by the case's world)".to_string()
            };
            let run = if r.pass {
                "pass"
            } else if r.skipped {
                "skipped"
            } else {
                "FAIL"
            };
            verdict = format!(
                "{code} | cpu-simt[{}] {run} | {}{}",
                a.target.name,
                a.device,
                if r.pass { String::new() } else { format!(" | {}", r.message) }
            );
            r.backend = "amd".into();
        }
        if !(quiet && r.pass) {
            progress.line(|| {
                println!(
                    "{tag}{:<12} {:<8} {:<5} {:<14} {:>5} {:>10} {:>8.0e} {:>9.2}  {verdict}",
                    r.kernel,
                    r.variant,
                    r.dtype,
                    case.shape_text(),
                    r.world,
                    err,
                    r.bound,
                    r.time_ms
                );
                let _ = std::io::stdout().flush();
            });
        }
        progress.step(&format!("{} {} world {}", r.kernel, r.dtype, r.world));
        records.push(r);
    };
    if jobs <= 1 {
        for (index, case) in &selected {
            let (r, counts) = run_one(case, *index);
            report(case, r, counts);
        }
    } else {
        // Workers take the next case; results are reported in the suite's order as they come.
        let next = std::sync::atomic::AtomicUsize::new(0);
        let (send, receive) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            for _ in 0..jobs.min(selected.len()) {
                let (send, next, selected, run_one) = (send.clone(), &next, &selected, &run_one);
                let worker = std::thread::Builder::new().stack_size(WORKER_STACK_BYTES).spawn_scoped(s, move || loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((index, case)) = selected.get(i) else { break };
                    if send.send((i, run_one(case, *index))).is_err() {
                        break;
                    }
                });
                if let Err(e) = worker {
                    println!("trident conformance: starting a worker thread: {e}");
                }
            }
            drop(send);
            let (mut done, mut reported) = (std::collections::BTreeMap::new(), 0);
            for (i, result) in receive {
                done.insert(i, result);
                while let Some((r, counts)) = done.remove(&reported) {
                    report(&selected[reported].1, r, counts);
                    reported += 1;
                }
            }
        });
    }
    drop(progress);
    if let Some(path) = args.json.as_ref().filter(|_| !quiet) {
        let text = serde_json::to_string_pretty(&records).unwrap_or_default();
        if let Err(e) = std::fs::write(path, text + "\n") {
            eprintln!("error: writing {}: {e}", path.display());
            return ExitCode::from(2);
        }
        println!("wrote {} records to {}", records.len(), path.display());
    }
    if let Some(w) = processes {
        // Every rank judged every rank's output; the world ends together (bounded).
        match Arc::try_unwrap(w) {
            Ok(w) => {
                if let Err(e) = w.finish() {
                    println!("trident conformance: ending the NVSHMEM world: {e}");
                    return ExitCode::FAILURE;
                }
            }
            Err(_) => println!("trident conformance: the NVSHMEM world is still in use; left to the process's exit"),
        }
    }
    let skipped = records.iter().filter(|r| r.skipped).count();
    let failed = records.iter().filter(|r| !r.pass && !r.skipped).count();
    let what = match &amd {
        Some(a) => format!(" (code objects compiled and checked, and cpu-simt[{}]; no device run)", a.target.name),
        None => String::new(),
    };
    println!(
        "{tag}conformance: {} passed{what}, {} failed, {} skipped",
        records.len() - failed - skipped,
        failed,
        skipped
    );
    if failed > 0 {
        println!("replay the failures with --seed {seed:#x}");
        // A device that stuck work left unusable: the driver's exit handlers would wait for it.
        trident_gpu_runtime::health::exit_if_wedged(1);
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
