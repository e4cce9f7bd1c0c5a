//! The command line as a user meets it: usage errors exit 2 before any work, `trident --help`
//! lists every subcommand and each subcommand's `--help` its options, `.tile` files compile and
//! run.

use std::process::{Command, Output};

/// `trident SUBCOMMAND ARGS..` from the repository's root.
fn tool(subcommand: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trident"))
        .arg(subcommand)
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("the tool starts")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn usage_errors_exit_2_before_any_work() {
    for (bin, args) in [
        ("test", vec!["--backend", "rocm"]),
        ("test", vec!["--chaos", "0"]),
        ("test", vec!["--world", "65"]),
        ("test", vec!["--json", "/nonexistent/dir/report.json"]),
        ("test", vec!["--backend", "nvidia", "--race"]),
        ("test", vec!["--backend", "cpu", "--peer"]),
        ("test", vec!["--backend", "nvidia", "--peer", "--processes"]),
        ("emit", vec!["--kernel", "no_such_kernel"]),
        ("emit", vec!["--backend", "nvidia", "--target", "sm_42"]),
        ("emit", vec!["--file", "no/such.tile"]),
        ("ops", vec!["--backend", "rocm"]),
        ("ops", vec!["--op", "no_such_op"]),
        ("run", vec!["examples/gelu.tile", "--arg", "x=f32[8]"]),
        ("run", vec!["examples/gelu.tile", "--grid", "0"]),
        ("math", vec!["--stride", "0"]),
    ] {
        let o = tool(bin, &args);
        assert_eq!(o.status.code(), Some(2), "{bin} {args:?}: {}", text(&o));
        assert!(text(&o).contains("error"), "{bin} {args:?}: {}", text(&o));
    }
}

#[test]
fn trident_lists_its_subcommands() {
    let o = Command::new(env!("CARGO_BIN_EXE_trident")).arg("--help").output().expect("trident starts");
    let t = text(&o);
    for sub in ["run", "emit", "test", "bench", "ops", "math", "launch", "selftest", "demo", "nvshmem-shim"] {
        assert!(o.status.success() && t.contains(&format!("  {sub} ")), "trident --help lacks {sub}: {t}");
    }
    let o = Command::new(env!("CARGO_BIN_EXE_trident")).arg("no-such-command").output().expect("trident starts");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

#[test]
fn every_tool_lists_its_options() {
    for (bin, option) in [
        ("test", "--world"),
        ("emit", "--file"),
        ("run", "--arg"),
        ("ops", "--bless"),
        ("math", "--stride"),
        ("bench", "--world"),
        ("launch", "--bound-ms"),
        ("nvshmem-shim", "--bc"),
    ] {
        let o = tool(bin, &["--help"]);
        assert!(o.status.success() && text(&o).contains(option), "{bin} --help: {}", text(&o));
    }
}

#[test]
fn any_world_size_selects_the_distributed_cases() {
    for w in ["3", "6"] {
        let o = tool("test", &["--world", w, "--list"]);
        let t = text(&o);
        assert!(o.status.success() && t.lines().count() >= 27, "--world {w}: {t}");
        assert!(t.lines().all(|l| l.ends_with(&format!("world {w}"))), "{t}");
    }
}

#[test]
fn tile_files_compile_and_run() {
    let o = tool("emit", &["--backend", "nvidia", "--target", "sm_90a", "--file", "examples/gelu.tile"]);
    assert!(o.status.success() && text(&o).contains(".entry gelu"), "{}", text(&o));
    let dir = std::env::temp_dir().join(format!("trident-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let xs: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) / 97.0).collect();
    let xb: Vec<u8> = xs.iter().flat_map(|v| v.to_le_bytes()).collect();
    let x_path = dir.join("in.npy");
    std::fs::write(&x_path, trident_conformance::npy::write(trident_core::ir::DType::F32, &xb)).expect("write");
    let (d, xa) = (dir.display().to_string(), format!("x={}", x_path.display()));
    let o = tool(
        "run",
        &[
            "examples/gelu.tile",
            "--backend",
            "cpu-simt",
            "--grid",
            "4",
            "--arg",
            &xa,
            "--arg",
            "out=f32[1000]:zeros",
            "--arg",
            "n=1000",
            "--out",
            &d,
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    // The written buffer against GELU in f64.
    let out = std::fs::read(dir.join("out.npy")).expect("out.npy written");
    let y = trident_conformance::npy::read(trident_core::ir::DType::F32, &out).expect("a valid .npy");
    let y: Vec<f32> = y.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    assert!(!dir.join("x.npy").exists(), "an input the kernel did not write was written");
    for (x, y) in xs.iter().zip(&y) {
        let x = *x as f64;
        let want = x * (1.0 + trident_conformance::reference::erf(x / 2f64.sqrt())) / 2.0;
        assert!((*y as f64 - want).abs() <= 1e-6 * (1.0 + want.abs()), "gelu({x}) = {y}, want {want}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `trident run --world`: the ring AllGather of `examples/` in text form gathers every rank's
/// chunk on every rank, under chaos schedules, on the interpreter and on the SIMT lowering at
/// warp 32 and 64, over two calls on the same buffers; its copy with a planted missing acquire
/// fails under the race detector, naming the racing accesses.
#[test]
fn a_distributed_tile_kernel_runs_in_a_world_and_a_planted_race_is_named() {
    let dir = std::env::temp_dir().join(format!("trident-run-world-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let (w, chunk) = (4usize, 1500usize);
    let src = |r: usize| -> Vec<f32> { (0..chunk).map(|i| (r * 10_000 + i) as f32 / 7.0).collect() };
    for r in 0..w {
        let bytes: Vec<u8> = src(r).iter().flat_map(|v| v.to_le_bytes()).collect();
        let npy = trident_conformance::npy::write(trident_core::ir::DType::F32, &bytes);
        std::fs::write(dir.join(format!("src_{r}.npy")), npy).expect("write");
    }
    let src_arg = format!("src={}/src_{{rank}}.npy", dir.display());
    let (out_arg, ready_arg) = (format!("out=f32[{}]:zeros:symm", w * chunk), format!("ready=u64[{w}]:zeros:symm"));
    let want: Vec<f32> = (0..w).flat_map(src).collect();
    let backends: [&[&str]; 3] =
        [&["--backend", "cpu"], &["--backend", "cpu-simt"], &["--backend", "cpu-simt", "--target", "gfx942"]];
    for backend in backends {
        let out = dir.join(backend.join("_"));
        let out_dir = out.display().to_string();
        // Traced: the gathered bytes are the same, and every rank's waits are on the timeline.
        let trace = out.join("trace.json").display().to_string();
        let mut args = vec![
            "examples/allgather_ring.tile",
            "--world",
            "4",
            "--chaos",
            "8",
            "--repeat",
            "1",
            "--out",
            &out_dir,
            "--trace",
            &trace,
        ];
        args.extend(backend);
        args.extend([
            "--arg",
            &src_arg,
            "--arg",
            &out_arg,
            "--arg",
            &ready_arg,
            "--arg",
            "chunk=1500",
            "--arg",
            "epoch=call",
        ]);
        let o = tool("run", &args);
        assert!(o.status.success(), "{backend:?}: {}", text(&o));
        for r in 0..w {
            let bytes = std::fs::read(out.join(format!("rank{r}/out.npy"))).expect("every rank's out written");
            let got = trident_conformance::npy::read(trident_core::ir::DType::F32, &bytes).expect("a valid .npy");
            let got: Vec<f32> = got.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            assert_eq!(got, want, "{backend:?}: rank {r} gathered");
        }
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&trace).expect("the trace written")).expect("trace JSON");
        let events = json["traceEvents"].as_array().expect("trace events");
        for r in 0..w {
            // Two calls, one program each; W - 1 waits per call.
            let of =
                |name: &str| events.iter().filter(|e| e["pid"] == r && e["ph"] == "X" && e["name"] == name).count();
            assert_eq!(of("allgather_ring p0"), 2, "{backend:?} rank {r}");
            assert_eq!(of("wait %ready"), 2 * (w - 1), "{backend:?} rank {r}");
        }
        // Every wait ends after the notify that satisfied it: rank r's wait on `ready[c]` by
        // its predecessor's notify of `ready[c]`, the k-th wait by the k-th call's notify.
        let times = |rank: usize, ph: &str, name: &str, signal: u64, end: bool| -> Vec<f64> {
            let mut t: Vec<f64> = events
                .iter()
                .filter(|e| e["pid"] == rank && e["ph"] == ph && e["name"] == name && e["args"]["signal"] == signal)
                .map(|e| {
                    e["ts"].as_f64().unwrap_or(f64::NAN) + if end { e["dur"].as_f64().unwrap_or(0.0) } else { 0.0 }
                })
                .collect();
            t.sort_by(f64::total_cmp);
            t
        };
        for r in 0..w {
            for c in (0..w as u64).filter(|&c| c != r as u64) {
                let waits = times(r, "X", "wait %ready", c, true);
                let notifies = times((r + w - 1) % w, "i", "notify %ready", c, false);
                assert_eq!((waits.len(), notifies.len()), (2, 2), "{backend:?} rank {r} ready[{c}]");
                for (end, at) in waits.iter().zip(&notifies) {
                    assert!(
                        end >= at,
                        "{backend:?}: rank {r}'s wait on ready[{c}] ended at {end} us, notified at {at} us"
                    );
                }
            }
        }
        if let Err(e) = trace_schema_check(&json) {
            panic!("{backend:?}: the trace against docs/trace-event.schema.json: {e}");
        }
        assert!(out.join("trace.svg").exists(), "{backend:?}");
    }
    let out_dir = dir.join("planted").display().to_string();
    let o = tool(
        "run",
        &[
            "examples/allgather_ring_missing_acquire.tile",
            "--world",
            "3",
            "--race",
            "--out",
            &out_dir,
            "--arg",
            "src=f32[1500]",
            "--arg",
            "out=f32[4500]:zeros:symm",
            "--arg",
            "ready=u64[3]:zeros:symm",
            "--arg",
            "chunk=1500",
            "--arg",
            "epoch=call",
        ],
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("data race on `out`") && t.contains("unordered by any release/acquire"), "{t}");
    // Usage errors: a symmetric buffer without a world, chaos on a GPU backend.
    let o = tool("run", &["examples/gelu.tile", "--arg", "x=f32[8]:symm", "--arg", "out=f32[8]", "--arg", "n=8"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `docs/CLI.md`, the command reference, is every subcommand's `--help` as the binary prints it:
/// this test fails when they differ, and `TRIDENT_BLESS=1` rewrites it.
#[test]
fn the_command_reference_is_the_binarys_help() {
    let top = tool("--help", &[]);
    let top_text = String::from_utf8_lossy(&top.stdout).into_owned();
    let subcommands: Vec<String> = top_text
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|s| s != "help")
        .collect();
    assert!(subcommands.len() >= 10, "{top_text}");
    let mut doc = String::from(
        "# trident command reference\n\n\
         Every subcommand of `trident` with its options, as `trident SUBCOMMAND --help` prints them\n\
         (`cargo xtask SUBCOMMAND` forwards to it). Generated: `TRIDENT_BLESS=1 cargo test -p\n\
         trident-cli --test cli` rewrites this file, and that test fails when it is out of date.\n\n\
         ## trident\n\n```text\n",
    );
    doc += top_text.trim_end();
    doc += "\n```\n";
    for s in &subcommands {
        let o = tool(s, &["--help"]);
        assert!(o.status.success(), "trident {s} --help: {}", text(&o));
        doc += &format!("\n## trident {s}\n\n```text\n{}\n```\n", String::from_utf8_lossy(&o.stdout).trim_end());
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/CLI.md");
    if std::env::var_os("TRIDENT_BLESS").is_some() {
        std::fs::write(path, &doc).expect("docs/CLI.md is writable");
        return;
    }
    let current = std::fs::read_to_string(path).unwrap_or_default();
    assert!(current == doc, "docs/CLI.md is not what the binary prints: rewrite it with TRIDENT_BLESS=1 cargo test -p trident-cli --test cli");
}

/// `json` against `docs/trace-event.schema.json` (the trace-event format as trident writes it).
fn trace_schema_check(json: &serde_json::Value) -> Result<(), String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/trace-event.schema.json");
    let (mut schemas, mut compiler) = (boon::Schemas::new(), boon::Compiler::new());
    let schema = compiler.compile(&path.display().to_string(), &mut schemas).map_err(|e| format!("{e:#}"))?;
    schemas.validate(json, schema).map_err(|e| format!("{e:#}"))
}

/// The schema check can fail: a trace with a negative duration, an unknown phase or no events
/// is refused.
#[test]
fn the_trace_schema_refuses_malformed_traces() {
    let good = serde_json::json!({
        "traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "rank 0"}},
            {"ph": "X", "name": "k p0", "cat": "k", "pid": 0, "tid": 0, "ts": 0.0, "dur": 2.5, "args": {}},
            {"ph": "i", "s": "t", "name": "notify %s", "pid": 0, "tid": 0, "ts": 1.0, "args": {"signal": 3}},
        ],
        "displayTimeUnit": "ns",
        "otherData": {"dropped_events": 0, "launches": 1, "clock_offsets_ns": []},
    });
    trace_schema_check(&good).expect("a well-formed trace");
    let mut bad = good.clone();
    bad["traceEvents"][1]["dur"] = serde_json::json!(-1.0);
    assert!(trace_schema_check(&bad).is_err(), "a negative duration");
    let mut bad = good.clone();
    bad["traceEvents"][2]["ph"] = serde_json::json!("Q");
    assert!(trace_schema_check(&bad).is_err(), "an unknown phase");
    let mut bad = good.clone();
    bad["traceEvents"][1].as_object_mut().unwrap().remove("tid");
    assert!(trace_schema_check(&bad).is_err(), "a slice without its track");
    let mut bad = good;
    bad.as_object_mut().unwrap().remove("traceEvents");
    assert!(trace_schema_check(&bad).is_err(), "no events");
}
