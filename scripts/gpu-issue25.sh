#!/usr/bin/env bash
# Issue 25's checks on the GPU machine, over a bundle made by `cargo xtask bundle`, in one call:
# gpu-check (self-test, the loopback worlds 1-8, ops, math at a coarse stride; no benchmarks),
# every collective recorded once and replayed 10 times in the loopback world of 2, every one
# re-armed after a planted timeout (short bounds), the ring AllGather of examples/ from the
# command line in the loopback world of 4 and in an NVSHMEM world of 2 processes (outputs
# compared byte for byte with the CPU world's on the same inputs), and ReduceScatter in the
# NVSHMEM world of 2. Writes $OUT/summary.txt and $OUT/all.tgz (logs, JSON, outputs).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
KEEP='conformance:|ops:|PASS|FAIL|rank [0-9]+:|identical|differ|skipped'
DROP='^exp|^log|^sin|^cos'
step gpu-check 200 env BENCH=0 MATH_STRIDE=4096 OUT="$O/check" bash scripts/gpu-check.sh
step replay-world2 60 $B/trident test --backend nvidia --world 2 --replay 10 --json "$O/logs/replay.json"
step rearm-world2 120 env TRIDENT_WAIT_BOUND_MS=300 TRIDENT_STREAM_WAIT_BOUND_MS=1000 \
  $B/trident test --backend nvidia --world 2 --rearm --json "$O/logs/rearm.json"
RING="--seed 7 --arg src=f32[3000] --arg chunk=3000 --arg epoch=call --repeat 2"
step ring-cpu-w4 30 $B/trident run examples/allgather_ring.tile --backend cpu --world 4 --chaos 5 $RING \
  --arg out=f32[12000]:zeros:symm --arg ready=u64[4]:zeros:symm --out "$O/ring/cpu-w4"
step ring-nvidia-w4 30 $B/trident run examples/allgather_ring.tile --backend nvidia --world 4 $RING \
  --arg out=f32[12000]:zeros:symm --arg ready=u64[4]:zeros:symm --out "$O/ring/nvidia-w4"
for r in 0 1 2 3; do
  cmp "$O/ring/cpu-w4/rank$r/out.npy" "$O/ring/nvidia-w4/rank$r/out.npy" && echo "ring w4 rank $r: identical to the CPU world's" >> "$S" \
    || echo "ring w4 rank $r: FAIL (differs from the CPU world's)" >> "$S"
done
# The NVSHMEM world of processes (gpu-nvshmem.sh's environment).
nvshmem_env
step ring-cpu-w2 30 $B/trident run examples/allgather_ring.tile --backend cpu --world 2 $RING \
  --arg out=f32[6000]:zeros:symm --arg ready=u64[2]:zeros:symm --out "$O/ring/cpu-w2"
step ring-nvshmem-w2 30 $B/trident launch -n 2 -- $B/trident run examples/allgather_ring.tile --backend nvidia --processes $RING \
  --arg out=f32[6000]:zeros:symm --arg ready=u64[2]:zeros:symm --out "$O/ring/nvshmem-w2"
for r in 0 1; do
  cmp "$O/ring/cpu-w2/rank$r/out.npy" "$O/ring/nvshmem-w2/rank$r/out.npy" && echo "ring nvshmem w2 rank $r: identical to the CPU world's" >> "$S" \
    || echo "ring nvshmem w2 rank $r: FAIL (differs from the CPU world's)" >> "$S"
done
step nvshmem-w2-reduce-scatter 45 $B/trident launch -n 2 -- $B/trident test --backend nvidia --processes \
  --kernel reduce_scatter --json "$O/logs/nvshmem-w2.json"
tar czf "$O/all.tgz" -C "$O" logs check ring 2>/dev/null
rm -rf "$O/logs" "$O/check" "$O/ring"
cat "$S"
