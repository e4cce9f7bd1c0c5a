"""Launch overhead from Python: `kernel[grid](...)` of a tiny kernel (a 256-element GELU, one
program) through trident and through Triton (`@triton.jit` of the same computation), measured
in the same run.

What is timed is the host: a batch of launches back to back (few enough that the GPU's queue
never fills, so the host never waits for the device), then one synchronize outside the timed
region; the figure is the median over batches of the time per launch. The kernels themselves
run in a few microseconds each, so a host that launches faster than that stays ahead.

    python python/bench/launch_overhead.py [--out report.json]
"""

import argparse
import json
import pathlib
import statistics
import time

import torch
import triton
import triton.language as tl

import trident

ROOT = pathlib.Path(__file__).resolve().parents[2]


@triton.jit
def gelu_triton(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = x * (1 + tl.erf(x * 0.7071067811865476)) * 0.5
    tl.store(out_ptr + offs, y, mask=mask)


def per_launch_us(launch, batches=50, batch=200):
    """The median over `batches` of the host time per launch in a batch of `batch` launches."""
    for _ in range(3 * batch):
        launch()
    torch.cuda.synchronize()
    times = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(batch):
            launch()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        times.append((t1 - t0) / batch * 1e6)
    return statistics.median(times), min(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=pathlib.Path)
    args = ap.parse_args()
    n = 256
    x = torch.empty(n, device="cuda").uniform_(-4, 4)
    out_t = torch.full((n,), float("nan"), device="cuda")
    out_r = torch.full((n,), float("nan"), device="cuda")
    k = trident.compile(ROOT / "examples" / "gelu.tile", backend="nvidia")
    launch_trident = k[1]
    # Both compute the same values first (checked against float64).
    launch_trident(x, out_t, n)
    gelu_triton[(1,)](x, out_r, n, BLOCK=256)
    torch.cuda.synchronize()
    want = x.double() * (1 + torch.erf(x.double() / 2**0.5)) / 2
    errs = [torch.max(torch.abs(o.double() - want)).item() for o in (out_t, out_r)]
    assert max(errs) <= 1e-5, errs

    raw_stream = torch._C._cuda_getCurrentRawStream

    def torch_reads():
        # What the launcher reads of the arguments, as Python code.
        for t in (x, out_t):
            t.dtype, t.get_device(), t.is_contiguous(), t.data_ptr()
        raw_stream(0)

    cases = {
        "trident k[grid](x, out, n)": lambda: k[1](x, out_t, n),
        "trident launcher(x, out, n) (k[grid] kept)": lambda: launch_trident(x, out_t, n),
        "triton kernel[grid](x, out, n, BLOCK=256)": lambda: gelu_triton[(1,)](x, out_r, n, BLOCK=256),
        # Where trident's time goes:
        "  of which: reading the arguments (no launch)": lambda: launch_trident._prepare(x, out_t, n),
        "  the same reads as Python code": torch_reads,
    }
    results = {}
    for name, launch in cases.items():
        med, best = per_launch_us(launch)
        results[name] = {"median_us": round(med, 3), "min_us": round(best, 3)}
        print(f"{name:48s} {med:8.2f} us per launch (min {best:.2f})")
    # Launches enqueued from Rust with the arguments read once: trident's Rust and the driver.
    batch = 200
    med, best = per_launch_us(lambda: launch_trident._repeat(batch, x, out_t, n), batches=50, batch=1)
    name = "  of which: trident's Rust + cuLaunchKernel"
    results[name] = {"median_us": round(med / batch, 3), "min_us": round(best / batch, 3)}
    print(f"{name:48s} {med / batch:8.2f} us per launch (min {best / batch:.2f})")
    t, r = results["trident k[grid](x, out, n)"]["median_us"], results["triton kernel[grid](x, out, n, BLOCK=256)"]["median_us"]
    print(f"trident / triton: {t / r:.3f} (goal: at most 1/3)")
    report = {
        "what": "host time per launch of a 256-element GELU from Python",
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "trident": trident.__version__,
        "results": results,
        "trident_over_triton": round(t / r, 4),
    }
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
