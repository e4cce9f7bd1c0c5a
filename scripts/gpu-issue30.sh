#!/usr/bin/env bash
# Issue 30's checks on the GPU machine, in one call, over `bundle/` (cargo xtask bundle): the
# MoE block's conformance cases (`moe_block`: the expert-parallel block over the low-latency and
# the high-throughput exchange) in the loopback world of 1/2/4/8 ranks and in NVSHMEM worlds of
# 1/2/4 processes; then `trident bench --world 1` of it against PyTorch's pipeline of the same
# math (`bench/baseline_dist.py`, torchrun of one process) at the DeepSeek-V3, Qwen3-30B-A3B and
# Mixtral shapes (BENCH=0 leaves it out), with the tensor-parallel block's stages alone against
# the plain grouped GEMMs (the overlap machinery) and the block against its stages one after the
# other; then `trident bench --world 4` in the loopback world (four ranks on the GPU, no
# baseline: report only), the overlapped block beside the sequential one (BENCH_WORLD4=0 leaves
# it out; ONLY_WORLD4 picks its cases, e.g. "moe_block bf16 128 ": about 100 s a shape;
# ONLY_WORLD1 picks the world-1 cases; CONFORMANCE=0 leaves the conformance runs out).
# Writes $OUT/summary.txt, logs, bench-world1.json and bench-world4.json.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
KEEP='^conformance:|FAIL|skipped|rror'
KEEP_LINES=12
if [ "${CONFORMANCE:-1}" = 1 ]; then
  step conformance-loopback 300 $B/trident test --backend nvidia --kernel moe_block --json "$O/logs/loopback.json"
  nvshmem_env
  for W in ${WORLDS:-1 2 4}; do
    step "nvshmem-world$W" 120 $B/trident launch -n $W -- $B/trident test --backend nvidia --processes \
      --kernel moe_block --json "$O/logs/nvshmem-world$W.json"
  done
fi
PY=/opt/torch/.venv/bin/python; [ -x "$PY" ] || PY=python3
TORCHRUN=/opt/torch/.venv/bin/torchrun; [ -x "$TORCHRUN" ] || TORCHRUN=torchrun
if [ "${BENCH:-1}" = 1 ]; then
  KEEP='moe|grouped/|rror|failed' KEEP_LINES=60 step bench-world1 420 $B/trident bench --world 1 --only "${ONLY_WORLD1:-moe_block}" \
    --baseline-cmd "$TORCHRUN --nproc-per-node 1 bench/baseline_dist.py" --json "$O/bench-world1.json"
  if [ "${BENCH_WORLD4:-1}" = 1 ]; then
    KEEP='moe|grouped/|rror|failed' KEEP_LINES=60 step bench-world4 300 $B/trident bench --world 4 --only "${ONLY_WORLD4:-moe_block}" \
      --json "$O/bench-world4.json"
  fi
fi
cat "$S"
