//! The conformance cases: kernel x dtype x shape (x variant), each with its bound, its inputs
//! drawn from the run's seed, its f64 reference, poisoned outputs and a normwise check.

use crate::host::{case_rng, decode, encode, poison, random};
use crate::reference;
use serde::Serialize;
use std::time::Instant;
use trident_core::backend::{Backend, BackendError, Buffer, Device, LaunchOptions};
use trident_core::ir::{DType, InputPrecision};
use trident_kernels::Launcher;
use trident_kernels::{gemm::Gemm, softmax::Softmax, splitk_gemm::SplitKGemm, vector_add::VectorAdd};

/// Element types every kernel is checked in.
pub const DTYPES: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

#[derive(Clone, Debug)]
pub struct Case {
    pub kernel: &'static str,
    /// A kernel's sub-configuration (`dot` precision for f32 GEMM), or `-`.
    pub variant: &'static str,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Ranks (1 for single-device kernels).
    pub world: usize,
    /// Whether the kernel runs in a world (even of one rank).
    pub distributed: bool,
}

impl Case {
    pub fn shape_text(&self) -> String {
        self.shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x")
    }
}

/// One case's outcome: one JSON record.
#[derive(Clone, Debug, Serialize)]
pub struct Record {
    pub backend: String,
    pub kernel: String,
    pub variant: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub world: usize,
    pub seed: u64,
    /// Schedules the case ran under (chaos mode runs distributed cases several times).
    pub schedules: usize,
    pub failed_schedules: usize,
    pub error: Option<f64>,
    pub bound: f64,
    pub pass: bool,
    pub time_ms: f64,
    /// The backend cannot compile the kernel yet (not a failure; the message says why).
    pub skipped: bool,
    /// Why a case failed or was skipped (empty when it passed).
    pub message: String,
}

