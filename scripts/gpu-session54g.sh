#!/usr/bin/env bash
# Session 54's seventh call: the AG-GEMM (its persistent copy-engine form with the producer's
# wait, and at one process per GPU its own chunk first) in the NVSHMEM world of 1 and 2
# processes, intra-node scope (and inter-node where the bundle carries the device shim).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
nvshmem_env
KEEP='conformance:|FAIL|rror'
for scope in intra $( [ -d $B/cache/nvshmem-shim ] && echo inter ); do
  F=""; [ $scope = inter ] && F="--inter-node"
  for w in 1 2; do
    step "nvshmem-$scope-w$w" 80 $B/trident launch -n $w -- $B/trident test --backend nvidia --processes $F --kernel ag_gemm
  done
done
cat "$S"
