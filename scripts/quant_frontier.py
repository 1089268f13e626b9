#!/usr/bin/env python3
"""The speed/quality frontier of the container's recipes (issue 30, item 5):
results/quant-frontier.md. Run by a person, never by CI.

Quality and speed come from two models, because no trained model here is large enough for its
experts' reads to set the speed:
- quality: KL(f32 ‖ recipe) and top-1 agreement from a `scripts/quant_quality.py --json` file
  (trained weights; later files given to --kl override earlier rows of the same label), the
  rows without importance;
- speed: disk-bound decode tok/s of the same recipe (the same `convert` flags) applied to a
  synthetic BF16 checkpoint (`moestream synth --hidden 2048 --moe-inter 768 ...`: the expert
  shape of Qwen3-30B-A3B, random weights, near-uniform routing), with --cache experts per
  layer held in RAM (default 1: every recipe then reads nearly its census bytes a token, while
  with more slots each random-weight model falls into its own repetition loop and reads a
  different share), the rest read with O_DIRECT on every miss. Rounds alternate
  the recipes; the median of the rounds is reported.

Usage: python3 scripts/quant_frontier.py --bin target/release/moestream --synth DIR
       --kl results/quant-quality-k256.json [--kl MORE.json] [--workdir /tmp/quant-frontier]
       [--rounds 5] [--tokens 64] [--cache 1] [--recipes "default;row4;..."]
       [--csv OUT.csv] [--plot OUT.png] [--out OUT.md]
   or: python3 scripts/quant_frontier.py --synth DIR --kl ... --from-csv OUT.csv [--tokens N
       --cache N] [--plot OUT.png] [--out OUT.md]   (re-render, no runs)
(--plot needs matplotlib.)
"""

import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quant_quality import RECIPES, container_census, fmt_types  # noqa: E402

DEFAULT_RECIPES = ["row4", "experts q4g64", "g32", "default", "k4m", "k3m", "k2", "experts q3g64",
                   "int8"]


def slug(label):
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


def kl_rows(paths):
    """label -> (kl, top1) of the moestream rows without importance; later files win."""
    out = {}
    for p in paths:
        for r in json.load(open(p))["rows"]:
            m = r.get("moestream")
            if r["side"] == "moestream" and not r["weighting"] and m:
                out[r["label"]] = (m["kl"], m["top1"])
    return out


def convert(a, label, flags):
    out = os.path.join(a.workdir, slug(label))
    if not os.path.exists(os.path.join(out, "moestream-convert.json")):
        subprocess.run([a.bin, "convert", "--input", a.synth, "--output", out, "--quiet"] + flags,
                       check=True, stdout=subprocess.DEVNULL)
    return out


def decode(a, model):
    """(decode tok/s, expert bytes read per decode step) of one run."""
    cmd = [a.bin, "run", "-m", model, "-p", a.prompt, "-n", str(a.tokens), "--ignore-eos",
           "--ram-gb", "none", "--expert-cache", str(a.cache), "--io", "direct", "--no-history",
           "--json"]
    s = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)["stats"]
    return s["decode_steps"] / s["decode_s"], s["decode_bytes_read"] / s["decode_steps"]


def pareto(points):
    """Labels no other point beats on both speed (higher) and KL (lower)."""
    return {l for l, s, k in points
            if not any(s2 >= s and k2 <= k and (s2, k2) != (s, k) for _, s2, k2 in points)}


