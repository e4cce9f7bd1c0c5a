//! `cargo xtask emit`: prints a kernel's code for a backend and target, optionally timed.

use std::process::ExitCode;
use std::time::Instant;
use trident_conformance::cli::{self, usage};
use trident_core::ir::DType;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[arg(long, default_value = "nvidia")]
    backend: String,
    /// Target of the backend (default: its first).
    #[arg(long)]
    target: Option<String>,
    /// Kernel name (see --list).
    #[arg(long, default_value = "vector_add")]
    kernel: String,
    /// A kernel in the text format instead of a library kernel.
    #[arg(long, conflicts_with = "kernel")]
    file: Option<std::path::PathBuf>,
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// What to print: `tile` (the text IR), `simt` (the SIMT program a GPU writer translates:
    /// lowered for the target, protocol expanded), or `code` (the backend's output).
    #[arg(long, default_value = "code", value_parser = ["tile", "simt", "code"])]
    stage: String,
    /// With `--backend amd`: print the AMDGCN disassembly of the code object.
    #[arg(long)]
    asm: bool,
    /// Print the time from tile IR to code (median of 20 compiles) instead of the code.
    #[arg(long)]
    time: bool,
    /// With `--kernel gemm` or `ag_gemm`: the configuration `BMxBNxBK/Ww/Ss` (as `trident bench` prints it),
    /// specialized for arguments divisible by 16.
    #[arg(long)]
    config: Option<String>,
    /// With `--config`: A and B read through tensor descriptors (TMA copies on sm_90a), as the
    /// library's GEMM does where the target has TMA.
    #[arg(long, requires = "config")]
    descriptors: bool,
    /// With `--descriptors`: a producer warp issues the TMA copies (warp specialization).
    #[arg(long, requires = "descriptors")]
    warp_specialize: bool,
    /// With `--config`: the persistent GEMM (one program per multiprocessor walking the tiles).
    #[arg(long, requires = "config")]
    persistent: bool,
    /// With `--descriptors`: C written through a descriptor (a TMA store on sm_90a).
    #[arg(long, requires = "descriptors")]
    tma_store: bool,
    /// With `--warp-specialize` and `--persistent`: consumer ping-pong, two groups of the
    /// configuration's warps taking the tiles in turn (`LaunchAttrs::pingpong`; 128x128x64/4w).
    #[arg(long, requires_all = ["warp_specialize", "persistent"])]
    pingpong: bool,
    /// Every communication op at inter-node scope (`LaunchAttrs::inter_node`: calls of
    /// NVSHMEM's device functions).
    #[arg(long)]
    inter_node: bool,
    /// Compile the kernel with a timeline (`trident_core::trace::instrument`: one more
    /// parameter, the trace buffer, and the events the lowering records in it).
    #[arg(long)]
    trace: bool,
    /// List kernel names.
    #[arg(long)]
    list: bool,
    /// Write the code of every kernel x f32/bf16/f16 that the backend compiles into this folder
    /// (one file each), listing the ones it cannot compile yet.
    #[arg(long)]
    all_to: Option<std::path::PathBuf>,
}

/// A GEMM of configuration `BMxBNxBK/Ww/Ss`.
fn gemm_config(text: &str, dtype: DType) -> Result<trident_kernels::gemm::Gemm, String> {
    let bad = || format!("--config {text}: expected BMxBNxBK/Ww/Ss, like 128x256x64/8w/3s");
    let (tile, rest) = text.split_once('/').ok_or_else(bad)?;
    let (w, s) = rest.split_once('/').ok_or_else(bad)?;
    let dims: Vec<u32> = tile.split('x').map(|x| x.parse().map_err(|_| bad())).collect::<Result<_, _>>()?;
    let num = |x: &str, suffix: char| x.strip_suffix(suffix).and_then(|v| v.parse::<u32>().ok()).ok_or_else(bad);
    let [bm, bn, bk] = dims[..] else { return Err(bad()) };
    Ok(trident_kernels::gemm::Gemm {
        block_m: bm,
        block_n: bn,
        block_k: bk,
        warps: num(w, 'w')?,
        stages: num(s, 's')?,
        divisible: true,
        ..trident_kernels::gemm::Gemm::new(dtype)
    })
}

