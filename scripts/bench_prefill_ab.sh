#!/usr/bin/env bash
# Cold prefill of one model by two moestream binaries, side by side: per
# round each binary once (the order reversed every other round), page
# cache dropped before each run, each run inside a RAM_GB memory cgroup
# (scripts/in_cgroup.sh). A prompt of LENGTH spread-out ids, one generated
# token, `run --ram-gb RAM_PLAN_GB` plus any EXTRA flags. Prints one JSON
# line per run and a markdown table of medians: prefill seconds, the
# profile's attention / expert matmul / disk-wait seconds, expert GB read,
# peak RSS, and the generated token (the same for both, or the change
# changed tokens). Needs root.
#
#   RAM_GB=5.5 scripts/bench_prefill_ab.sh BEFORE AFTER MODEL LENGTH ROUNDS RAM_PLAN_GB [EXTRA...]
set -euo pipefail
BEFORE=${1:?before binary} AFTER=${2:?after binary} MODEL=${3:?model}
LENGTH=${4:-2048} ROUNDS=${5:-2} PLAN=${6:-3}
shift $(( $# < 6 ? $# : 6 ))
RAM_GB=${RAM_GB:?set RAM_GB (the cgroup cap)}
export RAM_GB
cd "$(dirname "$0")/.."
IDS=$(python3 -c "print(','.join(str(100 + (i * 7919 + 104729) % 149900) for i in range($LENGTH)))")
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
for round in $(seq 1 "$ROUNDS"); do
  order=(before after)
  if (( round % 2 == 0 )); then order=(after before); fi
  for name in "${order[@]}"; do
    bin=$BEFORE; [ "$name" = after ] && bin=$AFTER
    sync && echo 3 > /proc/sys/vm/drop_caches
    MOESTREAM_NO_HISTORY=1 scripts/in_cgroup.sh "$bin" run --model "$MODEL" --prompt-ids "$IDS" \
      --max-tokens 1 --json --ram-gb "$PLAN" "$@" 2>/dev/null |
      tail -1 | python3 -c '
import json, sys
v = json.load(sys.stdin); s = v["stats"]
print(json.dumps({"round": int(sys.argv[1]), "bin": sys.argv[2], "token": v["token_ids"][0],
  "prefill_s": s["prefill_seconds"], "attention_s": s["attention_s"],
  "expert_matmul_s": s["expert_matmul_s"], "expert_disk_s": s["expert_disk_s"],
  "bytes_read": s["expert_bytes_read"], "peak_rss": s["peak_rss_bytes"]}))' \
      "$round" "$name" | tee -a "$rows"
  done
done
python3 - "$rows" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| binary | prefill s (runs) | median | attention s | expert matmul s | disk wait s | GB read | peak RSS GB | token |")
print("|---|---|---|---|---|---|---|---|---|")
for b in ("before", "after"):
    rs = [r for r in rows if r["bin"] == b]
    med = lambda k: statistics.median(r[k] for r in rs)
    runs = ", ".join(f"{r['prefill_s']:.1f}" for r in rs)
    toks = ",".join(sorted({str(r["token"]) for r in rs}))
    print(f"| {b} | {runs} | {med('prefill_s'):.1f} | {med('attention_s'):.1f} | {med('expert_matmul_s'):.1f} | "
          f"{med('expert_disk_s'):.1f} | {med('bytes_read') / 1e9:.2f} | {med('peak_rss') / 1e9:.2f} | {toks} |")
PY
