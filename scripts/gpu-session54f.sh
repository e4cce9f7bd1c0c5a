#!/usr/bin/env bash
# Session 54's sixth call: the library's AG-GEMM default where a rank has its GPU to itself is
# now the persistent copy-engine form: its conformance at world 1 (that form) and in the
# loopback worlds of 2 and 4, a planted timeout at world 2, and the whole world-1 suite.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
KEEP='^conformance:|FAIL|rror'
for w in 1 2 4; do step "conformance-ag-w$w" 90 $B/trident test --backend nvidia --world $w --kernel ag_gemm; done
TRIDENT_WAIT_BOUND_MS=300 step rearm-ag-w2 120 $B/trident test --backend nvidia --world 2 --kernel ag_gemm --dtype bf16 --rearm
step conformance-world1 200 $B/trident test --backend nvidia --world 1
cat "$S"
