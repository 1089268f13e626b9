#!/usr/bin/env bash
# Held-out perplexity of containers converted with and without
# `--importance` (issue 30, item 3), per recipe, on the trained fixtures.
# The calibration text and the evaluation text are disjoint slices of the
# held-out corpus (scripts/moe_corpus.py --dump-heldout).
#
# Usage: scripts/importance_check.sh BIN HELDOUT.txt [MODEL_DIR...]
#   e.g. scripts/importance_check.sh target/release/moestream /tmp/heldout.txt
set -euo pipefail
bin=$1 heldout=$2
shift 2
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(tests/fixtures/trained/qwen3_moe tests/fixtures/trained/deepseek_v3)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
head -c 60000 "$heldout" > "$work/calib.txt"
tail -c 20000 "$heldout" > "$work/eval.txt"
ppl() { "$bin" eval --model "$1" --text "$work/eval.txt" --json 2>/dev/null | python3 -c 'import json,sys; print("%.3f" % json.load(sys.stdin)["perplexity"])'; }
echo "| model | recipe | importance | held-out ppl |"
echo "|---|---|---|---|"
for m in "${models[@]}"; do
  name=$(basename "$m")
  echo "| $name | (unconverted BF16) | | $(ppl "$m") |"
  "$bin" calibrate --model "$m" --text "$work/calib.txt" --out "$work/$name.imp" 2>/dev/null
  for recipe in default down8 g32 k4m tiny; do
    for imp in no yes; do
      out="$work/$name-$recipe-$imp"
      extra=()
      [ "$imp" = yes ] && extra=(--importance "$work/$name.imp")
      "$bin" convert --input "$m" --output "$out" --recipe "$recipe" --quiet "${extra[@]}" >/dev/null 2>&1
      echo "| $name | $recipe | $imp | $(ppl "$out") |"
      rm -rf "$out"
    done
  done
done
