#!/usr/bin/env bash
# Session 54's first call on the GPU machine, over `bundle/` (the commit in bundle/COMMIT):
# 1. on an H200 only: issue 32's traces, AG-GEMM and GEMM-RS in the loopback world of 4
#    (`trident bench --trace`), the traced time beside the untraced (on an H100 they exist:
#    results/h100-session53);
# 2. what session 53's reuse-barrier elision has not yet run on hardware: conformance in the
#    loopback worlds of 2, 4 and 8 ranks, the differential test of every op (`ops`), and the
#    elementary functions (`math`, every 256th f32 pattern).
# Writes $OUT/summary.txt, logs/ and the reports; tar the traces and logs to bring them back.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || [ "${TRACES:-0}" = 1 ]; then
  for c in "ag_gemm bf16 8192 14336 4096" "gemm_rs bf16 8192 4096 14336"; do
    k=${c%% *}
    KEEP="$k|trace|rror|failed" KEEP_LINES=40 step "trace-$k" 200 $B/trident bench --world 4 --only "$c" --reps 10 \
      --trace "$O/traces" --json "$O/bench-$k-world4.json"
  done
fi
KEEP='^conformance:|FAIL|rror|SUMMARY'
for w in ${WORLDS:-2 4 8}; do
  step "conformance-world$w" 150 $B/trident test --backend nvidia --world $w --json "$O/logs/conformance-world$w.json"
done
KEEP='^ops:|disagree|FAIL' step ops 200 $B/trident ops --backend nvidia --fast --json "$O/logs/ops-nvidia.json"
KEEP='^math:|FAIL|differ' step math 150 $B/trident math --backend nvidia --stride ${MATH_STRIDE:-256} --fast \
  --json "$O/logs/math-nvidia.json"
cat "$S"
