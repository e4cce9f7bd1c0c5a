#!/usr/bin/env bash
# Owed from session 57 (no device time was left): the combine sized to its partials
# (DecodeStage::Combine { tile }) and the programmatic combine (`/pdl`, conformance variant
# `pdl`: cuLaunchKernelEx and griddepcontrol.wait on hardware for the first time).
# Flash decoding's conformance at world 1 and the distributed form in the loopback world of 2
# (its combines of 2 partials), then three shapes against SDPA and Triton in the same run
# (`--config 64n/8w/pf/w16/fm` selects the default and `/pdl`):
# 32 x 32/8 x 4K (2 splits: tile 2, one warp), 8 x 32/8 x 8K, 1 x 32/8 x 128K (64 splits:
# unchanged, the control), with each launch timed alone.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
KEEP='^conformance:|FAIL|rror'
step conformance-flash_decode 90 $B/trident test --backend nvidia --world 1 --kernel flash_decode
step conformance-flash_decode-w2 60 $B/trident test --backend nvidia --world 2 --kernel flash_decode_dist
PY=/opt/torch/.venv/bin/python; [ -x "$PY" ] || PY=python3
for c in "flash_decode bf16 32 1 32 8 128 4096" "flash_decode bf16 8 1 32 8 128 8192" "flash_decode bf16 1 1 32 8 128 131072"; do
  KEEP='stage alone|^flash_decode|rror' KEEP_LINES=6 step "bench-${c// /_}" 60 $B/trident bench --only "$c" \
    --config 64n/8w/pf/w16/fm --reps 10 --baseline-cmd "$PY bench/baseline.py"
done
tar czf "$O/logs.tgz" -C "$O" logs && rm -rf "$O/logs"
cat "$S"
