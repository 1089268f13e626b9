#!/usr/bin/env bash
# Prefetch depth and pinning replayed on the four committed traces
# (tests/fixtures/traces/: the two routing presets, the two trained
# models) at about 10%, 25% and 50% residency, under --policy auto
# (results/policies.md). Prints two markdown tables:
# 1. each trace whole: misses, stalling misses and MB read per token with
#    prefetch none / attn and output guesses at depth 1 and 2 / oracle;
# 2. pinning: each run's first half as the usage history, its second half
#    replayed with 0, `history` (the store's own count), 25% and 50% of
#    the slots pinned: misses per token, ratio to Belady, and stalling
#    misses per token with the output guess at depth 1.
# Counts, not timings: any build gives the same figures. A version-1 trace
# (no guesses from two layers back: the presets) shows – for depth 2.
# Usage: scripts/replay_prefetch_pins.sh BIN   (BIN: a built moestream)
set -euo pipefail
BIN=${1:?moestream binary}
cd "$(dirname "$0")/.."
python3 - "$BIN" <<'PY'
import json, subprocess, sys
bin = sys.argv[1]
traces = [
    ("weak-locality preset", "weak-locality", "1,2,4"),
    ("strong-locality preset", "strong-locality", "6,16,32"),
    ("trained qwen3_moe", "trained-qwen3_moe", "3,8,16"),
    ("trained deepseek_v3", "trained-deepseek_v3", "3,8,16"),
]

def replay(trace, slots, prefetch="none", pin="none"):
    """The outcomes, or None for depth 2 on a trace without its guesses (version 1)."""
    p = subprocess.run(
        [bin, "replay", "--trace", f"tests/fixtures/traces/{trace}.parquet", "--slots", slots,
         "--policy", "auto", "--prefetch", prefetch, "--pin", pin, "--json"],
        capture_output=True, text=True)
    if p.returncode != 0 and prefetch.endswith(":2") and "version-1" in p.stderr:
        return None
    if p.returncode != 0:
        sys.exit(f"{bin} replay {trace} --prefetch {prefetch} --pin {pin}: {p.stderr}")
    return json.loads(p.stdout)["outcomes"]

def fmt(v, spec):
    return "–" if v is None else format(v, spec)

prefetches = ["none", "lookahead:attn", "lookahead:output", "lookahead:attn:2", "lookahead:output:2", "oracle"]
short = ["none", "attn-1", "output-1", "attn-2", "output-2", "oracle"]
print("Whole traces, `--policy auto`: stalling (demand) misses and MB read per token by prefetch.\n")
print("| trace | slots | misses | stalling misses: " + " / ".join(short) + " | MB/token: " + " / ".join(short[:-1]) + " |")
print("|---|---|---|---|---|")
for label, trace, slots in traces:
    got = {p: replay(trace, slots, p) for p in prefetches}
    for i, s in enumerate(slots.split(",")):
        rows = [got[p][i] if got[p] else None for p in prefetches]
        assert len({r["misses"] for r in rows if r}) == 1, "prefetch changed misses"
        stalls = " / ".join(fmt(r and r["demand_misses"], ",") for r in rows)
        mb = " / ".join(fmt(r and r["bytes_per_token"] / 1e6, ".3f") for r in rows[:-1])
        print(f"| {label} | {s} | {rows[0]['misses']:,} | {stalls} | {mb} |")

pins = ["0", "history", "25%", "50%"]
print("\nPinning, `--policy auto`: each run's first half is the usage history, its second half is replayed.\n")
print("| trace | slots | pinned per layer: " + " / ".join(pins) + " | misses/token | ÷ Belady | stalling misses/token, output-1 prefetch |")
print("|---|---|---|---|---|---|")
for label, trace, slots in traces:
    got = {p: replay(trace, slots, "lookahead:output", p) for p in pins}
    for i, s in enumerate(slots.split(",")):
        rows = [got[p][i] for p in pins]
        runs_layers = max(1, sum(rows[0]["ended"].values()))
        pinned = " / ".join(f"{r['pinned'] / runs_layers:.1f}" for r in rows)
        mpt = " / ".join(f"{r['misses_per_token']:.3f}" for r in rows)
        ratio = " / ".join(fmt(r["ratio_to_belady"], ".3f") for r in rows)
        stall = " / ".join(f"{r['demand_misses'] / r['tokens']:.3f}" for r in rows)
        print(f"| {label} | {s} | {pinned} | {mpt} | {ratio} | {stall} |")
PY
