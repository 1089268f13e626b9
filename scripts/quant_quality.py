#!/usr/bin/env python3
"""moestream's formats and recipes beside llama.cpp's own quantizations of the same weights
(issue 30, item 5): results/quant-quality.md. Run by a person, never by CI.

For one Qwen3-MoE checkpoint (default: the trained fixture):
1. The held-out text is cut into two disjoint slices: calibration (the first --calib-chars
   characters) and evaluation (the last --eval-chars).
2. llama.cpp: `moestream export-gguf --type f32` writes the f32 GGUF; llama-imatrix makes an
   importance matrix on the calibration slice; llama-quantize makes each of --llama-types
   with and without it (the types it actually chose, after its fallbacks on rows that are not
   whole blocks, are read back from each GGUF); llama-perplexity scores each against the f32
   GGUF (--kl-divergence-base / --kl-divergence: mean KL, same top-1, PPL(Q)).
3. moestream: every recipe of RECIPES, without and with `convert --importance` (from
   `moestream calibrate` on the same calibration slice), and every llama.cpp GGUF that its
   GGUF path reads, scored by moestream against the unconverted checkpoint.

moestream's scores use llama-perplexity's own yardstick: the evaluation tokens are cut into
non-overlapping chunks of --ctx tokens, each teacher-forced from an empty cache (`eval
--prompt-ids --save-logits`), and the positions of each chunk's second half score: mean
KL(ref ‖ q) of the next-token distributions, top-1 agreement with the reference, and the
perplexity of the text's next tokens. Tokens come from the checkpoint's tokenizer.json.
With --tasks (scripts/make_choice_set.py), every row moestream reads also gets `score`'s
multiple-choice accuracy, and its change paired with the unconverted model's per-task answers
(the tasks whose answer moved, the mean change and its standard error): llama.cpp's GGUFs are
scored by moestream's GGUF path, as for KL.

Bytes per token: the routed-expert bytes one token reads, top_k × (all routed experts'
bytes / experts per layer), from the container's census or the GGUF's tensor sizes; and the
whole model's bytes on disk.

Needs numpy and tokenizers (scripts/requirements.txt), a built moestream, and a llama.cpp
source tree with llama-quantize, llama-imatrix and llama-perplexity built under build/bin
(its gguf-py reads the GGUFs' tensor types). On a CPU with AMX, llama.cpp 0c1e570 repacks
Q8_0/Q4_0 weights for its AMX kernels and `llama-perplexity --kl-divergence` segfaulted there
(results/quant-quality.md, the k256 section): run with LLAMA_ARG_REPACK=false (--no-repack).

Usage: python3 scripts/quant_quality.py --bin target/release/moestream --llama-cpp DIR
       --heldout /tmp/heldout.txt [--model tests/fixtures/trained/qwen3_moe]
       [--workdir /tmp/quant-quality] [--json ROWS.json] [--out TABLES.md]
       [--part llama.cpp|moestream] [--llama-types Q8_0,...]
   or: python3 scripts/quant_quality.py --render ROWS.json [ROWS.json...] [--out TABLES.md]
"""

import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quant_grid import paired  # noqa: E402  (the paired change of accuracy, one definition)

