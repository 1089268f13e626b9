#!/usr/bin/env python3
"""Markdown table of a bench_budget_sweep.sh CSV: per read mode and budget,
the median tok/s (and MB/token, hit rate) of each binary over its rounds.

    python3 scripts/summarize_sweep.py results/budget-sweep.csv
"""
import csv
import statistics
import sys
from collections import defaultdict


def main(path):
    rows = list(csv.DictReader(open(path)))
    bins = list(dict.fromkeys(r["bin"] for r in rows))
    cells = defaultdict(list)
    for r in rows:
        cells[(r["mode"], r["ram_gb"], r["bin"])].append(r)
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    budgets = sorted({r["ram_gb"] for r in rows}, key=float)
    head = ["mode", "GB", "slots"]
    for b in bins:
        name = b.rsplit("/", 1)[-1]
        head += [f"{name} tok/s (runs)", f"{name} MB/tok", f"{name} hit"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for m in modes:
        for gb in budgets:
            line = [m, gb, ""]
            for b in bins:
                ok = [r for r in cells[(m, gb, b)] if r["status"] == "ok"]
                if not ok:
                    line += ["refused (budget too small)", "", ""]
                    continue
                line[2] = ok[0]["slots"]
                tps = [float(r["tok_per_s"]) for r in ok]
                line += [
                    f"**{statistics.median(tps):.2f}** ({', '.join(f'{t:.2f}' for t in tps)})",
                    f"{statistics.median(float(r['mb_per_token']) for r in ok):.0f}",
                    f"{statistics.median(float(r['hit_rate']) for r in ok):.2f}",
                ]
            print("| " + " | ".join(line) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
