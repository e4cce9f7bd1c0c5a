//! `trident.distributed` on NVIDIA GPUs: this process's rank of an NVSHMEM world made from a
//! `torch.distributed` process group, the library's ops called one by one on torch tensors,
//! and tensors on the symmetric heap.
//!
//! Joining: rank 0 of the group serves a rendezvous (`serve_rendezvous`) whose address the
//! Python layer broadcasts over the group (NCCL or gloo); the world then joins as under
//! `trident launch` (`NvshmemWorld::join_at`: everyone's verdict on CUDA and NVSHMEM, NVSHMEM's
//! unique id from rank 0, the heap). The rank keeps one session open (`ProcessWorld::session`)
//! until `finish`: each op is host code on the session's context, run on the calling thread.
//!
//! Streams: an op orders the rank's streams after torch's current stream, enqueues its kernels
//! on them, and orders torch's stream after them (`RankCtx::follow_stream`, `join_stream`),
//! so it runs in torch's stream order without the host waiting, and a CUDA graph captured on
//! torch's stream captures it. Ops never synchronize: a wait that timed out is reported by
//! `synchronize` (and the world is then unusable: init again).
//!
//! Buffers: each op's symmetric state (signals, epochs, double buffers) is made on the first
//! call with a shape and kept: every rank must call the same ops with the same shapes in the
//! same order, as for any collective. Inputs and outputs are torch tensors by address where
//! only the rank itself touches them (AG-GEMM's A shard, B and C; GEMM-RS's A, B and output;
//! the reduce-scatter's output); a result in a symmetric double buffer is copied into the
//! caller's tensor by `CopyLatest`, which picks the half on the device so that a replayed graph
//! follows the halves.

use crate::errors;
use pyo3::prelude::*;
use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use trident_backend_nvidia::nvshmem_world::NvshmemWorld;
use trident_backend_nvidia::runtime::CudaDevice;
use trident_core::backend::{BackendError, Buffer};
use trident_core::ir::DType;
use trident_core::world::RankCtx;
use trident_gpu_runtime::world_env::WorldEnv;
use trident_gpu_runtime::{GpuWorldOptions, RankSession};
use trident_kernels::ag_gemm::{AgGemm, GatherMode};
use trident_kernels::allgather::{AllGather, GatherBuffers};
use trident_kernels::allgather_auto::GatherForm;
use trident_kernels::allgather_ll::{AllGatherLl, LlBuffers};
use trident_kernels::allreduce::{Algorithm, AllReduce};
use trident_kernels::ep_all_to_all::{EpShape, LowLatencyAllToAll, Part};
use trident_kernels::ep_high_throughput::HighThroughputAllToAll;
use trident_kernels::epoch::{state_arg, CopyLatest};
use trident_kernels::flash_decode::DecodeShape;
use trident_kernels::flash_decode_dist::DistFlashDecode;
use trident_kernels::gemm_ar::GemmAr;
use trident_kernels::gemm_ar_auto;
use trident_kernels::gemm_ar_two_shot::GemmArTwoShot;
use trident_kernels::gemm_rs::GemmRs;
use trident_kernels::reduce_scatter::{ReduceScatter, ScatterAlgorithm};

/// Starts the rendezvous of a world of `size` ranks on a free port of every interface;
/// returns the port (rank 0 of the group calls it).
#[pyfunction]
pub fn serve_rendezvous(size: usize) -> PyResult<u16> {
    let server = trident_gpu_runtime::rendezvous::Server::start(
        "0.0.0.0:0",
        size,
        trident_backend_nvidia::nvshmem_world::VERSION,
    )
    .map_err(|e| errors::backend(BackendError::Host(format!("serving the rendezvous: {e}"))))?;
    Ok(server.addr.port())
}

/// A block of the symmetric heap handed to torch as a tensor.
struct Block {
    buffer: Buffer,
    live: bool,
}

/// The symmetric blocks of `empty`: made in the same order on every rank, so a block has the
/// same number everywhere; a block is reused only after every rank's tensor of it died.
#[derive(Default)]
struct Pool {
    blocks: Vec<Block>,
}

/// Ids of blocks whose tensor died on this rank, not yet agreed on (DLPack deleters push here,
/// from whatever thread frees the tensor).
type Released = Arc<Mutex<Vec<u64>>>;

/// This process's rank of a world of GPUs, driven from Python.
#[pyclass(frozen, module = "trident._trident")]
pub struct GpuWorld {
    session: Mutex<Option<RankSession<CudaDevice>>>,
    world: Mutex<Option<NvshmemWorld>>,
    rank: usize,
    size: usize,
    device: usize,
    provider: String,
    /// Each op's state by op and shape.
    ops: Mutex<HashMap<String, Box<dyn Any + Send>>>,
    pool: Mutex<Pool>,
    released: Released,
    /// The failure that made the world unusable (a wait that timed out).
    failed: Mutex<Option<String>>,
}

