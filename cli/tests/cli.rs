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
