"""The vendor pipeline for `trident bench --world W`, measured in the same run on the same GPUs.

Run under torchrun, one process per GPU:

    torchrun --nproc-per-node W bench/baseline_dist.py CASES_FILE OUT_JSON

(`trident bench --world W --baseline-cmd "torchrun --nproc-per-node W bench/baseline_dist.py"`
appends the two paths). Each case line is `name dtype dims... wW` as `trident bench --world W
--cases` prints it. For every case it times, with NCCL through `torch.distributed` and cuBLAS
through `torch.matmul`:

* `ag_gemm M N K`: all_gather of A's row shards (M/W x K each), then A_full @ B_r (K x N/W);
  also the matmul alone (`cublas <case>`) and the all_gather alone (`nccl <case>`);
* `gemm_rs M N K`: A_r (M x K/W) @ B_r (K/W x N), then reduce_scatter of the M x N partial
  products (each rank keeps M/W rows); also the matmul and the reduce_scatter alone;
* `gemm_ar M N K`: A_r (M x K/W) @ B_r (K/W x N), then all_reduce of the M x N partial
  products (every rank keeps all of it); also the matmul and the all_reduce alone;
* `flash_decode_dist B Hq Hkv D L`: one new token per sequence against the rank's L/W keys
  (attention with its log-sum-exp), all_gather of the f32 partials and log-sum-exps, their
  combine; also the shard's attention (`cublas <case>`) and the all_gather alone (`nccl <case>`);
* `allreduce N`: all_reduce (sum) of N elements;
* `reduce_scatter C`: reduce_scatter_tensor (sum) of W x C elements per rank, C kept;
* `allgather C`: all_gather_into_tensor of C elements per rank.
* `ep_all_to_all T H E k`: expert parallelism as PyTorch runs it without a special library:
  each of T tokens to its k experts (uniform, distinct), rows sorted by destination rank, the
  counts exchanged (all_to_all_single, then read on the host), the rows sent
  (all_to_all_single with those splits), sent back the same way (identity experts) and summed
  with the routing weights in f32; also the two row all-to-alls alone (`nccl <case>`).
* `moe_block T H E k F`: the expert-parallel MoE block as PyTorch runs it: the rows exchanged
  as `ep_all_to_all` does (with their experts), sorted by local expert, `torch._grouped_mm`
  gate/up (B [E_local, 2F, H] as its transpose), `silu(gate) * up`, `torch._grouped_mm` down,
  unsorted, sent home and summed with the routing weights in f32 (at one rank no exchange).
  Also the tensor-parallel block as Megatron-style MoE tensor parallelism runs it (key
  `moe-tp/block <case>`, the pipeline of trident's variant of that name): every rank's tokens,
  top-k and weights all-gathered, each rank's shard of every expert (F / W of the intermediate
  size) run on all of them as above, the weighted sum of its partial outputs in f32, rounded,
  and reduce-scattered home.

Timing protocol, the one `trident_conformance::dist_bench` uses for trident: every repetition
clears L2 (a 256 MB write, as `triton.testing.do_bench` does), synchronizes, meets the other
ranks at an NCCL barrier and synchronizes again, then reads the host clock, runs the operation,
synchronizes and reads the clock; a repetition's figure is the slowest rank's, the case's the
median over repetitions. Rank 0 writes {"case line": ms, "cublas <line>": ms, "nccl <line>": ms}.
NVLink multicast stays off (NCCL_NVLS_ENABLE=0). Baselines only: nothing here is part of trident.
"""

import json
import os
import sys
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch
import torch.distributed as dist

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
REPS = int(os.environ.get("TRIDENT_BASELINE_REPS", "20"))


def timed(fn, flush, device):
    """Median over repetitions of the slowest rank's host-clock time of `fn` (ms)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(REPS):
        flush.zero_()
        torch.cuda.synchronize()
        dist.barrier(device_ids=[device.index])
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ms.append((time.perf_counter() - t) * 1e3)
    slowest = torch.tensor(ms, device=device, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.median().item()


def send_rows(dest, world, *rows_of):
    """Pairs sorted by destination rank (`dest`, one per pair) and sent there with
    all_to_all_single: each of `rows_of` maps the stable order to the rows it sends. Returns the
    order, the send and receive splits, and what each sent tensor brought here."""
    order = torch.argsort(dest, stable=True)
    counts = torch.bincount(dest, minlength=world)
    got = torch.empty_like(counts)
    dist.all_to_all_single(got, counts)
    sc, rc = counts.tolist(), got.tolist()
    received = []
    for take in rows_of:
        rows = take(order)
        out = torch.empty((sum(rc), *rows.shape[1:]), device=rows.device, dtype=rows.dtype)
        dist.all_to_all_single(out, rows, rc, sc)
        received.append(out)
    return order, sc, rc, received


def rows_home(rows, order, sc, rc):
    """`rows` sent back the way `send_rows` brought them, in the pairs' original order."""
    home = torch.empty((sum(sc), *rows.shape[1:]), device=rows.device, dtype=rows.dtype)
    dist.all_to_all_single(home, rows, sc, rc)
    y = torch.empty_like(home)
    y[order] = home
    return y


