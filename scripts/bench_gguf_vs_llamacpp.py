#!/usr/bin/env python3
"""Head-to-head on identical bytes: moestream and llama.cpp decoding the same GGUF file.

Each engine runs cold (page cache dropped first) inside a cgroup-v1 memory group of
--caps GB (page cache included; scripts/in_cgroup.sh), in alternating rounds, and
"warm" (the file read into the page cache first, no cap). Reported per setting:
median decode tok/s over the rounds, and the device's bytes read per decoded token
(/sys/block/<disk>/stat, sectors read, over the whole run including load and prefill,
divided by the decoded tokens).

llama.cpp runs through llama-cpp-python (built from source, GGML_NATIVE), plain
mmap, 2 threads, greedy. Cold, its weights stay in the mapping (--no-repack:
its default copies the weights into repacked anonymous memory, which a cap below
the file's size cannot hold), with the disk's read-ahead as it is and cut to 128
KB. Warm, with and without repacking. moestream runs with --ram-gb equal to the
cap and otherwise default flags.

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
# The binary these benches run: the release build, or $MOESTREAM_BIN (to compare two builds).
MOESTREAM = os.environ.get("MOESTREAM_BIN") or os.path.join(REPO, "target", "release", "moestream")
IN_CGROUP = os.path.join(REPO, "scripts", "in_cgroup.sh")
PROMPT = list(range(100, 116))
WARM_PROMPT = "The history of the printing press begins in the fifteenth century, when"

LLAMA_CODE = r"""
import json, sys, time, llama_cpp
path, tokens, warmup, repack = sys.argv[1], int(sys.argv[2]), sys.argv[4] == "1", sys.argv[5] == "1"
prompt = [int(x) for x in sys.argv[3].split(",")]
if not repack:
    # llama.cpp's --no-repack: weights stay in the mapping, as the file has them.
    # Its default copies every Q4_0/Q4_K weight into a repacked anonymous buffer,
    # which cannot fit a cgroup smaller than the file.
    import llama_cpp.llama_cpp as low  # what Llama() takes its default parameters from
    default_params = low.llama_model_default_params
    def no_repack():
        p = default_params()
        p.use_extra_bufts = False
        return p
    low.llama_model_default_params = no_repack
t0 = time.time()
llm = llama_cpp.Llama(model_path=path, n_ctx=256, n_threads=2, n_threads_batch=2, use_mmap=True,
                      verbose=False, logits_all=False)
assert llm.model_params.use_extra_bufts == repack, "the repack setting did not take"
t1 = time.time()

def timed():
    # generate() yields a token once it is sampled and evaluates it when asked
    # for the next one: the time between the first and the last yield is
    # tokens - 1 decode steps.
    n, t2, t3 = 0, None, None
    start = time.time()
    for tok in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        n += 1
        if n == 1:
            t2 = time.time()  # prefill and the first token
        if n == tokens:
            t3 = time.time()
            break
    return start, t2, t3

if warmup:
    timed()
start, t2, t3 = timed()
print(json.dumps({"load_s": t1 - t0, "prefill_s": t2 - start, "decode_s": t3 - t2, "tok_s": (tokens - 1) / (t3 - t2)}))
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
    compact_memory()


def compact_memory() -> None:
    """Defragments free memory, so each run finds huge pages as the one
    before left them: without it, a warm moestream run right after
    llama.cpp's (whose page cache filled RAM) got 4 KB pages for its
    MADV_HUGEPAGE expert slabs and decoded 25% slower."""
    with open("/proc/sys/vm/compact_memory", "w") as f:
        f.write("1\n")


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


def moestream_warm(gguf: str, tokens: int) -> dict:
    """Every expert the measured decode needs in RAM: the same greedy
    generation once before, in the same process (`bench decode --warmup`)."""
    out, _ = run_capped(
        [MOESTREAM, "bench", "decode", "--model", gguf, "--prompt", WARM_PROMPT, "--tokens", str(tokens),
         "--warmup", "--ram-gb", "20"], None)
    row = dict(kv.split("=", 1) for kv in out.split())
    if float(row["hit_rate"]) < 0.999:
        raise RuntimeError(f"warm run missed the cache: {out}")
    return {"tok_s": float(row["decode_tok_s"])}


