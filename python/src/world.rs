//! The library's collectives on a world of ranks, driven from Python: every rank's input in,
//! every rank's output out. Today the CPU world (threads under its seeded scheduler, with
//! `race` the happens-before race detector): what a porter runs on a laptop; the GPU worlds
//! from `torch.distributed` are the next step of the package.

use crate::errors;
use pyo3::prelude::*;
use std::sync::Arc;
use trident_backend_cpu::world::{CpuWorld, WorldOptions};
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::DType;
use trident_core::world::RankCtx;
use trident_kernels::allgather::{AllGather, GatherBuffers};
use trident_kernels::allreduce::{Algorithm, AllReduce};
use trident_kernels::moe_block::Experts;
use trident_kernels::reduce_scatter::{ReduceScatter, ScatterAlgorithm};

fn dtype(name: &str) -> PyResult<DType> {
    DType::parse(name).ok_or_else(|| errors::argument(format!("`{name}` is not an element type")))
}

/// Every rank's input, checked: as many as ranks, the same length, whole elements.
fn elements(inputs: &[Vec<u8>], d: DType, what: &str) -> PyResult<usize> {
    let es = d.size_bytes() as usize;
    let n = inputs.first().map_or(0, Vec::len);
    if inputs.is_empty() || inputs.len() > trident_backend_cpu::world::MAX_RANKS {
        return Err(errors::argument(format!(
            "{what}: one input per rank, 1..={} ranks, not {}",
            trident_backend_cpu::world::MAX_RANKS,
            inputs.len()
        )));
    }
    if let Some((r, b)) = inputs.iter().enumerate().find(|(_, b)| b.len() != n) {
        return Err(errors::argument(format!("{what}: rank {r}'s input has {} bytes, rank 0's {n}", b.len())));
    }
    if n == 0 || !n.is_multiple_of(es) {
        return Err(errors::argument(format!("{what}: {n} bytes is not a positive number of {d} elements")));
    }
    Ok(n / es)
}

/// Runs `host` on a CPU world of `inputs.len()` ranks; returns every rank's result.
fn cpu_world<T: Send + 'static>(
    py: Python<'_>,
    ranks: usize,
    seed: u64,
    race: bool,
    host: impl Fn(&dyn RankCtx) -> Result<T, BackendError> + Send + Sync + 'static,
) -> PyResult<Vec<T>> {
    let opts = WorldOptions { race, ..WorldOptions::new(ranks, seed) };
    py.detach(|| CpuWorld::run(opts, host)).map(|r| r.results).map_err(errors::backend)
}

/// A rank's input as a buffer of its own.
fn upload(ctx: &dyn RankCtx, bytes: &[u8], name: &str) -> Result<trident_core::backend::Buffer, BackendError> {
    let b = ctx.alloc(bytes.len(), name)?;
    ctx.write(&b, 0, bytes)?;
    Ok(b)
}

fn download(ctx: &dyn RankCtx, b: &trident_core::backend::Buffer, bytes: usize) -> Result<Vec<u8>, BackendError> {
    let mut out = vec![0u8; bytes];
    ctx.read(b, 0, &mut out)?;
    Ok(out)
}

/// AllGather: rank r's output is every rank's input, in rank order (the in-kernel push).
#[pyfunction]
#[pyo3(signature = (inputs, dtype_name, seed = 0, race = false))]
pub fn all_gather(
    py: Python<'_>,
    inputs: Vec<Vec<u8>>,
    dtype_name: &str,
    seed: u64,
    race: bool,
) -> PyResult<Vec<Vec<u8>>> {
    let d = dtype(dtype_name)?;
    let chunk = elements(&inputs, d, "all_gather")?;
    let (w, inputs) = (inputs.len(), Arc::new(inputs));
    cpu_world(py, w, seed, race, move |ctx| {
        let src = upload(ctx, &inputs[ctx.rank()], "src")?;
        let mut bufs = GatherBuffers::new(ctx, d, chunk)?;
        AllGather::new(d).run(ctx, &mut bufs, &src)?;
        download(ctx, &bufs.result(bufs.calls), w * chunk * d.size_bytes() as usize)
    })
}

