#!/usr/bin/env bash
# Session 54's call on the GPU machine, over `bundle/` (the commit in bundle/COMMIT), with
# `bundle/trident-base` (68908ff: the persistent AG-GEMM without a producer warp) for the A/B:
# 1. the AG-GEMM with its wait in the producer warp on hardware: conformance at worlds 1, 2, 4
#    and 8, and a planted timeout at world 2 (`--rearm`: the last rank skips a call, the others'
#    producer waits time out with their diagnostics, then two calls re-armed);
# 2. the A/B, same call: loopback world of 4 (the persistent forms), then world 1 (one program
#    per tile against the persistent form, both bench shapes), base binary then new;
# 3. the loopback-4 traces of AG-GEMM and GEMM-RS (issue 32's, on whichever card), and
#    GEMM-RS traced with the base binary (tracing's cost before its start and end shared a
#    reservation);
# (What session 53's reuse-barrier elision had not run on hardware is scripts/gpu-session54b.sh's.)
# Writes $OUT/summary.txt, logs/ and the reports; tar the traces and logs to bring them back.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
KEEP='^conformance:|FAIL|rror|timed out'
for w in 1 2 4 8; do
  step "conformance-ag-w$w" 120 $B/trident test --backend nvidia --world $w --kernel ag_gemm
done
step conformance-grouped-w1 90 $B/trident test --backend nvidia --world 1 --kernel grouped_gemm
KEEP_LINES=12 TRIDENT_WAIT_BOUND_MS=300 step rearm-ag-w2 120 $B/trident test --backend nvidia --world 2 --kernel ag_gemm --dtype bf16 --rearm
for bin in trident-base trident; do
  KEEP='^bench: ag_gemm|rror|failed' KEEP_LINES=12 step "ag-w4-$bin" 120 $B/$bin bench --world 4 \
    --only "ag_gemm bf16 8192 14336 4096" --reps 10
  KEEP='^bench: ag_gemm|rror|failed' KEEP_LINES=12 step "ag-w1-$bin" 120 $B/$bin bench --world 1 --only ag_gemm --reps 10
done
# The traces (the new binary's: with the start and end events as one reservation), and
# GEMM-RS's traced time against its untraced with the base binary too (tracing's cost before).
for k in ag_gemm gemm_rs; do
  case $k in ag_gemm) c="ag_gemm bf16 8192 14336 4096";; gemm_rs) c="gemm_rs bf16 8192 4096 14336";; esac
  KEEP="$k|trace|rror|failed" KEEP_LINES=40 step "trace-$k" 200 $B/trident bench --world 4 --only "$c" --reps 10 \
    --trace "$O/traces" --json "$O/bench-$k-world4.json"
done
KEEP="gemm_rs|trace|rror|failed" KEEP_LINES=20 step "trace-gemm_rs-base" 200 $B/trident-base bench --world 4 \
  --only "gemm_rs bf16 8192 4096 14336" --reps 10 --trace "$O/logs/traces-base"
cat "$S"
