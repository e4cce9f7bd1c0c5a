//! Distributed cases: a world of ranks runs each kernel's host orchestration SPMD; every rank's
//! output is checked against an f64 reference of the whole collective.

use crate::cases::Case;
use crate::host::{decode, encode, poison, random};
use crate::reference;
use std::sync::Arc;
use trident_backend_cpu::world::{CpuWorld, WorldOptions};
use trident_backend_nvidia::nvshmem_world::NvshmemWorld;
use trident_backend_nvidia::world::{GpuWorld, GpuWorldOptions};
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::DType;
use trident_core::world::RankCtx;
use trident_kernels::ag_gemm::{AgGemm, GatherMode};
use trident_kernels::allgather::{AllGather, AllGatherCe, GatherBuffers};
use trident_kernels::allreduce::{Algorithm, AllReduce};
use trident_kernels::gemm_rs::GemmRs;
use trident_kernels::ring_shift::{RingShift, ShiftMode};

/// Where a distributed case runs.
#[derive(Clone, Debug)]
pub enum WorldKind {
    /// The CPU world: tile interpreter, or the SIMT lowering at a warp size.
    Cpu { race: bool, simt_target: Option<&'static str>, compile_check: Option<trident_core::backend::CompileCheck> },
    /// A world of threads on GPUs: every rank on GPU 0 (the loopback world), or with `peer` one
    /// rank per GPU of the node (the peer world; ranks share GPUs when there are fewer).
    Gpu { peer: bool },
    /// The world of processes this process is one rank of (NVSHMEM, `trident launch`); every
    /// rank's output comes back through the rendezvous so that each process judges the whole
    /// collective. `plant_dead`: that rank exits just before its first launch or copy.
    Processes { world: Arc<NvshmemWorld>, plant_dead: Option<usize> },
}

/// Kernels that run in a world, with their variants and shapes.
pub const KERNELS: &[(&str, &[&str])] = &[
    ("allgather", &["push", "ce"]),
    ("allreduce", &["oneshot", "twoshot"]),
    ("ag_gemm", &["ce", "kernel"]),
    // `tma`: A and B read by TMA where the target has it and the arguments are divisible.
    ("gemm_rs", &["-", "tma"]),
    ("ring_shift", &["put", "get"]),
];

/// World sizes every distributed kernel runs at.
pub const WORLDS: [usize; 4] = [1, 2, 4, 8];

/// A kernel's shapes at world size `world`. GEMM-RS splits M over the ranks in power-of-two
/// tiles, so M stays as it is where `M / world` is a power of two and becomes a multiple of
/// `16 world` otherwise; AG-GEMM's M (over all ranks) becomes a multiple of `world`.
pub fn shapes(kernel: &str, world: usize) -> Vec<Vec<usize>> {
    let split = |m: usize| {
        if m.is_multiple_of(world) && (m / world).is_power_of_two() {
            m
        } else {
            m.next_multiple_of(16 * world)
        }
    };
    match kernel {
        // elements per rank
        "allgather" | "ring_shift" => vec![vec![777], vec![4096]],
        // elements
        "allreduce" => vec![vec![1000], vec![8197]],
        // M, N, K (M over all ranks; N per rank)
        "ag_gemm" => {
            // (The third: more rows of tiles than a group of the grouped raster order holds,
            // at 64- and 128-row tiles, the last group partial.)
            vec![
                vec![128usize.next_multiple_of(world), 96, 64],
                vec![64usize.next_multiple_of(world), 40, 72],
                vec![1152usize.next_multiple_of(world), 48, 32],
            ]
        }
        // M, N, K (M over all ranks)
        _ => vec![vec![split(128), 64, 32], vec![split(64), 80, 24], vec![split(1152), 48, 32]],
    }
}

/// Inputs of every rank and the output every rank must end with.
pub struct WorldData {
    pub inputs: Vec<Vec<Vec<f64>>>,
    pub expected: Vec<Vec<f64>>,
    pub reduction_len: usize,
}

pub fn prepare(case: &Case, rng: &mut rand::rngs::StdRng) -> WorldData {
    let (w, d, s) = (case.world, case.dtype, &case.shape);
    match case.kernel {
        "allgather" => {
            let inputs: Vec<Vec<Vec<f64>>> = (0..w).map(|_| vec![random(s[0], d, rng)]).collect();
            let all: Vec<f64> = inputs.iter().flat_map(|i| i[0].clone()).collect();
            WorldData { expected: vec![all; w], inputs, reduction_len: 1 }
        }
        "ring_shift" => {
            let inputs: Vec<Vec<Vec<f64>>> = (0..w).map(|_| vec![random(s[0], d, rng)]).collect();
            let expected = (0..w).map(|r| inputs[(r + w - 1) % w][0].clone()).collect();
            WorldData { expected, inputs, reduction_len: 1 }
        }
        "allreduce" => {
            let inputs: Vec<Vec<Vec<f64>>> = (0..w).map(|_| vec![random(s[0], d, rng)]).collect();
            let sum: Vec<f64> = (0..s[0]).map(|i| inputs.iter().map(|x| x[0][i]).sum()).collect();
            WorldData { expected: vec![sum; w], inputs, reduction_len: w }
        }
        "ag_gemm" => {
            let (m, n, k) = (s[0], s[1], s[2]);
            let a = random(m * k, d, rng);
            let rows = m / w.max(1);
            let mut inputs = Vec::new();
            let mut expected = Vec::new();
            for r in 0..w {
                let b = random(k * n, d, rng);
                expected.push(reference::gemm(&a, &b, m, n, k));
                inputs.push(vec![a[r * rows * k..(r + 1) * rows * k].to_vec(), b]);
            }
            WorldData { inputs, expected, reduction_len: k }
        }
        _ => {
            let (m, n, k) = (s[0], s[1], s[2]);
            let inputs: Vec<Vec<Vec<f64>>> =
                (0..w).map(|_| vec![random(m * k, d, rng), random(k * n, d, rng)]).collect();
            let mut total = vec![0.0; m * n];
            for x in &inputs {
                for (t, v) in total.iter_mut().zip(reference::gemm(&x[0], &x[1], m, n, k)) {
                    *t += v;
                }
            }
            let rows = m / w;
            let expected = (0..w).map(|r| total[r * rows * n..(r + 1) * rows * n].to_vec()).collect();
            WorldData { inputs, expected, reduction_len: k * w }
        }
    }
}

fn upload(ctx: &dyn RankCtx, name: &str, values: &[f64], d: DType) -> Result<Buffer, BackendError> {
    let b = ctx.alloc(values.len() * d.size_bytes() as usize, name)?;
    ctx.write(&b, 0, &encode(values, d))?;
    Ok(b)
}

fn download(ctx: &dyn RankCtx, b: &Buffer, len: usize, d: DType) -> Result<Vec<f64>, BackendError> {
    let mut bytes = vec![0u8; len * d.size_bytes() as usize];
    ctx.read(b, 0, &mut bytes)?;
    Ok(decode(&bytes, d))
}

/// Runs one rank's part of a case; returns its output.
fn rank_main(case: &Case, data: &WorldData, ctx: &dyn RankCtx) -> Result<Vec<f64>, BackendError> {
    let (d, s, r) = (case.dtype, &case.shape, ctx.rank());
    let inputs: Vec<Buffer> = data.inputs[r]
        .iter()
        .enumerate()
        .map(|(i, v)| upload(ctx, &format!("in{i}"), v, d))
        .collect::<Result<_, _>>()?;
    let len = data.expected[r].len();
    match (case.kernel, case.variant) {
        ("allgather", variant) => {
            let mut bufs = GatherBuffers::new(ctx, d, s[0])?;
            ctx.fill(&bufs.out, &poison(d))?;
            ctx.barrier()?;
            if variant == "push" {
                AllGather::new(d).run(ctx, &mut bufs, &inputs[0])?;
            } else {
                AllGatherCe { dtype: d }.run(ctx, &mut bufs, &inputs[0])?;
            }
            download(ctx, &bufs.out, len, d)
        }
        ("ring_shift", variant) => {
            let mode = if variant == "put" { ShiftMode::Put } else { ShiftMode::Get };
            let op = RingShift::new(d, mode);
            let mut bufs = op.buffers(ctx, s[0])?;
            ctx.write(&bufs.src, 0, &encode(&data.inputs[r][0], d))?;
            ctx.fill(&bufs.out, &poison(d))?;
            ctx.barrier()?;
            op.run(ctx, &mut bufs)?;
            download(ctx, &bufs.out, len, d)
        }
        ("allreduce", variant) => {
            let algo = if variant == "oneshot" { Algorithm::OneShot } else { Algorithm::TwoShot };
            // At most 4 programs: the larger shape's programs loop over several blocks, as every
            // program does at the benchmark's sizes (at most 128 programs by default).
            let ar = AllReduce { max_programs: 4, ..AllReduce::new(d, algo) };
            let mut bufs = ar.buffers(ctx, s[0])?;
            ctx.fill(&bufs.out, &poison(d))?;
            ctx.barrier()?;
            ar.run(ctx, &mut bufs, &inputs[0])?;
            download(ctx, &bufs.out, len, d)
        }
        ("ag_gemm", variant) => {
            let mode = if variant == "ce" { GatherMode::CopyEngine } else { GatherMode::Kernel };
            let (m, n, k) = (s[0], s[1], s[2]);
            let op = AgGemm::for_world(ctx, d, mode);
            let mut bufs = op.buffers(ctx, m, k)?;
            let c = ctx.alloc(m * n * d.size_bytes() as usize, "c")?;
            ctx.fill(&c, &poison(d))?;
            ctx.barrier()?;
            op.run(ctx, &mut bufs, &inputs[0], &inputs[1], &c, n)?;
            download(ctx, &c, len, d)
        }
        _ => {
            let (m, n, k) = (s[0], s[1], s[2]);
            // The library's choice for this world: the reduction persistent where ranks share
            // a device (the CPU world above one rank, loopback), a program per tile elsewhere.
            let mut op = GemmRs::for_world(ctx, d);
            op.gemm.descriptors = case.variant == "tma";
            let mut bufs = op.buffers(ctx, m, n)?;
            let out = ctx.alloc(len * d.size_bytes() as usize, "out")?;
            ctx.fill(&out, &poison(d))?;
            ctx.barrier()?;
            op.run(ctx, &mut bufs, &inputs[0], &inputs[1], &out, k)?;
            download(ctx, &out, len, d)
        }
    }
}

/// Runs a case in a world with the given schedule seed; returns every rank's output. With
/// `inter_node`, every kernel is compiled with all its communication at inter-node scope.
pub fn execute(
    case: &Case,
    data: Arc<WorldData>,
    schedule_seed: u64,
    kind: WorldKind,
    inter_node: bool,
) -> Result<Vec<Vec<f64>>, BackendError> {
    let case2 = case.clone();
    let steer = move |ctx: &dyn RankCtx, die: bool| {
        if die || inter_node {
            rank_main(&case2, &data, &Steered { inner: ctx, die, inter_node })
        } else {
            rank_main(&case2, &data, ctx)
        }
    };
    match kind {
        WorldKind::Cpu { race, simt_target, compile_check } => {
            let opts =
                WorldOptions { race, simt_target, compile_check, ..WorldOptions::new(case.world, schedule_seed) };
            CpuWorld::run(opts, move |ctx| steer(ctx, false)).map(|run| run.results)
        }
        WorldKind::Gpu { peer: false } => GpuWorld::run(GpuWorldOptions::new(case.world), move |ctx| steer(ctx, false)),
        WorldKind::Gpu { peer: true } => {
            GpuWorld::run_peer(GpuWorldOptions::new(case.world), move |ctx| steer(ctx, false))
        }
        WorldKind::Processes { world, plant_dead } => {
            let mine = world.run(&|ctx| steer(ctx, plant_dead == Some(ctx.rank())));
            // Every rank's outcome: 0 and its output's f64s, or 1 and its error.
            let payload = match &mine {
                Ok(v) => std::iter::once(0u8).chain(v.iter().flat_map(|x| x.to_le_bytes())).collect(),
                Err(e) => std::iter::once(1u8).chain(e.to_string().into_bytes()).collect::<Vec<u8>>(),
            };
            let all = match (world.all_gather("outputs", &payload), mine) {
                (Ok(all), _) => all,
                (Err(_), Err(e)) => return Err(e),
                (Err(e), Ok(_)) => return Err(e),
            };
            all.iter()
                .enumerate()
                .map(|(rank, b)| match b.split_first() {
                    Some((0, v)) => {
                        Ok(v.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap_or_default())).collect())
                    }
                    Some((_, m)) => Err(BackendError::Rank {
                        rank,
                        error: Box::new(BackendError::Host(String::from_utf8_lossy(m).into_owned())),
                    }),
                    None => Err(BackendError::Host(format!("rank {rank} sent no outcome"))),
                })
                .collect()
        }
    }
}

