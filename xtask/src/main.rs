//! `cargo xtask`: the project's entry points. The commands users run are subcommands of the one
//! `trident` binary (the `cli` crate): `cargo xtask test` runs `trident test` (release build)
//! with the unit tests and the differential test around it, and `emit`, `run`, `ops`, `math`,
//! `bench`, `launch`, `demo` and `nvshmem-shim` forward to `trident` of the same name.
//!
//! * `cargo xtask test [--backend cpu] [--kernel K] [--dtype D] [--seed S] [--json FILE]`:
//!   checks the options, then unit tests of the workspace, the conformance suite (release
//!   build) and the differential test of every op x element type (`trident ops`, which also
//!   checks the support matrix `docs/SUPPORT.md`) on the backend.
//!   With `--backend nvidia` the distributed cases also run in the NVSHMEM world of processes
//!   (`trident launch -n 2`, or `-n W` with `--world W`); `--peer` runs them in the peer world
//!   (a rank per GPU) instead of the loopback world.
//! * `cargo xtask test --list-backends`: the backends the conformance runner links.
//! * `cargo xtask demo`: a GEMM through the whole path (build, verify, print, run, check).
//! * `cargo xtask ci`: format check, clippy with warnings as errors, `test`, then the
//!   distributed cases at world 4 under 4 schedules each and at world 2 under the race detector,
//!   every collective recorded once and replayed 4 times (world 4) and re-armed
//!   after a planted timeout (worlds 1-3)
//!   (on the tile interpreter and on cpu-simt's sm_90a lowering),
//!   the SIMT lowering on `cpu-simt` at warp 32 and 64 (suite and differential test), its
//!   elementary functions against the host's bit for bit, and `ptx-check` when ptxas is present.
//! * `cargo xtask emit --backend nvidia --target sm_90 (--kernel NAME | --file K.tile) [--time]`:
//!   a kernel's code.
//! * `cargo xtask run K.tile --grid X[,Y,Z] --arg NAME=VALUE ..`: runs a `.tile` kernel and
//!   writes the buffers it wrote as `.npy` (`trident run --help`).
//! * `cargo xtask ops [--backend B] [--op NAME] [--bless]`: the differential test alone.
//! * `cargo xtask math [--stride N] [--backend B]`: accuracy of the elementary functions.
//! * `cargo xtask bundle`: release binaries for the GPU machine in `bundle/`.
//! * `cargo xtask nvshmem-shim [--bc FILE] [--arch sm_90] [--out FILE]`: the NVSHMEM device shim
//!   (LLVM 18+ and NVSHMEM's bitcode needed), to carry to a GPU machine without LLVM.
//! * `cargo xtask ptx-check`: every compiled kernel's PTX through ptxas for sm_80/sm_90/sm_90a.

use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use trident_core::target::{reference_set, registered, Vendor};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "trident's build, test and demo entry points")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Clone, Default)]
struct TestArgs {
    /// Backend the conformance suite runs on.
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// Only kernels whose name contains this.
    #[arg(long)]
    kernel: Option<String>,
    /// Only this element type.
    #[arg(long)]
    dtype: Option<String>,
    /// Only cases at this world size.
    #[arg(long)]
    world: Option<String>,
    /// Only cases at worlds of at most this many ranks.
    #[arg(long)]
    max_world: Option<String>,
    /// Backend target (e.g. `gfx942` for `cpu-simt`, `sm_90` for `nvidia`).
    #[arg(long)]
    target: Option<String>,
    /// Run every distributed case under N schedules.
    #[arg(long)]
    chaos: Option<String>,
    /// Run distributed cases under the race detector.
    #[arg(long)]
    race: bool,
    /// Record one call of every distributed case and replay it N times (`trident test --replay`).
    #[arg(long)]
    replay: Option<String>,
    /// Plant a timeout in every distributed case, re-arm, check two more calls
    /// (`trident test --rearm`).
    #[arg(long)]
    rearm: bool,
    /// Replay the inputs of an earlier run.
    #[arg(long)]
    seed: Option<String>,
    /// JSON report path (default: target/conformance-<backend>.json).
    #[arg(long)]
    json: Option<PathBuf>,
    /// List the registered backends and exit.
    #[arg(long)]
    list_backends: bool,
    /// Skip the workspace unit tests; run the conformance suite only.
    #[arg(long)]
    no_unit: bool,
    /// Only ops whose name contains this in the differential test (`exp`, `cast`, `atomic`).
    #[arg(long)]
    op: Option<String>,
    /// Skip the differential test of every op.
    #[arg(long)]
    no_ops: bool,
    /// Distributed cases only, every kernel's communication at inter-node scope (cpu-simt, or
    /// nvidia's NVSHMEM world).
    #[arg(long)]
    inter_node: bool,
    /// nvidia: the distributed cases in the peer world (one process, a rank per GPU) instead
    /// of the loopback world.
    #[arg(long)]
    peer: bool,
}