/// AllReduce (sum): every rank's output is the sum of the inputs (`one_shot` or `two_shot`).
#[pyfunction]
#[pyo3(signature = (inputs, dtype_name, algorithm = "one_shot", seed = 0, race = false))]
pub fn all_reduce(
    py: Python<'_>,
    inputs: Vec<Vec<u8>>,
    dtype_name: &str,
    algorithm: &str,
    seed: u64,
    race: bool,
) -> PyResult<Vec<Vec<u8>>> {
    let d = dtype(dtype_name)?;
    let algorithm = match algorithm {
        "one_shot" => Algorithm::OneShot,
        "two_shot" => Algorithm::TwoShot,
        a => return Err(errors::argument(format!("all_reduce: algorithm `{a}`: one_shot or two_shot"))),
    };
    let n = elements(&inputs, d, "all_reduce")?;
    let (w, inputs) = (inputs.len(), Arc::new(inputs));
    cpu_world(py, w, seed, race, move |ctx| {
        let input = upload(ctx, &inputs[ctx.rank()], "input")?;
        let op = AllReduce::new(d, algorithm);
        let mut bufs = op.buffers(ctx, n)?;
        op.run(ctx, &mut bufs, &input)?;
        download(ctx, &bufs.result(bufs.calls), n * d.size_bytes() as usize)
    })
}

/// ReduceScatter (sum): each rank's input holds `world` chunks; rank r's output is the sum of
/// every rank's chunk r (`ring` or `one_shot`).
#[pyfunction]
#[pyo3(signature = (inputs, dtype_name, algorithm = "ring", seed = 0, race = false))]
pub fn reduce_scatter(
    py: Python<'_>,
    inputs: Vec<Vec<u8>>,
    dtype_name: &str,
    algorithm: &str,
    seed: u64,
    race: bool,
) -> PyResult<Vec<Vec<u8>>> {
    let d = dtype(dtype_name)?;
    let algorithm = match algorithm {
        "ring" => ScatterAlgorithm::Ring,
        "one_shot" => ScatterAlgorithm::OneShot,
        a => return Err(errors::argument(format!("reduce_scatter: algorithm `{a}`: ring or one_shot"))),
    };
    let n = elements(&inputs, d, "reduce_scatter")?;
    let w = inputs.len();
    if !n.is_multiple_of(w) {
        return Err(errors::argument(format!("reduce_scatter: {n} elements per rank do not split into {w} chunks")));
    }
    let (chunk, inputs) = (n / w, Arc::new(inputs));
    cpu_world(py, w, seed, race, move |ctx| {
        let input = upload(ctx, &inputs[ctx.rank()], "input")?;
        let op = ReduceScatter::new(d, algorithm);
        let mut bufs = op.buffers(ctx, chunk)?;
        op.run(ctx, &mut bufs, &input)?;
        download(ctx, &bufs.out, chunk * d.size_bytes() as usize)
    })
}

