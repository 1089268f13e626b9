#!/usr/bin/env bash
# Decode speed of every read mode, cold and warm, on a synthetic model whose
# experts are several times the RAM budget, each run inside a cgroup-v1 memory
# group capped at the budget (page cache included: buffered and mmap get no
# free RAM beyond it). Writes results/io-modes.csv and prints a markdown table.
#
#   MODEL=/work/q30b24 RAM_GB=1.8 TOKENS=32 scripts/bench_io_modes.sh
#
# Make the model with:
#   moestream synth --geometry qwen3-30b-a3b --layers 24 --out /work/q30b24
set -euo pipefail
BIN=${BIN:-target/release/moestream}
MODEL=${MODEL:-/work/q30b24}
RAM_GB=${RAM_GB:-1.8}
TOKENS=${TOKENS:-32}
CONTEXT=${CONTEXT:-512}
CSV=${CSV:-results/io-modes.csv}
CG=/sys/fs/cgroup/memory/moestream-bench-$$
LIMIT=$(python3 -c "print(int($RAM_GB * 1e9))")
use_cg=0
if mkdir "$CG" 2>/dev/null && echo "$LIMIT" > "$CG/memory.limit_in_bytes"; then
  use_cg=1
  trap 'rmdir "$CG" 2>/dev/null || true' EXIT
else
  echo "no cgroup-v1 memory group: runs are not capped (page cache unbounded)" >&2
fi
rm -f "$CSV" "$CSV.peaks"
for mode in direct buffered drop mmap pread; do
  for temp in cold warm; do
    flag=""; [ "$temp" = cold ] && flag="--cold"
    if [ $use_cg = 1 ]; then
      echo 0 > "$CG/memory.max_usage_in_bytes"
      sh -c "echo \$\$ > $CG/cgroup.procs; exec $BIN bench decode --model $MODEL --ram-gb $RAM_GB --io $mode --pipeline on --prefetch off --context $CONTEXT --tokens $TOKENS $flag --csv $CSV" 2>/dev/null
      echo "$mode,$temp,$(cat $CG/memory.max_usage_in_bytes),$(grep -c 'oom_kill [1-9]' $CG/memory.oom_control || true)" >> "$CSV.peaks"
    else
      $BIN bench decode --model $MODEL --ram-gb $RAM_GB --io $mode --pipeline on --prefetch off --context $CONTEXT --tokens $TOKENS $flag --csv $CSV 2>/dev/null
    fi
  done
done
python3 - "$CSV" "$use_cg" <<'PY'
import csv, sys, os
rows = list(csv.DictReader(open(sys.argv[1])))
peaks = {}
if sys.argv[2] == "1" and os.path.exists(sys.argv[1] + ".peaks"):
    for line in open(sys.argv[1] + ".peaks"):
        m, t, p, oom = line.strip().split(",")
        peaks[(m, t)] = (int(p), oom)
print("| mode | cache | slots/layer | decode tok/s | hit rate | engine MB/tok | device MB/tok | read latency mean / p99 ms | peak RSS MiB | cgroup peak MiB |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    t = "cold" if r["cold"] == "true" else "warm"
    p = peaks.get((r["read_mode"], t))
    cg = f"{p[0] / 2**20:.0f}" + (" (OOM)" if p and p[1] not in ("", "0") else "") if p else "-"
    print(f"| {r['read_mode']} | {t} | {r['slots']} | {r['decode_tok_s']} | {r['hit_rate']} | {r['read_mb_per_tok']} | {r['device_mb_per_tok']} | {r['lat_mean_ms']} / {r['lat_p99_ms']} | {r['peak_rss_mib']} | {cg} |")
PY