def main(cases_path, out_path):
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    flush = torch.empty(256 << 20, dtype=torch.int8, device=device)
    results = {}
    for line in open(cases_path):
        line = line.strip()
        if not line:
            continue
        name, dtype, *rest = line.split()
        dims, w = [int(d) for d in rest[:-1]], int(rest[-1].lstrip("w"))
        if w != world:
            if rank == 0:
                print(f"baseline {line}: skipped (a world of {w}, this one has {world})", flush=True)
            continue
        dt = DTYPES[dtype]
        rand = lambda *shape: torch.rand(*shape, device=device, dtype=dt) * 2 - 1
        if name == "ag_gemm":
            m, n, k = dims
            shard, b = rand(m // w, k), rand(k, n // w)
            a_full = torch.empty(m, k, device=device, dtype=dt)

            def gather():
                dist.all_gather_into_tensor(a_full, shard)

            gemm = lambda: torch.matmul(a_full, b)
            parts = {"nccl": gather, "cublas": gemm}
            pipeline = lambda: (gather(), gemm())
        elif name == "gemm_rs":
            m, n, k = dims
            a, b = rand(m, k // w), rand(k // w, n)
            c = torch.empty(m, n, device=device, dtype=dt)
            out = torch.empty(m // w, n, device=device, dtype=dt)
            gemm = lambda: torch.matmul(a, b, out=c)

            def scatter():
                dist.reduce_scatter_tensor(out, c)

            parts = {"cublas": gemm, "nccl": scatter}
            pipeline = lambda: (gemm(), scatter())
        elif name == "gemm_ar":
            m, n, k = dims
            a, b = rand(m, k // w), rand(k // w, n)
            c = torch.empty(m, n, device=device, dtype=dt)
            gemm = lambda: torch.matmul(a, b, out=c)
            reduce = lambda: dist.all_reduce(c)
            parts = {"cublas": gemm, "nccl": reduce}
            pipeline = lambda: (gemm(), reduce())
        elif name == "flash_decode_dist":
            b, hq, hkv, d, length = dims
            g = hq // hkv
            # One new token per sequence sees every key: its G query heads of a KV head are G
            # query rows against that head, so the attention with its log-sum-exp (FlashAttention
            # through SDPA's own entry point, the math path where that is missing) runs on the
            # shard without repeating K and V.
            q = rand(b, hkv, g, d)
            k, v = rand(b, hkv, length // w, d), rand(b, hkv, length // w, d)
            mine = torch.empty(b * hkv * g * (d + 1), device=device, dtype=torch.float32)
            parts_all = torch.empty(w, b * hkv * g * (d + 1), device=device, dtype=torch.float32)

            def attend():
                try:
                    o, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v)[:2]
                except RuntimeError:
                    s = (q.float() @ k.float().transpose(-1, -2)) / d**0.5
                    lse = torch.logsumexp(s, -1)
                    o = torch.softmax(s, -1) @ v.float()
                mine[: b * hkv * g * d] = o.float().flatten()
                mine[b * hkv * g * d :] = lse.float().flatten()

            def gather():
                dist.all_gather_into_tensor(parts_all, mine)

            def combine():
                o = parts_all[:, : b * hkv * g * d].view(w, b * hkv * g, d)
                lse = parts_all[:, b * hkv * g * d :]
                weight = torch.softmax(lse, 0)
                return (o * weight[..., None]).sum(0).to(dt)

            parts = {"cublas": attend, "nccl": gather}
            pipeline = lambda: (attend(), gather(), combine())
        elif name == "allreduce":
            x = rand(dims[0])
            parts, pipeline = {}, lambda: dist.all_reduce(x)
        elif name == "reduce_scatter":
            x = rand(dims[0] * w)
            out = torch.empty(dims[0], device=device, dtype=dt)
            parts, pipeline = {}, lambda: dist.reduce_scatter_tensor(out, x)
        elif name == "allgather":
            x = rand(dims[0])
            out = torch.empty(dims[0] * w, device=device, dtype=dt)
            parts, pipeline = {}, lambda: dist.all_gather_into_tensor(out, x)
        elif name == "ep_all_to_all":
            t, h, e, k = dims
            x = rand(t, h)
            topk = torch.stack([torch.randperm(e, device=device)[:k] for _ in range(t)])
            weights = torch.rand(t, k, device=device)
            dest = (topk.flatten() // (e // w)).to(torch.int64)
            # The splits and buffers of the row all-to-alls timed alone.
            order, sc, rc, (recv,) = send_rows(dest, w, lambda o: x[o // k])
            send = x[order // k]
            back = torch.empty_like(send)

            def rows_out_and_back():
                dist.all_to_all_single(recv, send, rc, sc)
                dist.all_to_all_single(back, recv, sc, rc)

            def ep_pipeline():
                order, sc, rc, (received,) = send_rows(dest, w, lambda o: x[o // k])
                y = rows_home(received, order, sc, rc)
                return (y.view(t, k, h).float() * weights[..., None]).sum(1).to(dt)

            parts, pipeline = {"nccl": rows_out_and_back}, ep_pipeline
        elif name == "moe_block":
            t, h, e, k, f = dims
            el = e // w
            x = rand(t, h)
            topk = torch.stack([torch.randperm(e, device=device)[:k] for _ in range(t)])
            weights = torch.rand(t, k, device=device)
            w1 = rand(el, 2 * f, h) / h**0.5
            w2 = rand(el, h, f) / f**0.5
            expert = topk.flatten()
            dest = (expert // el).to(torch.int64)

            def experts(rows, local, w1=w1, w2=w2, f=f, n=el):
                # Rows sorted by local expert, the two grouped GEMMs with SwiGLU between, unsorted.
                order = torch.argsort(local, stable=True)
                offs = torch.bincount(local, minlength=n).cumsum(0).to(torch.int32)
                gu = torch._grouped_mm(rows[order], w1.transpose(-2, -1), offs=offs)
                act = torch.nn.functional.silu(gu[:, :f]) * gu[:, f:]
                y = torch._grouped_mm(act, w2.transpose(-2, -1), offs=offs)
                out = torch.empty_like(y)
                out[order] = y
                return out

            def moe_pipeline():
                if w == 1:
                    y = experts(x[torch.arange(t * k, device=device) // k], expert)
                else:
                    order, sc, rc, (received, ids) = send_rows(dest, w, lambda o: x[o // k], lambda o: expert[o])
                    y = rows_home(experts(received, ids % el), order, sc, rc)
                return (y.view(t, k, h).float() * weights[..., None]).sum(1).to(dt)

            parts, pipeline = {}, moe_pipeline
            if f % w == 0:
                # Tensor parallelism: this rank's shard of every one of the e experts.
                fl = f // w
                tp_w1, tp_w2 = rand(e, 2 * fl, h) / h**0.5, rand(e, h, fl) / f**0.5
                xs = torch.empty(w * t, h, device=device, dtype=dt)
                tks = torch.empty(w * t, k, device=device, dtype=topk.dtype)
                wts = torch.empty(w * t, k, device=device, dtype=weights.dtype)
                home = torch.empty(t, h, device=device, dtype=dt)
                gathered_rows = torch.arange(w * t * k, device=device) // k

                def tp_pipeline():
                    dist.all_gather_into_tensor(xs, x)
                    dist.all_gather_into_tensor(tks, topk)
                    dist.all_gather_into_tensor(wts, weights)
                    y = experts(xs[gathered_rows], tks.flatten(), tp_w1, tp_w2, fl, e)
                    partial = (y.view(w * t, k, h).float() * wts[..., None]).sum(1).to(dt)
                    dist.reduce_scatter_tensor(home, partial)
                    return home

                parts = {"moe-tp/block": tp_pipeline}
        else:
            if rank == 0:
                print(f"baseline {line}: skipped (no vendor pipeline for {name})", flush=True)
            continue
        results[line] = timed(pipeline, flush, device)
        for part, fn in parts.items():
            results[f"{part} {line}"] = timed(fn, flush, device)
        if rank == 0:
            extra = "".join(f", {p} {results[f'{p} {line}']:.3f} ms" for p in parts)
            print(f"baseline {line}: {results[line]:.3f} ms{extra}", flush=True)
    if rank == 0:
        json.dump(results, open(out_path, "w"), indent=1)
    dist.barrier(device_ids=[device.index])
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
