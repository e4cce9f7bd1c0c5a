#!/usr/bin/env bash
# Session 60, one call for what sessions 57d-59 owed and the tensor-parallel MoE block's rows
# form, in order of need within a deadline of 560 s (steps that would not fit are skipped, named
# in the summary): conformance at world 1 (every kernel) and in the loopback world of 2; the
# grouped GEMM's C by bulk row copies (the bf16 benchmark with the masked-store default beside
# it); the dense GEMM at M = 256 with split-K by atomics and by slots against the unsplit default
# and cuBLAS; flash decoding's sized and programmatic combines (the default against `/pdl`, SDPA
# and Triton); conformance in the loopback worlds of 4 and 8; the tensor-parallel MoE block's
# rows form against its atomic form and PyTorch (two prefill shapes); ops, the FP8 grouped
# benchmark and pytest with torch.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
PY=/opt/torch/.venv/bin/python; [ -x "$PY" ] || PY=python3
# Conformance at world 1 first (every kernel: the grouped GEMM's bulk stores, split-K's slots,
# flash decoding's `pdl` variant among them), then the loopback world of 2 (`moe_block tp-rows`
# across ranks), then the benchmarks, then the other worlds.
KEEP='^conformance:|FAIL|skipped|rror'
run conformance-world1 120 $B/trident test --backend nvidia --world 1
run conformance-world2 60 $B/trident test --backend nvidia --world 2
KEEP='^grouped_gemm|rror|failed' KEEP_LINES=40 run bench-grouped-bf16 220 $B/trident bench \
  --baseline-cmd "$PY bench/baseline.py" --only "grouped_gemm bf16" --config 128x256x64/8w --reps 10 --json "$O/bench-bf16.json"
KEEP='^gemm|splitk|rror|failed' KEEP_LINES=30 run bench-gemm-m256 90 $B/trident bench \
  --baseline-cmd "$PY bench/baseline.py" --only "gemm bf16 256 8192" --config splitk \
  --config 128x128x64/8w/6s/tma-ws-persistent --reps 20 --json "$O/bench-gemm-m256.json"
for c in "flash_decode bf16 32 1 32 8 128 4096" "flash_decode bf16 8 1 32 8 128 8192" "flash_decode bf16 1 1 32 8 128 131072"; do
  KEEP='stage alone|^flash_decode|rror' KEEP_LINES=8 run "bench-${c// /_}" 50 $B/trident bench --only "$c" \
    --config 64n/8w/pf/w16/fm --reps 10 --baseline-cmd "$PY bench/baseline.py"
done
KEEP='^conformance:|FAIL|rror'
for w in 4 8; do
  run conformance-world$w 60 $B/trident test --backend nvidia --world $w
done
# The tensor-parallel block with its down rows stored to their owner (`moe-tp-rows/block`)
# against the atomic form, and its down GEMM against the plain one (Qwen3-30B-A3B prefill,
# then DeepSeek-V3 prefill), PyTorch's pipeline in the same run.
TORCHRUN=/opt/torch/.venv/bin/torchrun; [ -x "$TORCHRUN" ] || TORCHRUN=torchrun
for c in "moe_block bf16 2048 2048" "moe_block bf16 4096 7168"; do
  KEEP='moe-tp|grouped/|rror|failed' KEEP_LINES=20 run "bench-${c// /_}" 110 $B/trident bench --world 1 --only "$c" \
    --baseline-cmd "$TORCHRUN --nproc-per-node 1 bench/baseline_dist.py" --json "$O/bench-${c// /_}.json"
done
KEEP='passed|disagree|FAIL' run ops 60 $B/trident ops --backend nvidia --fast
KEEP='^grouped_gemm|rror|failed' KEEP_LINES=40 run bench-grouped-fp8 150 $B/trident bench \
  --baseline-cmd "$PY bench/baseline.py" --only "grouped_gemm f8e4m3fn" --config x128/8w --reps 10 --json "$O/bench-fp8.json"
left=$(( ${DEADLINE:-560} - ($(date +%s) - T0) ))
if [ "$left" -gt 150 ]; then
  KEEP='FAIL|rror|passed|failed|SKIP' torch_pytest python/tests/test_torch.py
else
  echo "== pytest: skipped (deadline)" >> "$S"
fi
tar czf "$O/logs.tgz" -C "$O" logs && rm -rf "$O/logs"
cat "$S"
