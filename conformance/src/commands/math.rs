//! `trident math`: the accuracy of core's elementary functions.
//!
//! * Host mode (default): every f32 input (or every `--stride`-th bit pattern) through the
//!   host evaluation of each definition, against f64; prints the largest distance from the
//!   correctly rounded result in ulps, where it occurs, and how many results are not correctly
//!   rounded. This is the table of `docs/ACCURACY.md`.
//! * `--backend B`: the same inputs through kernels compiled for backend `B`; every result must
//!   be bit-identical to the host evaluation (the definitions use correctly rounded primitives
//!   only, so they are), which carries the host's accuracy over to the device.

use crate::reference::{ulps, unary_f64};
use std::process::ExitCode;
use trident_core::backend::{self, LaunchOptions};
use trident_core::ir::{DType, LaunchAttrs, UnaryOp};
use trident_core::math::{self, native::Native};
use trident_core::KernelBuilder;

#[derive(clap::Args, Debug)]
pub struct Args {
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

#[derive(serde::Serialize, Clone)]
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

/// What a run found over some inputs (merged across threads and launches).
#[derive(Clone, Copy, Default)]
struct Tally {
    worst: u64,
    worst_x: u32,
    inexact: u64,
    over: u64,
    dabs: f64,
    drel: f64,
    mismatches: u64,
}

impl Tally {
    /// `y = op(x)`; `host` is the host's bits to match (device mode).
    fn add(&mut self, op: UnaryOp, x: f32, y: f32, host: Option<f32>) {
        if host.is_some_and(|h| h.to_bits() != y.to_bits() && !(h.is_nan() && y.is_nan())) {
            self.mismatches += 1;
        }
        let r = unary_f64(op, x as f64);
        let u = ulps(y as f64, r, DType::F32);
        self.inexact += (u >= 1) as u64;
        self.over += (u >= 2) as u64;
        if u > self.worst {
            (self.worst, self.worst_x) = (u, x.to_bits());
        }
        // On fast math's domain: absolute error, and relative where |f(x)| >= 2^-64; results
        // that round to infinity are judged by ulps only.
        if crate::ops::fast_domain(op, x as f64) && !(r as f32).is_infinite() && !r.is_nan() {
            let e = (y as f64 - r).abs();
            let e = if e.is_nan() { f64::INFINITY } else { e };
            self.dabs = self.dabs.max(e);
            if r.abs() >= 2f64.powi(-64) {
                self.drel = self.drel.max(e / r.abs());
            }
        }
    }

    fn merge(&mut self, o: Tally) {
        if o.worst > self.worst {
            (self.worst, self.worst_x) = (o.worst, o.worst_x);
        }
        self.inexact += o.inexact;
        self.over += o.over;
        self.dabs = self.dabs.max(o.dabs);
        self.drel = self.drel.max(o.drel);
        self.mismatches += o.mismatches;
    }

    fn row(&self, op: UnaryOp, fast: bool, inputs: u64) -> Row {
        Row {
            op: op.to_string(),
            fast,
            inputs,
            max_ulp: self.worst,
            worst_input: f32::from_bits(self.worst_x),
            not_correctly_rounded: self.inexact,
            over_one_ulp: self.over,
            mismatches: self.mismatches,
            domain_max_abs: self.dabs,
            domain_max_rel: self.drel,
        }
    }
}

/// Tallies `item(i)` (input, result, host's result) for `i` in `0..n` over `threads` threads.
fn tally(n: u64, threads: usize, item: &(dyn Fn(u64) -> (f32, f32, Option<f32>) + Sync), op: UnaryOp) -> Tally {
    let per = n.div_ceil(threads as u64);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads as u64)
            .map(|t| {
                s.spawn(move || {
                    let mut acc = Tally::default();
                    for i in t * per..((t + 1) * per).min(n) {
                        let (x, y, h) = item(i);
                        acc.add(op, x, y, h);
                    }
                    acc
                })
            })
            .collect();
        let mut all = Tally::default();
        for h in hs {
            all.merge(h.join().unwrap_or_default());
        }
        all
    })
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
    let stride = a.stride;
    let t = tally(
        count,
        threads,
        &|k| {
            let x = f32::from_bits((k * stride) as u32);
            (x, host_eval(op, fast, x), None)
        },
        op,
    );
    t.row(op, fast, count)
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
    let mut all = Tally::default();
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
        let t = tally(n, threads, &|i| (xs[i as usize], ys[i as usize], Some(host_eval(op, fast, xs[i as usize]))), op);
        all.merge(t);
        start += n;
    }
    let _ = (dev.free(&xb), dev.free(&yb));
    Ok(all.row(op, fast, count))
}

/// `trident math`: the accuracy of the elementary functions, as `a` says.
pub fn main(a: Args) -> ExitCode {
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
        "trident math: {where_}, every {}-th f32 bit pattern ({} inputs per function)",
        a.stride,
        (1u64 << 32).div_ceil(a.stride)
    );
    println!(
        "{:<10} {:>5} {:>8} {:>14} {:>16} {:>12} {:>11}",
        "function", "mode", "max ulp", "at x", "not corr. round.", "> 1 ulp", "vs host"
    );
    let mut failed = false;
    let modes = if a.fast { vec![false, true] } else { vec![false] };
    let progress = crate::progress::Progress::new(modes.len() * list.len(), "functions");
    for fast in modes {
        for &op in &list {
            progress.step(&format!("{op}{}", if fast { " (fast)" } else { "" }));
            let t = std::time::Instant::now();
            let row = match &a.backend {
                None => host(&a, op, fast, threads),
                Some(b) => match device(&a, b, op, fast, threads) {
                    Ok(r) => r,
                    Err(e) => {
                        progress.line(|| println!("{op}: skipped: {e}"));
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
            progress.line(|| {
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
                )
            });
            rows.push(row);
        }
    }
    drop(progress);
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
