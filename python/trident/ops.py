"""The library's single-GPU kernels on torch CUDA tensors, launched on torch's current stream
(importing this module needs torch, and defines them as torch ops, ``torch.ops.trident.NAME``).

    c = trident.ops.scaled_mm(a, b, scale_a, scale_b, scaling="row", use_fast_accum=False)
    c = trident.ops.grouped_mm(a, b, offs)                # a [T, K], b [E, N, K], offs int32 [E]
    c = trident.ops.grouped_mm_masked(a, b, counts)       # a [E, T_max, K], counts int32 [E]
    h = trident.ops.grouped_mm(a, trident.ops.interleave_gate_up(w13), offs, swiglu=True)
    o = trident.ops.flash_decode(q, k_cache, v_cache, lens)             # or block_table=...
    o = trident.ops.flash_decode(q, k_fp8, v_fp8, lens, k_scale=ks, v_scale=vs)

``scaled_mm``: ``(a * scale_a) @ (b * scale_b).T`` in bf16, with `a` ``[M, K]`` and `b`
``[N, K]`` FP8 (``torch.float8_e4m3fn`` or ``float8_e5m2``, both row-major, i.e. K-major as FP8
tensor cores read them; torch's ``_scaled_mm`` takes the same B as ``b.t()``), and f32 scales:
``tensor`` one each; ``row`` ``[M]`` and ``[N]``; ``block`` (DeepSeek-V3) ``[M, ceil(K/128)]``
and ``[ceil(N/128), ceil(K/128)]``. On the H200 (16-byte aligned tensors, K a multiple of 16)
it runs on the FP8 tensor cores (TMA, ``wgmma``); each 128 of K is added into an f32
accumulator, unless ``use_fast_accum`` (tensor and row scaling: the whole K accumulates in the
tensor cores, whose FP8 accumulation keeps about 14 bits; as ``torch._scaled_mm``'s flag of the
same name). Elsewhere the portable kernel (FP8 converted to f16 for the f16 tensor cores).

``grouped_mm``: the grouped GEMM of a mixture-of-experts layer, one launch whatever the routing
(no host synchronisation): ``c[rows of e] = a[rows of e] @ b[e].T`` with ``a`` ``[T, K]`` (rows
grouped by expert, ``offs[e]`` the int32 end of expert ``e``'s rows, as ``torch._grouped_mm``
takes them) and ``b`` ``[E, N, K]`` (``b_layout="nk"``, ``torch._grouped_mm``'s
``b.transpose(-2, -1)``) or ``[E, K, N]`` (``"kn"``), bf16 or f16. ``grouped_mm_masked``: ``a``
``[E, T_max, K]`` with ``counts[e]`` valid rows per expert; the rows of ``c`` past a count are
zeros. FP8 operands take ``scale_a`` (f32 ``[rows of a]``) and ``scale_b`` (f32 ``[E, N]``),
row-wise as ``torch._scaled_grouped_mm``, and give bf16; bf16/f16 operands may take them too
(a routing weight per row). On the H200 (aligned tensors, rows of whole 16 bytes) TMA and
``wgmma``, FP8 included (whole K accumulated in the tensor cores); else the portable kernel.
Epilogue options: ``weights`` (f32 ``[rows of a]``) multiplies each row of the result (the
routing weight of a token for the expert); ``swiglu=True`` fuses SwiGLU of a gate/up projection:
``b``'s N rows are gate and up rows interleaved in blocks of 128 (``interleave_gate_up`` makes
that layout once from the usual ``[gate; up]`` halves, vLLM's ``w13``), N a multiple of 256, and
``c`` has N/2 columns, ``silu(a @ gate.T) * (a @ up.T)`` (computed in f32, after the scales,
before the weights). With FP8 operands ``scale_b`` follows ``b``'s rows: interleave it too
(``interleave_gate_up(scale_b[:, :, None])[:, :, 0]``).

``flash_decode``: grouped-query attention of the ``Nq`` newest tokens of each sequence against
its KV cache, split along the cache over the GPU and combined by log-sum-exp: ``q``
``[B, Nq, Hq, D]``, caches ``[B, S, Hkv, D]`` (contiguous) or ``[pages, P, Hkv, D]`` with
``block_table`` int32 ``[B, S / P]`` naming each sequence's pages (P a power of two, at least
16), ``lens``
int32 ``[B]`` each sequence's length, its new tokens included; bf16 or f16, ``Hq`` a multiple
of ``Hkv``, ``D`` 64 or 128. Query token ``i`` sits at position ``lens[b] - Nq + i`` and
attends causally (scale ``1/sqrt(D)``); a query that sees no key gets zeros. The caches may be
FP8 (both ``float8_e4m3fn`` or both ``float8_e5m2``) with per-tensor dequantization scales
``k_scale`` and ``v_scale`` (floats, as serving engines keep an FP8 KV cache): a stored key
``K`` counts as ``k_scale * K``, a value ``V`` as ``v_scale * V``; they are read at half the
bytes and widened to ``q``'s type in registers.
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


_GROUPED = {torch.bfloat16: "bf16", torch.float16: "f16", **_FP8}


def interleave_gate_up(w13, b_layout="nk"):
    """``w13`` (``[E, 2I, K]``, or ``[E, K, 2I]`` with ``b_layout="kn"``: the gate projection's
    ``I`` rows, then the up projection's) in the layout ``swiglu=True`` reads: blocks of 128 gate
    rows and the 128 up rows of the same columns, alternating. ``I`` a multiple of 128."""
    dim = 1 if b_layout == "nk" else 2
    two_i = w13.shape[dim]
    if two_i % 256:
        raise ArgumentError(f"interleave_gate_up: {two_i} rows are not two halves of whole 128-row blocks")
    w = w13 if b_layout == "nk" else w13.transpose(1, 2)
    e, _, k = w.shape
    gate, up = w[:, : two_i // 2], w[:, two_i // 2 :]
    out = torch.stack((gate.reshape(e, -1, 128, k), up.reshape(e, -1, 128, k)), dim=2).reshape(e, two_i, k)
    return out.contiguous() if b_layout == "nk" else out.transpose(1, 2).contiguous()


def _grouped(a, b, groups, layout, b_layout, scale_a, scale_b, swiglu=False, weights=None):
    if b_layout not in ("nk", "kn"):
        raise ArgumentError(f"grouped_mm: b_layout {b_layout!r}: nk or kn")
    if a.dtype not in _GROUPED or b.dtype != a.dtype:
        raise ArgumentError(f"grouped_mm: A {a.dtype} and B {b.dtype}: both bfloat16, float16 or one float8 type")
    fp8 = a.dtype in _FP8
    if (scale_a is None) != (scale_b is None) or (fp8 and scale_a is None):
        raise ArgumentError("grouped_mm: scale_a and scale_b together (FP8 operands need them)")
    want_a = 2 if layout == "contiguous" else 3
    if a.dim() != want_a or b.dim() != 3 or groups.dim() != 1 or groups.dtype != torch.int32:
        raise ArgumentError(
            f"grouped_mm: A {tuple(a.shape)}, B {tuple(b.shape)}, groups {groups.dtype} {tuple(groups.shape)}: "
            + ("A [T, K]" if layout == "contiguous" else "A [E, T_max, K]")
            + ", B [E, N, K] (nk) or [E, K, N] (kn), int32 [E]"
        )
    experts = b.shape[0]
    n, k = (b.shape[1], b.shape[2]) if b_layout == "nk" else (b.shape[2], b.shape[1])
    if a.shape[-1] != k or groups.shape[0] != experts or (layout == "masked" and a.shape[0] != experts):
        raise ArgumentError(f"grouped_mm: A {tuple(a.shape)}, B {tuple(b.shape)} and {groups.shape[0]} groups disagree")
    rows = a.shape[0] if layout == "contiguous" else a.shape[1]
    a_rows = rows if layout == "contiguous" else experts * rows
    scales = None
    if scale_a is not None:
        if scale_a.dtype != torch.float32 or scale_b.dtype != torch.float32:
            raise ArgumentError("grouped_mm: scale_a and scale_b float32")
        if scale_a.numel() != a_rows or scale_b.numel() != experts * n:
            raise ArgumentError(f"grouped_mm: scale_a needs {a_rows} elements (a row each), scale_b {experts} x {n}")
        scales = (scale_a.data_ptr(), scale_b.data_ptr())
    if swiglu and n % 256:
        raise ArgumentError(f"grouped_mm: swiglu=True needs N = {n} a multiple of 256 (interleave_gate_up's layout)")
    if weights is not None and (weights.dtype != torch.float32 or weights.numel() != a_rows):
        raise ArgumentError(f"grouped_mm: weights float32 with {a_rows} elements (a row each)")
    tensors = (a, b, groups) + ((scale_a, scale_b) if scales else ()) + ((weights,) if weights is not None else ())
    if any(not t.is_cuda or t.get_device() != a.get_device() for t in tensors):
        raise ArgumentError("grouped_mm: every tensor on the same CUDA device")
    if any(not t.is_contiguous() for t in tensors):
        raise ArgumentError("grouped_mm: every tensor contiguous")
    out = torch.bfloat16 if fp8 else a.dtype
    n_out = n // 2 if swiglu else n
    if layout == "contiguous":
        c = torch.empty((rows, n_out), dtype=out, device=a.device)
    else:
        c = torch.zeros((experts, rows, n_out), dtype=out, device=a.device)
    # The tile schedule the kernel makes on the device (int32 words: a first tile per group and
    # the count, then a group per row tile), sized for row tiles of 64, the smallest; from
    # torch's allocator, so it follows the stream (and a CUDA graph's memory pool).
    tiles = -(-rows // 64) + experts if layout == "contiguous" else experts * -(-rows // 64)
    schedule = torch.empty(experts + 1 + tiles, dtype=torch.int32, device=a.device)
    _trident.grouped_gemm(
        (a.data_ptr(), b.data_ptr(), c.data_ptr(), groups.data_ptr()),
        (schedule.data_ptr(), schedule.numel() * 4),
        scales,
        (bool(swiglu), weights.data_ptr() if weights is not None else None),
        (experts, n, k, rows),
        _GROUPED[a.dtype],
        layout,
        b_layout,
        a.get_device(),
        torch.cuda.current_stream(a.device).cuda_stream,
    )
    return c


def grouped_mm(a, b, offs, b_layout="nk", scale_a=None, scale_b=None, swiglu=False, weights=None):
    """See the module's text. Raises ``ArgumentError`` for wrong dtypes, shapes or devices."""
    return _grouped(a, b, offs, "contiguous", b_layout, scale_a, scale_b, swiglu, weights)


def grouped_mm_masked(a, b, counts, b_layout="nk", scale_a=None, scale_b=None, swiglu=False, weights=None):
    """See the module's text. Raises ``ArgumentError`` for wrong dtypes, shapes or devices."""
    return _grouped(a, b, counts, "masked", b_layout, scale_a, scale_b, swiglu, weights)


_DECODE = {torch.bfloat16: "bf16", torch.float16: "f16"}


def decode_extents(what, q, k_cache, v_cache, lens, block_table):
    """Decoding attention's extents ``(B, Nq, Hq, Hkv, D, S)`` and page size (``None`` for a
    contiguous cache) from its tensors' shapes (``trident.distributed.flash_decode``'s too, `S`
    a shard's keys); ``ArgumentError`` naming `what` where they do not fit together."""
    if q.dim() != 4 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ArgumentError(
            f"{what}: q {tuple(q.shape)}, caches {tuple(k_cache.shape)}/{tuple(v_cache.shape)}: "
            "q [B, Nq, Hq, D], caches [B, S, Hkv, D] or [pages, P, Hkv, D], the same"
        )
    batch, q_len, heads_q, d = q.shape
    heads_kv = k_cache.shape[2]
    if k_cache.shape[3] != d or lens.dtype != torch.int32 or lens.shape != (batch,):
        raise ArgumentError(f"{what}: head dims {d}/{k_cache.shape[3]}, lens {lens.dtype} {tuple(lens.shape)}: equal, int32 [B]")
    page = None
    if block_table is None:
        if k_cache.shape[0] != batch:
            raise ArgumentError(f"{what}: a contiguous cache of {k_cache.shape[0]} sequences for a batch of {batch}")
        cache_len = k_cache.shape[1]
    else:
        if block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != batch:
            raise ArgumentError(f"{what}: block_table {block_table.dtype} {tuple(block_table.shape)}: int32 [B, S / P]")
        page = k_cache.shape[1]
        if page < 16 or page & (page - 1):
            raise ArgumentError(f"{what}: pages of {page} keys: a power of two, at least 16")
        cache_len = block_table.shape[1] * page
    return (batch, q_len, heads_q, heads_kv, d, cache_len), page


def flash_decode(q, k_cache, v_cache, lens, block_table=None, k_scale=1.0, v_scale=1.0):
    """See the module's text. Raises ``ArgumentError`` for wrong dtypes, shapes or devices."""
    eight_bit = k_cache.dtype in _FP8 and v_cache.dtype == k_cache.dtype
    if q.dtype not in _DECODE or not (eight_bit or (k_cache.dtype == q.dtype and v_cache.dtype == q.dtype)):
        raise ArgumentError(
            f"flash_decode: q {q.dtype}, caches {k_cache.dtype}/{v_cache.dtype}: bfloat16 or float16 q, "
            "caches of q's type or both float8_e4m3fn or float8_e5m2"
        )
    if not eight_bit and (k_scale != 1.0 or v_scale != 1.0):
        raise ArgumentError("flash_decode: k_scale and v_scale are for an 8-bit cache")
    extents, page = decode_extents("flash_decode", q, k_cache, v_cache, lens, block_table)
    tensors = (q, k_cache, v_cache, lens) + ((block_table,) if block_table is not None else ())
    if any(not t.is_cuda or t.get_device() != q.get_device() for t in tensors):
        raise ArgumentError("flash_decode: every tensor on the same CUDA device")
    if any(not t.is_contiguous() for t in tensors):
        raise ArgumentError("flash_decode: every tensor contiguous")
    name = _DECODE[q.dtype]
    # Scratch from torch's allocator: it follows the stream (and a CUDA graph's memory pool).
    work = torch.empty(_trident.flash_decode_work_bytes(name, extents, page), dtype=torch.uint8, device=q.device)
    out = torch.empty_like(q)
    _trident.flash_decode(
        (
            q.data_ptr(),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            lens.data_ptr(),
            block_table.data_ptr() if block_table is not None else None,
            work.data_ptr(),
            out.data_ptr(),
        ),
        k_cache.numel() * k_cache.element_size(),
        extents,
        page,
        name,
        _FP8[k_cache.dtype] if eight_bit else name,
        (float(k_scale), float(v_scale)),
        q.get_device(),
        torch.cuda.current_stream(q.device).cuda_stream,
    )
    return out


def _fake_flash_decode(q, k_cache, v_cache, lens, block_table=None, k_scale=1.0, v_scale=1.0):
    return torch.empty_like(q)


def _out_dtype(a):
    return torch.bfloat16 if a.dtype in _FP8 else a.dtype


def _fake_grouped_mm(a, b, offs, b_layout="nk", scale_a=None, scale_b=None, swiglu=False, weights=None):
    n = b.shape[1] if b_layout == "nk" else b.shape[2]
    return a.new_empty((a.shape[0], n // 2 if swiglu else n), dtype=_out_dtype(a))


def _fake_grouped_mm_masked(a, b, counts, b_layout="nk", scale_a=None, scale_b=None, swiglu=False, weights=None):
    n = b.shape[1] if b_layout == "nk" else b.shape[2]
    return a.new_empty((a.shape[0], a.shape[1], n // 2 if swiglu else n), dtype=_out_dtype(a))


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
    lib.define(
        "grouped_mm(Tensor a, Tensor b, Tensor offs, str b_layout='nk', Tensor? scale_a=None, Tensor? scale_b=None,"
        " bool swiglu=False, Tensor? weights=None) -> Tensor"
    )
    lib.impl("grouped_mm", grouped_mm, "CUDA")
    torch.library.register_fake("trident::grouped_mm", lib=lib)(_fake_grouped_mm)
    lib.define(
        "grouped_mm_masked(Tensor a, Tensor b, Tensor counts, str b_layout='nk', Tensor? scale_a=None,"
        " Tensor? scale_b=None, bool swiglu=False, Tensor? weights=None) -> Tensor"
    )
    lib.impl("grouped_mm_masked", grouped_mm_masked, "CUDA")
    torch.library.register_fake("trident::grouped_mm_masked", lib=lib)(_fake_grouped_mm_masked)
    lib.define(
        "flash_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor lens, Tensor? block_table=None,"
        " float k_scale=1.0, float v_scale=1.0) -> Tensor"
    )
    lib.impl("flash_decode", flash_decode, "CUDA")
    torch.library.register_fake("trident::flash_decode", lib=lib)(_fake_flash_decode)


_define()
