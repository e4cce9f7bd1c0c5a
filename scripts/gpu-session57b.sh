#!/usr/bin/env bash
# Session 57's second call: (1) issue 32, tracing's cost at the current commit: AG-GEMM
# (8192 x 14336 x 4096) and GEMM-RS (8192 x 4096 x 14336), each variant timed untraced, traced,
# untraced again, at world 1 twice (kernels of a millisecond or more, one rank on the GPU) and
# in the loopback world of 4 once (ranks share the GPU: report only); (2) issue 27, the FP8
# GEMMs against `torch._scaled_mm` in the same run: row-scaled at the bar's three shapes, then
# block-scaled at the DeepSeek-V3 shapes (no baseline: against the FP8 peak), with the SASS.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
for run in 1 2; do
  for c in "ag_gemm bf16 8192 14336 4096" "gemm_rs bf16 8192 4096 14336"; do
    k=${c%% *}
    KEEP="^bench: trace|rror|failed" KEEP_LINES=12 DROP=gather.json step "trace-$k-w1-$run" 150 $B/trident bench --world 1 \
      --only "$c" --reps 20 --trace "$O/traces-w1-$run" --json "$O/logs/bench-$k-w1-$run.json"
  done
done
for c in "ag_gemm bf16 8192 14336 4096" "gemm_rs bf16 8192 4096 14336"; do
  k=${c%% *}
  KEEP="^bench: trace|rror|failed" KEEP_LINES=12 step "trace-$k-w4" 150 $B/trident bench --world 4 \
    --only "$c" --reps 10 --trace "$O/traces-w4" --json "$O/logs/bench-$k-w4.json"
done
tar czf "$O/traces.tgz" -C "$O" traces-w1-1 traces-w1-2 traces-w4 && rm -rf "$O"/traces-w*
# The descriptor forms' SASS: FP8 GMMA (QGMMA ... E4M3) and ptxas's spill count.
for k in scaled_gemm_desc scaled_gemm_block_desc; do
  $B/trident emit --kernel $k --target sm_90a > "$O/logs/$k.ptx" &&
    /usr/local/cuda/bin/ptxas -v -arch=sm_90a "$O/logs/$k.ptx" -o "$O/logs/$k.cubin" 2> "$O/logs/$k.ptxas" &&
    /usr/local/cuda/bin/cuobjdump -sass "$O/logs/$k.cubin" > "$O/logs/$k.sass" &&
    echo "$k: GMMA: $(grep -cE '[HQ]GMMA' "$O/logs/$k.sass"), E4M3 QGMMA: $(grep QGMMA "$O/logs/$k.sass" | grep -c E4M3), $(grep -o '[0-9]* bytes spill stores' "$O/logs/$k.ptxas" | head -1)" >> "$S"
done
PY=/opt/torch/.venv/bin/python; [ -x "$PY" ] || PY=python3
KEEP='^scaled_gemm|^bench: scaled_gemm_row f8e4m3fn [0-9 ]*:|rror|failed' KEEP_LINES=12 step bench-scaled-row 240 $B/trident bench \
  --baseline-cmd "$PY bench/baseline.py" --only "scaled_gemm_row f8e4m3fn" --json "$O/bench-scaled-row.json"
KEEP='^scaled_gemm|rror|failed' KEEP_LINES=12 step bench-scaled-block 150 $B/trident bench \
  --baseline-cmd "$PY bench/baseline.py" --only "scaled_gemm_block" --json "$O/bench-scaled-block.json"
# (3) issue 31: where flash decoding's default spends its time: each launch (split, combine)
# timed alone beside the whole, at every bf16 shape of the benchmark.
KEEP='stage alone|^bench: flash_decode bf16 [0-9 ]*:|rror' KEEP_LINES=30 step fd-stages 200 $B/trident bench \
  --only "flash_decode bf16" --config 64n/8w/pf/w16 --reps 10
tar czf "$O/logs.tgz" -C "$O" logs && rm -rf "$O/logs"
cat "$S"
