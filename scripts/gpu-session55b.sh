#!/usr/bin/env bash
# Session 55's second call: the allgather_ll `wrap` flake at world 4 (issue 31) with every
# launch logged on the host (`TRIDENT_LOG_LAUNCHES=1`: when each rank's host thread launched
# each gather, whether the first-launch meeting was complete, how long the driver call took),
# to tell a host thread that launched late or blocked from a kernel that was launched but did
# not run.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
fails=0
for i in $(seq ${RUNS:-12}); do
  TRIDENT_LOG_LAUNCHES=${LOG:-1} TRIDENT_SERIAL_LAUNCHES=${SERIAL:-0} timeout 120 $B/trident test --backend nvidia --world 4 --kernel allgather_ll ${DTYPE:+--dtype $DTYPE} \
    > "$O/logs/flake${TAG:-}-$i.log" 2>&1 || fails=$((fails + 1))
done
echo "== flake${TAG:-} (log ${LOG:-1}, serial ${SERIAL:-0}): $fails of ${RUNS:-12} runs failed" >> "$S"
grep -h "FAIL" "$O"/logs/flake${TAG:-}-*.log | cut -c1-400 | head -8 >> "$S"
tar czf "$O/logs.tgz" -C "$O" logs && rm -rf "$O/logs"
cat "$S"