/// `trident emit`: a kernel's code, as `a` says.
pub fn main(a: Args) -> ExitCode {
    let Some(dtype) = DType::parse(&a.dtype) else {
        return usage(format!("--dtype {}: not an element type", a.dtype));
    };
    if let Some(dir) = &a.all_to {
        return emit_all(&a, dir);
    }
    let cat = trident_kernels::catalogue(dtype);
    if a.list {
        for (n, _) in &cat {
            println!("{n}");
        }
        return ExitCode::SUCCESS;
    }
    // Usage errors (exit 2) before any work: the backend, its target, the kernel.
    let d = match cli::backend(&a.backend, a.target.as_deref()) {
        Ok(d) => d,
        Err(e) => return usage(e),
    };
    let built = match &a.file {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(text) => trident_core::text::parse(&text).map_err(|e| format!("{}: {e}", path.display())),
            Err(e) => return usage(format!("{}: {e}", path.display())),
        },
        None if a.config.is_some() => match gemm_config(a.config.as_deref().unwrap_or(""), dtype) {
            Ok(g) => match trident_kernels::gemm_based().into_iter().find(|c| c.name == a.kernel) {
                Some(based) => (based.build)(trident_kernels::gemm::Gemm {
                    descriptors: a.descriptors,
                    warp_specialize: a.warp_specialize,
                    persistent: a.persistent,
                    tma_store: a.tma_store,
                    pingpong: a.pingpong,
                    ..g
                })
                .map_err(|e| e.to_string()),
                None => {
                    let names: Vec<&str> = trident_kernels::gemm_based().iter().map(|c| c.name).collect();
                    return usage(format!(
                        "--config applies to the kernels built around a GEMM ({}), not `{}`",
                        names.join(", "),
                        a.kernel
                    ));
                }
            },
            Err(e) => return usage(e),
        },
        None => match cat.into_iter().find(|(n, _)| *n == a.kernel) {
            Some((_, built)) => built.map_err(|e| e.to_string()),
            None => return usage(format!("no kernel `{}` (try --list)", a.kernel)),
        },
    };
    let result = {
        let mut func = match built {
            Ok(f) => f,
            Err(e) => return usage(e),
        };
        func.attrs.inter_node |= a.inter_node;
        if a.trace {
            func = trident_core::trace::instrument(func);
        }
        let b = (d.create)();
        (|| -> Result<String, String> {
            if a.backend == "amd" && (a.time || a.asm) {
                let name = a.target.as_deref().unwrap_or(d.target_names()[0]);
                let t = trident_core::target::lookup(name).map_err(|e| e.to_string())?;
                let tools = trident_backend_amd::codeobj::tools().map_err(|e| e.to_string())?;
                if a.asm {
                    let m = trident_backend_amd::AmdBackend::compile_checked(&func, t).map_err(|e| e.to_string())?;
                    return trident_backend_amd::codeobj::disassemble(&tools, &m.code_object, name)
                        .map_err(|e| e.to_string());
                }
                let median = |f: &mut dyn FnMut() -> Result<(), String>, n: usize| -> Result<f64, String> {
                    let mut v = Vec::new();
                    for _ in 0..n {
                        let s = Instant::now();
                        f()?;
                        v.push(s.elapsed().as_secs_f64() * 1e3);
                    }
                    v.sort_by(|x, y| x.total_cmp(y));
                    Ok(v[n / 2])
                };
                let ir_ms = median(
                    &mut || trident_backend_amd::AmdBackend::llvm_ir(&func, t).map(|_| ()).map_err(|e| e.to_string()),
                    20,
                )?;
                let (k, ir) = trident_backend_amd::AmdBackend::llvm_ir(&func, t).map_err(|e| e.to_string())?;
                let co_ms = median(
                    &mut || {
                        trident_backend_amd::codeobj::code_object_uncached(&tools, &ir, &k.name, name)
                            .map(|_| ())
                            .map_err(|e| e.to_string())
                    },
                    3,
                )?;
                return Ok(format!(
                    "{}: tile IR -> LLVM IR ({name}) in {ir_ms:.3} ms (median of 20); LLVM IR -> code object (llc -O3 + ld.lld) in {co_ms:.1} ms (median of 3)",
                    func.name
                ));
            }
            if a.time {
                let mut times = Vec::new();
                for _ in 0..20 {
                    let t = Instant::now();
                    b.compile(&func, a.target.as_deref()).map_err(|e| e.to_string())?;
                    times.push(t.elapsed().as_secs_f64() * 1e3);
                }
                times.sort_by(|x, y| x.total_cmp(y));
                // On a machine with a CUDA driver: the driver's PTX -> cubin JIT beside it.
                let jit = if d.name == "nvidia" {
                    let ptx = b.compile(&func, a.target.as_deref()).map_err(|e| e.to_string())?.text;
                    match trident_backend_nvidia::runtime::CudaDevice::open(0) {
                        Ok(dev) => {
                            let mut v = Vec::new();
                            for _ in 0..3 {
                                v.push(dev.jit_ms(&ptx).map_err(|e| e.to_string())?);
                            }
                            v.sort_by(|x, y| x.total_cmp(y));
                            format!("; PTX -> cubin (driver JIT) in {:.1} ms (median of 3)", v[1])
                        }
                        Err(_) => String::new(),
                    }
                } else {
                    String::new()
                };
                Ok(format!(
                    "{}: tile IR -> {} {} in {:.3} ms (median of 20){jit}",
                    func.name,
                    d.name,
                    a.target.as_deref().unwrap_or(d.target_names()[0]),
                    times[10]
                ))
            } else if a.stage == "tile" {
                Ok(trident_core::text::print(&func))
            } else if a.stage == "simt" {
                let name = a.target.as_deref().unwrap_or(d.target_names()[0]);
                let t = trident_core::target::lookup(name).map_err(|e| {
                    format!("--stage simt needs a GPU target; backend `{}` target `{name}`: {e}", d.name)
                })?;
                trident_core::verify(&func).map_err(|e| e.to_string())?;
                let mut k = trident_core::simt::lower(&func, t).map_err(|e| e.to_string())?;
                trident_core::simt::protocol::expand(&mut k);
                Ok(k.to_string())
            } else {
                b.compile(&func, a.target.as_deref()).map(|art| art.text).map_err(|e| e.to_string())
            }
        })()
    };
    match result {
        Ok(text) => {
            // A closed pipe (`| head`) ends the output quietly.
            use std::io::Write;
            let _ = writeln!(std::io::stdout().lock(), "{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn emit_all(a: &Args, dir: &std::path::Path) -> ExitCode {
    let desc = match cli::backend(&a.backend, a.target.as_deref()) {
        Ok(d) => d,
        Err(e) => return usage(e),
    };
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("error: creating {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    let b = (desc.create)();
    let (mut written, mut skipped) = (0, 0);
    for d in [DType::F32, DType::BF16, DType::F16] {
        for (name, built) in trident_kernels::catalogue(d) {
            let r = built.map_err(|e| e.to_string()).and_then(|f| {
                let art = b.compile(&f, a.target.as_deref()).map_err(|e| e.to_string())?;
                // On nvidia, communicating kernels also with their communication at inter-node
                // scope (calls of NVSHMEM's device functions: assembled as relocatable code).
                let mut inter = f.clone();
                inter.attrs.inter_node = true;
                let inter = match desc.name {
                    "nvidia" => b
                        .compile(&inter, a.target.as_deref())
                        .ok()
                        .map(|x| x.text)
                        .filter(|t| t.contains("call nvshmem")),
                    _ => None,
                };
                // On nvidia, bf16 kernels also compiled with a timeline (`trace::instrument`).
                let traced = match (desc.name, d) {
                    ("nvidia", DType::BF16) => Some(
                        b.compile(&trident_core::trace::instrument(f), a.target.as_deref())
                            .map_err(|e| e.to_string())?
                            .text,
                    ),
                    _ => None,
                };
                Ok((art, inter, traced))
            });
            match r {
                Ok((art, inter, traced)) => {
                    let ext = if desc.name == "amd" { "ll" } else { "ptx" };
                    let mut files = vec![(dir.join(format!("{name}_{d}.{ext}")), art.text)];
                    files.extend(inter.map(|t| (dir.join(format!("{name}_{d}_inter_node.{ext}")), t)));
                    files.extend(traced.map(|t| (dir.join(format!("{name}_{d}_trace.{ext}")), t)));
                    for (path, text) in files {
                        if let Err(e) = std::fs::write(&path, text) {
                            eprintln!("error: writing {}: {e}", path.display());
                            return ExitCode::FAILURE;
                        }
                        written += 1;
                    }
                }
                Err(e) if e.contains("not supported by the SIMT lowering yet") => {
                    println!("skipped {name} {d}: {}", e.rsplit(": ").next().unwrap_or(&e));
                    skipped += 1;
                }
                Err(e) => {
                    eprintln!("error: {name} {d}: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    println!("emitted {written} kernels into {}, {skipped} skipped (not lowered yet)", dir.display());
    ExitCode::SUCCESS
}
