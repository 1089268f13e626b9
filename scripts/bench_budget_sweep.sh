#!/usr/bin/env bash
# Cold decode across RAM budgets, in every read mode, each run inside a
# memory cgroup of its budget (scripts/in_cgroup.sh; page cache included),
# page cache dropped first. Budgets and modes alternate within a round, so
# drift in the machine spreads over all rows. One CSV row per run.
#
#   MODEL=/work/q30u ROUNDS=2 scripts/bench_budget_sweep.sh > results/budget-sweep.csv
#
# Needs root (drop_caches, cgroup). BINS lists the binaries to compare,
# alternating run by run, in reverse order on even rounds (on a VM, memory
# the previous run freed is cheaper to fault in again, which favours
# whichever runs second) (default: target/release/moestream); BUDGETS and
# MODES override the grid.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:?set MODEL to a container directory}
BINS=${BINS:-target/release/moestream}
ROUNDS=${ROUNDS:-2}
BUDGETS=${BUDGETS:-"2 3 4 6 8"}
MODES=${MODES:-"direct buffered drop mmap pread"}
TOKENS=${TOKENS:-16}
echo "bin,round,mode,ram_gb,slots,tok_per_s,decode_s,prefill_s,mb_per_token,hit_rate,peak_rss_mib,status"
for round in $(seq 1 "$ROUNDS"); do
  for mode in $MODES; do
    for gb in $BUDGETS; do
     order=$BINS
     if [ $((round % 2)) -eq 0 ]; then order=$(echo $BINS | tr ' ' '\n' | tac | tr '\n' ' '); fi
     for BIN in $order; do
      sync; echo 3 > /proc/sys/vm/drop_caches
      out=$(RAM_GB=$gb scripts/in_cgroup.sh "$BIN" run --model "$MODEL" \
        --prompt-ids 101,102,103,104,105,106,107,108 --max-tokens "$TOKENS" \
        --ignore-eos --temperature 0 --no-history --ram-gb "$gb" --io "$mode" \
        --json 2>/dev/null) || { echo "$BIN,$round,$mode,$gb,,,,,,,,failed"; continue; }
      echo "$out" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read().strip().splitlines()[-1])
s, c = r["stats"], r.get("config", {})
print(",".join(str(x) for x in [sys.argv[4], sys.argv[1], sys.argv[2], sys.argv[3], c.get("slots_per_layer", ""),
  round(s["tok_per_s"], 3), round(s.get("decode_s", 0), 3), round(s.get("prefill_seconds", 0), 3),
  round(s["bytes_read_per_token"] / 1e6, 1), round(s["expert_hit_rate"], 3),
  round(s["peak_rss_bytes"] / 2**20), "ok"]))' "$round" "$mode" "$gb" "$BIN"
     done
    done
  done
done
