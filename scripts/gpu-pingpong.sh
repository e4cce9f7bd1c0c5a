#!/usr/bin/env bash
# Consumer ping-pong's checks on the GPU machine, in one call, over `bundle/` (cargo xtask
# bundle): the GEMM and scaled-GEMM conformance cases at world 1 (their -pingpong variants
# among them); a short probe of each ping-pong form at a large K (bf16 4096^3, FP8 tensor- and
# row-scaled 4096^3: the shapes where the form hung or failed its launch before the order
# barrier), each under its own short limit so that a hang costs that limit only; then, where
# the bf16 probe passed, the dense bf16 GEMM's ping-pong configurations beside the
# single-group ones the sweep picks (128x256x64/8w/4s and 128x128x64/8w/6s, each form), at
# every bf16 shape, against cuBLAS in the same run. Writes $OUT/summary.txt, logs and
# bench-gemm.json. CHECKS=0 leaves out the conformance cases, SWEEP=0 the sweep.
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
export TRIDENT_SWEEP_PINGPONG=1
KEEP='config|rror|failed' KEEP_LINES=8 step probe-bf16 60 $B/trident bench --reps 10 \
  --only "gemm bf16 4096 4096 4096" --config pingpong
BF16=$?
for s in tensor row; do
  KEEP='config|rror|failed' KEEP_LINES=8 step "probe-fp8-$s" 60 $B/trident bench --reps 10 \
    --only "scaled_gemm_$s f8e4m3fn 4096 4096 4096" --config pingpong
done
if [ "${SWEEP:-1}" = 1 ]; then
  PP="--config pingpong"; [ $BF16 = 0 ] || PP=""
  KEEP='^gemm|rror|failed' KEEP_LINES=40 step bench-gemm 300 $B/trident bench \
    --baseline-cmd "$PY bench/baseline.py" --only "gemm bf16" $PP \
    --config 128x256x64/8w/4s --config 128x128x64/8w/6s --json "$O/bench-gemm.json"
fi
cat "$S"
