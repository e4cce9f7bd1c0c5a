#!/usr/bin/env bash
# The NVSHMEM world on the GPU machine, over a bundle made by `cargo xtask bundle`: every
# distributed conformance case in worlds of 1, 2 and 4 processes sharing the GPU
# (`trident launch`), then a planted dead rank at 2 and 4 processes (every other rank must end
# with a diagnostic within its bounds). NVSHMEM is the machine's Python wheel; one node, no
# remote transport, NVLink multicast off.
#   WORLDS="1 2" scripts/gpu-nvshmem.sh
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-gpu-out}; mkdir -p "$O"
B=bundle
LIB=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nvshmem/lib 2>/dev/null | head -1)
export TRIDENT_NVSHMEM_LIB=${TRIDENT_NVSHMEM_LIB:-$LIB/libnvshmem_host.so.3}
export LD_LIBRARY_PATH=$LIB:${LD_LIBRARY_PATH:-}
export NVSHMEM_REMOTE_TRANSPORT=none NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=lo NVSHMEM_DISABLE_NVLS=1
{ date -u +%FT%TZ; cat $B/COMMIT; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "NVSHMEM: $TRIDENT_NVSHMEM_LIB"; } > "$O/nvshmem.log"
for W in ${WORLDS:-1 2 4}; do
  start=$(date +%s%N)
  timeout 300 $B/trident launch -n $W -- $B/trident-conformance --backend nvidia --processes \
    --json "$O/conformance-nvshmem-world$W.json" > "$O/nvshmem-world$W.log" 2>&1
  rc=$?
  echo "== world $W processes: rc=$rc, $(( ($(date +%s%N) - start) / 1000000 )) ms" >> "$O/nvshmem.log"
  grep -E "conformance:|FAIL|rank [0-9]+ of|failed first" "$O/nvshmem-world$W.log" | head -20 >> "$O/nvshmem.log"
done
for W in ${DEAD_WORLDS:-2 4}; do
  R=$((W - 1))
  start=$(date +%s%N)
  timeout 120 $B/trident launch -n $W --grace-ms 20000 -- $B/trident-conformance --backend nvidia --processes \
    --kernel allgather --plant-dead-rank $R > "$O/nvshmem-dead-world$W.log" 2>&1
  rc=$?
  echo "== planted dead rank $R of $W: rc=$rc (non-zero expected), $(( ($(date +%s%N) - start) / 1000000 )) ms" >> "$O/nvshmem.log"
  head -c 6000 "$O/nvshmem-dead-world$W.log" >> "$O/nvshmem.log"
done
cat "$O/nvshmem.log"
