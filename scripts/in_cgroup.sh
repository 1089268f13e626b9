#!/usr/bin/env bash
# Runs a command inside a fresh cgroup-v1 memory group capped at RAM_GB
# (10^9 bytes; page cache included), then prints the group's peak usage and
# OOM kills on stderr. Without a writable memory controller it runs the
# command uncapped and says so.
#
#   RAM_GB=3.5 scripts/in_cgroup.sh target/release/moestream tune --model DIR
set -euo pipefail
RAM_GB=${RAM_GB:?set RAM_GB}
CG=/sys/fs/cgroup/memory/moestream-$$
LIMIT=$(python3 -c "print(int($RAM_GB * 1e9))")
if mkdir "$CG" 2>/dev/null && echo "$LIMIT" > "$CG/memory.limit_in_bytes"; then
  trap 'rmdir "$CG" 2>/dev/null || true' EXIT
  status=0
  sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$CG" "$@" || status=$?
  echo "cgroup peak $(cat "$CG/memory.max_usage_in_bytes") bytes (limit $LIMIT), oom kills $(grep -c 'oom_kill [1-9]' "$CG/memory.oom_control" || true)" >&2
  exit $status
else
  echo "no cgroup-v1 memory group: running uncapped" >&2
  exec "$@"
fi
