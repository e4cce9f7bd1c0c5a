#!/usr/bin/env bash
# Runs on the GPU machine over a bundle made by `cargo xtask bundle` (no Rust toolchain there).
# Checks what the NVIDIA backend can run and writes JSON and logs under $OUT (or ./gpu-out).
# Each step has its own time limit, so that a hang in one step still returns the others.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
B=bundle
{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(cat $B/COMMIT 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
} | tee "$OUT/device.txt"
$B/trident test --list-backends | tee -a "$OUT/device.txt"
status=0
# Planted never-satisfied wait: ends within its bound with the diagnostic; the next launch works.
timeout 60 $B/trident selftest 2>&1 | tee "$OUT/selftest.log" || status=1
# Single-device kernels, and distributed kernels in the loopback world (ranks on this GPU).
# (At most 8 files come back from the device machine: the worlds share one log, and one JSON.)
for w in 1 2 4 8; do
  echo "== world $w" >> "$OUT/conformance-nvidia.log"
  timeout 120 $B/trident test --backend nvidia --world $w --json "$OUT/conformance-nvidia-world$w.json" \
    >> "$OUT/conformance-nvidia.log" 2>&1 || status=1
  tail -1 "$OUT/conformance-nvidia.log"
done
# Every op x element type alone against the host reference, default and fast math; the
# support matrix's nvidia column checked against what compiles.
timeout 300 $B/trident ops --backend nvidia --fast --json "$OUT/ops-nvidia.json" > "$OUT/ops-nvidia.log" 2>&1 || status=1
tail -1 "$OUT/ops-nvidia.log"
# The elementary functions on the GPU: bit-identical to the host evaluation (every 64th f32
# bit pattern), and the hardware's fast-math approximations measured.
timeout 300 $B/trident math --backend nvidia --stride ${MATH_STRIDE:-64} --fast --json "$OUT/math-nvidia.json" \
  > "$OUT/math-nvidia.log" 2>&1 || status=1
cat "$OUT/math-nvidia.log"
# IR -> PTX time of each kernel (median of 20 compiles).
for k in vector_add softmax gemm splitk_gemm ag_gemm; do
  $B/trident emit --backend nvidia --kernel $k --dtype bf16 --time | tee -a "$OUT/device.txt"
done
# The Hopper GEMM as the library runs it on sm_90a (TMA descriptors), and warp-specialized.
for f in --descriptors "--descriptors --warp-specialize"; do
  $B/trident emit --backend nvidia --target sm_90a --kernel gemm --dtype bf16 --config 128x256x64/8w/4s $f --time \
    | tee -a "$OUT/device.txt"
done
# Benchmarks: trident's kernels (CUDA events) vs the vendor baseline measured in the same run
# (cuBLAS / PyTorch through bench/baseline.py, with the venv of DEVICE.md), next to the roofline.
if [ "${BENCH:-1}" = 1 ]; then
  PY=/opt/torch/.venv/bin/python
  [ -x "$PY" ] || PY=python3
  # The baseline is timed before and after trident's timings, in the same run (`--baseline-cmd`).
  timeout 540 $B/trident bench --baseline-cmd "$PY bench/baseline.py" --json "$OUT/bench.json" 2>&1 \
    | tee -a "$OUT/device.txt" | grep -v '^bench: .* config ' || status=1
fi
exit $status
