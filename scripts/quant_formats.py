#!/usr/bin/env python3
"""Quality of the container's storage formats on the trained fixtures, one row per convert flag set.

For each model directory, saves the unconverted (BF16) model's teacher-forced logits over its
oracle's eval_ids once (`eval --save-logits`), then for each row converts with the row's flags and
reports `eval --ref-logits`: positions whose argmax matches, mean KL(ref || converted) in nats,
and the bytes the census gives the row's class (what a token streams, for experts), with the
widths the census names (block types fall back on rows that are not whole blocks:
docs/FORMAT.md). Writes a markdown table to stdout. Needs only the built binary.

Usage: python3 scripts/quant_formats.py [--bin target/release/moestream] DIR...
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

# (label, convert flags, census class (prefix) whose bytes and widths the row reports)
ROWS = [
    ("experts int4 per-row (default)", [], "expert"),
    ("experts q4_0", ["--quant", "q4_0"], "expert"),
    ("experts q4_k", ["--quant", "q4_k"], "expert"),
    ("experts q5_k", ["--quant", "q5_k"], "expert"),
    ("experts q6_k", ["--quant", "q6_k"], "expert"),
    ("experts q8_0", ["--quant", "q8_0"], "expert"),
    ("experts int8 per-row", ["--expert-bits", "8"], "expert"),
    ("dense int4 per-row", ["--bits", "dense=4"], "dense"),
    ("dense q4_k", ["--bits", "dense=q4_k"], "dense"),
    ("dense q5_k", ["--bits", "dense=q5_k"], "dense"),
    ("dense q6_k", ["--bits", "dense=q6_k"], "dense"),
]


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)}\n{r.stderr}")
    return r.stdout


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default="target/release/moestream")
    p.add_argument("dirs", nargs="+")
    a = p.parse_args()
    lines = ["| model | row | widths stored | class bytes | top-1 | mean KL |", "|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for d in a.dirs:
            name = os.path.basename(os.path.normpath(d))
            ids = ",".join(map(str, json.load(open(os.path.join(d, "oracle.json")))["eval_ids"]))
            ref = os.path.join(tmp, name + ".ref.safetensors")
            run([a.bin, "eval", "--model", d, "--prompt-ids", ids, "--save-logits", ref])
            for label, flags, cls in ROWS:
                out = os.path.join(tmp, "c")
                run([a.bin, "convert", "--input", d, "--output", out, "--quiet"] + flags)
                census = json.load(open(os.path.join(out, "moestream-convert.json")))["census"]["rows"]
                widths = {}  # routed experts are two classes: expert_gate_up, expert_down
                for c, ws in census.items():
                    for w, r in ws.items():
                        if c.startswith(cls):
                            t = widths.setdefault(w, {"tensors": 0, "bytes": 0})
                            t["tensors"] += r["tensors"]
                            t["bytes"] += r["bytes"]
                if not widths:
                    run(["rm", "-rf", out])
                    continue
                v = json.loads(run([a.bin, "eval", "--model", out, "--prompt-ids", ids, "--ref-logits", ref]))["ref"]
                stored = ", ".join(f"{w} ({r['tensors']})" for w, r in sorted(widths.items()))
                nbytes = sum(r["bytes"] for r in widths.values())
                lines.append(f"| {name} | {label} | {stored} | {nbytes} | {v['top1_matched']}/{v['positions']} | {v['mean_kl']:.5f} |")
                run(["rm", "-rf", out])
            print(f"{name}: done", file=sys.stderr)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
