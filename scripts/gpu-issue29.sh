#!/usr/bin/env bash
# Issue 29's checks on the GPU machine, in one call, over `bundle/` (cargo xtask bundle): the
# expert-parallel all-to-all's conformance cases (low-latency and high-throughput, bf16 and
# FP8) in the loopback world of 1/2/4/8 ranks on the GPU and in NVSHMEM worlds of 1/2/4
# processes at intra- and inter-node scope; compute-sanitizer (memcheck, racecheck, synccheck)
# at world 2 (SANITIZE=0 leaves it out); then `trident bench --world 8` of it on the one GPU
# (ranks sharing it: DeepSeek-V3's decode shape and a prefill shape; BENCH=0 leaves it out).
# Writes $OUT/summary.txt, logs and bench-world8.json.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
KEEP='^conformance:|FAIL|skipped|rror'
KEEP_LINES=12
step conformance-loopback 300 $B/trident test --backend nvidia --kernel ep_all_to_all --json "$O/logs/loopback.json"
nvshmem_env
# Inter-node scope links NVSHMEM's device functions through the shim `cargo xtask nvshmem-shim`
# puts in bundle/cache (it needs the nvidia-nvshmem wheel's bitcode where the bundle is made).
SCOPES=${SCOPES:-intra}; [ -d $B/cache ] && SCOPES=${SCOPES/#intra/intra inter}
for SCOPE in $SCOPES; do
  FLAG=""; [ $SCOPE = inter ] && FLAG="--inter-node"
  for W in ${WORLDS:-1 2 4}; do
    step "nvshmem-$SCOPE-world$W" 120 $B/trident launch -n $W -- $B/trident test --backend nvidia --processes $FLAG \
      --kernel ep_all_to_all --json "$O/logs/nvshmem-$SCOPE-world$W.json"
  done
done
if [ "${SANITIZE:-1}" = 1 ]; then
  KEEP='clean|ERRORS|TIMEOUT|exit' step sanitize 400 env OUT="$O/logs/sanitize" TOOLS="memcheck racecheck synccheck" WORLDS=2 \
    KERNEL=ep_all_to_all SAN_LIMIT=130 LINEINFO=0 scripts/gpu-sanitize.sh
fi
if [ "${BENCH:-1}" = 1 ]; then
  KEEP='ep|rror|failed' KEEP_LINES=30 step bench-world8 300 $B/trident bench --world 8 --only ep_all_to_all \
    --json "$O/bench-world8.json"
fi
cat "$S"
