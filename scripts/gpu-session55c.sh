#!/usr/bin/env bash
# Session 55's third call: one submission at a time per device shared by a world of threads
# (`gpu-runtime/src/submit.rs`). The allgather_ll `wrap` flake at world 4, 60 runs as shipped
# and 30 with `TRIDENT_CONCURRENT_SUBMITS=1` (the behaviour before, in the same call); then
# the whole suite in the loopback worlds of 2, 4 and 8, twice each.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
flake() {  # flake NAME RUNS [ENV...]
  local name=$1 runs=$2; shift 2
  local fails=0
  for i in $(seq "$runs"); do
    env "$@" timeout 120 $B/trident test --backend nvidia --world 4 --kernel allgather_ll \
      > "$O/logs/flake-$name-$i.log" 2>&1 || fails=$((fails + 1))
  done
  echo "== flake $name: $fails of $runs runs failed" >> "$S"
  grep -h "FAIL" "$O"/logs/flake-"$name"-*.log | cut -c1-300 | head -4 >> "$S"
}
flake serialized 60
flake concurrent 30 TRIDENT_CONCURRENT_SUBMITS=1
KEEP='^conformance:|FAIL'
for w in 2 4 8; do for i in 1 2; do
  step "conformance-w$w-$i" 120 $B/trident test --backend nvidia --world $w
done; done
tar czf "$O/logs.tgz" -C "$O" logs && rm -rf "$O/logs"
cat "$S"
