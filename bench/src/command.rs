//! `trident bench`: times the library's kernels on the GPU with the vendor's events (through the
//! shared runtime's `Driver`: CUDA or HIP) and compares them with a baseline measured in the same
//! run (cuBLAS or rocBLAS/hipBLASLt under PyTorch, through `bench/baseline.py`), next to the
//! roofline. Every timed kernel is first checked against an f64 host reference on
//! fresh random inputs with poisoned outputs.
//!
//! `trident bench --cases` prints the cases (one per line) for the baseline script;
//! `trident bench --baseline FILE --json OUT` runs them.

use rand::{Rng, SeedableRng};
use std::process::ExitCode;

/// A line on stderr above the progress bar, when one is drawn (the sweep's lines come from inside
/// each case).
macro_rules! note {
    ($($t:tt)*) => { trident_conformance::progress::note(&format!($($t)*)) };
}

use std::sync::Arc;
use trident_conformance::host::{decode, encode, poison, random};
use trident_core::backend::{check_launch, Artifact, BackendError, Buffer, Device, KernelArg, LaunchOptions};
use trident_core::ir::DType;
use trident_gpu_runtime::hidden::HiddenBuffers;
use trident_gpu_runtime::Driver;
use trident_kernels::gemm::GemmConfig;
use trident_kernels::scaled_gemm::Scaling;
use trident_kernels::tuning::{Tuned, TuningCache};
use trident_kernels::{gemm::Gemm, softmax::Softmax, vector_add::VectorAdd, DeviceCtx};

/// Dense bf16 matrix FLOP/s and HBM bandwidth of the device, from the vendors' datasheets:
/// H200 SXM (989 TF/s, 4.8 TB/s), MI300X (1307 TF/s, 5.3 TB/s); unknown devices use the H200's.
fn peaks(device: &str) -> (f64, f64) {
    if device.contains("gfx942") || device.contains("MI300") {
        (1307.4e12, 5.3e12)
    } else {
        (989e12, 4.8e12)
    }
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Two JSON reports (two vendors, two commits) side by side, instead of running anything.
    #[arg(long, num_args = 2, value_names = ["A.json", "B.json"])]
    compare: Option<Vec<String>>,
    /// One report (or two side by side) as SVG pictures, one per workload: each case's speed
    /// against its baseline and Triton and the fraction of the roofline floor reached, into
    /// `--plot-dir` (default: `plots` beside the first report), instead of running anything.
    #[arg(long, num_args = 1..=2, value_names = ["REPORT.json", "OTHER.json"])]
    plot: Option<Vec<String>>,
    /// Where `--plot` writes its pictures.
    #[arg(long, requires = "plot")]
    plot_dir: Option<String>,
    /// Print the cases, one per line (`name dtype dims...`), and exit.
    #[arg(long)]
    cases: bool,
    /// Baseline timings (JSON from bench/baseline.py: {"case": ms}).
    #[arg(long)]
    baseline: Option<String>,
    /// Write the results as JSON.
    #[arg(long)]
    json: Option<String>,
    /// Baseline timings measured after trident's run (the same script again): the report
    /// shows both and compares against the faster.
    #[arg(long)]
    baseline_after: Option<String>,
    /// A command that times the vendor baseline (`CMD CASES_FILE OUT_JSON`, like
    /// `python bench/baseline.py`): run before and after trident's timings, in this run.
    #[arg(long)]
    baseline_cmd: Option<String>,
    /// Timed repetitions per case (after two warm-up runs).
    #[arg(long, default_value_t = 20)]
    reps: usize,
    /// Only cases whose key contains this (`gemm bf16`, `8192 8192`).
    #[arg(long)]
    only: Option<String>,
    /// `nvidia` (CUDA events, cuBLAS/PyTorch baseline) or `amd` (HIP; rocBLAS/hipBLASLt
    /// through PyTorch for ROCm, untested: no AMD GPU here).
    #[arg(long, default_value = "nvidia")]
    backend: String,
    /// Time GEMMs of these shapes instead of the catalogue's cases (`bf16:4096x4096x64`,
    /// repeatable): where a figure's time goes, from variants that change one extent.
    #[arg(long = "gemm", value_name = "DTYPE:MxNxK")]
    gemms: Vec<String>,
    /// Only the configurations whose name contains this (`128x256x64/8w/4s/tma-store`,
    /// repeatable; the names are those the sweep prints), in the sweeps of the dense, scaled
    /// and grouped GEMMs.
    #[arg(long = "config")]
    configs: Vec<String>,
    /// Run the distributed cases (AG-GEMM, GEMM-RS, AllReduce, AllGather) in the peer world of
    /// W ranks, one per GPU (`trident_conformance::dist_bench`), against a baseline command
    /// started under torchrun (`bench/baseline_dist.py`: NCCL and cuBLAS through PyTorch).
    #[arg(long, value_name = "W")]
    world: Option<usize>,
    /// With --world: after each case's timing, run it once more with every kernel compiled for
    /// tracing and write each variant's timeline to DIR/<case>/<variant>.json (a Perfetto /
    /// Chrome trace: one process per rank, one track per multiprocessor slot) and .svg.
    #[arg(long, value_name = "DIR", requires = "world")]
    trace: Option<String>,
}

/// What a single-device case times: a typed list, so that a misspelt case is a compile error
/// (its name is only for reports and the baseline's key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Workload {
    VectorAdd,
    Softmax,
    /// Softmax with `fast_math` (`exp` by ex2.approx).
    SoftmaxFast,
    Gemm,
    /// AG-GEMM's GEMM at world 1, every signal set, against the plain GEMM of the same tiles.
    AgGemmW1,
    /// GEMM-RS's GEMM at world 1, against the plain GEMM of the same tiles.
    GemmRsW1,
    /// AG-GEMM against the gather then the GEMM, in a loopback world sharing the GPU.
    AgGemmLoopback,
    /// The FP8 GEMM with scales (`trident_kernels::scaled_gemm`): C (bf16) = (A sa) (B sb)^T,
    /// against `torch._scaled_mm` of the same scaling and accumulation: tensor and row scaling
    /// accumulating the whole K in the tensor cores (`use_fast_accum=True`), or, with `true`,
    /// each K block's product added in f32 (`ScaledGemm::promote`; `use_fast_accum=False`).
    ScaledGemm(Scaling, bool),
    /// The grouped GEMM of a mixture-of-experts layer (`trident_kernels::grouped_gemm`,
    /// contiguous A, B `[E, N, K]`), dims `[experts, n, k, tokens per expert, routing]` (routing
    /// 0 uniform; 1 skewed: one expert takes half the tokens, a quarter of the experts none),
    /// against `torch._grouped_mm`; of FP8 (e4m3) operands with row-wise scales (bf16 out,
    /// the whole K accumulated in the tensor cores), against `torch._scaled_grouped_mm` with
    /// `use_fast_accum`; with a sixth dim of 1, FP8 with DeepSeek-V3's block scales (no
    /// baseline: against the FP8 peak).
    GroupedGemm,
    /// Flash decoding (`trident_kernels::flash_decode`), dims `[B, Nq, Hq, Hkv, D, S]`: every
    /// sequence `S` keys long in a contiguous cache, against `scaled_dot_product_attention`
    /// (GQA) on `[B, H, S, D]` tensors (and FlashAttention's `flash_attn_with_kvcache` where
    /// it is installed). Memory-bound: rated by the cache's bytes against HBM.
    FlashDecode,
}

impl Workload {
    /// The name in reports and in the baseline script's case lines.
    fn name(self) -> &'static str {
        match self {
            Workload::VectorAdd => "vector_add",
            Workload::Softmax => "softmax",
            Workload::SoftmaxFast => "softmax_fast",
            Workload::Gemm => "gemm",
            Workload::AgGemmW1 => "ag_gemm_w1",
            Workload::GemmRsW1 => "gemm_rs_w1",
            Workload::AgGemmLoopback => "ag_gemm_loopback",
            Workload::ScaledGemm(Scaling::Tensor, false) => "scaled_gemm_tensor",
            Workload::ScaledGemm(Scaling::Tensor, true) => "scaled_gemm_tensor_promoted",
            Workload::ScaledGemm(Scaling::Row, false) => "scaled_gemm_row",
            Workload::ScaledGemm(Scaling::Row, true) => "scaled_gemm_row_promoted",
            Workload::ScaledGemm(Scaling::Block, _) => "scaled_gemm_block",
            Workload::GroupedGemm => "grouped_gemm",
            Workload::FlashDecode => "flash_decode",
        }
    }
}

#[derive(Clone, Debug)]
struct Case {
    workload: Workload,
    dtype: DType,
    dims: Vec<usize>,
}

impl Case {
    fn key(&self) -> String {
        let dims: Vec<String> = self.dims.iter().map(|d| d.to_string()).collect();
        format!("{} {} {}", self.workload.name(), self.dtype, dims.join(" "))
    }

    /// Work done: (FLOPs, bytes moved at least once).
    fn work(&self) -> (f64, f64) {
        let s = self.dtype.size_bytes() as f64;
        let d: Vec<f64> = self.dims.iter().map(|&x| x as f64).collect();
        match self.workload {
            Workload::VectorAdd => (d[0], 3.0 * d[0] * s),
            Workload::Softmax | Workload::SoftmaxFast => (5.0 * d[0] * d[1], 2.0 * d[0] * d[1] * s),
            // Every rank's GEMM on the one GPU (a loopback world of d[3] ranks).
            Workload::AgGemmLoopback => {
                (2.0 * d[0] * d[1] * d[2] * d[3], (d[0] * d[2] + d[2] * d[1] + d[0] * d[1]) * s * d[3])
            }
            // The GEMM's: the gather (or the reduction) is not part of what is timed.
            Workload::Gemm | Workload::AgGemmW1 | Workload::GemmRsW1 => {
                (2.0 * d[0] * d[1] * d[2], (d[0] * d[2] + d[2] * d[1] + d[0] * d[1]) * s)
            }
            // FP8 operands, bf16 output (the scales are a rounding error).
            // Every expert's GEMM: T = experts x tokens rows in all; B once per expert.
            // With SwiGLU (6th dimension 2) half the columns are written.
            Workload::GroupedGemm => {
                let t = d[0] * d[3];
                let out = if self.dtype.is_fp8() { 2.0 } else { s };
                let cols = if d.get(5) == Some(&2.0) { d[1] / 2.0 } else { d[1] };
                (2.0 * t * d[1] * d[2], (t * d[2] + d[0] * d[1] * d[2]) * s + t * cols * out)
            }
            Workload::ScaledGemm(..) => (2.0 * d[0] * d[1] * d[2], (d[0] * d[2] + d[2] * d[1]) * s + d[0] * d[1] * 2.0),
            // Q K^T and P V over every key; K and V read once, the queries and outputs besides.
            // A 7th dimension of 8: the cache in 8-bit floats.
            Workload::FlashDecode => {
                let (b, nq, hq, hkv, hd, len) = (d[0], d[1], d[2], d[3], d[4], d[5]);
                let kv = d.get(6).map_or(s, |bits| bits / 8.0);
                (4.0 * b * nq * hq * len * hd, 2.0 * b * len * hkv * hd * kv + 2.0 * b * nq * hq * hd * s)
            }
        }
    }

    /// The largest error the check accepts: the output type's rounding with margin (absolute for
    /// vector_add and softmax, relative to sum |a b| for GEMM).
    fn bound(&self) -> f64 {
        match self.dtype {
            DType::F32 => 1e-6,
            DType::F16 => 2e-3,
            _ => 1e-2,
        }
    }

    /// Whether the case is a GEMM (rated in FLOP/s, bounded by compute).
    fn is_gemm(&self) -> bool {
        !matches!(
            self.workload,
            Workload::VectorAdd | Workload::Softmax | Workload::SoftmaxFast | Workload::FlashDecode
        )
    }

    /// The roofline time in ms: the larger of compute and memory time at the device's peaks.
    fn floor_ms(&self, device: &str) -> f64 {
        let (flops, bytes) = self.work();
        let (peak_flops, peak_bytes) = peaks(device);
        // The tensor cores run FP8 at twice the bf16 rate (H200: 1979 TF/s dense).
        let peak_flops = if self.dtype.is_fp8() { 2.0 * peak_flops } else { peak_flops };
        let compute = if self.is_gemm() { flops / peak_flops } else { 0.0 };
        compute.max(bytes / peak_bytes) * 1e3
    }
}