/// Every case, in a stable order (the order defines per-case seeds). Distributed kernels run
/// at the standard world sizes, or at `world` alone when one is given (any size a world takes).
pub fn all_cases(world: Option<usize>) -> Vec<Case> {
    let worlds: Vec<usize> = world.map_or_else(|| crate::distributed::WORLDS.to_vec(), |w| vec![w]);
    let mut cases = Vec::new();
    for dtype in DTYPES {
        for n in [1, 100, 1024, 4099, 65536] {
            cases.push(Case {
                kernel: "vector_add",
                variant: "-",
                dtype,
                shape: vec![n],
                world: 1,
                distributed: false,
            });
        }
        for (r, c) in [(1, 1), (4, 100), (37, 781), (128, 1024), (3, 4096)] {
            cases.push(Case {
                kernel: "softmax",
                variant: "-",
                dtype,
                shape: vec![r, c],
                world: 1,
                distributed: false,
            });
        }
        let variants: &[&'static str] =
            if dtype == DType::F32 { &["ieee", "tf32", "bf16x3"] } else { GEMM_16BIT_VARIANTS };
        for &variant in variants {
            // Shapes off the tile; the last three divisible by 16 in N and K but not by the tile
            // (the descriptor/TMA path on sm_90a, whose copies read the edges' zeros themselves;
            // the last on its 128x256 tiles, two per persistent program on cpu-simt, whose TMA
            // store beside a 4-stage ring goes out half a block at a time).
            for s in [
                [1, 1, 1],
                [64, 64, 64],
                [100, 70, 33],
                [129, 65, 257],
                [17, 300, 64],
                [256, 256, 256],
                [70, 144, 208],
                [130, 272, 96],
                [272, 512, 128],
            ] {
                cases.push(Case { kernel: "gemm", variant, dtype, shape: s.to_vec(), world: 1, distributed: false });
            }
        }
        for s in [[1, 1, 1, 2], [64, 64, 256, 4], [50, 70, 300, 3], [33, 33, 1000, 8]] {
            cases.push(Case {
                kernel: "splitk_gemm",
                variant: "-",
                dtype,
                shape: s.to_vec(),
                world: 1,
                distributed: false,
            });
        }
    }
    for dtype in DTYPES {
        for &(kernel, variants) in crate::distributed::KERNELS {
            for &variant in variants {
                for &world in &worlds {
                    for shape in crate::distributed::shapes(kernel, world) {
                        cases.push(Case { kernel, variant, dtype, shape: shape.clone(), world, distributed: true });
                    }
                }
            }
        }
    }
    cases
}

/// The 16-bit GEMM's cases: the heuristic's schedule, then the same tiles with a producer warp,
/// as a persistent loop, and as a persistent loop with a producer warp (sm_90a with TMA; the
/// same kernel as the first elsewhere).
const GEMM_16BIT_VARIANTS: &[&str] = &["f32acc", "f32acc-ws", "f32acc-persistent", "f32acc-ws-persistent"];

/// The accepted normwise error for a dtype (and `dot` precision), scaled for long reductions.
pub fn bound(dtype: DType, variant: &str, reduction_len: usize) -> f64 {
    let base = match (dtype, variant) {
        // Worst case of one product of two rounded inputs (2u + u^2), so that a 1x1x1 problem,
        // where nothing averages out, cannot exceed it: tf32 u = 2^-11, bf16x3 leaves ~2^-16.
        (DType::F32, "tf32") => 1e-3,
        (DType::F32, "bf16x3") => 3e-5,
        (_, "exact") => 0.0,
        (DType::F32, _) => 1e-6,
        (DType::F16, _) => 2e-3,
        (DType::BF16, _) => 1e-2,
        _ => 1e-12,
    };
    base * (reduction_len as f64 / 256.0).sqrt().max(1.0)
}

/// Inputs, expected output and the output buffer's size, for one case.
struct Prepared {
    inputs: Vec<Vec<f64>>,
    expected: Vec<f64>,
    reduction_len: usize,
}

fn prepare(case: &Case, rng: &mut rand::rngs::StdRng) -> Prepared {
    let d = case.dtype;
    match case.kernel {
        "vector_add" => {
            let n = case.shape[0];
            let (x, y) = (random(n, d, rng), random(n, d, rng));
            Prepared { expected: reference::vector_add(&x, &y), inputs: vec![x, y], reduction_len: 1 }
        }
        "softmax" => {
            let (r, c) = (case.shape[0], case.shape[1]);
            let x: Vec<f64> = random(r * c, d, rng).iter().map(|v| v * 4.0).collect();
            Prepared { expected: reference::softmax(&x, r, c), inputs: vec![x], reduction_len: c }
        }
        _ => {
            let (m, n, k) = (case.shape[0], case.shape[1], case.shape[2]);
            let (a, b) = (random(m * k, d, rng), random(k * n, d, rng));
            Prepared { expected: reference::gemm(&a, &b, m, n, k), inputs: vec![a, b], reduction_len: k }
        }
    }
}

fn upload(device: &dyn Device, name: &str, values: &[f64], d: DType) -> Result<Buffer, BackendError> {
    let bytes = encode(values, d);
    let buf = device.alloc(bytes.len().max(1), name)?;
    device.write(&buf, 0, &bytes)?;
    Ok(buf)
}

/// Runs the case's kernel through its host orchestration; returns the output buffer.
fn execute(
    case: &Case,
    backend: &dyn Backend,
    device: &dyn Device,
    p: &Prepared,
    opts: &LaunchOptions,
    target: Option<String>,
) -> Result<Buffer, BackendError> {
    let mut l = Launcher::new(backend, device, *opts);
    l.target = target;
    let d = case.dtype;
    let ins: Vec<Buffer> =
        p.inputs.iter().enumerate().map(|(i, v)| upload(device, &format!("in{i}"), v, d)).collect::<Result<_, _>>()?;
    let out = device.alloc((p.expected.len() * d.size_bytes() as usize).max(1), "out")?;
    device.fill(&out, &poison(d))?;
    match case.kernel {
        "vector_add" => VectorAdd { dtype: d, block: 256 }.run(&l, &ins[0], &ins[1], &out, case.shape[0])?,
        "softmax" => {
            let (r, c) = (case.shape[0], case.shape[1]);
            Softmax::for_cols(d, c).run(&l, &ins[0], &out, r, c)?
        }
        "gemm" => {
            let precision = InputPrecision::parse(case.variant).unwrap_or(InputPrecision::Ieee);
            let mnk = (case.shape[0], case.shape[1], case.shape[2]);
            let g = Gemm::for_problem(d, l.gpu_target(), mnk.0).with_precision(precision);
            // The schedules the heuristic does not pick on its own, on targets where they exist
            // (elsewhere the attribute changes nothing and the case repeats the plain one).
            let g = match case.variant {
                "f32acc-ws" => Gemm { warp_specialize: true, ..g },
                "f32acc-persistent" => Gemm { persistent: true, ..g },
                "f32acc-ws-persistent" => Gemm { warp_specialize: true, persistent: true, ..g },
                _ => g,
            };
            g.run(&l, &ins[0], &ins[1], &out, mnk)?
        }
        "splitk_gemm" => {
            let (m, n, k, splits) = (case.shape[0], case.shape[1], case.shape[2], case.shape[3]);
            let g = SplitKGemm::new(d, splits as u32);
            let ws = g.workspace(device, m, n)?;
            // Twice: the second call checks that the kernel left its workspace clean.
            g.run(&l, &ins[0], &ins[1], &out, &ws, (m, n, k))?;
            device.fill(&out, &poison(d))?;
            g.run(&l, &ins[0], &ins[1], &out, &ws, (m, n, k))?;
        }
        other => return Err(BackendError::Host(format!("no conformance driver for kernel `{other}`"))),
    }
    Ok(out)
}

/// Runs one case and checks it; a distributed case runs under `schedules` different schedules
/// (chaos mode) and passes only if every one of them does.
/// How the suite runs: backend, target, schedules per distributed case, race detection.
pub struct RunConfig<'a> {
    pub backend: &'a dyn Backend,
    pub target: Option<String>,
    pub schedules: usize,
    pub race: bool,
    /// Run on every kernel compiled, in worlds too (`--backend amd`: the code object checks).
    pub compile_check: Option<trident_core::backend::CompileCheck>,
    /// Where distributed cases run instead of the backend's own world (`--processes`).
    pub world: Option<crate::distributed::WorldKind>,
    /// Every distributed kernel compiled with all its communication at inter-node scope.
    pub inter_node: bool,
}

