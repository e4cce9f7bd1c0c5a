//! `trident ops`: the differential test of every op x element type on one backend, and the
//! check of the support matrix (`docs/SUPPORT.md`) against what the backends compile.

use crate::cli::{self, usage};
use crate::ops::matrix::{cell, columns, Cell, Matrix};
use crate::ops::run::{Outcome, Runner, Status};
use crate::ops::{cases, OpCase};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use trident_core::backend::{self, BackendError};
use trident_core::ir::DType;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Backend to run on (`--list-backends` in trident test lists them).
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// Backend target (default: its first).
    #[arg(long)]
    target: Option<String>,
    /// Only ops whose name contains this (`exp`, `cmp`, `cast.f16`, `atomic`).
    #[arg(long)]
    op: Option<String>,
    /// Only this element type.
    #[arg(long)]
    dtype: Option<String>,
    /// Also the fast-math forms of the f32 functions.
    #[arg(long)]
    fast: bool,
    /// Replay a run: the seed it printed (decimal or 0x-hex).
    #[arg(long)]
    seed: Option<String>,
    /// Write one JSON record per case here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// The support matrix to check (or write with --bless).
    #[arg(long, default_value = "docs/SUPPORT.md")]
    matrix: PathBuf,
    /// Rewrite the support matrix from what every backend compiles, then exit.
    #[arg(long)]
    bless: bool,
    /// Only check the support matrix (compile every case); run nothing.
    #[arg(long)]
    compile_only: bool,
    /// Check the options and exit (what `cargo xtask test` does before any work).
    #[arg(long)]
    check_args: bool,
    /// Write the backend's code of every selected case x layout into this folder, then exit
    /// (`cargo xtask ptx-check` assembles them).
    #[arg(long)]
    emit: Option<PathBuf>,
}

/// Whether this machine has what a column's compile needs: the `amd` column's cells are
/// checked code objects, made with LLVM 19's tools.
fn column_tools(column: &str) -> Result<(), String> {
    match column {
        "amd" => trident_backend_amd::codeobj::tools().map(|_| ()).map_err(|e| e.to_string()),
        _ => Ok(()),
    }
}

/// The cells of `cases` on `runners`, compiled on every core (a column's check compiles every
/// case for every target: the amd column runs `llc` and `ld.lld` for each when not cached).
fn cells_in_parallel(runners: &[Runner], cases: &[&(usize, OpCase)]) -> Vec<Result<Cell, String>> {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 16);
    let chunk = cases.len().div_ceil(workers).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = cases
            .chunks(chunk)
            .map(|part| (part.len(), s.spawn(move || part.iter().map(|(_, c)| cell(runners, c)).collect::<Vec<_>>())))
            .collect();
        handles
            .into_iter()
            .flat_map(|(n, h)| h.join().unwrap_or_else(|_| vec![Err("a compile thread panicked".to_string()); n]))
            .collect()
    })
}

/// Runners (one per target) for a matrix column's backend, compile-only.
fn column_runners<'a>(
    backends: &'a [(String, Box<dyn trident_core::backend::Backend>)],
    column: &str,
) -> Vec<Runner<'a>> {
    let targets = columns().into_iter().find(|c| c.0 == column).map(|c| c.1).unwrap_or_default();
    backends
        .iter()
        .filter(|(n, _)| n == column)
        .flat_map(|(_, b)| {
            targets.clone().into_iter().map(move |t| Runner {
                backend: b.as_ref(),
                target: Some(t),
                device: None,
                seed: 0,
            })
        })
        .collect()
}

