#!/usr/bin/env bash
# Session 54's fifth call: the persistent copy-engine AG-GEMM at world 1 with its own chunk on
# the GEMM's stream and `signalled_before` (every multiprocessor), against one program per tile
# and the plain GEMM in the same run, both bench shapes; its conformance at worlds 1 and 2.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
KEEP='^conformance:|FAIL|rror'
for w in 1 2; do step "conformance-ag-w$w" 90 $B/trident test --backend nvidia --world $w --kernel ag_gemm; done
KEEP='^bench: ag_gemm|rror|failed' KEEP_LINES=12 step ag-w1 150 $B/trident bench --world 1 --only ag_gemm --reps 10 \
  --json "$O/bench-ag_gemm-world1.json"
cat "$S"
