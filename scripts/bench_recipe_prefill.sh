#!/bin/bash
# Warm prefill of one synthetic BF16 checkpoint converted by two recipes,
# alternating, two rounds: prefill, expert-matmul and attention seconds of
# each run (results/long-prompts.md, "The default convert recipe prefills
# 3.6x slower"). Usage:
#   scripts/bench_recipe_prefill.sh BIN WORKDIR [PROMPT_TOKENS] [RECIPE_A] [RECIPE_B]
# WORKDIR gets bf16/ (moestream synth: the Qwen3-30B-A3B expert shape, 4
# layers, 64 experts, random weights) and one container per recipe.
set -euo pipefail
B=${1:?moestream binary}
W=${2:?work directory}
N=${3:-2048}
A=${4:-default}
R=${5:-row4}
[ -d "$W/bf16" ] || "$B" synth --out "$W/bf16" --hidden 2048 --layers 4 --experts 64 --top-k 8 --moe-inter 768
for r in "$A" "$R"; do
  [ -d "$W/$r" ] || "$B" convert --input "$W/bf16" --output "$W/$r" --recipe "$r" --quiet
done
IDS=$(python3 -c "
import json; v = json.load(open('$W/bf16/config.json'))['vocab_size']
print(','.join(str(1 + (i * 7919) % (v - 1)) for i in range($N)))")
for round in 1 2; do
  for r in "$A" "$R"; do
    echo -n "round $round $r: "
    "$B" run --model "$W/$r" --prompt-ids "$IDS" --max-tokens 1 --json --ram-gb 18 2>/dev/null |
      python3 -c "
import json, sys
s = json.load(sys.stdin)
s = s.get('stats', s)
print(' '.join(f'{k} {s[k]:.3f}' for k in ('prefill_seconds', 'expert_matmul_s', 'attention_s', 'other_s')))"
  done
done
