#!/usr/bin/env bash
# Issue 24 on the GPU machine, over a bundle made by `cargo xtask bundle`: worlds of more ranks
# than one GPU's hardware queues served before. The self-test (its planted world of 32, the
# timed-out wait on a reused offset, and last a kernel that never ends on stream 1 of rank 3 of
# 16), then the whole conformance suite in loopback worlds of 2, 4, 8, 9, 12, 16 and 32 ranks
# (each passes, or is refused at once with the typed error), then a planted dead rank in a world
# of 4 NVSHMEM processes running GEMM-RS (the survivors' diagnostics name the kernel and the
# buffer). Each step has its own time limit; a hang shows as rc=124 with the time it took.
#   WORLDS="9 16" scripts/gpu-worlds.sh
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-gpu-out}; mkdir -p "$O"
B=bundle
L="$O/worlds.log"
{ date -u +%FT%TZ; echo "commit: $(cat $B/COMMIT)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > "$L"
step() { # name, limit, command...
  local name=$1 limit=$2; shift 2
  local start; start=$(date +%s%N)
  timeout "$limit" "$@" > "$O/step.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc, $(( ($(date +%s%N) - start) / 1000000 )) ms" | tee -a "$L"
  cat "$O/step.log" >> "$O/steps-full.log"
  grep -E "conformance:|refused|FAIL|PASS|ended after|named|unusable|stuck|timed out|died|rank [0-9]+ of" "$O/step.log" | head -${LINES_KEPT:-12} >> "$L"
}
step "self-test" 120 $B/trident selftest
for W in ${WORLDS:-2 4 8 9 12 16 32}; do
  step "loopback world $W" ${LIMIT:-150} $B/trident test --backend nvidia --world "$W" --json "$O/conformance-world$W.json"
done
if [ "${DEAD:-1}" = 1 ]; then
  LIB=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nvshmem/lib 2>/dev/null | head -1)
  export TRIDENT_NVSHMEM_LIB=${TRIDENT_NVSHMEM_LIB:-$LIB/libnvshmem_host.so.3} LD_LIBRARY_PATH=$LIB:${LD_LIBRARY_PATH:-}
  export NVSHMEM_REMOTE_TRANSPORT=none NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=lo NVSHMEM_DISABLE_NVLS=1
  LINES_KEPT=30 step "NVSHMEM world of 4, rank 3 dead, gemm_rs" 90 $B/trident launch -n 4 --grace-ms 20000 -- \
    $B/trident test --backend nvidia --processes --kernel gemm_rs --plant-dead-rank 3
fi
rm -f "$O/step.log"
gzip -f "$O/steps-full.log"
(cd "$O" && tar czf conformance-json.tgz conformance-world*.json 2>/dev/null && rm -f conformance-world*.json)
cat "$L"