/// `trident ops`: the differential test of every op, as `a` says.
pub fn main(a: Args) -> ExitCode {
    let desc = match cli::backend(&a.backend, a.target.as_deref()) {
        Ok(d) => d,
        Err(e) => return usage(e),
    };
    let dtype = match a.dtype.as_deref().map(|d| DType::parse(d).ok_or(d)) {
        Some(Err(d)) => return usage(format!("--dtype {d}: not an element type")),
        Some(Ok(d)) => Some(d),
        None => None,
    };
    let seed = match cli::seed(a.seed.as_deref()) {
        Ok(s) => s,
        Err(e) => return usage(e),
    };
    // Fail before any work when the report cannot be written.
    if let Some(p) = &a.json {
        if let Err(e) = std::fs::write(p, "") {
            return usage(format!("--json {}: {e}", p.display()));
        }
    }
    // The default matrix is the repository's, from wherever the tool runs.
    let matrix_path = if a.matrix.is_relative() && !a.matrix.exists() {
        let at_repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(&a.matrix);
        if at_repo.exists() || a.bless {
            at_repo
        } else {
            a.matrix.clone()
        }
    } else {
        a.matrix.clone()
    };
    let all = cases(a.fast);
    let selected: Vec<(usize, OpCase)> = all
        .iter()
        .copied()
        .enumerate()
        .filter(|(_, c)| a.op.as_ref().is_none_or(|o| c.op_name().contains(o.as_str())))
        .filter(|(_, c)| dtype.is_none_or(|d| c.dtype == d))
        .collect();
    if selected.is_empty() {
        return usage("no case matches --op/--dtype");
    }

    if a.check_args {
        println!("options ok: backend {}, {} cases", desc.name, selected.len());
        return ExitCode::SUCCESS;
    }
    if let Some(dir) = &a.emit {
        return emit(desc, a.target.as_deref(), &selected, dir);
    }

    // The support matrix: every column's backend compiles every case (no device needed).
    let backends: Vec<(String, Box<dyn trident_core::backend::Backend>)> = columns()
        .iter()
        .filter_map(|(name, _)| backend::lookup(name).ok().map(|d| (name.to_string(), (d.create)())))
        .collect();
    let base_cases: Vec<&(usize, OpCase)> = selected.iter().filter(|(_, c)| !c.fast).collect();
    if a.bless {
        if a.op.is_some() || dtype.is_some() {
            return usage("--bless rewrites the whole matrix: give no --op or --dtype");
        }
        if let Err(why) = column_tools("amd") {
            return usage(format!("--bless writes the amd column from checked code objects: {why}"));
        }
        let mut m = Matrix::default();
        for (col, _) in columns() {
            let cells = cells_in_parallel(&column_runners(&backends, col), &base_cases);
            for ((_, c), x) in base_cases.iter().zip(cells) {
                match x {
                    Ok(x) => m.set(c, col, x),
                    Err(e) => return usage(e),
                }
            }
        }
        if let Err(e) = std::fs::write(&matrix_path, m.render()) {
            return usage(format!("writing {}: {e}", matrix_path.display()));
        }
        println!("wrote {} rows to {}", m.rows.len(), matrix_path.display());
        return ExitCode::SUCCESS;
    }
    let matrix = match std::fs::read_to_string(&matrix_path).map_err(|e| e.to_string()).and_then(|t| Matrix::parse(&t))
    {
        Ok(m) => m,
        Err(e) => return usage(format!("reading the support matrix {}: {e}", matrix_path.display())),
    };
    let column = columns().into_iter().find(|c| c.0 == desc.name).map(|c| c.0);
    let mut disagreements = Vec::new();
    let checkable = match column.map(column_tools) {
        Some(Err(why)) => {
            println!("support matrix: skipped: the {} column is not checked here: {why}", desc.name);
            false
        }
        _ => true,
    };
    if let Some(col) = column.filter(|_| checkable) {
        let runners = column_runners(&backends, col);
        let cells = cells_in_parallel(&runners, &base_cases);
        for ((_, c), got) in base_cases.iter().zip(cells) {
            let got = match got {
                Ok(x) => x,
                Err(e) => {
                    disagreements.push(e);
                    continue;
                }
            };
            match matrix.get(c, col) {
                None => disagreements.push(format!("{} {}: not in the matrix", c.op_name(), c.dtype)),
                Some(want) if *want != got => disagreements.push(format!(
                    "{} {} on {col}: the matrix says {}, the backend {}",
                    c.op_name(),
                    c.dtype,
                    want.as_ref().map_or("supported".to_string(), |r| format!("refused ({r})")),
                    got.map_or("compiles it".to_string(), |r| format!("refuses it: {r}"))
                )),
                _ => {}
            }
        }
        println!(
            "support matrix {}: {} {} cases on {col} ({}), {} disagreement(s)",
            matrix_path.display(),
            base_cases.len(),
            if a.op.is_some() || dtype.is_some() { "selected" } else { "" },
            columns().into_iter().find(|x| x.0 == col).map(|x| x.1.join(", ")).unwrap_or_default(),
            disagreements.len()
        );
        for d in &disagreements {
            println!("  MATRIX: {d}");
        }
    }
    if a.compile_only {
        return if disagreements.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE };
    }

    let b = (desc.create)();
    let device = match b.open_device(0) {
        Ok(d) => d,
        Err(e @ BackendError::NoDevice { .. }) => {
            println!("trident ops: backend {}: skipped: {e}", desc.name);
            println!("ops: 0 passed, 0 failed, {} skipped", selected.len());
            return if disagreements.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE };
        }
        Err(e) => return usage(e),
    };
    let target = a.target.as_deref();
    let runner = Runner { backend: b.as_ref(), target, device: Some(device), seed };
    println!(
        "trident ops: backend {} target {}, {} cases, seed {seed:#x} (replay with --seed {seed:#x})",
        desc.name,
        target.unwrap_or(desc.target_names()[0]),
        selected.len()
    );
    let mut outcomes: Vec<Outcome> = Vec::new();
    let progress = crate::progress::Progress::new(selected.len(), "ops");
    for (index, c) in &selected {
        let o = runner.run(c, *index);
        progress.step(&format!("{} {}", o.op, o.dtype));
        // A refusal must be one the matrix lists; a listed one is not a failure.
        let listed = column.and_then(|col| matrix.get(c, col)).is_some_and(|x| x.is_some());
        let verdict = match (&o.status, c.fast) {
            (Status::Pass, _) => "ok".to_string(),
            (Status::Refused, false) if listed => format!("refused (listed): {}", o.message),
            (Status::Refused, _) => format!("REFUSED (not in the matrix): {}", o.message),
            (Status::Fail, _) => format!("FAIL: {}", o.message),
        };
        if o.status != Status::Pass || a.op.is_some() {
            progress.line(|| {
                println!("{:<22} {:<5} max {:>3} ulp {:>6} elements  {verdict}", o.op, o.dtype, o.max_ulp, o.checked);
                let _ = std::io::stdout().flush();
            });
        }
        outcomes.push(o);
    }
    drop(progress);
    let failed: Vec<&Outcome> = outcomes
        .iter()
        .zip(&selected)
        .filter(|(o, (_, c))| {
            o.status == Status::Fail
                || (o.status == Status::Refused
                    && !column.and_then(|col| matrix.get(c, col)).is_some_and(|x| x.is_some()))
        })
        .map(|(o, _)| o)
        .collect();
    let refused = outcomes.iter().filter(|o| o.status == Status::Refused).count();
    print_accuracy(&outcomes);
    if let Some(p) = &a.json {
        let text = serde_json::to_string_pretty(&outcomes).unwrap_or_default();
        if let Err(e) = std::fs::write(p, text + "\n") {
            return usage(format!("writing {}: {e}", p.display()));
        }
        println!("wrote {} records to {}", outcomes.len(), p.display());
    }
    let passed = outcomes.iter().filter(|o| o.status == Status::Pass).count();
    let refused_unlisted = failed.iter().filter(|o| o.status == Status::Refused).count();
    println!(
        "ops: {passed} passed, {} failed, {} refused as the matrix lists, {} matrix disagreement(s)",
        failed.len(),
        refused - refused_unlisted,
        disagreements.len()
    );
    if !failed.is_empty() || !disagreements.is_empty() {
        println!("replay with --seed {seed:#x}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// Writes the code of every case x layout the backend compiles.
fn emit(
    desc: &'static trident_core::backend::BackendDescriptor,
    target: Option<&str>,
    selected: &[(usize, OpCase)],
    dir: &std::path::Path,
) -> ExitCode {
    if let Err(e) = std::fs::create_dir_all(dir) {
        return usage(format!("creating {}: {e}", dir.display()));
    }
    let b = (desc.create)();
    let (mut n, mut failed) = (0, 0);
    for (_, c) in selected {
        for lay in crate::ops::kernel::layouts(c.family) {
            let f = match crate::ops::kernel::build(c, &lay) {
                Ok(f) => f,
                Err(e) => return usage(format!("{} {}: {e}", c.op_name(), c.dtype)),
            };
            let art = match b.compile(&f, target) {
                Ok(a) => a,
                Err(e) => {
                    // Refusals are the support matrix's business (its compile-only check),
                    // except for cases it does not hold (fast math): there, for amd, anything
                    // but the lowering's refusals (a writer, the assembler, a code-object check)
                    // is a failure.
                    let refusal = e.to_string().contains("not supported") || e.to_string().contains("refuse");
                    if desc.name == "amd" && !refusal {
                        eprintln!("{} {} {}: {e}", c.op_name(), c.dtype, lay.text());
                        failed += 1;
                    }
                    continue;
                }
            };
            let ext = if desc.name == "amd" { "ll" } else { "ptx" };
            let path = dir.join(format!("{}_{}_{}.{ext}", c.op_name(), c.dtype, lay.text()));
            if let Err(e) = std::fs::write(&path, art.text) {
                return usage(format!("writing {}: {e}", path.display()));
            }
            n += 1;
        }
    }
    println!("emitted {n} kernels into {}, {failed} failed", dir.display());
    if failed > 0 {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// The largest ulp distance per float function and element type, as `docs/ACCURACY.md` lists.
fn print_accuracy(outcomes: &[Outcome]) {
    let mut t: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for o in outcomes.iter().filter(|o| o.status == Status::Pass && o.max_ulp > 0) {
        t.entry(o.op.clone()).or_default().insert(o.dtype.clone(), o.max_ulp);
    }
    if t.is_empty() {
        return;
    }
    println!("largest distance from the correctly rounded result (ulp), by op and type:");
    for (op, row) in &t {
        let cells: Vec<String> = row.iter().map(|(d, u)| format!("{d} {u}")).collect();
        println!("  {op:<16} {}", cells.join(", "));
    }
}
