#!/usr/bin/env bash
# Session 54's fourth call: the AG-GEMM traced at world 1 and in the loopback world of 4 with
# stream marks from an event pool (no event created while work is timed): what tracing costs
# the copy-engine gather's copies now.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
for w in 4 1; do
  KEEP="ag_gemm|trace|rror|failed" KEEP_LINES=40 step trace-ag-w$w 150 $B/trident bench --world $w \
    --only "ag_gemm bf16 8192 14336 4096" --reps 10 --trace "$O/traces" --json "$O/bench-ag_gemm-world$w.json"
done
cat "$S"
