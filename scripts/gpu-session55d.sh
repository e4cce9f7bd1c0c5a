#!/usr/bin/env bash
# Session 55's fourth call: loads that feed only `dot`s copied by `cp.async` into a ring of
# shared stages in any loop (`core/src/simt/lower/staged.rs`): flash decoding's K and V without
# prefetching, the portable grouped GEMM's K-major B. Conformance of both on the GPU (the new
# `flash_decode` variant `staged`), racecheck on flash decoding, then the flash decoding sweep
# against SDPA and the Triton split-KV kernel in the same run (`/sN` variants: N stages;
# without `/sN` and `/pf`: the register form).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
T0=$(date +%s)
KEEP='^conformance:|FAIL|rror'
step conformance-flash-decode 120 $B/trident test --backend nvidia --world 1 --kernel flash_decode
step conformance-grouped 180 $B/trident test --backend nvidia --world 1 --kernel grouped_gemm
PY=/opt/torch/.venv/bin/python; [ -x "$PY" ] || PY=python3
KEEP='^bench: flash_decode|flash_decode|rror|failed' KEEP_LINES=80 step bench-flash-decode 280 $B/trident bench \
  --only flash_decode --reps 10 --baseline-cmd "$PY bench/baseline.py" --json "$O/bench-flash-decode.json"
# The staged forms without the queries staged once before the loop (d9ef50d's binary, where
# present): the same configurations, no baseline.
if [ -x $B/trident-d9ef50d ]; then
  # d9ef50d names its two-stage form without a suffix (later: `/s2`).
  for c in 64n/8w 64n/8w/s3 32n/4w/s3; do
    KEEP='^bench: flash_decode|rror|failed' KEEP_LINES=10 step "ab-d9ef50d-${c//\//_}" 60 $B/trident-d9ef50d bench \
      --only flash_decode --config $c --reps 10
  done
fi
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  # Issue 32's traces on the H200 (scripts/gpu-session54c.sh, its own summary).
  OUT=$O/h200-traces bash scripts/gpu-session54c.sh > /dev/null 2>&1
  { echo "== H200 traces (scripts/gpu-session54c.sh):"; cat "$O/h200-traces/summary.txt"; } >> "$S"
  tar czf "$O/h200-traces.tgz" -C "$O" h200-traces && rm -rf "$O/h200-traces"
fi
[ $(( $(date +%s) - T0 )) -lt 200 ] && KEEP='ERROR SUMMARY|^conformance:|rror' step racecheck-flash-decode 100 /usr/local/cuda/bin/compute-sanitizer \
  --tool racecheck --error-exitcode 86 --print-limit 20 $B/trident test --backend nvidia --world 1 --kernel flash_decode --dtype bf16
tar czf "$O/logs.tgz" -C "$O" logs && rm -rf "$O/logs"
cat "$S"
