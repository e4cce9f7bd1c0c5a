#!/usr/bin/env bash
# After the barrier_all words moved into the heaps: the loopback worlds, self-test and world-1
# suite (gpu-check without ops/math), then the NVSHMEM world (intra and inter-node, dead rank).
cd "$(dirname "$0")/.."
O=${OUT:-gpu-out}; mkdir -p $O
BENCH=0 MATH_STRIDE=4096 OUT=$O timeout 200 bash scripts/gpu-check.sh > $O/gpu-check.log 2>&1; echo "gpu-check rc=$?" >> $O/gpu-check.log
grep -E "conformance:|ops:|PASS|FAIL|rc=" $O/gpu-check.log | head -20
OUT=$O timeout 300 bash scripts/gpu-nvshmem.sh > /dev/null 2>&1
grep -E "^==|conformance:|failed first" $O/nvshmem.log | head -60
ls $O