fn cases() -> Vec<Case> {
    use Workload::*;
    let c = |workload, dtype, dims: &[usize]| Case { workload, dtype, dims: dims.to_vec() };
    vec![
        c(VectorAdd, DType::F32, &[1 << 26]),
        c(Softmax, DType::BF16, &[16384, 4096]),
        // The same with `fast_math` (`exp` by ex2.approx), to show what accuracy costs.
        c(SoftmaxFast, DType::BF16, &[16384, 4096]),
        c(Gemm, DType::BF16, &[4096, 4096, 4096]),
        c(Gemm, DType::BF16, &[8192, 3584, 8192]),
        c(Gemm, DType::BF16, &[8192, 8192, 8192]),
        // Small M at N = K = 8192 (decode-like shapes), then f16.
        c(Gemm, DType::BF16, &[128, 8192, 8192]),
        c(Gemm, DType::BF16, &[256, 8192, 8192]),
        c(Gemm, DType::BF16, &[512, 8192, 8192]),
        c(Gemm, DType::BF16, &[1024, 8192, 8192]),
        c(Gemm, DType::BF16, &[4096, 8192, 8192]),
        c(Gemm, DType::F16, &[4096, 4096, 4096]),
        c(Gemm, DType::F16, &[8192, 3584, 8192]),
        c(Gemm, DType::F16, &[8192, 8192, 8192]),
        // What the overlap machinery costs: AG-GEMM's GEMM (per-chunk waits, rank swizzle) and
        // GEMM-RS's GEMM (epilogue into the owner's buffer, notify) at world 1 with every signal
        // already set, against the plain GEMM of the same tiles in the same run (LLaMA-3.1-70B's
        // per-rank shape at 8 ranks: N = 28672 / 8).
        c(AgGemmW1, DType::BF16, &[8192, 3584, 8192]),
        c(GemmRsW1, DType::BF16, &[8192, 3584, 8192]),
        // AG-GEMM against the gather and then the GEMM, in a loopback world of 4 ranks sharing
        // the GPU (M over all ranks, N and K per rank, ranks): protocol and scheduling costs
        // on real hardware, not communication speed (`trident_conformance::overlap`).
        c(AgGemmLoopback, DType::BF16, &[8192, 3584, 8192, 4]),
        // FP8 (e4m3) GEMMs with scales against `torch._scaled_mm`: per tensor and per row at
        // 4096^3, 8192^3 and a decode-like 128 x 7168 x 7168; DeepSeek-V3's block scales at
        // one of its shapes (M = 4096, N = 7168, K = 2048) and at 4096^3.
        c(ScaledGemm(Scaling::Tensor, false), DType::F8E4M3FN, &[4096, 4096, 4096]),
        c(ScaledGemm(Scaling::Tensor, false), DType::F8E4M3FN, &[8192, 8192, 8192]),
        c(ScaledGemm(Scaling::Tensor, false), DType::F8E4M3FN, &[128, 7168, 7168]),
        c(ScaledGemm(Scaling::Row, false), DType::F8E4M3FN, &[4096, 4096, 4096]),
        c(ScaledGemm(Scaling::Row, false), DType::F8E4M3FN, &[8192, 8192, 8192]),
        c(ScaledGemm(Scaling::Row, false), DType::F8E4M3FN, &[128, 7168, 7168]),
        // Row scaling with each K block added in f32, against cuBLAS's default accumulation.
        c(ScaledGemm(Scaling::Row, true), DType::F8E4M3FN, &[4096, 4096, 4096]),
        c(ScaledGemm(Scaling::Row, true), DType::F8E4M3FN, &[8192, 8192, 8192]),
        c(ScaledGemm(Scaling::Block, true), DType::F8E4M3FN, &[4096, 7168, 2048]),
        c(ScaledGemm(Scaling::Block, true), DType::F8E4M3FN, &[4096, 4096, 4096]),
        // Grouped GEMMs per rank at 8-way expert parallelism (issue 28's shapes): DeepSeek-V3's
        // 32 local experts (gate/up, down), Qwen3-30B-A3B's 16 (gate/up, down), Mixtral's 8 (a
        // tensor-parallel shard); decode (32 tokens per expert) and prefill (1024), uniform and
        // skewed routing.
        c(GroupedGemm, DType::BF16, &[32, 4096, 7168, 32, 0]),
        c(GroupedGemm, DType::BF16, &[32, 4096, 7168, 1024, 0]),
        c(GroupedGemm, DType::BF16, &[32, 4096, 7168, 1024, 1]),
        c(GroupedGemm, DType::BF16, &[32, 7168, 2048, 1024, 0]),
        c(GroupedGemm, DType::BF16, &[16, 1536, 2048, 32, 0]),
        c(GroupedGemm, DType::BF16, &[16, 1536, 2048, 1024, 1]),
        c(GroupedGemm, DType::BF16, &[16, 2048, 768, 1024, 0]),
        c(GroupedGemm, DType::BF16, &[8, 3584, 4096, 1024, 0]),
        // FP8 with row-wise scales at DeepSeek-V3's and Qwen3's shapes.
        c(GroupedGemm, DType::F8E4M3FN, &[32, 4096, 7168, 32, 0]),
        c(GroupedGemm, DType::F8E4M3FN, &[32, 4096, 7168, 1024, 0]),
        c(GroupedGemm, DType::F8E4M3FN, &[32, 7168, 2048, 1024, 0]),
        c(GroupedGemm, DType::F8E4M3FN, &[16, 1536, 2048, 1024, 1]),
        c(GroupedGemm, DType::F8E4M3FN, &[32, 4096, 7168, 1024, 0, 1]),
        // Flash decoding, one new token per sequence, heads 32/8 (LLaMA-3-8B), 64/8 (70B) and
        // 96/12 of 128: batch 1, 8, 32 and 64, keys 1K to 128K per sequence.
        c(FlashDecode, DType::BF16, &[1, 1, 32, 8, 128, 131072]),
        c(FlashDecode, DType::BF16, &[8, 1, 32, 8, 128, 8192]),
        c(FlashDecode, DType::BF16, &[32, 1, 32, 8, 128, 4096]),
        c(FlashDecode, DType::BF16, &[64, 1, 32, 8, 128, 1024]),
        c(FlashDecode, DType::BF16, &[4, 1, 64, 8, 128, 32768]),
        c(FlashDecode, DType::BF16, &[1, 1, 96, 12, 128, 131072]),
        c(FlashDecode, DType::BF16, &[8, 1, 96, 12, 128, 32768]),
        // The same with the cache in f8e4m3fn with per-tensor scales (7th dimension 8): half
        // the bytes, against the HBM floor (no baseline on the machine reads an 8-bit cache).
        c(FlashDecode, DType::BF16, &[1, 1, 32, 8, 128, 131072, 8]),
        c(FlashDecode, DType::BF16, &[8, 1, 32, 8, 128, 8192, 8]),
        c(FlashDecode, DType::BF16, &[4, 1, 64, 8, 128, 32768, 8]),
        c(GroupedGemm, DType::F8E4M3FN, &[32, 7168, 2048, 1024, 0, 1]),
        // The gate/up GEMMs with SwiGLU fused (6th dimension 2; B's gate and up rows
        // interleaved), against `torch._grouped_mm` then `silu(gate) * up`.
        c(GroupedGemm, DType::BF16, &[32, 4096, 7168, 32, 0, 2]),
        c(GroupedGemm, DType::BF16, &[32, 4096, 7168, 1024, 0, 2]),
        c(GroupedGemm, DType::BF16, &[16, 1536, 2048, 1024, 0, 2]),
        c(GroupedGemm, DType::BF16, &[8, 3584, 4096, 1024, 0, 2]),
    ]
}

/// Median and spread (min, max) of timings in ms.
#[derive(Clone, Copy, Debug)]
struct Stats {
    median: f64,
    min: f64,
    max: f64,
    /// Median host time of one enqueue (us): compile-cache lookup, tensor maps, launch.
    host_us: f64,
}

impl Stats {
    fn of(mut v: Vec<f64>) -> Stats {
        v.sort_by(f64::total_cmp);
        Stats { median: v[v.len() / 2], min: v[0], max: v[v.len() - 1], host_us: f64::NAN }
    }
}

/// A device whose launches are enqueued on the default stream without waiting, so a kernel's
/// host orchestration can be timed with events around it; [`Enqueuing::finish`] waits and
/// reports a timed-out wait.
struct Enqueuing {
    drv: Arc<dyn Driver>,
    hidden: HiddenBuffers,
    /// Copied before every timed repetition ([`FLUSH_BYTES`]).
    flush: Buffer,
}

/// Bytes of a device-to-device copy enqueued before every timed repetition, outside the timed
/// events, as `triton.testing.do_bench` (the baseline's timer) clears L2 before each call: the
/// inputs come from HBM, not from the last repetition's L2 (50 MB on the H200), and the host's
/// work of the launch overlaps the copy, so the events time the GPU's work only (as they do
/// for the baseline).
const FLUSH_BYTES: usize = 256 << 20;

impl Drop for Enqueuing {
    fn drop(&mut self) {
        let _ = self.drv.free(&self.flush);
    }
}

impl Enqueuing {
    fn new(drv: &Arc<dyn Driver>) -> Result<Enqueuing, BackendError> {
        let flush = drv.alloc(FLUSH_BYTES, "bench.l2_flush")?;
        Ok(Enqueuing { drv: drv.clone(), hidden: HiddenBuffers::default(), flush })
    }

    /// Enqueues the copy that evicts L2 (half the buffer onto the other half).
    fn flush_l2(&self) -> Result<(), BackendError> {
        let half = FLUSH_BYTES / 2;
        self.drv.copy_async(0, self.flush.address + half as u64, self.flush.address, half)
    }

    fn finish(&self, opts: &LaunchOptions) -> Result<(), BackendError> {
        trident_gpu_runtime::watchdog::finish(
            self.drv.as_ref(),
            0,
            trident_gpu_runtime::watchdog::FINISH_BOUND,
            "the benchmark's work",
        )?;
        self.hidden.check(self.drv.as_ref(), "bench", self.drv.allocations(), opts.wait_bound)
    }
}

impl Device for Enqueuing {
    fn backend(&self) -> &'static str {
        self.drv.backend()
    }

    fn name(&self) -> String {
        self.drv.device_name()
    }
    fn alloc(&self, bytes: usize, name: &str) -> Result<Buffer, BackendError> {
        self.drv.alloc(bytes, name)
    }
    fn free(&self, buffer: &Buffer) -> Result<(), BackendError> {
        self.drv.free(buffer)
    }
    fn write(&self, buffer: &Buffer, offset: usize, data: &[u8]) -> Result<(), BackendError> {
        self.drv.write(buffer, offset, data)
    }
    fn read(&self, buffer: &Buffer, offset: usize, out: &mut [u8]) -> Result<(), BackendError> {
        self.drv.read(buffer, offset, out)
    }
    fn resident_programs(&self, kernel: &Artifact) -> Result<Option<u64>, BackendError> {
        trident_gpu_runtime::Driver::resident_programs(self.drv.as_ref(), kernel)
    }
    fn launch(&self, k: &Artifact, grid: [u32; 3], args: &[KernelArg], o: &LaunchOptions) -> Result<(), BackendError> {
        check_launch(k, grid, args, u32::MAX as u64)?;
        let hidden = self.hidden.args(self.drv.as_ref(), o.wait_bound)?;
        self.drv.launch_on(0, k, grid, args, &hidden, 1)
    }
}

struct Measured {
    ms: Stats,
    error: f64,
    /// The fastest configuration, where several were tried.
    config: String,
}

fn upload(dev: &Enqueuing, name: &str, v: &[f64], d: DType) -> Result<Buffer, BackendError> {
    let b = dev.alloc(v.len() * d.size_bytes() as usize, name)?;
    dev.write(&b, 0, &encode(v, d))?;
    Ok(b)
}

