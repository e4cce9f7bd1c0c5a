"""Tensor-parallel blocks of a LLaMA-style decoder layer on trident's overlap kernels, beside
the same blocks written with PyTorch collectives (the reference the check compares with).

Sequence-parallel layout, as Megatron-LM and Triton-distributed use it: each rank holds
``T / W`` tokens of the activations between blocks. A block gathers them while multiplying
(AG-GEMM, column-parallel weight shard), works on its shard of the heads or of the MLP's
hidden units, and multiplies by the row-parallel shard while reducing and scattering the
result back to token shards (GEMM-RS). Weights are ``[in, out]`` (the layout the library's
GEMM reads as B).

    torchrun --nproc-per-node 2 python/examples/tp_blocks.py     # checks both blocks
"""

import math
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

import trident.distributed as td


def mlp_trident(x_shard, w_gate_up, w_down):
    """SwiGLU MLP: ``[T/W, H]`` tokens -> ``[T/W, H]``; `w_gate_up` is this rank's ``[H, 2 I/W]``
    (gate columns, then up columns), `w_down` its ``[I/W, H]``."""
    h = torch.ops.trident.ag_gemm(x_shard, w_gate_up)
    gate, up = h.chunk(2, dim=-1)
    return torch.ops.trident.gemm_rs((F.silu(gate) * up).contiguous(), w_down)


def attention_trident(x_shard, w_qkv, w_o, heads, head_dim):
    """Causal self-attention of the rank's ``heads`` heads: QKV projection by AG-GEMM
    (``w_qkv``: ``[H, 3 heads head_dim]``), SDPA, the output projection by GEMM-RS (``w_o``:
    ``[heads head_dim, H]``)."""
    qkv = torch.ops.trident.ag_gemm(x_shard, w_qkv)
    t = qkv.shape[0]
    q, k, v = qkv.view(t, 3, heads, head_dim).permute(1, 2, 0, 3)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return torch.ops.trident.gemm_rs(o.permute(1, 0, 2).reshape(t, heads * head_dim).contiguous(), w_o)


# ---- the same blocks with PyTorch collectives (gloo moves through the host) ----


def _all_gather_rows(x, group=None):
    w = dist.get_world_size(group)
    if dist.get_backend(group) == "nccl":
        out = x.new_empty((x.shape[0] * w, *x.shape[1:]))
        dist.all_gather_into_tensor(out, x, group=group)
        return out
    parts = [torch.empty_like(x, device="cpu") for _ in range(w)]
    dist.all_gather(parts, x.cpu(), group=group)
    return torch.cat(parts).to(x.device)


def _reduce_scatter_rows(x, group=None):
    w, r = dist.get_world_size(group), dist.get_rank(group)
    if dist.get_backend(group) == "nccl":
        out = x.new_empty((x.shape[0] // w, *x.shape[1:]))
        dist.reduce_scatter_tensor(out, x, group=group)
        return out
    total = x.float().cpu()
    dist.all_reduce(total, group=group)
    return total.chunk(w)[r].to(x.device, x.dtype)


def mlp_torch(x_shard, w_gate_up, w_down):
    h = _all_gather_rows(x_shard) @ w_gate_up
    gate, up = h.chunk(2, dim=-1)
    return _reduce_scatter_rows((F.silu(gate) * up) @ w_down)


def attention_torch(x_shard, w_qkv, w_o, heads, head_dim):
    qkv = _all_gather_rows(x_shard) @ w_qkv
    t = qkv.shape[0]
    q, k, v = qkv.view(t, 3, heads, head_dim).permute(1, 2, 0, 3)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return _reduce_scatter_rows(o.permute(1, 0, 2).reshape(t, heads * head_dim) @ w_o)


def weights(hidden, inter, heads, head_dim, world, seed=0):
    """This rank's shards of random weights (the same full weights on every rank)."""
    g = torch.Generator().manual_seed(seed)
    r = dist.get_rank()

    def rand(*shape):
        return (torch.randn(*shape, generator=g) / math.sqrt(shape[0])).to(torch.bfloat16)

    gate, up, down = rand(hidden, inter), rand(hidden, inter), rand(inter, hidden)
    qkv, o = rand(hidden, 3 * heads * world * head_dim), rand(heads * world * head_dim, hidden)
    i = inter // world
    shard = {
        "w_gate_up": torch.cat([gate[:, r * i : (r + 1) * i], up[:, r * i : (r + 1) * i]], dim=1),
        "w_down": down[r * i : (r + 1) * i],
        # Q, K and V columns of this rank's heads.
        "w_qkv": torch.cat(
            [qkv[:, p * heads * world * head_dim :][:, r * heads * head_dim : (r + 1) * heads * head_dim] for p in range(3)],
            dim=1,
        ),
        "w_o": o[r * heads * head_dim : (r + 1) * heads * head_dim],
    }
    return {k: v.cuda().contiguous() for k, v in shard.items()}


def check(tokens=512, hidden=512, inter=1536, heads_total=8, head_dim=64, compile_mlp=True):
    """Both blocks against the PyTorch versions on fresh random tokens; returns the errors."""
    w, r = dist.get_world_size(), dist.get_rank()
    heads = heads_total // w
    p = weights(hidden, inter, heads, head_dim, w)
    x = torch.randn(tokens // w, hidden, device="cuda").to(torch.bfloat16)
    out = {}
    mlp = torch.compile(mlp_trident) if compile_mlp else mlp_trident
    for name, mine, ref in [
        ("mlp", lambda: mlp(x, p["w_gate_up"], p["w_down"]), lambda: mlp_torch(x, p["w_gate_up"], p["w_down"])),
        (
            "attention",
            lambda: attention_trident(x, p["w_qkv"], p["w_o"], heads, head_dim),
            lambda: attention_torch(x, p["w_qkv"], p["w_o"], heads, head_dim),
        ),
    ]:
        got, want = mine(), ref()
        torch.cuda.synchronize()
        err = (got.float() - want.float()).abs().max().item() / max(want.float().abs().max().item(), 1e-6)
        out[name] = err
        print(f"rank {r}: {name} block: max error {err:.2e} of the largest output", flush=True)
    return out


if __name__ == "__main__":
    dist.init_process_group("gloo" if os.environ.get("TRIDENT_GLOO") or torch.cuda.device_count() < int(os.environ["WORLD_SIZE"]) else "nccl")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    td.init()
    errs = check()
    td.destroy()
    dist.destroy_process_group()
    assert max(errs.values()) <= 2e-2, errs
