#!/usr/bin/env bash
# Session 54's seventh call: the AG-GEMM (its persistent copy-engine form with the producer's
# wait, and at one process per GPU its own chunk first) in the NVSHMEM world of 1 and 2
# processes, intra- and inter-node scope.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
nvshmem_env
KEEP='conformance:|FAIL|rror'
for scope in intra inter; do
  F=""; [ $scope = inter ] && F="--inter-node"
  for w in 1 2; do
    step "nvshmem-$scope-w$w" 80 $B/trident launch -n $w -- $B/trident test --backend nvidia --processes $F --kernel ag_gemm
  done
done
cat "$S"