pub fn run_case(case: &Case, index: usize, seed: u64, cfg: &RunConfig) -> Record {
    let (backend, schedules, race) = (cfg.backend, cfg.schedules, cfg.race);
    let mut rng = case_rng(seed, index);
    let mut record = Record {
        backend: backend.descriptor().name.to_string(),
        kernel: case.kernel.to_string(),
        variant: case.variant.to_string(),
        dtype: case.dtype.to_string(),
        shape: case.shape.clone(),
        world: case.world,
        seed,
        schedules: 1,
        failed_schedules: 0,
        error: None,
        bound: 0.0,
        pass: false,
        time_ms: 0.0,
        skipped: false,
        message: String::new(),
    };
    let start = Instant::now();
    // The SIMT lowering runs in the CPU world for the requested GPU target.
    let simt_target = match backend.descriptor().name {
        "cpu-simt" => backend.descriptor().resolve_target(cfg.target.as_deref()).ok(),
        _ => None,
    };
    let kind = match backend.descriptor().name {
        _ if cfg.world.is_some() => cfg.world.clone(),
        "nvidia" => Some(crate::distributed::WorldKind::Gpu { peer: false }),
        "cpu" | "cpu-simt" => {
            Some(crate::distributed::WorldKind::Cpu { race, simt_target, compile_check: cfg.compile_check.clone() })
        }
        _ => None,
    };
    if case.distributed && kind.is_none() {
        record.skipped = true;
        record.message = format!("backend `{}` has no world of ranks yet", backend.descriptor().name);
    } else if let (true, Some(kind)) = (case.distributed, kind) {
        let data = std::sync::Arc::new(crate::distributed::prepare(case, &mut rng));
        let exact = if matches!(case.kernel, "allgather" | "ring_shift") { "exact" } else { case.variant };
        record.bound = bound(case.dtype, exact, data.reduction_len);
        let expected: Vec<f64> = data.expected.concat();
        record.schedules = schedules.max(1);
        record.pass = true;
        let mut worst = 0.0f64;
        for s in 0..record.schedules {
            let schedule_seed = seed ^ (index as u64).rotate_left(17) ^ (s as u64).wrapping_mul(0xA076_1D64_78BD_642F);
            let outcome = crate::distributed::execute(case, data.clone(), schedule_seed, kind.clone(), cfg.inter_node)
                .map(|outs| outs.concat());
            match judge(outcome, &expected, record.bound) {
                Ok(err) => worst = worst.max(err),
                Err((err, message)) => {
                    record.failed_schedules += 1;
                    if record.pass {
                        record.message = format!("schedule {s} (seed {schedule_seed:#x}): {message}");
                    }
                    record.pass = false;
                    if let Some(e) = err {
                        worst = worst.max(e);
                    }
                }
            }
        }
        record.error = Some(worst);
    } else {
        let p = prepare(case, &mut rng);
        record.bound = bound(case.dtype, case.variant, p.reduction_len);
        let opts = LaunchOptions { seed: seed ^ index as u64, ..LaunchOptions::default() };
        let outcome = backend.open_device(0).and_then(|device| {
            let out = execute(case, backend, device.as_ref(), &p, &opts, cfg.target.clone())?;
            let mut bytes = vec![0u8; p.expected.len() * case.dtype.size_bytes() as usize];
            device.read(&out, 0, &mut bytes)?;
            Ok(decode(&bytes, case.dtype))
        });
        match judge(outcome, &p.expected, record.bound) {
            Ok(err) => {
                record.error = Some(err);
                record.pass = true;
            }
            Err((err, message)) => {
                record.error = err;
                record.skipped = message.contains("not supported by the SIMT lowering yet");
                record.message = message;
            }
        }
    }
    record.time_ms = start.elapsed().as_secs_f64() * 1e3;
    record
}

/// The normwise error if within `bound`, else the error (if any) and what went wrong.
fn judge(outcome: Result<Vec<f64>, BackendError>, expected: &[f64], bound: f64) -> Result<f64, (Option<f64>, String)> {
    let out = outcome.map_err(|e| (None, e.to_string()))?;
    if out.len() != expected.len() {
        return Err((None, format!("{} output elements, expected {}", out.len(), expected.len())));
    }
    match reference::normwise_error(&out, expected) {
        Err(i) => Err((None, format!("output element {i} is {} (not written, or not finite)", out[i]))),
        Ok(err) if err <= bound => Ok(err),
        Ok(err) => Err((Some(err), format!("error {err:.3e} exceeds bound {bound:.1e}"))),
    }
}