fn dtype(name: &str) -> PyResult<DType> {
    DType::parse(name).ok_or_else(|| errors::argument(format!("`{name}` is not an element type")))
}

/// A caller's tensor as a buffer (by address; `name` for diagnostics).
fn tensor(name: &str, address: u64, bytes: usize) -> Buffer {
    Buffer { name: name.to_string(), address, bytes }
}

/// A MoE block's experts on the caller's tensors: `count` of them, `w1` `[count, 2 ffn,
/// hidden]` and `w2` `[count, hidden, ffn]` of `es`-byte elements; with `scales` (f32, a scale
/// per 128 x 128 block: `[count, 2 ffn/128, ceil(hidden/128)]` and `[count, ceil(hidden/128),
/// ffn/128]`) FP8 ones, a byte an element.
struct ExpertTensors {
    w1: Buffer,
    w2: Buffer,
    scales: Option<(Buffer, Buffer)>,
}

impl ExpertTensors {
    fn new(
        (w1, w2): (u64, u64),
        scales: Option<(u64, u64)>,
        (count, hidden, ffn): (usize, usize, usize),
        es: usize,
    ) -> ExpertTensors {
        let wes = if scales.is_some() { 1 } else { es };
        let (hb, fb) = (hidden.div_ceil(128), ffn / 128);
        ExpertTensors {
            w1: tensor("w1", w1, count * 2 * ffn * hidden * wes),
            w2: tensor("w2", w2, count * hidden * ffn * wes),
            scales: scales.map(|(s1, s2)| {
                (tensor("w1_scale", s1, count * 2 * fb * hb * 4), tensor("w2_scale", s2, count * hb * fb * 4))
            }),
        }
    }

    fn experts(&self) -> trident_kernels::moe_block::Experts<'_> {
        use trident_kernels::moe_block::Experts;
        match &self.scales {
            Some((s1, s2)) => Experts::fp8((&self.w1, s1), (&self.w2, s2)),
            None => Experts::from((&self.w1, &self.w2)),
        }
    }
}

/// Puts `with` (the caller's tensors) in an operation's buffer `places` for one call, so that
/// its kernels write the results there; returns what the places held, which the same call with
/// them puts back.
fn lend<const N: usize>(places: [&mut Buffer; N], with: [Buffer; N]) -> [Buffer; N] {
    let mut with = with.into_iter();
    places.map(|p| std::mem::replace(p, with.next().expect("one buffer per place")))
}

impl GpuWorld {
    /// Runs `f` on the session's context, between ordering after `stream` and ordering it
    /// after (see the file's comment).
    fn op<T: Send>(
        &self,
        py: Python<'_>,
        stream: u64,
        f: impl FnOnce(&dyn RankCtx, &mut HashMap<String, Box<dyn Any + Send>>) -> Result<T, BackendError> + Send,
    ) -> PyResult<T> {
        if let Some(why) = self.failed.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Err(errors::KernelError::new_err(format!(
                "this world failed earlier ({why}): destroy it and init again"
            )));
        }
        py.detach(|| {
            let session = self.session.lock().unwrap_or_else(|e| e.into_inner());
            let s = session.as_ref().ok_or_else(|| BackendError::Host("the world was destroyed".into()))?;
            let ctx = s.ctx();
            let mut ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
            ctx.follow_stream(stream)?;
            let r = f(ctx, &mut ops);
            // Torch's stream follows whatever was enqueued, also after an error.
            let joined = ctx.join_stream(stream);
            r.and_then(|v| joined.map(|()| v))
        })
        .map_err(errors::backend)
    }
}

/// The state of op `key`, made by `make` on first use.
fn state<T: Any + Send>(
    ops: &mut HashMap<String, Box<dyn Any + Send>>,
    key: String,
    make: impl FnOnce() -> Result<T, BackendError>,
) -> Result<&mut T, BackendError> {
    if !ops.contains_key(&key) {
        let v = make()?;
        ops.insert(key.clone(), Box::new(v));
    }
    Ok(ops.get_mut(&key).and_then(|b| b.downcast_mut::<T>()).expect("an op's state has one type per key"))
}

