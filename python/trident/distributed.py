"""The library's collectives on a world of ranks, from Python.

``CpuWorld(ranks)`` runs them on the CPU world: every rank a thread under trident's seeded
scheduler (``seed`` picks the interleaving; ``race=True`` turns on the happens-before race
detector). Each call takes one NumPy array per rank and returns one per rank:

    world = trident.distributed.CpuWorld(4)
    outs = world.all_gather([np.full(100, r, np.float32) for r in range(4)])

On GPUs, ``init()`` makes this process's rank of an NVSHMEM world from an initialised
``torch.distributed`` process group (one process per GPU as torchrun starts them, or several
sharing a GPU with a gloo group); the ops then take and return torch tensors on the rank's
device, in torch's stream order and capturable in CUDA graphs, and ``empty()`` makes tensors
on the symmetric heap:

    torch.distributed.init_process_group("gloo")        # or "nccl"
    trident.distributed.init()
    y = trident.distributed.all_reduce(x)                # also torch.ops.trident.all_reduce
    c = trident.distributed.ag_gemm(a_shard, b)          # A gathered by rows while multiplied
    trident.distributed.destroy()

Every rank must call the same ops with the same shapes in the same order (as for any
collective); each op's symmetric state is made on its first call with a shape, so run a step
once before capturing it in a graph.
"""

import os

import numpy as np

from . import _trident
from . import ArgumentError, _element_type, numpy_dtype


