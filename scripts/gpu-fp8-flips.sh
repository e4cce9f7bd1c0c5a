#!/usr/bin/env bash
# The FP8 MoE blocks' error against their data-dependent bound (`WorldData::slack`, from
# `flip_reach` in conformance/src/cases/moe_block.rs) on the GPU machine, over `bundle/`
# (cargo xtask bundle): `trident test --backend nvidia --kernel moe_block` at world 1 (and
# WORLDS, default "1 2") RUNS times (default 8), each with fresh inputs; writes every FP8 case's
# error, bound and verdict to $OUT/fp8-flips.txt and a summary (the largest error / bound
# ratio, the failures) to $OUT/summary.txt; then compute-sanitizer racecheck of the same
# kernels at world 1 (SAN_LIMIT seconds, default 150; RACECHECK=0 leaves it out).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-gpu-out}; mkdir -p "$O"
B=bundle
: > "$O/fp8-flips.txt"
for i in $(seq "${RUNS:-8}"); do
  for w in ${WORLDS:-1 2}; do
    $B/trident test --backend nvidia --kernel moe_block --world "$w" 2>&1 \
      | awk -v run="$i" '$2 ~ /e4m3/ {print run, $2, $4, $5, $6, $7, $9}' >> "$O/fp8-flips.txt"
  done
done
{
  echo "commit: $(cat $B/COMMIT)"
  echo "cases: $(wc -l < "$O/fp8-flips.txt") (run variant shape world error bound verdict)"
  echo "largest error / bound:"
  awk '{ if ($6 > 0) printf "%.3f %s\n", $5 / $6, $0 }' "$O/fp8-flips.txt" | sort -gr | head -5
  echo "failures:"
  grep -v " ok$" "$O/fp8-flips.txt" | head -20
} > "$O/summary.txt"
if [ "${RACECHECK:-1}" = 1 ]; then
  TRIDENT_WAIT_BOUND_MS=60000 timeout "${SAN_LIMIT:-150}" /usr/local/cuda/bin/compute-sanitizer --tool racecheck \
    --error-exitcode 86 --print-limit 10 $B/trident test --backend nvidia --kernel moe_block --world 1 > "$O/racecheck.log" 2>&1
  echo "racecheck world 1: rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$O/racecheck.log" | tail -1)" >> "$O/summary.txt"
fi
cat "$O/summary.txt"
