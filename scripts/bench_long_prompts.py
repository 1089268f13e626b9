#!/usr/bin/env python3
"""Long prompts, cold, inside a memory cgroup: moestream's layer-major
prefill against its chunked prefill and llama.cpp (issue 28).

For each routing (a container and the Q4_0 GGUF exported from it) and each
prompt length, three runs, each from a dropped page cache inside a memory
cgroup of --cap GB (page cache included; scripts/in_cgroup.sh):

- `after`: moestream `run --max-tokens 1 --ram-gb RAM`, its default
  prefill pass (the RAM plan's `prefill pass` line);
- `before`: the same with `--prefill-pass 256`, the 256-position chunks of
  the prefill that came before layer-major passes (each chunk walks every
  layer, so each chunk re-reads the experts);
- `llama.cpp`: llama-cpp-python (built from source), plain mmap without
  repacking, 2 threads, n_batch = the prompt length (n_ubatch its default
  512), the disk's read-ahead cut to 128 KB.

TTFT = seconds from the start of the request (model loaded) to the first
token: moestream's `prefill_seconds`, llama.cpp's `eval` of the prompt.
Bytes: moestream's expert bytes read and the process's device bytes
(/proc/self/io); llama.cpp's device bytes. Prompts are spread-out token ids
(the same ids for every engine), different per round. Rounds alternate the
order; medians are reported. Needs root. Usage::

    python scripts/bench_long_prompts.py --routing uniform=/work/q30u,/work/q30u-Q4_0.gguf \\
        --lengths 2048,4096 --rounds 2 --cap 3 --ram-gb 3.12 --csv results/long-prompts.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gguf_vs_llamacpp import (MOESTREAM, disk_of, drop_caches, run_capped,  # noqa: E402
                                    set_read_ahead)

LLAMA_CODE = r"""
import json, sys, time, llama_cpp
import llama_cpp.llama_cpp as low
path, ids = sys.argv[1], [int(x) for x in sys.argv[2].split(",")]
default_params = low.llama_model_default_params
def no_repack():
    p = default_params()
    p.use_extra_bufts = False
    return p
low.llama_model_default_params = no_repack
n = len(ids)
llm = llama_cpp.Llama(model_path=path, n_ctx=n + 16, n_batch=n, n_threads=2, n_threads_batch=2,
                      use_mmap=True, verbose=False)
