#!/usr/bin/env bash
# Session 54's second call on the GPU machine, over `bundle/`:
# 1. the AG-GEMM at world 1 traced (8192 x 14336 x 4096): why its persistent form with the
#    producer's wait (`ag_gemm/ce-persistent`) is slower than one program per tile where a rank
#    has the GPU to itself, when in the loopback world of 4 its tiles are as fast as the plain
#    GEMM's;
# 2. GEMM-RS in the loopback world of 4 traced, its traced time against the untraced runs
#    before and after it (tracing's cost);
# 3. what session 53's reuse-barrier elision has not run on hardware: conformance in the
#    loopback worlds of 2, 4 and 8, the differential test (`ops`), `math` every 256th pattern.
# Writes $OUT/summary.txt, logs/ and the reports; tar the traces and logs to bring them back.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
KEEP="ag_gemm|trace|rror|failed" KEEP_LINES=40 step trace-ag-w1 120 $B/trident bench --world 1 \
  --only "ag_gemm bf16 8192 14336 4096" --reps 10 --trace "$O/traces" --json "$O/bench-ag_gemm-world1.json"
KEEP="gemm_rs|trace|rror|failed" KEEP_LINES=40 step trace-gemm_rs 200 $B/trident bench --world 4 \
  --only "gemm_rs bf16 8192 4096 14336" --reps 10 --trace "$O/logs/traces-rs"
KEEP='^conformance:|FAIL|rror|SUMMARY'
for w in 2 4 8; do
  step "conformance-world$w" 150 $B/trident test --backend nvidia --world $w --json "$O/logs/conformance-world$w.json"
done
KEEP='^ops:|disagree|FAIL' step ops 200 $B/trident ops --backend nvidia --fast --json "$O/logs/ops-nvidia.json"
KEEP='^math:|FAIL|differ' step math 150 $B/trident math --backend nvidia --stride 256 --fast \
  --json "$O/logs/math-nvidia.json"
cat "$S"
