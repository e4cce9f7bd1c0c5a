#!/usr/bin/env bash
# Session 61, one call for what session 60's run left (its deadline cut it after the flash
# decoding benchmarks), in order of need within a deadline of 560 s (steps that would not fit
# are skipped, named in the summary): conformance in the loopback worlds of 4 and 8 (`moe_block
# tp-rows` across ranks among them); the tensor-parallel MoE block's rows form against its
# atomic form and PyTorch, and its down GEMM against the plain one (Qwen3-30B-A3B prefill,
# then DeepSeek-V3 prefill); the FP8 grouped benchmark (bulk row stores since session 58); the
# bf16 grouped SwiGLU cases session 60 did not reach; ops; pytest with torch.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
PY=/opt/torch/.venv/bin/python; [ -x "$PY" ] || PY=python3
TORCHRUN=/opt/torch/.venv/bin/torchrun; [ -x "$TORCHRUN" ] || TORCHRUN=torchrun
KEEP='^conformance:|FAIL|skipped|rror'
for w in 4 8; do
  run conformance-world$w 60 $B/trident test --backend nvidia --world $w
done
for c in "moe_block bf16 2048 2048" "moe_block bf16 4096 7168"; do
  KEEP='moe-tp|grouped/|rror|failed' KEEP_LINES=20 run "bench-${c// /_}" 110 $B/trident bench --world 1 --only "$c" \
    --baseline-cmd "$TORCHRUN --nproc-per-node 1 bench/baseline_dist.py" --json "$O/bench-${c// /_}.json"
done
KEEP='^grouped_gemm|rror|failed' KEEP_LINES=40 run bench-grouped-fp8 150 $B/trident bench \
  --baseline-cmd "$PY bench/baseline.py" --only "grouped_gemm f8e4m3fn" --config x128/8w --reps 10 --json "$O/bench-fp8.json"
# The fused SwiGLU cases that session 60's grouped benchmark did not reach.
for c in "grouped_gemm bf16 32 4096 7168 1024 0 2" "grouped_gemm bf16 16 1536 2048 1024 0 2" "grouped_gemm bf16 8 3584 4096 1024 0 2"; do
  KEEP='^grouped_gemm|rror|failed' KEEP_LINES=12 run "bench-${c// /_}" 45 $B/trident bench \
    --baseline-cmd "$PY bench/baseline.py" --only "$c" --config 128x256x64/8w --reps 10
done
KEEP='passed|disagree|FAIL' run ops 60 $B/trident ops --backend nvidia --fast
left=$(( ${DEADLINE:-560} - ($(date +%s) - T0) ))
if [ "$left" -gt 150 ]; then
  KEEP='FAIL|rror|passed|failed|SKIP' torch_pytest python/tests/test_torch.py
else
  echo "== pytest: skipped (deadline)" >> "$S"
fi
tar czf "$O/logs.tgz" -C "$O" logs && rm -rf "$O/logs"
cat "$S"
