#!/usr/bin/env bash
# moestream on the geometry of the llama.cpp figures in issue 6: a
# Qwen3-30B-A3B-shaped container of 24 layers, skewed (zipf) and
# near-uniform routing, cold, inside cgroup-v1 memory groups of 3 and 6 GB,
# with lookahead prefetch off and on. Appends to $CSV; prints the rows.
#
#   scripts/bench_qwen3_caps.sh
#
# Make the models with:
#   moestream synth --geometry qwen3-30b-a3b --layers 24 --out /work/q30b24
#   moestream synth --geometry qwen3-30b-a3b --layers 24 --routing uniform --out /work/q30b24u
set -euo pipefail
BIN=${BIN:-target/release/moestream}
TOKENS=${TOKENS:-32}
CSV=${CSV:-results/roofline-qwen3.csv}
rm -f "$CSV"
export MOESTREAM_NO_HISTORY=1
for model in ${MODELS:-/work/q30b24 /work/q30b24u}; do
  for cap in 3 6; do
    for prefetch in off on; do
      RAM_GB=$cap scripts/in_cgroup.sh $BIN bench decode --model "$model" --ram-gb "$cap" \
        --io direct --pipeline on --prefetch $prefetch --context 512 --tokens "$TOKENS" \
        --cold --csv "$CSV" 2>&1 | grep -E '^model=|cgroup peak' || true
    done
  done
done
