"""trident's distributed ops as torch ops: ``torch.ops.trident.all_gather``, ``all_reduce``,
``reduce_scatter``, ``ag_gemm``, ``gemm_rs``, ``gemm_ar``, ``flash_decode_dist``, ``ep_dispatch``, ``ep_combine``, ``ep_dispatch_ht``, ``ep_combine_ht``, ``ep_moe``, ``tp_moe`` (CUDA implementations: ``trident.distributed``;
fake implementations for ``torch.compile``, which traces them as opaque calls).

Defined through ``torch.library.Library`` rather than ``torch.library.custom_op``, whose
Python dispatch costs about 10 us per eager call; in eager code the functions of
``trident.distributed`` skip the dispatcher altogether. Autograd is not defined.
``register()`` runs once, from ``trident.distributed.init()``.
"""

import torch

from . import distributed

_LIB = None

SCHEMAS = {
    "all_gather": "all_gather(Tensor x) -> Tensor",
    "all_reduce": "all_reduce(Tensor x) -> Tensor",
    "reduce_scatter": "reduce_scatter(Tensor x) -> Tensor",
    "ag_gemm": "ag_gemm(Tensor a_shard, Tensor b) -> Tensor",
    "gemm_rs": "gemm_rs(Tensor a, Tensor b) -> Tensor",
    "gemm_ar": "gemm_ar(Tensor a, Tensor b, str? form=None) -> Tensor",
    "flash_decode_dist": "flash_decode_dist(Tensor q, Tensor k_shard, Tensor v_shard, Tensor lens, Tensor? block_table=None) -> Tensor",
    "ep_dispatch": "ep_dispatch(Tensor x, Tensor topk, int num_experts, int t_max, bool fp8=False) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    "ep_combine": "ep_combine(Tensor y, Tensor topk, Tensor weights, Tensor recv_src, Tensor layout, "
    "int num_experts, int t_max, bool fp8=False) -> Tensor",
    "ep_dispatch_ht": "ep_dispatch_ht(Tensor x, Tensor topk, Tensor weights, int num_experts, int t_max) "
    "-> (Tensor, Tensor, Tensor)",
    "ep_combine_ht": "ep_combine_ht(Tensor y, int tokens, int top_k, int num_experts, int t_max) -> Tensor",
    "ep_moe": "ep_moe(Tensor x, Tensor topk, Tensor weights, Tensor w1, Tensor w2, int num_experts, int t_max, "
    "bool high_throughput=False, Tensor? w1_scale=None, Tensor? w2_scale=None) -> Tensor",
    "tp_moe": "tp_moe(Tensor x, Tensor topk, Tensor weights, Tensor w1, Tensor w2, int num_experts, int t_max, "
    "Tensor? w1_scale=None, Tensor? w2_scale=None) -> Tensor",
}


def _size():
    w = distributed.get_world()
    if w is None:
        raise RuntimeError("trident.distributed.init() has not been called in this process")
    return w.size


def _fake_all_gather(x):
    return x.new_empty((_size(), *x.shape))


def _fake_all_reduce(x):
    return torch.empty_like(x)


def _fake_reduce_scatter(x):
    return x.new_empty((x.shape[0] // _size(), *x.shape[1:]))


def _fake_ag_gemm(a_shard, b):
    return a_shard.new_empty((a_shard.shape[0] * _size(), b.shape[1]))


def _fake_gemm_rs(a, b):
    return a.new_empty((a.shape[0] // _size(), b.shape[1]))


def _fake_gemm_ar(a, b, form=None):
    return a.new_empty((a.shape[0], b.shape[1]))


def _fake_flash_decode_dist(q, k_shard, v_shard, lens, block_table=None):
    return torch.empty_like(q)


def _fake_ep_dispatch(x, topk, num_experts, t_max, fp8=False):
    size = _size()
    el, rows, hidden = num_experts // size, size * t_max, x.shape[1]
    recv = x.new_empty((el, rows, hidden), dtype=torch.float8_e4m3fn if fp8 else x.dtype)
    scales = x.new_empty((el, rows, hidden // 128) if fp8 else (0,), dtype=torch.float32)
    i32 = dict(dtype=torch.int32)
    return recv, scales, x.new_empty((el,), **i32), x.new_empty((el, rows), **i32), x.new_empty((el, size, 2), **i32)


def _fake_ep_combine(y, topk, weights, recv_src, layout, num_experts, t_max, fp8=False):
    return y.new_empty((topk.shape[0], y.shape[2]))


def _fake_ep_dispatch_ht(x, topk, weights, num_experts, t_max):
    size = _size()
    el = num_experts // size
    capacity = size * t_max * min(topk.shape[1], el)
    i32 = dict(dtype=torch.int32)
    return x.new_empty((capacity, x.shape[1])), x.new_empty((el,), **i32), x.new_empty((capacity,), **i32)


def _fake_ep_combine_ht(y, tokens, top_k, num_experts, t_max):
    return y.new_empty((tokens, y.shape[1]))


def _fake_ep_moe(x, topk, weights, w1, w2, num_experts, t_max, high_throughput=False, w1_scale=None, w2_scale=None):
    return torch.empty_like(x)


def _fake_tp_moe(x, topk, weights, w1, w2, num_experts, t_max, w1_scale=None, w2_scale=None):
    return torch.empty_like(x)


_REGISTERED = False

# Ops whose function in ``trident.distributed`` has another name: ``flash_decode_dist``
# beside the one-GPU ``torch.ops.trident.flash_decode``.
_FUNCTIONS = {"flash_decode_dist": "flash_decode"}


def library():
    """The process's ``torch.library.Library("trident", "DEF")``: every trident op is defined
    in it (``trident.ops`` defines the single-GPU ones)."""
    global _LIB
    if _LIB is None:
        _LIB = torch.library.Library("trident", "DEF")
    return _LIB


def register():
    """Defines the distributed ops once per process (later calls do nothing)."""
    global _REGISTERED
    if _REGISTERED:
        return
    lib = library()
    for name, schema in SCHEMAS.items():
        lib.define(schema)
        lib.impl(name, getattr(distributed, _FUNCTIONS.get(name, name)), "CUDA")
        torch.library.register_fake(f"trident::{name}", lib=lib)(globals()[f"_fake_{name}"])
    _REGISTERED = True
