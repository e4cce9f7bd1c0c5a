#!/usr/bin/env bash
# Session 56's third call: byte elements now move in vectors of 32-bit words (PTX `v4.u8`, or
# words packed by `prmt` and unpacked by `bfe`), which only the GPU checks bit for bit. The
# kernels with 8-bit accesses at world 1 and 2 (flash decoding's 8-bit caches, the FP8 GEMMs,
# the FP8 dispatch, the MoE blocks), the 8-bit cache's timings beside the bf16 cache's, then the differential test of every
# op (8-bit loads and stores of every integer and float type).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
KEEP='^conformance:|FAIL' 
for k in flash_decode scaled_gemm grouped_gemm; do
  step conformance-$k 120 $B/trident test --backend nvidia --world 1 --kernel $k
done
for k in ep_all_to_all moe_block; do
  step conformance-$k-w2 120 $B/trident test --backend nvidia --world 2 --kernel $k
done
for c in "flash_decode bf16 1 1 32 8 128 131072 8" "flash_decode bf16 4 1 64 8 128 32768 8" "flash_decode bf16 4 1 64 8 128 32768"; do
  KEEP='^bench: flash_decode [^c]*:|rror' step "bench-${c// /_}" 60 $B/trident bench --only "$c" --reps 10 --config 64n/8w
done
# One split writes the output directly (no combine): the shape where that happens, against SDPA.
PY=/opt/torch/.venv/bin/python; [ -x "$PY" ] || PY=python3
KEEP='^bench: flash_decode [^c]*:|rror' step bench-direct 90 $B/trident bench --only "flash_decode bf16 64 1 32 8 128 1024" \
  --reps 10 --config 64n/8w/pf/w16 --baseline-cmd "$PY bench/baseline.py"
KEEP='passed|disagree|FAIL' step ops 150 $B/trident ops --backend nvidia --fast
tar czf "$O/logs.tgz" -C "$O" logs && rm -rf "$O/logs"
cat "$S"
