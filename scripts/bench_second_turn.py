#!/usr/bin/env python3
"""An agent's second turn after a server restart, with --kv-dir (issue 28).

Turn 1: `moestream serve --kv-dir DIR` (cold, page cache dropped, inside a
memory cgroup of --cap GB) answers a completion of a --prefix-token prompt
(spread-out ids, max_tokens 1); the server is stopped with SIGTERM, which
saves the kept KV. Turn 2: a fresh server on the same DIR (page cache
dropped again) answers the prefix plus --extra new tokens; its TTFT is the
seconds from sending the request to the first streamed text chunk. Each
second turn also reports the server's own split (`/metrics` after the
answer): the KV restore at start (before the server takes requests, so
outside the TTFT; `start_to_ready_s` holds it and the model's load), and
the prefill's seconds, the compute's wait on expert reads, attention, the
experts' matmuls and the expert GB read. The
same second-turn prompt on a server without --kv-dir (cold prefill of the
whole prompt) is the reference. Rounds alternate the two second turns;
medians are reported; each row of the restarted kind also gives its first
turn's TTFT (a cold prefill of the prefix). Needs root. Usage::

    python scripts/bench_second_turn.py --model /work/q30u --prefix 2048 --extra 32 \\
        --rounds 2 --cap 3 --ram-gb 3.12
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gguf_vs_llamacpp import IN_CGROUP, MOESTREAM, drop_caches  # noqa: E402
from bench_long_prompts import prompt_ids  # noqa: E402

PORT = 18428


def start(a, kv_dir: str | None) -> subprocess.Popen:
    cmd = [IN_CGROUP, MOESTREAM, "serve", "--model", a.model, "--port", str(PORT), "--ram-gb",
           str(a.ram_gb), "--context", str(a.prefix + a.extra + 16), "--slots", "1"]
    if kv_dir:
        cmd += ["--kv-dir", kv_dir]
    env = dict(os.environ, MOESTREAM_NO_HISTORY="1", RAM_GB=str(a.cap))
    log = open(os.path.join(a.scratch, "bench_second_turn.log"), "ab")  # the servers' stderr
    p = subprocess.Popen(cmd, env=env, stderr=log, stdout=subprocess.DEVNULL)
    log.close()
    deadline = time.time() + 600
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2) as r:
                if r.status == 200:
                    return p
        except OSError:
            time.sleep(0.5)
    p.kill()
    raise SystemExit("the server did not get ready")


SPLIT = {"kv_restore_s": "kv_restore_seconds", "kv_restored": "kv_restored_positions",
         "prefill_s": "prefill_seconds_total", "expert_wait_s": "expert_wait_seconds_total",
         "expert_matmul_s": "expert_matmul_seconds_total", "attention_s": "attention_seconds_total",
         "expert_gb_read": "expert_bytes_read_total"}


def split() -> dict:
    """The server's own split of its work so far (`/metrics`): the KV
    restore at start, and the prefill's seconds by where they went."""
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=10) as r:
        values = {}
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#") and " " in line:
                name, v = line.rsplit(" ", 1)
                values[name] = float(v)
    out = {k: values.get(f"moestream_{m}", float("nan")) for k, m in SPLIT.items()}
    out["expert_gb_read"] /= 1e9
    return {k: round(v, 3) for k, v in out.items()}


def stop(p: subprocess.Popen) -> None:
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=300)


def first_chunk_s(ids: list[int]) -> tuple[float, int]:
    """Seconds to the first streamed text chunk, and the cached prompt
    tokens the usage chunk reports."""
    body = json.dumps({"prompt": ids, "max_tokens": 1, "temperature": 0, "ignore_eos": True,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}/v1/completions", data=body,
                                 headers={"content-type": "application/json"})
    start_t = time.time()
    ttft, cached = None, -1
    with urllib.request.urlopen(req, timeout=3600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            c = json.loads(line[6:])
            if ttft is None and c.get("choices") and "text" in c["choices"][0]:
                ttft = time.time() - start_t
            if c.get("usage"):
                details = c["usage"].get("prompt_tokens_details") or {}
                cached = details.get("cached_tokens", 0)
    return ttft, cached


def answered(a, kv: str | None, ids: list[int]) -> dict:
    """A cold server (page cache dropped) on `kv` answers `ids`: its seconds from start to
    ready, the TTFT, the cached prompt tokens and the server's own split (`split`)."""
    drop_caches()
    started = time.time()
    p = start(a, kv)
    ready_s = time.time() - started
    try:
        ttft, cached = first_chunk_s(ids)
        time.sleep(0.5)  # the snapshot is published after the step that answered
        parts = split()
    finally:
        stop(p)
    return {"cached_tokens": cached, "ttft_s": round(ttft, 2), "start_to_ready_s": round(ready_s, 2),
            **parts}


def second_turn(a, rnd: int, keep: bool) -> dict:
    prefix = prompt_ids(a.prefix, rnd)
    turn2 = prefix + prompt_ids(a.extra, 1000 + rnd)
    kv = tempfile.mkdtemp(prefix="kv-", dir=a.scratch) if keep else None
    first = None
    try:
        if keep:
            drop_caches()
            p = start(a, kv)
            first, _ = first_chunk_s(prefix)
            stop(p)
        second = answered(a, kv, turn2)
    finally:
        if kv:
            shutil.rmtree(kv, ignore_errors=True)
    row = {"round": rnd, "second_turn": "kv-dir, restarted" if keep else "cold prefill",
           "prompt_tokens": len(turn2), **second}
    if first is not None:
        row["first_turn_ttft_s"] = round(first, 2)
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--prefix", type=int, default=2048, help="tokens of the first turn's prompt")
    p.add_argument("--extra", type=int, default=32, help="new tokens of the second turn")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--cap", type=float, default=3.0)
    p.add_argument("--ram-gb", type=float, default=3.12)
    p.add_argument("--scratch", default="/work", help="where the KV directories go")
    p.add_argument("--no-cold", action="store_true",
                   help="skip the cold-prefill reference (when it was measured already)")
    a = p.parse_args()
    rows = []
    for r in range(1, a.rounds + 1):
        for keep in ((True, False) if r % 2 else (False, True)):
            if keep or not a.no_cold:
                rows.append(second_turn(a, r, keep))
    for kind in ("kv-dir, restarted", "cold prefill"):
        vals = [x["ttft_s"] for x in rows if x["second_turn"] == kind]
        if not vals:
            continue
        print(f"{kind:18} TTFT {', '.join(f'{v:.2f}' for v in vals)} s (median {statistics.median(vals):.2f})")


if __name__ == "__main__":
    main()
