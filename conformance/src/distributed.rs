//! Distributed cases: a world of ranks runs each operation's host orchestration SPMD (its
//! `Operation::run_rank`); every rank's output is checked against an f64 reference of the
//! whole collective.

use crate::host::{decode, encode};
use crate::registry::WorldData;
use crate::suite::Case;
use std::sync::Arc;
use trident_backend_cpu::world::{CpuWorld, WorldOptions};
use trident_backend_nvidia::nvshmem_world::NvshmemWorld;
use trident_backend_nvidia::world::{GpuWorld, GpuWorldOptions};
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::DType;
use trident_core::world::RankCtx;

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

/// A new buffer of this rank holding `values` encoded in `d`.
pub fn upload(ctx: &dyn RankCtx, name: &str, values: &[f64], d: DType) -> Result<Buffer, BackendError> {
    let b = ctx.alloc(values.len() * d.size_bytes() as usize, name)?;
    ctx.write(&b, 0, &encode(values, d))?;
    Ok(b)
}

/// The first `len` elements of `b`, decoded from `d`.
pub fn download(ctx: &dyn RankCtx, b: &Buffer, len: usize, d: DType) -> Result<Vec<f64>, BackendError> {
    let mut bytes = vec![0u8; len * d.size_bytes() as usize];
    ctx.read(b, 0, &mut bytes)?;
    Ok(decode(&bytes, d))
}

/// How a distributed case makes its calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Calls {
    /// `n` calls on the same buffers, each enqueued from the host.
    Direct(usize),
    /// One call recorded (`trident_core::capture`), replayed `n` times.
    Replayed(usize),
    /// A planted timeout, then `n` calls: every rank makes one call, the last rank skips the
    /// second (the waits of the ranks that need its part time out, with their diagnostics),
    /// every rank re-arms the operation ([`RankOp::rearm`]), and `n` calls follow from epoch 0.
    /// Each rank's outputs end with one more entry, `[1.0]` if a wait of its timed out, else
    /// `[0.0]` (the suite requires one rank's). In the CPU world device waits then time out
    /// where the world would deadlock (`WorldOptions::timeouts`).
    Rearmed(usize),
}

impl Calls {
    /// How many calls are checked.
    pub fn count(self) -> usize {
        match self {
            Calls::Direct(n) | Calls::Replayed(n) | Calls::Rearmed(n) => n,
        }
    }
}

/// The planted timeout of [`Calls::Rearmed`]: one good call, one the last rank skips, the
/// re-arm. Returns whether a wait of this rank timed out.
fn plant_timeout(op: &mut dyn crate::registry::RankOp, ctx: &dyn RankCtx) -> Result<bool, BackendError> {
    ctx.barrier()?;
    op.enqueue(ctx)?;
    ctx.synchronize()?;
    ctx.barrier()?;
    if ctx.rank() + 1 < ctx.world_size() {
        op.enqueue(ctx)?;
    }
    let timed_out = match ctx.synchronize() {
        Ok(()) => false,
        Err(e) if e.to_string().contains("timed out") => true,
        Err(e) => return Err(e),
    };
    op.rearm(ctx)?;
    Ok(timed_out)
}

/// Runs one rank's part of a case (its inputs uploaded first, the operation set up once); returns
/// its output of every call. Each call's output is poisoned before it, and every rank meets the
/// others before and after it.
fn rank_main(case: &Case, data: &WorldData, ctx: &dyn RankCtx, calls: Calls) -> Result<Vec<Vec<f64>>, BackendError> {
    let (d, r) = (case.dtype, ctx.rank());
    let ins: Vec<Buffer> = data.inputs[r]
        .iter()
        .enumerate()
        .map(|(i, v)| upload(ctx, &format!("in{i}"), v, d))
        .collect::<Result<_, _>>()?;
    let mut op = case.op.setup_rank(case, ctx, &data.inputs[r], &ins, data.expected[r].len())?;
    let timed_out = match calls {
        Calls::Rearmed(_) => Some(plant_timeout(op.as_mut(), ctx)?),
        _ => None,
    };
    let recording = match calls {
        Calls::Replayed(_) => Some(trident_core::capture::capture(ctx, |c| op.enqueue(c))?),
        Calls::Direct(_) | Calls::Rearmed(_) => None,
    };
    let mut outputs = Vec::new();
    for call in 1..=calls.count() as u64 {
        op.poison(ctx, call)?;
        ctx.barrier()?;
        match &recording {
            Some(rec) => rec.replay(ctx)?,
            None => op.enqueue(ctx)?,
        }
        ctx.synchronize()?;
        ctx.barrier()?;
        outputs.push(op.result(ctx, call)?);
    }
    if let Some(t) = timed_out {
        outputs.push(vec![if t { 1.0 } else { 0.0 }]);
    }
    Ok(outputs)
}

/// Runs a case in a world with the given schedule seed; returns every rank's output. With
/// `inter_node`, every kernel is compiled with all its communication at inter-node scope.
pub fn execute(
    case: &Case,
    data: Arc<WorldData>,
    schedule_seed: u64,
    kind: WorldKind,
    inter_node: bool,
    calls: Calls,
) -> Result<Vec<Vec<Vec<f64>>>, BackendError> {
    let case2 = case.clone();
    let steer = move |ctx: &dyn RankCtx, die: bool| {
        if die || inter_node {
            rank_main(&case2, &data, &Steered { inner: ctx, die, inter_node }, calls)
        } else {
            rank_main(&case2, &data, ctx, calls)
        }
    };
    match kind {
        WorldKind::Cpu { race, simt_target, compile_check } => {
            let timeouts = matches!(calls, Calls::Rearmed(_));
            let opts = WorldOptions {
                race,
                simt_target,
                compile_check,
                timeouts,
                ..WorldOptions::new(case.world, schedule_seed)
            };
            CpuWorld::run(opts, move |ctx| steer(ctx, false)).map(|run| run.results)
        }
        WorldKind::Gpu { peer: false } => GpuWorld::run(GpuWorldOptions::new(case.world), move |ctx| steer(ctx, false)),
        WorldKind::Gpu { peer: true } => {
            GpuWorld::run_peer(GpuWorldOptions::new(case.world), move |ctx| steer(ctx, false))
        }
        WorldKind::Processes { world, plant_dead } => {
            let mine = world.run(&|ctx| steer(ctx, plant_dead == Some(ctx.rank())));
            // Every rank's outcome: 0 and each call's output (its length, then its f64s), or 1
            // and its error.
            let payload = match &mine {
                Ok(calls) => std::iter::once(0u8)
                    .chain(calls.iter().flat_map(|v| {
                        (v.len() as u64).to_le_bytes().into_iter().chain(v.iter().flat_map(|x| x.to_le_bytes()))
                    }))
                    .collect(),
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
                        let words: Vec<u64> =
                            v.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default())).collect();
                        let mut calls = Vec::new();
                        let mut rest = words.as_slice();
                        while let Some((&len, tail)) = rest.split_first() {
                            let (out, next) = tail.split_at((len as usize).min(tail.len()));
                            calls.push(out.iter().map(|x| f64::from_bits(*x)).collect());
                            rest = next;
                        }
                        Ok(calls)
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
    trident_core::forward_rank_ctx!(
        identity,
        memory,
        capturing,
        write_signal,
        wait_signal,
        synchronize,
        barrier,
        rearm_barrier_all,
        follow_stream,
        join_stream
    );
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
}