class CpuWorld:
    """A world of `ranks` CPU ranks (1 to 64)."""

    def __init__(self, ranks, seed=0, race=False):
        if not isinstance(ranks, int) or not 1 <= ranks <= 64:
            raise ArgumentError(f"a CPU world has 1..=64 ranks, not {ranks!r}")
        self.ranks, self.seed, self.race = ranks, seed, race

    def _inputs(self, what, inputs):
        inputs = list(inputs)
        if len(inputs) != self.ranks:
            raise ArgumentError(f"{what}: {len(inputs)} inputs for a world of {self.ranks} ranks")
        arrays = [np.ascontiguousarray(a) for a in inputs]
        etype = _element_type(arrays[0].dtype)
        if etype is None:
            raise ArgumentError(f"{what}: arrays of {arrays[0].dtype} are not a trident element type")
        for r, a in enumerate(arrays):
            if a.dtype != arrays[0].dtype or a.shape != arrays[0].shape:
                raise ArgumentError(
                    f"{what}: rank {r}'s input is {a.dtype}{list(a.shape)}, rank 0's {arrays[0].dtype}{list(arrays[0].shape)}"
                )
        return [a.reshape(-1).view(np.uint8).tobytes() for a in arrays], etype, arrays[0].dtype

    @staticmethod
    def _outputs(raw, dtype):
        return [np.frombuffer(b, dtype=dtype).copy() for b in raw]

    def all_gather(self, inputs):
        """Rank r's output: every rank's input (flattened), in rank order."""
        data, etype, dtype = self._inputs("all_gather", inputs)
        return self._outputs(_trident.all_gather(data, etype, self.seed, self.race), dtype)

    def all_reduce(self, inputs, algorithm="one_shot"):
        """Every rank's output: the element-wise sum of the inputs (``one_shot`` or ``two_shot``)."""
        data, etype, dtype = self._inputs("all_reduce", inputs)
        return self._outputs(_trident.all_reduce(data, etype, algorithm, self.seed, self.race), dtype)

    def ep_round_trip(self, xs, topks, weights, num_experts, high_throughput=False):
        """Expert parallelism's low-latency dispatch and combine with every expert the
        identity: rank r's tokens `xs[r]` ``[T, H]`` to their experts `topks[r]` ``[T, k]``
        (int32, -1 none) and back, summed with `weights[r]` ``[T, k]`` (float32). Returns per
        rank ``(recv_count, out)``: the rows each of its ``num_experts // ranks`` experts
        received, and ``[T, H]``. `high_throughput` runs the prefill form (each token sent
        once per rank)."""
        data, etype, dtype = self._inputs("ep_round_trip", xs)
        hidden = np.asarray(xs[0]).shape[-1]
        topks = [np.ascontiguousarray(t, dtype=np.int32).tobytes() for t in topks]
        weights = [np.ascontiguousarray(w, dtype=np.float32).tobytes() for w in weights]
        raw = _trident.ep_round_trip(
            data, topks, weights, num_experts, hidden, etype, bool(high_throughput), self.seed, self.race
        )
        shape = np.asarray(xs[0]).shape
        return [(np.frombuffer(c, dtype=np.int32).copy(), np.frombuffer(o, dtype=dtype).reshape(shape).copy()) for c, o in raw]

    def ep_moe(self, xs, topks, weights, w1s, w2s, num_experts, high_throughput=False, w1_scales=None, w2_scales=None):
        """Expert parallelism's MoE block: rank r's tokens `xs[r]` ``[T, H]`` (float16) to
        their experts `topks[r]` ``[T, k]`` (int32, -1 none), each expert's SwiGLU MLP (rank
        r's experts: `w1s[r]` ``[E_local, 2F, H]``, gate and up rows interleaved in blocks of
        128, `w2s[r]` ``[E_local, H, F]``), and back, summed with `weights[r]` ``[T, k]``
        (float32). Returns each rank's ``[T, H]``. `high_throughput` exchanges the tokens as
        the prefill form does (each once per rank). With `w1_scales` and `w2_scales` (each
        rank's float32 scale per 128 x 128 block: ``[E_local, 2F/128, ceil(H/128)]`` and
        ``[E_local, ceil(H/128), F/128]``) the FP8 block: `w1s` and `w2s` hold E4M3FN (as
        ``uint8`` bits, or ``ml_dtypes.float8_e4m3fn``), the tokens go over quantized to
        E4M3FN with a scale per 128 channels, and the SwiGLU output is quantized the same way
        before the down projection (H a multiple of 128)."""
        fp8 = self._fp8_experts("ep_moe", w1s, w2s, w1_scales, w2_scales)
        if fp8 is None:
            return self._moe("ep_moe", xs, topks, weights, w1s, w2s, num_experts, bool(high_throughput))
        return self._moe("ep_moe", xs, topks, weights, *fp8[:2], num_experts, bool(high_throughput), scales=fp8[2])

    def tp_moe(self, xs, topks, weights, w1s, w2s, num_experts, w1_scales=None, w2_scales=None):
        """Tensor parallelism's MoE block: every rank's tokens `xs[r]` ``[T, H]`` (float16)
        gathered, rank r's shard of every expert (`w1s[r]` ``[E, 2F_l, H]``, gate and up rows
        interleaved in blocks of 128, `w2s[r]` ``[E, H, F_l]``: intermediate columns
        ``r F_l ..`` of each expert) run on the tokens routed to it by `topks` ``[T, k]``
        (int32, -1 none), and the shards' partial outputs, weighted by `weights` ``[T, k]``
        (float32), summed home. Returns each rank's ``[T, H]``. With `w1_scales` and
        `w2_scales` (each rank's float32 scale per 128 x 128 block of its shards:
        ``[E, 2F_l/128, H/128]`` and ``[E, H/128, F_l/128]``) the FP8 block: `w1s` and `w2s`
        hold E4M3FN (``uint8`` bits or ``ml_dtypes.float8_e4m3fn``), the gathered rows are
        quantized to E4M3FN with a scale per 128 channels, and each shard's SwiGLU output the
        same way (H a multiple of 128)."""
        fp8 = self._fp8_experts("tp_moe", w1s, w2s, w1_scales, w2_scales)
        if fp8 is None:
            return self._moe("tp_moe", xs, topks, weights, w1s, w2s, num_experts)
        return self._moe("tp_moe", xs, topks, weights, *fp8[:2], num_experts, scales=fp8[2])

    @staticmethod
    def _fp8_experts(name, w1s, w2s, w1_scales, w2_scales):
        """None for experts of the tokens' type; for FP8 ones (scales given) their bits and the
        scales as bytes: ``(w1 bits, w2 bits, (w1 scales, w2 scales))``."""
        if (w1_scales is None) != (w2_scales is None):
            raise ArgumentError(f"{name}: w1_scales and w2_scales go together (the FP8 block)")
        if w1_scales is None:
            return None
        for a in list(w1s) + list(w2s):
            if np.asarray(a).dtype.itemsize != 1:
                raise ArgumentError(f"{name}: FP8 weights are E4M3FN bytes (uint8); got {np.asarray(a).dtype}")
        bits = lambda arrays: [np.ascontiguousarray(a).view(np.uint8) for a in arrays]
        as_f32 = lambda arrays: [np.ascontiguousarray(a, dtype=np.float32).tobytes() for a in arrays]
        return bits(w1s), bits(w2s), (as_f32(w1_scales), as_f32(w2_scales))

    def _moe(self, name, xs, topks, weights, w1s, w2s, num_experts, *options, scales=None):
        """Either MoE block (`name`, the native function's), `options` passed before the seed;
        `scales` (FP8 experts' block scales, as bytes) after it. Weights of one byte an element
        (FP8) go as they are, others in the tokens' type."""
        data, etype, dtype = self._inputs(name, xs)
        hidden = np.asarray(xs[0]).shape[-1]
        ffn = np.asarray(w2s[0]).shape[-1]
        as_bytes = lambda arrays, t: [np.ascontiguousarray(a, dtype=t).tobytes() for a in arrays]
        wtype = np.uint8 if scales is not None else dtype
        raw = getattr(_trident, name)(
            data,
            as_bytes(topks, np.int32),
            as_bytes(weights, np.float32),
            as_bytes(w1s, wtype),
            as_bytes(w2s, wtype),
            (num_experts, hidden, ffn),
            etype,
            *options,
            self.seed,
            self.race,
            *([scales] if scales is not None else []),
        )
        shape = np.asarray(xs[0]).shape
        return [np.frombuffer(o, dtype=dtype).reshape(shape).copy() for o in raw]

    def reduce_scatter(self, inputs, algorithm="ring"):
        """Each input holds `ranks` equal chunks; rank r's output is the sum of every rank's chunk r
        (``ring`` or ``one_shot``)."""
        data, etype, dtype = self._inputs("reduce_scatter", inputs)
        return self._outputs(_trident.reduce_scatter(data, etype, algorithm, self.seed, self.race), dtype)


