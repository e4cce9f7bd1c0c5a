#!/usr/bin/env bash
# Issue 31's second call on the GPU machine, over `bundle/` and the wheel in bundle/wheels:
# GEMM + AllReduce's conformance and benchmark (the split-K form) in the loopback world,
# compute-sanitizer on the new kernels at world 2 (memcheck, synccheck; racecheck on the LL
# AllGather), and the torch ops' tests of this issue (flash decoding, the AllGather and
# AllReduce that follow `auto`). Writes $OUT/summary.txt and logs/.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
KEEP='^conformance:|FAIL|skipped|rror|SUMMARY|passed|failed'
step loopback-gemm_ar 120 $B/trident test --backend nvidia --kernel gemm_ar --json "$O/logs/loopback-gemm_ar.json"
TORCHRUN=/opt/torch/.venv/bin/torchrun; [ -x "$TORCHRUN" ] || TORCHRUN=torchrun
KEEP='gemm_ar|rror|failed' KEEP_LINES=40 step bench-gemm-ar 200 $B/trident bench --world 1 --only gemm_ar \
  --baseline-cmd "$TORCHRUN --nproc-per-node 1 bench/baseline_dist.py" --json "$O/bench-gemm-ar.json"
export TRIDENT_WAIT_BOUND_MS=60000
SAN=/usr/local/cuda/bin/compute-sanitizer
for spec in "memcheck allgather_ll 2" "synccheck allgather_ll 2" "racecheck allgather_ll 2" \
  "memcheck gemm_ar 2" "synccheck gemm_ar 2" "memcheck flash_decode 1"; do
  set -- $spec
  step "sanitize-$1-$2" 100 $SAN --tool $1 --error-exitcode 86 --print-limit 20 \
    $B/trident test --backend nvidia --world $3 --kernel $2 --dtype bf16
done
unset TRIDENT_WAIT_BOUND_MS
PYTHON=/opt/torch/.venv/bin/python
TP=/tmp/trident-py; rm -rf $TP
step install 120 $PYTHON -m pip install --no-deps --no-index --target $TP bundle/wheels/*.whl
export PYTHONPATH=$TP TRIDENT_CACHE_DIR=$PWD/bundle/cache
LIB=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nvshmem/lib 2>/dev/null | head -1)
export TRIDENT_NVSHMEM_LIB=$LIB/libnvshmem_host.so.3 LD_LIBRARY_PATH=$LIB:${LD_LIBRARY_PATH:-}
export NVSHMEM_REMOTE_TRANSPORT=none NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=lo NVSHMEM_DISABLE_NVLS=1
step pytest 200 $PYTHON -m pytest -q -rs -p no:cacheprovider python/tests ${PYTEST_ARGS:--k "flash_decode or all_gather or all_reduce or allgather or allreduce"}
cat "$S"
