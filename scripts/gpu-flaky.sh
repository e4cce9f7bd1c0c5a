#!/usr/bin/env bash
# How often a conformance kernel fails in a world, for one binary or two compared: runs
# `trident test --backend nvidia --kernel KERNEL --world WORLD` with each of BINS in turn
# (default: bundle/trident; e.g. BINS="bundle/trident-old bundle/trident" with the binary of
# the commit before a fix copied beside the bundle's) until BUDGET seconds (default 420) have
# passed; one line per run in $OUT/stress.txt (round, binary, exit code, time, summary), every
# failure's line in $OUT/fails.txt, and the runs that passed per binary at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-gpu-out}; mkdir -p "$O"
export TRIDENT_CACHE_DIR=${TRIDENT_CACHE_DIR:-$PWD/bundle/cache}
BINS=${BINS:-bundle/trident}
end=$(( $(date +%s) + ${BUDGET:-420} ))
i=0
while [ "$(date +%s)" -lt $end ]; do
  i=$((i + 1))
  for bin in $BINS; do
    t0=$(date +%s%N)
    timeout 90 "$bin" test --backend nvidia --kernel "${KERNEL:-moe_block}" --world "${WORLD:-8}" > "$O/run.log" 2>&1
    rc=$?
    summary=$(grep -E '^conformance:' "$O/run.log" | tail -1)
    echo "$i $bin rc=$rc $(( ($(date +%s%N) - t0) / 1000000 ))ms $summary" | tee -a "$O/stress.txt"
    grep FAIL "$O/run.log" | cut -c1-400 >> "$O/fails.txt"
  done
done
for bin in $BINS; do
  echo "$bin: $(grep -c " $bin rc=0 " "$O/stress.txt") of $(grep -c " $bin rc=" "$O/stress.txt") runs passed"
done
