# Sourced by the GPU machine's one-call scripts (scripts/gpu-issue*.sh):
# `step NAME LIMIT COMMAND...` runs COMMAND under `timeout LIMIT` into $O/logs/NAME.log, then
# appends to the summary $S its exit code, its time and the log's lines matching $KEEP (at
# most $KEEP_LINES, 24 by default), less those matching $DROP when it is set.
step() {
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s%N)
  timeout "$limit" "$@" > "$O/logs/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc, $(( ($(date +%s%N) - t0) / 1000000 )) ms" >> "$S"
  if [ -n "${DROP:-}" ]; then
    grep -E "$KEEP" "$O/logs/$name.log" | grep -Ev "$DROP" | head -"${KEEP_LINES:-24}" >> "$S"
  else
    grep -E "$KEEP" "$O/logs/$name.log" | head -"${KEEP_LINES:-24}" >> "$S"
  fi
}
