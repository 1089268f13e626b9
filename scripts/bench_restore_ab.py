#!/usr/bin/env python3
"""The --kv-dir restore of two builds on one KV directory (issue 28; results/long-prompts.md,
the second turn): turn 1 (a --prefix-token prompt) by build A fills the directory; then each
round starts a cold server of each build (page cache dropped, inside a memory cgroup of
--cap GB) that answers the prefix plus --extra new tokens, and reports the server's own split
(`/metrics`: kv_restore_seconds and the prefill's parts). After the first second turn the
directory holds the longer prefix, so later rounds restore slightly more positions and prefill
fewer. Rounds alternate the order. Needs root. Usage::

    python3 scripts/bench_restore_ab.py --a BIN_A --b BIN_B --model /work/q30u --prefix 8192 \\
        --rounds 3 --cap 3.4 --ram-gb 3.32
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_second_turn as bst  # noqa: E402
from bench_long_prompts import prompt_ids  # noqa: E402


def turn(a, binary, kv, ids):
    bst.MOESTREAM = binary  # the server `bst.start` runs
    return bst.answered(a, kv, ids)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True, help="build A (also fills the KV directory)")
    p.add_argument("--b", required=True, help="build B")
    p.add_argument("--model", required=True)
    p.add_argument("--prefix", type=int, default=8192)
    p.add_argument("--extra", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cap", type=float, default=3.4)
    p.add_argument("--ram-gb", type=float, default=3.32)
    p.add_argument("--scratch", default="/work", help="where the KV directory goes")
    a = p.parse_args()
    kv = tempfile.mkdtemp(prefix="kv-ab-", dir=a.scratch)
    try:
        prefix = prompt_ids(a.prefix, 1)
        first = turn(a, a.a, kv, prefix)
        print(json.dumps({"turn": 1, **first}), flush=True)
        second = prefix + prompt_ids(a.extra, 1001)
        rows = {a.a: [], a.b: []}
        for r in range(a.rounds):
            for b in ((a.a, a.b) if r % 2 == 0 else (a.b, a.a)):
                rows[b].append(turn(a, b, kv, second))
                print(json.dumps({"round": r + 1, "bin": b, **rows[b][-1]}), flush=True)
        for b, rs in rows.items():
            vals = [x["kv_restore_s"] for x in rs]
            print(f"{b}: KV restore {', '.join(f'{v:.2f}' for v in vals)} s "
                  f"(median {statistics.median(vals):.2f})")
    finally:
        shutil.rmtree(kv, ignore_errors=True)


if __name__ == "__main__":
    main()