def render(a, rows, front):
    cfg = json.load(open(os.path.join(a.synth, "config.json")))
    head = (f"Speed: `{a.synth}` ({cfg['num_hidden_layers']} layers, {cfg['num_experts']} experts "
            f"of {cfg['hidden_size']}x{cfg['moe_intermediate_size']}, top-{cfg['num_experts_per_tok']}, "
            f"random weights), {a.cache} experts a layer cached, O_DIRECT reads, {a.tokens} tokens, "
            f"median of {a.rounds} alternating rounds. Quality: {', '.join(a.kl)} (no importance).")
    lines = [head, "",
             "| recipe | widths stored | expert bytes/token (census) | MB read per decode token | "
             "decode tok/s (median; rounds) | ÷ row4, same round (median) | KL (trained) | top-1 | "
             "on the frontier |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    base = next((r["rounds"] for r in rows if r["label"] == "row4"), None)
    for r in sorted(rows, key=lambda r: -r["tok_s"]):
        kl = f"{r['kl']:.5f}" if r["kl"] is not None else "not measured"
        t1 = f"{r['top1']:.4f}" if r["top1"] is not None else ""
        each = ", ".join(f"{v:.2f}" for v in r["rounds"])
        ratio = (f"{statistics.median(v / b for v, b in zip(r['rounds'], base)):.2f}x"
                 if base else "")
        lines.append(f"| {r['label']} | {r['widths']} | {r['per_token']:,} | {r['mb']:.1f} | "
                     f"{r['tok_s']:.2f} ({each}) | {ratio} | {kl} | {t1} | "
                     f"{'yes' if r['label'] in front else ''} |")
    return "\n".join(lines) + "\n"


def plot(rows, front, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    pts = [r for r in rows if r["kl"] is not None]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([r["tok_s"] for r in pts], [r["kl"] for r in pts])
    for r in pts:
        ax.annotate(r["label"], (r["tok_s"], r["kl"]), fontsize=8, xytext=(4, 3),
                    textcoords="offset points")
    fr = sorted((r for r in pts if r["label"] in front), key=lambda r: r["tok_s"])
    ax.plot([r["tok_s"] for r in fr], [r["kl"] for r in fr], "--", lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("disk-bound decode tok/s (synthetic 30B expert shape, random weights)")
    ax.set_ylabel("KL(f32 || recipe), trained k256 fixture")
    ax.set_title("moestream recipes: speed against quality")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default="target/release/moestream")
    p.add_argument("--synth", required=True, help="synthetic BF16 checkpoint (moestream synth)")
    p.add_argument("--kl", action="append", required=True, help="quant_quality.py --json rows")
    p.add_argument("--workdir", default="/tmp/quant-frontier")
    p.add_argument("--recipes", default=";".join(DEFAULT_RECIPES))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--cache", type=int, default=1)
    p.add_argument("--prompt", default="The quick brown fox jumps over the lazy dog.")
    p.add_argument("--csv")
    p.add_argument("--plot")
    p.add_argument("--out")
    p.add_argument("--from-csv", help="re-render the rows of an earlier --csv (no runs)")
    a = p.parse_args()
    if a.from_csv:
        rows = [dict(r, per_token=int(r["per_token"]), mb=float(r["mb"]), tok_s=float(r["tok_s"]),
                     kl=float(r["kl"]) if r["kl"] else None,
                     top1=float(r["top1"]) if r["top1"] else None,
                     rounds=[float(v) for v in r["rounds"].split()])
                for r in csv.DictReader(open(a.from_csv))]
        a.rounds = len(rows[0]["rounds"])
        return finish(a, rows)
    flags = dict(RECIPES)
    labels = [l for l in a.recipes.split(";") if l]
    unknown = [l for l in labels if l not in flags]
    if unknown:
        sys.exit(f"unknown recipes: {unknown} (see quant_quality.RECIPES)")
    os.makedirs(a.workdir, exist_ok=True)
    models = {l: convert(a, l, flags[l]) for l in labels}
    cfg = json.load(open(os.path.join(a.synth, "config.json")))
    top_k, n = cfg["num_experts_per_tok"], cfg["num_experts"]
    runs = {l: [] for l in labels}
    for r in range(a.rounds):
        order = labels if r % 2 == 0 else labels[::-1]
        for l in order:
            runs[l].append(decode(a, models[l]))
            print(f"round {r + 1} {l}: {runs[l][-1][0]:.2f} tok/s", file=sys.stderr)
    kls = kl_rows(a.kl)
    rows = []
    for l in labels:
        c = container_census(models[l], top_k, n)
        kl, top1 = kls.get(l, (None, None))
        rows.append({"label": l, "widths": fmt_types(c["types"]), "per_token": c["per_token"],
                     "mb": statistics.median(b for _, b in runs[l]) / 1e6,
                     "tok_s": statistics.median(t for t, _ in runs[l]),
                     "rounds": [t for t, _ in runs[l]], "kl": kl, "top1": top1})
    finish(a, rows)


def finish(a, rows):
    """The table (--out or stdout), the CSV and the plot of measured rows."""
    front = pareto([(r["label"], r["tok_s"], r["kl"]) for r in rows if r["kl"] is not None])
    md = render(a, rows, front)
    if a.out:
        open(a.out, "w").write(md)
    else:
        print(md)
    if a.csv and not a.from_csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["label", "widths", "per_token", "mb", "tok_s", "kl",
                                              "top1", "rounds"])
            w.writeheader()
            for r in rows:
                w.writerow(dict(r, rounds=" ".join(f"{v:.3f}" for v in r["rounds"])))
    if a.plot:
        plot(rows, front, a.plot)


if __name__ == "__main__":
    main()
