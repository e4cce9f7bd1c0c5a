"""Kernels on torch CUDA tensors on the nvidia backend, without copies (skipped without torch,
CUDA or a GPU: CI has none)."""

import math
import pathlib

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device for torch", allow_module_level=True)

import trident  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_gelu_on_cuda_tensors_in_place():
    k = trident.compile(ROOT / "examples" / "gelu.tile", backend="nvidia")
    n = 100_000
    x = torch.empty(n, device="cuda", dtype=torch.float32).uniform_(-4, 4)
    out = torch.full((n,), float("nan"), device="cuda", dtype=torch.float32)
    ptr = out.data_ptr()
    k[(n + 255) // 256](x, out, n)
    assert out.data_ptr() == ptr  # written in place: no copy
    want = x.double() * (1 + torch.erf(x.double() / math.sqrt(2))) / 2
    assert torch.max(torch.abs(out.double() - want)).item() <= 1e-5


def test_a_cuda_tensor_of_the_wrong_dtype():
    k = trident.compile(ROOT / "examples" / "gelu.tile", backend="nvidia")
    x = torch.zeros(10, device="cuda", dtype=torch.float16)
    with pytest.raises(trident.ArgumentError, match="torch.float16"):
        k[1](x, x, 10)


COPY_BYTES = """
kernel @copy_bytes(%x: !ptr<u8>, %out: !ptr<u8>, %n: i32) attributes {warps = 4, stages = 2, cooperative = false} {
  %pid = program_id x : i32
  %bs = const 256 : i32
  %base = mul %pid, %bs : i32
  %lanes = arange 0, 256 : tile<256xi32>
  %b = splat %base : tile<256xi32>
  %i = add %b, %lanes : tile<256xi32>
  %nn = splat %n : tile<256xi32>
  %m = cmp lt %i, %nn : tile<256xi1>
  %xs = splat %x : tile<256x!ptr<u8>>
  %xp = addptr %xs, %i : tile<256x!ptr<u8>>
  %v = load %xp, mask %m : tile<256xu8>
  %os = splat %out : tile<256x!ptr<u8>>
  %op = addptr %os, %i : tile<256x!ptr<u8>>
  store %op, %v, mask %m
  return
}
"""

WAIT_FLAG = """
kernel @wait_flag(%flag: !ptr<u64>, %value: u64) attributes {warps = 4, stages = 2, cooperative = false} {
  %one = const 1 : i32
  %t = wait %flag, %one, cmp ge, %value, scope sys, sem acquire : !token
  return
}
"""


def gelu_ref(x):
    return x.double() * (1 + torch.erf(x.double() / math.sqrt(2))) / 2


def gelu():
    return trident.compile(ROOT / "examples" / "gelu.tile", backend="nvidia")


def test_the_launch_is_on_the_callers_stream():
    """On a side stream, behind a long torch op that writes the input: a launch on any other
    stream would read the input before it was written."""
    k, n = gelu(), 1 << 20
    side = torch.cuda.Stream()
    big = torch.randn(4096, 4096, device="cuda")
    src = torch.empty(n, device="cuda").uniform_(-4, 4)
    x = torch.zeros(n, device="cuda")
    out = torch.full((n,), float("nan"), device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        for _ in range(20):
            big = big @ big / 4096
        x.copy_(src + 0 * big[0, 0])
        k[(n + 255) // 256](x, out, n)
    side.synchronize()
    assert torch.max(torch.abs(out.double() - gelu_ref(src))).item() <= 1e-5


def test_a_cuda_graph_replays_the_launch_100_times():
    k, n = gelu(), 50_000
    x = torch.empty(n, device="cuda")
    out = torch.empty(n, device="cuda")
    x.uniform_(-4, 4)
    k[(n + 255) // 256](x, out, n)  # warm: the module loads outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        k[(n + 255) // 256](x, out, n)
    for i in range(100):
        x.uniform_(-4, 4)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        err = torch.max(torch.abs(out.double() - gelu_ref(x))).item()
        assert err <= 1e-5, f"replay {i}: {err}"


def test_fp8_tensors_travel_as_bytes():
    k = trident.compile(COPY_BYTES, backend="nvidia")
    n = 10_000
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        x = torch.randn(n, device="cuda").to(dtype)
        out = torch.zeros(n, device="cuda", dtype=torch.uint8).view(dtype)
        k[(n + 255) // 256](x, out, n)
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.uint8), x.view(torch.uint8))
    with pytest.raises(trident.ArgumentError, match="float16"):
        k[1](torch.zeros(4, device="cuda", dtype=torch.float16), out, 4)


class Exporter:
    """Something that is not a torch tensor but exports DLPack (as CuPy or JAX arrays do)."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, stream=None):
        return self.t.__dlpack__()

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


def test_dlpack_objects_are_taken_by_address():
    k, n = gelu(), 3000
    x = torch.empty(n, device="cuda").uniform_(-4, 4)
    out = torch.full((n,), float("nan"), device="cuda")
    k[(n + 255) // 256](Exporter(x), Exporter(out), n)
    torch.cuda.synchronize()
    assert torch.max(torch.abs(out.double() - gelu_ref(x))).item() <= 1e-5
    with pytest.raises(trident.ArgumentError, match="DLPack tensor of f16"):
        k[1](Exporter(x.half()), out, 10)
    with pytest.raises(trident.ArgumentError, match="not contiguous"):
        k[1](Exporter(torch.zeros(20, device="cuda")[::2]), out, 10)


def test_wrong_tensors_are_typed_errors():
    k = gelu()
    x = torch.zeros(10, device="cuda")
    with pytest.raises(trident.ArgumentError, match="on cpu"):
        k[1](torch.zeros(10), x, 10)
    with pytest.raises(trident.ArgumentError, match="not contiguous"):
        k[1](torch.zeros(20, device="cuda")[::2], x, 10)
    with pytest.raises(trident.ArgumentError, match="takes an int"):
        k[1](x, x, 1.5)


def test_a_wait_that_times_out_is_reported_by_synchronize():
    k = trident.compile(WAIT_FLAG, backend="nvidia")
    words = torch.zeros(1, device="cuda", dtype=torch.int64)
    flag = words.view(torch.uint64)
    k[1](flag, 1)  # returns at once; nobody sets the flag
    with pytest.raises(trident.KernelError, match="wait_flag") as e:
        trident.synchronize()
    print(e.value)
    trident.synchronize()  # the record was reset
    words.fill_(1)
    k[1](flag, 1)
    trident.synchronize()


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("scaling", ["tensor", "row", "block"])
# K = 256 takes the descriptor form on sm_90a (TMA and FP8 wgmma) for tensor and row scaling.
@pytest.mark.parametrize("mnk", [(65, 200, 300), (130, 200, 256)])
@pytest.mark.parametrize("fast", [False, True])
def test_scaled_fp8_gemm_against_float64(dtype, scaling, mnk, fast):
    import trident.ops

    m, n, k = mnk
    # Clamped before the cast: torch's FP8 overflow behaviour changed across versions.
    a = (torch.randn(m, k, device="cuda") * 64).clamp(-448, 448).to(dtype)
    b = (torch.randn(n, k, device="cuda") * 64).clamp(-448, 448).to(dtype)
    kb = -(-k // 128)
    shapes = {"tensor": ((1,), (1,)), "row": ((m,), (n,)), "block": ((m, kb), (-(-n // 128), kb))}[scaling]
    sa = torch.rand(shapes[0], device="cuda") + 0.5
    sb = torch.rand(shapes[1], device="cuda") + 0.5
    c = torch.ops.trident.scaled_mm(a, b, sa, sb, scaling, use_fast_accum=fast)
    torch.cuda.synchronize()
    a64, b64 = a.double(), b.double()
    if scaling == "block":
        want = torch.zeros(m, n, dtype=torch.float64, device="cuda")
        for q in range(kb):
            s = slice(q * 128, min((q + 1) * 128, k))
            part = a64[:, s] @ b64[:, s].T
            want += part * sa[:, q].double()[:, None] * sb[:, q].double().repeat_interleave(128)[:n][None, :]
    else:
        want = (a64 @ b64.T) * sa.double().reshape(-1, 1 if scaling == "row" else 1)
        want = want * (sb.double()[None, :] if scaling == "row" else sb.double())
    err = (c.double() - want).abs().max().item() / want.abs().max().item()
    assert err <= 1e-2, err
    with pytest.raises(trident.ArgumentError, match="float8"):
        trident.ops.scaled_mm(a.half(), b, sa, sb, scaling)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("b_layout", ["nk", "kn"])
def test_grouped_gemm_against_float64(dtype, b_layout):
    import trident.ops

    # Experts with 0, 1 and many rows; K and N not multiples of the tiles.
    rows = [0, 1, 70, 0, 130, 5]
    e, n, k = len(rows), 72, 40
    a = torch.randn(sum(rows), k, device="cuda").to(dtype)
    b = torch.randn(e, n, k, device="cuda").to(dtype)
    b_given = b if b_layout == "nk" else b.transpose(1, 2).contiguous()
    offs = torch.tensor(rows, device="cuda").cumsum(0).to(torch.int32)
    c = torch.ops.trident.grouped_mm(a, b_given, offs, b_layout)
    masked_a = torch.zeros(e, max(rows) + 2, k, device="cuda", dtype=dtype)
    start = 0
    for i, r in enumerate(rows):
        masked_a[i, :r] = a[start:start + r]
        start += r
    counts = torch.tensor(rows, device="cuda", dtype=torch.int32)
    cm = torch.ops.trident.grouped_mm_masked(masked_a, b_given, counts, b_layout)
    torch.cuda.synchronize()
    start = 0
    for i, r in enumerate(rows):
        want = a[start:start + r].double() @ b[i].double().T
        for got in (c[start:start + r], cm[i, :r]):
            err = (got.double() - want).abs().max().item() if r else 0.0
            assert err <= 2e-2 * max(1.0, want.abs().max().item() if r else 1.0), (i, err)
        assert cm[i, r:].abs().max().item() == 0 if r < cm.shape[1] else True
        start += r
    with pytest.raises(trident.ArgumentError, match="int32"):
        trident.ops.grouped_mm(a, b_given, offs.long(), b_layout)


@pytest.mark.parametrize("b_layout", ["nk", "kn"])
def test_grouped_gemm_swiglu_and_weights_against_float64(b_layout):
    """SwiGLU of the [gate; up] halves (interleaved by ``interleave_gate_up``) times each row's
    routing weight, against float64 per expert; an expert with no rows and one with one."""
    import trident.ops

    rows = [3, 0, 1, 150]
    e, i_half, k = len(rows), 256, 64
    a = torch.randn(sum(rows), k, device="cuda").to(torch.bfloat16)
    w13 = (torch.randn(e, 2 * i_half, k, device="cuda") / 4).to(torch.bfloat16)
    weights = torch.rand(sum(rows), device="cuda")
    given = w13 if b_layout == "nk" else w13.transpose(1, 2).contiguous()
    b = trident.ops.interleave_gate_up(given, b_layout)
    offs = torch.tensor(rows, device="cuda").cumsum(0).to(torch.int32)
    c = torch.ops.trident.grouped_mm(a, b, offs, b_layout, swiglu=True, weights=weights)
    torch.cuda.synchronize()
    assert c.shape == (sum(rows), i_half)
    start = 0
    for x, r in enumerate(rows):
        if r:
            h = a[start:start + r].double() @ w13[x].double().T
            gate, up = h[:, :i_half], h[:, i_half:]
            want = gate * torch.sigmoid(gate) * up * weights[start:start + r, None].double()
            err = (c[start:start + r].double() - want).abs().max().item()
            assert err <= 2e-2 * max(1.0, want.abs().max().item()), (x, err)
        start += r
    with pytest.raises(trident.ArgumentError, match="multiple of 256"):
        trident.ops.grouped_mm(a, b[:, :128] if b_layout == "nk" else b[:, :, :128].contiguous(), offs, b_layout, swiglu=True)


@pytest.mark.parametrize("k", [96, 40])  # 96: TMA and FP8 wgmma on the H200; 40: portable
def test_fp8_grouped_gemm_with_row_scales_against_float64(k):
    import trident.ops

    rows = [0, 1, 70, 130]
    e, n = len(rows), 136
    a = (torch.randn(sum(rows), k, device="cuda") * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    b = (torch.randn(e, n, k, device="cuda") * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    offs = torch.tensor(rows, device="cuda").cumsum(0).to(torch.int32)
    sa = torch.rand(sum(rows), device="cuda") + 0.5
    sb = torch.rand(e, n, device="cuda") + 0.5
    c = torch.ops.trident.grouped_mm(a, b, offs, "nk", sa, sb)
    torch.cuda.synchronize()
    assert c.dtype == torch.bfloat16
    start = 0
    for i, r in enumerate(rows):
        if r:
            want = (a[start:start + r].double() @ b[i].double().T) * sa[start:start + r, None].double() * sb[i].double()
            err = (c[start:start + r].double() - want).abs().max().item() / want.abs().max().item()
            assert err <= 1e-2, (i, err)
        start += r
    with pytest.raises(trident.ArgumentError, match="scale_a and scale_b"):
        trident.ops.grouped_mm(a, b, offs)


def _decode_reference(q, k, v, lens):
    """Causal GQA attention of q's tokens (the newest of each sequence) in float64."""
    batch, q_len, heads_q, d = q.shape
    group = heads_q // k.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    for b in range(batch):
        n = int(lens[b])
        kb = k[b, :n].double().repeat_interleave(group, dim=1)  # [n, Hq, D]
        vb = v[b, :n].double().repeat_interleave(group, dim=1)
        for i in range(q_len):
            pos = n - q_len + i
            if pos < 0:
                continue
            s = torch.einsum("hd,nhd->hn", q[b, i].double(), kb[: pos + 1]) / math.sqrt(d)
            out[b, i] = torch.einsum("hn,nhd->hd", torch.softmax(s, dim=-1), vb[: pos + 1])
    return out


def _paged(caches, page):
    """Each cache ``[B, S, Hkv, D]`` as a pool of pages ``[B S / P, P, Hkv, D]``, every
    sequence's pages shuffled through it (the same order for all), and the block table. FP8
    caches move as bytes (indexed copies of float8 tensors are not in every torch)."""
    batch, cap = caches[0].shape[:2]
    per = cap // page
    order = torch.randperm(batch * per, device="cuda")
    pools = []
    for c in caches:
        raw = c.view(torch.uint8) if c.element_size() == 1 else c
        pool = torch.empty((batch * per, page) + tuple(raw.shape[2:]), device="cuda", dtype=raw.dtype)
        pool[order] = raw.reshape(batch * per, page, *raw.shape[2:])
        pools.append(pool.view(c.dtype))
    return pools, order.reshape(batch, per).to(torch.int32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("page", [None, 16, 256])
def test_flash_decode_against_float64(dtype, page):
    import trident.ops

    # GQA 4:1, two new tokens, sequences of different lengths (one shorter than the tokens,
    # one whole cache), a cache not a multiple of the key block.
    batch, q_len, heads_q, heads_kv, d, cap = 3, 2, 8, 2, 128, 4096 + 256
    lens = torch.tensor([1, 4099, cap], dtype=torch.int32, device="cuda")
    q = torch.randn(batch, q_len, heads_q, d, device="cuda").to(dtype)
    k = torch.randn(batch, cap, heads_kv, d, device="cuda").to(dtype)
    v = torch.randn(batch, cap, heads_kv, d, device="cuda").to(dtype)
    if page is None:
        out = torch.ops.trident.flash_decode(q, k, v, lens)
    else:
        (kp, vp), table = _paged((k, v), page)
        out = torch.ops.trident.flash_decode(q, kp, vp, lens, table)
    torch.cuda.synchronize()
    want = _decode_reference(q, k, v, lens)
    err = (out.double() - want).abs().max().item()
    assert err <= 2e-2, err
    # The first sequence's first token sees no key: zeros.
    assert out[0, 0].abs().max().item() == 0
    with pytest.raises(trident.ArgumentError, match="int32"):
        trident.ops.flash_decode(q, k, v, lens.long())


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("page", [None, 64])
def test_flash_decode_fp8_cache_against_float64(fp8, page):
    import trident.ops

    # An FP8 cache with per-tensor scales (neither a power of two), GQA 4:1, two new tokens.
    batch, q_len, heads_q, heads_kv, d, cap = 2, 2, 8, 2, 128, 2048 + 64
    lens = torch.tensor([1027, cap], dtype=torch.int32, device="cuda")
    q = torch.randn(batch, q_len, heads_q, d, device="cuda").to(torch.bfloat16)
    k8 = (4 * torch.rand(batch, cap, heads_kv, d, device="cuda") - 2).to(fp8)
    v8 = (4 * torch.rand(batch, cap, heads_kv, d, device="cuda") - 2).to(fp8)
    ks, vs = 0.37, 1.9
    if page is None:
        out = torch.ops.trident.flash_decode(q, k8, v8, lens, k_scale=ks, v_scale=vs)
    else:
        (kp, vp), table = _paged((k8, v8), page)
        out = torch.ops.trident.flash_decode(q, kp, vp, lens, table, k_scale=ks, v_scale=vs)
    torch.cuda.synchronize()
    want = _decode_reference(q, k8.double() * ks, v8.double() * vs, lens)
    err = (out.double() - want).abs().max().item() / want.abs().max().item()
    assert err <= 2e-2, err
    with pytest.raises(trident.ArgumentError, match="8-bit cache"):
        trident.ops.flash_decode(q, q, q, lens, k_scale=2.0)