def device_read():
    for line in open("/proc/self/io"):
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0
before = device_read()
start = time.time()
llm.eval(ids)
s = time.time() - start
print(json.dumps({"prompt_tokens": n, "ttft_s": s, "device_bytes": device_read() - before}))
"""

ENGINES = ("before", "after", "llama.cpp")


def prompt_ids(length: int, seed: int, vocab: int = 150_000) -> list[int]:
    """`length` spread-out token ids, different per seed (no special ids)."""
    return [100 + (i * 7919 + seed * 104_729) % (vocab - 100) for i in range(length)]


def moestream(model: str, a, ids: list[int], pass_positions: int | None) -> dict:
    cmd = [MOESTREAM, "run", "--model", model, "--prompt-ids", ",".join(map(str, ids)),
           "--max-tokens", "1", "--json", "--ram-gb", str(a.ram_gb)]
    if pass_positions is not None:
        cmd += ["--prefill-pass", str(pass_positions)]
    out, err = run_capped(cmd, a.cap)
    s = json.loads(out.strip().splitlines()[-1])["stats"]
    plan = next((line for line in err.splitlines() if "prefill pass" in line), "")
    passes = plan.split("prefill pass")[1].split("(")[1].split(" positions")[0] if plan else ""
    return {"prompt_tokens": s["prompt_tokens"], "ttft_s": s["prefill_seconds"],
            "expert_bytes": s["expert_bytes_read"], "device_bytes": s["device_bytes_read"],
            "compute_s": s["expert_matmul_s"] + s["attention_s"] + s["other_s"],
            "disk_wait_s": s["expert_disk_s"], "plan_pass": passes}


def llama(gguf: str, a, ids: list[int]) -> dict:
    out, _ = run_capped([sys.executable, "-c", LLAMA_CODE, gguf, ",".join(map(str, ids))], a.cap)
    r = json.loads(out.strip().splitlines()[-1])
    return r | {"expert_bytes": "", "compute_s": "", "disk_wait_s": "", "plan_pass": ""}


def measure(a, disk: str, ra0: int, routing: str, paths: tuple[str, str], engine: str,
            length: int, rnd: int) -> dict:
    ids = prompt_ids(length, rnd)
    set_read_ahead(disk, 128 if engine == "llama.cpp" else ra0)
    drop_caches()
    note = ""
    try:
        if engine == "llama.cpp":
            res = llama(paths[1], a, ids)
        else:
            res = moestream(paths[0], a, ids, 256 if engine == "before" else None)
    except RuntimeError as e:
        res, note = {"prompt_tokens": length, "ttft_s": float("inf"), "device_bytes": 0}, "failed"
        print(str(e)[-600:], file=sys.stderr)
    row = {"round": rnd, "routing": routing, "length": length, "engine": engine} | res | {"note": note}
    row["ttft_s"] = round(row["ttft_s"], 2)
    print(json.dumps(row), flush=True)
    return row


def summary(rows: list[dict]) -> None:
    keys = sorted({(r["routing"], r["length"], r["engine"]) for r in rows},
                  key=lambda k: (k[0], k[1], ENGINES.index(k[2])))
    for routing, length, engine in keys:
        sel = [r for r in rows if (r["routing"], r["length"], r["engine"]) == (routing, length, engine)]
        ttft = [r["ttft_s"] for r in sel]
        dev = [r["device_bytes"] / 1e9 for r in sel]
        exp = [r["expert_bytes"] / 1e9 for r in sel if r.get("expert_bytes") != ""]
        line = (f"{routing:9} {length:6} {engine:9} TTFT {', '.join(f'{v:.1f}' for v in ttft)} s "
                f"(median {statistics.median(ttft):.1f}) device GB {statistics.median(dev):.1f}")
        if exp:
            line += f" experts GB {statistics.median(exp):.1f} ({1e3 * statistics.median(exp) / length:.2f} MB/token)"
        print(line)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--routing", action="append", required=True,
                   help="NAME=CONTAINER,GGUF (repeatable): a container and its Q4_0 GGUF")
    p.add_argument("--lengths", default="2048,4096")
    p.add_argument("--engines", default=",".join(ENGINES))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--cap", type=float, default=3.0, help="memory cgroup cap, GB")
    p.add_argument("--ram-gb", type=float, default=3.12, help="moestream's --ram-gb")
    p.add_argument("--csv", required=True, help="rows are appended as they finish")
    a = p.parse_args()
    routings = [(r.split("=", 1)[0], tuple(r.split("=", 1)[1].split(","))) for r in a.routing]
    lengths = [int(x) for x in a.lengths.split(",")]
    engines = a.engines.split(",")
    disk = disk_of(routings[0][1][0])
    ra0 = int(open(f"/sys/block/{disk}/queue/read_ahead_kb").read())
    cells = [(name, paths, length, e) for name, paths in routings for length in lengths for e in engines]
    rows = []
    fields = ["round", "routing", "length", "engine", "prompt_tokens", "ttft_s", "expert_bytes",
              "device_bytes", "compute_s", "disk_wait_s", "plan_pass", "note"]
    new = not os.path.exists(a.csv)
    with open(a.csv, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        if new:
            w.writeheader()
        try:
            for r in range(1, a.rounds + 1):
                for name, paths, length, engine in (cells if r % 2 else cells[::-1]):
                    rows.append(measure(a, disk, ra0, name, paths, engine, length, r))
                    w.writerow(rows[-1])
                    f.flush()
        finally:
            set_read_ahead(disk, ra0)
    summary(rows)


if __name__ == "__main__":
    main()
