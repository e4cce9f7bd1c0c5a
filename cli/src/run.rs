//! `trident run` (`cargo xtask run`): runs a kernel written as a `.tile` file on one device, or
//! SPMD on the ranks of a world (`--world N`, `--processes`: `crate::run_world`).
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
    pub(crate) file: PathBuf,
    /// Programs along x[,y[,z]].
    #[arg(long, default_value = "1")]
    pub(crate) grid: String,
    /// `NAME=VALUE` for each parameter. A scalar: a number, or `rank`, `world` or `call` (the
    /// call's number from 1: an epoch). A pointer: `dtype[len]` (random, different on every
    /// rank), `dtype[len]:zeros`, or a .npy file (`{rank}` in its name is the rank); `:symm`
    /// after either allocates it in the symmetric heap (`--world`).
    #[arg(long = "arg", value_name = "NAME=VALUE")]
    pub(crate) args: Vec<String>,
    #[arg(long, default_value = "cpu")]
    pub(crate) backend: String,
    /// Backend target (default: its first).
    #[arg(long)]
    pub(crate) target: Option<String>,
    /// Where the written buffers go (`OUT/rank<r>/` in a world).
    #[arg(long, default_value = "run-out")]
    pub(crate) out: PathBuf,
    /// Seed of the random buffers (and of the CPU world's schedules).
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// One device: extra timed runs (median reported), inputs rewritten before each. A world:
    /// calls after the first, back to back on the same buffers (`call` counts them), each
    /// ended on every rank before the next starts.
    #[arg(long, default_value_t = 0)]
    pub(crate) repeat: usize,
    /// Runs the kernel SPMD on N ranks: the CPU world (`cpu`, `cpu-simt`), the loopback world
    /// (`nvidia`: every rank on GPU 0), or with `--peer` a rank per GPU.
    #[arg(long)]
    pub(crate) world: Option<usize>,
    /// The CPU world: runs under N schedules (seeded from `--seed`), each of which must
    /// succeed and leave the same bytes.
    #[arg(long, default_value_t = 1)]
    pub(crate) chaos: usize,
    /// The CPU world: the happens-before race detector.
    #[arg(long)]
    pub(crate) race: bool,
    /// `nvidia`: the peer world (a rank per GPU) instead of the loopback world.
    #[arg(long)]
    pub(crate) peer: bool,
    /// This process is one rank of a world of processes (`trident launch -n N -- trident run
    /// ... --processes`): NVSHMEM's symmetric heap on `nvidia`.
    #[arg(long)]
    pub(crate) processes: bool,
    /// With --world: compile the kernel with a timeline and write every rank's programs (each
    /// call's) to this Perfetto / Chrome trace, and the same drawn beside it as `.svg` (the CPU
    /// world: its virtual time; the first schedule with --chaos).
    #[arg(long, value_name = "OUT.json", requires = "world")]
    pub(crate) trace: Option<PathBuf>,
}

/// A scalar argument: a number, or one the rank or the call gives.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ScalarArg {
    Fixed(KernelArg),
    Rank,
    World,
    Call,
}

/// What a buffer starts with.
#[derive(Clone, Debug)]
pub(crate) enum Init {
    Random,
    Zeros,
    /// A .npy file; `{rank}` in the path is the rank.
    File(String),
}

/// A parameter's argument, resolved before anything runs.
#[derive(Clone, Debug)]
pub(crate) enum ArgValue {
    Scalar { name: String, dtype: DType, value: ScalarArg },
    Buffer { name: String, dtype: DType, len: usize, init: Init, symmetric: bool },
}

impl ArgValue {
    /// The kernel argument of a scalar at `rank` of `world`, in call `call`.
    pub(crate) fn scalar(&self, rank: usize, world: usize, call: usize) -> Result<KernelArg, String> {
        let ArgValue::Scalar { name, dtype, value } = self else { unreachable!("only scalars") };
        let n = match value {
            ScalarArg::Fixed(k) => return Ok(*k),
            ScalarArg::Rank => rank,
            ScalarArg::World => world,
            ScalarArg::Call => call,
        };
        scalar(name, *dtype, &n.to_string())
    }