/// The configurations of one case's sweep so far: each is run, checked and timed; one the
/// target cannot hold (shared memory, registers) is refused and noted; one over the case's
/// error bound ends the case; the fastest is kept.
struct Sweep<'c> {
    case: &'c Case,
    reps: usize,
    /// `--config`: only the configurations whose names contain one of these (all if empty).
    only: &'c [String],
    best: Option<(Stats, f64, String)>,
    refused: Vec<String>,
}

impl<'c> Sweep<'c> {
    fn new(case: &'c Case, reps: usize, only: &'c [String]) -> Sweep<'c> {
        Sweep { case, reps, only, best: None, refused: Vec::new() }
    }

    /// Whether `--config` selects configuration `name`.
    fn selected(&self, name: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|c| name.contains(c.as_str()))
    }

    /// Times configuration `name`; whether it is the fastest so far (`None`: refused, or not
    /// selected by `--config`).
    fn try_config(
        &mut self,
        cuda: &Enqueuing,
        name: String,
        op: impl FnMut() -> Result<(), BackendError>,
        check: impl Fn() -> Result<f64, BackendError>,
    ) -> Result<Option<bool>, BackendError> {
        if !self.selected(&name) {
            return Ok(None);
        }
        let (ms, error) = match time(cuda, self.reps, op, check) {
            Err(BackendError::Compile { message, .. }) => {
                note!("bench: {} config {name}: refused: {message}", self.case.key());
                self.refused.push(format!("{name}: {message}"));
                return Ok(None);
            }
            other => other?,
        };
        if error > self.case.bound() {
            return Err(BackendError::Host(format!(
                "configuration {name}: error {error:.2e} over the bound {:.0e}",
                self.case.bound()
            )));
        }
        let (flops, _) = self.case.work();
        note!(
            "bench: {} config {name}: {:.3} ms ({:.1} TF/s, host enqueue {:.1} us)",
            self.case.key(),
            ms.median,
            flops / ms.median / 1e9,
            ms.host_us
        );
        let fastest = self.best.as_ref().is_none_or(|(b, _, _)| ms.median < b.median);
        if fastest {
            self.best = Some((ms, error, name));
        }
        Ok(Some(fastest))
    }

    /// The fastest configuration, or why there is none.
    fn result(self) -> Result<Measured, BackendError> {
        match self.best {
            Some((ms, error, config)) => Ok(Measured { ms, error, config }),
            None if self.refused.is_empty() => Err(BackendError::Host(format!(
                "no configuration of the sweep matches --config {}",
                self.only.join(", ")
            ))),
            None => Err(BackendError::Host(format!("every configuration refused: {}", self.refused.join("; ")))),
        }
    }
}

/// Runs `op` twice to warm up, checks the output with `check`, then times `reps` runs.
fn time(
    dev: &Enqueuing,
    reps: usize,
    mut op: impl FnMut() -> Result<(), BackendError>,
    check: impl Fn() -> Result<f64, BackendError>,
) -> Result<(Stats, f64), BackendError> {
    let opts = LaunchOptions::default();
    op()?;
    dev.finish(&opts)?;
    let error = check()?;
    op()?;
    let (mut ms, mut host) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    for _ in 0..reps.max(1) {
        dev.flush_l2()?;
        let mut timed = || {
            let t = std::time::Instant::now();
            let r = op();
            host.push(t.elapsed().as_secs_f64() * 1e6);
            r
        };
        ms.push(dev.drv.time_enqueued(0, trident_gpu_runtime::watchdog::FINISH_BOUND, &mut timed)?.as_secs_f64() * 1e3);
    }
    dev.finish(&opts)?;
    let host_us = Stats::of(host).median;
    Ok((Stats { host_us, ..Stats::of(ms) }, error))
}

/// A `--gemm` case: `DTYPE:MxNxK`.
fn gemm_case(text: &str) -> Result<Case, String> {
    let bad = || format!("--gemm {text}: expected DTYPE:MxNxK (like bf16:4096x4096x64)");
    let (dtype, dims) = text.split_once(':').ok_or_else(bad)?;
    let dtype = match dtype {
        "bf16" => DType::BF16,
        "f16" => DType::F16,
        "f32" => DType::F32,
        _ => return Err(bad()),
    };
    let dims: Vec<usize> = dims.split('x').map(|d| d.parse().map_err(|_| bad())).collect::<Result<_, _>>()?;
    if dims.len() != 3 || dims.contains(&0) {
        return Err(bad());
    }
    Ok(Case { workload: Workload::Gemm, dtype, dims })
}

fn run_case(
    drv: &Arc<dyn Driver>,
    case: &Case,
    reps: usize,
    only_configs: &[String],
) -> Result<Measured, BackendError> {
    let dev = Enqueuing::new(drv)?;
    let cuda = &dev;
    let target = drv.target();
    let mut l = DeviceCtx::new(drv.compiler(), &dev, LaunchOptions::default());
    l.target = target;
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    let d = case.dtype;
    let es = d.size_bytes() as usize;
    let (ms, error) = match case.workload {
        Workload::VectorAdd => {
            let n = case.dims[0];
            let (x, y) = (random(n, d, &mut rng), random(n, d, &mut rng));
            let (xb, yb) = (upload(cuda, "x", &x, d)?, upload(cuda, "y", &y, d)?);
            let out = cuda.alloc(n * es, "out")?;
            cuda.fill(&out, &poison(d))?;
            let k = VectorAdd { dtype: d, block: 1024 };
            time(
                cuda,
                reps,
                || k.run(&l, &xb, &yb, &out, n),
                || {
                    let mut raw = vec![0u8; n * es];
                    cuda.read(&out, 0, &mut raw)?;
                    let got = decode(&raw, d);
                    Ok((0..n).map(|i| (got[i] - (x[i] + y[i])).abs()).fold(0.0, f64::max))
                },
            )?
        }
        Workload::Softmax | Workload::SoftmaxFast => {
            let (rows, cols) = (case.dims[0], case.dims[1]);
            let x = random(rows * cols, d, &mut rng);
            let xb = upload(cuda, "x", &x, d)?;
            let out = cuda.alloc(rows * cols * es, "out")?;
            cuda.fill(&out, &poison(d))?;
            let k = Softmax { fast_math: case.workload == Workload::SoftmaxFast, ..Softmax::for_cols(d, cols) };
            time(
                cuda,
                reps,
                || k.run(&l, &xb, &out, rows, cols),
                || {
                    let mut worst = 0.0f64;
                    for _ in 0..16 {
                        let r = rng_row(rows);
                        let mut raw = vec![0u8; cols * es];
                        cuda.read(&out, r * cols * es, &mut raw)?;
                        let got = decode(&raw, d);
                        let row = &x[r * cols..(r + 1) * cols];
                        let m = row.iter().copied().fold(f64::MIN, f64::max);
                        let sum: f64 = row.iter().map(|v| (v - m).exp()).sum();
                        for (g, v) in got.iter().zip(row) {
                            worst = worst.max((g - (v - m).exp() / sum).abs());
                        }
                    }
                    Ok(worst)
                },
            )?
        }
        Workload::AgGemmW1 | Workload::GemmRsW1 => return overlap_cost(cuda, &l, case, reps, &mut rng),
        Workload::AgGemmLoopback => return loopback_overlap(drv, case, reps),
        Workload::GroupedGemm => return grouped_gemm(cuda, &l, case, (reps, only_configs), &mut rng),
        Workload::FlashDecode => return flash_decode(cuda, &l, case, (reps, only_configs), &mut rng),
        Workload::ScaledGemm(scaling, promote) => {
            return scaled_gemm(cuda, &l, case, (scaling, promote), (reps, only_configs), &mut rng)
        }
        Workload::Gemm => {
            let (m, n, k) = (case.dims[0], case.dims[1], case.dims[2]);
            let (a, b) = (random(m * k, d, &mut rng), random(k * n, d, &mut rng));
            let (ab, bb) = (upload(cuda, "a", &a, d)?, upload(cuda, "b", &b, d)?);
            let c = cuda.alloc(m * n * es, "c")?;
            cuda.fill(&c, &poison(d))?;
            // A small autotuning sweep (like Triton's `autotune`): every configuration is
            // checked, the fastest is reported.
            let mut sweep = Sweep::new(case, reps, only_configs);
            // The fastest GEMM configuration and its time (for the tuning cache).
            let mut best_gemm = None;
            // Where the target has TMA, each configuration also reads A and B through tensor
            // descriptors (`/tma`), with the copies issued by a producer warp (`/tma-ws`), and
            // persistent (`/tma-persistent`: one program per SM walking the tiles), and with C
            // written by a TMA store (`/tma-store`), and the combinations
            // (`/tma-ws-persistent-store`: a producer warp filling the next tile's stages while
            // the consumers run this tile's epilogue).
            let tma = l.gpu_target().is_some_and(|t| t.has_async_copy(trident_core::target::AsyncCopy::Tma));
            // (The sweep of results/README.md, less the configurations that never won.)
            let configs = [
                (64, 128, 64, 4, 4),
                (128, 128, 64, 8, 4),
                (128, 128, 64, 8, 5),
                (64, 256, 64, 4, 4),
                (128, 256, 64, 8, 3),
                (128, 256, 64, 8, 4),
                // Deeper pipelines for small M (more bytes in flight per SM).
                (64, 128, 64, 4, 6),
                (64, 128, 64, 4, 8),
                (128, 128, 64, 8, 6),
                // Two programs per SM at small M.
                (64, 64, 64, 4, 6),
                // K tiles of 128: half the per-step waits and fences.
                (64, 128, 128, 4, 4),
                (64, 64, 128, 4, 6),
                (128, 128, 128, 8, 3),
                // Two programs per SM at large M (96 KB of stages each).
                (128, 128, 64, 8, 3),
                // 128 rows on one warpgroup (two `wgmma` bands per warp): with 3 stages and no
                // TMA store two programs share an SM, one's epilogue under the other's main
                // loop (the effect of CUTLASS's ping-pong consumers, by the hardware's scheduler).
                (128, 128, 64, 4, 3),
                (128, 128, 64, 4, 4),
                // 256 x 128 on two warpgroups: 128 x 256's traffic per step, the other aspect.
                (256, 128, 64, 8, 4),
            ];
            let variants = if tma {
                &[
                    (false, false, false, false),
                    (true, false, false, false),
                    (true, true, false, false),
                    (true, false, true, false),
                    (true, false, false, true),
                    (true, true, false, true),
                    (true, false, true, true),
                    (true, true, true, false),
                    (true, true, true, true),
                ][..]
            } else {
                &[(false, false, false, false)][..]
            };
            let mut candidates = Vec::new();
            for ((bm, bn, bk, warps, stages), (descriptors, warp_specialize, persistent, tma_store)) in
                configs.into_iter().flat_map(|c| variants.iter().map(move |&t| (c, t)))
            {
                let g = Gemm {
                    block_m: bm,
                    block_n: bn,
                    block_k: bk,
                    warps,
                    stages,
                    descriptors,
                    warp_specialize,
                    persistent,
                    tma_store,
                    ..Gemm::new(d)
                };
                let suffix = match (descriptors, warp_specialize, persistent, tma_store) {
                    (true, true, true, true) => "/tma-ws-persistent-store",
                    (true, true, true, false) => "/tma-ws-persistent",
                    (true, false, true, true) => "/tma-persistent-store",
                    (true, true, _, true) => "/tma-ws-store",
                    (true, _, _, true) => "/tma-store",
                    (true, _, true, _) => "/tma-persistent",
                    (true, true, _, _) => "/tma-ws",
                    (true, false, _, _) => "/tma",
                    _ => "",
                };
                candidates.push((g, format!("{bm}x{bn}x{bk}/{warps}w/{stages}s{suffix}")));
            }
            // Consumer ping-pong on TMA targets: two groups of 4 consumer warps taking 128 x 128
            // tiles in turn (the producer warp, persistent, the TMA store per group).
            if tma && sweep_pingpong() {
                for stages in [4, 5] {
                    let g = Gemm { tma_store: true, ..Gemm::new(d).with_pingpong(stages) };
                    candidates.push((g, format!("128x128x64/4w/{stages}s/tma-ws-persistent-store-pingpong")));
                }
            }
            for (g, name) in candidates {
                if !sweep.selected(&name) {
                    continue;
                }
                cuda.fill(&c, &poison(d))?;
                let run = || g.run(&l, &ab, &bb, &c, (m, n, k));
                if sweep.try_config(cuda, name, run, || gemm_error(cuda, &c, (&a, &b), (m, n, k), d))? == Some(true) {
                    best_gemm = sweep.best.as_ref().map(|(ms, _, _)| (g, ms.median));
                }
            }
            // Split-K for small M on TMA targets (the output tiles alone leave SMs idle): the
            // descriptor form of `SplitKGemm`, each configuration checked the same way.
            if tma && m <= 1024 && d.size_bytes() == 2 {
                use trident_kernels::splitk_gemm::{SplitKGemm, SplitReduction};
                let base = SplitKGemm::for_target(d, 2, l.gpu_target());
                let tiles = [(128, 128, 8, 2), (128, 128, 8, 4), (64, 128, 4, 2), (128, 256, 8, 2)];
                // Each tiling with the partial tiles added by atomics and (`-slots`) stored into
                // per-split slots that the last split sums, the latter also with a producer warp
                // (`-slots-ws`).
                let forms = [
                    (SplitReduction::Atomic, false, ""),
                    (SplitReduction::Slots, false, "-slots"),
                    (SplitReduction::Slots, true, "-slots-ws"),
                ];
                for ((bm, bn, warps, splits), (reduction, warp_specialize, form)) in
                    tiles.into_iter().flat_map(|t| forms.map(|f| (t, f)))
                {
                    let g = SplitKGemm { block_m: bm, block_n: bn, warps, splits, reduction, warp_specialize, ..base };
                    let name = format!("{bm}x{bn}x{}/{warps}w/{}s/tma-splitk{splits}{form}", g.block_k, g.stages);
                    if !sweep.selected(&name) {
                        continue;
                    }
                    let ws = g.workspace(cuda, m, n)?;
                    cuda.fill(&c, &poison(d))?;
                    let run = || g.run(&l, &ab, &bb, &c, &ws, (m, n, k));
                    sweep.try_config(cuda, name, run, || gemm_error(cuda, &c, (&a, &b), (m, n, k), d))?;
                }
            }
            let measured = sweep.result()?;
            // The fastest GEMM of a whole sweep goes to the tuning cache, where `Gemm::tuned`
            // finds it (split-K is reported, not tuned).
            let Some((g, gemm_ms)) = best_gemm.filter(|_| only_configs.is_empty()) else { return Ok(measured) };
            let mut cache = TuningCache::load(TuningCache::default_path());
            let key = Gemm::tuning_key(&cuda.name(), d, (m, n, k));
            match cache.record(&key, &Tuned { config: GemmConfig::of(&g), ms: gemm_ms }) {
                Ok(()) => {
                    note!("bench: {}: {:?} recorded in {}", key.text(), GemmConfig::of(&g), cache.path.display())
                }
                Err(e) => {
                    note!("bench: {}: the tuning cache {} cannot be written: {e}", key.text(), cache.path.display())
                }
            }
            return Ok(measured);
        }
    };
    if error > case.bound() {
        return Err(BackendError::Host(format!("error {error:.2e} over the bound {:.0e}", case.bound())));
    }
    Ok(Measured { ms, error, config: String::new() })
}

