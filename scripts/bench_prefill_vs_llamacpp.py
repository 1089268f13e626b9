#!/usr/bin/env python3
"""Prefill of a ~512-token prompt: moestream against llama.cpp, warm and cold.

Issue 18's prefill target, on the same Qwen3-30B-A3B geometry: moestream runs
its int4 container (--model), llama.cpp the Q4_0 GGUF exported from that same
container (`moestream export-gguf --type q4_0`), both with near-uniform routing.
Prefill tok/s = prompt tokens / the seconds from the request to the first
token (each engine counts its own prompt tokens; the GGUF's tokenizer is the
container's, so the counts agree).

- warm: every weight in RAM. moestream: `run --prompts` of two different
  prompts in one process with --ram-gb 20 (the first reads every expert into
  the cache; the second is timed). llama.cpp: the file in the page cache (cat),
  its defaults (weights repacked), a first prompt, then the timed one.
- cold: page cache dropped, inside a memory cgroup of --cap GB (page cache
  included; scripts/in_cgroup.sh). moestream with --ram-gb equal to the cap;
  llama.cpp plain mmap without repacking (its repacked copy cannot fit the
  cap), with the disk's read-ahead as it is and cut to 128 KB.

Rounds alternate the engines; medians are reported. Needs root. Usage::

    python scripts/bench_prefill_vs_llamacpp.py --model /work/q30u \\
        --gguf /work/q30u-Q4_0.gguf --cap 6 --rounds 2 --csv results/prefill-vs-llamacpp.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gguf_vs_llamacpp import (MOESTREAM, disk_of, drop_caches, run_capped,  # noqa: E402
                                    set_read_ahead)

WORDS = ("river stone lantern harbor meadow copper whisper orchard canyon signal ember "
         "glacier violet thunder compass marble falcon prairie lighthouse saffron").split()


def prompt(seed: int, words: int) -> str:
    """A prompt of `words` words, different per seed."""
    return " ".join(WORDS[(seed * 7 + i * (seed + 3)) % len(WORDS)] for i in range(words))


LLAMA_CODE = r"""
import json, sys, time, llama_cpp
path, warm_text, text, repack = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
if not repack:
    import llama_cpp.llama_cpp as low
    default_params = low.llama_model_default_params
    def no_repack():
        p = default_params()
        p.use_extra_bufts = False
        return p
    low.llama_model_default_params = no_repack
llm = llama_cpp.Llama(model_path=path, n_ctx=1024, n_batch=1024, n_ubatch=512, n_threads=2,
                      n_threads_batch=2, use_mmap=True, verbose=False)
assert llm.model_params.use_extra_bufts == repack, "the repack setting did not take"
def prefill(t):
    toks = llm.tokenize(t.encode(), add_bos=False)
    llm.reset()
    start = time.time()
    llm.eval(toks)
    return len(toks), time.time() - start
if warm_text:
    prefill(warm_text)
n, s = prefill(text)
print(json.dumps({"prompt_tokens": n, "prefill_s": s}))
"""


def moestream(model: str, cap: float | None, warm: str, text: str) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write((warm + "\n" if warm else "") + text + "\n")
    try:
        out, _ = run_capped([MOESTREAM, "run", "--model", model, "--prompts", f.name, "--max-tokens", "1",
                             "--json", "--ram-gb", str(cap if cap is not None else 20)], cap)
    finally:
        os.unlink(f.name)
    last = json.loads(out.strip().splitlines()[-1])
    s = last["stats"]
    return {"prompt_tokens": s["prompt_tokens"], "prefill_s": s["prefill_seconds"]}


def llama(gguf: str, cap: float | None, warm: str, text: str, repack: bool) -> dict:
    out, _ = run_capped([sys.executable, "-c", LLAMA_CODE, gguf, warm, text, "1" if repack else "0"], cap)
    return json.loads(out.strip().splitlines()[-1])


def measure(a, disk: str, ra0: int, setting: str, engine: str, ra: int | None, text: str, warm: str) -> dict:
    set_read_ahead(disk, ra if ra is not None else ra0)
    cap = None if setting == "warm" else a.cap
    if setting == "warm" and engine == "llama.cpp":
        subprocess.run(["cat", a.gguf], stdout=subprocess.DEVNULL, check=True)
    else:
        drop_caches()
    try:
        if engine == "moestream":
            res = moestream(a.model, cap, warm if setting == "warm" else "", text)
        else:
            res = llama(a.gguf, cap, warm if setting == "warm" else "", text, repack=setting == "warm")
        note = ""
    except RuntimeError as e:
        res, note = {"prompt_tokens": 0, "prefill_s": float("inf")}, "failed"
        print(str(e)[-400:], file=sys.stderr)
    label = engine if ra is None else f"{engine} ra{ra}"
    tok_s = res["prompt_tokens"] / res["prefill_s"] if res["prefill_s"] > 0 else 0.0
    row = {"setting": setting, "engine": label, "prompt_tokens": res["prompt_tokens"],
           "prefill_s": round(res["prefill_s"], 3), "tok_s": round(tok_s, 2), "note": note}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="moestream's container of the geometry")
    p.add_argument("--gguf", required=True, help="the Q4_0 GGUF of the same weights, for llama.cpp")
    p.add_argument("--cap", type=float, default=6.0, help="memory cap of the cold runs, GB")
    p.add_argument("--words", type=int, default=95,
                   help="prompt length in words (the synthetic models' tokenizer makes 95 words ~512 tokens)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--csv", required=True)
    a = p.parse_args()
    disk = disk_of(a.gguf)
    ra0 = int(open(f"/sys/block/{disk}/queue/read_ahead_kb").read())
    settings = [("warm", "moestream", None), ("warm", "llama.cpp", None),
                ("cold", "moestream", None), ("cold", "llama.cpp", None), ("cold", "llama.cpp", 128)]
    rows = []
    try:
        for r in range(a.rounds):
            order = settings if r % 2 == 0 else settings[::-1]
            for setting, engine, ra in order:
                text, warm = prompt(2 * r + 1, a.words), prompt(2 * r + 2, a.words)
                rows.append(measure(a, disk, ra0, setting, engine, ra, text, warm) | {"round": r + 1})
    finally:
        set_read_ahead(disk, ra0)
    with open(a.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    for setting, engine, ra in settings:
        label = engine if ra is None else f"{engine} ra{ra}"
        vals = [x["tok_s"] for x in rows if x["setting"] == setting and x["engine"] == label]
        print(f"{setting:5} {label:22} prefill tok/s {', '.join(f'{v:.1f}' for v in vals)} "
              f"(median {statistics.median(vals):.1f})")


if __name__ == "__main__":
    main()
