#!/usr/bin/env python3
"""Warm prefill A/B on one GGUF: moestream builds against each other and llama.cpp.

Each round runs every moestream binary given (LABEL=PATH) and llama.cpp on the
same file, warm, with the engines of scripts/bench_prefill_vs_llamacpp.py
(moestream: `run --prompts` of two prompts in one process, the second timed;
llama.cpp: the file in the page cache, its defaults, a first prompt, then the
timed one). Rounds alternate the order; medians are printed. Usage::

    python scripts/ab_prefill_warm.py FILE.gguf ROUNDS WORDS old=/path/to/old/moestream \\
        new=target/release/moestream

llama.cpp runs with its repacked weights (extra buffer types) unless
AB_LLAMA_REPACK=0 (plain mmap; on the 2026-12-07 AMX machine its repacked
Q4_K path crashed with SIGSEGV).
"""
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_prefill_vs_llamacpp as bp  # noqa: E402

gguf, rounds, words = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
bins = dict(a.split("=", 1) for a in sys.argv[4:])
REPACK = os.environ.get("AB_LLAMA_REPACK", "1") != "0"
res = {}
for r in range(rounds):
    order = list(bins.items()) + [("llama.cpp", None)]
    if r % 2:
        order = order[::-1]
    text, warm = bp.prompt(2 * r + 1, words), bp.prompt(2 * r + 2, words)
    for label, b in order:
        if b is None:
            os.system(f"cat {gguf} > /dev/null")
            out = bp.llama(gguf, None, warm, text, repack=REPACK)
        else:
            bp.MOESTREAM = b
            out = bp.moestream(gguf, None, warm, text)
        tps = out["prompt_tokens"] / out["prefill_s"]
        res.setdefault(label, []).append(tps)
        print(json.dumps({"round": r + 1, "engine": label, **out, "tok_s": round(tps, 1)}), flush=True)
for k, v in res.items():
    print(f"{k:12} prefill tok/s {', '.join(f'{x:.1f}' for x in v)} median {statistics.median(v):.1f}")
