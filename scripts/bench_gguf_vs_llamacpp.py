#!/usr/bin/env python3
"""Head-to-head on identical bytes: moestream and llama.cpp decoding the same GGUF file.

Each engine runs cold (page cache dropped first) inside a cgroup-v1 memory group of
--caps GB (page cache included; scripts/in_cgroup.sh), in alternating rounds, and
"warm" (the file read into the page cache first, no cap). Reported per setting:
median decode tok/s over the rounds, and the device's bytes read per decoded token
(/sys/block/<disk>/stat, sectors read, over the whole run including load and prefill,
divided by the decoded tokens).

llama.cpp runs through llama-cpp-python (built from source, GGML_NATIVE), plain
mmap, 2 threads, greedy, in two settings: as installed (the disk's read-ahead
untouched) and with the disk's read_ahead_kb cut to 128. moestream runs with
--ram-gb equal to the cap and otherwise default flags.

Needs root (drop_caches, read_ahead_kb, cgroups). Usage::

    python scripts/bench_gguf_vs_llamacpp.py --gguf /work/q30-Q4_K.gguf --caps 3,6 \\
        --rounds 2 --tokens 12 --csv results/gguf-vs-llamacpp.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MOESTREAM = os.path.join(REPO, "target", "release", "moestream")
IN_CGROUP = os.path.join(REPO, "scripts", "in_cgroup.sh")
PROMPT = list(range(100, 116))

LLAMA_CODE = r"""
import json, sys, time, llama_cpp
path, tokens = sys.argv[1], int(sys.argv[2])
prompt = [int(x) for x in sys.argv[3].split(",")]
t0 = time.time()
llm = llama_cpp.Llama(model_path=path, n_ctx=256, n_threads=2, n_threads_batch=2, use_mmap=True,
                      verbose=False, logits_all=False)
t1 = time.time()
n, t2 = 0, None
for tok in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
    n += 1
    if n == 1:
        t2 = time.time()  # prefill and the first token
    if n == tokens:
        break
t3 = time.time()
print(json.dumps({"load_s": t1 - t0, "prefill_s": t2 - t1, "decode_s": t3 - t2, "tok_s": (tokens - 1) / (t3 - t2)}))
"""


def disk_of(path: str) -> str:
    dev = os.stat(path).st_dev
    major, minor = os.major(dev), os.minor(dev)
    for name in os.listdir("/sys/block"):
        for cand in [name] + [p for p in os.listdir(f"/sys/block/{name}") if p.startswith(name)]:
            base = f"/sys/block/{name}/{cand}" if cand != name else f"/sys/block/{name}"
            try:
                if open(f"{base}/dev").read().strip() == f"{major}:{minor}":
                    return name
            except OSError:
                pass
    raise SystemExit(f"no block device for {path}")


def sectors_read(disk: str) -> int:
    return int(open(f"/sys/block/{disk}/stat").read().split()[2])


def drop_caches() -> None:
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def set_read_ahead(disk: str, kb: int) -> None:
    with open(f"/sys/block/{disk}/queue/read_ahead_kb", "w") as f:
        f.write(f"{kb}\n")


def run_capped(cmd: list[str], cap: float | None) -> tuple[str, str]:
    env = dict(os.environ, MOESTREAM_NO_HISTORY="1")
    if cap is not None:
        env["RAM_GB"] = str(cap)
        cmd = [IN_CGROUP, *cmd]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {p.stderr[-2000:]}")
    return p.stdout, p.stderr


def moestream(gguf: str, cap: float | None, tokens: int) -> dict:
    ram = str(cap) if cap is not None else "20"
    out, _ = run_capped(
        [MOESTREAM, "run", "--model", gguf, "--prompt-ids", ",".join(map(str, PROMPT)), "--max-tokens",
         str(tokens), "--ignore-eos", "--json", "--ram-gb", ram], cap)
    s = json.loads(out)["stats"]
    decode_s = s["seconds"] - s["prefill_seconds"]
    return {"tok_s": (tokens - 1) / decode_s if tokens > 1 else s["tok_per_s"]}


def llama(gguf: str, cap: float | None, tokens: int) -> dict:
    out, _ = run_capped([sys.executable, "-c", LLAMA_CODE, gguf, str(tokens), ",".join(map(str, PROMPT))], cap)
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf", required=True)
    p.add_argument("--caps", default="3,6", help="memory caps in GB, comma-separated")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--tokens", type=int, default=12)
    p.add_argument("--warm", action="store_true", help="also run warm (file in page cache, no cap)")
    p.add_argument("--csv", required=True)
    a = p.parse_args()
    disk = disk_of(a.gguf)
    ra0 = int(open(f"/sys/block/{disk}/queue/read_ahead_kb").read())
    settings = [("moestream", None), ("llama.cpp", ra0), ("llama.cpp", 128)]
    rows = []
    try:
        for cap in [float(c) for c in a.caps.split(",")]:
            for r in range(a.rounds):
                for engine, ra in settings:
                    set_read_ahead(disk, ra if ra is not None else ra0)
                    drop_caches()
                    before = sectors_read(disk)
                    t = time.time()
                    res = (moestream if engine == "moestream" else llama)(a.gguf, cap, a.tokens)
                    mb = (sectors_read(disk) - before) * 512 / 1e6 / a.tokens
                    row = {"cap_gb": cap, "round": r, "engine": engine, "read_ahead_kb": ra or ra0,
                           "tok_s": res["tok_s"], "mb_per_token": mb, "wall_s": time.time() - t}
                    print(row, flush=True)
                    rows.append(row)
        if a.warm:
            set_read_ahead(disk, ra0)
            subprocess.run(["cat", a.gguf], stdout=subprocess.DEVNULL, check=True)
            for r in range(a.rounds):
                for engine, ra in settings[:2]:
                    res = (moestream if engine == "moestream" else llama)(a.gguf, None, a.tokens * 2)
                    row = {"cap_gb": "warm", "round": r, "engine": engine, "read_ahead_kb": ra0,
                           "tok_s": res["tok_s"], "mb_per_token": 0.0, "wall_s": 0.0}
                    print(row, flush=True)
                    rows.append(row)
    finally:
        set_read_ahead(disk, ra0)
    with open(a.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print("\nmedians:")
    keys = sorted({(r["cap_gb"], r["engine"], r["read_ahead_kb"]) for r in rows}, key=str)
    for k in keys:
        sel = [r for r in rows if (r["cap_gb"], r["engine"], r["read_ahead_kb"]) == k]
        print(k, "tok/s", round(statistics.median(r["tok_s"] for r in sel), 3),
              "MB/token", round(statistics.median(r["mb_per_token"] for r in sel), 1))


if __name__ == "__main__":
    main()
