#!/usr/bin/env bash
# Issue 31's distributed flash decoding on the GPU machine, over `bundle/` and the wheel in
# bundle/wheels, in two calls (PART=a, PART=b) of under ten minutes each:
# a: the conformance case flash_decode_dist in the loopback world of 1/2/4/8 ranks and in
#    NVSHMEM worlds of 2 and 4 processes (intra- and inter-node scope); compute-sanitizer
#    (memcheck, racecheck, synccheck) on it at world 2; the torchrun test of the torch ops
#    (gemm_ar and flash_decode_dist among them).
# b: `trident bench --world 1` of flash_decode_dist and gemm_ar against the torchrun baseline
#    (SDPA's flash attention with its log-sum-exp + NCCL, cuBLAS + NCCL), then the loopback
#    world of 8 ranks (report only: the ranks share the GPU) of flash_decode_dist, gemm_ar and
#    allgather, each beside its steps run one after the other.
# c: the flash decoding sweep against SDPA and Triton, the world-1 distributed bench again,
#    GEMM-AR at world 8, the torch ops' test again.
# e: the flash decoding sweep alone (CONFIG: `--config`'s filter), every configuration's line.
# f: Nsight Compute on flash decoding's split stage, and the SASS of bundle/fd-*.cubin.
# g: the loopback world of 1 (and of 8 for gemm_ar), the flash decoding sweep (prefetching forms), the
#    torch ops' tests (the torchrun check among them) with TORCH=1.
# Writes $OUT/summary.txt, logs/ and the benchmark reports.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
KEEP='^conformance:|FAIL|skipped|rror|SUMMARY|PASS|passed|failed'
TORCHRUN=/opt/torch/.venv/bin/torchrun; [ -x "$TORCHRUN" ] || TORCHRUN=torchrun
# The wheel installed for the torch venv, then pytest (LIMIT seconds) on ARGS with NVSHMEM for
# the worlds of processes; $KEEP and $DROP pick the summary's lines as `step` does.
torch_tests() {
  local limit=$1; shift
  PYTHON=/opt/torch/.venv/bin/python
  TP=/tmp/trident-py; rm -rf $TP
  step install 60 $PYTHON -m pip install --no-deps --no-index --target $TP bundle/wheels/*.whl
  (
    nvshmem_env
    export PYTHONPATH=$TP
    step pytest "$limit" $PYTHON -m pytest -q -rs -s -p no:cacheprovider "$@"
  )
}
if [ "${PART:-a}" = a ]; then
  step loopback-flash_decode_dist 150 $B/trident test --backend nvidia --kernel flash_decode_dist \
    --json "$O/logs/loopback-flash_decode_dist.json"
  (
    nvshmem_env
    for W in 2 4; do
      step "nvshmem-world$W" 100 $B/trident launch -n $W -- $B/trident test --backend nvidia --processes \
        --kernel flash_decode_dist --dtype bf16 --json "$O/logs/nvshmem-world$W.json"
    done
    step nvshmem-internode-world2 100 $B/trident launch -n 2 -- $B/trident test --backend nvidia --processes \
      --inter-node --kernel flash_decode_dist --dtype bf16 --json "$O/logs/nvshmem-internode-world2.json"
  )
  export TRIDENT_WAIT_BOUND_MS=60000
  for tool in memcheck racecheck synccheck; do
    step "sanitize-$tool" 120 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 86 \
      --print-limit 20 $B/trident test --backend nvidia --world 2 --kernel flash_decode_dist --dtype bf16
  done
  unset TRIDENT_WAIT_BOUND_MS
  KEEP='PASS|FAIL|rror|passed|failed' KEEP_LINES=60 DROP='PASS (all_|reduce|CUDA|symm|ep_|tp_|ag_|gemm_rs|torch.ops.trident.(ag|gemm_rs))' torch_tests 240 python/tests/test_distributed_gpu.py
elif [ "$PART" = c ]; then
  # The flash decoding sweep (keys per step x warps) against SDPA and Triton; the distributed
  # form at world 1 against the torchrun baseline; GEMM-AR in the loopback world of 8 beside
  # GEMM then AllReduce; the torch ops' test again.
  KEEP='flash_decode|rror|failed' KEEP_LINES=80 step bench-flash-decode 300 $B/trident bench \
    --only flash_decode --baseline-cmd "/opt/torch/.venv/bin/python bench/baseline.py" --json "$O/bench-flash-decode.json"
  KEEP='flash_decode_dist|rror|failed|skipped' KEEP_LINES=40 step bench-world1 150 $B/trident bench --world 1 \
    --only flash_decode_dist --baseline-cmd "$TORCHRUN --nproc-per-node 1 bench/baseline_dist.py" \
    --json "$O/bench-flash-decode-dist-world1.json"
  KEEP='gemm_ar|rror|failed' KEEP_LINES=40 step bench-world8-gemm_ar 120 $B/trident bench --world 8 --only gemm_ar \
    --json "$O/bench-gemm_ar-world8.json"
  KEEP='PASS|FAIL|rror|passed|failed' KEEP_LINES=60 DROP='PASS (all_|reduce|CUDA|symm|ep_|tp_|ag_|gemm_rs|torch.ops.trident.(ag|gemm_rs))' torch_tests 120 python/tests/test_distributed_gpu.py
elif [ "$PART" = e ]; then
  # The split stage's memory pipeline: the whole flash decoding sweep (keys per step x warps x
  # the next block prefetched x the wave the splits fill) against SDPA and Triton.
  KEEP='flash_decode|rror|failed' KEEP_LINES=200 step bench-flash-decode 480 $B/trident bench \
    --only flash_decode ${CONFIG:+--config $CONFIG} --baseline-cmd "/opt/torch/.venv/bin/python bench/baseline.py" \
    --json "$O/bench-flash-decode.json"
elif [ "$PART" = f ]; then
  # Where the split stage's time goes: Nsight Compute's scheduler, warp-state and instruction
  # sections on one launch of it (1 x 32/8 heads x 128K keys), and the SASS of its loop
  # (bundle/fd-*.cubin, made by ptxas where the bundle was made).
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  for c in ${CONFIGS:-64n/8w/pf}; do
    tag=$(echo $c | tr / _)
    KEEP='Duration|Throughput|Issue Slots|Issued Warp|No Eligible|Eligible Warps|Active Warps|Warp Cycles|Executed Ipc|Occupancy|Registers|Block Limit|Executed Instructions|Shared Memory' \
      KEEP_LINES=60 step "ncu-$tag" 200 "$NCU" --kernel-name regex:flash_decode_split --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats \
      --section InstructionStats --section MemoryWorkloadAnalysis --section LaunchStats \
      $B/trident bench --only "flash_decode bf16 1 1 32 8 128 131072" --config "$c" --reps 1
  done
  for f in bundle/fd-*.cubin; do
    /usr/local/cuda/bin/cuobjdump -sass "$f" > "$O/logs/$(basename $f .cubin).sass" 2>&1
    echo "$f: $(grep -c '^        /\*[0-9a-f]*\*/' "$O/logs/$(basename $f .cubin).sass") SASS instructions" >> "$S"
  done
elif [ "$PART" = g ]; then
  # After the lowering's uniform vector guards, the prefetching split stage and GEMM-AR at any
  # M: every case at world 1, GEMM-AR in the loopback world of 8, flash decoding against SDPA
  # and Triton, the torch ops' tests.
  step conformance-world1 120 $B/trident test --backend nvidia --world 1 --json "$O/logs/conformance-world1.json"
  step conformance-world8-gemm_ar 60 $B/trident test --backend nvidia --world 8 --kernel gemm_ar
  KEEP='flash_decode|rror|failed' KEEP_LINES=40 DROP='config' step bench-flash-decode 100 $B/trident bench \
    --only flash_decode --config 64n/8w/pf --baseline-cmd "/opt/torch/.venv/bin/python bench/baseline.py" \
    --json "$O/bench-flash-decode.json"
  [ "${TORCH:-0}" = 1 ] && KEEP='FAIL|rror|passed|failed|gemm_ar' KEEP_LINES=30 torch_tests 100 \
    python/tests/test_distributed_gpu.py python/tests/test_torch.py -k "flash_decode or distributed"
elif [ "$PART" = d ]; then
  # After the accumulator-layout softmax: compute-sanitizer on flash decoding, its benchmark
  # (64 keys per step, 4 and 8 warps) against SDPA and Triton, the distributed form at world 1
  # against the torchrun baseline, the torch ops' test.
  export TRIDENT_WAIT_BOUND_MS=60000
  for tool in memcheck racecheck synccheck; do
    step "sanitize-$tool" 120 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 86 \
      --print-limit 20 $B/trident test --backend nvidia --world 2 --kernel flash_decode --dtype bf16
  done
  unset TRIDENT_WAIT_BOUND_MS
  KEEP='flash_decode|rror|failed' KEEP_LINES=40 DROP='config' step bench-flash-decode 240 $B/trident bench \
    --only flash_decode --config 64n/ --baseline-cmd "/opt/torch/.venv/bin/python bench/baseline.py" \
    --json "$O/bench-flash-decode.json"
  KEEP='flash_decode_dist|rror|failed|skipped' KEEP_LINES=40 DROP='^baseline' step bench-world1 150 $B/trident bench \
    --world 1 --only flash_decode_dist --baseline-cmd "$TORCHRUN --nproc-per-node 1 bench/baseline_dist.py" \
    --json "$O/bench-flash-decode-dist-world1.json"
  KEEP='FAIL|rror|passed|failed|flash_decode' KEEP_LINES=40 torch_tests 150 python/tests/test_distributed_gpu.py python/tests/test_torch.py -k "flash_decode or distributed"
else
  KEEP='flash_decode_dist|gemm_ar|rror|failed|skipped' KEEP_LINES=60 step bench-world1 240 $B/trident bench --world 1 \
    --only flash_decode_dist --baseline-cmd "$TORCHRUN --nproc-per-node 1 bench/baseline_dist.py" \
    --json "$O/bench-flash-decode-dist-world1.json"
  for k in flash_decode_dist gemm_ar allgather; do
    KEEP="$k|rror|failed" KEEP_LINES=40 step "bench-world8-$k" 200 $B/trident bench --world 8 --only $k \
      --json "$O/bench-$k-world8.json"
  done
fi
cat "$S"
