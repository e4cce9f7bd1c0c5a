#!/usr/bin/env bash
# Issue 27's checks on the GPU machine, over `bundle/` (cargo xtask bundle): every FP8 case of
# the differential test on the H200 (casts from every FP8 pattern, casts to FP8 on the boundary
# sets, select), with the PTX of sm_90a (hardware `cvt ... e4m3x2`) and of sm_80 (integer
# conversions), and the whole op matrix once more so that nothing else moved; the scaled FP8
# GEMM's conformance cases (the portable form, FP8 on the f16 atoms, and the descriptor form:
# TMA and `wgmma ... .e4m3`); the SASS of the descriptor form (QGMMA on E4M3); then the
# benchmark of the scaled GEMMs against `torch._scaled_mm` in the same run. Writes
# $OUT/summary.txt, logs and bench.json.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/step.sh
KEEP='^ops:|^conformance:|FAIL|skipped'
KEEP_LINES=12
# CHECKS=0 leaves out the op matrix and the conformance cases (a benchmark-only run).
if [ "${CHECKS:-1}" = 1 ]; then
for t in sm_90a sm_80; do
  for d in f8e4m3fn f8e5m2; do
    step "ops-$t-from-$d" 120 $B/trident ops --backend nvidia --target $t --dtype $d --json "$O/logs/ops-$t-$d.json"
  done
  step "ops-$t-to-f8" 120 $B/trident ops --backend nvidia --target $t --op cast.f8 --json "$O/logs/ops-$t-to-f8.json"
done
step ops-all-sm_90a 300 $B/trident ops --backend nvidia --json "$O/logs/ops-all.json"
# The scaled FP8 GEMM's conformance cases on the GPU (portable and descriptor forms).
step conformance-scaled-gemm 120 $B/trident test --backend nvidia --kernel scaled_gemm --json "$O/logs/scaled-gemm.json"
fi
# The descriptor form's SASS: the tensor cores' FP8 instruction (QGMMA ... E4M3; HGMMA is the 16-bit one), how many conversion instructions
# there are (the epilogue's f32 -> bf16 included), and ptxas's spill count (the issue asks for none).
sass() {
  for k in scaled_gemm_desc scaled_gemm_block_desc; do
    $B/trident emit --kernel $k --target sm_90a > "$O/logs/$k.ptx" &&
      /usr/local/cuda/bin/ptxas -v -arch=sm_90a "$O/logs/$k.ptx" -o "$O/logs/$k.cubin" 2> "$O/logs/$k.ptxas" &&
      /usr/local/cuda/bin/cuobjdump -sass "$O/logs/$k.cubin" > "$O/logs/$k.sass" &&
      echo "$k: GMMA: $(grep -cE '[HQ]GMMA' "$O/logs/$k.sass"), E4M3 QGMMA: $(grep QGMMA "$O/logs/$k.sass" | grep -c E4M3), F2FP/I2F conversions: $(grep -cE 'F2FP|I2F|HADD2.F32' "$O/logs/$k.sass"), $(grep -o '[0-9]* bytes spill stores' "$O/logs/$k.ptxas" | head -1)"
  done
}
# (`timeout` runs programs, not shell functions: the function goes to a shell of its own.)
KEEP='GMMA|rror' step sass 60 bash -c "$(declare -f sass); B='$B' O='$O' sass"
# The benchmark (a few minutes; BENCH=0 leaves it out). ONLY narrows the cases (a key prefix:
# "scaled_gemm_row f8e4m3fn" is the row-scaled cases the issue's bar names), CONFIGS the sweep
# (space-separated parts of configuration names, as `--config` takes them).
PY=/opt/torch/.venv/bin/python; [ -x "$PY" ] || PY=python3
if [ "${BENCH:-1}" = 1 ]; then
  CFG=(); for c in ${CONFIGS:-}; do CFG+=(--config "$c"); done
  KEEP='scaled_gemm|rror|failed' KEEP_LINES=40 step bench-scaled-gemm ${BENCH_LIMIT:-480} $B/trident bench \
    --baseline-cmd "$PY bench/baseline.py" --only "${ONLY:-scaled_gemm}" "${CFG[@]}" --json "$O/bench.json"
fi
cat "$S"