_TORCH_ELEMENT = {
    "torch.float32": "f32",
    "torch.float16": "f16",
    "torch.bfloat16": "bf16",
    "torch.float64": "f64",
    "torch.int32": "i32",
    "torch.int64": "i64",
}

_world = None


class GpuWorld:
    """This process's rank of a GPU world (``init()``): ``rank``, ``size``, ``device``,
    ``provider`` (the symmetric heap's maker, e.g. "NVSHMEM 3.4.5")."""

    def __init__(self, raw, group):
        self._raw, self.group, self.pending = raw, group, set()

    def __getattr__(self, name):
        return getattr(self._raw, name)

    def __repr__(self):
        return f"<trident GpuWorld rank {self.rank} of {self.size} on cuda:{self.device}, {self.provider}>"


def _need_world():
    if _world is None:
        raise ArgumentError("trident.distributed.init() has not been called in this process")
    return _world


def init(group=None, heap_bytes=None, bound_ms=60_000):
    """Makes this process's rank of a GPU world from the initialised ``torch.distributed``
    process `group` (the default group when None): rank and size are the group's, the device
    is torch's current CUDA device. Rank 0 serves a rendezvous whose address travels over the
    group (NCCL or gloo); NVSHMEM's unique id then travels over the rendezvous, which also
    bounds every start-up step (`bound_ms`).

    The symmetric heap is NVSHMEM's, outside torch's caching allocator: `heap_bytes` per rank
    (``TRIDENT_HEAP_BYTES``, else 1 GiB), reserved when the world starts; ops' state and
    ``empty()`` tensors come from it, and a full heap is an error naming what asked. NVSHMEM
    itself may need ``NVSHMEM_SYMMETRIC_SIZE`` above that (1 GiB by default)."""
    global _world
    import torch
    import torch.distributed as dist

    if _world is not None:
        return _world
    if not dist.is_initialized():
        raise ArgumentError("torch.distributed is not initialised: call torch.distributed.init_process_group first")
    group = group or dist.group.WORLD
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if heap_bytes is None:
        heap_bytes = int(os.environ.get("TRIDENT_HEAP_BYTES", 1 << 30))
    addr = [None]
    if rank == 0:
        port = _trident.serve_rendezvous(size)
        host = os.environ.get("TRIDENT_RENDEZVOUS_HOST") or os.environ.get("MASTER_ADDR") or "127.0.0.1"
        addr = [f"{host}:{port}"]
    dist.broadcast_object_list(addr, src=dist.get_global_rank(group, 0), group=group)
    device = torch.cuda.current_device()
    _world = GpuWorld(_trident.GpuWorld.join(rank, size, device, addr[0], int(heap_bytes), int(bound_ms)), group)
    from . import torch_ops

    torch_ops.register()
    return _world


def destroy():
    """Ends the world (collective): every rank's streams drained, then NVSHMEM finalised.
    Symmetric tensors must not be used after it."""
    global _world
    if _world is not None:
        w, _world = _world, None
        w.finish()


def get_world():
    """This process's GPU world (``init()``), or None."""
    return _world


def _stream():
    import torch

    return torch.cuda.current_stream().cuda_stream


def _check(what, t, ndim=None, fp8=False):
    """`t` on this rank's device, contiguous, of a trident element type (E4M3FN too with
    `fp8`), with `ndim` dimensions: the world and the type's name."""
    w = _need_world()
    if not t.is_cuda or t.get_device() != w.device:
        raise ArgumentError(f"{what}: a tensor on {t.device}; this rank's world is on cuda:{w.device}")
    if not t.is_contiguous():
        raise ArgumentError(f"{what}: the tensor is not contiguous (.contiguous() copies it)")
    etype = "f8e4m3fn" if fp8 and str(t.dtype) == "torch.float8_e4m3fn" else _TORCH_ELEMENT.get(str(t.dtype))
    if etype is None:
        raise ArgumentError(f"{what}: tensors of {t.dtype} are not supported")
    if ndim is not None and t.dim() != ndim:
        raise ArgumentError(f"{what}: a tensor of {t.dim()} dimensions, {ndim} expected")
    return w, etype


