//! `trident-math`: the accuracy of core's elementary functions.
//!
//! * Host mode (default): every f32 input (or every `--stride`-th bit pattern) through the
//!   host evaluation of each definition, against f64; prints the largest distance from the
//!   correctly rounded result in ulps, where it occurs, and how many results are not correctly
//!   rounded. This is the table of `docs/ACCURACY.md`.
//! * `--backend B`: the same inputs through kernels compiled for backend `B`; every result must
//!   be bit-identical to the host evaluation (the definitions use correctly rounded primitives
//!   only, so they are), which carries the host's accuracy over to the device.

use clap::Parser;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use trident_conformance::reference::{ulps, unary_f64};
use trident_core::backend::{self, LaunchOptions};
use trident_core::ir::{DType, LaunchAttrs, UnaryOp};
use trident_core::math::{self, native::Native};
use trident_core::KernelBuilder;

#[derive(Parser, Debug)]
#[command(name = "trident-math", about = "Accuracy of the elementary functions over the f32 inputs")]
struct Args {
    /// Take every N-th bit pattern (1: all 2^32).
    #[arg(long, default_value_t = 1)]
    stride: u64,
    /// Only functions whose name contains this.
    #[arg(long)]
    op: Option<String>,
    /// Host threads.
    #[arg(long)]
    threads: Option<usize>,
    /// Compare a backend's results bit for bit with the host's instead (`nvidia`, `cpu-simt`).
    #[arg(long)]
    backend: Option<String>,
    /// The backend's target.
    #[arg(long)]
    target: Option<String>,
    /// Also the fast-math forms (host: approximations evaluated correctly rounded; device:
    /// the hardware's, reported, not required to match).
    #[arg(long)]
    fast: bool,
    /// Write the table as JSON.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

#[derive(serde::Serialize, Default, Clone)]
struct Row {
    op: String,
    fast: bool,
    inputs: u64,
    max_ulp: u64,
    worst_input: f32,
    not_correctly_rounded: u64,
    over_one_ulp: u64,
    /// Device mode: results that differ from the host's bits.
    mismatches: u64,
    /// On fast math's input domain (`ops::fast_domain`): the largest absolute error, and the
    /// largest error relative to |f(x)| where f(x) >= 2^-64.
    domain_max_abs: f64,
    domain_max_rel: f64,
}

/// Errors of `y` against `r` on the fast-math domain: (abs, rel).
fn domain_err(op: UnaryOp, x: f32, y: f32, r: f64) -> (f64, f64) {
    // Results that round to infinity are judged by ulps, not here.
    if !trident_conformance::ops::fast_domain(op, x as f64) || (r as f32).is_infinite() || r.is_nan() {
        return (0.0, 0.0);
    }
    let e = (y as f64 - r).abs();
    let e = if e.is_nan() { f64::INFINITY } else { e };
    (e, if r.abs() >= 2f64.powi(-64) { e / r.abs() } else { 0.0 })
}

fn ops(filter: &Option<String>) -> Vec<UnaryOp> {
    UnaryOp::ALL
        .iter()
        .copied()
        .filter(|o| math::is_expanded(*o))
        .filter(|o| filter.as_ref().is_none_or(|f| o.as_str().contains(f.as_str())))
        .collect()
}

fn host_eval(op: UnaryOp, fast: bool, x: f32) -> f32 {
    let m = &mut Native;
    let y = if fast { math::fast_unary(m, op, x) } else { None };
    y.or_else(|| math::unary(m, op, x)).unwrap_or(f32::NAN)
}

fn host(a: &Args, op: UnaryOp, fast: bool, threads: usize) -> Row {
    let count = (1u64 << 32).div_ceil(a.stride);
    let chunk = count.div_ceil(threads as u64);
    let (worst, worst_x, inexact, over) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let (dabs, drel) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        for t in 0..threads as u64 {
            let (worst, worst_x, inexact, over) = (&worst, &worst_x, &inexact, &over);
            let (dabs, drel) = (&dabs, &drel);
            let stride = a.stride;
            s.spawn(move || {
                let (mut w, mut wx, mut ni, mut ov) = (0u64, 0u32, 0u64, 0u64);
                let (mut da, mut dr) = (0f64, 0f64);
                for k in t * chunk..((t + 1) * chunk).min(count) {
                    let x = f32::from_bits((k * stride) as u32);
                    let (y, r) = (host_eval(op, fast, x), unary_f64(op, x as f64));
                    let (ea, er) = domain_err(op, x, y, r);
                    (da, dr) = (da.max(ea), dr.max(er));
                    let u = ulps(y as f64, r, DType::F32);
                    ni += (u >= 1) as u64;
                    ov += (u >= 2) as u64;
                    if u > w {
                        (w, wx) = (u, x.to_bits());
                    }
                }
                inexact.fetch_add(ni, Ordering::Relaxed);
                over.fetch_add(ov, Ordering::Relaxed);
                // Non-negative f64s order like their bits.
                dabs.fetch_max(da.to_bits(), Ordering::Relaxed);
                drel.fetch_max(dr.to_bits(), Ordering::Relaxed);
                if worst.fetch_max(w, Ordering::Relaxed) < w {
                    worst_x.store(wx as u64, Ordering::Relaxed);
                }
            });
        }
    });
    Row {
        op: op.to_string(),
        fast,
        inputs: count,
        max_ulp: worst.into_inner(),
        worst_input: f32::from_bits(worst_x.into_inner() as u32),
        not_correctly_rounded: inexact.into_inner(),
        over_one_ulp: over.into_inner(),
        mismatches: 0,
        domain_max_abs: f64::from_bits(dabs.into_inner()),
        domain_max_rel: f64::from_bits(drel.into_inner()),
    }
}

