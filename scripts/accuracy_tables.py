#!/usr/bin/env python3
"""Prints the tables of docs/ACCURACY.md from the recorded runs.

    python3 scripts/accuracy_tables.py results/math/host-exhaustive.json \
        results/h200/math-nvidia.json results/h200/ops-nvidia.json [results/ops-cpu*.json ..]

The first file is `trident math --stride 1 --fast` on the host (every f32 input), the second
`trident math --backend nvidia --fast` on the GPU, the rest `trident ops --json` records of
backends (largest ulp per op and element type in the differential test).
"""
import json
import sys


# The functions fast math changes (the others keep their accurate definitions).
FAST = {"exp", "exp2", "log", "log2", "sin", "cos", "rsqrt", "sigmoid", "tanh"}


# The ops whose accuracy is a bound rather than exactness.
ELEMENTARY = FAST | {"expm1", "log1p", "erf", "pow"}


def load(p):
    with open(p) as f:
        return json.load(f)


def main(host_path, gpu_path, *ops_paths):
    host = load(host_path)
    gpu = {(r["op"], r["fast"]): r for r in load(gpu_path)}
    print("### f32, every input (host) and the GPU's bits\n")
    print("| function | max ulp | at x | not correctly rounded | > 1 ulp | H200 vs host (2^26 inputs) |")
    print("|---|---|---|---|---|---|")
    for r in host:
        if r["fast"]:
            continue
        g = gpu.get((r["op"], False))
        same = "-" if g is None else ("bit-identical" if g["mismatches"] == 0 else f'{g["mismatches"]} differ')
        share = 100.0 * r["not_correctly_rounded"] / r["inputs"]
        print(f'| {r["op"]} | {r["max_ulp"]} | {r["worst_input"]:.8g} | {r["not_correctly_rounded"]} ({share:.2f}%) '
              f'| {r["over_one_ulp"]} | {same} |')
    print("\n### Fast math on the H200, on the fast-math domain\n")
    print("| function | max abs error | max rel error | max ulp (all inputs) |")
    print("|---|---|---|---|")
    for (op, fast), g in sorted(gpu.items()):
        if fast and op in FAST:
            print(f'| {op} | {g.get("domain_max_abs") or 0:.2e} | {g.get("domain_max_rel") or 0:.2e} | {g["max_ulp"]} |')
    print("\n### Largest ulp in the differential test, by backend, op and type\n")
    rows = {}
    backends = []
    for p in ops_paths:
        for o in load(p):
            base = o["op"].removesuffix(".fast")
            if o["status"] != "Pass" or (base not in ELEMENTARY and o["max_ulp"] == 0):
                continue
            b = o["backend"] + ("/" + o["target"] if o["backend"] == "cpu-simt" else "")
            if b not in backends:
                backends.append(b)
            rows.setdefault((o["op"], o["dtype"]), {})[b] = o["max_ulp"]
    print("| op | dtype | " + " | ".join(backends) + " |")
    print("|---|---|" + "---|" * len(backends))
    for (op, d), cells in sorted(rows.items()):
        print(f"| {op} | {d} | " + " | ".join(str(cells.get(b, "-")) for b in backends) + " |")


if __name__ == "__main__":
    main(*sys.argv[1:])
