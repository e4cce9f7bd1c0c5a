#!/usr/bin/env bash
# Session 56's first call: the checks owed since session 55 changed the lowering (loads staged by
# `cp.async`), the CPU simulator and the runtime's submission lock. The planted timeout, the
# conformance suite at worlds 1/2/4/8 (loopback: ranks on this GPU; world 1 has flash decoding's
# `staged` variants and the grouped GEMM), then the flash decoding sweep against SDPA and the
# Triton split-KV kernel in the same run (`/sN`: N stages by `cp.async`; `/pf`: the prefetching
# register form; neither: the register form), in what is left of the call.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
T0=$(date +%s)
KEEP='PASS|FAIL|rror|timed out' step selftest 60 $B/trident selftest
for w in 1 2 4 8; do
  KEEP='^conformance:|FAIL' step conformance-world$w 150 $B/trident test --backend nvidia --world $w \
    --json "$O/logs/conformance-world$w.json"
done
LEFT=$(( 560 - ($(date +%s) - T0) ))
PY=/opt/torch/.venv/bin/python; [ -x "$PY" ] || PY=python3
[ $LEFT -gt 60 ] && KEEP='^bench: flash_decode|flash_decode|rror|failed' KEEP_LINES=80 step bench-flash-decode $LEFT \
  $B/trident bench --only flash_decode --reps 10 --baseline-cmd "$PY bench/baseline.py" --json "$O/bench-flash-decode.json"
tar czf "$O/logs.tgz" -C "$O" logs && rm -rf "$O/logs"
cat "$S"
