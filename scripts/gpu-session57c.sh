#!/usr/bin/env bash
# Session 57's third call: flash decoding with `exp` through the hardware by default for
# 16-bit queries. Conformance of flash decoding at world 1 and of the distributed form in the
# loopback world of 2; the sweep's default and accurate forms against SDPA and the Triton
# split-KV kernel (same run) with each launch timed alone; pytest with torch on the
# flash_decode ops.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
KEEP='^conformance:|FAIL|rror'
step conformance-flash_decode 120 $B/trident test --backend nvidia --world 1 --kernel flash_decode
step conformance-flash_decode-w2 120 $B/trident test --backend nvidia --world 2 --kernel flash_decode_dist
PY=/opt/torch/.venv/bin/python; [ -x "$PY" ] || PY=python3
KEEP='stage alone|^flash_decode|rror' KEEP_LINES=40 step bench-fd 330 $B/trident bench --only "flash_decode bf16" \
  --config 64n/8w/pf/w16 --reps 10 --baseline-cmd "$PY bench/baseline.py" --json "$O/bench-flash-decode.json"
KEEP='FAIL|rror|passed|failed' torch_pytest python/tests/test_torch.py -k flash_decode
tar czf "$O/logs.tgz" -C "$O" logs && rm -rf "$O/logs"
cat "$S"