/// An FP8 GEMM with scales (`trident_kernels::scaled_gemm`) at the target's meta-parameters,
/// on FP8 values over their whole range, checked on 256 random entries against f64 sums of the
/// decoded products times the scales (relative to the sum of their magnitudes), then timed.
fn scaled_gemm(
    cuda: &Enqueuing,
    l: &DeviceCtx,
    case: &Case,
    (scaling, promote): (Scaling, bool),
    (reps, only): (usize, &[String]),
    rng: &mut rand::rngs::StdRng,
) -> Result<Measured, BackendError> {
    use trident_conformance::host::round_to;
    use trident_kernels::scaled_gemm::{ScaledGemm, SCALE_BLOCK};
    let d = case.dtype;
    let (m, n, k) = (case.dims[0], case.dims[1], case.dims[2]);
    let op = ScaledGemm::for_problem(d, scaling, l.gpu_target(), m, promote);
    let spread = |v: Vec<f64>| round_to(&v.iter().map(|x| x * 400.0).collect::<Vec<_>>(), d);
    let (a, b) = (spread(random(m * k, DType::F32, rng)), spread(random(n * k, DType::F32, rng)));
    let (la, lb) = op.scale_lens(m, n, k);
    let mut scales = |len: usize| -> Vec<f64> { (0..len).map(|_| rng.gen_range(0.25..4.0) / 400.0).collect() };
    let (sa, sb) = (round_to(&scales(la), DType::F32), round_to(&scales(lb), DType::F32));
    let (ab, bb) = (upload(cuda, "a", &a, d)?, upload(cuda, "b", &b, d)?);
    let (sab, sbb) = (upload(cuda, "scale_a", &sa, DType::F32)?, upload(cuda, "scale_b", &sb, DType::F32)?);
    let c = cuda.alloc(m * n * 2, "c")?;
    cuda.fill(&c, &poison(DType::BF16))?;
    let (blk, kb) = (SCALE_BLOCK as usize, k.div_ceil(SCALE_BLOCK as usize));
    let check = || -> Result<f64, BackendError> {
        let mut worst = 0.0f64;
        let mut pick = rand::thread_rng();
        for _ in 0..256 {
            let (i, j) = (pick.gen_range(0..m), pick.gen_range(0..n));
            let mut raw = [0u8; 2];
            cuda.read(&c, (i * n + j) * 2, &mut raw)?;
            let got = decode(&raw, DType::BF16)[0];
            let (mut want, mut mag) = (0.0, 0.0);
            for q in 0..kb {
                let s = match scaling {
                    Scaling::Tensor => sa[0] * sb[0],
                    Scaling::Row => sa[i] * sb[j],
                    Scaling::Block => sa[i * kb + q] * sb[(j / blk) * kb + q],
                };
                for p in q * blk..((q + 1) * blk).min(k) {
                    let t = a[i * k + p] * b[j * k + p] * s;
                    want += t;
                    mag += t.abs();
                }
            }
            worst = worst.max((got - want).abs() / mag.max(1e-30));
        }
        Ok(worst)
    };
    // A small sweep on TMA targets (each configuration checked, the fastest reported): the
    // default of `for_target` first, then without the producer warp and persistent loop,
    // wider tiles, and one warpgroup for small M. Elsewhere the one form there is.
    let mut variants = vec![op];
    let mut push = |v: ScaledGemm| {
        if !variants.contains(&v) {
            variants.push(v);
        }
    };
    if op.descriptors {
        let plain = ScaledGemm { warp_specialize: false, persistent: false, ..op };
        push(plain);
        if scaling != Scaling::Block && !promote {
            push(ScaledGemm { block_n: 256, stages: 3, ..op });
            push(ScaledGemm { block_n: 128, stages: 4, ..op });
            // 4 stages of 48 KB: the TMA store's staging then goes out a part at a time.
            push(ScaledGemm { block_n: 256, stages: 4, ..op });
        }
        let plain = ScaledGemm { block_n: 128, stages: 4, ..plain };
        push(ScaledGemm { block_m: 64, warps: 4, ..plain });
        push(ScaledGemm { tma_store: false, ..op });
        if scaling != Scaling::Block && !promote {
            // 256 x 128 on two warpgroups (two `wgmma` bands each), and 128 x 128 on one
            // warpgroup: with K steps of 64 over 4 stages (99 KB with the TMA store) or of 128
            // over 3 stages without it (96 KB), two programs share an SM and one's epilogue
            // runs under the other's main loop.
            let narrow = ScaledGemm { block_n: 128, ..op };
            push(ScaledGemm { block_m: 256, stages: 3, ..narrow });
            push(ScaledGemm { warps: 4, block_k: 64, stages: 4, ..narrow });
            push(ScaledGemm { warps: 4, stages: 3, tma_store: false, ..narrow });
            // Consumer ping-pong: two groups of 4 consumer warps taking 128 x 128 tiles in turn
            // (only on request: see `sweep_pingpong`).
            if sweep_pingpong() {
                push(narrow.with_pingpong());
            }
        }
        // Small M: 128 x 128 tiles leave most SMs idle (56 tiles at N = 7168), so narrower
        // tiles with the producer warp and the persistent loop: 128 x 64 and 64 x 128.
        if m <= 256 && scaling != Scaling::Block && !promote {
            push(ScaledGemm { block_n: 64, stages: 6, ..op });
            push(ScaledGemm { block_m: 64, warps: 4, block_n: 128, stages: 6, ..op });
        }
        // Split-K for small M (the tiles alone leave SMs idle): 2 and 4 splits.
        if m <= 1024 && scaling != Scaling::Block && !promote {
            push(ScaledGemm { splits: 2, ..plain });
            push(ScaledGemm { splits: 4, ..plain });
            push(ScaledGemm { block_m: 64, warps: 4, splits: 2, ..plain });
        }
    }
    let mut sweep = Sweep::new(case, reps, only);
    for v in variants {
        let g = v.specialized(&ab, &bb, &c, n, k);
        let (producer, persistent) = g.overlapped();
        let name = format!(
            "{}x{}x{}/{}w/{}s{}{}{}{}",
            g.block_m,
            g.block_n,
            g.block_k,
            g.warps,
            g.stages,
            if g.divisible { "/tma-wgmma" } else { "/portable" },
            if g.divisible && producer { "-ws" } else { "" },
            if g.divisible && persistent { "-persistent" } else { "" },
            if g.divisible && g.tma_store && g.splits <= 1 { "-store" } else { "" },
        ) + &if g.splits > 1 { format!("-splitk{}", g.splits) } else { String::new() }
            + if g.divisible && g.pingpong && producer && persistent { "-pingpong" } else { "" };
        cuda.fill(&c, &poison(DType::BF16))?;
        // A split-K variant's workspace, zeroed once (each call leaves it clean).
        let ws = if g.splits > 1 { Some(g.workspace(cuda, m, n)?) } else { None };
        let run = || g.run_with(l, &ab, &bb, &c, (&sab, &sbb), ws.as_ref(), (m, n, k));
        sweep.try_config(cuda, name, run, check)?;
    }
    sweep.result()
}

/// Each expert's rows of a benchmark routing: `tokens` per expert on average, uniform (0) or
/// skewed (1: one expert takes half of them, a quarter of the experts none, the rest shared
/// evenly). The baseline script makes the same counts from the same rule.
pub fn grouped_rows(experts: usize, tokens: usize, routing: usize) -> Vec<usize> {
    let total = experts * tokens;
    if routing == 0 {
        return vec![tokens; experts];
    }
    let empty = experts / 4;
    let mut rows = vec![0; experts];
    rows[empty] = total / 2;
    let rest = experts - empty - 1;
    for (i, r) in rows.iter_mut().enumerate().skip(empty + 1) {
        *r = (total - total / 2) / rest + usize::from(i - empty - 1 < (total - total / 2) % rest);
    }
    rows
}

