"""Baseline timings for `trident-bench`, measured in the same run on the same GPU.

Reads the cases (`trident-bench --cases`, one per line: name dtype dims...) and times the vendor
path for each with `triton.testing.do_bench` (median ms): cuBLAS through `torch.matmul` for
GEMM, PyTorch's kernels for softmax and elementwise add. Writes {"case line": ms} as JSON.
Baselines only: nothing here is part of trident.
"""

import json
import sys

import torch
from triton.testing import do_bench

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def main(cases_path: str, out_path: str) -> None:
    results = {}
    for line in open(cases_path):
        line = line.strip()
        if not line:
            continue
        name, dtype, *dims = line.split()
        dims = [int(d) for d in dims]
        dt = DTYPES[dtype]
        dev = "cuda"
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
        else:
            continue
        results[line] = ms
        print(f"baseline {line}: {ms:.3f} ms", flush=True)
    json.dump(results, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