#[pymethods]
impl GpuWorld {
    /// Joins the world: this process is rank `rank` of `size` on CUDA device `device`, the
    /// rendezvous at `rendezvous` (`host:port`), `heap_bytes` of symmetric heap per rank.
    #[staticmethod]
    #[pyo3(signature = (rank, size, device, rendezvous, heap_bytes, bound_ms = 60_000))]
    fn join(
        py: Python<'_>,
        rank: usize,
        size: usize,
        device: usize,
        rendezvous: String,
        heap_bytes: usize,
        bound_ms: u64,
    ) -> PyResult<GpuWorld> {
        let env = WorldEnv {
            rank,
            size,
            local_rank: device,
            rendezvous: Some(rendezvous),
            hosts_rendezvous: false,
            source: "torch.distributed",
            bound: Duration::from_millis(bound_ms.max(1)),
        };
        let opts = GpuWorldOptions { heap_bytes, ..GpuWorldOptions::new(size) };
        let (world, session) = py
            .detach(|| {
                let world = NvshmemWorld::join_at(env, opts)?;
                let session = world.session()?;
                Ok::<_, BackendError>((world, session))
            })
            .map_err(errors::backend)?;
        Ok(GpuWorld {
            rank,
            size,
            device: world.device_ordinal(),
            provider: world.provider().to_string(),
            session: Mutex::new(Some(session)),
            world: Mutex::new(Some(world)),
            ops: Mutex::new(HashMap::new()),
            pool: Mutex::new(Pool::default()),
            released: Arc::new(Mutex::new(Vec::new())),
            failed: Mutex::new(None),
        })
    }

    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    #[getter]
    fn size(&self) -> usize {
        self.size
    }

    #[getter]
    fn device(&self) -> usize {
        self.device
    }

    #[getter]
    fn provider(&self) -> String {
        self.provider.clone()
    }

    /// AllGather: `out` (`size x n` elements) = every rank's `x` (`n` elements of `dtype`), in
    /// rank order: the low-latency protocol into `out` directly where `AllGather::auto` picks
    /// it, else the in-kernel push (the copy engine's stream writes would not replay in a CUDA
    /// graph).
    fn all_gather(&self, py: Python<'_>, x: u64, out: u64, n: usize, dtype_name: &str, stream: u64) -> PyResult<()> {
        let d = dtype(dtype_name)?;
        let (w, es) = (self.size, d.size_bytes() as usize);
        self.op(py, stream, move |ctx, ops| {
            if AllGather::auto(ctx, d, n) == GatherForm::LowLatency {
                let bufs = state(ops, format!("allgather_ll/{d}/{n}"), || LlBuffers::new(ctx, d, n))?;
                let (src, dst) = (tensor("x", x, n * es), tensor("out", out, w * n * es));
                return AllGatherLl::default().enqueue_into(ctx, 0, bufs, &src, &dst);
            }
            let bufs = state(ops, format!("allgather/{d}/{n}"), || GatherBuffers::new(ctx, d, n))?;
            AllGather::new(d).enqueue(ctx, 0, bufs, &tensor("x", x, n * es))?;
            let dst = tensor("out", out, w * n * es);
            CopyLatest::new(d).enqueue(ctx, 0, &bufs.out, state_arg(&bufs.epochs, 0), &dst, w * n, w * n)
        })
    }

    /// AllReduce (sum; one-shot or two-shot as `AllReduce::auto` picks: by default one-shot up
    /// to 256 KiB per rank): `out` = the sum over ranks of `x` (`n` elements of `dtype`).
    fn all_reduce(&self, py: Python<'_>, x: u64, out: u64, n: usize, dtype_name: &str, stream: u64) -> PyResult<()> {
        let d = dtype(dtype_name)?;
        let es = d.size_bytes() as usize;
        self.op(py, stream, move |ctx, ops| {
            let op = AllReduce::auto(ctx, d, n);
            let algorithm = op.algorithm;
            let bufs = state(ops, format!("allreduce/{d}/{n}/{algorithm:?}"), || op.buffers(ctx, n))?;
            op.enqueue(ctx, bufs, &tensor("x", x, n * es))?;
            let dst = tensor("out", out, n * es);
            CopyLatest::new(d).enqueue(ctx, 0, &bufs.out, state_arg(&bufs.epochs, 0), &dst, n, n)
        })
    }

