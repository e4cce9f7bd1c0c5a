#!/usr/bin/env bash
# The NVSHMEM world on the GPU machine, over a bundle made by `cargo xtask bundle` (after
# `cargo xtask nvshmem-shim`, which the bundle carries in bundle/cache: this machine has no
# LLVM): every distributed conformance case in worlds of 1, 2 and 4 processes sharing the GPU
# (`trident launch`), with intra-node scope and with inter-node scope forced (NVSHMEM's device
# functions), then a planted dead rank at 2 and 4 processes (every other rank must end with a
# diagnostic within its bounds). NVSHMEM is the machine's Python wheel; one node, no remote
# transport, NVLink multicast off.
#   WORLDS="1 2" scripts/gpu-nvshmem.sh
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-gpu-out}; mkdir -p "$O"
B=bundle
LIB=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nvshmem/lib 2>/dev/null | head -1)
export TRIDENT_NVSHMEM_LIB=${TRIDENT_NVSHMEM_LIB:-$LIB/libnvshmem_host.so.3}
export LD_LIBRARY_PATH=$LIB:${LD_LIBRARY_PATH:-}
export TRIDENT_CACHE_DIR=$PWD/$B/cache
export NVSHMEM_REMOTE_TRANSPORT=none NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=lo NVSHMEM_DISABLE_NVLS=1
{ date -u +%FT%TZ; cat $B/COMMIT; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "NVSHMEM: $TRIDENT_NVSHMEM_LIB"; } > "$O/nvshmem.log"
for SCOPE in intra inter; do
  FLAG=""; [ $SCOPE = inter ] && FLAG="--inter-node"
  for W in ${WORLDS:-1 2 4}; do
    L="$O/logs/nvshmem-$SCOPE-world$W.log"; mkdir -p "$O/logs"
    start=$(date +%s%N)
    timeout ${LIMIT:-80} $B/trident launch -n $W -- $B/trident test --backend nvidia --processes $FLAG \
      --json "$O/logs/conformance-nvshmem-$SCOPE-world$W.json" > "$L" 2>&1
    rc=$?
    echo "== $SCOPE-node scope, world of $W processes: rc=$rc, $(( ($(date +%s%N) - start) / 1000000 )) ms" >> "$O/nvshmem.log"
    grep -E "conformance:|FAIL|rank [0-9]+ of|failed first" "$L" | head -12 >> "$O/nvshmem.log"
  done
done
for W in ${DEAD_WORLDS:-2 4}; do
  R=$((W - 1))
  start=$(date +%s%N)
  timeout 60 $B/trident launch -n $W --grace-ms 20000 -- $B/trident test --backend nvidia --processes \
    --kernel allgather --plant-dead-rank $R > "$O/logs/nvshmem-dead-world$W.log" 2>&1
  rc=$?
  echo "== planted dead rank $R of $W: rc=$rc (non-zero expected), $(( ($(date +%s%N) - start) / 1000000 )) ms" >> "$O/nvshmem.log"
  head -c 5000 "$O/logs/nvshmem-dead-world$W.log" >> "$O/nvshmem.log"
done
(cd "$O" && tar czf logs.tgz logs && rm -rf logs)
cat "$O/nvshmem.log"