def moestream(gguf: str, cap: float | None, tokens: int) -> dict:
    ram = str(cap) if cap is not None else "20"
    out, _ = run_capped(
        [MOESTREAM, "run", "--model", gguf, "--prompt-ids", ",".join(map(str, PROMPT)), "--max-tokens",
         str(tokens), "--ignore-eos", "--json", "--ram-gb", ram], cap)
    s = json.loads(out)["stats"]
    decode_s = s["seconds"] - s["prefill_seconds"]
    return {"tok_s": (tokens - 1) / decode_s if tokens > 1 else s["tok_per_s"]}


def llama(gguf: str, cap: float | None, tokens: int, warmup: bool = False, repack: bool = False) -> dict:
    out, _ = run_capped(
        [sys.executable, "-c", LLAMA_CODE, gguf, str(tokens), ",".join(map(str, PROMPT)), "1" if warmup else "0",
         "1" if repack else "0"],
        cap)
    return json.loads(out.strip().splitlines()[-1])


# (label, engine, read-ahead: None = as the disk has it, llama.cpp's weight repacking)
COLD = [("moestream", "moestream", None, False),
        ("llama.cpp no-repack", "llama.cpp", None, False),
        ("llama.cpp no-repack ra128", "llama.cpp", 128, False)]
WARM = [("moestream", "moestream", None, False),
        ("llama.cpp", "llama.cpp", None, True),
        ("llama.cpp no-repack", "llama.cpp", None, False)]


def measure(a, disk: str, ra0: int, cap, setting, tokens: int) -> dict:
    label, engine, ra, repack = setting
    set_read_ahead(disk, ra if ra is not None else ra0)
    if cap == "warm" and engine == "llama.cpp":
        # The whole file in the page cache, which its mapping reads. Each
        # engine warm generates once before the timed generation, in the same
        # process: moestream's expert cache (O_DIRECT, no page cache) then
        # holds every expert the timed one needs, so its page cache is dropped
        # instead, leaving it the memory.
        subprocess.run(["cat", a.gguf], stdout=subprocess.DEVNULL, check=True)
        compact_memory()
    else:
        drop_caches()
    before = sectors_read(disk)
    t = time.time()
    try:
        if engine == "moestream":
            model = a.moestream_model or a.gguf
            res = moestream_warm(model, tokens) if cap == "warm" else moestream(model, cap, tokens)
        else:
            res = llama(a.gguf, None if cap == "warm" else cap, tokens, warmup=cap == "warm", repack=repack)
        note = ""
    except RuntimeError as e:
        res, note = {"tok_s": 0.0}, "killed (out of memory)" if "oom kills 1" in str(e) else "failed"
        print(str(e)[-400:], file=sys.stderr)
    mb = (sectors_read(disk) - before) * 512 / 1e6 / tokens if cap != "warm" else 0.0
    return {"cap_gb": cap, "setting": label, "read_ahead_kb": ra or ra0, "tok_s": res["tok_s"],
            "mb_per_token": mb, "wall_s": time.time() - t, "note": note}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf", required=True)
    p.add_argument("--caps", default="3,6", help="memory caps in GB, comma-separated; empty for none")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--tokens", type=int, default=12)
    p.add_argument("--warm", action="store_true", help="also run warm (file in page cache, no cap)")
    p.add_argument("--csv", required=True)
    p.add_argument("--moestream-model", help="what moestream runs instead of the GGUF (e.g. its own "
                   "container of the same weights)")
    p.add_argument("--skip", default="", help="comma-separated settings to leave out, e.g. "
                   "'llama.cpp no-repack'")
    a = p.parse_args()
    disk = disk_of(a.gguf)
    ra0 = int(open(f"/sys/block/{disk}/queue/read_ahead_kb").read())
    plan = [(float(c), COLD, a.tokens) for c in a.caps.split(",") if c]
    if a.warm:
        plan.append(("warm", WARM, 2 * a.tokens))
    rows = []
    try:
        for cap, settings, tokens in plan:
            for r in range(a.rounds):
                for setting in [s for s in settings if s[0] not in a.skip.split(",")]:
                    row = {"round": r, **measure(a, disk, ra0, cap, setting, tokens)}
                    print(row, flush=True)
                    rows.append(row)
    finally:
        set_read_ahead(disk, ra0)
    with open(a.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print("\nmedians:")
    keys = sorted({(r["cap_gb"], r["setting"]) for r in rows}, key=str)
    for k in keys:
        sel = [r for r in rows if (r["cap_gb"], r["setting"]) == k]
        print(k, "tok/s", round(statistics.median(r["tok_s"] for r in sel), 3),
              "MB/token", round(statistics.median(r["mb_per_token"] for r in sel), 1))


if __name__ == "__main__":
    main()