    /// ReduceScatter (sum, ring): `out` (`n / size` elements) = this rank's chunk of the sum
    /// over ranks of `x` (`n` elements).
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        x: u64,
        out: u64,
        n: usize,
        dtype_name: &str,
        stream: u64,
    ) -> PyResult<()> {
        let d = dtype(dtype_name)?;
        let (w, es) = (self.size, d.size_bytes() as usize);
        if n == 0 || !n.is_multiple_of(w) {
            return Err(errors::argument(format!("reduce_scatter: {n} elements do not split evenly over {w} ranks")));
        }
        let chunk = n / w;
        self.op(py, stream, move |ctx, ops| {
            let op = ReduceScatter::new(d, ScatterAlgorithm::Ring);
            let bufs = state(ops, format!("reduce_scatter/{d}/{chunk}"), || op.buffers(ctx, chunk))?;
            // The result is this rank's own (only its kernel writes it): the caller's tensor.
            let own = lend([&mut bufs.out], [tensor("out", out, chunk * es)]);
            let r = op.enqueue(ctx, bufs, &tensor("x", x, n * es));
            lend([&mut bufs.out], own);
            r
        })
    }

    /// AG-GEMM: `c` (`m x n`) = the row shards `a` (`m/size x k` on each rank) gathered, times
    /// `b` (`k x n`), the gather overlapped with the GEMM (the in-kernel gather: replayable).
    #[allow(clippy::too_many_arguments)]
    fn ag_gemm(
        &self,
        py: Python<'_>,
        a: u64,
        b: u64,
        c: u64,
        m: usize,
        n: usize,
        k: usize,
        dtype_name: &str,
        stream: u64,
    ) -> PyResult<()> {
        let d = dtype(dtype_name)?;
        let (w, es) = (self.size, d.size_bytes() as usize);
        self.op(py, stream, move |ctx, ops| {
            let op = AgGemm::for_world(ctx, d, GatherMode::Kernel);
            let bufs = state(ops, format!("ag_gemm/{d}/{m}x{n}x{k}"), || op.buffers(ctx, m, n, k))?;
            let (a, b, c) = (tensor("a", a, (m / w) * k * es), tensor("b", b, k * n * es), tensor("c", c, m * n * es));
            op.enqueue_separated(ctx, bufs, &a, &b, &c)
        })
    }

    /// GEMM-RS: `out` (`m/size x n`) = this rank's rows of the sum over ranks of `a @ b` (`a`
    /// `m x k`, `b` `k x n` on each rank: K split over ranks), reduced as the tiles arrive.
    #[allow(clippy::too_many_arguments)]
    fn gemm_rs(
        &self,
        py: Python<'_>,
        a: u64,
        b: u64,
        out: u64,
        m: usize,
        n: usize,
        k: usize,
        dtype_name: &str,
        stream: u64,
    ) -> PyResult<()> {
        let d = dtype(dtype_name)?;
        let (w, es) = (self.size, d.size_bytes() as usize);
        self.op(py, stream, move |ctx, ops| {
            let op = GemmRs::for_world(ctx, d);
            let bufs = state(ops, format!("gemm_rs/{d}/{m}x{n}"), || op.buffers(ctx, m, n))?;
            let (a, b, o) =
                (tensor("a", a, m * k * es), tensor("b", b, k * n * es), tensor("out", out, (m / w) * n * es));
            op.enqueue(ctx, bufs, &a, &b, &o, k)
        })
    }

    /// GEMM + AllReduce: `out` (`m x n`, on every rank) = the sum over ranks of `a @ b` (`a`
    /// `m x k`, `b` `k x n` on each rank: K split over ranks). `form`: `one_shot` (each tile
    /// pushed to every rank as it is computed), `two_shot` (GEMM-RS, then the AllGather of the
    /// reduced rows; M a multiple of the world size), or `None`: as `gemm_ar_auto::auto` picks
    /// (one-shot up to 4 MB of result until `trident bench --world` measured the crossover).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (a, b, out, m, n, k, dtype_name, stream, form = None))]
    fn gemm_ar(
        &self,
        py: Python<'_>,
        a: u64,
        b: u64,
        out: u64,
        m: usize,
        n: usize,
        k: usize,
        dtype_name: &str,
        stream: u64,
        form: Option<&str>,
    ) -> PyResult<()> {
        let d = dtype(dtype_name)?;
        let (w, es) = (self.size, d.size_bytes() as usize);
        let form = match form {
            None => None,
            Some("one_shot") => Some(Algorithm::OneShot),
            Some("two_shot") if m.is_multiple_of(w) => Some(Algorithm::TwoShot),
            Some("two_shot") => {
                return Err(errors::argument(format!(
                    "gemm_ar: the two-shot form needs M = {m} rows to split over {w} ranks"
                )))
            }
            Some(other) => {
                return Err(errors::argument(format!(
                    "gemm_ar: form {other:?} is not one of \"one_shot\", \"two_shot\" (or None: chosen by size)"
                )))
            }
        };
        self.op(py, stream, move |ctx, ops| {
            let (a, b, o) = (tensor("a", a, m * k * es), tensor("b", b, k * n * es), tensor("out", out, m * n * es));
            if form.unwrap_or_else(|| gemm_ar_auto::auto(ctx, d, (m, n))) == Algorithm::TwoShot {
                let op = GemmArTwoShot::for_world(ctx, d);
                let bufs = state(ops, format!("gemm_ar_two_shot/{d}/{m}x{n}"), || op.buffers(ctx, m, n))?;
                op.enqueue(ctx, bufs, (&a, &b), k)?;
                // The gather's half of this call, picked on the device (a replayed graph reads
                // the right one).
                let g = &bufs.gather;
                return CopyLatest::new(d).enqueue(ctx, 0, &g.out, state_arg(&g.epochs, 0), &o, m * n, m * n);
            }
            let op = GemmAr::for_problem(ctx, d, (m, n, k));
            let bufs = state(ops, format!("gemm_ar/{d}/{m}x{n}x{k}"), || op.buffers(ctx, m, n))?;
            op.enqueue(ctx, bufs, (&a, &b), &o, k)
        })
    }

    /// Distributed flash decoding: `out` (`[B, Nq, Hq, D]`, on every rank) = the attention of
    /// `q` (every rank's the same) over every rank's shard of the KV cache: this rank's `k`,
    /// `v` (`kv_bytes` each) hold keys `rank S .. (rank + 1) S` of every sequence (`S` =
    /// `extents.5`), contiguous or paged (`table`, pages of `page` keys); `lens` (`[B]` i32)
    /// are the sequences' lengths over all shards.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (q, k, v, lens, table, out, kv_bytes, extents, page, dtype_name, stream))]
    fn flash_decode(
        &self,
        py: Python<'_>,
        q: u64,
        k: u64,
        v: u64,
        lens: u64,
        table: Option<u64>,
        out: u64,
        kv_bytes: usize,
        extents: (usize, usize, usize, usize, usize, usize),
        page: Option<u32>,
        dtype_name: &str,
        stream: u64,
    ) -> PyResult<()> {
        let d = dtype(dtype_name)?;
        let (batch, q_len, heads_q, heads_kv, head_dim, cache_len) = extents;
        let shape = DecodeShape { batch, q_len, heads_q, heads_kv, head_dim, cache_len };
        let op = DistFlashDecode::for_shape(d, &shape);
        let op = page.map_or(op, |p| op.paged(p));
        op.local.check(&shape, table.is_some()).map_err(|e| errors::argument(e.to_string()))?;
        let tokens = batch * q_len * heads_q * head_dim * d.size_bytes() as usize;
        self.op(py, stream, move |ctx, ops| {
            let bufs = state(ops, format!("flash_decode_dist/{op:?}/{shape:?}"), || op.buffers(ctx, &shape))?;
            let table = table.map(|t| tensor("block_table", t, batch * cache_len / page.unwrap_or(1) as usize * 4));
            let (q, k, v) = (tensor("q", q, tokens), tensor("k_cache", k, kv_bytes), tensor("v_cache", v, kv_bytes));
            let (lens, out) = (tensor("lens", lens, batch * 4), tensor("out", out, tokens));
            op.enqueue(ctx, 0, bufs, (&q, &k, &v), &lens, table.as_ref(), &out)
        })
    }

    /// Expert parallelism's low-latency dispatch: this rank's `tokens` rows of `x` (`[T, H]`
    /// of `dtype`) to the ranks of their top-k experts (`topk`, `[T, k]` i32, -1 none). The
    /// results go to the caller's tensors (only this rank's kernel writes them): `recv`
    /// (`[E_local, size t_max, H]`, E4M3FN with `fp8`), `recv_scales` (with `fp8`,
    /// `[E_local size t_max, H / 128]` f32), `recv_count` (`[E_local]` i32), and what combine
    /// needs: `recv_src` (`[E_local, size t_max]` i32) and `layout` (`[E_local, size, 2]` i32).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (x, topk, recv, recv_scales, recv_count, recv_src, layout, tokens, t_max, hidden, experts, top_k, dtype_name, fp8, stream))]
    fn ep_dispatch(
        &self,
        py: Python<'_>,
        x: u64,
        topk: u64,
        recv: u64,
        recv_scales: u64,
        recv_count: u64,
        recv_src: u64,
        layout: u64,
        tokens: usize,
        t_max: usize,
        hidden: usize,
        experts: usize,
        top_k: usize,
        dtype_name: &str,
        fp8: bool,
        stream: u64,
    ) -> PyResult<()> {
        let d = dtype(dtype_name)?;
        let shape = EpShape { t_max, hidden, experts, top_k };
        self.op(py, stream, move |ctx, ops| {
            let op = LowLatencyAllToAll::new(d);
            let op = if fp8 { op.fp8() } else { op };
            let bufs = state(ops, format!("ep/{d}/{fp8}/{shape:?}"), || op.buffers(ctx, shape))?;
            // Without `fp8` the scales stay the operation's own (a placeholder argument).
            let scales = match fp8 {
                true => tensor("recv_scales", recv_scales, bufs.recv_scales.bytes),
                false => bufs.recv_scales.clone(),
            };
            let mine = [
                tensor("recv", recv, bufs.recv.bytes),
                scales,
                tensor("recv_count", recv_count, bufs.recv_count.bytes),
                tensor("recv_src", recv_src, bufs.recv_src.bytes),
                tensor("layout", layout, bufs.layout.bytes),
            ];
            let own = lend(
                [&mut bufs.recv, &mut bufs.recv_scales, &mut bufs.recv_count, &mut bufs.recv_src, &mut bufs.layout],
                mine,
            );
            let es = d.size_bytes() as usize;
            let r = op.dispatch(
                ctx,
                bufs,
                &tensor("x", x, tokens * hidden * es),
                &tensor("topk", topk, tokens * top_k * 4),
                tokens,
                Part::Whole,
            );
            lend(
                [&mut bufs.recv, &mut bufs.recv_scales, &mut bufs.recv_count, &mut bufs.recv_src, &mut bufs.layout],
                own,
            );
            r
        })
    }

    /// Expert parallelism's low-latency combine: the experts' outputs `y` (in `recv`'s layout,
    /// `dtype`) back to their tokens' ranks by `recv_src` and `layout` (a dispatch's, same
    /// shape), summed there with `weights` (`[T, k]` f32) into `out` (`[T, H]`).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (y, topk, weights, recv_src, layout, out, tokens, t_max, hidden, experts, top_k, dtype_name, fp8, stream))]
    fn ep_combine(
        &self,
        py: Python<'_>,
        y: u64,
        topk: u64,
        weights: u64,
        recv_src: u64,
        layout: u64,
        out: u64,
        tokens: usize,
        t_max: usize,
        hidden: usize,
        experts: usize,
        top_k: usize,
        dtype_name: &str,
        fp8: bool,
        stream: u64,
    ) -> PyResult<()> {
        let d = dtype(dtype_name)?;
        let shape = EpShape { t_max, hidden, experts, top_k };
        let es = d.size_bytes() as usize;
        self.op(py, stream, move |ctx, ops| {
            // The dispatch's state (`fp8` as it was): combine uses its combine buffer and
            // signals; the heap holds one set of buffers per shape.
            let op = LowLatencyAllToAll::new(d);
            let dispatch = if fp8 { op.fp8() } else { op };
            let bufs = state(ops, format!("ep/{d}/{fp8}/{shape:?}"), || dispatch.buffers(ctx, shape))?;
            let (src_bytes, layout_bytes) = (bufs.recv_src.bytes, bufs.layout.bytes);
            let mine = [
                tensor("recv_src", recv_src, src_bytes),
                tensor("layout", layout, layout_bytes),
                tensor("out", out, tokens * hidden * es),
            ];
            let own = lend([&mut bufs.recv_src, &mut bufs.layout, &mut bufs.out], mine);
            let rows = (experts / ctx.world_size()) * ctx.world_size() * t_max * hidden * es;
            let r = op.combine(
                ctx,
                bufs,
                &tensor("y", y, rows),
                &tensor("topk", topk, tokens * top_k * 4),
                &tensor("weights", weights, tokens * top_k * 4),
                tokens,
                Part::Whole,
            );
            lend([&mut bufs.recv_src, &mut bufs.layout, &mut bufs.out], own);
            r
        })
    }

    /// Expert parallelism's high-throughput dispatch (prefill): each token once to each rank
    /// holding one of its experts; the results go to the caller's tensors: `recv`
    /// (`[capacity, H]`, each local expert's rows contiguous), `offs` (`[E_local]` i32, the
    /// segments' ends, `torch._grouped_mm`'s convention) and `recv_src` (`[capacity]` i32).
    /// Combine needs the operation's own state for the shape (kept here).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (x, topk, weights, recv, offs, recv_src, tokens, t_max, hidden, experts, top_k, dtype_name, stream))]
    fn ep_ht_dispatch(
        &self,
        py: Python<'_>,
        x: u64,
        topk: u64,
        weights: u64,
        recv: u64,
        offs: u64,
        recv_src: u64,
        tokens: usize,
        t_max: usize,
        hidden: usize,
        experts: usize,
        top_k: usize,
        dtype_name: &str,
        stream: u64,
    ) -> PyResult<()> {
        let d = dtype(dtype_name)?;
        let shape = EpShape { t_max, hidden, experts, top_k };
        let es = d.size_bytes() as usize;
        self.op(py, stream, move |ctx, ops| {
            let op = HighThroughputAllToAll::new(d);
            let bufs = state(ops, format!("ep-ht/{d}/{shape:?}"), || op.buffers(ctx, shape))?;
            let (rb, ob, sb) = (bufs.recv.bytes, bufs.offs.bytes, bufs.recv_src.bytes);
            let mine = [tensor("recv", recv, rb), tensor("offs", offs, ob), tensor("recv_src", recv_src, sb)];
            let own = lend([&mut bufs.recv, &mut bufs.offs, &mut bufs.recv_src], mine);
            let r = op.dispatch(
                ctx,
                bufs,
                &tensor("x", x, tokens * hidden * es),
                &tensor("topk", topk, tokens * top_k * 4),
                &tensor("weights", weights, tokens * top_k * 4),
                tokens,
            );
            lend([&mut bufs.recv, &mut bufs.offs, &mut bufs.recv_src], own);
            r
        })
    }

    /// Expert parallelism's high-throughput combine: the experts' outputs `y` (`recv`'s order)
    /// summed per token with the last dispatch's weights (of the same shape) into `out`
    /// (`[T, H]`) on the tokens' ranks.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (y, out, tokens, t_max, hidden, experts, top_k, dtype_name, stream))]
    fn ep_ht_combine(
        &self,
        py: Python<'_>,
        y: u64,
        out: u64,
        tokens: usize,
        t_max: usize,
        hidden: usize,
        experts: usize,
        top_k: usize,
        dtype_name: &str,
        stream: u64,
    ) -> PyResult<()> {
        let d = dtype(dtype_name)?;
        let shape = EpShape { t_max, hidden, experts, top_k };
        let es = d.size_bytes() as usize;
        self.op(py, stream, move |ctx, ops| {
            let op = HighThroughputAllToAll::new(d);
            let bufs = state(ops, format!("ep-ht/{d}/{shape:?}"), || op.buffers(ctx, shape))?;
            let rows = bufs.capacity(ctx.world_size()) * hidden * es;
            let own = lend([&mut bufs.out], [tensor("out", out, tokens * hidden * es)]);
            let r = op.combine(ctx, bufs, &tensor("y", y, rows), tokens);
            lend([&mut bufs.out], own);
            r
        })
    }

    /// The expert-parallel MoE block (`trident_kernels::moe_block`): this rank's `tokens` rows
    /// of `x` (`[T, H]`) to their experts (`topk` `[T, k]` i32), each expert's SwiGLU MLP
    /// (this rank's `w1` `[E_local, 2F, H]`, gate/up interleaved by 128, and `w2`
    /// `[E_local, H, F]`), and back, summed with `weights` (`[T, k]` f32) into the caller's
    /// `out` (`[T, H]`). `high_throughput`: the prefill exchange. With `scales` (the f32 block
    /// scales of `w1`, `[E_local, 2F/128, ceil(H/128)]`, and of `w2`, `[E_local, ceil(H/128),
    /// F/128]`) the FP8 block: `w1` and `w2` E4M3FN (`EpMoeBlock::fp8`).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (x, topk, weights, w1, w2, out, tokens, t_max, hidden, experts, top_k, ffn, dtype_name, high_throughput, stream, scales=None))]
    fn ep_moe(
        &self,
        py: Python<'_>,
        x: u64,
        topk: u64,
        weights: u64,
        w1: u64,
        w2: u64,
        out: u64,
        tokens: usize,
        t_max: usize,
        hidden: usize,
        experts: usize,
        top_k: usize,
        ffn: usize,
        dtype_name: &str,
        high_throughput: bool,
        stream: u64,
        scales: Option<(u64, u64)>,
    ) -> PyResult<()> {
        use trident_kernels::moe_block::EpMoeBlock;
        let d = dtype(dtype_name)?;
        let shape = EpShape { t_max, hidden, experts, top_k };
        let es = d.size_bytes() as usize;
        let block = EpMoeBlock::new(d, ffn);
        let block = if high_throughput { block.high_throughput() } else { block };
        let block = if scales.is_some() { block.fp8() } else { block };
        self.op(py, stream, move |ctx, ops| {
            let el = experts / ctx.world_size();
            let key = format!("moe/{d}/{high_throughput}/{}/{ffn}/{shape:?}", scales.is_some());
            let bufs = state(ops, key, || block.buffers(ctx, shape))?;
            let own = lend([bufs.out_mut()], [tensor("out", out, tokens * hidden * es)]);
            let ws = ExpertTensors::new((w1, w2), scales, (el, hidden, ffn), es);
            let r = block.enqueue(
                ctx,
                bufs,
                &tensor("x", x, tokens * hidden * es),
                &tensor("topk", topk, tokens * top_k * 4),
                &tensor("weights", weights, tokens * top_k * 4),
                ws.experts(),
                tokens,
            );
            lend([bufs.out_mut()], own);
            r
        })
    }

    /// The tensor-parallel MoE block (`trident_kernels::moe_tp`): every rank's `tokens` rows
    /// of `x` (`[T, H]`, routed by `topk` `[T, k]` i32 with `weights` `[T, k]` f32) gathered,
    /// this rank's shard of every expert (`w1` `[E, 2F_l, H]`, gate/up interleaved by 128, `w2`
    /// `[E, H, F_l]`) run on all of them, and the shards' partial outputs reduced home into the
    /// caller's `out` (`[T, H]`). With `scales` (the f32 block scales of the shards,
    /// `[E, 2F_l/128, H/128]` and `[E, H/128, F_l/128]`) the FP8 block: `w1` and `w2` E4M3FN
    /// (`TpMoeBlock::fp8`).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (x, topk, weights, w1, w2, out, tokens, t_max, hidden, experts, top_k, ffn_shard, dtype_name, stream, scales=None))]
    fn tp_moe(
        &self,
        py: Python<'_>,
        x: u64,
        topk: u64,
        weights: u64,
        w1: u64,
        w2: u64,
        out: u64,
        tokens: usize,
        t_max: usize,
        hidden: usize,
        experts: usize,
        top_k: usize,
        ffn_shard: usize,
        dtype_name: &str,
        stream: u64,
        scales: Option<(u64, u64)>,
    ) -> PyResult<()> {
        use trident_kernels::moe_tp::TpMoeBlock;
        let d = dtype(dtype_name)?;
        let shape = EpShape { t_max, hidden, experts, top_k };
        let es = d.size_bytes() as usize;
        let block = TpMoeBlock::new(d, ffn_shard);
        let block = if scales.is_some() { block.fp8() } else { block };
        self.op(py, stream, move |ctx, ops| {
            let key = format!("moe-tp/{d}/{ffn_shard}/{shape:?}/{}", scales.is_some());
            let bufs = state(ops, key, || block.buffers(ctx, shape))?;
            let own = lend([&mut bufs.out], [tensor("out", out, tokens * hidden * es)]);
            let shards = ExpertTensors::new((w1, w2), scales, (experts, hidden, ffn_shard), es);
            let r = block.enqueue(
                ctx,
                bufs,
                &tensor("x", x, tokens * hidden * es),
                &tensor("topk", topk, tokens * top_k * 4),
                &tensor("weights", weights, tokens * top_k * 4),
                shards.experts(),
                tokens,
            );
            lend([&mut bufs.out], own);
            r
        })
    }

    /// Ids of this rank's symmetric blocks whose tensors died since the last call (the Python
    /// layer gathers them from every rank before allocating).
    fn take_released(&self) -> Vec<u64> {
        std::mem::take(&mut *self.released.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Marks blocks free whose tensors died on every rank (`ids`: agreed by all), then returns a
    /// DLPack capsule of a `u8` tensor of `bytes` on the symmetric heap: a free block of
    /// exactly that size (the first, so every rank picks the same) or a new one. Collective.
    fn symmetric_empty<'py>(&self, py: Python<'py>, bytes: usize, ids: Vec<u64>) -> PyResult<Bound<'py, PyAny>> {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        for id in ids {
            if let Some(b) = pool.blocks.get_mut(id as usize) {
                b.live = false;
            }
        }
        let size = bytes.max(1).div_ceil(256) * 256;
        let reuse = pool.blocks.iter().position(|b| !b.live && b.buffer.bytes == size);
        let id = match reuse {
            Some(i) => {
                pool.blocks[i].live = true;
                i
            }
            None => {
                let session = self.session.lock().unwrap_or_else(|e| e.into_inner());
                let s = session
                    .as_ref()
                    .ok_or_else(|| errors::backend(BackendError::Host("the world was destroyed".into())))?;
                let buffer = py
                    .detach(|| s.ctx().symm_alloc(size, &format!("symmetric_tensor{}", pool.blocks.len())))
                    .map_err(errors::backend)?;
                pool.blocks.push(Block { buffer, live: true });
                pool.blocks.len() - 1
            }
        };
        let b = &pool.blocks[id].buffer;
        crate::dlpack::export_bytes(py, b.address, bytes, self.device, id as u64, self.released.clone())
    }

    /// The address `address` has on rank `peer` (a symmetric tensor's peer copy, reachable by
    /// load and store on this node).
    fn peer_address(&self, address: u64, peer: usize) -> PyResult<u64> {
        let pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        let b = pool
            .blocks
            .iter()
            .find(|b| address >= b.buffer.address && address < b.buffer.address + b.buffer.bytes as u64)
            .ok_or_else(|| errors::argument("not a tensor of the symmetric heap (trident.distributed.empty)"))?;
        let session = self.session.lock().unwrap_or_else(|e| e.into_inner());
        let s = session.as_ref().ok_or_else(|| errors::argument("the world was destroyed"))?;
        let p = s.ctx().peer(&b.buffer, peer).map_err(errors::backend)?;
        Ok(p.address + (address - b.buffer.address))
    }

    /// Waits for this rank's streams and reports a wait of an op that timed out; the world is
    /// unusable after one (init again).
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        let r = py.detach(|| {
            let session = self.session.lock().unwrap_or_else(|e| e.into_inner());
            match session.as_ref() {
                Some(s) => s.ctx().synchronize(),
                None => Ok(()),
            }
        });
        if let Err(e) = &r {
            *self.failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
        }
        r.map_err(errors::backend)
    }

    /// Ends the world (collective): the session, then NVSHMEM. Symmetric tensors still alive
    /// must not be used after it.
    fn finish(&self, py: Python<'_>) -> PyResult<()> {
        let session = self.session.lock().unwrap_or_else(|e| e.into_inner()).take();
        let world = self.world.lock().unwrap_or_else(|e| e.into_inner()).take();
        py.detach(|| {
            if let Some(s) = session {
                s.end()?;
            }
            match world {
                Some(w) => w.finish(),
                None => Ok(()),
            }
        })
        .map_err(errors::backend)
    }
}