/// The grouped GEMM (contiguous A `[T, K]`, B `[E, N, K]`; FP8 with row-wise scales) checked on
/// 256 random entries against f64 sums, then timed.
fn grouped_gemm(
    cuda: &Enqueuing,
    l: &DeviceCtx,
    case: &Case,
    (reps, only): (usize, &[String]),
    rng: &mut rand::rngs::StdRng,
) -> Result<Measured, BackendError> {
    use trident_kernels::grouped_gemm::{
        swiglu_gate_row, BLayout, Epilogue, GroupedGemm, Groups, Layout, Operands, Scales, SWIGLU_BLOCK,
    };
    let d = case.dtype;
    let (experts, n, k) = (case.dims[0], case.dims[1], case.dims[2]);
    let rows = grouped_rows(experts, case.dims[3], case.dims[4]);
    let t: usize = rows.iter().sum();
    let ends: Vec<f64> = rows
        .iter()
        .scan(0usize, |s, &r| {
            *s += r;
            Some(*s as f64)
        })
        .collect();
    // FP8 over its whole range with scales near 1/400 (per token, per expert and column).
    let spread = if d.is_fp8() { 400.0 } else { 1.0 };
    let values = |len: usize, rng: &mut rand::rngs::StdRng| {
        let v: Vec<f64> = random(len, DType::F32, rng).iter().map(|x| x * spread).collect();
        trident_conformance::host::round_to(&v, d)
    };
    let (a, b) = (values(t * k, rng), values(experts * n * k, rng));
    let (ab, bb) = (upload(cuda, "a", &a, d)?, upload(cuda, "b", &b, d)?);
    let gb = upload(cuda, "groups", &ends, DType::I32)?;
    let op = GroupedGemm::for_target(d, Layout::Contiguous, BLayout::NK, l.gpu_target());
    let op = match case.dims.get(5) {
        Some(1) => op.with_scales(Scales::Block, false),
        Some(2) => op.with_epilogue(Epilogue { swiglu: true, ..Epilogue::default() }),
        _ => op,
    };
    let (swiglu, n_out) = (op.epilogue.swiglu, op.out_cols(n));
    let scale = |len: usize, rng: &mut rand::rngs::StdRng| -> Vec<f64> {
        (0..len).map(|_| if op.scales != Scales::None { rng.gen_range(0.25..4.0) / spread } else { 1.0 }).collect()
    };
    let (la, lb) = match op.scales {
        Scales::None => (t, experts * n),
        _ => op.scale_lens(t, experts, n, k),
    };
    let (sa, sb) = (scale(la, rng), scale(lb, rng));
    let (kb, nb) = (k.div_ceil(128), n.div_ceil(128));
    // The scale of product term (row i of expert e, column j, K index p).
    let scale_of = |i: usize, e: usize, j: usize, p: usize| match op.scales {
        Scales::None => 1.0,
        Scales::Row => sa[i] * sb[e * n + j],
        Scales::Block => sa[i * kb + p / 128] * sb[(e * nb + j / 128) * kb + p / 128],
    };
    let scales = match op.scales != Scales::None {
        true => Some((upload(cuda, "scale_a", &sa, DType::F32)?, upload(cuda, "scale_b", &sb, DType::F32)?)),
        false => None,
    };
    let out = op.out_type();
    let c = cuda.alloc(t * n_out * out.size_bytes() as usize, "c")?;
    cuda.fill(&c, &poison(out))?;
    let expert_of = |i: usize| ends.iter().position(|&e| i < e as usize).expect("a row of some expert");
    let check = || -> Result<f64, BackendError> {
        let mut worst = 0.0f64;
        let mut pick = rand::thread_rng();
        for _ in 0..256 {
            let (i, j) = (pick.gen_range(0..t), pick.gen_range(0..n_out));
            let mut raw = vec![0u8; out.size_bytes() as usize];
            cuda.read(&c, (i * n_out + j) * raw.len(), &mut raw)?;
            let got = decode(&raw, out)[0];
            let e = expert_of(i);
            // Row `j` of B's expert: the sum and the sum of magnitudes of its products.
            let product = |j: usize| {
                (0..k).fold((0.0, 0.0), |(s, m), p| {
                    let x = a[i * k + p] * b[(e * n + j) * k + p] * scale_of(i, e, j, p);
                    (s + x, m + f64::abs(x))
                })
            };
            // With SwiGLU: silu(gate) * up of the interleaved pair (|silu(g)| <= |g|, so the
            // product of the magnitudes bounds both factors' errors).
            let (want, mag) = match swiglu {
                true => {
                    let gate_row = swiglu_gate_row(j);
                    let ((g, mg), (u, mu)) = (product(gate_row), product(gate_row + SWIGLU_BLOCK as usize));
                    (g / (1.0 + (-g).exp()) * u, 1.1 * mg * mu)
                }
                false => product(j),
            };
            worst = worst.max((got - want).abs() / mag.max(1e-30));
        }
        Ok(worst)
    };
    let p = Groups::new(experts, n, k, t);
    let scales = scales.as_ref().map(|(x, y)| (x, y));
    let ops = Operands { scales, ..Operands::new(&ab, &bb, &c, &gb) };
    // A small sweep where the descriptor form runs (each configuration checked, the fastest
    // reported): `for_target`'s tiles first, then 128 and 256 columns (3 stages for FP8's
    // 256), the other stage count (3 or 4), FP8 on K steps of 64, one warpgroup's 64 rows when
    // experts average fewer than 128 rows, and the other form (bf16 walks the groups, FP8
    // takes the schedule by default). SwiGLU and block scales fix the tile's columns.
    let mut variants = vec![op];
    if op.descriptors && !swiglu && op.scales != Scales::Block {
        let mut push = |v: GroupedGemm| {
            if !variants.contains(&v) {
                variants.push(v);
            }
        };
        push(GroupedGemm { block_n: 128, ..op });
        push(GroupedGemm { block_n: 256, stages: if d.is_fp8() { 3 } else { op.stages }, ..op });
        push(GroupedGemm { stages: 7 - op.stages, ..op });
        if d.is_fp8() {
            push(GroupedGemm { block_n: 128, block_k: 64, stages: 4, ..op });
        }
        // 128 x 128 on one warpgroup (two `wgmma` bands per warp) over 3 stages of 32 KB (FP8
        // K steps of 128, bf16's of 64): 96 KB, two programs per SM.
        push(GroupedGemm { block_n: 128, warps: 4, block_k: if d.is_fp8() { 128 } else { 64 }, stages: 3, ..op });
        // Consumer ping-pong: two groups of 4 consumer warps taking those tiles in turn (the
        // scheduled form, with its producer warpgroup; only on request: see `sweep_pingpong`).
        // Not FP8: its row-scaled form spills 284 bytes there (ptxas 13.0).
        if !d.is_fp8() && sweep_pingpong() {
            push(GroupedGemm { block_n: 128, warps: 4, block_k: 64, stages: 4, scheduled: true, pingpong: true, ..op });
        }
        if case.dims[3] < 128 {
            push(GroupedGemm { block_m: 64, warps: 4, ..op });
        }
        push(GroupedGemm { scheduled: !op.scheduled, ..op });
    }
    // C by masked stores from the accumulator, against the default's bulk row stores.
    if op.descriptors {
        variants.push(GroupedGemm { bulk_store: false, ..op });
    }
    // The schedule's scratch, for the largest of the variants' schedules.
    let bytes = variants.iter().map(|v| v.schedule_bytes(p)).max().unwrap_or(0).max(4);
    let scratch = cuda.alloc(bytes, "grouped_gemm.schedule")?;
    let ops = Operands { schedule: Some(&scratch), ..ops };
    let mut sweep = Sweep::new(case, reps, only);
    for v in variants {
        let g = v.specialized(&ab, &bb, &c, n, k);
        let form = match (g.divisible, g.scheduled) {
            (true, true) if g.pingpong => "tma-wgmma-ws-scheduled-pingpong",
            (true, true) => "tma-wgmma-ws-scheduled",
            (true, false) => "tma-wgmma",
            (false, _) => "portable",
        };
        let store = if g.bulk_store && g.divisible { "" } else { "/masked-store" };
        let name = format!("{}x{}x{}/{}w/{}s/{form}{store}", g.block_m, g.block_n, g.block_k, g.warps, g.stages);
        cuda.fill(&c, &poison(out))?;
        sweep.try_config(cuda, name, || v.run(l, ops, p), check)?;
    }
    sweep.result()
}

/// The worst of 256 random entries of `c = a b` against f64 dot products, relative to
/// sum |a||b|.
fn gemm_error(
    cuda: &Enqueuing,
    c: &Buffer,
    (a, b): (&[f64], &[f64]),
    mnk: (usize, usize, usize),
    d: DType,
) -> Result<f64, BackendError> {
    let es = d.size_bytes() as usize;
    let entry = |idx: usize| -> Result<f64, BackendError> {
        let mut raw = vec![0u8; es];
        cuda.read(c, idx * es, &mut raw)?;
        Ok(decode(&raw, d)[0])
    };
    trident_conformance::reference::sampled_gemm_error(&entry, (a, b), mnk, 256, &mut rand::thread_rng())
}

/// AG-GEMM's or GEMM-RS's GEMM kernel at world 1 (single-device launch: `symm_at` to rank 0 is
/// the pointer itself) with every signal it waits for already set, and the plain GEMM of the
/// same tiles, both timed and checked in this run; the configuration column gives the GEMM's
/// time and what the machinery costs.
fn overlap_cost(
    cuda: &Enqueuing,
    l: &DeviceCtx,
    case: &Case,
    reps: usize,
    rng: &mut rand::rngs::StdRng,
) -> Result<Measured, BackendError> {
    use trident_kernels::ag_gemm::{AgGemm, GatherMode};
    use trident_kernels::gemm_rs::GemmRs;
    let d = case.dtype;
    let es = d.size_bytes() as usize;
    let (m, n, k) = (case.dims[0], case.dims[1], case.dims[2]);
    let (a, b) = (random(m * k, d, rng), random(k * n, d, rng));
    let (ab, bb) = (upload(cuda, "a", &a, d)?, upload(cuda, "b", &b, d)?);
    let c = cuda.alloc(m * n * es, "c")?;
    // AG-GEMM reads A through pointers (its rows arrive while it runs), GEMM-RS through
    // descriptors where the target has TMA: the plain GEMM compared reads the same way.
    let ag = case.workload == Workload::AgGemmW1;
    let gemm = if ag {
        AgGemm::for_target(d, GatherMode::Kernel, l.gpu_target()).gemm
    } else {
        GemmRs::for_target(d, l.gpu_target()).gemm
    }
    .specialized([&ab, &bb, &c], n, k);
    let i32 = |x: usize| KernelArg::i32(x as i32);
    let tiles = (m.div_ceil(gemm.block_m as usize) * n.div_ceil(gemm.block_n as usize)) as u32;
    // Signals: AG-GEMM waits for `ready[0] >= epoch` (set far ahead of every call's epoch);
    // GEMM-RS's epilogue adds to its tiles' arrival counters (one per block of rows). Both keep
    // their epoch words on the device (`trident_kernels::epoch`); GEMM-RS writes half `epoch mod
    // 2` of its partial buffer, so the check after the first call reads the second half.
    let signals = cuda.alloc(8 * (m / gemm.block_m as usize).max(1), "signals")?;
    let epochs = cuda.alloc(16, "epochs")?;
    cuda.fill(&epochs, &[0])?;
    let partial = if ag { c.clone() } else { cuda.alloc(trident_kernels::epoch::halves_bytes(m * n, es), "partial")? };
    let written = if ag { c.clone() } else { trident_kernels::epoch::half_of(&partial, 1) };
    let (kernel, args) = if ag {
        cuda.write(&signals, 0, &(1u64 << 40).to_le_bytes())?;
        let op = AgGemm { gemm, mode: GatherMode::Kernel };
        let kernel = l.compile(format!("{op:?}"), || op.build())?;
        let args = vec![
            ab.arg(),
            bb.arg(),
            c.arg(),
            signals.arg(),
            epochs.arg(),
            i32(m),
            i32(n),
            i32(k),
            i32(m),
            KernelArg::u64(1),
        ];
        (kernel, args)
    } else {
        let op = GemmRs { gemm, reduce: Default::default() };
        let kernel = l.compile(format!("{op:?}/gemm"), || op.build_gemm(gemm.block_m))?;
        (kernel, vec![ab.arg(), bb.arg(), partial.arg(), signals.arg(), epochs.arg(), i32(m), i32(n), i32(k), i32(m)])
    };
    cuda.fill(&partial, &poison(d))?;
    let overlap = time(
        cuda,
        reps,
        || l.launch(&kernel, [tiles, 1, 1], &args),
        || gemm_error(cuda, &written, (&a, &b), (m, n, k), d),
    )?;
    cuda.fill(&c, &poison(d))?;
    let plain =
        time(cuda, reps, || gemm.run(l, &ab, &bb, &c, (m, n, k)), || gemm_error(cuda, &c, (&a, &b), (m, n, k), d))?;
    let err = overlap.1.max(plain.1);
    if err > case.bound() {
        return Err(BackendError::Host(format!("error {err:.2e} over the bound {:.0e}", case.bound())));
    }
    let config = format!(
        "{}x{}x{}/{}s{}; same-tile GEMM {:.3} ms: machinery {:+.1}%",
        gemm.block_m,
        gemm.block_n,
        gemm.block_k,
        gemm.stages,
        if gemm.descriptors { "/tma" } else { "" },
        plain.0.median,
        (overlap.0.median / plain.0.median - 1.0) * 100.0
    );
    Ok(Measured { ms: overlap.0, error: err, config })
}

