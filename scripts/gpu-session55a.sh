#!/usr/bin/env bash
# Session 55's first call: (1) the library's AG-GEMM default with the copy engine is now the
# persistent form wherever the target has TMA (`AgGemm::for_world`): its conformance at world 1
# (its own chunk first, every multiprocessor) and in the loopback worlds of 2 and 4, and in the
# NVSHMEM world of 1 and 2 processes; (2) the allgather_ll `wrap` flake at world 4 (issue 31):
# repeated runs with the default 2 s bound, with a 10 s bound (a deadlock stays, slowness
# passes) and with 8 hardware queues (false dependencies between the ranks' streams would
# show more often); (3) on an H200 only, issue 32's traces (scripts/gpu-session54c.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
KEEP='^conformance:|FAIL|rror'
for w in 1 2 4; do step "conformance-ag-w$w" 90 $B/trident test --backend nvidia --world $w --kernel ag_gemm; done
( nvshmem_env
  for w in 1 2; do
    step "nvshmem-intra-w$w" 80 $B/trident launch -n $w -- $B/trident test --backend nvidia --processes --kernel ag_gemm
  done )
flake() {  # flake NAME RUNS [ENV...]: RUNS runs of allgather_ll at world 4, failures counted
  local name=$1 runs=$2; shift 2
  local fails=0
  for i in $(seq "$runs"); do
    env "$@" timeout 120 $B/trident test --backend nvidia --world 4 --kernel allgather_ll \
      > "$O/logs/flake-$name-$i.log" 2>&1 || fails=$((fails + 1))
  done
  echo "== flake $name: $fails of $runs runs failed" >> "$S"
  grep -h "FAIL" "$O"/logs/flake-"$name"-*.log | cut -c1-400 | head -8 >> "$S"
}
flake default 8
flake bound10s 6 TRIDENT_WAIT_BOUND_MS=10000
flake queues8 6 CUDA_DEVICE_MAX_CONNECTIONS=8
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  OUT=$O/h200-traces bash scripts/gpu-session54c.sh > /dev/null 2>&1
  { echo "== H200 traces (scripts/gpu-session54c.sh):"; cat "$O/h200-traces/summary.txt"; } >> "$S"
  tar czf "$O/h200-traces.tgz" -C "$O" h200-traces && rm -rf "$O/h200-traces"
fi
tar czf "$O/logs.tgz" -C "$O" logs && rm -rf "$O/logs"
cat "$S"