#[derive(Subcommand)]
enum Cmd {
    /// Unit tests, then the conformance suite.
    Test(TestArgs),
    /// Build, verify, print, run and check a GEMM.
    Demo,
    /// fmt check, clippy -D warnings, then test.
    Ci(TestArgs),
    /// Release binaries for the GPU machine in `bundle/` (run them with scripts/gpu-check.sh).
    Bundle {
        /// Also the Python package's wheel in `bundle/wheels/` (maturin, from `$MATURIN` or
        /// `python3 -m maturin`), for the scripts that run pytest with torch there.
        #[arg(long)]
        wheel: bool,
    },
    /// Assembles the PTX of every kernel the NVIDIA backend compiles, for sm_80, sm_90 and
    /// sm_90a, with `ptxas` (from `$PTXAS` or the PATH).
    PtxCheck,
    /// Time the library's kernels on the GPU against a baseline measured in the same run
    /// (`--baseline FILE` from bench/baseline.py; `--json OUT`); skips without a CUDA driver.
    /// One process per rank: `cargo xtask launch -n N -- PROGRAM ARGS` (`trident launch`).
    #[command(disable_help_flag = true)]
    Launch {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// `cargo xtask bench compare A.json B.json` puts two reports side by side.
    #[command(disable_help_flag = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Print a kernel's code for a backend (`--backend nvidia --target sm_90 --kernel NAME` or
    /// `--file K.tile`; `--help` lists every option).
    #[command(disable_help_flag = true)]
    Emit {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run a `.tile` kernel: `K.tile --grid X[,Y,Z] --arg NAME=VALUE ..` (`--help` lists every
    /// option).
    #[command(disable_help_flag = true)]
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Makes the NVSHMEM device shim from NVSHMEM's bitcode with LLVM 18+ (`--bc FILE`,
    /// `--arch sm_90`, `--out FILE`; default: the cache the runtime reads), to carry to a GPU
    /// machine without LLVM.
    #[command(name = "nvshmem-shim", disable_help_flag = true)]
    NvshmemShim {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The differential test of every op x element type, and the support matrix (`--bless`
    /// rewrites it; `--help` lists every option).
    #[command(disable_help_flag = true)]
    Ops {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Accuracy of the elementary functions over the f32 inputs (`--stride N`, `--backend B`;
    /// `--help` lists every option).
    #[command(disable_help_flag = true)]
    Math {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(workspace_root());
    c
}

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().map(PathBuf::from).unwrap_or_default()
}

/// Why a step failed: the message, and whether it was a usage error (exit code 2).
struct Failure {
    message: String,
    usage: bool,
}

impl From<String> for Failure {
    fn from(message: String) -> Failure {
        Failure { message, usage: false }
    }
}

/// Runs a command, echoing it; a child's usage error (exit code 2) stays one.
fn run(mut cmd: Command) -> Result<(), Failure> {
    let shown = format!("{cmd:?}").replace('"', "");
    eprintln!("xtask: {shown}");
    let started = std::time::Instant::now();
    let status = cmd.status().map_err(|e| format!("could not start {shown}: {e}"))?;
    // Each step's time, so that CI's budget (20 minutes on 2 cores) can be read from its log.
    eprintln!("xtask: ({:.0} s)", started.elapsed().as_secs_f64());
    if status.success() {
        Ok(())
    } else {
        Err(Failure { message: format!("`{shown}` failed ({status})"), usage: status.code() == Some(2) })
    }
}

/// `cargo run --release` of `trident SUBCOMMAND` in the caller's directory, so that the paths a
/// user gives (`.tile` files, `.npy` inputs, `--out`) mean what they say.
fn tool_here(subcommand: &str, args: &[String]) -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    let manifest = workspace_root().join("Cargo.toml");
    c.args(["run", "--quiet", "--release", "--manifest-path"]).arg(manifest);
    c.args(["-p", "trident-cli", "--bin", "trident", "--", subcommand]);
    c.args(args);
    c
}

/// `cargo run --release` of `trident SUBCOMMAND` with `args`.
fn tool(subcommand: &str, args: &[String]) -> Command {
    let mut c = cargo();
    c.args(["run", "--quiet", "--release", "-p", "trident-cli", "--bin", "trident", "--", subcommand]);
    c.args(args);
    c
}

fn conformance(args: &TestArgs) -> Command {
    let mut c = tool("test", &[]);
    c.args(["--backend", &args.backend]);
    if args.race {
        c.arg("--race");
    }
    if args.rearm {
        c.arg("--rearm");
    }
    if args.peer {
        c.arg("--peer");
    }
    // On nvidia the inter-node path is the NVSHMEM world's (`processes`).
    if args.inter_node && args.backend != "nvidia" {
        c.arg("--inter-node");
    }
    for (flag, v) in [
        ("--kernel", &args.kernel),
        ("--dtype", &args.dtype),
        ("--seed", &args.seed),
        ("--world", &args.world),
        ("--max-world", &args.max_world),
        ("--target", &args.target),
        ("--chaos", &args.chaos),
        ("--replay", &args.replay),
    ] {
        if let Some(v) = v {
            c.args([flag, v.as_str()]);
        }
    }
    let json =
        args.json.clone().unwrap_or_else(|| workspace_root().join(format!("target/conformance-{}.json", args.backend)));
    c.arg("--json").arg(json);
    c
}

/// The differential test of every op on the test's backend (not for the distributed modes).
fn ops(args: &TestArgs) -> Option<Command> {
    if args.no_ops
        || args.world.is_some()
        || args.chaos.is_some()
        || args.race
        || args.inter_node
        || args.replay.is_some()
        || args.rearm
    {
        return None;
    }
    let mut a = vec!["--backend".to_string(), args.backend.clone()];
    for (flag, v) in [("--target", &args.target), ("--seed", &args.seed), ("--op", &args.op), ("--dtype", &args.dtype)]
    {
        if let Some(v) = v {
            a.extend([flag.to_string(), v.clone()]);
        }
    }
    let target = args.target.as_deref().map(|t| format!("-{t}")).unwrap_or_default();
    a.extend([
        "--json".into(),
        workspace_root().join(format!("target/ops-{}{target}.json", args.backend)).display().to_string(),
    ]);
    Some(tool("ops", &a))
}

fn test(args: &TestArgs) -> Result<(), Failure> {
    if args.list_backends {
        let mut c = conformance(args);
        c.arg("--list-backends");
        return run(c);
    }
    // Every option is checked before any work (an unknown backend, a world the backends do
    // not take, an unwritable report path).
    let mut check = conformance(args);
    check.arg("--check");
    run(check)?;
    if let Some(mut c) = ops(args) {
        c.arg("--check-args");
        run(c)?;
    }
    if !args.no_unit {
        // In the release profile, as the conformance runs: one build of the workspace instead
        // of two (the debug one cost CI's 2 cores minutes), and the CPU world's benchmark tests
        // run in seconds. The workspace has one `debug_assert!`; `cargo test` alone still
        // builds the debug profile.
        let mut c = cargo();
        c.args(["test", "--release", "--workspace", "--quiet"]);
        run(c)?;
    }
    if !(args.backend == "nvidia" && args.inter_node) {
        run(conformance(args))?;
    }
    if args.backend == "nvidia" && !args.race && args.chaos.is_none() && args.replay.is_none() && !args.rearm {
        run(processes(args, args.world.as_deref().unwrap_or("2")))?;
    }
    match ops(args) {
        Some(c) => run(c),
        None => Ok(()),
    }
}

/// The distributed cases in the NVSHMEM world of `ranks` processes (`trident launch`), one
/// rank per process; a visible skip on every rank without CUDA, a GPU or NVSHMEM.
fn processes(args: &TestArgs, ranks: &str) -> Command {
    let mut build = cargo();
    build.args(["build", "--quiet", "--release", "-p", "trident-cli"]);
    // The build's failure shows in the launch that follows (no binaries).
    let _ = build.status();
    let bin = workspace_root().join("target/release");
    let mut c = Command::new(bin.join("trident"));
    c.args(["launch", "-n", ranks, "--"]).arg(bin.join("trident"));
    c.args(["test", "--backend", "nvidia", "--processes"]);
    if args.inter_node {
        c.arg("--inter-node");
    }
    for (flag, v) in
        [("--kernel", &args.kernel), ("--dtype", &args.dtype), ("--seed", &args.seed), ("--target", &args.target)]
    {
        if let Some(v) = v {
            c.args([flag, v.as_str()]);
        }
    }
    c.arg("--json").arg(workspace_root().join(format!("target/conformance-nvshmem-world{ranks}.json")));
    c
}

/// The `ptxas` to use: `$PTXAS`, else the one on the PATH.
fn ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PTXAS") {
        return Some(PathBuf::from(p));
    }
    let ok = Command::new("ptxas").arg("--version").output().map(|o| o.status.success()).unwrap_or(false);
    ok.then(|| PathBuf::from("ptxas"))
}

fn ptx_check() -> Result<(), Failure> {
    let Some(ptxas) = ptxas() else {
        return Err(
            String::from("ptxas not found: set PTXAS (the PyPI wheel nvidia-cuda-nvcc==13.0.88 ships it)").into()
        );
    };
    let root = workspace_root();
    let mut jobs: Vec<(String, PathBuf)> = Vec::new();
    let nvidia = registered().into_iter().filter(|t| t.vendor == Vendor::Nvidia);
    for t in nvidia {
        // The catalogue's kernels, and (for the reference set) every case of the differential
        // test in every layout.
        let target = t.name;
        let dir = root.join("target/ptx").join(target);
        let _ = std::fs::remove_dir_all(&dir);
        let base = ["--backend", "nvidia", "--target", target].map(String::from);
        let mut a = base.to_vec();
        a.extend(["--all-to".to_string(), dir.display().to_string()]);
        run(tool("emit", &a))?;
        if t.reference {
            let mut a = base.to_vec();
            a.extend(["--emit".to_string(), dir.join("ops").display().to_string()]);
            run(tool("ops", &a))?;
        }
        for d in [dir.clone(), dir.join("ops")] {
            let Ok(entries) = std::fs::read_dir(&d) else { continue };
            jobs.extend(
                entries
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "ptx"))
                    .map(|p| (target.to_string(), p)),
            );
        }
    }
    jobs.sort();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let workers = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let errors: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| {
                    let mut errs = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((target, f)) = jobs.get(i) else { break };
                        // Inter-node kernels call NVSHMEM's device functions, defined by the shim the
                        // runtime links in: assembled as relocatable code.
                        let relocatable = f.to_string_lossy().contains("_inter_node");
                        match Command::new(&ptxas)
                            .arg(format!("-arch={target}"))
                            .args(relocatable.then_some("-c"))
                            .arg(f)
                            .arg("-o")
                            .arg(f.with_extension("cubin"))
                            .output()
                        {
                            Ok(o) if o.status.success() => {}
                            Ok(o) => errs.push(format!(
                                "ptxas -arch={target} rejected {}:\n{}",
                                f.display(),
                                String::from_utf8_lossy(&o.stderr)
                            )),
                            Err(e) => errs.push(format!("running {}: {e}", ptxas.display())),
                        }
                    }
                    errs
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
    });
    if let Some(e) = errors.first() {
        return Err(format!("{} of {} PTX modules rejected; the first: {e}", errors.len(), jobs.len()).into());
    }
    eprintln!("xtask: ptxas assembled {} PTX modules (the catalogue for sm_80, sm_90, sm_90a, its communicating kernels also at inter-node scope, its bf16 kernels also traced; every op case for sm_80 and sm_90a)", jobs.len());
    gemm_forms_check(&ptxas, &root)
}