/// AG-GEMM against "gather, then GEMM" in a loopback world on this GPU (`case.dims[3]` ranks);
/// the time is the slowest rank's median of AG-GEMM, the configuration column gives the
/// sequential pipeline's and the ratio.
fn loopback_overlap(drv: &Arc<dyn Driver>, case: &Case, reps: usize) -> Result<Measured, BackendError> {
    use trident_backend_nvidia::world::{GpuWorld, GpuWorldOptions};
    if drv.backend() != "nvidia" {
        return Err(BackendError::Host(format!("{}: the loopback case runs on nvidia", case.key())));
    }
    let (d, dims) = (case.dtype, case.dims.clone());
    let (mnk, w, seed) = ((dims[0], dims[1], dims[2]), dims[3], rand::random());
    // The gathered A lives in every rank's symmetric heap (`m x k`) twice, AG-GEMM's and the
    // sequential pipeline's (each counts its own calls), beside their signals.
    let mut opts = GpuWorldOptions::new(w);
    opts.heap_bytes = opts.heap_bytes.max(2 * mnk.0 * mnk.2 * d.size_bytes() as usize + (8 << 20));
    let out = GpuWorld::run(opts, move |ctx| crate::overlap::ag_gemm_vs_sequential(ctx, d, mnk, reps, seed))?;
    let worst = |f: &dyn Fn(&crate::overlap::OverlapTimes) -> f64| out.iter().map(f).fold(0.0, f64::max);
    let (overlapped, sequential, error) =
        (worst(&|t| t.overlapped_ms), worst(&|t| t.sequential_ms), worst(&|t| t.error));
    if error > case.bound() {
        return Err(BackendError::Host(format!("error {error:.2e} over the bound {:.0e}", case.bound())));
    }
    let ms = Stats { median: overlapped, min: overlapped, max: overlapped, host_us: f64::NAN };
    let config =
        format!("{w} ranks on one GPU; gather then GEMM {sequential:.3} ms: overlap {:.3}x", sequential / overlapped);
    Ok(Measured { ms, error, config })
}

