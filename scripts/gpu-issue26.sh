#!/usr/bin/env bash
# Issue 26's checks on the GPU machine, in one call, over `bundle/` (cargo xtask bundle) and the
# wheel built on the development machine into bundle/wheels (`cargo xtask bundle --wheel`): the wheel installed into
# torch's Python, pytest python/tests with torch on the H200, the launch overhead against
# Triton, and a cold and a warm start of a new process. Writes $OUT/summary.txt and logs.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
PYTHON=${PYTHON:-/opt/torch/.venv/bin/python}
KEEP='passed|failed|error|per launch|trident / triton|start|Error|FAIL|ALL PASS'
KEEP_LINES=30
TP=/tmp/trident-py; rm -rf $TP
step install 120 $PYTHON -m pip install --no-deps --no-index --target $TP bundle/wheels/*.whl
export PYTHONPATH=$TP
export TRIDENT_CACHE_DIR=$PWD/bundle/cache
# NVSHMEM for trident.distributed (gpu-nvshmem.sh's environment): torch's wheel's library.
LIB=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nvshmem/lib 2>/dev/null | head -1)
export TRIDENT_NVSHMEM_LIB=${TRIDENT_NVSHMEM_LIB:-$LIB/libnvshmem_host.so.3}
export LD_LIBRARY_PATH=$LIB:${LD_LIBRARY_PATH:-}
export NVSHMEM_REMOTE_TRANSPORT=none NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=lo NVSHMEM_DISABLE_NVLS=1
step pytest 400 $PYTHON -m pytest -q -rs -s -p no:cacheprovider python/tests ${PYTEST_ARGS:-}
step launch-overhead 120 $PYTHON python/bench/launch_overhead.py --out "$O/launch_overhead.json"
# A new process: compile + first launch, with empty caches (trident's and the driver's), then
# again with both warm.
COLD=$(mktemp -d)
START='import time; t0 = time.perf_counter(); import torch, trident; x = torch.ones(256, device="cuda"); t1 = time.perf_counter(); k = trident.compile("examples/gelu.tile", backend="nvidia"); k[1](x, x, 256); torch.cuda.synchronize(); t2 = time.perf_counter(); print(f"start: import+torch init {1e3*(t1-t0):.1f} ms, compile+first launch {1e3*(t2-t1):.1f} ms, from_disk={k.from_disk}")'
step start-cold 60 env TRIDENT_CACHE_DIR=$COLD CUDA_CACHE_PATH=$COLD/nv $PYTHON -c "$START"
step start-warm 60 env TRIDENT_CACHE_DIR=$COLD CUDA_CACHE_PATH=$COLD/nv $PYTHON -c "$START"
cat "$S"
