#!/usr/bin/env bash
# Session 59's short call, if only a little device time is left: the grouped GEMM's and the
# split-K GEMM's conformance (C by bulk row copies; split-K by slots, with and without a producer
# warp), the dense GEMM at M = 256 with split-K by atomics and by slots against the unsplit
# default and cuBLAS, the two grouped down projections (the weakest cases) against
# `torch._grouped_mm` with the masked-store form beside, then flash decoding's conformance (its
# `pdl` variant). Each step's limit is cut to what is left before `DEADLINE` (300 s default).
set -uo pipefail
cd "$(dirname "$0")/.."
DEADLINE=${DEADLINE:-300}
source scripts/step.sh
PY=/opt/torch/.venv/bin/python; [ -x "$PY" ] || PY=python3
KEEP='^conformance:|FAIL|skipped|rror'
run conformance-grouped-gemm 60 $B/trident test --backend nvidia --kernel grouped_gemm
run conformance-splitk 30 $B/trident test --backend nvidia --kernel splitk_gemm
KEEP='^gemm|splitk|rror|failed' KEEP_LINES=30 run bench-gemm-m256 60 $B/trident bench \
  --baseline-cmd "$PY bench/baseline.py" --only "gemm bf16 256 8192" --config 128x256x64/8w/4s/tma-splitk2 \
  --config 128x128x64/8w/6s/tma-ws-persistent --reps 20 --json "$O/bench-gemm-m256.json"
for c in "grouped_gemm bf16 16 2048 768 1024 0" "grouped_gemm bf16 32 7168 2048 1024 0"; do
  KEEP='^grouped_gemm|rror|failed' KEEP_LINES=20 run "bench-${c// /_}" 70 $B/trident bench \
    --baseline-cmd "$PY bench/baseline.py" --only "$c" --config 128x256x64/8w/4s --reps 10
done
KEEP='^conformance:|FAIL|rror'
run conformance-flash_decode 60 $B/trident test --backend nvidia --world 1 --kernel flash_decode
tar czf "$O/logs.tgz" -C "$O" logs && rm -rf "$O/logs"
cat "$S"
