#!/usr/bin/env bash
# Consumer ping-pong's checks on the GPU machine, in one call, over `bundle/` (cargo xtask
# bundle): the GEMM and scaled-GEMM conformance cases at world 1 (their -pingpong variants
# among them), then the dense bf16 GEMM's ping-pong configurations beside the single-group
# ones the sweep picked before (128x256x64/8w/4s and 128x128x64/8w/6s, each form), at every bf16 shape,
# against cuBLAS in the same run. Writes $OUT/summary.txt, logs and bench-gemm.json.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
PY=/opt/torch/.venv/bin/python; [ -x "$PY" ] || PY=python3
KEEP='^conformance:|FAIL|pingpong|skipped'
KEEP_LINES=12
if [ "${CHECKS:-1}" = 1 ]; then
  step conformance-gemm 240 $B/trident test --backend nvidia --kernel gemm --world 1 --json "$O/logs/gemm.json"
  step conformance-scaled-gemm 120 $B/trident test --backend nvidia --kernel scaled_gemm --world 1 --json "$O/logs/scaled-gemm.json"
fi
if [ "${BENCH:-1}" = 1 ]; then
  KEEP='^gemm|rror|failed' KEEP_LINES=40 step bench-gemm 300 env TRIDENT_SWEEP_PINGPONG=1 $B/trident bench \
    --baseline-cmd "$PY bench/baseline.py" --only "gemm bf16" --config pingpong \
    --config 128x256x64/8w/4s --config 128x128x64/8w/6s --json "$O/bench-gemm.json"
fi
cat "$S"
