"""The library's collectives on a CPU world of ranks through the Python API, against float64
references on fresh random inputs."""

import numpy as np
import pytest

import trident
from trident.distributed import CpuWorld


def inputs(ranks, n, dtype=np.float32):
    g = np.random.default_rng()
    return [g.uniform(-1, 1, n).astype(dtype) for _ in range(ranks)]


def routes(g, ranks, tokens, experts, k):
    """Each rank's ``[tokens, k]`` int32 experts: k distinct per token, about one entry in five
    -1 (none)."""
    topks = []
    for _ in range(ranks):
        t = np.stack([g.permutation(experts)[:k] for _ in range(tokens)]).astype(np.int32)
        t[g.uniform(size=t.shape) < 0.2] = -1
        topks.append(t)
    return topks


@pytest.mark.parametrize("race", [False, True])
def test_all_gather_on_4_ranks(race):
    xs = inputs(4, 777)
    outs = CpuWorld(4, seed=int(np.random.default_rng().integers(1 << 32)), race=race).all_gather(xs)
    want = np.concatenate(xs)
    assert len(outs) == 4
    for out in outs:
        assert out.dtype == np.float32 and np.array_equal(out, want)


@pytest.mark.parametrize("algorithm", ["one_shot", "two_shot"])
def test_all_reduce_on_3_ranks(algorithm):
    xs = inputs(3, 1000)
    outs = CpuWorld(3).all_reduce(xs, algorithm)
    want = np.sum([x.astype(np.float64) for x in xs], axis=0)
    for out in outs:
        assert np.max(np.abs(out - want)) <= 1e-6 * 3


@pytest.mark.parametrize("algorithm", ["ring", "one_shot"])
def test_reduce_scatter_on_4_ranks(algorithm):
    xs = inputs(4, 4 * 250)
    outs = CpuWorld(4).reduce_scatter(xs, algorithm)
    total = np.sum([x.astype(np.float64) for x in xs], axis=0)
    for r, out in enumerate(outs):
        assert out.shape == (250,)
        assert np.max(np.abs(out - total[r * 250 : (r + 1) * 250])) <= 1e-6 * 4


def test_bf16_travels_as_uint16_bits():
    bits = [np.arange(64, dtype=np.uint16) + 1000 * r for r in range(2)]
    # uint16 arrays are u16 elements: the gather moves them bit for bit.
    outs = CpuWorld(2).all_gather(bits)
    assert np.array_equal(outs[1], np.concatenate(bits))


