# Sourced by the GPU machine's one-call scripts (scripts/gpu-issue*.sh), from the repository's
# root: sets $O (the output folder: $OUT or gpu-out, with logs/ in it), $B (the bundle) and $S
# (the summary, begun with the date, the bundle's commit and the GPU); then
# `step NAME LIMIT COMMAND...` runs COMMAND under `timeout LIMIT` into $O/logs/NAME.log, then
# appends to the summary $S its exit code, its time and the log's lines matching $KEEP (at
# most $KEEP_LINES, 24 by default), less those matching $DROP when it is set; returns COMMAND's
# exit code. `run NAME LIMIT COMMAND...` is `step` within a deadline: its limit cut to what is
# left of `DEADLINE` seconds (560 unless set) from when this file was sourced, and skipped (named
# in the summary) when under 20 s are left. `nvshmem_env` exports what the NVSHMEM worlds need on
# the GPU machine.
O=${OUT:-gpu-out}; mkdir -p "$O/logs"
B=bundle
S="$O/summary.txt"
{ date -u +%FT%TZ; echo "commit: $(cat $B/COMMIT)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > "$S"
T0=$(date +%s)
run() {
  local name=$1 limit=$2; shift 2
  local left=$(( ${DEADLINE:-560} - ($(date +%s) - T0) ))
  [ "$left" -lt 20 ] && { echo "== $name: skipped (deadline)" >> "$S"; return 0; }
  [ "$limit" -gt "$left" ] && limit=$left
  step "$name" "$limit" "$@"
}
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
  return $rc
}

# NVSHMEM from the torch venv's wheel (unless TRIDENT_NVSHMEM_LIB is set), the bundle's cache
# (its device shim for inter-node scope), the worlds of processes on one node: no remote
# transport, the bootstrap over loopback, NVLink multicast off.
nvshmem_env() {
  LIB=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nvshmem/lib 2>/dev/null | head -1)
  export TRIDENT_NVSHMEM_LIB=${TRIDENT_NVSHMEM_LIB:-$LIB/libnvshmem_host.so.3}
  export LD_LIBRARY_PATH=$LIB:${LD_LIBRARY_PATH:-}
  export TRIDENT_CACHE_DIR=$PWD/$B/cache
  export NVSHMEM_REMOTE_TRANSPORT=none NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=lo NVSHMEM_DISABLE_NVLS=1
}

# `torch_pytest ARGS...`: installs the bundle's wheel (`cargo xtask bundle --wheel`) for the torch venv's Python (step
# `install`), then runs `pytest ARGS` with NVSHMEM's environment (step `pytest`, its lines
# matching $KEEP, default failures and the pass count, in the summary).
torch_pytest() {
  local python=/opt/torch/.venv/bin/python tp=/tmp/trident-py
  rm -rf $tp
  step install 60 $python -m pip install --no-deps --no-index --target $tp bundle/wheels/*.whl
  ( nvshmem_env; export PYTHONPATH=$tp
    KEEP=${KEEP:-'FAIL|rror|passed|failed'} KEEP_LINES=${KEEP_LINES:-30} step pytest 120 \
      $python -m pytest -q -rs -s -p no:cacheprovider "$@" )
}
