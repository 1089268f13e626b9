#!/usr/bin/env bash
# Routing statistics and policy replay of the trained fixtures (results/trained.md):
# eight held-out paragraphs' first 24 words as prompts, 256 sampled tokens each,
# every expert cached (the trace records the routing, not the cache), then
# `moestream replay` at 10%, 25% and 50% residency (3, 8, 16 of 32 slots).
# Usage: scripts/trained_routing.sh BIN OUTDIR   (BIN: a built moestream)
set -euo pipefail
bin=$1 out=$2
mkdir -p "$out"
cd "$(dirname "$0")/.."
python3 scripts/moe_corpus.py --workdir "$out/corpus" --dump-heldout "$out/heldout.txt" > /dev/null
python3 - "$out" <<'PY'
import random, sys
out = sys.argv[1]
paras = [p.strip().replace("\n", " ") for p in open(f"{out}/heldout.txt").read().split("\n\n") if len(p.strip()) > 200]
random.seed(3)
with open(f"{out}/prompts8.txt", "w") as f:
    for p in random.sample(paras, 8):
        f.write(" ".join(p.split()[:24]) + "\n")
PY
for m in qwen3_moe deepseek_v3; do
  rm -f "$out/trace-$m.parquet"
  MOESTREAM_NO_HISTORY=1 "$bin" run --model tests/fixtures/trained/$m --prompts "$out/prompts8.txt" \
    -n 256 --temp 0.7 --seed 1 --expert-cache 32 --trace "$out/trace-$m.parquet" --json > /dev/null
  "$bin" replay --trace "$out/trace-$m.parquet" --slots 3,8,16 --policy lru,lfu,lfru,least-stale,arc,belady
done