LLAMA_TYPES = ["Q8_0", "Q6_K", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K", "IQ4_XS"]
# (label, convert flags): named recipes, then routed-expert formats over the default recipe.
RECIPES = [
    ("q8_0 (every matrix)", ["--expert-bits", "q8_0", "--dense-bits", "q8_0", "--io-bits", "q8_0"]),
    ("int8", ["--recipe", "int8"]),
    ("k4m", ["--recipe", "k4m"]),
    ("k3m", ["--recipe", "k3m"]),
    ("k2", ["--recipe", "k2"]),
    ("down8", ["--recipe", "down8"]),
    ("g32", ["--recipe", "g32"]),
    ("default", ["--recipe", "default"]),
    ("row4", ["--recipe", "row4"]),
    ("experts q4g64", ["--expert-bits", "q4g64"]),
    ("gate/up q4g64, down q4g32", ["--bits", "expert_gate_up=q4g64", "--bits", "expert_down=q4g32"]),
    ("gate/up q4g64, down int8", ["--bits", "expert_gate_up=q4g64", "--bits", "expert_down=int8"]),
    ("gate/up q4g64, down q8_0", ["--bits", "expert_gate_up=q4g64", "--bits", "expert_down=q8_0"]),
    # the default recipe's widths as flags (for a binary built before it became the default)
    ("gate/up q4g64, down q5_k", ["--bits", "expert_gate_up=q4g64", "--bits", "expert_down=q5_k"]),
    ("experts q4g64a", ["--expert-bits", "q4g64a"]),
    ("experts q3g64", ["--expert-bits", "q3g64"]),
    ("gate/up q3g64, down q4g64", ["--bits", "expert_gate_up=q3g64", "--bits", "expert_down=q4g64"]),
    ("experts q2g64", ["--expert-bits", "q2g64"]),
    ("gate/up q2g64, down q4g64", ["--bits", "expert_gate_up=q2g64", "--bits", "expert_down=q4g64"]),
    ("tiny", ["--recipe", "tiny"]),
]


class Failed(Exception):
    pass


def run(cmd, log=None, env=None):
    """Runs `cmd` (with `env` added to the environment); returns stdout (with `log`: stdout
    and stderr, written to that file), or raises Failed with the last lines of stderr."""
    if log:
        with open(log, "w") as f:
            f.write(" ".join(cmd) + "\n")
            f.flush()
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT,
                                env=dict(os.environ, **(env or {}))).returncode
        out = open(log).read()
        err = out
    else:
        r = subprocess.run(cmd, capture_output=True, text=True)
        rc, out, err = r.returncode, r.stdout, r.stderr
    if rc != 0:
        tail = " / ".join(err.strip().splitlines()[-3:])
        raise Failed(f"`{os.path.basename(cmd[0])} {cmd[1]}` failed: {tail}")
    return out