/// The sm_90a GEMM in the forms the library and the benchmark run (tiles x TMA, producer warp,
/// persistent, TMA store x bf16/f16) through `ptxas -v`: no spills, and no warning (C7518 and
/// its kind: `wgmma` serialized by ptxas, which costs a tenth of the GEMM's speed).
fn gemm_forms_check(ptxas: &Path, root: &Path) -> Result<(), Failure> {
    let dir = root.join("target/ptx/sm_90a-gemm-forms");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let forms: [&[&str]; 5] = [
        &[],
        &["--descriptors", "--tma-store"],
        &["--descriptors", "--warp-specialize"],
        &["--descriptors", "--persistent", "--tma-store"],
        &["--descriptors", "--warp-specialize", "--persistent", "--tma-store"],
    ];
    // AG-GEMM as the library runs it on sm_90a: one program per tile, or persistent (with the
    // copy engine gathering), its waits before each tile's first copies.
    let ag_forms: [&[&str]; 2] = [&["--descriptors", "--tma-store"], &["--descriptors", "--persistent", "--tma-store"]];
    let mut cases = Vec::new();
    for config in ["128x256x64/8w/4s", "128x128x64/8w/5s", "64x128x128/4w/4s"] {
        cases.extend(forms.iter().map(|f| ("gemm", config, *f)));
    }
    cases.extend(ag_forms.iter().map(|f| ("ag_gemm", "128x256x64/8w/4s", *f)));
    let mut checked = 0;
    for (kernel, config, form) in cases {
        for dtype in ["bf16", "f16"] {
            let mut a: Vec<String> =
                ["--backend", "nvidia", "--target", "sm_90a", "--kernel", kernel].map(String::from).to_vec();
            a.extend(["--dtype", dtype, "--config", config].map(String::from));
            a.extend(form.iter().map(|f| f.to_string()));
            let out = tool("emit", &a).output().map_err(|e| format!("trident emit: {e}"))?;
            if !out.status.success() {
                return Err(format!("trident emit {}: {}", a.join(" "), String::from_utf8_lossy(&out.stderr)).into());
            }
            let name = format!("{kernel}_{dtype}_{}{}", config.replace('/', "_"), form.join("").replace("--", "_"));
            let f = dir.join(format!("{name}.ptx"));
            std::fs::write(&f, &out.stdout).map_err(|e| format!("{}: {e}", f.display()))?;
            let o = Command::new(ptxas)
                .args(["-arch=sm_90a", "-v"])
                .arg(&f)
                .arg("-o")
                .arg(f.with_extension("cubin"))
                .output()
                .map_err(|e| format!("running {}: {e}", ptxas.display()))?;
            let log = String::from_utf8_lossy(&o.stderr);
            let spills = log.lines().any(|l| l.contains("spill stores") && !l.contains(" 0 bytes spill stores"));
            if !o.status.success() || spills || log.contains("warning") {
                return Err(format!("ptxas -v on `{}`: spills or warnings:\n{log}", a.join(" ")).into());
            }
            checked += 1;
        }
    }
    eprintln!("xtask: the sm_90a GEMM and AG-GEMM in {checked} forms assembled without spills or ptxas warnings");
    Ok(())
}

