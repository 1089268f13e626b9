#!/usr/bin/env bash
# The expert cache's hit rate on a busy machine (issue 31, item 10): a
# 200-token greedy decode at a budget below the experts, idle and beside
# two `yes > /dev/null` CPU hogs, alternating binaries and conditions,
# ROUNDS rounds. Prints CSV: binary,condition,round,hit_rate,tok_s.
# Usage: scripts/busy_hit_rate.sh MODEL RAM_GB ROUNDS BIN...
set -euo pipefail
model=$1 ram=$2 rounds=$3
shift 3
echo "binary,condition,round,hit_rate,tok_s"
for r in $(seq 1 "$rounds"); do
  for bin in "$@"; do
    for cond in idle busy; do
      hogs=()
      if [ "$cond" = busy ]; then
        for _ in 1 2; do yes > /dev/null & hogs+=($!); done
      fi
      json=$(MOESTREAM_NO_HISTORY=1 "$bin" run --model "$model" --ram-gb "$ram" \
        --prompt-ids 5,9,2,7,11,3 --max-tokens 200 --ignore-eos --json 2>/dev/null)
      for p in "${hogs[@]}"; do kill "$p"; done
      wait 2>/dev/null || true
      echo "$json" | python3 -c "import json,sys; s=json.load(sys.stdin)['stats']; print('$bin,$cond,$r,%.3f,%.2f' % (s['expert_hit_rate'], s['tok_per_s']))"
    done
  done
done
