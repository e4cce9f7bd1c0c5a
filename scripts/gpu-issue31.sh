#!/usr/bin/env bash
# Issue 31's checks on the GPU machine, in one call, over `bundle/` (cargo xtask bundle): the
# flash decoding, GEMM + AllReduce and low-latency AllGather conformance cases in the loopback world of 1/2/4/8 ranks
# and in NVSHMEM worlds of 1/2/4 processes (CONFORMANCE=0 leaves them out); compute-sanitizer
# (memcheck, racecheck, synccheck) on both at world 2 (SANITIZE=0 leaves it out); then
# `trident bench --only flash_decode` against SDPA and the Triton split-KV kernel
# (`bench/baseline.py`) and `trident bench --world 1 --only gemm_ar` against cuBLAS + NCCL
# (`bench/baseline_dist.py` under torchrun of one process) (BENCH=0 leaves both out).
# Writes $OUT/summary.txt, logs/, bench-flash-decode.json and bench-gemm-ar.json.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
KEEP='^conformance:|FAIL|skipped|rror|SUMMARY'
KERNELS=${KERNELS:-flash_decode gemm_ar allgather_ll}
if [ "${CONFORMANCE:-1}" = 1 ]; then
  for k in $KERNELS; do
    step "loopback-$k" 240 $B/trident test --backend nvidia --kernel "$k" --json "$O/logs/loopback-$k.json"
  done
  (
    nvshmem_env
    for W in ${WORLDS:-1 2 4}; do
      for k in gemm_ar allgather_ll; do
        step "nvshmem-$k-world$W" 120 $B/trident launch -n $W -- $B/trident test --backend nvidia --processes \
          --kernel "$k" --json "$O/logs/nvshmem-$k-world$W.json"
      done
    done
  )
fi
if [ "${SANITIZE:-1}" = 1 ]; then
  export TRIDENT_WAIT_BOUND_MS=60000
  for k in $KERNELS; do
    for tool in memcheck racecheck synccheck; do
      step "sanitize-$tool-$k" 180 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 86 \
        --print-limit 20 $B/trident test --backend nvidia --world 2 --kernel "$k"
    done
  done
  unset TRIDENT_WAIT_BOUND_MS
fi
PY=/opt/torch/.venv/bin/python; [ -x "$PY" ] || PY=python3
TORCHRUN=/opt/torch/.venv/bin/torchrun; [ -x "$TORCHRUN" ] || TORCHRUN=torchrun
if [ "${BENCH:-1}" = 1 ]; then
  KEEP='flash_decode|gemm_ar|rror|failed' KEEP_LINES=60 step bench-flash-decode 300 $B/trident bench \
    --only flash_decode --baseline-cmd "$PY bench/baseline.py" --json "$O/bench-flash-decode.json"
  # The AllGather forms (copy engine, push, low-latency) in the loopback world of 4 ranks on
  # the GPU: report only (the ranks share the GPU's memory system, no NVLink).
  KEEP='allgather|rror|failed' KEEP_LINES=40 step bench-allgather-world4 150 $B/trident bench --world 4 \
    --only allgather --json "$O/bench-allgather-world4.json"
  KEEP='gemm_ar|rror|failed' KEEP_LINES=60 step bench-gemm-ar 300 $B/trident bench --world 1 --only gemm_ar \
    --baseline-cmd "$TORCHRUN --nproc-per-node 1 bench/baseline_dist.py" --json "$O/bench-gemm-ar.json"
fi
cat "$S"
