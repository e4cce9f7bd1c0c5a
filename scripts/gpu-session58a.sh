#!/usr/bin/env bash
# Session 58's first call: the full check owed at HEAD (the runtime's cuLaunchKernelEx path and
# the sized combine landed since the last one), then what gpu-session57d.sh owed: the sized
# combine and the programmatic combine (`/pdl`) against SDPA and Triton in the same run.
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
KEEP='FAIL|rror|passed|failed|SKIP' torch_pytest python/tests/test_torch.py
PY=/opt/torch/.venv/bin/python; [ -x "$PY" ] || PY=python3
for c in "flash_decode bf16 32 1 32 8 128 4096" "flash_decode bf16 8 1 32 8 128 8192" "flash_decode bf16 1 1 32 8 128 131072" "flash_decode bf16 64 1 32 8 128 1024"; do
  KEEP='stage alone|^flash_decode|rror' KEEP_LINES=8 step "bench-${c// /_}" 60 $B/trident bench --only "$c" \
    --config 64n/8w/pf/w16/fm --reps 10 --baseline-cmd "$PY bench/baseline.py"
done
tar czf "$O/logs.tgz" -C "$O" logs && rm -rf "$O/logs"
cat "$S"