def all_gather(x):
    """Every rank's `x` stacked in rank order: a new tensor of ``[size, *x.shape]``."""
    import torch

    w, etype = _check("all_gather", x)
    out = torch.empty((w.size, *x.shape), dtype=x.dtype, device=x.device)
    w.all_gather(x.data_ptr(), out.data_ptr(), x.numel(), etype, _stream())
    return out


def all_reduce(x):
    """The sum over ranks of `x`: a new tensor."""
    import torch

    w, etype = _check("all_reduce", x)
    out = torch.empty_like(x)
    w.all_reduce(x.data_ptr(), out.data_ptr(), x.numel(), etype, _stream())
    return out


def reduce_scatter(x):
    """This rank's rows of the sum over ranks of `x` (its first dimension split evenly over the
    ranks): a new tensor of ``[x.shape[0] // size, *x.shape[1:]]``."""
    import torch

    w, etype = _check("reduce_scatter", x)
    if x.dim() == 0 or x.shape[0] % w.size:
        raise ArgumentError(f"reduce_scatter: {tuple(x.shape)} does not split over {w.size} ranks by rows")
    out = torch.empty((x.shape[0] // w.size, *x.shape[1:]), dtype=x.dtype, device=x.device)
    w.reduce_scatter(x.data_ptr(), out.data_ptr(), x.numel(), etype, _stream())
    return out


def ag_gemm(a_shard, b):
    """``all_gather(a_shard) @ b`` with the gather overlapped: `a_shard` is ``[m / size, k]``
    (this rank's rows of A), `b` is ``[k, n]``; returns ``[m, n]``."""
    import torch

    w, etype = _check("ag_gemm", a_shard, 2)
    _check("ag_gemm", b, 2)
    if b.dtype != a_shard.dtype or b.shape[0] != a_shard.shape[1]:
        raise ArgumentError(f"ag_gemm: A shard {tuple(a_shard.shape)} {a_shard.dtype} and B {tuple(b.shape)} {b.dtype}")
    m, k, n = a_shard.shape[0] * w.size, a_shard.shape[1], b.shape[1]
    c = torch.empty((m, n), dtype=a_shard.dtype, device=a_shard.device)
    w.ag_gemm(a_shard.data_ptr(), b.data_ptr(), c.data_ptr(), m, n, k, etype, _stream())
    return c


def gemm_rs(a, b):
    """This rank's rows of ``sum over ranks of a @ b`` with the reduction overlapped: `a` is
    ``[m, k_r]``, `b` is ``[k_r, n]`` (K split over ranks); returns ``[m / size, n]``."""
    import torch

    w, etype = _check("gemm_rs", a, 2)
    _check("gemm_rs", b, 2)
    if b.dtype != a.dtype or b.shape[0] != a.shape[1]:
        raise ArgumentError(f"gemm_rs: A {tuple(a.shape)} {a.dtype} and B {tuple(b.shape)} {b.dtype}")
    m, k, n = a.shape[0], a.shape[1], b.shape[1]
    if m % w.size:
        raise ArgumentError(f"gemm_rs: M = {m} rows do not split over {w.size} ranks")
    out = torch.empty((m // w.size, n), dtype=a.dtype, device=a.device)
    w.gemm_rs(a.data_ptr(), b.data_ptr(), out.data_ptr(), m, n, k, etype, _stream())
    return out


def gemm_ar(a, b, form=None):
    """``sum over ranks of a @ b`` on every rank: `a` is ``[m, k_r]``, `b` is ``[k_r, n]`` (K
    split over ranks); returns ``[m, n]``. `form`: ``"one_shot"`` (each tile pushed to every
    rank as it is computed: decode-sized M), ``"two_shot"`` (GEMM-RS, then an AllGather of the
    reduced rows: prefill-sized M, a multiple of the world size), or None: chosen by the
    result's size (one-shot up to 4 MB until ``trident bench --world`` has measured the
    crossover on this machine)."""
    import torch

    w, etype = _check("gemm_ar", a, 2)
    _check("gemm_ar", b, 2)
    if b.dtype != a.dtype or b.shape[0] != a.shape[1]:
        raise ArgumentError(f"gemm_ar: A {tuple(a.shape)} {a.dtype} and B {tuple(b.shape)} {b.dtype}")
    if form not in (None, "one_shot", "two_shot"):
        raise ArgumentError(f"gemm_ar: form {form!r} is not one of 'one_shot', 'two_shot' (or None: chosen by size)")
    m, k, n = a.shape[0], a.shape[1], b.shape[1]
    if form == "two_shot" and m % w.size:
        raise ArgumentError(f"gemm_ar: the two-shot form needs M = {m} rows to split over {w.size} ranks")
    out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    w.gemm_ar(a.data_ptr(), b.data_ptr(), out.data_ptr(), m, n, k, etype, _stream(), form)
    return out


def flash_decode(q, k_shard, v_shard, lens, block_table=None):
    """Distributed flash decoding: the attention of `q` ``[B, Nq, Hq, D]`` (the same on every
    rank) over a KV cache sharded along the sequence: rank r's `k_shard`, `v_shard` hold keys
    ``r S .. (r + 1) S`` of every sequence, ``[B, S, Hkv, D]``, or pages ``[pages, P, Hkv, D]``
    with `block_table` ``[B, S / P]`` (int32) naming them; `lens` ``[B]`` (int32) are the
    sequences' lengths over all shards, their last Nq keys the queries' own (causal). Each
    rank attends over its shard, the partial outputs and log-sum-exps go to every rank
    through the low-latency AllGather, and every rank returns the whole ``[B, Nq, Hq, D]``."""
    import torch

    w, etype = _check("flash_decode", q, 4)
    for t in (k_shard, v_shard, lens) + ((block_table,) if block_table is not None else ()):
        _check("flash_decode", t)
    if k_shard.dtype != q.dtype or v_shard.dtype != q.dtype:
        raise ArgumentError(f"flash_decode: q {q.dtype}, shards {k_shard.dtype}/{v_shard.dtype}: the same type")
    from .ops import decode_extents

    extents, page = decode_extents("flash_decode", q, k_shard, v_shard, lens, block_table)
    out = torch.empty_like(q)
    w.flash_decode(
        q.data_ptr(),
        k_shard.data_ptr(),
        v_shard.data_ptr(),
        lens.data_ptr(),
        block_table.data_ptr() if block_table is not None else None,
        out.data_ptr(),
        k_shard.numel() * k_shard.element_size(),
        extents,
        page,
        etype,
        _stream(),
    )
    return out


def _topk_i32(what, topk, tokens):
    import torch

    if topk.dim() != 2 or topk.shape[0] != tokens:
        raise ArgumentError(f"{what}: topk {tuple(topk.shape)}, [{tokens}, k] expected")
    if topk.dtype == torch.int64:
        topk = topk.to(torch.int32)  # torch.topk's indices
    if topk.dtype != torch.int32:
        raise ArgumentError(f"{what}: topk of {topk.dtype}; int32 (or int64) expert ids, -1 for none")
    _check(what, topk.contiguous())
    return topk.contiguous()


def ep_dispatch(x, topk, num_experts, t_max, fp8=False):
    """Expert parallelism's low-latency dispatch (decode): this rank's tokens `x` ``[T, H]``
    (bf16, f16 or f32) go to the ranks of their top-k experts `topk` ``[T, k]`` (int32 or
    int64 expert ids in ``0..num_experts``, -1 for none; expert `e` lives on rank
    ``e // (num_experts // size)``); `t_max` bounds T on every rank and sizes the buffers (keep
    it fixed across steps: each value has its own buffers on the symmetric heap, about
    ``2 num_experts t_max H`` elements). With `fp8` the rows travel as E4M3FN with one f32 scale
    per 128 channels, quantized by the sender.

    Returns ``(recv, recv_scales, recv_count, recv_src, layout)``: ``recv``
    ``[E_local, size t_max, H]`` (E4M3FN with `fp8`): local expert l's ``recv_count[l]`` rows
    from row 0, source rank by source rank; ``recv_scales`` ``[E_local, size t_max, H / 128]``
    f32 (empty without `fp8`); ``recv_src`` and ``layout``: what ``ep_combine`` needs to send
    each row home. No host synchronisation."""
    import torch

    w, etype = _check("ep_dispatch", x, 2)
    tokens, hidden = x.shape
    topk = _topk_i32("ep_dispatch", topk, tokens)
    if num_experts <= 0 or num_experts % w.size:
        raise ArgumentError(f"ep_dispatch: {num_experts} experts do not split over {w.size} ranks")
    if tokens > t_max:
        raise ArgumentError(f"ep_dispatch: {tokens} tokens where t_max is {t_max}")
    if fp8 and hidden % 128:
        raise ArgumentError(f"ep_dispatch: fp8 quantizes blocks of 128 channels; H = {hidden}")
    el, rows = num_experts // w.size, w.size * t_max
    dev = x.device
    recv = torch.empty((el, rows, hidden), dtype=torch.float8_e4m3fn if fp8 else x.dtype, device=dev)
    scales = torch.empty((el, rows, hidden // 128) if fp8 else (0,), dtype=torch.float32, device=dev)
    count = torch.empty(el, dtype=torch.int32, device=dev)
    src = torch.empty((el, rows), dtype=torch.int32, device=dev)
    layout = torch.empty((el, w.size, 2), dtype=torch.int32, device=dev)
    w.ep_dispatch(
        x.data_ptr(), topk.data_ptr(), recv.data_ptr(), scales.data_ptr(), count.data_ptr(), src.data_ptr(),
        layout.data_ptr(), tokens, t_max, hidden, num_experts, topk.shape[1], etype, bool(fp8), _stream(),
    )
    return recv, scales, count, src, layout


def ep_combine(y, topk, weights, recv_src, layout, num_experts, t_max, fp8=False):
    """Expert parallelism's low-latency combine: the experts' outputs `y` (``recv``'s layout,
    ``[E_local, size t_max, H]`` in the tokens' type) back to their tokens' ranks, where each
    token's rows are summed with its `weights` ``[T, k]`` (f32) in f32: returns ``[T, H]``.
    `topk`, `recv_src`, `layout`, `num_experts`, `t_max` and `fp8` as the dispatch had them."""
    import torch

    w, etype = _check("ep_combine", y, 3)
    tokens = topk.shape[0]
    topk = _topk_i32("ep_combine", topk, tokens)
    if weights.shape != topk.shape or weights.dtype != torch.float32:
        raise ArgumentError(f"ep_combine: weights {tuple(weights.shape)} {weights.dtype}; f32 like topk {tuple(topk.shape)}")
    _check("ep_combine", weights)
    el, hidden = num_experts // w.size, y.shape[2]
    if tuple(y.shape) != (el, w.size * t_max, hidden):
        raise ArgumentError(f"ep_combine: y {tuple(y.shape)}, [{el}, {w.size * t_max}, H] expected")
    out = torch.empty((tokens, hidden), dtype=y.dtype, device=y.device)
    w.ep_combine(
        y.data_ptr(), topk.data_ptr(), weights.contiguous().data_ptr(), recv_src.data_ptr(), layout.data_ptr(),
        out.data_ptr(), tokens, t_max, hidden, num_experts, topk.shape[1], etype, bool(fp8), _stream(),
    )
    return out


def ep_dispatch_ht(x, topk, weights, num_experts, t_max):
    """Expert parallelism's high-throughput dispatch (prefill): each token of `x` ``[T, H]``
    goes once to each rank holding one of its experts (`topk` ``[T, k]``, -1 none), with its
    `weights` ``[T, k]`` (f32, used by ``ep_combine_ht``). Returns ``(recv, offs, recv_src)``:
    ``recv`` ``[size t_max min(k, E_local), H]`` with local expert l's rows at
    ``offs[l - 1]:offs[l]`` (``offs`` int32, the grouped GEMM's contiguous layout, as
    ``torch._grouped_mm`` takes it), ``recv_src`` each row's source. Keep `t_max` fixed."""
    import torch

    w, etype = _check("ep_dispatch_ht", x, 2)
    tokens, hidden = x.shape
    topk = _topk_i32("ep_dispatch_ht", topk, tokens)
    if weights.shape != topk.shape or weights.dtype != torch.float32:
        raise ArgumentError(f"ep_dispatch_ht: weights {tuple(weights.shape)} {weights.dtype}; f32 like topk")
    _check("ep_dispatch_ht", weights)
    if num_experts <= 0 or num_experts % w.size:
        raise ArgumentError(f"ep_dispatch_ht: {num_experts} experts do not split over {w.size} ranks")
    if tokens > t_max:
        raise ArgumentError(f"ep_dispatch_ht: {tokens} tokens where t_max is {t_max}")
    el, k = num_experts // w.size, topk.shape[1]
    capacity = w.size * t_max * min(k, el)
    recv = torch.empty((capacity, hidden), dtype=x.dtype, device=x.device)
    offs = torch.empty(el, dtype=torch.int32, device=x.device)
    src = torch.empty(capacity, dtype=torch.int32, device=x.device)
    w.ep_ht_dispatch(
        x.data_ptr(), topk.data_ptr(), weights.contiguous().data_ptr(), recv.data_ptr(), offs.data_ptr(),
        src.data_ptr(), tokens, t_max, hidden, num_experts, k, etype, _stream(),
    )
    return recv, offs, src


def ep_combine_ht(y, tokens, top_k, num_experts, t_max):
    """Expert parallelism's high-throughput combine: the experts' outputs `y` (``recv``'s
    order and shape) back to the tokens' ranks, each token's rows summed with the dispatch's
    weights in f32 (per rank, then over ranks): returns ``[tokens, H]``. The arguments are the
    last ``ep_dispatch_ht``'s."""
    import torch

    w, etype = _check("ep_combine_ht", y, 2)
    out = torch.empty((tokens, y.shape[1]), dtype=y.dtype, device=y.device)
    w.ep_ht_combine(y.data_ptr(), out.data_ptr(), tokens, t_max, y.shape[1], num_experts, top_k, etype, _stream())
    return out


def ep_moe(x, topk, weights, w1, w2, num_experts, t_max, high_throughput=False, w1_scale=None, w2_scale=None):
    """The expert-parallel MoE block: this rank's tokens `x` ``[T, H]`` (bf16 or f16) to
    their experts `topk` ``[T, k]`` (int32 or int64, -1 none), each expert's SwiGLU MLP (this
    rank's ``num_experts // size`` experts: `w1` ``[E_local, 2F, H]`` with gate and up rows
    interleaved in blocks of 128, `w2` ``[E_local, H, F]``), and back, summed with `weights`
    ``[T, k]`` (float32): returns ``[T, H]``. `t_max` bounds T on every rank;
    `high_throughput` exchanges the tokens as the prefill form does. FP8 experts (DeepSeek-V3's
    serving): `w1` and `w2` ``torch.float8_e4m3fn`` with `w1_scale` ``[E_local, 2F/128,
    ceil(H/128)]`` and `w2_scale` ``[E_local, ceil(H/128), F/128]`` (float32, one per 128 x 128
    block); the tokens then go over quantized to E4M3FN (a scale per 128 channels) and the
    SwiGLU output is quantized the same way before the down projection (H a multiple of
    128)."""
    import torch

    w, etype = _check("ep_moe", x, 2)
    tokens, hidden = x.shape
    topk = _topk_i32("ep_moe", topk, tokens)
    if weights.dtype != torch.float32 or tuple(weights.shape) != tuple(topk.shape):
        raise ArgumentError(f"ep_moe: weights {tuple(weights.shape)} {weights.dtype}; f32 like topk")
    _check("ep_moe", weights)
    if num_experts % w.size:
        raise ArgumentError(f"ep_moe: {num_experts} experts do not split over {w.size} ranks")
    if tokens > t_max:
        raise ArgumentError(f"ep_moe: {tokens} tokens where t_max is {t_max}")
    el = num_experts // w.size
    fp8 = w1_scale is not None or w2_scale is not None
    _check("ep_moe", w1, 3, fp8)
    _check("ep_moe", w2, 3, fp8)
    ffn = w2.shape[2]
    wtype = torch.float8_e4m3fn if fp8 else x.dtype
    if tuple(w1.shape) != (el, 2 * ffn, hidden) or tuple(w2.shape) != (el, hidden, ffn) or w1.dtype != wtype or w2.dtype != wtype:
        raise ArgumentError(
            f"ep_moe: w1 {tuple(w1.shape)} and w2 {tuple(w2.shape)}; [{el}, 2F, {hidden}] and [{el}, {hidden}, F] of {wtype}"
        )
    scales = _block_scales("ep_moe", (w1_scale, w2_scale), el, hidden, ffn) if fp8 else None
    out = torch.empty_like(x)
    w.ep_moe(
        x.data_ptr(), topk.data_ptr(), weights.data_ptr(), w1.data_ptr(), w2.data_ptr(), out.data_ptr(),
        tokens, t_max, hidden, num_experts, topk.shape[1], ffn, etype, bool(high_throughput), _stream(), scales,
    )
    return out


def _block_scales(name, scales, experts, hidden, ffn):
    """The data pointers of FP8 experts' block scales (`w1`'s ``[experts, 2 ffn/128,
    ceil(hidden/128)]`` and `w2`'s ``[experts, ceil(hidden/128), ffn/128]``, float32), checked."""
    import torch

    if any(s is None for s in scales):
        raise ArgumentError(f"{name}: w1_scale and w2_scale go together (FP8 experts)")
    hb, fb = -(-hidden // 128), ffn // 128
    for s, want in zip(scales, ((experts, 2 * fb, hb), (experts, hb, fb))):
        _check(name, s, 3)
        if s.dtype != torch.float32 or tuple(s.shape) != want:
            raise ArgumentError(f"{name}: a block scale of {tuple(s.shape)} {s.dtype}; float32 {list(want)}")
    return tuple(s.data_ptr() for s in scales)


def tp_moe(x, topk, weights, w1, w2, num_experts, t_max, w1_scale=None, w2_scale=None):
    """The tensor-parallel MoE block: every rank's tokens `x` ``[T, H]`` (bf16 or f16, T at
    most `t_max`) gathered, this rank's shard of every one of the `num_experts` experts' SwiGLU
    MLPs (`w1` ``[E, 2F_l, H]`` with gate and up rows interleaved in blocks of 128, `w2`
    ``[E, H, F_l]``; F_l a multiple of 128) run on the tokens `topk` ``[T, k]`` (int32 or int64,
    -1 none) routes to it, and the shards' partial outputs, weighted by `weights` ``[T, k]``
    (float32), reduced home: returns ``[T, H]``. The gather overlaps the first grouped GEMM and
    the reduction the second; a call replays in a CUDA graph. FP8 shards: `w1` and `w2`
    ``torch.float8_e4m3fn`` with `w1_scale` ``[E, 2F_l/128, H/128]`` and `w2_scale`
    ``[E, H/128, F_l/128]`` (float32, one per 128 x 128 block); the gathered rows are then
    quantized to E4M3FN (a scale per 128 channels) and each shard's SwiGLU output the same way
    (H a multiple of 128)."""
    import torch

    w, etype = _check("tp_moe", x, 2)
    tokens, hidden = x.shape
    topk = _topk_i32("tp_moe", topk, tokens)
    if weights.dtype != torch.float32 or tuple(weights.shape) != tuple(topk.shape):
        raise ArgumentError(f"tp_moe: weights {tuple(weights.shape)} {weights.dtype}; f32 like topk")
    _check("tp_moe", weights)
    if tokens > t_max:
        raise ArgumentError(f"tp_moe: {tokens} tokens where t_max is {t_max}")
    fp8 = w1_scale is not None or w2_scale is not None
    _check("tp_moe", w1, 3, fp8)
    _check("tp_moe", w2, 3, fp8)
    ffn = w2.shape[2]
    e = num_experts
    wtype = torch.float8_e4m3fn if fp8 else x.dtype
    if tuple(w1.shape) != (e, 2 * ffn, hidden) or tuple(w2.shape) != (e, hidden, ffn) or w1.dtype != wtype or w2.dtype != wtype:
        raise ArgumentError(
            f"tp_moe: w1 {tuple(w1.shape)} and w2 {tuple(w2.shape)}; [{e}, 2F_l, {hidden}] and [{e}, {hidden}, F_l] of {wtype}"
        )
    scales = _block_scales("tp_moe", (w1_scale, w2_scale), e, hidden, ffn) if fp8 else None
    out = torch.empty_like(x)
    w.tp_moe(
        x.data_ptr(), topk.data_ptr(), weights.data_ptr(), w1.data_ptr(), w2.data_ptr(), out.data_ptr(),
        tokens, t_max, hidden, num_experts, topk.shape[1], ffn, etype, _stream(), scales,
    )
    return out


def empty(shape, dtype=None):
    """A torch tensor on the symmetric heap (collective: every rank asks for the same shapes
    in the same order). Its memory returns to trident's pool when the tensor dies on every
    rank (agreed at the next ``empty``), so a block is never reused while a peer may still
    read or write it."""
    import torch
    import torch.distributed as dist

    w = _need_world()
    dtype = dtype or torch.get_default_dtype()
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    numel = 1
    for s in shape:
        numel *= s
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    # Blocks whose tensors died here and are not yet agreed on; a block is free once its
    # tensor died on every rank (the same intersection on every rank: the same choice).
    w.pending |= set(w.take_released())
    pending = [None] * w.size
    dist.all_gather_object(pending, sorted(w.pending), group=w.group)
    everywhere = set(pending[0]).intersection(*map(set, pending[1:]))
    w.pending -= everywhere
    capsule = w.symmetric_empty(nbytes, sorted(everywhere))
    raw = torch.utils.dlpack.from_dlpack(capsule)
    return raw.view(dtype).view(shape) if numel else raw[:0].view(dtype).view(shape)


def synchronize():
    """Waits for this rank's trident work and raises ``KernelError`` naming a wait that timed
    out (rank, kernel, signal); the world is unusable after one: ``destroy()`` and ``init()``."""
    import torch

    torch.cuda.synchronize()
    _need_world().synchronize()


__all__ = [
    "CpuWorld",
    "numpy_dtype",
    "init",
    "destroy",
    "get_world",
    "all_gather",
    "all_reduce",
    "reduce_scatter",
    "ag_gemm",
    "gemm_rs",
    "gemm_ar",
    "flash_decode",
    "ep_dispatch",
    "ep_combine",
    "ep_dispatch_ht",
    "ep_combine_ht",
    "ep_moe",
    "tp_moe",
    "empty",
    "synchronize",
]