def read_logits(path):
    """`eval --save-logits` output (safetensors: `logits` f32 (T, V), `ids` u32 (T))."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    t = header["logits"]
    a, b = t["data_offsets"]
    return np.frombuffer(data[a:b], dtype="<f4").reshape(t["shape"])


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


class Scorer:
    """moestream's scores of a model against the reference over the evaluation chunks."""

    def __init__(self, a, ids, ref_model, work):
        self.a, self.work = a, work
        self.chunks = [ids[i * a.ctx:(i + 1) * a.ctx] for i in range(len(ids) // a.ctx)]
        self.first = a.ctx // 2
        self.ref = [self.logprobs(ref_model, c) for c in self.chunks]
        self.ref_model = ref_model
        self.ref_tasks = self.choices(ref_model) if a.tasks else None

    def choices(self, model):
        """Per-task (prediction, correct) of `moestream score` on --tasks."""
        v = json.loads(run([self.a.bin, "score", "--model", model, "--tasks", self.a.tasks, "--json"]))
        return [(t["pred"], t["pred"] == t["label"]) for t in v["per_task"]]

    def accuracy(self, model):
        """acc on --tasks, and the paired change against the unconverted model: the tasks whose
        answer moved, the mean per-task change of correctness and its standard error."""
        right = self.ref_tasks if model is None else self.choices(model)
        (_, changed), (_, mean), (_, se) = paired(right, self.ref_tasks)
        return {"acc": sum(c for _, c in right) / len(right), "tasks": len(right),
                "changed": changed, "dacc": mean, "dacc_se": se}

    def logprobs(self, model, chunk):
        """Log-probabilities at the scored positions (first .. ctx-2) of one chunk."""
        path = os.path.join(self.work, "logits.safetensors")
        run([self.a.bin, "eval", "--model", model, "--prompt-ids", ",".join(map(str, chunk)),
             "--save-logits", path])
        lp = log_softmax(read_logits(path)[self.first:self.a.ctx - 1])
        os.remove(path)
        return lp

    def score(self, model):
        kl = nll = 0.0
        top1 = n = 0
        for chunk, ref in zip(self.chunks, self.ref):
            lp = ref if model is None else self.logprobs(model, chunk)
            kl += float(np.maximum((np.exp(ref) * (ref - lp)).sum(axis=1), 0.0).sum())
            top1 += int((ref.argmax(axis=1) == lp.argmax(axis=1)).sum())
            nxt = np.asarray(chunk[self.first + 1:self.a.ctx])
            nll -= float(lp[np.arange(len(nxt)), nxt].sum())
            n += len(nxt)
        out = {"kl": kl / n, "top1": top1 / n, "ppl": float(np.exp(nll / n)), "positions": n}
        if self.ref_tasks is not None:
            out["choice"] = self.accuracy(model)
        return out


def llama_bin(a, name):
    return os.path.join(a.llama_cpp, "build", "bin", name)


EXIT_WAIT = "#include <unistd.h>\n__attribute__((destructor)) static void exit_wait(void) { usleep(500000); }\n"


def exit_wait(a):
    """A library whose destructor waits half a second at exit, preloaded into llama-perplexity:
    its logger's thread is never joined, so on a busy machine its last lines (the statistics)
    are lost when the process exits first."""
    lib = os.path.join(a.workdir, "exit_wait.so")
    if not os.path.exists(lib):
        src = os.path.join(a.workdir, "exit_wait.c")
        open(src, "w").write(EXIT_WAIT)
        run(["cc", "-shared", "-fPIC", "-o", lib, src])
    return lib


def llama_perplexity(a, model, eval_txt, base, make_base, log):
    """llama-perplexity's scores: (ppl, mean KL, same top-1) or (ppl,) when making the base."""
    cmd = [llama_bin(a, "llama-perplexity"), "-m", model, "-f", eval_txt, "-c", str(a.ctx),
           "-b", str(a.ctx), "-t", str(a.threads), "--kl-divergence-base", base]
    if not make_base:
        cmd.append("--kl-divergence")
    for _ in range(5):  # its last lines are now and then lost at exit: run it again
        out = run(cmd, log, {"LD_PRELOAD": exit_wait(a)})
        n = int(re.search(r"over (\d+) chunks", out).group(1))
        if re.search(rf"\[{n}\][0-9.]+,|^\s*{n}\s+[0-9.]+ ±", out, re.M):
            break
    else:
        raise Failed(f"llama-perplexity {model}: its last chunk's line lost five times")
    if make_base:  # the running estimate after the last chunk, [N]PPL, is the final one
        return {"ppl": float(re.findall(r"\[\d+\]([0-9.]+),", out)[-1])}
    stats = re.search(r"Mean PPL\(Q\)\s*:\s*([0-9.]+).*?Mean\s+KLD:\s*([0-9.]+).*?Same top p:\s*([0-9.]+)",
                      out, re.S)
    if stats is None:
        # Its statistics are now and then lost at exit (seen here on every try of some types):
        # the last chunk's line carries the same running means, KL to 5 decimals.
        last = re.findall(r"^\s*\d+\s+([0-9.]+) ±\s+\S+\s+\S+ ±\s+\S+\s+([0-9.]+) ±.*?([0-9.]+) ±\s+\S+ %$",
                          out, re.M)[-1]
        ppl, kl, top = map(float, last)
    else:
        ppl, kl, top = map(float, stats.groups())
    return {"ppl": ppl, "kl": kl, "top1": top / 100, "from_chunk_line": stats is None}


def gguf_census(path, top_k, n_experts):
    """Routed-expert bytes per token, file bytes, and the block types by tensor class."""
    from gguf import GGUFReader

    r = GGUFReader(path)
    experts, types = 0, {}
    for t in r.tensors:
        cls = gguf_class(t.name)
        types.setdefault(cls, {}).setdefault(t.tensor_type.name, 0)
        types[cls][t.tensor_type.name] += 1
        if cls.startswith("expert"):
            experts += int(t.n_bytes)
    return {"per_token": top_k * experts // n_experts, "file": os.path.getsize(path), "types": types}


def gguf_class(name):
    if "_exps" in name:
        return "expert down" if "down" in name else "expert gate/up"
    if "_shexp" in name:
        return "shared"
    if ".attn_" in name and "norm" not in name:
        return "attention"
    if name.startswith("token_embd"):
        return "embed"
    if name.startswith("output.") and "norm" not in name:
        return "lm_head"
    if "ffn_gate_inp" in name:
        return "router"
    return "norm/other"


def container_census(out, top_k, n_experts):
    census = json.load(open(os.path.join(out, "moestream-convert.json")))["census"]["rows"]
    experts = sum(r["bytes"] for c, ws in census.items() if c.startswith("expert") for r in ws.values())
    types = {c: {w: r["tensors"] for w, r in ws.items()} for c, ws in census.items()}
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out) if f.endswith(".safetensors"))
    return {"per_token": top_k * experts // n_experts, "file": size, "types": types}


def fmt_types(types):
    """The routed experts' widths, then every other matrix's (norms and routers left out)."""
    def of(classes):
        return "+".join(sorted({w for c in classes for w in types.get(c, {})}))

    rest = of(["attention", "shared", "dense", "embed", "lm_head", "mtp"])
    return f"gate/up {of(['expert gate/up', 'expert_gate_up'])}, down {of(['expert down', 'expert_down'])}; rest {rest}"


def tokenize(model_dir, text):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json")).encode(
        text, add_special_tokens=False).ids


def llama_rows(a, f32_gguf, calib, eval_txt, scorer, moe, rows, logs):
    """Every llama.cpp type, without and with the imatrix."""
    imatrix = os.path.join(a.workdir, "imatrix.gguf")
    run([llama_bin(a, "llama-imatrix"), "-m", f32_gguf, "-f", calib, "-o", imatrix, "-c",
         str(a.ctx), "-t", str(a.threads)], os.path.join(logs, "imatrix.log"))
    base = os.path.join(a.workdir, "f32.kld")
    f32 = llama_perplexity(a, f32_gguf, eval_txt, base, True, os.path.join(logs, "ppl-f32.log"))
    rows.append(row("llama.cpp", "F32 (export-gguf)", "", gguf_census(f32_gguf, *moe), f32_gguf,
                    scorer, {"ppl": f32["ppl"], "kl": 0.0, "top1": 1.0}))
    for ty in a.llama_types.split(","):
        for imat in (False, True):
            tag = f"{ty}{'-imat' if imat else ''}"
            dst = os.path.join(a.workdir, f"{tag}.gguf")
            cmd = [llama_bin(a, "llama-quantize")] + (["--imatrix", imatrix] if imat else [])
            run(cmd + [f32_gguf, dst, ty, str(a.threads)], os.path.join(logs, f"quantize-{tag}.log"))
            ll = llama_perplexity(a, dst, eval_txt, base, False, os.path.join(logs, f"ppl-{tag}.log"))
            rows.append(row("llama.cpp", ty, "imatrix" if imat else "", gguf_census(dst, *moe), dst,
                            scorer, ll))
            os.remove(dst)
            print(f"llama.cpp {tag}: done", file=sys.stderr)


def row(side, label, weighting, census, model, scorer, llama=None):
    try:
        ms, err = scorer.score(model), None
    except Failed as e:
        ms, err = None, str(e)
    return {"side": side, "label": label, "weighting": weighting, "census": census,
            "moestream": ms, "error": err, "llama": llama}


def moestream_rows(a, calib, scorer, moe, rows):
    imp = os.path.join(a.workdir, "importance.safetensors")
    run([a.bin, "calibrate", "--model", a.model, "--text", calib, "--window", str(a.ctx), "--out", imp])
    for label, flags in RECIPES:
        if a.recipes and label not in [x.strip() for x in a.recipes.split(";")]:
            continue
        for weighted in (False, True):
            out = os.path.join(a.workdir, "container")
            shutil.rmtree(out, ignore_errors=True)
            try:
                run([a.bin, "convert", "--input", a.model, "--output", out, "--quiet"] + flags
                    + (["--importance", imp] if weighted else []))
            except Failed as e:
                rows.append({"side": "moestream", "label": label, "weighting": "importance" if weighted else "",
                             "census": None, "moestream": None, "error": str(e), "llama": None})
                continue
            rows.append(row("moestream", label, "importance" if weighted else "",
                            container_census(out, *moe), out, scorer))
            shutil.rmtree(out)
            print(f"moestream {label}{' +importance' if weighted else ''}: done", file=sys.stderr)


def table(rows):
    lines = ["| expert bytes/token | file bytes | row | weighting | widths stored | KL (moestream) "
             "| top-1 (moestream) | ppl (moestream) | KL (llama-perplexity) | same top-1 (llama) "
             "| ppl (llama) | choice acc, Δacc ± SE (moestream) |",
             "|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    errors = []
    for r in sorted(rows, key=lambda r: (r["census"] or {"per_token": 1 << 62})["per_token"]):
        c, m, ll = r["census"], r["moestream"], r["llama"]
        if m is None and r["error"] not in errors:
            errors.append(r["error"])
        mcells = ([f"{m['kl']:.5f}", f"{m['top1']:.4f}", f"{m['ppl']:.3f}"] if m
                  else [f"not read ({errors.index(r['error']) + 1})", "", ""])
        lcells = [f"{ll['kl']:.5f}", f"{ll['top1']:.4f}", f"{ll['ppl']:.3f}"] if ll else ["", "", ""]
        ch = (m or {}).get("choice")
        ccell = (f"{ch['acc']:.4f}, {ch['dacc']:+.4f} ± {ch['dacc_se']:.4f} ({ch['changed']} moved)"
                 if ch else "")
        lines.append("| " + " | ".join(
            ([f"{c['per_token']:,}", f"{c['file']:,}"] if c else ["", ""])
            + [f"{r['side']} {r['label']}", r["weighting"], fmt_types(c["types"]) if c else ""]
            + mcells + lcells + [ccell]) + " |")
    return lines + [""] + [f"({i}) {e}" for i, e in enumerate(errors, 1)]


def kl_of(r):
    """A llama.cpp row's KL on moestream's yardstick where its GGUF path reads the file."""
    if r["moestream"]:
        return r["moestream"]["kl"], "moestream"
    return r["llama"]["kl"], "llama-perplexity"


def target(rows):
    """For every llama.cpp size: the best moestream row of no more bytes per token."""
    ours = [r for r in rows if r["side"] == "moestream" and r["moestream"] and r["census"]]
    lines = ["| llama.cpp row | bytes/token | its KL (yardstick) | best moestream row ≤ its bytes "
             "| bytes/token | KL | holds |", "|---|---:|---:|---|---:|---:|---|"]
    for r in rows:
        if r["side"] != "llama.cpp" or r["label"].startswith("F32"):
            continue
        kl, how = kl_of(r)
        fit = [o for o in ours if o["census"]["per_token"] <= r["census"]["per_token"]]
        best = min(fit, key=lambda o: o["moestream"]["kl"], default=None)
        name = f"{r['label']}{' + imatrix' if r['weighting'] else ''}"
        if best is None:
            lines.append(f"| {name} | {r['census']['per_token']:,} | {kl:.5f} ({how}) | none | | | no |")
            continue
        b = best["moestream"]["kl"]
        lines.append(f"| {name} | {r['census']['per_token']:,} | {kl:.5f} ({how}) | {best['label']}"
                     f"{' + importance' if best['weighting'] else ''} | {best['census']['per_token']:,} "
                     f"| {b:.5f} | {'yes' if b <= kl else 'no'} |")
    return lines


def half_of_default(rows):
    """Rows with at most half per-row int4's KL (`row4`, the default before issue 30) at no more
    than 10% more bytes per token."""
    ours = [r for r in rows if r["side"] == "moestream" and r["moestream"] and r["census"]]
    base = next((r for r in ours if r["label"] == "row4" and not r["weighting"]), None)
    if base is None:
        return ["(the row4 recipe was not measured)"]
    kl, nbytes = base["moestream"]["kl"], base["census"]["per_token"]
    fit = [r for r in ours if r["census"]["per_token"] <= 1.1 * nbytes and r["moestream"]["kl"] <= kl / 2]
    lines = [f"The row4 recipe (routed experts per-row int4, no importance): KL {kl:.5f} at "
             f"{nbytes:,} bytes per token. Rows with KL ≤ {kl / 2:.5f} at ≤ {int(1.1 * nbytes):,} bytes:", ""]
    lines += [f"- {r['label']}{' + importance' if r['weighting'] else ''}: KL {r['moestream']['kl']:.5f}, "
              f"{r['census']['per_token']:,} bytes per token ({r['census']['per_token'] / nbytes - 1:+.1%})"
              for r in sorted(fit, key=lambda r: r["moestream"]["kl"])] or ["- none"]
    return lines


def render(header, rows):
    lines = [header, ""] + table(rows) + ["", "### At every llama.cpp size", ""] + target(rows)
    return "\n".join(lines + ["", "### Against per-row int4", ""] + half_of_default(rows)) + "\n"


def measure(a):
    """Every row, and a line saying what was measured on what."""
    sys.path.insert(0, os.path.join(a.llama_cpp, "gguf-py"))
    logs = os.path.join(a.workdir, "logs")
    os.makedirs(logs, exist_ok=True)
    text = open(a.heldout).read()
    if a.calib_chars + a.eval_chars > len(text):
        sys.exit(f"{a.heldout}: {len(text)} characters, fewer than --calib-chars + --eval-chars")
    calib, eval_txt = os.path.join(a.workdir, "calib.txt"), os.path.join(a.workdir, "eval.txt")
    open(calib, "w").write(text[:a.calib_chars])
    open(eval_txt, "w").write(text[-a.eval_chars:])
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    n_exp = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg["n_routed_experts"]
    moe = (cfg["num_experts_per_tok"], n_exp)
    t0 = time.time()
    scorer = Scorer(a, tokenize(a.model, text[-a.eval_chars:]), a.model, a.workdir)
    rows = [row("moestream", "unconverted checkpoint (reference)", "", None, None, scorer)]
    tasks = f"; multiple choice: {a.tasks}, {len(scorer.ref_tasks)} tasks" if a.tasks else ""
    if a.part in ("all", "llama.cpp"):
        f32_gguf = os.path.join(a.workdir, "f32.gguf")
        run([a.bin, "export-gguf", "--model", a.model, "--out", f32_gguf, "--type", "f32"])
        llama_rows(a, f32_gguf, calib, eval_txt, scorer, moe, rows, logs)
    if a.part in ("all", "moestream"):
        moestream_rows(a, calib, scorer, moe, rows)
    header = (f"Model {a.model}; calibration: the first {a.calib_chars:,} characters of {a.heldout}; "
              f"evaluation: its last {a.eval_chars:,} ({len(scorer.chunks)} chunks of {a.ctx} tokens, "
              f"{rows[0]['moestream']['positions']} scored positions){tasks}; {time.time() - t0:.0f} s.")
    return header, rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default="target/release/moestream")
    p.add_argument("--llama-cpp", help="llama.cpp source tree with build/bin tools")
    p.add_argument("--model", default="tests/fixtures/trained/qwen3_moe")
    p.add_argument("--heldout", help="scripts/moe_corpus.py --dump-heldout FILE")
    p.add_argument("--calib-chars", type=int, default=60000)
    p.add_argument("--eval-chars", type=int, default=20000)
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--llama-types", default=",".join(LLAMA_TYPES))
    p.add_argument("--workdir", default="/tmp/quant-quality")
    p.add_argument("--out", help="markdown tables (default: stdout)")
    p.add_argument("--json", help="every row's figures as JSON")
    p.add_argument("--part", choices=["all", "llama.cpp", "moestream"], default="all",
                   help="measure only llama.cpp's rows or only moestream's (two runs side by side, "
                   "each with its own --workdir and --json, joined by --render)")
    p.add_argument("--tasks", help="a JSONL of multiple-choice tasks (scripts/make_choice_set.py): every "
                   "row moestream reads also gets `score`'s accuracy, paired with the unconverted model's")
    p.add_argument("--recipes", help="only these rows of RECIPES (labels, separated by ';': labels hold commas)")
    p.add_argument("--render", metavar="JSON", nargs="+", help="only re-render the rows of earlier --json files")
    a = p.parse_args()
    if a.render:
        saved = [json.load(open(f)) for f in a.render]
        header = saved[0]["header"]
        rows, seen = [], set()
        for r in (r for x in saved for r in x["rows"]):  # the reference and F32 rows once
            if (r["side"], r["label"], r["weighting"]) not in seen:
                seen.add((r["side"], r["label"], r["weighting"]))
                rows.append(r)
    else:
        if not (a.llama_cpp and a.heldout):
            p.error("--llama-cpp and --heldout are needed to measure")
        os.makedirs(a.workdir, exist_ok=True)
        header, rows = measure(a)
        if a.json:
            json.dump({"header": header, "rows": rows}, open(a.json, "w"), indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(render(header, rows))
    else:
        sys.stdout.write(render(header, rows))


if __name__ == "__main__":
    main()
