"""Run by torchrun (``test_distributed_gpu.py`` starts it): trident's distributed ops on torch
tensors against float64 references computed from every rank's inputs (gathered through gloo,
independently of trident), fresh random inputs each call, output memory poisoned first; the
torch ops; 100 replays of a CUDA graph of the ops; symmetric tensors; then the example
blocks (the MLP through torch.compile). Prints one line per check and exits non-zero on a
failure."""

import os
import sys

import torch
import torch.distributed as dist

import trident
import trident.distributed as td

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import tp_blocks  # noqa: E402

dist.init_process_group("gloo")
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(1000 + rank)
failures = []


def report(name, err, tol):
    ok = err <= tol
    print(f"rank {rank}: {'PASS' if ok else 'FAIL'} {name}: error {err:.3e} (tolerance {tol:.1e})", flush=True)
    if not ok:
        failures.append(name)


def everyone(x):
    """Every rank's `x`, in rank order, as float64 on the host (through gloo)."""
    parts = [torch.empty(x.shape, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(parts, x.double().cpu())
    return parts


def poison(shape, dtype):
    """Leaves a NaN-filled block of this size in torch's cache: the op's output reuses it."""
    torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def rel(got, want):
    return (got.double().cpu() - want).abs().max().item() / max(want.abs().max().item(), 1e-30)


w = td.init()
print(f"rank {rank}: {w!r}", flush=True)

for dtype, tol in [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)]:
    for n in (1000, 300_000):
        x = torch.randn(n, device="cuda").to(dtype)
        xs = everyone(x)
        poison((world, n), dtype)
        report(f"all_gather {dtype} {n}", rel(td.all_gather(x), torch.stack(xs)), 0.0)
        poison((n,), dtype)
        report(f"all_reduce {dtype} {n}", rel(td.all_reduce(x), sum(xs)), tol)
        y = torch.randn(world * 64, n // 100, device="cuda").to(dtype)
        ys = everyone(y)
        poison((64, n // 100), dtype)
        report(f"reduce_scatter {dtype} {tuple(y.shape)}", rel(td.reduce_scatter(y), sum(ys).chunk(world)[rank]), tol)

m, n, k = 1024, 768, 512
for op in ("ag_gemm", "gemm_rs"):
    for call in range(3):
        a = torch.randn(m // world if op == "ag_gemm" else m, k, device="cuda").to(torch.bfloat16)
        b = (torch.randn(k, n, device="cuda") / k**0.5).to(torch.bfloat16)
        if op == "ag_gemm":
            want = torch.cat(everyone(a)) @ b.double().cpu()
            got = torch.ops.trident.ag_gemm(a, b)
        else:
            want = sum(ai @ bi for ai, bi in zip(everyone(a), everyone(b))).chunk(world)[rank]
            got = torch.ops.trident.gemm_rs(a, b)
        report(f"torch.ops.trident.{op} {m}x{n}x{k} call {call}", rel(got, want), 1e-2)

# A CUDA graph of the ops, replayed 100 times on new inputs copied into its static inputs.
x = torch.randn(4096, device="cuda")
a = torch.randn(m // world, k, device="cuda").to(torch.bfloat16)
b = (torch.randn(k, n, device="cuda") / k**0.5).to(torch.bfloat16)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(2):  # each op's state made before the capture
        torch.ops.trident.all_reduce(x)
        torch.ops.trident.ag_gemm(a, b)
        torch.ops.trident.all_gather(x)
torch.cuda.current_stream().wait_stream(s)
torch.cuda.synchronize()
dist.barrier()
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y_sum = torch.ops.trident.all_reduce(x)
    y_ag = torch.ops.trident.ag_gemm(a, b)
    y_all = torch.ops.trident.all_gather(x)
worst = [0.0, 0.0, 0.0]
for i in range(100):
    x.copy_(torch.randn(4096, device="cuda"))
    a.copy_(torch.randn(m // world, k, device="cuda").to(torch.bfloat16))
    y_sum.fill_(float("nan")), y_ag.fill_(float("nan")), y_all.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    xs = everyone(x)
    worst[0] = max(worst[0], rel(y_sum, sum(xs)))
    worst[1] = max(worst[1], rel(y_ag, torch.cat(everyone(a)) @ b.double().cpu()))
    worst[2] = max(worst[2], rel(y_all, torch.stack(xs)))
report("CUDA graph x100: all_reduce", worst[0], 1e-6)
report("CUDA graph x100: ag_gemm", worst[1], 1e-2)
report("CUDA graph x100: all_gather", worst[2], 0.0)

# Symmetric tensors: on the heap, reachable by peers; a dead one's block is reused.
t = td.empty((4, 256), torch.float32)
t.fill_(rank + 1)
first = t.data_ptr()
del t
u = td.empty((4, 256), torch.float32)  # agreed free on every rank: the same block
report("symmetric tensor reused after it died everywhere", float(u.data_ptr() != first), 0.0)
v = td.empty(1000, torch.bfloat16)
report("a second symmetric tensor is another block", float(v.data_ptr() == u.data_ptr()), 0.0)

td.synchronize()
errs = tp_blocks.check()
report("tensor-parallel MLP block (torch.compile) vs PyTorch", errs["mlp"], 2e-2)
report("tensor-parallel attention block vs PyTorch", errs["attention"], 2e-2)

# Expert parallelism: dispatch, experts that scale their rows by (global id + 1), combine;
# three calls with new routings; then an FP8 dispatch, its rows dequantized against the tokens.
tokens, hidden, k, t_max = 24, 256, 3, 32
experts = 4 * world
per = experts // world
for call in range(3):
    x = torch.randn(tokens, hidden, device="cuda").to(torch.bfloat16)
    topk = torch.stack([torch.randperm(experts, device="cuda")[:k] for _ in range(tokens)])
    topk[torch.rand(tokens, k, device="cuda") < 0.2] = -1
    weights = torch.rand(tokens, k, device="cuda")
    recv, _, count, src, layout = torch.ops.trident.ep_dispatch(x, topk, experts, t_max)
    scale = (torch.arange(per, device="cuda") + rank * per + 1).to(torch.bfloat16)
    y = (recv * scale[:, None, None]).to(torch.bfloat16)
    out = torch.ops.trident.ep_combine(y, topk, weights, src, layout, experts, t_max)
    all_topk = everyone(topk)
    want_count = torch.tensor([sum(int((t == rank * per + l).sum()) for t in all_topk) for l in range(per)])
    report(f"ep_dispatch counts, call {call}", float((count.cpu() != want_count).any()), 0.0)
    t64, w64 = topk.cpu(), weights.double().cpu()
    factor = torch.where(t64 >= 0, t64 + 1, 0).double()
    yref = (x.double().cpu()[:, None, :] * factor[:, :, None]).to(torch.bfloat16).double()
    want = (yref * torch.where(t64 >= 0, w64, 0.0)[:, :, None]).sum(1)
    report(f"ep_dispatch + ep_combine {tokens}x{hidden} top-{k} of {experts}, call {call}", rel(out, want), 1e-2)
# The high-throughput form: contiguous segments per local expert (offs), the same experts.
for call in range(2):
    x = torch.randn(tokens, hidden, device="cuda").to(torch.bfloat16)
    topk = torch.stack([torch.randperm(experts, device="cuda")[:k] for _ in range(tokens)])
    topk[torch.rand(tokens, k, device="cuda") < 0.2] = -1
    weights = torch.rand(tokens, k, device="cuda")
    recv, offs, src = torch.ops.trident.ep_dispatch_ht(x, topk, weights, experts, t_max)
    ends = offs.long().cpu()
    starts = torch.cat([torch.zeros(1, dtype=torch.long), ends[:-1]])
    y = recv.clone()
    for l in range(per):
        y[starts[l] : ends[l]] = (recv[starts[l] : ends[l]].float() * (rank * per + l + 1)).to(torch.bfloat16)
    out = torch.ops.trident.ep_combine_ht(y, tokens, k, experts, t_max)
    all_topk = everyone(topk)
    want_count = torch.tensor([sum(int((t == rank * per + l).sum()) for t in all_topk) for l in range(per)])
    report(f"ep_dispatch_ht segments, call {call}", float((ends - starts != want_count).any()), 0.0)
    t64, w64 = topk.cpu(), weights.double().cpu()
    factor = torch.where(t64 >= 0, t64 + 1, 0).double()
    yref = (x.double().cpu()[:, None, :] * factor[:, :, None]).to(torch.bfloat16).double()
    want = (yref * torch.where(t64 >= 0, w64, 0.0)[:, :, None]).sum(1)
    report(f"ep_dispatch_ht + ep_combine_ht, call {call}", rel(out, want), 2e-2)

x = torch.randn(tokens, hidden, device="cuda").to(torch.bfloat16)
topk = torch.stack([torch.randperm(experts, device="cuda")[:k] for _ in range(tokens)])
recv, scales, count, src, layout = td.ep_dispatch(x, topk, experts, t_max, fp8=True)
xs, worst = everyone(x), 0.0
for l in range(per):
    for i in range(int(count[l])):
        code = int(src[l, i])
        s, pair = code // (t_max * k), code % (t_max * k)
        row = xs[s][pair // k]
        deq = (recv[l, i].float().view(-1, 128) * scales[l, i][:, None]).reshape(-1).double().cpu()
        amax = row.view(-1, 128).abs().amax(1).repeat_interleave(128)
        worst = max(worst, ((deq - row).abs() / amax.clamp_min(1e-30)).max().item())
report("ep_dispatch fp8: rows dequantized against the tokens (per-128 amax)", worst, 2.0**-4)

def swiglu(w1, xt):
    """silu(gate) * up of an expert's `w1` (gate and up rows interleaved by 128) times `xt`,
    in float64."""
    rows = [(j // 128) * 256 + j % 128 for j in range(w1.shape[0] // 2)]
    g, u = w1[rows] @ xt, w1[[r + 128 for r in rows]] @ xt
    return g / (1 + torch.exp(-g)) * u


def routed_want(topk, weights, expert_out):
    """Each token's sum over its experts (`topk`, -1 none) of `weights` times
    `expert_out(e, t)`, in float64: the MoE blocks' reference."""
    want = torch.zeros(tokens, hidden, dtype=torch.float64)
    for t in range(tokens):
        for j in range(k):
            e = int(topk[t, j])
            if e >= 0:
                want[t] += float(weights[t, j]) * expert_out(e, t)
    return want


# The expert-parallel MoE block (both exchanges): every rank's experts gathered to the host,
# the whole MoE in float64 with the block's bf16 roundings (SwiGLU output, expert output).
ffn = 128
w1 = (torch.rand(per, 2 * ffn, hidden, device="cuda") * 2 - 1).div(hidden**0.5).to(torch.bfloat16)
w2 = (torch.rand(per, hidden, ffn, device="cuda") * 2 - 1).div(ffn**0.5).to(torch.bfloat16)
w1s, w2s = everyone(w1), everyone(w2)


def ep_expert(e, xt):
    a, b = w1s[e // per][e % per], w2s[e // per][e % per]
    return (b @ swiglu(a, xt).to(torch.bfloat16).double()).to(torch.bfloat16).double()


# Two calls of each on new tokens and routes: what one call leaves in the block's buffers must
# not stand in for the next call's.
for ht in (False, True):
    for call in range(2):
        x = torch.randn(tokens, hidden, device="cuda").to(torch.bfloat16)
        topk = torch.stack([torch.randperm(experts, device="cuda")[:k] for _ in range(tokens)])
        topk[torch.rand(tokens, k, device="cuda") < 0.2] = -1
        weights = torch.rand(tokens, k, device="cuda")
        out = torch.ops.trident.ep_moe(x, topk, weights, w1, w2, experts, t_max, ht)
        want = routed_want(topk, weights, lambda e, t: ep_expert(e, x[t].double().cpu()))
        name = f"ep_moe ({'high-throughput' if ht else 'low-latency'}) {tokens}x{hidden} top-{k} of {experts}"
        report(f"{name}, call {call}", rel(out, want), 2e-2)

# The FP8 expert-parallel block: E4M3FN experts with a scale per 128 x 128 block; the
# reference quantizes the tokens and the SwiGLU output as the kernels do (f32 steps per 128
# values), the rest in float64, each expert's output rounded to bf16.
def fake_quantized(v):
    blocks = v.float().view(-1, 128)
    amax = blocks.abs().amax(1, keepdim=True)
    inv = torch.where(amax > 0, 448.0 / amax, torch.zeros_like(amax))
    q = (blocks * inv).clamp(-448, 448).to(torch.float8_e4m3fn).float()
    return (q.double() * (amax / 448.0).double()).reshape(-1)


hb, fb = hidden // 128, ffn // 128
q1 = ((torch.rand(per, 2 * ffn, hidden, device="cuda") * 2 - 1) * 448).to(torch.float8_e4m3fn)
q2 = ((torch.rand(per, hidden, ffn, device="cuda") * 2 - 1) * 448).to(torch.float8_e4m3fn)
s1 = (torch.rand(per, 2 * ffn // 128, hb, device="cuda") + 0.5) / (448 * hidden**0.5)
s2 = (torch.rand(per, hb, fb, device="cuda") + 0.5) / (448 * ffn**0.5)
full = lambda q, s: q.double() * s.double().repeat_interleave(128, 1).repeat_interleave(128, 2)
# Every rank's experts as the values they stand for (E4M3FN to float64 is exact).
e1s = [full(q, s) for q, s in zip(everyone(q1), everyone(s1))]
e2s = [full(q, s) for q, s in zip(everyone(q2), everyone(s2))]
x = torch.randn(tokens, hidden, device="cuda").to(torch.bfloat16)
topk = torch.stack([torch.randperm(experts, device="cuda")[:k] for _ in range(tokens)])
topk[torch.rand(tokens, k, device="cuda") < 0.2] = -1
weights = torch.rand(tokens, k, device="cuda")
out = torch.ops.trident.ep_moe(x, topk, weights, q1, q2, experts, t_max, False, s1, s2)


def ep_fp8_expert(e, t):
    a, b = e1s[e // per][e % per], e2s[e // per][e % per]
    return (b @ fake_quantized(swiglu(a, fake_quantized(x[t].cpu())))).to(torch.bfloat16).double()


want = routed_want(topk, weights, ep_fp8_expert)
report(f"ep_moe FP8 (low-latency) {tokens}x{hidden} top-{k} of {experts}", rel(out, want), 2e-2)

# The tensor-parallel MoE block (two calls: the buffers' halves alternate): this rank's
# 128-wide shard of every expert; the whole experts put back together on the host, the SwiGLU
# output rounded to bf16 as each shard stores it, the shards' sum rounded once.
shard, tp_experts = 128, 6
w1 = (torch.rand(tp_experts, 2 * shard, hidden, device="cuda") * 2 - 1).div(hidden**0.5).to(torch.bfloat16)
w2 = (torch.rand(tp_experts, hidden, shard, device="cuda") * 2 - 1).div((shard * world) ** 0.5).to(torch.bfloat16)
full_w1, full_w2 = torch.cat(everyone(w1), dim=1), torch.cat(everyone(w2), dim=2)


def tp_inputs():
    x = torch.randn(tokens, hidden, device="cuda").to(torch.bfloat16)
    topk = torch.stack([torch.randperm(tp_experts, device="cuda")[:k] for _ in range(tokens)])
    topk[torch.rand(tokens, k, device="cuda") < 0.2] = -1
    return x, topk, torch.rand(tokens, k, device="cuda")


def tp_want(x, topk, weights):
    return routed_want(
        topk, weights, lambda e, t: full_w2[e] @ swiglu(full_w1[e], x[t].double().cpu()).to(torch.bfloat16).double()
    )


for call in range(2):
    x, topk, weights = tp_inputs()
    out = torch.ops.trident.tp_moe(x, topk, weights, w1, w2, tp_experts, t_max)
    report(f"tp_moe {tokens}x{hidden} top-{k} of {tp_experts}, F {shard} x {world}, call {call}", rel(out, tp_want(x, topk, weights)), 2e-2)

# The FP8 tensor-parallel block: this rank's E4M3FN shards with a scale per 128 x 128 block;
# the rows quantized as the route does, each shard's SwiGLU output as its epilogue does (per
# 128 columns: the same blocks as the whole expert's), the shards' sum rounded once.
tq1 = ((torch.rand(tp_experts, 2 * shard, hidden, device="cuda") * 2 - 1) * 448).to(torch.float8_e4m3fn)
tq2 = ((torch.rand(tp_experts, hidden, shard, device="cuda") * 2 - 1) * 448).to(torch.float8_e4m3fn)
ts1 = (torch.rand(tp_experts, 2 * shard // 128, hb, device="cuda") + 0.5) / (448 * hidden**0.5)
ts2 = (torch.rand(tp_experts, hb, shard // 128, device="cuda") + 0.5) / (448 * (shard * world) ** 0.5)
fp8_w1 = torch.cat([full(q, s) for q, s in zip(everyone(tq1), everyone(ts1))], dim=1)
fp8_w2 = torch.cat([full(q, s) for q, s in zip(everyone(tq2), everyone(ts2))], dim=2)
x, topk, weights = tp_inputs()
out = torch.ops.trident.tp_moe(x, topk, weights, tq1, tq2, tp_experts, t_max, ts1, ts2)
want = routed_want(topk, weights, lambda e, t: fp8_w2[e] @ fake_quantized(swiglu(fp8_w1[e], fake_quantized(x[t].cpu()))))
report(f"tp_moe FP8 {tokens}x{hidden} top-{k} of {tp_experts}, F {shard} x {world}", rel(out, want), 2e-2)

# The tensor-parallel block in a CUDA graph (no launch of it depends on the call), replayed 20
# times on new tokens and routes copied into the static inputs.
x, topk, weights = tp_inputs()
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    torch.ops.trident.tp_moe(x, topk, weights, w1, w2, tp_experts, t_max)
torch.cuda.current_stream().wait_stream(s)
torch.cuda.synchronize()
dist.barrier()
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y_tp = torch.ops.trident.tp_moe(x, topk, weights, w1, w2, tp_experts, t_max)
worst = 0.0
for i in range(20):
    new = tp_inputs()
    x.copy_(new[0]), topk.copy_(new[1]), weights.copy_(new[2])
    y_tp.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    worst = max(worst, rel(y_tp, tp_want(x, topk, weights)))
report("CUDA graph x20: tp_moe", worst, 2e-2)

# (Last, so that the checks above draw the random inputs they always drew.)
# GEMM + AllReduce at decode-sized M (16, 48 and 5 rows; K split over ranks).
for m_ar in (16, 48, 5):
    a = torch.randn(m_ar, 256, device="cuda").to(torch.bfloat16)
    b = (torch.randn(256, 320, device="cuda") / 16).to(torch.bfloat16)
    want = sum(ai @ bi for ai, bi in zip(everyone(a), everyone(b)))
    poison((m_ar, 320), torch.bfloat16)
    report(f"torch.ops.trident.gemm_ar {m_ar}x320x{256 * world}", rel(torch.ops.trident.gemm_ar(a, b), want), 1e-2)
    # The two-shot form (GEMM-RS, then the AllGather of the sums) where M splits over the ranks.
    if m_ar % world == 0:
        poison((m_ar, 320), torch.bfloat16)
        got = torch.ops.trident.gemm_ar(a, b, "two_shot")
        report(f"torch.ops.trident.gemm_ar two_shot {m_ar}x320x{256 * world}", rel(got, want), 1e-2)
        # A second call reads the gather's other half.
        a = torch.randn(m_ar, 256, device="cuda").to(torch.bfloat16)
        want = sum(ai @ bi for ai, bi in zip(everyone(a), everyone(b)))
        poison((m_ar, 320), torch.bfloat16)
        got = torch.ops.trident.gemm_ar(a, b, "two_shot")
        report(f"torch.ops.trident.gemm_ar two_shot (second call) {m_ar}x320x{256 * world}", rel(got, want), 1e-2)


def decode_want(q, ks, vs, lens):
    """Attention of `q` [B, Nq, Hq, D] over the shards `ks`, `vs` (each [B, S, Hkv, D],
    float64 on the host) joined along the sequence, causal for the new tokens."""
    k, v = torch.cat(ks, 1), torch.cat(vs, 1)
    b, nq, hq, d = q.shape
    g = hq // k.shape[2]
    out = torch.zeros(b, nq, hq, d, dtype=torch.float64)
    for s in range(b):
        for i in range(nq):
            last = int(lens[s]) - nq + i
            if last < 0:
                continue
            kk, vv = k[s, : last + 1].repeat_interleave(g, 1), v[s, : last + 1].repeat_interleave(g, 1)
            p = torch.softmax((kk * q[s, i].double().cpu()).sum(-1) / d**0.5, 0)
            out[s, i] = (p[..., None] * vv).sum(0)
    return out


# Distributed flash decoding: the KV cache sharded along the sequence, contiguous and paged.
def check_flash_decode_dist(shard=192, page=64):
    for paged in (False, True):
        torch.manual_seed(77)  # the queries and lengths: the same on every rank
        q = torch.randn(2, 2, 8, 64, device="cuda").to(torch.bfloat16)
        lens = torch.tensor([world * shard, 3 + world * shard // 2], dtype=torch.int32, device="cuda")
        torch.manual_seed(1000 + rank)
        k, v = (torch.randn(2, shard, 2, 64, device="cuda").to(torch.bfloat16) for _ in range(2))
        want = decode_want(q, everyone(k), everyone(v), lens.cpu())
        poison(tuple(q.shape), torch.bfloat16)
        if paged:
            # The shard's pages in a pool twice its size, in shuffled order.
            order = torch.randperm(4 * shard // page, device="cuda").to(torch.int32)
            table = order[: 2 * shard // page].view(2, shard // page).contiguous()
            pool = torch.randn(4 * shard // page, page, 2, 64, device="cuda").to(torch.bfloat16)
            kp, vp = pool.clone(), pool.clone()
            kp[table.flatten().long()] = k.view(-1, page, 2, 64)
            vp[table.flatten().long()] = v.view(-1, page, 2, 64)
            got = torch.ops.trident.flash_decode_dist(q, kp, vp, lens, table)
        else:
            got = torch.ops.trident.flash_decode_dist(q, k, v, lens)
        form = "paged" if paged else "contiguous"
        report(f"torch.ops.trident.flash_decode_dist {form} 2x{world * shard}", rel(got, want), 1e-2)


check_flash_decode_dist()

# Errors are typed.
try:
    td.all_reduce(torch.zeros(10))
    failures.append("a CPU tensor was accepted")
except trident.ArgumentError as e:
    print(f"rank {rank}: PASS a host tensor is refused: {e}", flush=True)

td.destroy()
dist.destroy_process_group()
print(f"rank {rank}: {'ALL PASS' if not failures else 'FAILED: ' + ', '.join(failures)}", flush=True)
sys.exit(1 if failures else 0)