/// trident's cache directory (as `trident_core::backend::cache_dir` finds it).
fn trident_cache_dir() -> PathBuf {
    std::env::var_os("TRIDENT_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/trident")))
        .unwrap_or_else(std::env::temp_dir)
}

/// Builds the release binaries and copies them with the commit id into `bundle/` (and with
/// `wheel`, the Python package's wheel into `bundle/wheels/`).
fn bundle(wheel: bool) -> Result<(), Failure> {
    let mut c = cargo();
    c.args(["build", "--release", "-p", "trident-cli"]);
    run(c)?;
    let root = workspace_root();
    let dir = root.join("bundle");
    // A bundle holds the one binary (and the cache below); binaries of older bundles go.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let from = root.join("target/release/trident");
    std::fs::copy(&from, dir.join("trident")).map_err(|e| format!("copying {}: {e}", from.display()))?;
    // NVSHMEM device shims made here (`cargo xtask nvshmem-shim`): the GPU machine has no LLVM.
    let shims = trident_cache_dir().join("nvshmem-shim");
    if shims.is_dir() {
        let to = dir.join("cache/nvshmem-shim");
        let mut c = Command::new("cp");
        c.arg("-r").arg(&shims).arg(dir.join("cache"));
        let _ = std::fs::remove_dir_all(&to);
        std::fs::create_dir_all(dir.join("cache")).map_err(|e| e.to_string())?;
        run(c)?;
    }
    let commit = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(&root)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let dirty = Command::new("git")
        .args(["status", "--porcelain"])
        .current_dir(&root)
        .output()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false);
    let stamp = if dirty { format!("{commit}+uncommitted") } else { commit };
    std::fs::write(dir.join("COMMIT"), stamp + "\n").map_err(|e| e.to_string())?;
    if wheel {
        // The abi3 wheel (any CPython from 3.9) for the GPU machine's torch environment,
        // tagged plain `linux` since it is built here, not in a manylinux container.
        let mut c = match std::env::var_os("MATURIN") {
            Some(m) => Command::new(m),
            None => {
                let mut c = Command::new("python3");
                c.args(["-m", "maturin"]);
                c
            }
        };
        c.args(["build", "--release", "--compatibility", "linux", "-m"])
            .arg(root.join("python/Cargo.toml"))
            .arg("--out")
            .arg(dir.join("wheels"));
        run(c).map_err(|e| Failure {
            message: format!(
                "{} (the wheel needs maturin: `python3 -m pip install maturin`, or set MATURIN)",
                e.message
            ),
            usage: false,
        })?;
    }
    eprintln!(
        "xtask: bundle ready in {} (run scripts/gpu-check.sh on the GPU machine, carrying `bundle`)",
        dir.display()
    );
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.cmd {
        Cmd::Test(a) => test(a),
        Cmd::Demo => run(tool("demo", &[])),
        Cmd::Bundle { wheel } => bundle(*wheel),
        Cmd::PtxCheck => ptx_check(),
        Cmd::Bench { args } => run(tool("bench", args)),
        Cmd::Launch { args } => run(tool("launch", args)),
        Cmd::Emit { args } => run(tool_here("emit", args)),
        Cmd::Run { args } => run(tool_here("run", args)),
        Cmd::Ops { args } => run(tool("ops", args)),
        Cmd::NvshmemShim { args } => run(tool_here("nvshmem-shim", args)),
        Cmd::Math { args } => run(tool("math", args)),
        Cmd::Ci(a) => {
            let mut fmt = cargo();
            fmt.args(["fmt", "--all", "--check"]);
            let mut clippy = cargo();
            clippy.args(["clippy", "--workspace", "--all-targets", "--quiet", "--", "-D", "warnings"]);
            // After the full suite: every distributed kernel at world 4 under several schedules
            // (4: CI took 1223 s of its 1200 s target with 6 at c30c220), and at world 2 under
            // the race detector.
            let chaos = TestArgs {
                world: Some("4".into()),
                chaos: Some("4".into()),
                no_unit: true,
                json: Some(workspace_root().join("target/conformance-cpu-chaos.json")),
                ..a.clone()
            };
            // The inter-node and race passes of the SIMT lowering run on the NVIDIA target with
            // the architecture-specific features (`wgmma`, TMA: the widest lowering).
            let hopper = registered()
                .into_iter()
                .find(|t| t.vendor == Vendor::Nvidia && t.arch_specific && t.reference)
                .map_or("sm_90a", |t| t.name);
            // The SIMT lowering executed on the host at both warp sizes, every target to world 3,
            // the first odd world (a kernel's code is the same at more ranks; their world-8 cases
            // cost about 300 s of CI's 2 cores and sm_90a's worlds 4-8 about 160 s, and the
            // interpreter at every world with chaos and the GPU's loopback worlds 2/4/8 run
            // them; CI took 1219-1311 s of its 1200 s target with sm_90a at every world at
            // 071fa29, 1223 s with it to world 4 at c30c220).
            let simt = |target: &str| TestArgs {
                backend: "cpu-simt".into(),
                target: Some(target.into()),
                max_world: Some("3".into()),
                no_unit: true,
                json: Some(workspace_root().join(format!("target/conformance-cpu-simt-{target}.json"))),
                ..a.clone()
            };
            // The newest AMD target to world 3, the others to world 1: the code objects do not
            // change with the world, and the wave-64 SIMT programs of a world run once, on the
            // newest target.
            let newest_amd = reference_set(Some(Vendor::Amd)).last().map_or("gfx942", |t| t.name);
            let amd = |target: &str| TestArgs {
                backend: "amd".into(),
                target: Some(target.into()),
                max_world: Some(if target == newest_amd { "3" } else { "1" }.into()),
                no_unit: true,
                json: Some(workspace_root().join(format!("target/conformance-amd-{target}.json"))),
                ..a.clone()
            };
            let race = TestArgs {
                world: Some("2".into()),
                race: true,
                no_unit: true,
                json: Some(workspace_root().join("target/conformance-cpu-race.json")),
                ..a.clone()
            };
            // Every collective recorded once and replayed 4 times at world 4 (each half of every
            // double buffer twice; the chaos pass hunts schedules), and re-armed after a planted
            // timeout at worlds 1 to 3.
            let replay = TestArgs {
                world: Some("4".into()),
                replay: Some("4".into()),
                no_unit: true,
                json: Some(workspace_root().join("target/conformance-cpu-replay.json")),
                ..a.clone()
            };
            // The planted timeout and re-arm to world 3, the first odd world: the same host and
            // device code at 4 and 8 ranks, whose cases the plain pass runs (CI took 1115-1217 s
            // of its 1200 s target with world 4 here at 662a915 and f59fb06).
            let rearm = TestArgs {
                rearm: true,
                max_world: Some("3".into()),
                no_unit: true,
                json: Some(workspace_root().join("target/conformance-cpu-rearm.json")),
                ..a.clone()
            };
            let ptx = || {
                if ptxas().is_some() {
                    ptx_check()
                } else {
                    eprintln!("xtask: skipped: PTX assembly check (no ptxas: set PTXAS; .ci/run installs it)");
                    Ok(())
                }
            };
            run(fmt)
                .and_then(|_| run(clippy))
                .and_then(|_| test(a))
                // Without a GPU this prints a visible "skipped: no CUDA driver" for every case.
                .and_then(|_| test(&TestArgs { backend: "nvidia".into(), no_unit: true, ..a.clone() }))
                .and_then(|_| test(&chaos))
                .and_then(|_| test(&race))
                .and_then(|_| test(&replay))
                .and_then(|_| test(&rearm))
                // The SIMT lowering for every target of the reference set. On the AMD targets
                // only the differential test of the ops: the AMD passes below run every
                // conformance case's SIMT program on cpu-simt for their target beside its code
                // object, so a cpu-simt conformance pass there ran every case twice (about 110 s
                // each of CI's 2 cores).
                .and_then(|_| {
                    reference_set(None).iter().try_for_each(|t| match t.vendor {
                        Vendor::Amd => ops(&simt(t.name)).map_or(Ok(()), run),
                        _ => test(&simt(t.name)),
                    })
                })
                // Every distributed kernel with its communication at inter-node scope: the
                // NVSHMEM device calls executed as the library defines them (to world 2: the
                // calls do not change with more ranks, and the odd world's peers run at
                // intra-node scope in the sm_90a pass).
                .and_then(|_| {
                    test(&TestArgs {
                        inter_node: true,
                        max_world: Some("2".into()),
                        json: Some(workspace_root().join("target/conformance-cpu-simt-inter-node.json")),
                        ..simt(hopper)
                    })
                })
                // The race detector over the lowered kernels (fenced signals, acquiring waits).
                .and_then(|_| {
                    test(&TestArgs {
                        world: Some("2".into()),
                        max_world: None,
                        race: true,
                        json: Some(workspace_root().join("target/conformance-cpu-simt-race.json")),
                        ..simt(hopper)
                    })
                })
                // Every kernel's AMD code object compiled (LLVM 19) and checked, its SIMT
                // program run on cpu-simt for the same target.
                .and_then(|_| reference_set(Some(Vendor::Amd)).iter().try_for_each(|t| test(&amd(t.name))))
                // Every op x type x layout of the differential test as a code object of the
                // newest AMD target, checked (the writer meets every instruction the lowering
                // emits).
                .and_then(|_| {
                    let newest = reference_set(Some(Vendor::Amd)).last().map_or("gfx942", |t| t.name);
                    let dir = workspace_root().join("target/ll").join(newest).join("ops");
                    let a = ["--backend", "amd", "--target", newest, "--emit"].map(String::from);
                    let mut a = a.to_vec();
                    a.push(dir.display().to_string());
                    run(tool("ops", &a))
                })
                // The elementary functions of the lowering bit-identical to the host's.
                .and_then(|_| {
                    let a = ["--stride", "65537", "--backend", "cpu-simt"].map(String::from);
                    run(tool("math", &a))
                })
                .and_then(|_| ptx())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {}", e.message);
            ExitCode::from(if e.usage { 2 } else { 1 })
        }
    }
}
