#!/usr/bin/env python3
"""Bit-width sensitivity grid: experts x dense bits on the oracle models.

For every model directory given (default: every committed fixture), the f32 logits of
`eval` over the oracle's eval_ids are saved once (`--save-logits`); then each cell converts
the model with `--expert-bits E --dense-bits D --io-bits D --mtp-bits D` and reports
`eval --ref-logits`: teacher-forced top-1 positions matching the f32 model, and mean KL.
With `--text FILE` each cell also reports `eval --text` perplexity, and with `--tasks
FILE.jsonl` the multiple-choice accuracy of `score` (acc, acc_norm), each beside the
unconverted model's. Writes a markdown table (stdout, or --out FILE). Needs only the built
binary.

With `--formats q4g64,q3g64,...` it makes instead one row per routed-expert format (bit
counts or grouped format names, docs/FORMAT.md) with everything else at 8 bits, beside the
experts' bytes (from the convert census) and bits per weight.

Usage: python3 scripts/quant_grid.py [--bin target/release/moestream] [--out results/quant-grid.md]
       [--text FILE] [--tasks FILE.jsonl] [--bits 16,8,4,2] [--formats F,F,...] [DIR...]
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

BITS = [16, 8, 4, 2]


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)}\n{r.stderr}")
    return r.stdout


def quality(a, model, extra, ref=None):
    """Perplexity (--text) and (acc, acc_norm) (--tasks) of one model, as a tuple of (name,
    value) pairs, and the tasks' per-task correctness (None without --tasks). With `ref` (the
    unconverted model's per-task correctness) also the paired change of acc against it: the
    tasks whose answer changed, and the mean and standard error of the per-task difference
    (a paired comparison resolves far smaller differences than two independent accuracies)."""
    out, right = (), None
    if a.text:
        v = json.loads(run([a.bin, "eval", "--model", model, "--text", a.text, "--json"] + extra))
        out += (("ppl", v["perplexity"]),)
    if a.tasks:
        v = json.loads(run([a.bin, "score", "--model", model, "--tasks", a.tasks, "--json"] + extra))
        out += (("acc", v["acc"]), ("acc_norm", v["acc_norm"]))
        right = [(t["pred"], t["pred"] == t["label"]) for t in v["per_task"]]
        if ref is not None:
            out += paired(right, ref)
    return out, right


def paired(right, ref):
    """(changed, Δacc, SE) of per-task (pred, correct) `right` against `ref`."""
    n = len(ref)
    changed = sum(1 for (p, _), (q, _) in zip(right, ref) if p != q)
    d = [int(c) - int(r) for (_, c), (_, r) in zip(right, ref)]
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / max(n - 1, 1)
    return (("changed", changed), ("Δacc", mean), ("±", (var / n) ** 0.5))


def fmt_quality(q):
    return ", ".join(f"{k} {v:.4g}" if k != "±" else f"± {v:.3f}" for k, v in q)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default="target/release/moestream")
    p.add_argument("--out")
    p.add_argument("--int-dot", choices=["on", "off"], default="on")
    p.add_argument("--text", help="a text file: perplexity per cell (eval --text)")
    p.add_argument("--tasks", help="a JSONL of multiple-choice tasks: acc, acc_norm per cell (score)")
    p.add_argument("--bits", default="16,8,4,2", help="bit widths of the grid's rows and columns")
    p.add_argument("--formats", help="routed-expert formats, one row each, dense at 8 bits")
    p.add_argument("dirs", nargs="*")
    a = p.parse_args()
    if a.formats:
        return formats_table(a)
    global BITS
    BITS = [int(b) for b in a.bits.split(",")]
    dirs = a.dirs or sorted(d for d in glob.glob("tests/fixtures/*") if os.path.isdir(d))
    extra = [] if a.int_dot == "on" else ["--no-int-dot"]
    rows, totals = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for d in dirs:
            name = os.path.basename(os.path.normpath(d))
            ids = ",".join(map(str, json.load(open(os.path.join(d, "oracle.json")))["eval_ids"]))
            ref = os.path.join(tmp, name + ".ref.safetensors")
            run([a.bin, "eval", "--model", d, "--prompt-ids", ids, "--save-logits", ref])
            base, base_right = quality(a, d, extra)
            cells = {}
            for e in BITS:
                for dn in BITS:
                    out = os.path.join(tmp, f"{name}-{e}-{dn}")
                    run([a.bin, "convert", "--input", d, "--output", out, "--quiet",
                         "--expert-bits", str(e), "--dense-bits", str(dn),
                         "--io-bits", str(dn), "--mtp-bits", str(dn)])
                    v = json.loads(run([a.bin, "eval", "--model", out, "--prompt-ids", ids,
                                        "--ref-logits", ref] + extra))["ref"]
                    q, _ = quality(a, out, extra, base_right)
                    cells[(e, dn)] = (v["top1_matched"], v["positions"], v["mean_kl"]) + q
                    t = totals.setdefault((e, dn), [0, 0, 0.0, 0])
                    t[0] += v["top1_matched"]; t[1] += v["positions"]; t[2] += v["mean_kl"]; t[3] += 1
                    run(["rm", "-rf", out])
            rows.append((name, cells, base))
            print(f"{name}: done", file=sys.stderr)
    lines = [
        "# Quantization sensitivity grid",
        "",
        "Teacher-forced positions whose argmax matches the f32 model, and mean KL(f32 ‖ quantized)",
        "in nats, per model; rows are routed-expert bits, columns dense bits (attention, dense",
        "MLP, shared experts, embeddings, lm_head, MTP). 16 = BF16. Integer dot products "
        + ("on (the default)." if a.int_dot == "on" else "off (`--no-int-dot`)."),
        "",
        "Command: `cargo build --release && python3 scripts/quant_grid.py"
        + ("" if a.int_dot == "on" else " --int-dot off") + " --out results/quant-grid.md`",
        "",
        "## All models together (positions matched / total, mean of the per-model mean KL)",
        "",
        "| experts \\ dense | " + " | ".join(str(b) for b in BITS) + " |",
        "|---|" + "---|" * len(BITS),
    ]
    for e in BITS:
        cells = []
        for dn in BITS:
            m, n, kl, k = totals[(e, dn)]
            cells.append(f"{m}/{n}, {kl / k:.4f}")
        lines.append(f"| **{e}** | " + " | ".join(cells) + " |")
    for name, cells, base in rows:
        lines += ["", f"## {name}", ""]
        if base:
            lines += [f"Unconverted: {fmt_quality(base)}.", ""]
        lines += ["| experts \\ dense | " + " | ".join(str(b) for b in BITS) + " |",
                  "|---|" + "---|" * len(BITS)]
        for e in BITS:
            lines.append(f"| **{e}** | " + " | ".join(
                f"{cells[(e, dn)][0]}/{cells[(e, dn)][1]}, {cells[(e, dn)][2]:.4f}"
                + (f"; {fmt_quality(cells[(e, dn)][3:])}" if len(cells[(e, dn)]) > 3 else "")
                for dn in BITS) + " |")
    text = "\n".join(lines) + "\n"
    if a.out:
        open(a.out, "w").write(text)
    else:
        print(text)


def expert_bytes(out):
    """Bytes of the routed experts (all their widths) from a container's census."""
    census = json.load(open(os.path.join(out, "moestream-convert.json")))["census"]
    return sum(w["bytes"] for w in census["rows"]["expert"].values())


