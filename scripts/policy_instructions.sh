#!/usr/bin/env bash
# What `--policy auto`'s ghost caches cost, in instructions (deterministic,
# unlike tok/s on a busy machine): a short greedy decode of each trained
# fixture at --expert-cache 4 of 32 under valgrind's callgrind, once per
# policy (auto, least-stale, lfru), prefetch off, no usage history.
# Prints a markdown table: total instructions of the run, and of them the
# ones inside the policies' fetch hook (`Evictor::on_fetch`, where auto
# runs its ghosts; inclusive) and inside `SlotCache` methods called from it.
# Usage: scripts/policy_instructions.sh BIN [TOKENS]   (BIN: a release moestream)
set -euo pipefail
BIN=${1:?moestream binary}
TOKENS=${2:-32}
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
PROMPT="When a function is called, its arguments are evaluated from left to right and bound to the names of its parameters."
echo "| model | policy | instructions (total) | in on_fetch (inclusive) | share | tokens (sha256) |"
echo "|---|---|---|---|---|---|"
for model in qwen3_moe deepseek_v3; do
  for policy in least-stale lfru auto; do
    f="$out/$model-$policy.cg"
    valgrind --tool=callgrind --callgrind-out-file="$f" "$BIN" run "tests/fixtures/trained/$model" \
      -p "$PROMPT" -n "$TOKENS" --ignore-eos --expert-cache 4 --io buffered --prefetch off \
      --no-history --policy "$policy" --json > "$out/run.json" 2> "$out/vg.log"
    ids=$(python3 -c 'import hashlib, json, sys; print(hashlib.sha256(json.dumps(json.load(open(sys.argv[1]))["token_ids"]).encode()).hexdigest()[:12])' "$out/run.json")
    callgrind_annotate --inclusive=yes --threshold=100 "$f" > "$out/ann.txt" 2> /dev/null
    python3 - "$out/ann.txt" "$model" "$policy" "$ids" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
num = lambda s: int(s.replace(",", ""))
total = num(re.search(r"^\s*([\d,]+).*PROGRAM TOTALS", text, re.M).group(1))
# Every function whose name is some policy's on_fetch (inclusive counts).
hook = 0
for m in re.finditer(r"^\s*([\d,]+) \([^)]*\)\s+(\S.*)$", text, re.M):
    name = m.group(2)
    if "on_fetch" in name and "policy" in name:
        hook = max(hook, num(m.group(1)))
print(f"| {sys.argv[2]} | {sys.argv[3]} | {total:,} | {hook:,} | {100 * hook / total:.2f}% | {sys.argv[4]} |")
PY
  done
done
