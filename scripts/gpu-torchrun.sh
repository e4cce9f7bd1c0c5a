#!/usr/bin/env bash
# The NVSHMEM world formed from torchrun's variables (rank 0 serves the rendezvous at
# MASTER_PORT + 1), 2 processes on the one GPU, intra and inter-node scope.
cd "$(dirname "$0")/.."  # the repository root; the bundle of `cargo xtask bundle` in bundle/
O=${OUT:-gpu-out}; mkdir -p $O
LIB=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nvshmem/lib | head -1)
export TRIDENT_NVSHMEM_LIB=$LIB/libnvshmem_host.so.3 LD_LIBRARY_PATH=$LIB TRIDENT_CACHE_DIR=$PWD/bundle/cache
export NVSHMEM_REMOTE_TRANSPORT=none NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=lo NVSHMEM_DISABLE_NVLS=1
for F in "" --inter-node; do
  echo "== torchrun --no-python --nproc-per-node 2 trident test --backend nvidia --processes $F" | tee -a $O/torchrun.log
  timeout 120 /opt/torch/.venv/bin/torchrun --no-python --nproc-per-node 2 --master-port 29517 bundle/trident test \
    --backend nvidia --processes $F > $O/torchrun-run.log 2>&1; echo "rc=$?" | tee -a $O/torchrun.log
  grep -E "conformance:|rank [0-9] of|FAIL|rror" $O/torchrun-run.log | head -12 | tee -a $O/torchrun.log
done
