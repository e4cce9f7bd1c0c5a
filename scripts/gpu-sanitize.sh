#!/usr/bin/env bash
# compute-sanitizer over the NVIDIA conformance suite, on the GPU machine, over a bundle made by
# `cargo xtask bundle`: memcheck, racecheck, synccheck and initcheck at world 1 and in the
# loopback world of 2 ranks. Kernel waits are bounded by TRIDENT_WAIT_BOUND_MS (raised here:
# the tools slow kernels down by 10-1000x). Each run has its own time limit (SAN_LIMIT seconds);
# one log per tool and world under $OUT, and a summary line each in $OUT/sanitize.txt.
#   TOOLS="memcheck racecheck" WORLDS="1" KERNEL=ag_gemm scripts/gpu-sanitize.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
B=bundle
SAN=${SAN:-/usr/local/cuda/bin/compute-sanitizer}
export TRIDENT_WAIT_BOUND_MS=${TRIDENT_WAIT_BOUND_MS:-60000}
LIMIT=${SAN_LIMIT:-120}
status=0
filter=()
[ -n "${KERNEL:-}" ] && filter=(--kernel "$KERNEL")
for tool in ${TOOLS:-memcheck racecheck synccheck initcheck}; do
  for w in ${WORLDS:-1 2}; do
    log="$OUT/sanitize-$tool-world$w.log"
    start=$(date +%s)
    timeout "$LIMIT" "$SAN" --tool "$tool" --error-exitcode 86 --print-limit 20 \
      $B/trident test --backend nvidia --world "$w" "${filter[@]}" > "$log" 2>&1
    rc=$?
    took=$(( $(date +%s) - start ))
    cases=$(grep -E '^conformance:' "$log" | tail -1)
    errors=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -2 | tr '\n' ' ')
    case $rc in
      0) verdict=clean ;;
      86) verdict="ERRORS"; status=1 ;;
      124) verdict="TIMEOUT after ${LIMIT}s" ;;
      *) verdict="exit $rc"; status=1 ;;
    esac
    echo "$tool world $w: $verdict (${took}s) | ${cases:-no summary} | ${errors}" | tee -a "$OUT/sanitize.txt"
  done
done
# Line information: a kernel from the text format reading past its buffer (x holds 900 of the
# 1000 elements the launch covers); memcheck must name the tile-IR line of the load.
if [ "${LINEINFO:-1}" = 1 ]; then
  log="$OUT/sanitize-lineinfo.log"
  line=$(grep -n ' = load ' examples/gelu.tile | head -1 | cut -d: -f1)
  timeout 60 "$SAN" --tool memcheck --print-limit 3 $B/trident run examples/gelu.tile --backend nvidia \
    --grid 4 --arg 'x=f32[900]' --arg 'out=f32[1000]:zeros' --arg n=1000 --out /tmp/gelu-out > "$log" 2>&1
  if grep -q "gelu.tile:$line" "$log"; then
    echo "lineinfo: memcheck names gelu.tile:$line (the load)" | tee -a "$OUT/sanitize.txt"
  else
    echo "lineinfo: FAIL: no gelu.tile:$line in the memcheck report" | tee -a "$OUT/sanitize.txt"; status=1
  fi
fi
exit $status
