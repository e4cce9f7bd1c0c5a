#!/usr/bin/env bash
# Per-kernel times of one distributed benchmark case under Nsight Compute, on the GPU machine,
# over `bundle/` (cargo xtask bundle): where a block's time goes, kernel by kernel. Runs
# `trident bench --world ${WORLD:-1} --only "$ONLY" --reps ${REPS:-1}` under
# `ncu --clock-control none --cache-control none` (clocks left alone, L2 not flushed between
# kernels, as the block runs them) and writes $OUT/ncu-<tag>.csv (one row per launch: name,
# grid, block, duration, DRAM bytes) and $OUT/ncu-<tag>.txt (the launches in order, one line
# each). ncu serializes launches: durations are per kernel, not the overlapped block's time.
#   ONLY="moe_block bf16 128 7168" scripts/gpu-ncu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-gpu-out}; mkdir -p "$O"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
tag=$(echo "${ONLY:?ONLY names a case}" | tr ' ' '_')
timeout "${NCU_LIMIT:-300}" "$NCU" --clock-control none --cache-control none \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv \
  bundle/trident bench --world "${WORLD:-1}" --only "$ONLY" --reps "${REPS:-1}" > "$O/ncu-$tag.csv" 2> "$O/ncu-$tag.err"
echo "ncu rc=$?" >> "$O/ncu-$tag.err"
# One line per launch: id, kernel, grid, block, microseconds, DRAM MB read.
python3 - "$O/ncu-$tag.csv" > "$O/ncu-$tag.txt" <<'PY'
import csv, sys
rows = {}
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
for r in csv.DictReader(lines):
    k = (r["ID"], r["Kernel Name"], r["Grid Size"], r["Block Size"])
    rows.setdefault(k, {})[r["Metric Name"]] = (r["Metric Unit"], r["Metric Value"].replace(",", ""))
def val(m, name, scale):
    unit, v = m.get(name, ("", "0"))
    f = float(v or 0)
    return f * {"ns": 1e-3, "us": 1, "usecond": 1, "msecond": 1e3, "ms": 1e3, "nsecond": 1e-3,
                "byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1, "Gbyte": 1e3}.get(unit, scale)
for (i, name, grid, block), m in sorted(rows.items(), key=lambda kv: int(kv[0][0])):
    us = val(m, "gpu__time_duration.sum", 1)
    mb = val(m, "dram__bytes_read.sum", 1e-6)
    print(f"{i:>5} {name[:40]:40} {grid:>16} {block:>12} {us:10.1f} us {mb:9.1f} MB read")
PY
tail -5 "$O/ncu-$tag.err"
