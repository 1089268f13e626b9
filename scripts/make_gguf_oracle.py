#!/usr/bin/env python3
"""Build the GGUF fixtures and llama.cpp's reference outputs on them.

llama.cpp is the oracle for GGUF files. This script uses llama.cpp's own
converter (convert_hf_to_gguf.py) and quantizer (llama_model_quantize) and
runs llama.cpp through the llama-cpp-python package, built from source:

    CMAKE_ARGS="-DGGML_NATIVE=ON" pip install --no-binary llama-cpp-python llama-cpp-python

The converter is not in that package: point --llama-cpp at a llama.cpp
source tree (the llama-cpp-python sdist carries one under vendor/llama.cpp).
The venv also needs torch, transformers, numpy (as scripts/make_oracle.py).

Two kinds of fixture, under tests/fixtures/gguf/:

1. ``<family>-f32.gguf`` for every family llama.cpp converts, from the
   committed Hugging Face fixtures (tests/fixtures/<family>): the engine
   must give transformers' tokens on them (oracle.json of that family).
2. ``olmoe-split-0000K-of-0000N.gguf``: OLMoE's f32 file split by tensor count,
   and ``mixtral-<f16|bf16>.gguf`` with ``mixtral-<f16|bf16>.json`` (llama.cpp's
   greedy tokens and last logits on them; ``--float-only`` makes just these).
3. ``qwen3moe-<TYPE>.gguf`` (Q8_0, Q4_0, Q4_K_M, Q5_K_M) quantized from a
   Qwen3-MoE checkpoint whose dimensions are multiples of 256 (K-quant
   blocks), made by scripts/make_oracle.py --all-sparse, and
   ``qwen3moe-<TYPE>.json``: llama.cpp's greedy tokens from the prompt ids,
   its logits after the prompt, and its tokenization of the prompt text;
   the files carry a ChatML chat template, and the JSON what transformers'
   apply_chat_template renders with it.

llama.cpp runs with an f32 KV cache (type_k / type_v F32), 2 threads, CPU.

Usage::

    python scripts/make_gguf_oracle.py --llama-cpp /path/to/llama.cpp
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(REPO_ROOT, "tests", "fixtures")
OUT_DIR = os.path.join(FIXTURES, "gguf")
F32_FAMILIES = ["qwen2_moe", "olmoe", "mixtral", "deepseek_v3", "glm4_moe"]
# The family of the F16/BF16 fixtures.
FLOAT_FAMILY = "mixtral"
N_GREEDY = 20
# llama.cpp's llama_ftype values (include/llama.h).
FTYPES = {"Q8_0": 7, "Q4_0": 2, "Q4_K_M": 15, "Q5_K_M": 17}
GGML_TYPE_F32 = 0
# The quantized fixture: every width a multiple of 256 so K-quant blocks fit.
QUANT_SHAPE = [
    "--family", "qwen3_moe", "--all-sparse", "--hidden", "256", "--layers", "2",
    "--experts", "4", "--top-k", "2", "--heads", "4", "--kv-heads", "2", "--head-dim", "64",
    "--moe-inter", "256", "--inter", "256", "--init-std", "0.05",
]


# A ChatML template (Qwen's shape) carried into the quantized files as tokenizer.chat_template.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHAT_MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Where did the cat go?"},
]


def add_chat_template(model_dir: str) -> str:
    """Puts CHAT_TEMPLATE in the checkpoint's tokenizer_config.json; returns what
    transformers renders for CHAT_MESSAGES with a generation prompt."""
    import transformers

    path = os.path.join(model_dir, "tokenizer_config.json")
    cfg = json.load(open(path))
    cfg["chat_template"] = CHAT_TEMPLATE
    json.dump(cfg, open(path, "w"), indent=1)
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    return tok.apply_chat_template(CHAT_MESSAGES, tokenize=False, add_generation_prompt=True)


def convert(llama_cpp: str, model_dir: str, out: str, extra: tuple[str, ...] = ()) -> None:
    """Runs llama.cpp's converter on `model_dir` (f32 output).

    Our fixtures' tokenizer is a byte-level BPE trained by make_oracle.py with GPT-2's
    pre-tokenizer regex; the converter only knows published tokenizers by hash, so it is
    told the pre-tokenizer (`gpt-2`) instead of guessing, and GLM's vocabulary reader (which
    looks for GLM's own special tokens) is given the plain GPT-2 one.
    """
    code = f"""
import sys
sys.path[:0] = [{llama_cpp!r}, {os.path.join(llama_cpp, 'gguf-py')!r}]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
base.TextModel._set_vocab_glm = base.TextModel._set_vocab_gpt2
import convert_hf_to_gguf as c
sys.argv = ["convert_hf_to_gguf.py", {model_dir!r}, "--outfile", {out!r}, "--outtype", "f32", *{list(extra)!r}]
c.main()
"""
    subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL)


def quantize(src: str, dst: str, ftype: int) -> None:
    """llama.cpp's own quantizer."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src} -> {dst}) returned {rc}")


