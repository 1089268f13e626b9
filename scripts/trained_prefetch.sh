#!/usr/bin/env bash
# Disk-bound decode tok/s of the trained fixtures (results/policies.md):
# prefetch off / attn / output at depth 1 and 2 (under --policy auto), and
# --policy auto / least-stale / lfru (prefetch off), at --expert-cache 4 of
# 32 experts per layer, direct reads, no usage history. ROUNDS rounds; in
# each, every configuration of a model runs once, in turn, so slow spells
# of a busy machine fall on all of them. Prints a markdown table: per model
# and configuration, the median decode tok/s, its ratio to the first
# configuration (prefetch off, auto), MB read per token, prefetch reads
# used / issued, and whether the tokens equal the first configuration's.
# Usage: scripts/trained_prefetch.sh BIN [ROUNDS] [TOKENS]   (BIN: a release moestream)
set -euo pipefail
BIN=${1:?moestream binary}
ROUNDS=${2:-5}
TOKENS=${3:-128}
cd "$(dirname "$0")/.."
# The prompt of scripts/trained_speculation.sh (not corpus text).
PROMPT="When a function is called, its arguments are evaluated from left to right and bound to the names of its parameters. If a parameter has a default value, the argument may be omitted. The function returns a new object that"
CONFIGS=(
  "off|--prefetch off --policy auto"
  "attn-1|--prefetch on --prefetch-from attn --prefetch-depth 1 --policy auto"
  "output-1|--prefetch on --prefetch-from output --prefetch-depth 1 --policy auto"
  "attn-2|--prefetch on --prefetch-from attn --prefetch-depth 2 --policy auto"
  "output-2|--prefetch on --prefetch-from output --prefetch-depth 2 --policy auto"
  "least-stale|--prefetch off --policy least-stale"
  "lfru|--prefetch off --policy lfru"
)
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
for round in $(seq 1 "$ROUNDS"); do
  for model in qwen3_moe deepseek_v3; do
    for c in "${CONFIGS[@]}"; do
      name=${c%%|*} flags=${c#*|}
      # shellcheck disable=SC2086
      "$BIN" run "tests/fixtures/trained/$model" -p "$PROMPT" -n "$TOKENS" --ignore-eos \
        --expert-cache 4 --io direct --no-history $flags --json 2>/dev/null |
        python3 -c '
import hashlib, json, sys
d = json.load(sys.stdin); s = d["stats"]
print(json.dumps({"model": sys.argv[1], "config": sys.argv[2],
  "tok_s": (s["tokens"] - 1) / s["decode_s"],
  "mb_per_token": s["decode_bytes_read"] / max(s["tokens"] - 1, 1) / 1e6,
  "prefetch_used": s["prefetch_used"], "prefetch_issued": s["prefetch_issued"],
  "ids": hashlib.sha256(json.dumps(d["token_ids"]).encode()).hexdigest()[:16]}))' \
        "$model" "$name" >> "$rows"
    done
  done
done
python3 - "$rows" "$ROUNDS" "$TOKENS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{sys.argv[2]} rounds, {sys.argv[3]} tokens, --expert-cache 4 --io direct --no-history\n")
print("| model | configuration | decode tok/s (median) | ÷ off | MB/token | prefetch used / issued | tokens = off's |")
print("|---|---|---|---|---|---|---|")
for model in dict.fromkeys(r["model"] for r in rows):
    mine = [r for r in rows if r["model"] == model]
    configs = list(dict.fromkeys(r["config"] for r in mine))
    base = statistics.median(r["tok_s"] for r in mine if r["config"] == configs[0])
    base_ids = {r["ids"] for r in mine if r["config"] == configs[0]}
    for c in configs:
        rs = [r for r in mine if r["config"] == c]
        t = statistics.median(r["tok_s"] for r in rs)
        mb = statistics.median(r["mb_per_token"] for r in rs)
        used = statistics.median(r["prefetch_used"] for r in rs)
        issued = statistics.median(r["prefetch_issued"] for r in rs)
        same = "yes" if {r["ids"] for r in rs} == base_ids and len(base_ids) == 1 else "NO"
        print(f"| {model} | {c} | {t:.1f} | {t / base:.3f} | {mb:.2f} | {used:.0f} / {issued:.0f} | {same} |")
PY
