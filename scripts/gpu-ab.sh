#!/usr/bin/env bash
# Two (or more) binaries' benchmark of the same cases, alternated in one call on the GPU
# machine: for each case of CASES (separated by `;`, each an `--only` filter of
# `trident bench`, e.g. "moe_block bf16 4096 4096 8 2 3584"), `trident bench --world WORLD
# --only CASE` with each of BINS in turn (default: bundle/trident-old bundle/trident, the
# binary of the commit before a change copied beside the bundle's), ROUNDS times (default 1),
# no vendor baseline (add BASELINE=1 for bench/baseline_dist.py under torchrun). Writes
# $OUT/ab.txt (per run: round, binary, case, the report's table) and a log per run.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-gpu-out}; mkdir -p "$O/logs"
export TRIDENT_CACHE_DIR=${TRIDENT_CACHE_DIR:-$PWD/bundle/cache}
BINS=${BINS:-bundle/trident-old bundle/trident}
TORCHRUN=/opt/torch/.venv/bin/torchrun; [ -x "$TORCHRUN" ] || TORCHRUN=torchrun
IFS=';' read -ra cases <<< "${CASES:?CASES names the cases, separated by ;}"
for round in $(seq "${ROUNDS:-1}"); do
  for case in "${cases[@]}"; do
    for bin in $BINS; do
      tag="r$round-$(basename "$bin")-$(echo "$case" | tr ' ' '_')"
      extra=()
      [ "${BASELINE:-0}" = 1 ] && extra=(--baseline-cmd "$TORCHRUN --nproc-per-node 1 bench/baseline_dist.py")
      t0=$(date +%s)
      timeout "${CASE_LIMIT:-200}" "$bin" bench --world "${WORLD:-1}" --only "$case" "${extra[@]}" > "$O/logs/$tag.log" 2>&1
      rc=$?
      { echo "== round $round, $bin, $case: rc=$rc, $(( $(date +%s) - t0 )) s"
        sed -n '/^case /,$p' "$O/logs/$tag.log"; } >> "$O/ab.txt"
    done
  done
done