/// A rank's context with the suite's switches applied: `die`, the rank exits just before its
/// first launch or copy (its buffers exist, the others are past the barrier that precedes the
/// kernels, and their waits for its signals can only end through their bounds); `inter_node`,
/// every kernel is compiled with all its communication at inter-node scope.
struct Steered<'a> {
    inner: &'a dyn RankCtx,
    die: bool,
    inter_node: bool,
}

impl Steered<'_> {
    fn die(&self) {
        if self.die {
            eprintln!("rank {}: planted death before its first launch (--plant-dead-rank)", self.inner.rank());
            std::process::exit(3)
        }
    }
}

impl RankCtx for Steered<'_> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn ranks_sharing_device(&self) -> usize {
        self.inner.ranks_sharing_device()
    }
    fn backend(&self) -> &dyn trident_core::backend::Backend {
        self.inner.backend()
    }
    fn target(&self) -> Option<String> {
        self.inner.target()
    }
    fn compile(
        &self,
        key: &str,
        build: &dyn Fn() -> Result<trident_core::Function, trident_core::VerifyError>,
    ) -> Result<trident_core::backend::Artifact, BackendError> {
        if !self.inter_node {
            return self.inner.compile(key, build);
        }
        self.inner.compile(&format!("{key}+inter_node"), &|| {
            let mut f = build()?;
            f.attrs.inter_node = true;
            Ok(f)
        })
    }
    fn alloc(&self, bytes: usize, name: &str) -> Result<Buffer, BackendError> {
        self.inner.alloc(bytes, name)
    }
    fn symm_alloc(&self, bytes: usize, name: &str) -> Result<Buffer, BackendError> {
        self.inner.symm_alloc(bytes, name)
    }
    fn peer(&self, buffer: &Buffer, rank: usize) -> Result<Buffer, BackendError> {
        self.inner.peer(buffer, rank)
    }
    fn write(&self, buffer: &Buffer, offset: usize, data: &[u8]) -> Result<(), BackendError> {
        self.inner.write(buffer, offset, data)
    }
    fn read(&self, buffer: &Buffer, offset: usize, out: &mut [u8]) -> Result<(), BackendError> {
        self.inner.read(buffer, offset, out)
    }
    fn launch(
        &self,
        stream: trident_core::world::StreamId,
        kernel: &trident_core::backend::Artifact,
        grid: [u32; 3],
        args: &[trident_core::backend::KernelArg],
    ) -> Result<(), BackendError> {
        self.die();
        self.inner.launch(stream, kernel, grid, args)
    }
    fn copy(
        &self,
        stream: trident_core::world::StreamId,
        dst: &Buffer,
        dst_offset: usize,
        src: &Buffer,
        src_offset: usize,
        bytes: usize,
    ) -> Result<(), BackendError> {
        self.die();
        self.inner.copy(stream, dst, dst_offset, src, src_offset, bytes)
    }
    fn write_signal(
        &self,
        stream: trident_core::world::StreamId,
        signal: &Buffer,
        offset: usize,
        value: u64,
    ) -> Result<(), BackendError> {
        self.inner.write_signal(stream, signal, offset, value)
    }
    fn wait_signal(
        &self,
        stream: trident_core::world::StreamId,
        signal: &Buffer,
        offset: usize,
        cmp: trident_core::ir::CmpOp,
        value: u64,
    ) -> Result<(), BackendError> {
        self.inner.wait_signal(stream, signal, offset, cmp, value)
    }
    fn synchronize(&self) -> Result<(), BackendError> {
        self.inner.synchronize()
    }
    fn barrier(&self) -> Result<(), BackendError> {
        self.inner.barrier()
    }
}
