#!/usr/bin/env bash
# Several of the one-call scripts (scripts/gpu-issue*.sh) in one device call, in order, each
# with an output folder of its own; their summaries are concatenated into $OUT/summary.txt and
# everything they wrote is packed into $OUT/outputs.tgz (few files come back from the device
# machine). Environment variables (BENCH, CHECKS, ...) reach every script.
#   scripts/gpu-batch.sh scripts/gpu-issue28.sh scripts/gpu-issue26.sh
set -uo pipefail
cd "$(dirname "$0")/.."
FINAL=${OUT:-gpu-out}
mkdir -p "$FINAL"
TMP=$(mktemp -d)
for s in "$@"; do
  name=$(basename "$s" .sh)
  mkdir -p "$TMP/$name"
  OUT="$TMP/$name" bash "$s" > "$TMP/$name/stdout.txt" 2>&1
  { echo "#### $name: rc=$?"; cat "$TMP/$name/summary.txt" 2>/dev/null; } >> "$FINAL/summary.txt"
  # Packed after each script, so a call cut short keeps what finished.
  tar czf "$FINAL/outputs.tgz" -C "$TMP" .
done
cat "$FINAL/summary.txt"
