#!/usr/bin/env python3
"""FP8 fixture: a tiny DeepSeek-V3 stored the way vendors ship it, and its oracle.

1. make_oracle.generate() builds a tiny random DeepSeek-V3 (hidden 160 and dense
   intermediate 200, so weights span several 128x128 scale blocks, the last ones partial).
2. Every attention / MLP / expert / eh_proj matrix is stored as float8_e4m3fn with an f32
   `weight_scale_inv` grid of one scale per 128x128 block (scale = block absmax / 448);
   embeddings, lm_head, routers and the MTP head are stored BF16; 1-D tensors stay f32.
   config.json gains the vendors' `quantization_config`.
3. The dequantized model (fp8.to(f32) * expanded scale, in f32, as torch computes it;
   BF16 tensors widened) is run by transformers in f32: greedy tokens, teacher-forced
   argmax / NLL / last logits -> oracle.json (same fields as make_oracle's, no MTP).
4. fp8_dequant.json holds the sha256 of every dequantized FP8 tensor's f32 little-endian
   bytes, so tests check the engine's FP8 decode bit for bit.

Usage: python scripts/make_fp8_oracle.py [--out tests/fixtures/deepseek_v3_fp8]
"""

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import replace

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_oracle as mo  # noqa: E402

BLOCK = 128
FP8_MAX = 448.0


def is_fp8(name: str, t: torch.Tensor) -> bool:
    """Which tensors the vendors' FP8 checkpoints store in FP8."""
    if t.dim() != 2:
        return False
    if name.endswith("mlp.gate.weight") or "embed_tokens" in name or name.startswith("lm_head"):
        return False
    if "shared_head" in name:
        return False
    return ".self_attn." in name or ".mlp." in name or "eh_proj" in name


def quantize_fp8(w: torch.Tensor):
    """(fp8 weight, f32 scale_inv grid) with one scale per 128x128 block."""
    rows, cols = w.shape
    br, bc = -(-rows // BLOCK), -(-cols // BLOCK)
    scale = torch.empty(br, bc, dtype=torch.float32)
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(br):
        for j in range(bc):
            blk = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK]
            s = (blk.abs().max() / FP8_MAX).clamp(min=1e-12)
            scale[i, j] = s
            q[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = (blk / s).to(torch.float8_e4m3fn)
    return q, scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    rows, cols = q.shape
    s = scale.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:rows, :cols]
    return q.to(torch.float32) * s


@torch.no_grad()
def oracle(model_dir: str, base: dict) -> dict:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    prompt, n = base["prompt_ids"], len(base["greedy_ids"])
    gcfg = transformers.GenerationConfig(do_sample=False, max_new_tokens=n, min_new_tokens=n)
    model.generation_config.eos_token_id = None
    out = model.generate(torch.tensor([prompt]), generation_config=gcfg)
    greedy = out[0, len(prompt):].tolist()
    ev_ids = base["eval_ids"]
    ev = model(torch.tensor([ev_ids]), use_cache=False).logits[0]
    lsm = torch.log_softmax(ev.double(), -1)
    top2 = ev.topk(2, -1).values
    margin = ((top2[:, 0] - top2[:, 1]) / top2[:, 0].abs().clamp(min=1e-6)).min().item()
    return {
        "source": "scripts/make_fp8_oracle.py: transformers on the dequantized FP8 weights",
        "prompt_ids": prompt,
        "greedy_ids": greedy,
        "eval_ids": ev_ids,
        "argmax": ev.argmax(-1).tolist(),
        "nll": [-lsm[i, ev_ids[i + 1]].item() for i in range(len(ev_ids) - 1)],
        "last_logits": mo.f32_list(ev[-1]),
        "checks": {"min_logit_margin_rel": margin},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(mo.FIXTURES_DIR, "deepseek_v3_fp8"))
    args = p.parse_args()
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    seed, shape = mo.ALL_FIXTURES["deepseek_v3"]
    shape = replace(shape, hidden=160, inter=200)
    with tempfile.TemporaryDirectory() as tmp:
        base_dir, deq_dir = os.path.join(tmp, "base"), os.path.join(tmp, "dequant")
        os.makedirs(base_dir)
        base = mo.generate("deepseek_v3", seed, shape, base_dir)
        mo.clean_dir(args.out)
        os.makedirs(deq_dir)
        hashes = {}
        shards = sorted(f for f in os.listdir(base_dir) if f.endswith(".safetensors"))
        index = {"metadata": {}, "weight_map": {}}
        for f in shards:
            stored, deq = {}, {}
            with safe_open(os.path.join(base_dir, f), framework="pt") as fh:
                for k in fh.keys():
                    t = fh.get_tensor(k).to(torch.float32)
                    if is_fp8(k, t):
                        q, s = quantize_fp8(t)
                        stored[k], stored[k + "_scale_inv"] = q, s
                        d = dequantize_fp8(q, s)
                        hashes[k] = hashlib.sha256(d.contiguous().numpy().tobytes()).hexdigest()
                    elif t.dim() == 2:
                        stored[k] = t.to(torch.bfloat16)
                        d = stored[k].to(torch.float32)
                    else:
                        stored[k] = t
                        d = t
                    deq[k] = d.contiguous()
            save_file(stored, os.path.join(args.out, f), metadata={"format": "pt"})
            save_file(deq, os.path.join(deq_dir, f), metadata={"format": "pt"})
            for k in stored:
                index["weight_map"][k] = f
        mo.write_json(os.path.join(args.out, "model.safetensors.index.json"), index)
        for side in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(base_dir, side), os.path.join(deq_dir, side))
            shutil.copy(os.path.join(base_dir, side), os.path.join(args.out, side))
        shutil.copy(os.path.join(base_dir, "model.safetensors.index.json"), deq_dir)
        cfg = json.load(open(os.path.join(args.out, "config.json")))
        cfg["quantization_config"] = {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "weight_block_size": [BLOCK, BLOCK],
        }
        mo.write_json(os.path.join(args.out, "config.json"), cfg)
        o = oracle(deq_dir, base)
    mo.write_json(os.path.join(args.out, "oracle.json"), o)
    mo.write_json(os.path.join(args.out, "fp8_dequant.json"), hashes)
    size = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out))
    print(f"deepseek_v3_fp8 -> {args.out} ({size / 1e6:.2f} MB); {len(hashes)} FP8 tensors; "
          f"margin {o['checks']['min_logit_margin_rel']:.2e}; greedy {o['greedy_ids'][:6]}...")


if __name__ == "__main__":
    main()
