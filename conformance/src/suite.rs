//! The conformance suite: every registered operation (`crate::registry`) x dtype x shape (x
//! variant, x world size), each with its bound, its inputs drawn from the run's seed, its f64
//! reference, poisoned outputs and a normwise check.

use crate::host::{case_rng, decode, encode, poison};
use crate::reference;
use crate::registry::{operations, Operation, WorldData};
use serde::Serialize;
use std::time::Instant;
use trident_core::backend::{Backend, BackendError, Buffer, Device, LaunchOptions};
use trident_core::ir::DType;
use trident_kernels::DeviceCtx;

/// Element types every kernel is checked in.
pub const DTYPES: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

/// World sizes every distributed operation runs at.
pub const WORLDS: [usize; 4] = [1, 2, 4, 8];

#[derive(Clone)]
pub struct Case {
    /// The operation whose case this is.
    pub op: &'static dyn Operation,
    /// Its name.
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

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {} {} world {}", self.kernel, self.variant, self.dtype, self.shape_text(), self.world)
    }
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

/// Every case, in a stable order (the order defines per-case seeds): the single-device
/// operations, then the distributed ones at the standard world sizes, or at `world` alone when
/// one is given (any size a world takes).
pub fn all_cases(world: Option<usize>) -> Vec<Case> {
    let worlds: Vec<usize> = world.map_or_else(|| WORLDS.to_vec(), |w| vec![w]);
    let ops = operations();
    let mut cases = Vec::new();
    for distributed in [false, true] {
        for dtype in DTYPES {
            for &op in ops.iter().filter(|o| o.distributed() == distributed) {
                for &variant in op.variants(dtype) {
                    for &world in if distributed { worlds.as_slice() } else { &[1] } {
                        for shape in op.shapes(world) {
                            let kernel = op.name();
                            cases.push(Case { op, kernel, variant, dtype, shape, world, distributed });
                        }
                    }
                }
            }
        }
    }
    cases
}

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

fn upload(device: &dyn Device, name: &str, values: &[f64], d: DType) -> Result<Buffer, BackendError> {
    let bytes = encode(values, d);
    let buf = device.alloc(bytes.len().max(1), name)?;
    device.write(&buf, 0, &bytes)?;
    Ok(buf)
}

/// Runs a single-device case through its operation; returns the output buffer.
fn execute(
    case: &Case,
    backend: &dyn Backend,
    device: &dyn Device,
    p: &WorldData,
    opts: &LaunchOptions,
    target: Option<String>,
) -> Result<Buffer, BackendError> {
    let mut l = DeviceCtx::new(backend, device, *opts);
    l.target = target;
    let d = case.dtype;
    let types = case.op.input_types(case, p.inputs[0].len());
    let ins: Vec<Buffer> = p.inputs[0]
        .iter()
        .zip(&types)
        .enumerate()
        .map(|(i, (v, t))| upload(device, &format!("in{i}"), v, *t))
        .collect::<Result<_, _>>()?;
    let out = device.alloc((p.expected[0].len() * d.size_bytes() as usize).max(1), "out")?;
    device.fill(&out, &poison(d))?;
    case.op.run_device(case, &l, &ins, &out)?;
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
    /// How each distributed case makes its calls: two on the same buffers (both halves of every
    /// double buffer), or one recorded and replayed (`--replay N`).
    pub calls: crate::distributed::Calls,
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
        let data = std::sync::Arc::new(case.op.prepare(case, &mut rng));
        record.bound = case.op.bound(case, data.reduction_len) + data.slack;
        let expected: Vec<f64> = data.expected.concat();
        record.schedules = schedules.max(1);
        record.pass = true;
        let mut worst = 0.0f64;
        for s in 0..record.schedules {
            let schedule_seed = seed ^ (index as u64).rotate_left(17) ^ (s as u64).wrapping_mul(0xA076_1D64_78BD_642F);
            let outcome =
                crate::distributed::execute(case, data.clone(), schedule_seed, kind.clone(), cfg.inter_node, cfg.calls);
            // Every call's outputs over the ranks, judged in turn: the first failure, or the
            // worst error.
            let judged = match outcome {
                Err(e) if e.to_string().contains("not capturable") => {
                    (record.skipped, record.pass, record.message) = (true, false, e.to_string());
                    break;
                }
                Err(e) => judge(Err(e), &expected, record.bound),
                Ok(ranks) => (0..cfg.calls.count())
                    .try_fold(0.0f64, |worst, c| {
                        let out: Vec<f64> = ranks.iter().flat_map(|r| r.get(c).cloned().unwrap_or_default()).collect();
                        let prefix = match cfg.calls {
                            crate::distributed::Calls::Rearmed(_) => "after the re-arm, ",
                            _ => "",
                        };
                        judge(Ok(out), &expected, record.bound)
                            .map(|e| worst.max(e))
                            .map_err(|(e, m)| (e, format!("{prefix}call {} of {}: {m}", c + 1, cfg.calls.count())))
                    })
                    .and_then(|worst| match cfg.calls {
                        // The planted timeout must have happened: some rank's wait timed out.
                        crate::distributed::Calls::Rearmed(_)
                            if case.world > 1 && !ranks.iter().any(|r| r.last().is_some_and(|t| t == &[1.0])) =>
                        {
                            Err((None, "no rank's wait timed out when the last rank skipped a call".to_string()))
                        }
                        _ => Ok(worst),
                    }),
            };
            match judged {
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
        let p = case.op.prepare(case, &mut rng);
        record.bound = case.op.bound(case, p.reduction_len) + p.slack;
        let opts = LaunchOptions { seed: seed ^ index as u64, ..LaunchOptions::default() };
        let outcome = backend.open_device(0).and_then(|device| {
            let out = execute(case, backend, device.as_ref(), &p, &opts, cfg.target.clone())?;
            let mut bytes = vec![0u8; p.expected[0].len() * case.dtype.size_bytes() as usize];
            device.read(&out, 0, &mut bytes)?;
            Ok(decode(&bytes, case.dtype))
        });
        match judge(outcome, &p.expected[0], record.bound) {
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
