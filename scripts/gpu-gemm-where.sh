#!/usr/bin/env bash
# Where the Hopper GEMM's time goes, on the GPU machine over a bundle (`cargo xtask bundle`):
#  1. a K sweep at M = N = 4096 (and 8192 x 8192 x 4096): the time at K = 64 is one wave of
#     tiles' fixed cost (launch, pipeline fill, epilogue), the slope the cost per K step; cuBLAS
#     (`bench/baseline.py`) at the same shapes in the same run;
#  2. Nsight Compute (clocks left alone) on trident's default kernel and on cuBLAS's at 4096^3
#     (NCU_SHAPE for another):
#     speed of light, warp states, scheduler and memory sections;
#  3. the SASS of the default kernel.
#   CONFIGS="128x256x64/8w/4s/tma-store" NCU_SHAPE=8192x14336x4096 scripts/gpu-gemm-where.sh
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-gpu-out}; mkdir -p "$O"
B=bundle
PY=/opt/torch/.venv/bin/python; [ -x "$PY" ] || PY=python3
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
{ date -u +%FT%TZ; cat $B/COMMIT; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader; } > "$O/run.log"
cfg=()
for c in ${CONFIGS:-128x256x64/8w/4s/tma-store 128x256x64/8w/4s/tma-ws-store}; do cfg+=(--config "$c"); done
shapes=()
for s in ${SHAPES:-4096x4096x64 4096x4096x256 4096x4096x1024 4096x4096x4096 8192x8192x64 8192x8192x4096}; do shapes+=(--gemm "bf16:$s"); done
timeout 300 $B/trident bench --baseline-cmd "$PY bench/baseline.py" "${shapes[@]}" "${cfg[@]}" \
  --json "$O/ksweep.json" > "$O/ksweep.log" 2>&1
tail -12 "$O/ksweep.log" >> "$O/run.log"
NS=${NCU_SHAPE:-4096x4096x4096}; IFS=x read -r NM NN NK <<< "$NS"
SECTIONS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats"
timeout 120 "$NCU" --clock-control none -k regex:gemm_bf16 -c 1 $SECTIONS \
  $B/trident bench --gemm bf16:$NS --config "${NCU_CONFIG:-128x256x64/8w/4s/tma-store}" --reps 1 \
  > "$O/ncu-trident.txt" 2>&1
cat > /tmp/cublas.py <<'PY'
import torch
import sys
m, n, k = (int(v) for v in sys.argv[1:4])
a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    torch.matmul(a, b)
torch.cuda.synchronize()
PY
timeout 120 "$NCU" --clock-control none --launch-skip 3 -c 1 $SECTIONS "$PY" /tmp/cublas.py $NM $NN $NK > "$O/ncu-cublas.txt" 2>&1
grep -E "^  [a-zA-Z_].*\(|Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Shared Memory Config|Issue Slots Busy|No Eligible|Warp Cycles Per Issued" \
  "$O/ncu-trident.txt" "$O/ncu-cublas.txt" >> "$O/run.log"
$B/trident emit --backend nvidia --target sm_90a --kernel gemm --dtype bf16 --config 128x256x64/8w/4s \
  --descriptors --tma-store > /tmp/g.ptx
/usr/local/cuda/bin/ptxas -arch sm_90a -v /tmp/g.ptx -o /tmp/g.cubin >> "$O/run.log" 2>&1
/usr/local/cuda/bin/cuobjdump -sass /tmp/g.cubin | gzip > "$O/sass.txt.gz"
cat "$O/run.log"
