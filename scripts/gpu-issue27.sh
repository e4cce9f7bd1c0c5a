#!/usr/bin/env bash
# Issue 27's checks on the GPU machine, over `bundle/` (cargo xtask bundle): every FP8 case of
# the differential test on the H200 (casts from every FP8 pattern, casts to FP8 on the boundary
# sets, select), with the PTX of sm_90a and of sm_80 (software conversions on both today), and
# the whole op matrix once more so that nothing else moved, and the scaled FP8 GEMM's
# conformance cases. Writes $OUT/summary.txt and logs.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-gpu-out}; mkdir -p "$O/logs"
B=bundle
S="$O/summary.txt"
{ date -u +%FT%TZ; echo "commit: $(cat $B/COMMIT)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > "$S"
source scripts/step.sh
KEEP='^ops:|^conformance:|FAIL|skipped'
KEEP_LINES=12
for t in sm_90a sm_80; do
  for d in f8e4m3fn f8e5m2; do
    step "ops-$t-from-$d" 120 $B/trident ops --backend nvidia --target $t --dtype $d --json "$O/logs/ops-$t-$d.json"
  done
  step "ops-$t-to-f8" 120 $B/trident ops --backend nvidia --target $t --op cast.f8 --json "$O/logs/ops-$t-to-f8.json"
done
step ops-all-sm_90a 300 $B/trident ops --backend nvidia --json "$O/logs/ops-all.json"
# The scaled FP8 GEMM's conformance cases (the portable form) on the GPU.
step conformance-scaled-gemm 120 $B/trident test --backend nvidia --kernel scaled_gemm --json "$O/logs/scaled-gemm.json"
cat "$S"
