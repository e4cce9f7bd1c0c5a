#!/usr/bin/env bash
# Session 58's short call, if only a little device time is left: the grouped GEMM's
# conformance with C by bulk row copies, then the two down projections (the weakest cases:
# DeepSeek-V3 32 x 7168 x 2048 and Qwen3 16 x 2048 x 768, 1024 rows per expert) against
# `torch._grouped_mm` with the masked-store default beside, then flash decoding's conformance
# (its `pdl` variant: cuLaunchKernelEx on hardware for the first time).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
PY=/opt/torch/.venv/bin/python; [ -x "$PY" ] || PY=python3
KEEP='^conformance:|FAIL|skipped|rror'
step conformance-grouped-gemm 60 $B/trident test --backend nvidia --kernel grouped_gemm
for c in "grouped_gemm bf16 32 7168 2048 1024 0" "grouped_gemm bf16 16 2048 768 1024 0"; do
  KEEP='^grouped_gemm|rror|failed' KEEP_LINES=20 step "bench-${c// /_}" 90 $B/trident bench \
    --baseline-cmd "$PY bench/baseline.py" --only "$c" --config 128x256x64/8w --reps 10
done
KEEP='^conformance:|FAIL|rror'
step conformance-flash_decode 60 $B/trident test --backend nvidia --world 1 --kernel flash_decode
tar czf "$O/logs.tgz" -C "$O" logs && rm -rf "$O/logs"
cat "$S"
