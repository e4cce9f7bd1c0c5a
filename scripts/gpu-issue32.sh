#!/usr/bin/env bash
# Issue 32's traces on the GPU machine, over `bundle/` (and the wheel in bundle/wheels), in one
# call of under ten minutes, then a validation of what changed since the last GPU run:
# 1. AG-GEMM and GEMM-RS (LLaMA-3.1-8B's per-rank shapes) in the loopback world of 4 ranks,
#    timed, then run again traced (`trident bench --trace`): every variant's timeline as a
#    Perfetto trace and an SVG under $OUT/traces, the traced time beside the untraced;
# 2. (EXTRA=1) session 52's changes: GEMM-RS's masked shards, the two-shot GEMM + AllReduce, and
#    flash decoding's 16-byte loads against the default in the same run;
# 3. (VALIDATE=1) every conformance case at world 1, GEMM-AR in the loopback world of 8, flash
#    decoding against SDPA and Triton (FD=0: not), the torch ops' tests (TORCH=1).
# Writes $OUT/summary.txt, logs/ and the reports; tar the traces to bring them back.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
KEEP='^conformance:|FAIL|skipped|rror|SUMMARY|PASS|passed|failed'
for c in "ag_gemm bf16 8192 14336 4096" "gemm_rs bf16 8192 4096 14336"; do
  k=${c%% *}
  KEEP="$k|trace|rror|failed" KEEP_LINES=40 step "trace-$k" 200 $B/trident bench --world 4 --only "$c" --reps 10 \
    --trace "$O/traces" --json "$O/bench-$k-world4.json"
done
# The clock exchange forced on one GPU (its offsets should be zero within their bound).
TRIDENT_TRACE_CLOCKS=always KEEP='trace|kernel|rror' step trace-ring 60 $B/trident run examples/allgather_ring.tile --backend nvidia --world 4 \
  --repeat 1 --arg src=f32[3000] --arg out=f32[12000]:zeros:symm --arg ready=u64[4]:zeros:symm --arg chunk=3000 \
  --arg epoch=call --out "$O/ring-out" --trace "$O/traces/allgather_ring.json"
rm -rf "$O/ring-out"
# (EXTRA=1) What changed in session 52: GEMM-RS's masked shards and the two-shot GEMM + AllReduce
# at worlds 1 and 2; flash decoding's 16-byte K and V loads (`/w16`) against the default, same run.
if [ "${EXTRA:-0}" = 1 ]; then
  for w in 1 2; do
    step "conformance-w$w-gemm_rs" 60 $B/trident test --backend nvidia --world $w --kernel gemm_rs
    step "conformance-w$w-two-shot" 60 $B/trident test --backend nvidia --world $w --kernel gemm_ar_two_shot
  done
  step conformance-flash-decode-wide 60 $B/trident test --backend nvidia --world 1 --kernel flash_decode
  KEEP='flash_decode|rror|failed' KEEP_LINES=60 step bench-flash-decode-wide 150 \
    $B/trident bench --only flash_decode --config 64n/8w/pf --config 128n/8w/pf/w16 --config 64n/8w/w16 \
    --baseline-cmd "/opt/torch/.venv/bin/python bench/baseline.py" --json "$O/bench-flash-decode-wide.json"
fi
if [ "${VALIDATE:-1}" = 1 ]; then
  step conformance-world1 150 $B/trident test --backend nvidia --world 1 --json "$O/logs/conformance-world1.json"
  step conformance-world8-gemm_ar 60 $B/trident test --backend nvidia --world 8 --kernel gemm_ar
  [ "${FD:-1}" = 1 ] && KEEP='flash_decode|rror|failed' KEEP_LINES=40 DROP='config' step bench-flash-decode 100 \
    $B/trident bench --only flash_decode --config 64n/8w/pf --baseline-cmd "/opt/torch/.venv/bin/python bench/baseline.py" \
    --json "$O/bench-flash-decode.json"
  [ "${TORCH:-0}" = 1 ] && torch_pytest python/tests/test_distributed_gpu.py python/tests/test_torch.py \
    -k "flash_decode or distributed"
fi
cat "$S"