def reference(gguf: str, prompt_ids: list[int], prompt_text: str) -> dict:
    """llama.cpp's greedy tokens, last-position logits and prompt tokenization."""
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=gguf, n_ctx=256, n_threads=2, n_batch=256, logits_all=True,
        type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32, verbose=False, seed=0,
    )
    llm.eval(prompt_ids)
    last = [float(x) for x in llm.scores[llm.n_tokens - 1]]
    greedy = []
    for _ in range(N_GREEDY):
        logits = llm.scores[llm.n_tokens - 1]
        tok = int(max(range(len(logits)), key=lambda i: logits[i]))
        greedy.append(tok)
        llm.eval([tok])
    tokenized = llm.tokenize(prompt_text.encode(), add_bos=False, special=False)
    return {
        "prompt_ids": prompt_ids,
        "prompt_text": prompt_text,
        "llama_cpp_prompt_ids": list(tokenized),
        "greedy_ids": greedy,
        "last_logits": last,
        "llama_cpp_python": llama_cpp.__version__,
    }


def float_fixtures(llama_cpp: str) -> None:
    """``mixtral-<f16|bf16>.gguf`` converted from the committed Mixtral fixture, and
    ``mixtral-<f16|bf16>.json``: llama.cpp's greedy tokens and last logits on them.
    (llama.cpp refuses our OLMoE fixture: its k_norm is per head, llama.cpp's is
    over all heads.)"""
    fam = os.path.join(FIXTURES, FLOAT_FAMILY)
    oracle = json.load(open(os.path.join(fam, "oracle.json")))
    for outtype in ["f16", "bf16"]:
        out = os.path.join(OUT_DIR, f"{FLOAT_FAMILY}-{outtype}.gguf")
        convert(llama_cpp, fam, out, ("--outtype", outtype))
        ref = reference(out, oracle["prompt_ids"], oracle.get("prompt_text", ""))
        ref["transformers_greedy_ids"] = oracle["greedy_ids"]
        with open(os.path.join(OUT_DIR, f"{FLOAT_FAMILY}-{outtype}.json"), "w") as f:
            json.dump(ref, f, indent=1)
            f.write("\n")
        agree = sum(a == b for a, b in zip(ref["greedy_ids"], oracle["greedy_ids"]))
        print(f"{FLOAT_FAMILY} {outtype}: {os.path.getsize(out) / 1e6:.2f} MB; llama.cpp greedy agrees with transformers on {agree}/{N_GREEDY}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama-cpp", required=True, help="llama.cpp source tree (has convert_hf_to_gguf.py)")
    p.add_argument("--float-only", action="store_true",
                   help="only (re)make the F16/BF16 fixtures and their references")
    args = p.parse_args()
    os.makedirs(OUT_DIR, exist_ok=True)
    float_fixtures(args.llama_cpp)
    if args.float_only:
        return
    for fam in F32_FAMILIES:
        out = os.path.join(OUT_DIR, f"{fam}-f32.gguf")
        convert(args.llama_cpp, os.path.join(FIXTURES, fam), out)
        print(f"{fam}: {out} ({os.path.getsize(out) / 1e6:.2f} MB)")
    # A split set (gguf-split naming): the engine opens it from its first file.
    convert(args.llama_cpp, os.path.join(FIXTURES, "olmoe"), os.path.join(OUT_DIR, "olmoe-split.gguf"),
            ("--split-max-tensors", "16"))
    print("olmoe split:", sorted(f for f in os.listdir(OUT_DIR) if f.startswith("olmoe-split")))
    with tempfile.TemporaryDirectory() as tmp:
        hf = os.path.join(tmp, "qwen3moe")
        subprocess.run(
            [sys.executable, os.path.join(REPO_ROOT, "scripts", "make_oracle.py"), *QUANT_SHAPE, "--out", hf],
            check=True,
        )
        oracle = json.load(open(os.path.join(hf, "oracle.json")))
        chat = add_chat_template(hf)
        f32 = os.path.join(tmp, "qwen3moe-f32.gguf")
        convert(args.llama_cpp, hf, f32)
        for name, ftype in FTYPES.items():
            out = os.path.join(OUT_DIR, f"qwen3moe-{name}.gguf")
            quantize(f32, out, ftype)
            ref = reference(out, oracle["prompt_ids"], oracle["prompt_text"])
            ref["transformers_greedy_ids"] = oracle["greedy_ids"]
            ref["chat_messages"] = CHAT_MESSAGES
            ref["chat_rendered"] = chat
            with open(os.path.join(OUT_DIR, f"qwen3moe-{name}.json"), "w") as f:
                json.dump(ref, f, indent=1)
                f.write("\n")
            agree = sum(a == b for a, b in zip(ref["greedy_ids"], oracle["greedy_ids"]))
            print(f"qwen3moe {name}: {os.path.getsize(out) / 1e6:.2f} MB; greedy agrees with transformers on {agree}/{N_GREEDY}")


if __name__ == "__main__":
    main()
