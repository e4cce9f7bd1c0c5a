#!/usr/bin/env bash
# Session 58: the grouped GEMM's C by bulk row copies (`GroupedGemm::bulk_store`, lower/
# bulk_store.rs) on hardware for the first time: the grouped GEMM's and the MoE blocks'
# conformance at world 1, then the benchmark against `torch._grouped_mm` and
# `torch._scaled_grouped_mm` (timed before and after), each case's default with row copies,
# 3 stages (the whole tile staged in one round), the scheduled form, and the default with the
# masked stores it replaces (`/masked-store`), every configuration checked against f64.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
KEEP='^conformance:|FAIL|skipped|rror'
step conformance-grouped-gemm 120 $B/trident test --backend nvidia --kernel grouped_gemm
step conformance-moe 120 $B/trident test --backend nvidia --kernel moe
PY=/opt/torch/.venv/bin/python; [ -x "$PY" ] || PY=python3
KEEP='^grouped_gemm|rror|failed' KEEP_LINES=40 step bench-grouped-bf16 300 $B/trident bench \
  --baseline-cmd "$PY bench/baseline.py" --only "grouped_gemm bf16" --config 128x256x64/8w --reps 10 --json "$O/bench-bf16.json"
KEEP='^grouped_gemm|rror|failed' KEEP_LINES=40 step bench-grouped-fp8 200 $B/trident bench \
  --baseline-cmd "$PY bench/baseline.py" --only "grouped_gemm f8e4m3fn" --config x128/8w --reps 10 --json "$O/bench-fp8.json"
tar czf "$O/logs.tgz" -C "$O" logs && rm -rf "$O/logs"
cat "$S"
