#!/usr/bin/env bash
# Issue 28's checks on the GPU machine, over `bundle/` (cargo xtask bundle): the grouped GEMM's
# conformance cases on the H200 (both layouts of A and of B, empty and one-row experts, one
# expert with every row), compute-sanitizer's memcheck and racecheck over them, then the
# benchmark against `torch._grouped_mm` at the MoE shapes (BENCH=0 leaves it out), and with
# DENSE=1 the dense GEMM at M = 256 (split-K in its sweep). Writes $OUT/summary.txt, logs and
# bench.json.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
KEEP='^conformance:|FAIL|skipped|rror'
[ "${CHECKS:-1}" = 1 ] && step conformance-grouped-gemm 120 $B/trident test --backend nvidia --kernel grouped_gemm --json "$O/logs/grouped-gemm.json"
# The split-K GEMM (its descriptor form on the H200: the dense GEMM's small-M sweep runs it).
[ "${CHECKS:-1}" = 1 ] && step conformance-splitk-gemm 60 $B/trident test --backend nvidia --kernel splitk_gemm --json "$O/logs/splitk-gemm.json"
# SANITIZE=0 leaves out compute-sanitizer (minutes).
[ "${SANITIZE:-1}" = 1 ] && KEEP='clean|ERRORS|TIMEOUT|exit' step sanitize 300 env OUT="$O/logs" TOOLS="memcheck racecheck" WORLDS=1 KERNEL=grouped_gemm \
  LINEINFO=0 scripts/gpu-sanitize.sh
# The split-K protocol (atomics into the workspace, the last split's counter) under both tools.
[ "${SANITIZE:-1}" = 1 ] && KEEP='clean|ERRORS|TIMEOUT|exit' step sanitize-splitk 120 env OUT="$O/logs/splitk" TOOLS="memcheck racecheck" WORLDS=1 KERNEL=splitk_gemm \
  LINEINFO=0 scripts/gpu-sanitize.sh
PY=/opt/torch/.venv/bin/python; [ -x "$PY" ] || PY=python3
if [ "${BENCH:-1}" = 1 ]; then
  # Each case's sweep (the scheduled and unscheduled forms, 128/256 columns, stages) is
  # printed as measured; the table comes after the baseline's second run.
  KEEP='^grouped_gemm|rror|failed' KEEP_LINES=40 step bench-grouped-gemm 540 $B/trident bench \
    --baseline-cmd "$PY bench/baseline.py" --only grouped_gemm --json "$O/bench.json"
fi
# DENSE=1: the dense GEMM's weak shape M = 256 (its sweep with split-K) against cuBLAS.
if [ "${DENSE:-0}" = 1 ]; then
  KEEP='^gemm|splitk|rror|failed' KEEP_LINES=30 step bench-gemm-m256 300 $B/trident bench \
    --baseline-cmd "$PY bench/baseline.py" --only "gemm bf16 256 8192" --json "$O/bench-gemm-m256.json"
fi
cat "$S"