/// Flash decoding over a contiguous cache of `S` keys per sequence (in f8e4m3fn with
/// per-tensor scales where the 7th dimension is 8), checked on 16 sampled (sequence, token,
/// head) rows against f64 (normwise per row, the worst): a sweep of the keys per step, the
/// warps per program, prefetching and the splits' unit of programs, the fastest reported.
fn flash_decode(
    cuda: &Enqueuing,
    l: &DeviceCtx,
    case: &Case,
    (reps, only_configs): (usize, &[String]),
    rng: &mut rand::rngs::StdRng,
) -> Result<Measured, BackendError> {
    use trident_kernels::flash_decode::{DecodeShape, FlashDecode, KvScales};
    let (d, dims) = (case.dtype, &case.dims);
    let (b, nq, hq, hkv, hd, len) = (dims[0], dims[1], dims[2], dims[3], dims[4], dims[5]);
    let shape = DecodeShape { batch: b, q_len: nq, heads_q: hq, heads_kv: hkv, head_dim: hd, cache_len: len };
    let q = random(b * nq * hq * hd, d, rng);
    // An 8-bit cache holds values up to 4 (scaled by `scales` in the reference).
    let kv = if dims.get(6) == Some(&8) { DType::F8E4M3FN } else { d };
    let (scales, spread) = if kv == d { (KvScales::default(), 1.0) } else { (KvScales { k: 0.37, v: 1.9 }, 4.0) };
    let cache = |rng: &mut rand::rngs::StdRng| -> Vec<f64> {
        let x: Vec<f64> = random(b * len * hkv * hd, DType::F64, rng).iter().map(|x| x * spread).collect();
        trident_conformance::host::round_to(&x, kv)
    };
    let (k, v) = (cache(rng), cache(rng));
    let (qb, kb, vb) = (upload(cuda, "q", &q, d)?, upload(cuda, "k", &k, kv)?, upload(cuda, "v", &v, kv)?);
    let (k, v): (Vec<f64>, Vec<f64>) =
        (k.iter().map(|x| x * scales.k as f64).collect(), v.iter().map(|x| x * scales.v as f64).collect());
    let lens = upload(cuda, "lens", &vec![len as f64; b], DType::I32)?;
    let out = cuda.alloc(b * nq * hq * hd * d.size_bytes() as usize, "out")?;
    let es = d.size_bytes() as usize;
    let check = || -> Result<f64, BackendError> {
        let mut worst = 0.0f64;
        for _ in 0..16 {
            let row = rng_row(b * nq * hq);
            let (seq, i, h) = (row / (nq * hq), row / hq % nq, row % hq);
            let mut raw = vec![0u8; hd * es];
            cuda.read(&out, row * hd * es, &mut raw)?;
            let got = decode(&raw, d);
            // Query token i sees the keys up to its position, len - nq + i.
            let qv = &q[row * hd..(row + 1) * hd];
            let at = |j: usize| ((seq * len + j) * hkv + h / (hq / hkv)) * hd;
            let scores: Vec<f64> = (0..=len - nq + i)
                .map(|j| qv.iter().zip(&k[at(j)..at(j) + hd]).map(|(x, y)| x * y).sum::<f64>() / (hd as f64).sqrt())
                .collect();
            let m = scores.iter().copied().fold(f64::MIN, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let total: f64 = w.iter().sum();
            let want: Vec<f64> =
                (0..hd).map(|c| w.iter().enumerate().map(|(j, wj)| wj * v[at(j) + c]).sum::<f64>() / total).collect();
            let err: f64 = got.iter().zip(&want).map(|(g, w)| (g - w).powi(2)).sum::<f64>().sqrt();
            let norm: f64 = want.iter().map(|w| w * w).sum::<f64>().sqrt();
            worst = worst.max(err / norm.max(f64::MIN_POSITIVE));
        }
        Ok(worst)
    };
    let mut sweep = Sweep::new(case, reps, only_configs);
    let default = FlashDecode::for_shape(d, &shape).with_kv(kv);
    // Keys per step, warps, the next block prefetched, and the unit of programs the splits
    // fill (`Np`: N; none: twice the programs resident on the device, `FlashDecode::for_device`).
    // `64n/8w/pf/w16/fm` is `FlashDecode::for_shape`'s for 16-bit queries (`64n/8w/pf/w16`
    // for f32). `/w16`: K and V moved 16 bytes a thread (`FlashDecode::wide`). `/fm`: `exp`
    // through the hardware's approximation (`FlashDecode::fast_math`); the other forms keep
    // the accurate functions, to show what each costs.
    // `/sN`: without prefetching, K and V in a ring of N shared stages copied by `cp.async`
    // (`FlashDecode::stages`; without `/sN` and `/pf`, in registers, staged per `dot`).
    // Session 56 (H100, results/h100-session56/a) dropped the forms that lost at every shape
    // of two sweeps: 4 warps without stages, 128 keys a step without `/w16`, three stages.
    let variants = [
        (64, 8, false, 0, false, false, 1),
        (64, 8, true, 0, false, false, 1),
        (64, 8, true, 264, false, false, 1),
        (64, 8, true, 0, true, false, 1),
        (64, 8, false, 0, true, false, 1),
        (128, 8, true, 0, true, false, 1),
        (64, 8, true, 0, true, true, 1),
        (64, 8, false, 0, false, false, 2),
        (64, 4, false, 0, false, false, 2),
    ];
    // An 8-bit cache has no staged forms (`FlashDecode::with_kv`).
    let variants = variants.into_iter().filter(|v| kv == d || v.6 == 1);
    // The default with its combine a programmatic dependent of the split stage (`/pdl`:
    // `FlashDecode::programmatic`), to show what the programmatic launch gains.
    let plain = (default.block_n, default.warps, default.prefetch, 0, default.wide, default.fast_math, default.stages);
    let forms = variants.map(|v| (v, false)).chain([(plain, true)]);
    for ((block_n, warps, prefetch, wave, wide, fast_math, stages), programmatic) in forms {
        let op = FlashDecode { block_n, warps, prefetch, wave, wide, fast_math, stages, programmatic, ..default };
        let work = cuda.alloc(op.work_bytes(&shape), "flash_decode_work")?;
        cuda.fill(&out, &poison(d))?;
        let run = || op.run(l, (&qb, &kb, &vb), scales, &lens, None, &work, &out, &shape);
        let name = format!(
            "{block_n}n/{warps}w{}{}{}",
            if prefetch { "/pf" } else { "" },
            if wave > 0 { format!("/{wave}p") } else { String::new() },
            if wide { "/w16" } else { "" },
        ) + if fast_math { "/fm" } else { "" }
            + &if !prefetch && stages > 1 { format!("/s{stages}") } else { String::new() }
            + if programmatic { "/pdl" } else { "" };
        let r = sweep.try_config(cuda, name, run, check);
        cuda.free(&work)?;
        r?;
    }
    // Where the default's time goes: each of its launches timed alone (the combine reads the
    // partials the split stage left), printed beside the sweep.
    let work = cuda.alloc(default.work_bytes(&shape), "flash_decode_work")?;
    for (stage, kernel, grid, args) in
        default.launches(l, (&qb, &kb, &vb), scales, (&lens, None), (&work, &out), &shape)?
    {
        let (ms, _) = time(cuda, reps, || l.launch(&kernel, grid, &args), || Ok(0.0))?;
        note!(
            "bench: {} default's {stage:?} stage alone: {:.4} ms (grid {grid:?}, L2 flushed before each run)",
            case.key(),
            ms.median
        );
    }
    cuda.free(&work)?;
    sweep.result()
}

fn rng_row(n: usize) -> usize {
    rand::thread_rng().gen_range(0..n)
}

/// `trident bench --plot REPORT.json [OTHER.json]`: the reports' pictures
/// ([`crate::plot`]), each report named by its file's stem in the legend.
fn plot(paths: &[String], dir: Option<&str>) -> ExitCode {
    // Distributed reports (`--world W --json`) have their own pictures.
    let world: Vec<Option<(String, Vec<crate::plot_world::WorldPoint>)>> = paths
        .iter()
        .map(|p| {
            let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok()?;
            crate::plot_world::read(&v)
        })
        .collect();
    let distributed = world.iter().filter(|w| w.is_some()).count();
    if distributed > 0 && distributed < paths.len() {
        eprintln!("error: --plot: a distributed report (--world) and a single-device one cannot share pictures");
        return ExitCode::from(2);
    }
    let reports: Result<Vec<_>, String> =
        if distributed > 0 { Ok(Vec::new()) } else { paths.iter().map(|p| crate::plot::read(p)).collect() };
    let reports = match reports {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let first = std::path::Path::new(&paths[0]);
    let dir = dir.map(std::path::PathBuf::from).unwrap_or_else(|| first.with_file_name("plots"));
    let stem =
        |p: &String| std::path::Path::new(p).file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let mut names: Vec<String> = paths.iter().map(stem).collect();
    if names.len() == 2 && names[0] == names[1] {
        names = vec!["A".into(), "B".into()];
    }
    let drawn = if distributed > 0 {
        let world: Vec<_> = world.into_iter().flatten().collect();
        crate::plot_world::plot(&world, &names, &dir)
    } else {
        crate::plot::plot(&reports, &names, &dir)
    };
    match drawn {
        Ok(files) => {
            for f in files {
                println!("{}", f.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `trident bench --compare A.json B.json`: two reports (two vendors, two commits) side by side
/// per case: each one's time, its ratio to its own baseline, and the roofline floor.
fn compare(a: &str, b: &str) -> ExitCode {
    let read = |p: &str| -> Result<serde_json::Value, String> {
        let t = std::fs::read_to_string(p).map_err(|e| format!("{p}: {e}"))?;
        serde_json::from_str(&t).map_err(|e| format!("{p}: not a benchmark report: {e}"))
    };
    let (ra, rb) = match (read(a), read(b)) {
        (Ok(x), Ok(y)) => (x, y),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let rows =
        |r: &serde_json::Value| -> Vec<serde_json::Value> { r["results"].as_array().cloned().unwrap_or_default() };
    let (xa, xb) = (rows(&ra), rows(&rb));
    let dev = |r: &serde_json::Value| r["device"].as_str().unwrap_or("?").to_string();
    println!("A: {a} ({})\nB: {b} ({})", dev(&ra), dev(&rb));
    println!(
        "{:<34} {:>10} {:>8} {:>10} {:>8} {:>9} {:>10} {:>10}",
        "case", "A ms", "A/base", "B ms", "B/base", "B vs A", "A floor", "B floor"
    );
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64();
    let show = |x: Option<f64>, p: usize| x.map(|x| format!("{x:.p$}")).unwrap_or_else(|| "-".into());
    let mut cases: Vec<String> = xa.iter().chain(&xb).filter_map(|r| r["case"].as_str().map(String::from)).collect();
    cases.dedup();
    let mut seen = std::collections::HashSet::new();
    for c in cases.into_iter().filter(|c| seen.insert(c.clone())) {
        let find = |xs: &[serde_json::Value]| xs.iter().find(|r| r["case"].as_str() == Some(c.as_str())).cloned();
        let (pa, pb) = (find(&xa), find(&xb));
        let get = |p: &Option<serde_json::Value>, k: &str| p.as_ref().and_then(|v| f(v, k));
        let (ta, tb) = (get(&pa, "trident_ms"), get(&pb, "trident_ms"));
        let speed = match (ta, tb) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        };
        println!(
            "{:<34} {:>10} {:>8} {:>10} {:>8} {:>9} {:>10} {:>10}",
            c,
            show(ta, 3),
            show(get(&pa, "speedup_vs_baseline"), 2),
            show(tb, 3),
            show(get(&pb, "speedup_vs_baseline"), 2),
            speed.map(|s| format!("{s:.2}x")).unwrap_or_else(|| "-".into()),
            show(get(&pa, "floor_ms"), 3),
            show(get(&pb, "floor_ms"), 3),
        );
    }
    ExitCode::SUCCESS
}

/// Runs the baseline command (`CMD CASES_FILE OUT_JSON`) on `keys`; its timings, or `None`
/// without a command or when it fails.
fn baseline(cmd: Option<&str>, keys: &[String], when: &str) -> Option<serde_json::Map<String, serde_json::Value>> {
    let cmd = cmd?;
    let dir = std::env::temp_dir();
    let (list, out) = (dir.join("trident-bench-cases.txt"), dir.join(format!("trident-bench-baseline-{when}.json")));
    let text: String = keys.iter().map(|k| k.clone() + "\n").collect();
    std::fs::write(&list, text).ok()?;
    note!("bench: baseline ({when} trident): {cmd}");
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{cmd} '{}' '{}'", list.display(), out.display()))
        .status();
    if !status.as_ref().is_ok_and(|s| s.success()) {
        note!("bench: baseline command failed ({status:?}); no baseline {when}");
        return None;
    }
    read_json(Some(&out.display().to_string()))
}

fn read_json(path: Option<&str>) -> Option<serde_json::Map<String, serde_json::Value>> {
    std::fs::read_to_string(path?).ok().and_then(|t| serde_json::from_str(&t).ok())
}

/// `trident bench --world W`: the distributed cases in the peer world, checked and timed, with
/// the vendor pipeline timed before and after them (the faster compared).
fn world_main(args: &Args, w: usize) -> ExitCode {
    use crate::dist_report;
    use trident_backend_nvidia::world::{GpuWorld, GpuWorldOptions};
    use trident_conformance::dist_bench;
    if !(1..=64).contains(&w) {
        eprintln!("error: --world {w}: a world has 1..=64 ranks");
        return ExitCode::from(2);
    }
    if args.backend != "nvidia" {
        eprintln!("error: --world: the peer world runs on nvidia, not {}", args.backend);
        return ExitCode::from(2);
    }
    let selected: Vec<dist_bench::DistCase> = dist_bench::cases(w)
        .into_iter()
        .filter(|c| args.only.as_ref().is_none_or(|o| c.key().contains(o.as_str())))
        .collect();
    if args.cases {
        for c in &selected {
            println!("{}", c.key());
        }
        return ExitCode::SUCCESS;
    }
    let gpus = match GpuWorld::peer_devices(w) {
        Ok(g) => g,
        Err(e) => {
            println!(
                "bench: skipped: the peer world of {w} ranks: {e} ({})",
                trident_gpu_runtime::discovery::summary()
            );
            return ExitCode::SUCCESS;
        }
    };
    let layout = if gpus == w {
        format!("peer world: {w} ranks, one per GPU")
    } else {
        format!("peer world: {w} ranks on {gpus} GPU(s): ranks share GPUs, so these are not communication figures")
    };
    note!("bench: {layout}");
    let keys: Vec<String> = selected.iter().map(|c| c.key()).collect();
    let before = baseline(args.baseline_cmd.as_deref(), &keys, "before")
        .or_else(|| read_json(args.baseline.as_deref()))
        .unwrap_or_default();
    let seed: u64 = rand::random();
    let mut rows = Vec::new();
    let progress = trident_conformance::progress::Progress::new(selected.len(), "bench");
    for case in &selected {
        progress.step(&case.key());
        let mut opts = GpuWorldOptions::new(w);
        opts.heap_bytes = case.heap_bytes();
        let (c, reps) = (case.clone(), args.reps);
        let t = std::time::Instant::now();
        let out = GpuWorld::run_peer(opts, move |ctx| dist_bench::run(ctx, &c, reps, seed));
        let measured =
            out.map(|ranks| (dist_bench::combine(&ranks), ranks.iter().map(|r| r.error).fold(0.0, f64::max)));
        let measured = match measured {
            Ok((_, e)) if e > 1e-2 => Err(format!("error {e:.2e} over the bound 1e-2")),
            other => other.map_err(|e| e.to_string()),
        };
        note!("bench: {} ({:.1} s): {measured:?}", case.key(), t.elapsed().as_secs_f64());
        if let (Some(dir), Ok((times, _))) = (&args.trace, &measured) {
            if let Err(e) = write_traces(dir, case, (w, args.reps, seed), times) {
                note!("bench: {}: tracing: {e}", case.key());
            }
        }
        rows.push((case.clone(), measured));
    }
    drop(progress);
    let after = baseline(args.baseline_cmd.as_deref(), &keys, "after")
        .or_else(|| read_json(args.baseline_after.as_deref()))
        .unwrap_or_default();
    // The vendor timed before and after: the faster of the two is compared.
    let mut base = before.clone();
    for (k, v) in &after {
        match (base.get(k).and_then(|x| x.as_f64()), v.as_f64()) {
            (Some(b), Some(a)) if a >= b => {}
            _ => {
                base.insert(k.clone(), v.clone());
            }
        }
    }
    let device = trident_backend_nvidia::runtime::CudaDevice::open(0).map(|d| d.device_name()).unwrap_or_default();
    let (records, text) = dist_report::report(&rows, &base, &format!("{gpus} x {device}"));
    println!("{layout}\n{text}");
    let topology = format!("{device} / {}", if gpus == w { "peer" } else { "loopback" });
    record_crossovers(&rows, &topology, w);
    let failed = rows.iter().any(|(_, m)| m.is_err());
    if let Some(p) = &args.json {
        let doc = serde_json::json!({
            "device": device, "gpus": gpus, "world": w, "layout": layout, "reps": args.reps, "seed": seed,
            "protocol": "host clock per repetition after an L2-evicting copy and a host barrier; the slowest rank's time; median over repetitions",
            "baseline_before": before, "baseline_after": after, "results": records,
        });
        if let Err(e) = std::fs::write(p, serde_json::to_string_pretty(&doc).unwrap_or_default()) {
            println!("bench: cannot write {p}: {e}");
            return ExitCode::FAILURE;
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Events per traced launch (`--trace`): a program records a few per wait and tile.
const TRACE_CAPACITY: usize = 1 << 16;
/// Launches traced per rank and repetition, stream operations' two markers included (buffers
/// made before the run and emptied between repetitions; later ones record nothing).
const TRACE_LAUNCHES: usize = 96;

/// `case` run once more in the peer world of `w` ranks with every kernel traced (`reps`
/// repetitions, each variant's last one kept); each variant's timeline written to
/// `dir/<case>/<variant>.{json,svg}`, its traced time beside the untraced `times` of the same
/// run and those of one more untraced run after the traced one: tracing's cost is reported
/// against their mean, with both shown (runs of a case differ by a few percent where ranks
/// share a GPU, as much as tracing's cost).
fn write_traces(
    dir: &str,
    case: &trident_conformance::dist_bench::DistCase,
    (w, reps, seed): (usize, usize, u64),
    times: &[(String, f64)],
) -> Result<(), String> {
    use trident_backend_nvidia::world::{GpuWorld, GpuWorldOptions};
    use trident_conformance::dist_bench::{combine, run, run_traced};
    use trident_kernels::trace::{perfetto, svg, Timeline};
    let opts = || {
        let mut opts = GpuWorldOptions::new(w);
        opts.heap_bytes = case.heap_bytes();
        opts
    };
    let c = case.clone();
    let ranks =
        GpuWorld::run_peer(opts(), move |ctx| run_traced(ctx, &c, (reps, seed), (TRACE_CAPACITY, TRACE_LAUNCHES)))
            .map_err(|e| e.to_string())?;
    let traced_times = combine(&ranks.iter().map(|r| r.times.clone()).collect::<Vec<_>>());
    let c = case.clone();
    let after =
        GpuWorld::run_peer(opts(), move |ctx| run(ctx, &c, reps, seed)).map(|r| combine(&r)).unwrap_or_default();
    let safe = |s: &str| {
        s.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).collect::<String>()
    };
    let folder = std::path::Path::new(dir).join(safe(&case.key()));
    std::fs::create_dir_all(&folder).map_err(|e| format!("{}: {e}", folder.display()))?;
    let variants: Vec<String> =
        ranks.first().map(|r| r.variants.iter().map(|(n, _)| n.clone()).collect()).unwrap_or_default();
    for name in variants {
        let timeline = Timeline::of(
            ranks
                .iter()
                .map(|r| r.variants.iter().find(|(n, _)| *n == name).map(|(_, l)| l.clone()).unwrap_or_default()),
        );
        let (json_path, svg_path) =
            (folder.join(format!("{}.json", safe(&name))), folder.join(format!("{}.svg", safe(&name))));
        let json = serde_json::to_string(&perfetto::to_json(&timeline)).unwrap_or_default();
        std::fs::write(&json_path, json).map_err(|e| e.to_string())?;
        let title = format!("{} / {name} ({w} ranks)", case.key());
        std::fs::write(&svg_path, svg::render(&timeline, &title)).map_err(|e| e.to_string())?;
        let ms = |list: &[(String, f64)]| list.iter().find(|(n, _)| *n == name).map(|(_, t)| *t);
        let when = match (ms(&traced_times), ms(times), ms(&after)) {
            (Some(t), Some(u), Some(a)) => format!(
                "traced {t:.4} ms, untraced {u:.4} ms before and {a:.4} after ({:+.1}% against their mean)",
                (2.0 * t / (u + a) - 1.0) * 100.0
            ),
            (Some(t), Some(u), None) => {
                format!("traced {t:.4} ms, untraced {u:.4} ms ({:+.1}%)", (t / u - 1.0) * 100.0)
            }
            _ => "not timed".to_string(),
        };
        let clocks = match timeline.clocks.iter().max_by_key(|c| c.uncertainty_ns) {
            Some(worst) => format!(
                "; clocks aligned to rank 0's (offsets {} ns, each within {} ns)",
                timeline.clocks.iter().map(|c| c.offset_ns.to_string()).collect::<Vec<_>>().join(", "),
                worst.uncertainty_ns
            ),
            None => String::new(),
        };
        note!(
            "bench: trace {}: {} launches, {} programs, {} events dropped; {when}{clocks}; clock steps of {} ns at least; waiting: {}",
            json_path.display(),
            timeline.launches.len(),
            timeline.programs().0.len(),
            timeline.dropped(),
            timeline.clock_step_ns().map_or("-".into(), |s| s.to_string()),
            timeline
                .wait_shares()
                .iter()
                .map(|(k, share)| format!("{k} {:.1}%", share * 100.0))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}

/// Every case of operation `op` in `rows` as `(bytes, form, ms)`, its bytes as `bytes_of` says
/// and its variants' forms as `form_of` names them (other variants left out); `None` when a
/// case of it failed.
fn measured<F>(
    rows: &[(trident_conformance::dist_bench::DistCase, crate::dist_report::Measured)],
    op: &str,
    bytes_of: impl Fn(&trident_conformance::dist_bench::DistCase) -> usize,
    form_of: impl Fn(&str) -> Option<F>,
) -> Option<Vec<(usize, F, f64)>> {
    let mut times = Vec::new();
    for (case, m) in rows.iter().filter(|(c, _)| c.name == op) {
        let (variants, _) = m.as_ref().ok()?;
        for (v, ms) in variants {
            times.extend(form_of(v).map(|f| (bytes_of(case), f, *ms)));
        }
    }
    Some(times)
}

/// The AllGather forms' crossovers (by gathered bytes), the AllReduce's (by a rank's bytes) and
/// GEMM + AllReduce's (by the result's bytes) measured in `rows`, into the tuning cache where
/// `AllGather::auto`, `AllReduce::auto` and `gemm_ar_auto::auto` read them for this device,
/// transport and world.
fn record_crossovers(
    rows: &[(trident_conformance::dist_bench::DistCase, crate::dist_report::Measured)],
    topology: &str,
    w: usize,
) {
    use trident_kernels::allgather_auto::{GatherCrossovers, GatherForm};
    use trident_kernels::allreduce::Algorithm;
    use trident_kernels::allreduce_auto::AllReduceCrossover;
    let bytes = |c: &trident_conformance::dist_bench::DistCase| c.dims[0] * c.dtype.size_bytes() as usize;
    let gather = measured(
        rows,
        "allgather",
        |c| bytes(c) * c.world,
        |v| match v {
            "allgather/ll" => Some(GatherForm::LowLatency),
            "allgather/kernel" => Some(GatherForm::Push),
            "allgather/ce" => Some(GatherForm::CopyEngine),
            _ => None,
        },
    );
    if let Some(x) = gather.as_deref().and_then(GatherCrossovers::from_measurements) {
        record_crossover(&GatherCrossovers::tuning_key(topology, w), x);
    }
    let reduce = measured(rows, "allreduce", bytes, |v| match v {
        "allreduce/one_shot" => Some(Algorithm::OneShot),
        "allreduce/two_shot" => Some(Algorithm::TwoShot),
        _ => None,
    });
    if let Some(x) = reduce.as_deref().and_then(AllReduceCrossover::from_measurements) {
        record_crossover(&AllReduceCrossover::tuning_key(topology, w), x);
    }
    let result_bytes =
        |c: &trident_conformance::dist_bench::DistCase| c.dims[0] * c.dims[1] * c.dtype.size_bytes() as usize;
    let gemm_ar = measured(rows, "gemm_ar", result_bytes, |v| match v {
        "gemm_ar" => Some(Algorithm::OneShot),
        "gemm_ar/two-shot" => Some(Algorithm::TwoShot),
        _ => None,
    });
    if let Some(x) = gemm_ar.as_deref().and_then(AllReduceCrossover::from_measurements) {
        record_crossover(&trident_kernels::gemm_ar_auto::tuning_key(topology, w), x);
    }
}

/// Records a measured crossover under `key` in the tuning cache, saying where.
fn record_crossover<C: serde::Serialize + std::fmt::Debug>(key: &trident_kernels::tuning::TuningKey, x: C) {
    let mut cache = trident_kernels::tuning::TuningCache::load(trident_kernels::tuning::TuningCache::default_path());
    match cache.record(key, &trident_kernels::tuning::Tuned { config: &x, ms: 0.0 }) {
        Ok(()) => note!("bench: {}: {x:?} recorded in {}", key.text(), cache.path.display()),
        Err(e) => note!("bench: {}: the tuning cache {} cannot be written: {e}", key.text(), cache.path.display()),
    }
}

/// `trident bench`: the benchmark `args` select. (Modules load eagerly, so that the loopback
/// case's kernels can spin while others launch: `CudaDevice::open` sees to it.)
pub fn main(args: Args) -> ExitCode {
    if let Some(paths) = args.plot.as_deref() {
        return plot(paths, args.plot_dir.as_deref());
    }
    if let Some([a, b]) = args.compare.as_deref() {
        return compare(a, b);
    }
    if let Some(w) = args.world {
        return world_main(&args, w);
    }
    let chosen: Result<Vec<Case>, String> =
        if args.gemms.is_empty() { Ok(cases()) } else { args.gemms.iter().map(|g| gemm_case(g)).collect() };
    let chosen = match chosen {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if args.cases {
        for c in &chosen {
            println!("{}", c.key());
        }
        return ExitCode::SUCCESS;
    }
    let opened: Result<Arc<dyn Driver>, BackendError> = match args.backend.as_str() {
        "nvidia" => trident_backend_nvidia::runtime::CudaDevice::open(0).map(|d| Arc::new(d) as Arc<dyn Driver>),
        // Untested: no AMD GPU has been available. The baseline script runs unchanged on PyTorch
        // for ROCm (`torch.matmul` is rocBLAS/hipBLASLt there).
        "amd" => trident_backend_amd::hip::HipDevice::open(0).map(|d| Arc::new(d) as Arc<dyn Driver>),
        other => {
            eprintln!("error: --backend {other}: the benchmark runs on nvidia or amd");
            return ExitCode::from(2);
        }
    };
    let drv = match opened {
        Ok(d) => d,
        Err(e) => {
            let present = trident_gpu_runtime::discovery::summary();
            println!("bench: skipped: backend {}: {e} ({present})", args.backend);
            return ExitCode::SUCCESS;
        }
    };
    let device = drv.device_name();
    let read = |p: &Option<String>| read_json(p.as_deref()).unwrap_or_default();
    let selected: Vec<Case> =
        chosen.into_iter().filter(|c| args.only.as_ref().is_none_or(|o| c.key().contains(o.as_str()))).collect();
    let keys: Vec<String> = selected.iter().map(Case::key).collect();
    let run_baseline = |when: &str| baseline(args.baseline_cmd.as_deref(), &keys, when);
    let before = run_baseline("before").unwrap_or_else(|| read(&args.baseline));
    // Each case's figure as soon as it is measured (a run cut short keeps what it printed).
    let progress = trident_conformance::progress::Progress::new(selected.len(), "bench");
    let measured: Vec<(Case, Result<Measured, BackendError>)> = selected
        .iter()
        .map(|c| {
            progress.step(&c.key());
            let r = run_case(&drv, c, args.reps, &args.configs);
            let base = before.get(&c.key()).and_then(|v| v.as_f64());
            match &r {
                Ok(m) => note!(
                    "bench: {}: {:.3} ms ({}), baseline before {}",
                    c.key(),
                    m.ms.median,
                    m.config,
                    base.map_or("-".into(), |b| format!("{b:.3} ms = {:.3}x", b / m.ms.median))
                ),
                Err(e) => note!("bench: {}: {e}", c.key()),
            }
            (c.clone(), r)
        })
        .collect();
    drop(progress);
    let after = run_baseline("after").unwrap_or_else(|| read(&args.baseline_after));
    // A baseline timed before and after trident: the faster of the two is the one compared.
    let base_of = |key: &str| -> (Option<f64>, Option<f64>, Option<f64>) {
        let (b, a) = (before.get(key).and_then(|v| v.as_f64()), after.get(key).and_then(|v| v.as_f64()));
        let best = match (b, a) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        (best, b, a)
    };
    println!("device: {device}");
    println!(
        "{:<30} {:>9} {:>17} {:>11} {:>9} {:>8} {:>9} {:>8} {:>8} {:>8}  config",
        "case", "ms", "spread", "rate", "base ms", "vs base", "triton ms", "vs trit", "floor ms", "error"
    );
    let mut records = Vec::new();
    let mut failed = false;
    for (case, result) in measured {
        let (flops, bytes) = case.work();
        let rate = |ms: f64| {
            if case.is_gemm() {
                format!("{:.1} TF/s", flops / ms / 1e9)
            } else {
                format!("{:.0} GB/s", bytes / ms / 1e6)
            }
        };
        let (base, base_before, base_after) = base_of(&case.key());
        let (triton, _, _) = base_of(&format!("triton {}", case.key()));
        let show = |x: Option<f64>, p: usize| x.map(|x| format!("{x:.p$}")).unwrap_or_else(|| "-".into());
        match result {
            Ok(m) => {
                let ms = m.ms.median;
                println!(
                    "{:<30} {:>9.3} {:>17} {:>11} {:>9} {:>8} {:>9} {:>8} {:>8.3} {:>8.1e}  {}",
                    case.key(),
                    ms,
                    format!("{:.3}-{:.3}", m.ms.min, m.ms.max),
                    rate(ms),
                    show(base, 3),
                    base.map(|b| format!("{:.3}x", b / ms)).unwrap_or_else(|| "-".into()),
                    show(triton, 3),
                    triton.map(|b| format!("{:.3}x", b / ms)).unwrap_or_else(|| "-".into()),
                    case.floor_ms(&device),
                    m.error,
                    m.config
                );
                records.push(serde_json::json!({
                    "case": case.key(), "trident_ms": ms, "trident_min_ms": m.ms.min, "trident_max_ms": m.ms.max,
                    "reps": args.reps, "host_enqueue_us": m.ms.host_us, "baseline_ms": base, "baseline_before_ms": base_before,
                    "baseline_after_ms": base_after, "speedup_vs_baseline": base.map(|b| b / ms),
                    "triton_ms": triton, "speedup_vs_triton": triton.map(|t| t / ms),
                    "floor_ms": case.floor_ms(&device), "max_error": m.error, "config": m.config,
                }));
            }
            Err(e) => {
                failed = true;
                println!("{:<30} FAILED: {e}", case.key());
                records.push(serde_json::json!({ "case": case.key(), "error": e.to_string() }));
            }
        }
    }
    if let Some(p) = args.json {
        let doc = serde_json::json!({ "device": device, "backend": args.backend, "results": records });
        if let Err(e) = std::fs::write(&p, serde_json::to_string_pretty(&doc).unwrap_or_default()) {
            println!("bench: cannot write {p}: {e}");
            failed = true;
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Whether the GEMM sweeps try consumer ping-pong (`TRIDENT_SWEEP_PINGPONG=1`). Off by default
/// since its first hardware run (H100, 2026-12-05): at K = 4096 the FP8 form failed its launch
/// and the bf16 form did not finish, where the conformance cases (K up to 272) pass. A group
/// can wait on a ring stage a whole tile ahead of the producer, and an mbarrier's parity wait
/// then passes on an older phase of the same parity (DECISIONS, "Consumer ping-pong"); the
/// fix is CUTLASS's order barrier between the groups' main loops.
fn sweep_pingpong() -> bool {
    std::env::var("TRIDENT_SWEEP_PINGPONG").is_ok_and(|v| v == "1")
}

#[cfg(test)]
mod tests {
    use super::grouped_rows;

    /// The benchmark's routings: every token routed once; skewed: one expert with half, a
    /// quarter of the experts empty, the rest within one token of each other.
    #[test]
    fn grouped_routings_route_every_token() {
        for (experts, tokens) in [(32, 32), (16, 1024), (8, 1024), (5, 3)] {
            assert_eq!(grouped_rows(experts, tokens, 0), vec![tokens; experts]);
            let skewed = grouped_rows(experts, tokens, 1);
            assert_eq!(skewed.iter().sum::<usize>(), experts * tokens);
            assert_eq!(skewed.iter().filter(|&&r| r == 0).count(), experts / 4);
            assert_eq!(skewed[experts / 4], experts * tokens / 2);
            let rest: Vec<usize> = skewed[experts / 4 + 1..].to_vec();
            assert!(rest.iter().max().unwrap() - rest.iter().min().unwrap() <= 1, "{skewed:?}");
        }
    }
}