    /// A buffer's first bytes at `rank`: random values differ per rank (seeded by `seed` and
    /// the rank).
    pub(crate) fn bytes(&self, rank: usize, seed: u64) -> Result<Vec<u8>, String> {
        let ArgValue::Buffer { name, dtype, len, init, .. } = self else { unreachable!("only buffers") };
        let d = *dtype;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (rank as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let bits: Vec<u64> = match init {
            Init::File(path) => {
                let path = path.replace("{rank}", &rank.to_string());
                let file = std::fs::read(&path).map_err(|e| format!("--arg {name}={path}: {e}"))?;
                return npy::read(d, &file).map_err(|e| format!("--arg {name}={path}: {e}"));
            }
            Init::Zeros => vec![0; *len],
            Init::Random => (0..*len)
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
        };
        Ok(trident_conformance::ops::values::to_bytes(&bits, d))
    }
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

fn scalar_arg(name: &str, d: DType, text: &str) -> Result<ArgValue, String> {
    let value = match text {
        "rank" => ScalarArg::Rank,
        "world" => ScalarArg::World,
        "call" => ScalarArg::Call,
        _ => ScalarArg::Fixed(scalar(name, d, text)?),
    };
    Ok(ArgValue::Scalar { name: name.to_string(), dtype: d, value })
}

fn buffer(name: &str, d: DType, text: &str) -> Result<ArgValue, String> {
    let mut parts = text.split(':');
    let spec = parts.next().unwrap_or_default();
    let bad =
        || format!("--arg {name}={text}: expected `{d}[len]` or a .npy file, then `:zeros` and `:symm` if wanted");
    let (mut init, mut symmetric) = (Init::Random, false);
    for m in parts {
        match m {
            "zeros" => init = Init::Zeros,
            "random" => init = Init::Random,
            "symm" => symmetric = true,
            _ => return Err(bad()),
        }
    }
    let len = if spec.ends_with(".npy") {
        // Its length from the file (rank 0's, where the name has `{rank}`).
        let path = spec.replace("{rank}", "0");
        let file = std::fs::read(&path).map_err(|e| format!("--arg {name}={path}: {e}"))?;
        let bytes = npy::read(d, &file).map_err(|e| format!("--arg {name}={path}: {e}"))?;
        init = Init::File(spec.to_string());
        bytes.len() / d.size_bytes() as usize
    } else {
        let (ty, len) = spec.strip_suffix(']').and_then(|s| s.split_once('[')).ok_or_else(bad)?;
        let ty = DType::parse(ty).ok_or_else(bad)?;
        if ty != d {
            return Err(format!("--arg {name}={text}: the parameter points to `{d}`, not `{ty}`"));
        }
        len.parse().map_err(|_| bad())?
    };
    Ok(ArgValue::Buffer { name: name.to_string(), dtype: d, len, init, symmetric })
}

/// Writes `bytes` as `DIR/NAME.npy` and says so.
pub(crate) fn write_npy(dir: &std::path::Path, name: &str, dtype: DType, bytes: &[u8]) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let path = dir.join(format!("{name}.npy"));
    std::fs::write(&path, npy::write(dtype, bytes)).map_err(|e| format!("writing {}: {e}", path.display()))?;
    println!(
        "wrote {} ({} x {dtype}: {}, ..)",
        path.display(),
        bytes.len() / dtype.size_bytes() as usize,
        npy::preview(dtype, bytes, 4)
    );
    Ok(())
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
    let mut values = Vec::new();
    for p in &func.params {
        let Some((_, v)) = given.iter().find(|(n, _)| *n == p.name) else {
            return usage(format!("parameter `{}: {}` has no --arg", p.name, func.ty(p.value)));
        };
        let r = match func.ty(p.value).elem {
            Elem::Num(d) => scalar_arg(&p.name, d, v),
            Elem::Ptr(d) => buffer(&p.name, d, v),
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
    if a.world.is_some() || a.processes {
        return crate::run_world::main(&a, desc, func, grid, values);
    }
    if let Some(v) = values.iter().find(|v| matches!(v, ArgValue::Buffer { symmetric: true, .. })) {
        return usage(format!("{v:?}: `:symm` needs a world (--world N, or --processes)"));
    }
    let initial: Vec<Option<Vec<u8>>> = match values
        .iter()
        .map(|v| match v {
            ArgValue::Buffer { .. } => v.bytes(0, a.seed).map(Some),
            ArgValue::Scalar { .. } => Ok(None),
        })
        .collect::<Result<_, _>>()
    {
        Ok(b) => b,
        Err(e) => return usage(e),
    };

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
        for (v, bytes) in values.iter().zip(&initial) {
            bufs.push(match (v, bytes) {
                (ArgValue::Buffer { name, .. }, Some(bytes)) => Some(dev.alloc(bytes.len().max(1), name)?),
                _ => None,
            });
        }
        let opts = LaunchOptions { seed: a.seed, ..LaunchOptions::default() };
        let mut times = Vec::new();
        for call in 1..=a.repeat + 1 {
            let mut kargs = Vec::new();
            for ((v, bytes), buf) in values.iter().zip(&initial).zip(&bufs) {
                match (bytes, buf) {
                    (Some(bytes), Some(buf)) => {
                        dev.write(buf, 0, bytes)?;
                        kargs.push(buf.arg());
                    }
                    _ => kargs.push(v.scalar(0, 1, call).map_err(trident_core::backend::BackendError::Host)?),
                }
            }
            let t = Instant::now();
            dev.launch(&art, grid, &kargs, &opts)?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        for ((v, bytes), buf) in values.iter().zip(&initial).zip(&bufs) {
            if let (ArgValue::Buffer { name, dtype, .. }, Some(bytes), Some(buf)) = (v, bytes, buf) {
                let mut after = vec![0u8; bytes.len()];
                dev.read(buf, 0, &mut after)?;
                if after != *bytes {
                    write_npy(&a.out, name, *dtype, &after).map_err(trident_core::backend::BackendError::Host)?;
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
