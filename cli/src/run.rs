//! `trident run` (`cargo xtask run`): runs a kernel written as a `.tile` file on one device.
//!
//! ```text
//! cargo xtask run kernel.tile --grid 4 --arg x=f32[1024] --arg y=f32[1024]:zeros \
//!     --arg out=f32[1024] --arg n=1000 [--backend nvidia] [--out DIR]
//! ```
//!
//! Every kernel parameter gets an `--arg NAME=VALUE`: a scalar takes a number (`true`/`false`
//! for `i1`); a pointer takes a buffer, `dtype[len]` (random values in [-1, 1), or random
//! integers of the type; `:zeros` for zeros) or a `.npy` file. The kernel is verified,
//! compiled and launched (once, after the inputs are written; `--repeat N` runs it N more
//! times and reports the median); every buffer whose bytes changed is written to `DIR/NAME.npy`.

use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;
use trident_conformance::cli::{self, usage};
use trident_conformance::npy;
use trident_conformance::ops::values::{encode, V};
use trident_core::backend::{Buffer, KernelArg, LaunchOptions};
use trident_core::ir::{DType, Elem, Literal};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The kernel, in the text format.
    file: PathBuf,
    /// Programs along x[,y[,z]].
    #[arg(long, default_value = "1")]
    grid: String,
    /// `NAME=VALUE` for each parameter (scalar: a number; pointer: `dtype[len]`,
    /// `dtype[len]:zeros` or `file.npy`).
    #[arg(long = "arg", value_name = "NAME=VALUE")]
    args: Vec<String>,
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// Backend target (default: its first).
    #[arg(long)]
    target: Option<String>,
    /// Where the written buffers go.
    #[arg(long, default_value = "run-out")]
    out: PathBuf,
    /// Seed of the random buffers.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Extra timed runs (median reported); inputs are rewritten before each.
    #[arg(long, default_value_t = 0)]
    repeat: usize,
}

/// A parameter's argument, resolved before anything runs.
enum ArgValue {
    Scalar(KernelArg),
    Buffer { name: String, dtype: DType, bytes: Vec<u8> },
}

fn parse_grid(s: &str) -> Result<[u32; 3], String> {
    let v: Vec<u32> = s
        .split(',')
        .map(|x| x.trim().parse::<u32>().map_err(|_| format!("--grid {s}: not X[,Y[,Z]]")))
        .collect::<Result<_, _>>()?;
    if v.is_empty() || v.len() > 3 || v.contains(&0) {
        return Err(format!("--grid {s}: one to three positive sizes"));
    }
    Ok([v[0], *v.get(1).unwrap_or(&1), *v.get(2).unwrap_or(&1)])
}

fn scalar(name: &str, d: DType, text: &str) -> Result<KernelArg, String> {
    let bad = || format!("--arg {name}={text}: not a `{d}` value");
    let lit = if d.is_float() {
        Literal::Float(text.parse::<f64>().map_err(|_| bad())?)
    } else if d == DType::I1 {
        Literal::Int(match text {
            "true" | "1" => 1,
            "false" | "0" => 0,
            _ => return Err(bad()),
        })
    } else if d == DType::U64 {
        Literal::Int(text.parse::<u64>().map_err(|_| bad())? as i64)
    } else {
        Literal::Int(text.parse::<i64>().map_err(|_| bad())?)
    };
    if let Some(why) = trident_core::verify::literal_range_error(lit, d) {
        return Err(format!("--arg {name}={text}: {why}"));
    }
    Ok(KernelArg::Scalar(lit, d))
}

fn buffer(name: &str, d: DType, text: &str, rng: &mut rand::rngs::StdRng) -> Result<Vec<u8>, String> {
    if text.ends_with(".npy") {
        let file = std::fs::read(text).map_err(|e| format!("--arg {name}={text}: {e}"))?;
        return npy::read(d, &file).map_err(|e| format!("--arg {name}={text}: {e}"));
    }
    let (spec, init) = text.split_once(':').unwrap_or((text, "random"));
    let bad = || format!("--arg {name}={text}: expected `{d}[len]`, `{d}[len]:zeros` or a .npy file");
    let (ty, len) = spec.strip_suffix(']').and_then(|s| s.split_once('[')).ok_or_else(bad)?;
    let ty = DType::parse(ty).ok_or_else(bad)?;
    if ty != d {
        return Err(format!("--arg {name}={text}: the parameter points to `{d}`, not `{ty}`"));
    }
    let len: usize = len.parse().map_err(|_| bad())?;
    let bits: Vec<u64> = match init {
        "zeros" => vec![0; len],
        "random" => (0..len)
            .map(|_| {
                if d.is_float() {
                    encode(V::F(rng.gen_range(-1.0..1.0)), d)
                } else if d == DType::I1 {
                    rng.gen_range(0..2)
                } else {
                    encode(V::I(rng.gen::<i64>() as i128), d)
                }
            })
            .collect(),
        _ => return Err(bad()),
    };
    Ok(trident_conformance::ops::values::to_bytes(&bits, d))
}

