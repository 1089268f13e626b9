#!/usr/bin/env bash
# Decode against the I/O roofline (issue 6): every read mode x pipelining x
# lookahead prefetch, cold, inside a cgroup-v1 memory group of the budget,
# on a model whose experts are >= 4x the budget. Writes $OUT.csv and prints
# a markdown table.
#
#   roofline(token) = max(decode bytes per token / disk O_DIRECT GB/s,
#                         compute seconds per token with every expert in RAM)
#
# The disk figure is the best O_DIRECT cell of `bench io` at one expert's
# read size (depths 1 and 4); the compute figure is `bench decode --warmup`
# with every expert cached (no budget, no cgroup: needs RAM for the model).
#
#   MODEL=/work/glm5x6 RAM_GB=3.6 TOKENS=12 scripts/bench_roofline.sh
#
# Make the model with:
#   moestream synth --geometry glm5 --layers 6 --vocab 32768 --out /work/glm5x6
set -euo pipefail
BIN=${BIN:-target/release/moestream}
MODEL=${MODEL:-/work/glm5x6}
RAM_GB=${RAM_GB:-3.6}
TOKENS=${TOKENS:-12}
CONTEXT=${CONTEXT:-512}
MODES=${MODES:-direct buffered pread drop mmap}
OUT=${OUT:-results/roofline}
EXPERT_MIB=${EXPERT_MIB:-18}
CSV=$OUT.csv
rm -f "$CSV" "$OUT.compute.csv" "$OUT.disk.csv" "$OUT.failed" "$OUT.cgroup.log"
export MOESTREAM_NO_HISTORY=1

$BIN bench io --model "$MODEL" --modes direct --sizes-mib "$EXPERT_MIB" --depths 1,4 \
  --seconds 3 --csv "$OUT.disk.csv" >&2
$BIN bench decode --model "$MODEL" --io direct --expert-cache 100000 --warmup \
  --context "$CONTEXT" --tokens "$TOKENS" --pipeline on --prefetch off \
  --csv "$OUT.compute.csv" 2>/dev/null
for mode in $MODES; do
  for pipeline in on off; do
    for prefetch in on off; do
      RAM_GB=$RAM_GB scripts/in_cgroup.sh $BIN bench decode --model "$MODEL" \
        --ram-gb "$RAM_GB" --io "$mode" --pipeline $pipeline --prefetch $prefetch \
        --context "$CONTEXT" --tokens "$TOKENS" --cold --csv "$CSV" 2>>"$OUT.cgroup.log" \
        || echo "$mode,$pipeline,$prefetch,$(tail -2 "$OUT.cgroup.log" | head -1 | cut -c1-160)" >> "$OUT.failed"
    done
  done
done
python3 - "$OUT" <<'PY'
import csv, sys
out = sys.argv[1]
disk = max(float(r["gb_per_s"]) for r in csv.DictReader(open(out + ".disk.csv")))
comp = list(csv.DictReader(open(out + ".compute.csv")))[-1]
compute = float(comp["decode_s_per_tok"])
print(f"disk O_DIRECT {disk:.2f} GB/s (best of bench io); compute {compute:.3f} s/token "
      f"with every expert in RAM (hit rate {float(comp['hit_rate']):.3f})\n")
print("| mode | pipeline | prefetch | s/token | MB/token | roofline s/token | ratio | overlap | prefetch used/issued | recall | peak RSS MiB |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
import os
for r in csv.DictReader(open(out + ".csv")):
    s = float(r["decode_s_per_tok"]); mb = float(r["decode_mb_per_tok"])
    roof = max(mb / 1e3 / disk, compute)
    print(f"| {r['read_mode']} | {r['pipeline']} | {r['prefetch']} | {s:.3f} | {mb:.0f} | "
          f"{roof:.3f} | {s / roof:.2f} | {float(r['overlap']):.2f} | "
          f"{r['prefetch_used']}/{r['prefetch_issued']} | {r['recall_attn']} | {r['peak_rss_mib']} |")
if os.path.exists(out + ".failed"):
    for line in open(out + ".failed"):
        mode, pipeline, prefetch, why = line.rstrip("\n").split(",", 3)
        print(f"| {mode} | {pipeline} | {prefetch} | did not run: {why} | | | | | | | |")
PY
