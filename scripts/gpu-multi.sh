#!/usr/bin/env bash
# The multi-GPU run (issue 13) on a machine with several GPUs (nvidia-h200-x2/-x4/-x8), over a
# bundle made by `cargo xtask bundle` (after `cargo xtask nvshmem-shim`):
#   1. every conformance case in the peer world (one process, a rank per GPU) at every world
#      size from 2 up to the GPU count (powers of two),
#   2. the NVSHMEM world (one process per GPU) at the same sizes, intra-node and inter-node
#      scope, and a planted dead rank (scripts/gpu-nvshmem.sh),
#   3. `trident bench --world W` at the largest size (BENCH_WORLDS to choose others): AG-GEMM,
#      GEMM-RS, AllReduce and AllGather against NCCL + cuBLAS under torchrun, timed before and
#      after trident in the same run (bench/baseline_dist.py).
# NVLink multicast stays off. On a machine with one GPU everything runs at world 1 (a check of
# this script and of the code paths, not communication figures). Results under $OUT.
#   ONLY=allreduce BENCH_WORLDS="2 8" scripts/gpu-multi.sh
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-gpu-out}; mkdir -p "$O/logs"
B=bundle
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TRIDENT_CACHE_DIR=$PWD/$B/cache
G=$(nvidia-smi -L | wc -l)
WORLDS=""; for W in 2 4 8 16; do [ $W -le $G ] && WORLDS="$WORLDS $W"; done
[ -z "$WORLDS" ] && WORLDS=1
LARGEST=${WORLDS##* }
{ date -u +%FT%TZ; cat $B/COMMIT; nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader;
  nvidia-smi topo -m 2>/dev/null | head -20; echo "worlds:$WORLDS"; } > "$O/multi.log"
for W in $WORLDS; do
  L="$O/logs/conformance-peer-world$W.log"; mkdir -p "$O/logs"
  start=$(date +%s%N)
  timeout ${LIMIT:-240} $B/trident test --backend nvidia --peer --world $W \
    --json "$O/logs/conformance-peer-world$W.json" > "$L" 2>&1
  rc=$?
  echo "== peer world of $W: rc=$rc, $(( ($(date +%s%N) - start) / 1000000 )) ms" >> "$O/multi.log"
  grep -E "peer world|conformance:|FAIL" "$L" | head -12 >> "$O/multi.log"
done
if [ "${NVSHMEM:-1}" = 1 ]; then
  # A dead rank needs another to notice: at world 1, two processes share the GPU.
  DEAD=$LARGEST; [ "$DEAD" = 1 ] && DEAD=2
  OUT="$O" WORLDS="$WORLDS" DEAD_WORLDS="$DEAD" LIMIT=${LIMIT:-240} scripts/gpu-nvshmem.sh > /dev/null 2>&1
  cat "$O/nvshmem.log" >> "$O/multi.log"
fi
mkdir -p "$O/logs"
PY=/opt/torch/.venv/bin
[ -x "$PY/torchrun" ] || PY=$(dirname "$(command -v torchrun || echo /usr/bin/torchrun)")
for W in ${BENCH_WORLDS:-$LARGEST}; do
  ONLYARG=(); [ -n "${ONLY:-}" ] && ONLYARG=(--only "$ONLY")
  # Clocks, power and the clock-event reasons of every GPU every 100 ms: the H200 caps its
  # power (700 W) and large GEMMs run at 1.0-1.6 GHz instead of 1.98 then, for trident and
  # the baseline alike (results/h200-issue13/power-7476bca).
  C="$O/logs/clocks-world$W.csv"
  nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv,noheader -lms 100 > "$C" 2>/dev/null & SMI=$!
  timeout ${BENCH_LIMIT:-500} $B/trident bench --world $W "${ONLYARG[@]}" --reps ${REPS:-20} \
    --baseline-cmd "$PY/torchrun --nproc-per-node $W --master-port 29531 bench/baseline_dist.py" \
    --json "$O/bench-world$W.json" > "$O/logs/bench-world$W.log" 2>&1
  echo "== trident bench --world $W: rc=$?" >> "$O/multi.log"
  kill $SMI 2>/dev/null
  # Busy samples (SM clock above idle): how many ran power-capped (reason bit 0x4), the lowest
  # clock.
  awk -F', ' '$3+0 > 500 { n++; if (index("4567cdefCDEF", substr($6, length($6))) > 0) capped++; c = $3+0; if (!lo || c < lo) lo = c }
    END { printf "clocks during the benchmark: %d busy samples, %d power-capped, lowest SM clock %d MHz\n", n, capped, lo }' \
    "$C" >> "$O/multi.log"
  grep -vE "^bench: (baseline|config)" "$O/logs/bench-world$W.log" | tail -60 >> "$O/multi.log"
done
(cd "$O" && tar czf multi-logs.tgz logs && rm -rf logs)
cat "$O/multi.log"
