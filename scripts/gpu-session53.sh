#!/usr/bin/env bash
# Session 53's one call on the GPU machine, over `bundle/` (with `bundle/trident-base`, the binary
# of the commit before the reuse-barrier elision, for the A/B):
# 1. the elision on hardware: conformance at world 1 (and in the loopback world of 2: WORLD2=1);
# 2. flash decoding's split kernel with and without it (same machine, same call; 9 barriers a
#    step against 16), then against SDPA and Triton with it (FDB=1);
# 3. issue 32's traces: AG-GEMM and GEMM-RS in the loopback world of 4 (`trident bench --trace`),
#    and GEMM-RS with its reduction's next source prefetched against the base binary;
# 4. the torch op `gemm_ar` in both forms under torchrun (`TORCH=1`, the default).
# Writes $OUT/summary.txt, logs/ and the reports; tar the traces and logs to bring them back.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
KEEP='^conformance:|FAIL|rror|SUMMARY'
step conformance-world1 150 $B/trident test --backend nvidia --world 1 --json "$O/logs/conformance-world1.json"
[ "${WORLD2:-0}" = 1 ] && step conformance-world2 150 $B/trident test --backend nvidia --world 2
FD="--only flash_decode --config 64n/8w/pf/w16 --reps 20"
for bin in trident-base trident; do
  KEEP='^bench: flash_decode|rror|failed' KEEP_LINES=10 step "fd-$bin" 60 $B/$bin bench $FD
done
[ "${FDB:-0}" = 1 ] && KEEP='^bench: flash_decode|rror|failed' KEEP_LINES=10 step fd-baseline 150 $B/trident bench $FD \
  --baseline-cmd "/opt/torch/.venv/bin/python bench/baseline.py" --json "$O/bench-flash-decode.json"
for c in "ag_gemm bf16 8192 14336 4096" "gemm_rs bf16 8192 4096 14336"; do
  k=${c%% *}
  KEEP="$k|trace|rror|failed" KEEP_LINES=40 step "trace-$k" 200 $B/trident bench --world 4 --only "$c" --reps 10 \
    --trace "$O/traces" --json "$O/bench-$k-world4.json"
done
# GEMM-RS's reduction with its next source prefetched (this commit) against the base binary.
for bin in trident-base trident; do
  KEEP='^bench: gemm_rs|rror|failed' KEEP_LINES=12 step "rs-$bin" 120 $B/$bin bench --world 4 \
    --only "gemm_rs bf16 8192 4096 14336" --reps 10
  KEEP='^bench: gemm_ar|rror|failed' KEEP_LINES=12 step "ar-$bin" 120 $B/$bin bench --world 1 \
    --only "5120 25600" --reps 20
done
[ "${TORCH:-1}" = 1 ] && KEEP='FAIL|rror|passed|failed|gemm_ar' torch_pytest python/tests/test_distributed_gpu.py
cat "$S"
