#!/usr/bin/env bash
# Session 57's first call: the full check owed since the byte-vector lowering (b30af48):
# self-test, conformance at world 1 and in the loopback worlds of 2/4/8, every op against the
# host reference, the elementary functions (every 256th f32 pattern), then pytest with torch on
# the single-GPU ops (the float8-cache flash decoding op among them; needs bundle/wheels).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
KEEP='PASS|FAIL|rror'
step selftest 60 $B/trident selftest
KEEP='^conformance:|FAIL|rror'
step conformance-world1 240 $B/trident test --backend nvidia --world 1
for w in 2 4 8; do
  step conformance-world$w 120 $B/trident test --backend nvidia --world $w
done
KEEP='passed|disagree|FAIL' step ops 200 $B/trident ops --backend nvidia --fast
KEEP='ulp|FAIL|rror' KEEP_LINES=30 step math 150 $B/trident math --backend nvidia --stride 256 --fast
KEEP='FAIL|rror|passed|failed|SKIP' torch_pytest python/tests/test_torch.py
tar czf "$O/logs.tgz" -C "$O" logs && rm -rf "$O/logs"
cat "$S"
