#!/usr/bin/env bash
# What scripts/gpu-check.sh does for NVIDIA, on a machine with an AMD GPU and ROCm (HIP loaded
# at run time; no Rust toolchain needed there), over a bundle made by `cargo xtask bundle`:
# the backends seen, the conformance suite on the GPU (single-device kernels, and distributed
# kernels in the loopback world of 2, 4 and 8 ranks sharing the GPU), every op x element type
# against the host reference with the support matrix's amd column, the elementary functions
# bit for bit against the host, compile times, and the AMDGCN of the GEMM. Writes JSON and logs
# under $OUT (or ./amd-out); each step has its own time limit, so a hang in one still returns
# the others. The target is the GPU's (rocminfo), or TARGET=gfx942 / gfx90a.
#   OUT=amd-out scripts/amd-check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-amd-out}
mkdir -p "$OUT"
B=bundle
TARGET=${TARGET:-$(rocminfo 2>/dev/null | grep -o -m1 'gfx9[0-9a-f]*')}
TARGET=${TARGET:-gfx942}
{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(cat $B/COMMIT 2>/dev/null)"
  echo "target: $TARGET"
  rocm-smi --showproductname 2>&1 | grep -iE "card|gpu" | head -4
  command -v llc-19 ld.lld-19 2>&1
} | tee "$OUT/device.txt"
$B/trident test --list-backends | tee -a "$OUT/device.txt"
status=0
# Single-device kernels (world 1), then the distributed ones in the loopback world.
for w in 1 2 4 8; do
  echo "== world $w" >> "$OUT/conformance-amd.log"
  timeout 300 $B/trident test --backend amd --target "$TARGET" --world $w --json "$OUT/conformance-amd-world$w.json" \
    >> "$OUT/conformance-amd.log" 2>&1 || status=1
  tail -1 "$OUT/conformance-amd.log"
done
# A planted timeout in every collective, then the re-armed world's calls checked.
timeout 300 env TRIDENT_WAIT_BOUND_MS=300 TRIDENT_STREAM_WAIT_BOUND_MS=1000 $B/trident test --backend amd \
  --target "$TARGET" --world 2 --rearm --json "$OUT/rearm-amd.json" > "$OUT/rearm-amd.log" 2>&1 || status=1
tail -1 "$OUT/rearm-amd.log"
# Every op x element type against the host reference; the support matrix's amd column.
timeout 300 $B/trident ops --backend amd --target "$TARGET" --fast --json "$OUT/ops-amd.json" > "$OUT/ops-amd.log" 2>&1 || status=1
tail -1 "$OUT/ops-amd.log"
# The elementary functions on the GPU, bit for bit against the host.
timeout 300 $B/trident math --backend amd --stride ${MATH_STRIDE:-64} --fast --json "$OUT/math-amd.json" \
  > "$OUT/math-amd.log" 2>&1 || status=1
cat "$OUT/math-amd.log"
# IR -> code object time of each kernel, and the GEMM's AMDGCN.
for k in vector_add softmax gemm splitk_gemm ag_gemm; do
  $B/trident emit --backend amd --target "$TARGET" --kernel $k --dtype bf16 --time | tee -a "$OUT/device.txt"
done
$B/trident emit --backend amd --target "$TARGET" --kernel gemm --dtype bf16 --asm > "$OUT/gemm-$TARGET.s" 2>&1 || status=1
exit $status
