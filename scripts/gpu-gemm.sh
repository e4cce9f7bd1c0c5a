#!/usr/bin/env bash
# The Hopper GEMM on the GPU machine, over a bundle made by `cargo xtask bundle`: the benchmark
# sweep (every configuration without TMA, with TMA, with a producer warp, persistent, with a TMA
# store; cuBLAS and Triton timed before and after in the same run), the SASS of the default
# sm_90a kernel (HGMMA / UTMALDG counts, registers, spills), and racecheck/synccheck on the
# GEMM-shaped kernels. At most 8 files come back: logs are bundled in logs.tgz.
#   ONLY="gemm bf16" SANITIZE=0 scripts/gpu-gemm.sh
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-gpu-out}; mkdir -p "$O"
B=bundle
PY=/opt/torch/.venv/bin/python; [ -x "$PY" ] || PY=python3
{ date -u +%FT%TZ; cat $B/COMMIT; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > "$O/run.log"
for v in "" "--tma-store" "--persistent" "--warp-specialize --persistent --tma-store"; do
  $B/trident emit --backend nvidia --target sm_90a --kernel gemm --dtype bf16 --config 128x256x64/8w/4s \
    --descriptors $v > /tmp/g.ptx
  /usr/local/cuda/bin/ptxas -arch sm_90a -v /tmp/g.ptx -o /tmp/g.cubin 2>&1 | grep -E "registers|spill" >> "$O/run.log"
  /usr/local/cuda/bin/nvdisasm /tmp/g.cubin > /tmp/g.sass 2>&1
  { echo "== SASS 128x256x64 descriptors $v"; for op in HGMMA HMMA UTMALDG UTMASTG LDGSTS STG SYNCS; do
      echo "$op $(grep -c "$op" /tmp/g.sass)"; done; } >> "$O/run.log"
done
if [ "${SANITIZE:-1}" = 1 ]; then
  TOOLS="racecheck synccheck" WORLDS="1" KERNEL=gemm SAN_LIMIT=90 OUT=$O bash scripts/gpu-sanitize.sh > /dev/null 2>&1
  cat "$O/sanitize.txt" >> "$O/run.log" 2>/dev/null
fi
timeout 420 $B/trident bench --baseline-cmd "$PY bench/baseline.py" --only "${ONLY:-gemm}" --json "$O/bench.json" \
  > "$O/bench.log" 2> "$O/bench-configs.log"
tail -16 "$O/bench.log" >> "$O/run.log"
(cd "$O" && tar czf logs.tgz sanitize-*.log selftest.log 2>/dev/null; rm -f sanitize-*.log selftest.log)
cat "$O/run.log"
