#!/usr/bin/env bash
# Routing presets calibrated to published models (results/routing.md,
# results/policies.md): builds a small model of each preset (4 layers,
# hidden 256, experts of 64, vocabulary 512; the preset's experts and
# top-k), records one greedy run of 400 tokens with every expert cached
# (the trace records the routing, not the cache), and replays it at
# 10-50% residency with every policy.
# Usage: scripts/routing_presets.sh BIN OUTDIR   (BIN: a built moestream)
set -euo pipefail
bin=$1 out=$2
mkdir -p "$out"
for preset in weak-locality:1,2,3,4 strong-locality:6,16,24,32; do
  name=${preset%%:*} slots=${preset#*:}
  rm -rf "$out/$name" "$out/$name.parquet"
  "$bin" synth --geometry qwen3-30b-a3b --routing "$name" --layers 4 --hidden 256 \
    --moe-inter 64 --vocab 512 --out "$out/$name"
  "$bin" run --model "$out/$name" --prompt-ids 17,4,250,33,101,9,77,300 --max-tokens 400 \
    --ignore-eos --expert-cache 64 --no-history --trace "$out/$name.parquet" --json > /dev/null
  echo "== $name"
  "$bin" replay --trace "$out/$name.parquet" --slots "$slots" \
    --policy lru,lfu,lfru,least-stale,arc,belady
done