def formats_table(a):
    """One row per routed-expert format: KL and top-1 against f32 per model."""
    dirs = a.dirs or sorted(d for d in glob.glob("tests/fixtures/*") if os.path.isdir(d))
    extra = [] if a.int_dot == "on" else ["--no-int-dot"]
    fmts = a.formats.split(",")
    lines = ["| experts | " + " | ".join(
        f"{os.path.basename(os.path.normpath(d))}: expert bytes, top-1, mean KL" for d in dirs) + " |",
        "|---|" + "---|" * len(dirs)]
    cells = {f: [] for f in fmts}
    with tempfile.TemporaryDirectory() as tmp:
        for d in dirs:
            name = os.path.basename(os.path.normpath(d))
            ids = ",".join(map(str, json.load(open(os.path.join(d, "oracle.json")))["eval_ids"]))
            ref = os.path.join(tmp, name + ".ref.safetensors")
            run([a.bin, "eval", "--model", d, "--prompt-ids", ids, "--save-logits", ref])
            for f in fmts:
                out = os.path.join(tmp, f"{name}-{f}")
                run([a.bin, "convert", "--input", d, "--output", out, "--quiet", "--expert-bits", f,
                     "--dense-bits", "8", "--io-bits", "8", "--mtp-bits", "8"])
                v = json.loads(run([a.bin, "eval", "--model", out, "--prompt-ids", ids,
                                    "--ref-logits", ref] + extra))["ref"]
                nbytes = expert_bytes(out)
                q, _ = quality(a, out, extra)
                cells[f].append(f"{nbytes:,}, {v['top1_matched']}/{v['positions']}, {v['mean_kl']:.4f}"
                                + (f"; {fmt_quality(q)}" if q else ""))
                run(["rm", "-rf", out])
            print(f"{name}: done", file=sys.stderr)
    for f in fmts:
        lines.append(f"| **{f}** | " + " | ".join(cells[f]) + " |")
    text = "\n".join(lines) + "\n"
    if a.out:
        open(a.out, "w").write(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
