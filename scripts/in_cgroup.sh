#!/usr/bin/env bash
# Runs a command inside a fresh cgroup-v1 memory group capped at RAM_GB
# (10^9 bytes; page cache included), then prints the group's peak usage and
# OOM kills on stderr. Without a writable memory controller it runs the
# command uncapped and says so.
#
# With DISK_MBS set, the command's reads of the disk holding DISK_DIR
# (default: the current directory) are also throttled to DISK_MBS MB/s
# (10^6 bytes) in a fresh cgroup-v1 blkio group: a slower disk than this
# one, emulated (a laptop's SATA SSD, a USB disk). Without a writable blkio
# controller that is an error, not a silent full-speed run.
#
#   RAM_GB=3.5 scripts/in_cgroup.sh target/release/moestream tune --model DIR
#   RAM_GB=3 DISK_MBS=1500 DISK_DIR=/work/q30r scripts/in_cgroup.sh moestream bench decode ...
set -euo pipefail
RAM_GB=${RAM_GB:?set RAM_GB}
CG=/sys/fs/cgroup/memory/moestream-$$
BLK=/sys/fs/cgroup/blkio/moestream-$$
LIMIT=$(python3 -c "print(int($RAM_GB * 1e9))")
cleanup() {
  rmdir "$CG" 2>/dev/null || true
  rmdir "$BLK" 2>/dev/null || true
}
trap cleanup EXIT
join_blkio=""
if [ -n "${DISK_MBS:-}" ]; then
  dev=$(stat -c '%d' "${DISK_DIR:-.}")
  majmin="$((dev >> 8)):$((dev & 255))"
  # A partition's throttle belongs to its whole disk.
  parent=$(basename "$(dirname "$(readlink -f "/sys/dev/block/$majmin")")")
  if [ -e "/sys/block/$parent/dev" ]; then majmin=$(cat "/sys/block/$parent/dev"); fi
  bps=$(python3 -c "print(int($DISK_MBS * 1e6))")
  if ! { mkdir "$BLK" && echo "$majmin $bps" > "$BLK/blkio.throttle.read_bps_device"; } 2>/dev/null; then
    echo "DISK_MBS=$DISK_MBS: no writable cgroup-v1 blkio controller for disk $majmin" >&2
    exit 2
  fi
  join_blkio="$BLK"
  echo "reads of disk $majmin throttled to $DISK_MBS MB/s" >&2
fi
if mkdir "$CG" 2>/dev/null && echo "$LIMIT" > "$CG/memory.limit_in_bytes"; then
  status=0
  # The command runs as a child (the group must outlive it to report its
  # peak), so a TERM or INT sent to this script is passed on to it and the
  # script waits for it to exit: a caller that stops a server through this
  # wrapper knows it has stopped (its KV saved, its port free).
  sh -c 'echo $$ > "$1/cgroup.procs"; if [ -n "$2" ]; then echo $$ > "$2/cgroup.procs"; fi; shift 2; exec "$@"' sh "$CG" "$join_blkio" "$@" &
  child=$!
  trap 'kill -TERM "$child" 2>/dev/null || true' TERM
  trap 'kill -INT "$child" 2>/dev/null || true' INT
  while kill -0 "$child" 2>/dev/null; do
    wait "$child" && status=0 || status=$?
  done
  echo "cgroup peak $(cat "$CG/memory.max_usage_in_bytes") bytes (limit $LIMIT), oom kills $(grep -c 'oom_kill [1-9]' "$CG/memory.oom_control" || true)" >&2
  exit $status
else
  echo "no cgroup-v1 memory group: running uncapped" >&2
  if [ -n "$join_blkio" ]; then echo $$ > "$join_blkio/cgroup.procs"; fi
  exec "$@"
fi