/// Runs `op` over the sampled inputs on a device, in launches of 2^24 elements.
fn device(a: &Args, name: &str, op: UnaryOp, fast: bool, threads: usize) -> Result<Row, String> {
    let desc = backend::lookup(name).map_err(|e| e.to_string())?;
    let b = (desc.create)();
    let kb = KernelBuilder::new("math", LaunchAttrs { fast_math: fast, ..LaunchAttrs::default() });
    let (x, out) = (kb.arg_ptr("x", DType::F32), kb.arg_ptr("out", DType::F32));
    let offs = kb.program_id_x() * 1024 + kb.arange(0, 1024);
    kb.store(out + offs, kb.load(x + offs, None, None).apply(op), None);
    let f = kb.finish().map_err(|e| e.to_string())?;
    let art = b.compile(&f, a.target.as_deref()).map_err(|e| e.to_string())?;
    let dev = b.open_device(0).map_err(|e| e.to_string())?;
    const CHUNK: u64 = 1 << 24;
    let count = (1u64 << 32).div_ceil(a.stride);
    let (xb, yb) = (
        dev.alloc(4 * CHUNK as usize, "x").map_err(|e| e.to_string())?,
        dev.alloc(4 * CHUNK as usize, "out").map_err(|e| e.to_string())?,
    );
    let mut row = Row { op: op.to_string(), fast, inputs: count, ..Row::default() };
    let mut start = 0;
    while start < count {
        let n = CHUNK.min(count - start);
        let n_pad = n.div_ceil(1024) * 1024;
        let xs: Vec<f32> = (0..n_pad).map(|i| f32::from_bits(((start + i.min(n - 1)) * a.stride) as u32)).collect();
        let bytes: Vec<u8> = xs.iter().flat_map(|v| v.to_le_bytes()).collect();
        dev.write(&xb, 0, &bytes).map_err(|e| e.to_string())?;
        dev.launch(&art, [(n_pad / 1024) as u32, 1, 1], &[xb.arg(), yb.arg()], &LaunchOptions::default())
            .map_err(|e| e.to_string())?;
        let mut out = vec![0u8; 4 * n_pad as usize];
        dev.read(&yb, 0, &mut out).map_err(|e| e.to_string())?;
        let ys: Vec<f32> = out.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let per = (n as usize).div_ceil(threads);
        let results: Vec<(u64, u64, u64, u64, u32, f64, f64)> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|t| {
                    let (xs, ys) = (&xs, &ys);
                    s.spawn(move || {
                        let (mut mism, mut w, mut ni, mut ov, mut wx) = (0u64, 0u64, 0u64, 0u64, 0u32);
                        let (mut da, mut dr) = (0f64, 0f64);
                        for i in t * per..((t + 1) * per).min(n as usize) {
                            let (x, y) = (xs[i], ys[i]);
                            let h = host_eval(op, fast, x);
                            if h.to_bits() != y.to_bits() && !(h.is_nan() && y.is_nan()) {
                                mism += 1;
                            }
                            let r = unary_f64(op, x as f64);
                            let (ea, er) = domain_err(op, x, y, r);
                            (da, dr) = (da.max(ea), dr.max(er));
                            let u = ulps(y as f64, r, DType::F32);
                            ni += (u >= 1) as u64;
                            ov += (u >= 2) as u64;
                            if u > w {
                                (w, wx) = (u, x.to_bits());
                            }
                        }
                        (mism, w, ni, ov, wx, da, dr)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or_default()).collect()
        });
        for (mism, w, ni, ov, wx, da, dr) in results {
            row.domain_max_abs = row.domain_max_abs.max(da);
            row.domain_max_rel = row.domain_max_rel.max(dr);
            row.mismatches += mism;
            row.not_correctly_rounded += ni;
            row.over_one_ulp += ov;
            if w > row.max_ulp {
                row.max_ulp = w;
                row.worst_input = f32::from_bits(wx);
            }
        }
        start += n;
    }
    let _ = (dev.free(&xb), dev.free(&yb));
    Ok(row)
}

