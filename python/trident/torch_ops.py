"""trident's distributed ops as torch ops: ``torch.ops.trident.all_gather``, ``all_reduce``,
``reduce_scatter``, ``ag_gemm``, ``gemm_rs`` (CUDA implementations: ``trident.distributed``;
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


_REGISTERED = False


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
        lib.impl(name, getattr(distributed, name), "CUDA")
        torch.library.register_fake(f"trident::{name}", lib=lib)(globals()[f"_fake_{name}"])
    _REGISTERED = True