def swiglu_mlp(w1, w2, x, ffn):
    """One expert in f64: ``w2 (silu(gate) * up)`` with `w1`'s gate and up rows interleaved in
    blocks of 128, the SwiGLU output rounded to float16 as the blocks store it."""
    gate_rows = [(j // 128) * 256 + j % 128 for j in range(ffn)]
    gate, up = w1[gate_rows] @ x, w1[[r + 128 for r in gate_rows]] @ x
    act = (gate / (1 + np.exp(-gate)) * up).astype(np.float16).astype(np.float64)
    return w2 @ act


def moe_inputs(g, ranks, shape):
    """Each rank's tokens (``[T, H]`` float16), routes (`routes`) and routing weights
    (``[T, k]`` float32) for a MoE block of `shape` ``(T, H, experts, k)``."""
    tokens, hidden, experts, k = shape
    xs = [g.uniform(-1, 1, (tokens, hidden)).astype(np.float16) for _ in range(ranks)]
    topks = routes(g, ranks, tokens, experts, k)
    weights = [g.uniform(0, 1, (tokens, k)).astype(np.float32) for _ in range(ranks)]
    return xs, topks, weights


def fp8_experts(g, count, rows, cols):
    """`count` FP8 matrices of ``rows x cols`` (fan-in `cols`): their E4M3FN codes, their
    float32 scales per 128 x 128 block, and the f64 values they stand for."""
    values, codes = to_e4m3(g.uniform(-448, 448, (count, rows, cols)))
    scales = (g.uniform(0.5, 2.0, (count, rows // 128, cols // 128)) * 2 / (448 * np.sqrt(cols))).astype(np.float32)
    full = np.repeat(np.repeat(scales.astype(np.float64), 128, axis=1), 128, axis=2)
    return codes, scales, values * full


def fp8_swiglu_mlp(w1, w2, x):
    """One FP8 expert in f64 (`w1` and `w2` the values its codes and scales stand for): the
    token quantized as dispatch or the route does, the SwiGLU output as the gate/up epilogue
    does, then ``w2 act`` unrounded."""
    gate_rows = [(j // 128) * 256 + j % 128 for j in range(w1.shape[0] // 2)]
    xq = quantized(x)
    gate, up = w1[gate_rows] @ xq, w1[[j + 128 for j in gate_rows]] @ xq
    return w2 @ quantized(gate / (1 + np.exp(-gate)) * up)


def routed_sum(out_of, topks, weights, xs, r):
    """Rank r's ``[T, H]`` in f64: each token's routed experts' outputs (`out_of(e, x)`) summed
    with their weights."""
    tokens, k = topks[r].shape
    want = np.zeros((tokens, xs[r].shape[1]))
    for t in range(tokens):
        for j in range(k):
            e = topks[r][t, j]
            if e >= 0:
                want[t] += weights[r][t, j] * out_of(e, xs[r][t].astype(np.float64))
    return want


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_tp_moe_block(ranks):
    # The tensor-parallel MoE block against numpy in f64: each expert's full SwiGLU MLP (its
    # shards' columns put back together), the SwiGLU output rounded to float16 as each shard
    # stores it; the shards' down products summed unrounded, the sum rounded once.
    g = np.random.default_rng()
    tokens, hidden, k, experts, shard = 4, 32, 2, 3, 128
    ffn = shard * ranks
    xs, topks, weights = moe_inputs(g, ranks, (tokens, hidden, experts, k))
    # Whole experts (gate/up interleaved by 128 over F), then each rank's columns of them.
    w1 = (g.uniform(-1, 1, (experts, 2 * ffn, hidden)) * 2 / np.sqrt(hidden)).astype(np.float16)
    w2 = (g.uniform(-1, 1, (experts, hidden, ffn)) * 2 / np.sqrt(ffn)).astype(np.float16)
    w1s = [w1[:, 2 * shard * r : 2 * shard * (r + 1)] for r in range(ranks)]
    w2s = [w2[:, :, shard * r : shard * (r + 1)] for r in range(ranks)]
    world = CpuWorld(ranks, seed=int(g.integers(1 << 32)))
    outs = world.tp_moe(xs, topks, weights, w1s, w2s, experts)

    def expert(e, x):
        return swiglu_mlp(w1[e].astype(np.float64), w2[e].astype(np.float64), x, ffn)

    for r, out in enumerate(outs):
        want = routed_sum(expert, topks, weights, xs, r)
        err = np.linalg.norm(out.astype(np.float64) - want) / max(np.linalg.norm(want), 1e-30)
        assert out.shape == (tokens, hidden) and err <= 5e-3, (r, err)
    with pytest.raises(trident.ArgumentError, match="one w1 and one w2 shard each"):
        world.tp_moe(xs, topks, weights, w1s[:1] * (ranks + 1), w2s, experts)


def test_world_errors():
    with pytest.raises(trident.ArgumentError, match="1..=64"):
        CpuWorld(0)
    with pytest.raises(trident.ArgumentError, match="3 inputs for a world of 4"):
        CpuWorld(4).all_gather(inputs(3, 10))
    with pytest.raises(trident.ArgumentError, match="rank 1's input"):
        CpuWorld(2).all_gather([np.zeros(10, np.float32), np.zeros(11, np.float32)])
    with pytest.raises(trident.ArgumentError, match="do not split into 3 chunks"):
        CpuWorld(3).reduce_scatter(inputs(3, 10))
    with pytest.raises(trident.ArgumentError, match="algorithm `three_shot`"):
        CpuWorld(2).all_reduce(inputs(2, 10), "three_shot")


@pytest.mark.parametrize("ranks,high_throughput", [(3, False), (4, False), (3, True), (4, True)])
def test_ep_round_trip(ranks, high_throughput):
    # Every token to k distinct experts (about one entry in five empty); the identity experts
    # send each row back, so a token's output is its row times its weights' sum.
    g = np.random.default_rng()
    tokens, hidden, k, experts = 5, 48, 3, 2 * ranks
    xs = inputs(ranks, tokens * hidden)
    xs = [x.reshape(tokens, hidden) for x in xs]
    topks = routes(g, ranks, tokens, experts, k)
    weights = [g.uniform(0, 1, (tokens, k)).astype(np.float32) for _ in range(ranks)]
    world = CpuWorld(ranks, seed=int(g.integers(1 << 32)))
    outs = world.ep_round_trip(xs, topks, weights, experts, high_throughput=high_throughput)
    per_rank = experts // ranks
    for r, (counts, out) in enumerate(outs):
        routed = np.concatenate([t.reshape(-1) for t in topks])
        want_counts = [int(np.sum(routed == r * per_rank + l)) for l in range(per_rank)]
        assert list(counts) == want_counts
        w = np.where(topks[r] >= 0, weights[r], 0).astype(np.float64).sum(axis=1)
        want = xs[r].astype(np.float64) * w[:, None]
        assert out.shape == (tokens, hidden) and np.max(np.abs(out - want)) <= 1e-5 * max(1.0, np.max(np.abs(want)))


def e4m3_table():
    """The value of every E4M3FN code (OCP: no infinities, NaN S.1111.111)."""
    v = np.zeros(256)
    for c in range(256):
        sign, e, m = (-1.0 if c & 0x80 else 1.0), (c >> 3) & 0xF, c & 7
        v[c] = np.nan if (e, m) == (15, 7) else sign * (m / 8 * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return v


E4M3 = e4m3_table()
E4M3_POSITIVE = E4M3[:127]  # codes 0 .. 126: 0 up to 448


def to_e4m3(x):
    """`x` (f64) rounded to E4M3FN as `docs/SEMANTICS.md` says: nearest, ties to the even code,
    saturating at 448. Returns the values and their codes."""
    a = np.minimum(np.abs(x), 448.0)
    i = np.clip(np.searchsorted(E4M3_POSITIVE, a), 1, 126)
    lo, hi = E4M3_POSITIVE[i - 1], E4M3_POSITIVE[i]
    up = (a - lo > hi - a) | ((a - lo == hi - a) & (i % 2 == 0))
    code = np.where(up, i, i - 1)
    return np.sign(x) * E4M3_POSITIVE[code], (code | np.where(x < 0, 0x80, 0)).astype(np.uint8)


def quantized(row):
    """`row` as the FP8 kernels quantize it (f32 arithmetic per 128 values: amax, 448 / amax,
    E4M3FN of each value times it, scale amax / 448), then dequantized in f64."""
    out = np.empty(len(row))
    for b in range(0, len(row), 128):
        blk = np.asarray(row[b : b + 128], dtype=np.float32)
        amax = np.max(np.abs(blk))
        inv = np.float32(448.0) / amax if amax > 0 else np.float32(0.0)
        q, _ = to_e4m3((blk * inv).astype(np.float64))
        out[b : b + 128] = q * float(amax / np.float32(448.0))
    return out


def test_e4m3_rounding_of_the_reference():
    # The test's own rounding against known codes: ties to even, saturation, subnormals.
    cases = {0.0: 0, 448.0: 0x7E, 1000.0: 0x7E, 464.0: 0x7E, 2.0**-9: 1, 1.5 * 2.0**-9: 2, -1.0: 0xB8, 1.0625: 0x38}
    for x, code in cases.items():
        assert to_e4m3(np.array([x]))[1][0] == code, (x, code)


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("high_throughput", [False, True])
def test_ep_moe_block_fp8(ranks, high_throughput):
    # The FP8 block (E4M3FN experts with 128 x 128 block scales) against numpy in f64 with
    # the kernels' quantization emulated: the tokens' by dispatch, the SwiGLU output's by the
    # gate/up epilogue; each expert's output rounded to float16 where the block stores it.
    g = np.random.default_rng()
    tokens, hidden, k, per_rank, ffn = 4, 128, 2, 2, 128
    experts = per_rank * ranks
    xs, topks, weights = moe_inputs(g, ranks, (tokens, hidden, experts, k))

    w1 = [fp8_experts(g, per_rank, 2 * ffn, hidden) for _ in range(ranks)]
    w2 = [fp8_experts(g, per_rank, hidden, ffn) for _ in range(ranks)]
    world = CpuWorld(ranks, seed=int(g.integers(1 << 32)))
    outs = world.ep_moe(
        xs, topks, weights, [w[0] for w in w1], [w[0] for w in w2], experts, high_throughput=high_throughput,
        w1_scales=[w[1] for w in w1], w2_scales=[w[1] for w in w2],
    )

    def expert(e, x):
        r, l = e // per_rank, e % per_rank
        return fp8_swiglu_mlp(w1[r][2][l], w2[r][2][l], x).astype(np.float16).astype(np.float64)

    for r, out in enumerate(outs):
        want = routed_sum(expert, topks, weights, xs, r)
        err = np.linalg.norm(out.astype(np.float64) - want) / max(np.linalg.norm(want), 1e-30)
        assert out.shape == (tokens, hidden) and err <= 5e-3, (r, err)


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_tp_moe_block_fp8(ranks):
    # The FP8 tensor-parallel block (each rank's shards E4M3FN with 128 x 128 block scales)
    # against numpy in f64 with the kernels' quantization emulated: the gathered rows' by the
    # route, each shard's SwiGLU output's by its gate/up epilogue (per 128 columns, so the
    # same as the whole expert's); the shards' down products summed unrounded.
    g = np.random.default_rng()
    tokens, hidden, k, experts, shard = 4, 128, 2, 3, 128
    ffn = shard * ranks
    xs, topks, weights = moe_inputs(g, ranks, (tokens, hidden, experts, k))

    (c1, s1, w1), (c2, s2, w2) = fp8_experts(g, experts, 2 * ffn, hidden), fp8_experts(g, experts, hidden, ffn)
    rows = lambda a, r, n: a[:, n * r : n * (r + 1)]
    cols = lambda a, r, n: a[:, :, n * r : n * (r + 1)]
    world = CpuWorld(ranks, seed=int(g.integers(1 << 32)))
    outs = world.tp_moe(
        xs, topks, weights, [rows(c1, r, 2 * shard) for r in range(ranks)], [cols(c2, r, shard) for r in range(ranks)],
        experts, w1_scales=[rows(s1, r, 2 * shard // 128) for r in range(ranks)],
        w2_scales=[cols(s2, r, shard // 128) for r in range(ranks)],
    )

    def expert(e, x):
        return fp8_swiglu_mlp(w1[e], w2[e], x)

    for r, out in enumerate(outs):
        want = routed_sum(expert, topks, weights, xs, r)
        err = np.linalg.norm(out.astype(np.float64) - want) / max(np.linalg.norm(want), 1e-30)
        assert out.shape == (tokens, hidden) and err <= 5e-3, (r, err)
    with pytest.raises(trident.ArgumentError, match="go together"):
        world.tp_moe(xs, topks, weights, [c1] * ranks, [c2] * ranks, experts, w1_scales=[s1] * ranks)


@pytest.mark.parametrize("ranks", [1, 2, 3])
@pytest.mark.parametrize("high_throughput", [False, True])
def test_ep_moe_block(ranks, high_throughput):
    # The expert-parallel MoE block against numpy in f64: per token, the weighted sum over its
    # experts of W2 (silu(gate) * up), rounded to float16 where the block stores it.
    g = np.random.default_rng()
    tokens, hidden, k, per_rank, ffn = 4, 32, 2, 2, 128
    experts = per_rank * ranks
    xs, topks, weights = moe_inputs(g, ranks, (tokens, hidden, experts, k))
    w1s = [(g.uniform(-1, 1, (per_rank, 2 * ffn, hidden)) * 2 / np.sqrt(hidden)).astype(np.float16) for _ in range(ranks)]
    w2s = [(g.uniform(-1, 1, (per_rank, hidden, ffn)) * 2 / np.sqrt(ffn)).astype(np.float16) for _ in range(ranks)]
    world = CpuWorld(ranks, seed=int(g.integers(1 << 32)))
    outs = world.ep_moe(xs, topks, weights, w1s, w2s, experts, high_throughput=high_throughput)

    def expert(e, x):
        w1 = w1s[e // per_rank][e % per_rank].astype(np.float64)
        w2 = w2s[e // per_rank][e % per_rank].astype(np.float64)
        # The expert-parallel block stores each expert's output in float16 too.
        return swiglu_mlp(w1, w2, x, ffn).astype(np.float16).astype(np.float64)

    for r, out in enumerate(outs):
        want = routed_sum(expert, topks, weights, xs, r)
        err = np.linalg.norm(out.astype(np.float64) - want) / max(np.linalg.norm(want), 1e-30)
        assert out.shape == (tokens, hidden) and err <= 5e-3, (r, err)