fn main() -> ExitCode {
    trident_conformance::link_backends();
    let a = Args::parse();
    if a.stride == 0 {
        eprintln!("error: --stride must be at least 1");
        return ExitCode::from(2);
    }
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    let list = ops(&a.op);
    if list.is_empty() {
        eprintln!("error: no function matches --op");
        return ExitCode::from(2);
    }
    let mut rows = Vec::new();
    let where_ = a.backend.as_deref().map(|b| format!("backend {b}")).unwrap_or_else(|| "host".into());
    println!(
        "trident-math: {where_}, every {}-th f32 bit pattern ({} inputs per function)",
        a.stride,
        (1u64 << 32).div_ceil(a.stride)
    );
    println!(
        "{:<10} {:>5} {:>8} {:>14} {:>16} {:>12} {:>11}",
        "function", "mode", "max ulp", "at x", "not corr. round.", "> 1 ulp", "vs host"
    );
    let mut failed = false;
    for fast in if a.fast { vec![false, true] } else { vec![false] } {
        for &op in &list {
            let t = std::time::Instant::now();
            let row = match &a.backend {
                None => host(&a, op, fast, threads),
                Some(b) => match device(&a, b, op, fast, threads) {
                    Ok(r) => r,
                    Err(e) => {
                        println!("{op}: skipped: {e}");
                        if e.contains("no device") || e.contains("No device") || e.contains("no CUDA") {
                            continue;
                        }
                        failed = true;
                        continue;
                    }
                },
            };
            let vs_host = if a.backend.is_some() {
                if row.mismatches == 0 {
                    "identical".to_string()
                } else {
                    format!("{} differ", row.mismatches)
                }
            } else {
                "-".into()
            };
            // Accurate definitions: within 2 ulp, and the device bit-identical to the host.
            if !fast && (row.max_ulp > 2 || row.mismatches > 0) {
                failed = true;
            }
            println!(
                "{:<10} {:>5} {:>8} {:>14e} {:>16} {:>12} {:>11} {:>9.1e} {:>9.1e}  ({:.1} s)",
                row.op,
                if fast { "fast" } else { "exact" },
                row.max_ulp,
                row.worst_input,
                row.not_correctly_rounded,
                row.over_one_ulp,
                vs_host,
                row.domain_max_abs,
                row.domain_max_rel,
                t.elapsed().as_secs_f64()
            );
            rows.push(row);
        }
    }
    if let Some(p) = &a.json {
        if let Err(e) = std::fs::write(p, serde_json::to_string_pretty(&rows).unwrap_or_default() + "\n") {
            eprintln!("error: writing {}: {e}", p.display());
            return ExitCode::from(2);
        }
    }
    if failed {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
