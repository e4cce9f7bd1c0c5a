#!/usr/bin/env bash
# Issue 28's checks on the GPU machine, over `bundle/` (cargo xtask bundle): the grouped GEMM's
# conformance cases on the H200 (both layouts of A and of B, empty and one-row experts, one
# expert with every row), compute-sanitizer's memcheck and racecheck over them, then the
# benchmark against `torch._grouped_mm` at the MoE shapes (BENCH=0 leaves it out). Writes
# $OUT/summary.txt, logs and bench.json.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
KEEP='^conformance:|FAIL|skipped|rror'
[ "${CHECKS:-1}" = 1 ] && step conformance-grouped-gemm 120 $B/trident test --backend nvidia --kernel grouped_gemm --json "$O/logs/grouped-gemm.json"
# SANITIZE=0 leaves out compute-sanitizer (minutes).
[ "${SANITIZE:-1}" = 1 ] && KEEP='clean|ERRORS|TIMEOUT|exit' step sanitize 300 env OUT="$O/logs" TOOLS="memcheck racecheck" WORLDS=1 KERNEL=grouped_gemm \
  LINEINFO=0 scripts/gpu-sanitize.sh
PY=/opt/torch/.venv/bin/python; [ -x "$PY" ] || PY=python3
if [ "${BENCH:-1}" = 1 ]; then
  KEEP='grouped_gemm|rror|failed' KEEP_LINES=40 step bench-grouped-gemm 420 $B/trident bench \
    --baseline-cmd "$PY bench/baseline.py" --only grouped_gemm --json "$O/bench.json"
fi
cat "$S"