/// `trident run`: a `.tile` kernel launched as `a` says.
pub fn main(a: Args) -> ExitCode {
    // Everything is checked before anything runs.
    let desc = match cli::backend(&a.backend, a.target.as_deref()) {
        Ok(d) => d,
        Err(e) => return usage(e),
    };
    let grid = match parse_grid(&a.grid) {
        Ok(g) => g,
        Err(e) => return usage(e),
    };
    let text = match std::fs::read_to_string(&a.file) {
        Ok(t) => t,
        Err(e) => return usage(format!("{}: {e}", a.file.display())),
    };
    let func = match trident_core::text::parse(&text) {
        Ok(f) => f,
        Err(e) => return usage(format!("{}: {e}", a.file.display())),
    };
    if let Err(e) = trident_core::verify(&func) {
        return usage(format!("{}: {e}", a.file.display()));
    }
    let mut given: Vec<(String, String)> = Vec::new();
    for s in &a.args {
        match s.split_once('=') {
            Some((n, v)) if func.param(n).is_some() => given.push((n.to_string(), v.to_string())),
            Some((n, _)) => {
                let names: Vec<&str> = func.params.iter().map(|p| p.name.as_str()).collect();
                return usage(format!(
                    "--arg {s}: kernel @{} has no parameter `{n}` (it has {})",
                    func.name,
                    names.join(", ")
                ));
            }
            None => return usage(format!("--arg {s}: expected NAME=VALUE")),
        }
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(a.seed);
    let mut values = Vec::new();
    for p in &func.params {
        let Some((_, v)) = given.iter().find(|(n, _)| *n == p.name) else {
            return usage(format!("parameter `{}: {}` has no --arg", p.name, func.ty(p.value)));
        };
        let r = match func.ty(p.value).elem {
            Elem::Num(d) => scalar(&p.name, d, v).map(ArgValue::Scalar),
            Elem::Ptr(d) => {
                buffer(&p.name, d, v, &mut rng).map(|bytes| ArgValue::Buffer { name: p.name.clone(), dtype: d, bytes })
            }
            Elem::Token => Err(format!("parameter `{}` is a token", p.name)),
            Elem::Desc { .. } => Err(format!("parameter `{}` is a descriptor (make it with make_desc)", p.name)),
        };
        match r {
            Ok(v) => values.push(v),
            Err(e) => return usage(e),
        }
    }
    if let Err(e) = std::fs::create_dir_all(&a.out) {
        return usage(format!("--out {}: {e}", a.out.display()));
    }

    let b = (desc.create)();
    let t = Instant::now();
    let art = match b.compile(&func, a.target.as_deref()) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let compile_ms = t.elapsed().as_secs_f64() * 1e3;
    let dev = match b.open_device(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = (|| -> Result<Vec<f64>, trident_core::backend::BackendError> {
        let mut bufs: Vec<Option<Buffer>> = Vec::new();
        let mut kargs = Vec::new();
        for v in &values {
            match v {
                ArgValue::Scalar(k) => {
                    kargs.push(*k);
                    bufs.push(None);
                }
                ArgValue::Buffer { name, bytes, .. } => {
                    let buf = dev.alloc(bytes.len().max(1), name)?;
                    kargs.push(buf.arg());
                    bufs.push(Some(buf));
                }
            }
        }
        let opts = LaunchOptions { seed: a.seed, ..LaunchOptions::default() };
        let mut times = Vec::new();
        for _ in 0..=a.repeat {
            for (v, buf) in values.iter().zip(&bufs) {
                if let (ArgValue::Buffer { bytes, .. }, Some(buf)) = (v, buf) {
                    dev.write(buf, 0, bytes)?;
                }
            }
            let t = Instant::now();
            dev.launch(&art, grid, &kargs, &opts)?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        for (v, buf) in values.iter().zip(&bufs) {
            if let (ArgValue::Buffer { name, dtype, bytes }, Some(buf)) = (v, buf) {
                let mut after = vec![0u8; bytes.len()];
                dev.read(buf, 0, &mut after)?;
                if after != *bytes {
                    let path = a.out.join(format!("{name}.npy"));
                    std::fs::write(&path, npy::write(*dtype, &after)).map_err(|e| {
                        trident_core::backend::BackendError::Host(format!("writing {}: {e}", path.display()))
                    })?;
                    println!(
                        "wrote {} ({} x {dtype}: {}, ..)",
                        path.display(),
                        after.len() / dtype.size_bytes() as usize,
                        npy::preview(*dtype, &after, 4)
                    );
                }
                dev.free(buf)?;
            }
        }
        Ok(times)
    })();
    match result {
        Ok(mut times) => {
            let first = times[0];
            let rest = &mut times[1..];
            rest.sort_by(|x, y| x.total_cmp(y));
            let median = if rest.is_empty() {
                String::new()
            } else {
                format!(", median of {} more {:.3} ms", rest.len(), rest[rest.len() / 2])
            };
            println!(
                "kernel @{} on {} {}: compiled in {compile_ms:.2} ms, grid {grid:?}, first run {first:.3} ms (host clock, launch to completion){median}",
                func.name,
                desc.name,
                art.target
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