/// Expert parallelism's low-latency dispatch and combine, round trip: rank r's tokens `xs[r]`
/// (`[T, H]` of `dtype_name`) go to their top-k experts (`topks[r]`, `[T, k]` i32, -1 none;
/// `experts` in all, `experts / ranks` per rank), every expert is the identity, and combine
/// sums each token's rows with `weights[r]` (`[T, k]` f32); the low-latency form, or with
/// `high_throughput` the prefill one. Returns per rank the rows each local expert received
/// (`[experts / ranks]` i32 bytes) and combine's output (`[T, H]`).
#[pyfunction]
#[pyo3(signature = (xs, topks, weights, experts, hidden, dtype_name, high_throughput = false, seed = 0, race = false))]
#[allow(clippy::too_many_arguments)]
pub fn ep_round_trip(
    py: Python<'_>,
    xs: Vec<Vec<u8>>,
    topks: Vec<Vec<u8>>,
    weights: Vec<Vec<u8>>,
    experts: usize,
    hidden: usize,
    dtype_name: &str,
    high_throughput: bool,
    seed: u64,
    race: bool,
) -> PyResult<Vec<(Vec<u8>, Vec<u8>)>> {
    use trident_kernels::ep_all_to_all::{LowLatencyAllToAll, Part};
    use trident_kernels::ep_high_throughput::HighThroughputAllToAll;
    let d = dtype(dtype_name)?;
    let shape = routed_shape("ep_round_trip", &xs, &topks, &weights, d, hidden, experts)?;
    let (w, tokens) = (xs.len(), shape.t_max);
    let (xs, topks, weights) = (Arc::new(xs), Arc::new(topks), Arc::new(weights));
    cpu_world(py, w, seed, race, move |ctx| {
        let r = ctx.rank();
        let (x, topk, wt) =
            (upload(ctx, &xs[r], "x")?, upload(ctx, &topks[r], "topk")?, upload(ctx, &weights[r], "weights")?);
        let out_bytes = tokens * hidden * d.size_bytes() as usize;
        if high_throughput {
            let op = HighThroughputAllToAll::new(d);
            let mut bufs = op.buffers(ctx, shape)?;
            op.dispatch(ctx, &mut bufs, &x, &topk, &wt, tokens)?;
            let recv = bufs.recv.clone();
            op.combine(ctx, &mut bufs, &recv, tokens)?;
            ctx.synchronize()?;
            // Rows per local expert from the segments' ends.
            let ends = download(ctx, &bufs.offs, 4 * (experts / w))?;
            let mut before = 0i32;
            let counts = ends
                .chunks(4)
                .flat_map(|b| {
                    let end = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    let n = end - before;
                    before = end;
                    n.to_le_bytes()
                })
                .collect();
            return Ok((counts, download(ctx, &bufs.out, out_bytes)?));
        }
        let op = LowLatencyAllToAll::new(d);
        let mut bufs = op.buffers(ctx, shape)?;
        op.dispatch(ctx, &mut bufs, &x, &topk, tokens, Part::Whole)?;
        let recv = bufs.recv.clone();
        op.combine(ctx, &mut bufs, &recv, &topk, &wt, tokens, Part::Whole)?;
        ctx.synchronize()?;
        let counts = download(ctx, &bufs.recv_count, 4 * (experts / w))?;
        Ok((counts, download(ctx, &bufs.out, out_bytes)?))
    })
}

/// The all-to-all's shape for `xs` (each rank's `[T, hidden]` tokens of `d`, T at least one)
/// routed by `topks` (`[T, k]` i32) with `weights` (`[T, k]` f32), one of each per rank, among
/// `experts`; `what` names the call in errors.
fn routed_shape(
    what: &str,
    xs: &[Vec<u8>],
    topks: &[Vec<u8>],
    weights: &[Vec<u8>],
    d: DType,
    hidden: usize,
    experts: usize,
) -> PyResult<trident_kernels::ep_all_to_all::EpShape> {
    let rows = elements(xs, d, what)?;
    let w = xs.len();
    if hidden == 0 || !rows.is_multiple_of(hidden) {
        return Err(errors::argument(format!("{what}: {rows} elements are not rows of {hidden}")));
    }
    let tokens = rows / hidden;
    let pairs = elements(topks, DType::I32, &format!("{what} (topk)"))?;
    if topks.len() != w || weights.len() != w || tokens == 0 || !pairs.is_multiple_of(tokens) {
        return Err(errors::argument(format!(
            "{what}: {w} ranks of {tokens} tokens, {} topk and {} weights arrays of {pairs} entries",
            topks.len(),
            weights.len()
        )));
    }
    if elements(weights, DType::F32, &format!("{what} (weights)"))? != pairs {
        return Err(errors::argument(format!("{what}: weights must be [T, k] f32 as topk")));
    }
    Ok(trident_kernels::ep_all_to_all::EpShape { t_max: tokens, hidden, experts, top_k: pairs / tokens })
}

