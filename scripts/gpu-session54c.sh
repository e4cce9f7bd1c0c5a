#!/usr/bin/env bash
# Session 54's third call on the GPU machine, over `bundle/`: traces whose stream operations are
# timed by CUDA events (no marker kernels around copies):
# 1. the AG-GEMM at world 1 traced (8192 x 14336 x 4096): it timed out at 550d459, where the
#    per-tile form's programs filled the GPU waiting for a copy bracketed by marker kernels;
# 2. the AG-GEMM in the loopback world of 4 traced again (the copy engine's copies on their
#    tracks, now timed by events);
# 3. GEMM-RS at world 1 traced (one rank on the GPU: tracing's cost with less noise than where
#    ranks share it).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
KEEP="ag_gemm|trace|rror|failed" KEEP_LINES=40 step trace-ag-w1 150 $B/trident bench --world 1 \
  --only "ag_gemm bf16 8192 14336 4096" --reps 10 --trace "$O/traces" --json "$O/bench-ag_gemm-world1.json"
KEEP="ag_gemm|trace|rror|failed" KEEP_LINES=40 step trace-ag-w4 150 $B/trident bench --world 4 \
  --only "ag_gemm bf16 8192 14336 4096" --reps 10 --trace "$O/traces" --json "$O/bench-ag_gemm-world4.json"
KEEP="gemm_rs|trace|rror|failed" KEEP_LINES=40 step trace-gemm_rs-w1 150 $B/trident bench --world 1 \
  --only "gemm_rs bf16 8192 4096 14336" --reps 10 --trace "$O/logs/traces-rs"
cat "$S"
