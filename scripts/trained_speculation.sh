#!/usr/bin/env bash
# Speculation on the trained fixtures (results/trained-speculation.md):
# acceptance per draft position, tokens per verify step and decode tok/s
# with --speculate off|ngram|mtp|auto at --expert-cache 4 (of 32 experts
# per layer), direct reads, ROUNDS alternating rounds. One JSON line per
# run on stdout. Usage: scripts/trained_speculation.sh BIN [ROUNDS] [TOKENS]
set -euo pipefail
BIN=${1:?moestream binary}
ROUNDS=${2:-2}
TOKENS=${3:-128}
# Written for this measure in the style of Python's documentation (not a
# corpus passage: the corpus is the docs themselves, so any quote of them
# could be training text).
PROMPT="When a function is called, its arguments are evaluated from left to right and bound to the names of its parameters. If a parameter has a default value, the argument may be omitted. The function returns a new object that"
for round in $(seq 1 "$ROUNDS"); do
  for model in qwen3_moe deepseek_v3; do
    modes="off ngram auto"
    [ "$model" = deepseek_v3 ] && modes="off ngram mtp auto"
    for mode in $modes; do
      "$BIN" run "tests/fixtures/trained/$model" -p "$PROMPT" -n "$TOKENS" --ignore-eos \
        --expert-cache 4 --io direct --no-history --speculate "$mode" --draft 4 --json 2>/dev/null |
        python3 -c '
import hashlib, json, sys
d = json.load(sys.stdin); s = d["stats"]; sp = s.get("speculation") or {}
g = sp.get("gate") or {}
acc = [a / n if n else 0 for a, n in zip(sp.get("accepted_at", []), sp.get("drafted_at", []))]
print(json.dumps({"round": int(sys.argv[1]), "model": sys.argv[2], "mode": sys.argv[3],
  "tokens": s["tokens"], "decode_tok_s": (s["tokens"] - 1) / s["decode_s"],
  "decode_mb_per_token": s["decode_bytes_read"] / max(s["tokens"] - 1, 1) / 1e6,
  "drafted": sp.get("drafted", 0), "accepted": sp.get("accepted", 0),
  "acceptance_at": [round(a, 3) for a in acc],
  "tokens_per_verify": sp["tokens"] / sp["steps"] if sp.get("steps") else None,
  "gate": {k: g[k] for k in ("on_steps", "off_steps", "probes", "turned_off", "turned_on", "switched", "drafter", "gain", "time_ratio", "bytes_ratio") if k in g},
  "drafters": {d["name"]: {"asked": d["asked"], "gain": d["gain"], "time_ratio": d["time_ratio"]} for d in g.get("drafters", [])},
  "ids_sha256": hashlib.sha256(json.dumps(d["token_ids"]).encode()).hexdigest()[:16]}))' "$round" "$model" "$mode"
    done
  done
done
