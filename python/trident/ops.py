"""The library's single-GPU kernels on torch CUDA tensors, launched on torch's current stream
(importing this module needs torch, and defines them as torch ops, ``torch.ops.trident.NAME``).

    c = trident.ops.scaled_mm(a, b, scale_a, scale_b, scaling="row", use_fast_accum=False)

``scaled_mm``: ``(a * scale_a) @ (b * scale_b).T`` in bf16, with `a` ``[M, K]`` and `b`
``[N, K]`` FP8 (``torch.float8_e4m3fn`` or ``float8_e5m2``, both row-major, i.e. K-major as FP8
tensor cores read them; torch's ``_scaled_mm`` takes the same B as ``b.t()``), and f32 scales:
``tensor`` one each; ``row`` ``[M]`` and ``[N]``; ``block`` (DeepSeek-V3) ``[M, ceil(K/128)]``
and ``[ceil(N/128), ceil(K/128)]``. On the H200 (16-byte aligned tensors, K a multiple of 16)
it runs on the FP8 tensor cores (TMA, ``wgmma``); each 128 of K is added into an f32
accumulator, unless ``use_fast_accum`` (tensor and row scaling: the whole K accumulates in the
tensor cores, whose FP8 accumulation keeps about 14 bits; as ``torch._scaled_mm``'s flag of the
same name). Elsewhere the portable kernel (FP8 converted to f16 for the f16 tensor cores).
"""

import torch

from . import ArgumentError, _trident

_FP8 = {torch.float8_e4m3fn: "f8e4m3fn", torch.float8_e5m2: "f8e5m2"}


def _scale_shapes(scaling, m, n, k):
    kb = -(-k // 128)
    return {
        "tensor": ((1,), (1,)),
        "row": ((m,), (n,)),
        "block": ((m, kb), (-(-n // 128), kb)),
    }[scaling]


def scaled_mm(a, b, scale_a, scale_b, scaling="row", use_fast_accum=False):
    """See the module's text. Raises ``ArgumentError`` for wrong dtypes, shapes, devices or
    layouts."""
    if scaling not in ("tensor", "row", "block"):
        raise ArgumentError(f"scaled_mm: scaling {scaling!r}: tensor, row or block")
    if a.dtype not in _FP8 or b.dtype != a.dtype:
        raise ArgumentError(f"scaled_mm: A {a.dtype} and B {b.dtype}: both float8_e4m3fn or both float8_e5m2")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        raise ArgumentError(f"scaled_mm: A {tuple(a.shape)} and B {tuple(b.shape)}: [M, K] and [N, K]")
    m, k = a.shape
    n = b.shape[0]
    want_a, want_b = _scale_shapes(scaling, m, n, k)
    for name, s, want in (("scale_a", scale_a, want_a), ("scale_b", scale_b, want_b)):
        if s.dtype != torch.float32 or s.numel() != torch.Size(want).numel():
            raise ArgumentError(f"scaled_mm: {name} is {s.dtype} {tuple(s.shape)}; {scaling} scaling needs float32 {want}")
    tensors = (a, b, scale_a, scale_b)
    if any(not t.is_cuda or t.get_device() != a.get_device() for t in tensors):
        raise ArgumentError("scaled_mm: every tensor on the same CUDA device")
    if any(not t.is_contiguous() for t in tensors):
        raise ArgumentError("scaled_mm: every tensor contiguous (A and B row-major: B is [N, K])")
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    _trident.scaled_gemm(
        a.data_ptr(),
        b.data_ptr(),
        c.data_ptr(),
        scale_a.data_ptr(),
        scale_b.data_ptr(),
        (m, n, k),
        _FP8[a.dtype],
        scaling,
        bool(use_fast_accum),
        a.get_device(),
        torch.cuda.current_stream(a.device).cuda_stream,
    )
    return c


def _fake_scaled_mm(a, b, scale_a, scale_b, scaling, use_fast_accum=False):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=torch.bfloat16)


def _define():
    from .torch_ops import library

    lib = library()
    lib.define(
        "scaled_mm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, str scaling, bool use_fast_accum=False) -> Tensor"
    )
    lib.impl("scaled_mm", scaled_mm, "CUDA")
    torch.library.register_fake("trident::scaled_mm", lib=lib)(_fake_scaled_mm)


_define()
