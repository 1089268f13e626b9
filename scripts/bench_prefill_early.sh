#!/usr/bin/env bash
# Cold prefill with early expert reads (`--prefill-early off|files|guess`,
# issue 28 item 2): per round, each setting once (the order reversed every
# other round), page cache dropped before each run, each run inside a
# RAM_GB memory cgroup (scripts/in_cgroup.sh). A prompt of LENGTH
# spread-out ids, one generated token. Prints one JSON line per run and a
# markdown table of medians: prefill seconds, seconds compute waited on
# reads (expert_disk_s), expert bytes read, early reads issued / used /
# unneeded. Needs root.
#
#   RAM_GB=1.5 scripts/bench_prefill_early.sh BIN MODEL LENGTH ROUNDS RAM_PLAN_GB
set -euo pipefail
BIN=${1:?moestream binary} MODEL=${2:?model} LENGTH=${3:-2048} ROUNDS=${4:-2} PLAN=${5:-1.5}
RAM_GB=${RAM_GB:?set RAM_GB (the cgroup cap)}
export RAM_GB
cd "$(dirname "$0")/.."
IDS=$(python3 -c "print(','.join(str(100 + (i * 7919 + 104729) % 149900) for i in range($LENGTH)))")
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
SETTINGS=(off files guess)
for round in $(seq 1 "$ROUNDS"); do
  order=("${SETTINGS[@]}")
  if (( round % 2 == 0 )); then order=(guess files off); fi
  for s in "${order[@]}"; do
    sync && echo 3 > /proc/sys/vm/drop_caches
    MOESTREAM_NO_HISTORY=1 scripts/in_cgroup.sh "$BIN" run --model "$MODEL" --prompt-ids "$IDS" \
      --max-tokens 1 --json --ram-gb "$PLAN" --prefill-early "$s" 2>/dev/null |
      tail -1 | python3 -c '
import json, sys
s = json.load(sys.stdin)["stats"]
print(json.dumps({"round": int(sys.argv[1]), "early": sys.argv[2],
  "prefill_s": s["prefill_seconds"], "expert_disk_s": s.get("expert_disk_s"),
  "bytes_read": s.get("expert_bytes_read"), "early_issued": s.get("early_issued"),
  "early_used": s.get("early_used"), "early_unneeded": s.get("early_unneeded")}))' \
      "$round" "$s" | tee -a "$rows"
  done
done
python3 - "$rows" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| --prefill-early | prefill s (runs) | median | expert_disk_s (median) | GB read | early issued / used / unneeded |")
print("|---|---|---|---|---|---|")
for s in dict.fromkeys(r["early"] for r in rows):
    rs = [r for r in rows if r["early"] == s]
    med = lambda k: statistics.median(r[k] or 0 for r in rs)
    runs = ", ".join(f"{r['prefill_s']:.2f}" for r in rs)
    print(f"| {s} | {runs} | {med('prefill_s'):.2f} | {med('expert_disk_s'):.2f} | "
          f"{med('bytes_read') / 1e9:.2f} | {med('early_issued'):.0f} / {med('early_used'):.0f} / {med('early_unneeded'):.0f} |")
PY
