"""Baseline timings for `trident bench`, measured in the same run on the same GPU.

Reads the cases (`trident bench --cases`, one per line: name dtype dims...) and times the vendor
path for each with `triton.testing.do_bench` (median ms): cuBLAS through `torch.matmul` for
GEMM (rocBLAS/hipBLASLt under PyTorch for ROCm), PyTorch's kernels for softmax and elementwise
add, and for GEMM also a Triton kernel (below; autotuned over a few Hopper-sized
configurations, Triton picks wgmma and its pipelining itself), keyed "triton <case>". Writes
{"case line": ms} as JSON. Baselines only: nothing here is part of trident.
"""

import json
import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench


def _configs():
    out = []
    for bm, bn, bk, warps, stages in [
        (128, 256, 64, 8, 3),
        (128, 128, 64, 8, 4),
        (128, 256, 64, 8, 4),
        (64, 128, 64, 4, 4),
        (64, 256, 64, 4, 4),
    ]:
        out.append(triton.Config({"BM": bm, "BN": bn, "BK": bk, "GROUP": 8}, num_warps=warps, num_stages=stages))
    return out


@triton.autotune(configs=_configs(), key=["M", "N", "K"])
@triton.jit
def _matmul(a, b, c, M, N, K, sam, sbk, scm, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    width = GROUP * tiles_n
    first = (pid // width) * GROUP
    rows = min(tiles_m - first, GROUP)
    pm = first + (pid % width) % rows
    pn = (pid % width) // rows
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        ka = k0 + rk
        x = tl.load(a + rm[:, None] * sam + ka[None, :], mask=(rm[:, None] < M) & (ka[None, :] < K), other=0.0)
        y = tl.load(b + ka[:, None] * sbk + rn[None, :], mask=(ka[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(x, y, acc)
    tl.store(c + rm[:, None] * scm + rn[None, :], acc.to(c.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def triton_matmul(a, b):
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty((m, n), device=a.device, dtype=a.dtype)
    grid = lambda meta: (triton.cdiv(m, meta["BM"]) * triton.cdiv(n, meta["BN"]),)
    _matmul[grid](a, b, c, m, n, k, a.stride(0), b.stride(0), c.stride(0))
    return c

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def grouped_rows(experts: int, tokens: int, routing: int) -> list:
    """Each expert's rows, by the rule of trident's `grouped_rows` (bench/src/command.rs):
    uniform, or skewed (one expert half the tokens, a quarter of the experts none)."""
    total = experts * tokens
    if routing == 0:
        return [tokens] * experts
    empty = experts // 4
    rows = [0] * experts
    rows[empty] = total // 2
    rest = experts - empty - 1
    left = total - total // 2
    for i in range(empty + 1, experts):
        rows[i] = left // rest + (1 if i - empty - 1 < left % rest else 0)
    return rows


def grouped_mm_ms(experts: int, n: int, k: int, tokens: int, routing: int, fp8: bool = False) -> float:
    """`torch._grouped_mm` on bf16 A [T, K] (rows grouped by expert, `offs` their int32 ends)
    and B [E, N, K] passed as its [E, K, N] transpose, checked against float32 per expert; with
    `fp8`, `torch._scaled_grouped_mm` on e4m3 with row-wise scales ([T] and [E, N]), bf16 out,
    `use_fast_accum` (as trident's grouped FP8 GEMM accumulates)."""
    dev = "cuda"
    rows = grouped_rows(experts, tokens, routing)
    t = sum(rows)
    a = torch.randn(t, k, device=dev, dtype=torch.bfloat16)
    b = torch.randn(experts, n, k, device=dev, dtype=torch.bfloat16)
    offs = torch.tensor(rows, device=dev, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    sa = torch.ones(t, device=dev)
    sb = torch.ones(experts, n, device=dev)
    if fp8:
        a, b = (a * 64).clamp(-448, 448).to(torch.float8_e4m3fn), (b * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
        sa, sb = torch.rand(t, device=dev) / 64 + 1e-3, torch.rand(experts, n, device=dev) / 64 + 1e-3
        run = lambda: torch._scaled_grouped_mm(
            a, b.transpose(-2, -1), sa, sb, offs=offs, out_dtype=torch.bfloat16, use_fast_accum=True
        )
    else:
        run = lambda: torch._grouped_mm(a, b.transpose(-2, -1), offs=offs)
    got = run().float()
    start, worst = 0, 0.0
    for e, r in enumerate(rows):
        if r:
            want = (a[start:start + r].float() @ b[e].float().t()) * sa[start:start + r, None] * sb[e][None, :]
            worst = max(worst, ((got[start:start + r] - want).abs().max() / want.abs().max()).item())
        start += r
    if not worst < 2e-2:
        raise RuntimeError(f"relative error {worst:.2e}")
    return do_bench(run, return_mode="median")


def grouped_mm_swiglu_ms(experts: int, n: int, k: int, tokens: int, routing: int) -> float:
    """The gate/up GEMM of an MoE layer as PyTorch runs it: `torch._grouped_mm` on bf16 A
    [T, K] and B [E, N, K] (the gate's N/2 rows, then the up's), then `silu(gate) * up`,
    checked against float32 per expert."""
    dev = "cuda"
    rows = grouped_rows(experts, tokens, routing)
    t, half = sum(rows), n // 2
    a = torch.randn(t, k, device=dev, dtype=torch.bfloat16)
    b = torch.randn(experts, n, k, device=dev, dtype=torch.bfloat16) / 8
    offs = torch.tensor(rows, device=dev, dtype=torch.int32).cumsum(0, dtype=torch.int32)

    def run():
        h = torch._grouped_mm(a, b.transpose(-2, -1), offs=offs)
        return torch.nn.functional.silu(h[:, :half]) * h[:, half:]

    got = run().float()
    start, worst = 0, 0.0
    for e, r in enumerate(rows):
        if r:
            h = a[start:start + r].float() @ b[e].float().t()
            want = torch.nn.functional.silu(h[:, :half]) * h[:, half:]
            worst = max(worst, ((got[start:start + r] - want).abs().max() / want.abs().max()).item())
        start += r
    if not worst < 3e-2:
        raise RuntimeError(f"relative error {worst:.2e}")
    return do_bench(run, return_mode="median")


def scaled_mm_ms(scaling: str, m: int, n: int, k: int) -> float:
    """`torch._scaled_mm` (cuBLASLt) on e4m3 A [m, k] and B [n, k] (passed as B^T, the
    column-major operand it wants), bf16 out, with one f32 scale per tensor, per row ([m, 1] and
    [1, n]), or DeepSeek-V3's blocks (1 x 128 for A, 128 x 128 for B, where this torch and
    cuBLAS support them), checked against a float32 reference first. Tensor and row scaling
    accumulate as trident's case does: the whole K in the tensor cores (`use_fast_accum`), or
    for `<scaling>_promoted` with cuBLAS's default accumulation."""
    dev = "cuda"
    fast = not scaling.endswith("_promoted")
    scaling = scaling.removesuffix("_promoted")
    f8 = torch.float8_e4m3fn
    a = (torch.rand(m, k, device=dev) * 2 - 1).mul(400).to(f8)
    b = (torch.rand(n, k, device=dev) * 2 - 1).mul(400).to(f8)
    if scaling == "tensor":
        sa = torch.tensor(1 / 400, device=dev)
        sb = torch.tensor(1 / 400, device=dev)
        ref_sa, ref_sb = sa, sb
    elif scaling == "row":
        sa = torch.rand(m, 1, device=dev) / 400 + 1e-3
        sb = torch.rand(1, n, device=dev) / 400 + 1e-3
        ref_sa, ref_sb = sa, sb
    else:
        kb = (k + 127) // 128
        sa = (torch.rand(m, kb, device=dev) / 400 + 1e-3).t().contiguous().t()  # M-major, as cuBLAS wants
        sb = torch.rand((n + 127) // 128, kb, device=dev) / 400 + 1e-3
        ref_sa = sa.repeat_interleave(128, dim=1)[:, :k]
        ref_sb = sb.repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
    fast = fast and scaling != "block"
    run = lambda: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=fast)
    got = run().float()
    if scaling == "block":
        want = (a.float() * ref_sa) @ (b.float() * ref_sb).t()
    else:
        want = (a.float() @ b.float().t()) * ref_sa * ref_sb
    err = ((got - want).abs().max() / want.abs().max()).item()
    if not err < 1e-2:
        raise RuntimeError(f"relative error {err:.2e}")
    return do_bench(run, return_mode="median")


@triton.jit
def _decode_split(q, k, v, part, lse, length, chunk, scale, HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr,
                  D: tl.constexpr, BN: tl.constexpr, SPLITS: tl.constexpr):
    # One KV head's G query heads (padded to GP rows) over one chunk of the cache [B, S, HKV, D].
    bh, s = tl.program_id(0), tl.program_id(1)
    b, h = bh // HKV, bh % HKV
    g, d = tl.arange(0, GP), tl.arange(0, D)
    qt = tl.load(q + (b * HKV * G + h * G + g)[:, None] * D + d[None, :], mask=(g < G)[:, None], other=0.0)
    m = tl.full([GP], float("-inf"), tl.float32)
    l = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, D], tl.float32)
    start = s * chunk
    end = tl.minimum(start + chunk, length)
    for j0 in range(start, end, BN):
        j = j0 + tl.arange(0, BN)
        ok = j < end
        rows = ((b * length + j) * HKV + h) * D
        kt = tl.load(k + rows[:, None] + d[None, :], mask=ok[:, None], other=0.0)
        sc = tl.dot(qt, tl.trans(kt)) * scale
        sc = tl.where(ok[None, :], sc, float("-inf"))
        mn = tl.maximum(m, tl.max(sc, 1))
        p = tl.exp(sc - mn[:, None])
        alpha = tl.exp(m - mn)
        vt = tl.load(v + rows[:, None] + d[None, :], mask=ok[:, None], other=0.0)
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
        m = mn
    at = (bh * SPLITS + s) * GP + g
    tl.store(part + at[:, None] * D + d[None, :], acc / l[:, None])
    tl.store(lse + at, m + tl.log(l))


@triton.jit
def _decode_combine(part, lse, out, HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
                    SPLITS: tl.constexpr, SP: tl.constexpr):
    bh, g = tl.program_id(0), tl.program_id(1)
    s, d = tl.arange(0, SP), tl.arange(0, D)
    at = (bh * SPLITS + s) * GP + g
    x = tl.load(lse + at, mask=s < SPLITS, other=float("-inf"))
    w = tl.exp(x - tl.max(x, 0))
    parts = tl.load(part + at[:, None] * D + d[None, :], mask=(s < SPLITS)[:, None], other=0.0)
    o = tl.sum(parts * w[:, None], 0) / tl.sum(w, 0)
    tl.store(out + (bh * G + g) * D + d, o.to(out.dtype.element_ty))


def triton_decode(q, k, v, splits: int):
    """Split-KV decoding attention in Triton (one new token: `q [B, Hq, D]`, caches `[B, S, Hkv,
    D]`), written for this baseline: FlashDecoding's two kernels."""
    batch, heads_q, dim = q.shape
    length, heads_kv = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    gp = max(16, triton.next_power_of_2(group))
    bn = 64
    chunk = triton.cdiv(triton.cdiv(length, splits), bn) * bn
    splits = triton.cdiv(length, chunk)
    part = torch.empty(batch * heads_kv * splits * gp, dim, device=q.device, dtype=torch.float32)
    lse = torch.empty(batch * heads_kv * splits * gp, device=q.device, dtype=torch.float32)
    out = torch.empty_like(q)
    _decode_split[(batch * heads_kv, splits)](q, k, v, part, lse, length, chunk, dim ** -0.5, heads_kv, group, gp, dim, bn,
                                              splits)
    _decode_combine[(batch * heads_kv, group)](part, lse, out, heads_kv, group, gp, dim, splits,
                                               triton.next_power_of_2(splits))
    return out


def triton_decode_ms(batch: int, q_len: int, heads_q: int, heads_kv: int, head_dim: int, length: int) -> float:
    """The Triton split-KV kernel above, checked against SDPA first (max abs error printed),
    with about four programs per multiprocessor of a 132-SM GPU."""
    if q_len != 1:
        raise ValueError("the baseline times one new token per sequence")
    dt = torch.bfloat16
    q = torch.randn(batch, heads_q, head_dim, device="cuda", dtype=dt)
    k = torch.randn(batch, length, heads_kv, head_dim, device="cuda", dtype=dt)
    v = torch.randn_like(k)
    splits = max(1, min(64, triton.cdiv(528, batch * heads_kv)))
    got = triton_decode(q, k, v, splits).float()
    want = torch.nn.functional.scaled_dot_product_attention(
        q.unsqueeze(2).float(), k.transpose(1, 2).float(), v.transpose(1, 2).float(), enable_gqa=True).squeeze(2)
    print(f"baseline triton split-KV decode: max abs error {(got - want).abs().max().item():.2e} against SDPA in f32",
          flush=True)
    return do_bench(lambda: triton_decode(q, k, v, splits), return_mode="median")


def sdpa_backends(q, k, v) -> str:
    """Which of SDPA's backends run this problem, each timed alone: the default dispatch takes the
    first that supports it (it may fall back to the math path)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sdpa = torch.nn.functional.scaled_dot_product_attention
    said = []
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            continue
        try:
            with sdpa_kernel(backend):
                ms = do_bench(lambda: sdpa(q, k, v, enable_gqa=True), return_mode="median")
            said.append(f"{name.lower()} {ms:.3f} ms")
        except Exception:  # this backend does not take the problem
            said.append(f"{name.lower()} -")
    return ", ".join(said)


def flash_decode_ms(batch: int, q_len: int, heads_q: int, heads_kv: int, head_dim: int, length: int) -> float:
    """Decoding attention as PyTorch serves it: `scaled_dot_product_attention` with grouped
    query heads on `[B, H, S, D]` tensors (one new token per sequence: no mask)."""
    if q_len != 1:
        raise ValueError("the baseline times one new token per sequence")
    dt = torch.bfloat16
    q = torch.randn(batch, heads_q, q_len, head_dim, device="cuda", dtype=dt)
    k = torch.randn(batch, heads_kv, length, head_dim, device="cuda", dtype=dt)
    v = torch.randn_like(k)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    print(f"baseline SDPA backends for flash_decode {batch} {q_len} {heads_q} {heads_kv} {head_dim} {length}: "
          f"{sdpa_backends(q, k, v)}", flush=True)
    return do_bench(lambda: sdpa(q, k, v, enable_gqa=True), return_mode="median")


def flash_attn_decode_ms(batch: int, q_len: int, heads_q: int, heads_kv: int, head_dim: int, length: int) -> float:
    """FlashAttention's decoding kernel (`flash_attn_with_kvcache`, split-KV) on `[B, S, H, D]`
    caches, where the package is installed."""
    from flash_attn import flash_attn_with_kvcache

    dt = torch.bfloat16
    q = torch.randn(batch, q_len, heads_q, head_dim, device="cuda", dtype=dt)
    k = torch.randn(batch, length, heads_kv, head_dim, device="cuda", dtype=dt)
    v = torch.randn_like(k)
    lens = torch.full((batch,), length, device="cuda", dtype=torch.int32)
    return do_bench(lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, causal=True), return_mode="median")


def timed(results: dict, line: str, run) -> None:
    """Records `run()`'s time for the case `line`, or prints why there is none (a torch or
    cuBLAS without the operation, or a failed check, leaves the column empty)."""
    try:
        ms = run()
    except Exception as e:
        print(f"baseline {line}: failed: {e}", flush=True)
        return
    results[line] = ms
    print(f"baseline {line}: {ms:.3f} ms", flush=True)


def main(cases_path: str, out_path: str) -> None:
    results = {}
    for line in open(cases_path):
        line = line.strip()
        if not line:
            continue
        name, dtype, *dims = line.split()
        dims = [int(d) for d in dims]
        dev = "cuda"
        if name == "grouped_gemm" and len(dims) > 5 and dims[5] == 1:
            print(f"baseline {line}: none (block-scaled grouped FP8: compared with the FP8 peak)", flush=True)
            continue
        if name == "grouped_gemm":
            if len(dims) > 5:
                timed(results, line, lambda: grouped_mm_swiglu_ms(*dims[:5]))
            else:
                timed(results, line, lambda: grouped_mm_ms(*dims, fp8=dtype.startswith("f8")))
            continue
        if name == "flash_decode" and len(dims) > 6:
            print(f"baseline {line}: none (an 8-bit cache: compared with the HBM floor)", flush=True)
            continue
        if name == "flash_decode":
            timed(results, line, lambda: flash_decode_ms(*dims))
            timed(results, "flash-attn " + line, lambda: flash_attn_decode_ms(*dims))
            timed(results, "triton " + line, lambda: triton_decode_ms(*dims))
            continue
        if name.startswith("scaled_gemm_"):
            timed(results, line, lambda: scaled_mm_ms(name[len("scaled_gemm_"):], *dims))
            continue
        dt = DTYPES[dtype]
        if name == "vector_add":
            x, y = (torch.rand(dims[0], device=dev, dtype=dt) for _ in range(2))
            z = torch.empty_like(x)
            ms = do_bench(lambda: torch.add(x, y, out=z), return_mode="median")
        elif name in ("softmax", "softmax_fast"):
            x = torch.rand(dims[0], dims[1], device=dev, dtype=dt)
            ms = do_bench(lambda: torch.softmax(x, dim=-1), return_mode="median")
        elif name == "gemm":
            m, n, k = dims
            a = torch.rand(m, k, device=dev, dtype=dt)
            b = torch.rand(k, n, device=dev, dtype=dt)
            ms = do_bench(lambda: torch.matmul(a, b), return_mode="median")
            try:
                got = triton_matmul(a, b)
                err = (got.float() - torch.matmul(a.float(), b.float())).abs().max().item()
                tms = do_bench(lambda: triton_matmul(a, b), return_mode="median")
                results["triton " + line] = tms
                print(f"baseline triton {line}: {tms:.3f} ms (max abs error {err:.2e})", flush=True)
            except Exception as e:  # a Triton that cannot build the kernel leaves the column empty
                print(f"baseline triton {line}: failed: {e}", flush=True)
        else:
            continue
        results[line] = ms
        print(f"baseline {line}: {ms:.3f} ms", flush=True)
    json.dump(results, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