/// Each rank's `x`, `topk`, `weights`, `w1` and `w2`, as bytes.
type MoeArrays = (Vec<Vec<u8>>, Vec<Vec<u8>>, Vec<Vec<u8>>, Vec<Vec<u8>>, Vec<Vec<u8>>);

/// Each rank's block scales of FP8 `w1` and `w2`, as bytes.
type MoeScales = Option<(Vec<Vec<u8>>, Vec<Vec<u8>>)>;

/// Both MoE blocks' CPU-world calls: the routed inputs checked (`what` names the op; `held`
/// ends "one w1 and one w2" in its error: nothing, or ` shard`), then on each rank its arrays
/// uploaded, `make` its buffers, `run` the block enqueued (returning its output buffer) and the
/// `[T, H]` result read back.
#[allow(clippy::too_many_arguments)]
fn moe_in_cpu_world<B>(
    py: Python<'_>,
    (what, held): (&'static str, &'static str),
    ((xs, topks, weights, w1s, w2s), scales): (MoeArrays, MoeScales),
    (experts, hidden): (usize, usize),
    d: DType,
    (seed, race): (u64, bool),
    make: impl Fn(&dyn RankCtx, trident_kernels::ep_all_to_all::EpShape) -> Result<B, BackendError> + Send + Sync + 'static,
    run: impl Fn(&dyn RankCtx, &mut B, [&Buffer; 3], Experts<'_>, usize) -> Result<Buffer, BackendError>
        + Send
        + Sync
        + 'static,
) -> PyResult<Vec<Vec<u8>>> {
    let shape = routed_shape(what, &xs, &topks, &weights, d, hidden, experts)?;
    let (w, tokens) = (xs.len(), shape.t_max);
    let given = scales.as_ref().map_or((w, w), |(a, b)| (a.len(), b.len()));
    if w1s.len() != w || w2s.len() != w || given != (w, w) {
        return Err(errors::argument(format!(
            "{what}: {w} ranks need one w1 and one w2{held} each, and their scales if any ({} and {} given, {} and {} scales)",
            w1s.len(),
            w2s.len(),
            given.0,
            given.1
        )));
    }
    let arrays = Arc::new(((xs, topks, weights, w1s, w2s), scales));
    cpu_world(py, w, seed, race, move |ctx| {
        let r = ctx.rank();
        let ((xs, topks, weights, w1s, w2s), scales) = &*arrays;
        let mut bufs = make(ctx, shape)?;
        let (x, topk, wt) =
            (upload(ctx, &xs[r], "x")?, upload(ctx, &topks[r], "topk")?, upload(ctx, &weights[r], "weights")?);
        let (w1, w2) = (upload(ctx, &w1s[r], "w1")?, upload(ctx, &w2s[r], "w2")?);
        let s = match scales {
            Some((s1, s2)) => Some((upload(ctx, &s1[r], "w1_scales")?, upload(ctx, &s2[r], "w2_scales")?)),
            None => None,
        };
        let experts = match &s {
            Some((s1, s2)) => Experts::fp8((&w1, s1), (&w2, s2)),
            None => Experts::from((&w1, &w2)),
        };
        let out = run(ctx, &mut bufs, [&x, &topk, &wt], experts, tokens)?;
        ctx.synchronize()?;
        download(ctx, &out, tokens * hidden * d.size_bytes() as usize)
    })
}

/// Expert parallelism's MoE block (`trident_kernels::moe_block`) in the CPU world: dispatch, the
/// experts' SwiGLU MLPs (`w1s[r]` `[E_local, 2F, H]` gate/up interleaved by 128, `w2s[r]`
/// `[E_local, H, F]`, rank r's experts) as grouped GEMMs, combine (`high_throughput`: the prefill
/// exchange). With `scales` (each rank's f32 block scales of `w1` and `w2`) the FP8 block:
/// `w1s` and `w2s` E4M3FN (see `EpMoeBlock::fp8`). Returns each rank's `[T, H]`.
#[pyfunction]
#[pyo3(signature = (xs, topks, weights, w1s, w2s, extents, dtype_name, high_throughput, seed, race, scales=None))]
#[allow(clippy::too_many_arguments)]
pub fn ep_moe(
    py: Python<'_>,
    xs: Vec<Vec<u8>>,
    topks: Vec<Vec<u8>>,
    weights: Vec<Vec<u8>>,
    w1s: Vec<Vec<u8>>,
    w2s: Vec<Vec<u8>>,
    extents: (usize, usize, usize),
    dtype_name: &str,
    high_throughput: bool,
    seed: u64,
    race: bool,
    scales: MoeScales,
) -> PyResult<Vec<Vec<u8>>> {
    use trident_kernels::moe_block::EpMoeBlock;
    // (experts, H, F)
    let (experts, hidden, ffn) = extents;
    let d = dtype(dtype_name)?;
    let block = EpMoeBlock::new(d, ffn);
    let block = if high_throughput { block.high_throughput() } else { block };
    let block = if scales.is_some() { block.fp8() } else { block };
    let arrays = ((xs, topks, weights, w1s, w2s), scales);
    let make = move |ctx: &dyn RankCtx, shape| block.buffers(ctx, shape);
    moe_in_cpu_world(
        py,
        ("ep_moe", ""),
        arrays,
        (experts, hidden),
        d,
        (seed, race),
        make,
        move |ctx, bufs, [x, topk, wt], ws, tokens| {
            block.enqueue(ctx, bufs, x, topk, wt, ws, tokens)?;
            Ok(bufs.out().clone())
        },
    )
}

/// Tensor parallelism's MoE block (`trident_kernels::moe_tp`) in the CPU world: every rank's
/// tokens gathered, rank r's shard of every expert (`w1s[r]` `[E, 2F_l, H]` gate/up interleaved
/// by 128, `w2s[r]` `[E, H, F_l]`: intermediate columns `r F_l ..` of each) run on all of them,
/// the shards' weighted partial outputs reduced home. With `scales` (each rank's f32 block
/// scales of its shards, `[E, 2F_l/128, H/128]` and `[E, H/128, F_l/128]`) the FP8 block: `w1s`
/// and `w2s` E4M3FN (see `TpMoeBlock::fp8`). Returns each rank's `[T, H]`.
#[pyfunction]
#[pyo3(signature = (xs, topks, weights, w1s, w2s, extents, dtype_name, seed, race, scales=None))]
#[allow(clippy::too_many_arguments)]
pub fn tp_moe(
    py: Python<'_>,
    xs: Vec<Vec<u8>>,
    topks: Vec<Vec<u8>>,
    weights: Vec<Vec<u8>>,
    w1s: Vec<Vec<u8>>,
    w2s: Vec<Vec<u8>>,
    extents: (usize, usize, usize),
    dtype_name: &str,
    seed: u64,
    race: bool,
    scales: MoeScales,
) -> PyResult<Vec<Vec<u8>>> {
    use trident_kernels::moe_tp::TpMoeBlock;
    // (experts, H, F_l)
    let (experts, hidden, ffn_shard) = extents;
    let d = dtype(dtype_name)?;
    let block = TpMoeBlock::new(d, ffn_shard);
    let block = if scales.is_some() { block.fp8() } else { block };
    let arrays = ((xs, topks, weights, w1s, w2s), scales);
    let make = move |ctx: &dyn RankCtx, shape| block.buffers(ctx, shape);
    moe_in_cpu_world(
        py,
        ("tp_moe", " shard"),
        arrays,
        (experts, hidden),
        d,
        (seed, race),
        make,
        move |ctx, bufs, [x, topk, wt], ws, tokens| {
            block.enqueue(ctx, bufs, x, topk, wt, ws, tokens)?;
            Ok(bufs.out.clone())
        },
    )
}
