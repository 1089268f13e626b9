#!/usr/bin/env python3
"""Train small MoE language models with transformers' own model classes (run by a person, not CI).

The result is a genuine hub-layout checkpoint (BF16 safetensors, sharded, with an index), the
tokenizer, a chat template, generation_config.json, a model card (README.md) and an
``oracle.json`` made exactly as scripts/make_oracle.py makes one: transformers' references
(greedy tokens, teacher-forced argmax/NLL, last-position logits and, for DeepSeek-V3, MTP
drafts) computed in float32 on the committed BF16 weights loaded back from the directory.

Models (``--model``):

* ``qwen3_moe``: Qwen3MoeForCausalLM (GQA, softmax top-k router, every layer sparse), trained
  with transformers' own load-balancing loss (``output_router_logits``,
  ``router_aux_loss_coef``).
* ``deepseek_v3``: DeepseekV3ForCausalLM (MLA, sigmoid router with groups, a shared expert,
  first layer dense) plus one MTP layer in hub layout (``model.layers.{num_hidden_layers}.*``)
  trained with DeepSeek-V3's next-next-token loss (weight ``--mtp-weight``); load balance by
  DeepSeek-V3's auxiliary-loss-free bias update (``e_score_correction_bias += gamma *
  sign(mean_load - load)`` after every step, gamma ``--bias-gamma``).

Corpus: the prose of Python's documentation from Debian's python3.11-doc package
(scripts/moe_corpus.py: source, licence, checksums, the held-out split).

    python scripts/train_moe.py --model qwen3_moe --minutes 45 \\
        --out tests/fixtures/trained/qwen3_moe
    python scripts/train_moe.py --model deepseek_v3 --minutes 35 \\
        --out tests/fixtures/trained/deepseek_v3
    python scripts/train_moe.py --model qwen3_moe --variant k256 --minutes 25 \\
        --out tests/fixtures/trained/qwen3_moe_k256

``--variant k256`` is the qwen3_moe shape whose every matrix row (hidden, head dims times
heads, moe_intermediate) is a multiple of 256, so llama.cpp's K-quants (Q4_K, Q6_K, ...; 256
weights a super-block) apply to every tensor instead of falling back to Q5_0/Q8_0: hidden 256,
3 layers, 4 query / 2 KV heads of 64, 16 experts top-4 of width 256 (BF16 files ~24 MB).

Training runs for a wall-clock budget (``--minutes``); the learning-rate schedule (linear
warm-up, cosine decay to 10%) follows the elapsed fraction of that budget, so the same command
does the same amount of work per second on any machine but not the same number of steps.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_oracle as mo  # noqa: E402
import moe_corpus  # noqa: E402

REPO_ROOT = mo.REPO_ROOT
CHAT_TEMPLATES = os.path.join(REPO_ROOT, "tests", "fixtures", "chat_templates")
SHARD_BYTES = 8_000_000
ORACLE_EVAL_LEN = 32
MAX_PROMPT_TRIES = 400


# --------------------------------------------------------------------------------------
# Tokenizer and data
# --------------------------------------------------------------------------------------


def train_tokenizer(docs: list[str], vocab: int) -> Tokenizer:
    """Byte-level BPE as make_oracle.train_tokenizer, trained on `docs`; EOS is id vocab-1."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab - 1,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator((line for d in docs for line in d.splitlines()), trainer)
    tok.add_special_tokens([mo.EOS_TOKEN])
    assert tok.get_vocab_size() == vocab, (tok.get_vocab_size(), vocab)
    assert tok.token_to_id(mo.EOS_TOKEN) == vocab - 1
    return tok


def token_stream(tok: Tokenizer, docs: list[str]) -> np.ndarray:
    """All documents as one id stream, each followed by EOS."""
    eos = tok.token_to_id(mo.EOS_TOKEN)
    out = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        out.extend(enc.ids)
        out.append(eos)
    return np.asarray(out, dtype=np.int64)


# --------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------


def build_config(a, eos_id: int):
    """The transformers config of the model to train."""
    T = transformers
    common = dict(
        vocab_size=a.vocab,
        hidden_size=a.hidden,
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        initializer_range=0.02,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=None,
    )
    if a.model == "qwen3_moe":
        cfg = T.Qwen3MoeConfig(
            **common,
            max_position_embeddings=2048,
            num_key_value_heads=a.kv_heads,
            head_dim=a.head_dim,
            intermediate_size=a.inter,
            moe_intermediate_size=a.moe_inter,
            num_experts=a.experts,
            num_experts_per_tok=a.top_k,
            norm_topk_prob=True,
            mlp_only_layers=[],
            decoder_sparse_step=1,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            router_aux_loss_coef=a.aux_coef,
            output_router_logits=False,  # switched on for training only
        )
    else:
        factor, orig = 4.0, 128
        cfg = T.DeepseekV3Config(
            **common,
            max_position_embeddings=int(orig * factor),
            num_key_value_heads=a.heads,
            intermediate_size=a.inter,
            moe_intermediate_size=a.moe_inter,
            n_routed_experts=a.experts,
            num_experts_per_tok=a.top_k,
            n_shared_experts=1,
            n_group=a.n_group,
            topk_group=a.topk_group,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            first_k_dense_replace=1,
            q_lora_rank=a.q_lora,
            kv_lora_rank=a.kv_lora,
            qk_nope_head_dim=a.qk_nope,
            qk_rope_head_dim=a.qk_rope,
            v_head_dim=a.v_head,
            rope_interleave=True,
            rms_norm_eps=1e-6,
            num_nextn_predict_layers=1,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": factor,
                "original_max_position_embeddings": orig,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "mscale": 1.0,
                "mscale_all_dim": 0.8,
            },
            scoring_func="sigmoid",
            topk_method="noaux_tc",
        )
    cfg.architectures = [mo.model_class(a.model).__name__]
    return cfg


@torch.no_grad()
def init_(module: torch.nn.Module, std: float) -> None:
    """N(0, std) matrices, zero biases, unit norm weights, zero correction biases."""
    for name, p in module.named_parameters():
        owner = module.get_submodule(name.rsplit(".", 1)[0]) if "." in name else module
        if mo._is_norm(owner):
            p.fill_(1.0)
        elif name.endswith(".bias"):
            p.zero_()
        else:
            p.normal_(0.0, std)
    for name, b in module.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.zero_()


class Trainer:
    """The model (and MTP layer), the loss, the routing statistics and the bias update."""

    def __init__(self, a, cfg):
        self.a = a
        self.cfg = cfg
        cfg._attn_implementation = "sdpa"
        cfg._experts_implementation = "grouped_mm"  # training speed; the oracle uses eager
        self.model = mo.model_class(a.model)(cfg)
        init_(self.model, 0.02)
        self.mtp = None
        if a.model == "deepseek_v3":
            gen = torch.Generator().manual_seed(a.seed)
            self.mtp = mo.MtpParts(a.model, cfg, self.model, gen, 0.02)
            self.mtp.holder.config._attn_implementation = "sdpa"
            self.mtp.holder.model.layers[0].self_attn.config._attn_implementation = "sdpa"
            init_(self.mtp, 0.02)
            # the MTP layer's embed_tokens / lm_head are the main model's (hub copies on save)
            del self.mtp.holder.model.embed_tokens
            del self.mtp.holder.lm_head
        self.routers = []
        self.loads = {}
        roots = [self.model] + ([self.mtp.holder] if self.mtp is not None else [])
        for root in roots:
            for name, m in root.named_modules():
                if type(m).__name__.endswith(("TopKRouter", "TopkRouter")):
                    self.routers.append(m)
                    m.register_forward_hook(self._count)
        self.collect = True

    def _count(self, mod, args, out):
        if self.collect:
            idx = out[2].detach().flatten()
            c = torch.bincount(idx, minlength=mod.num_experts if hasattr(mod, "num_experts") else mod.weight.shape[0])
            self.loads[id(mod)] = self.loads.get(id(mod), 0) + c

    def parameters(self):
        ps = list(self.model.parameters())
        if self.mtp is not None:
            ps += [p for p in self.mtp.parameters()]
        return ps

    def train(self, on: bool):
        self.model.train(on)
        if self.mtp is not None:
            self.mtp.train(on)

    def loss(self, x: torch.Tensor):
        """(total loss, main next-token CE, MTP CE or None, aux loss or None) for x [B, S+1]."""
        inp, tgt = x[:, :-1], x[:, 1:]
        if self.a.model == "qwen3_moe":
            out = self.model(input_ids=inp, output_router_logits=True, use_cache=False)
            ce = F.cross_entropy(out.logits.flatten(0, 1).float(), tgt.flatten())
            aux = out.aux_loss
            return ce + self.cfg.router_aux_loss_coef * aux, ce, None, aux
        h = self.model.model(input_ids=inp, use_cache=False).last_hidden_state  # post-norm
        logits = self.model.lm_head(h)
        ce = F.cross_entropy(logits.flatten(0, 1).float(), tgt.flatten())
        # MTP (DeepSeek-V3 depth 1): row j combines h_j with E[tok_{j+1}], predicts tok_{j+2}.
        S = inp.shape[1]
        mtp = self.mtp
        emb = self.model.model.embed_tokens(inp[:, 1:])
        z = mtp.eh_proj(torch.cat([mtp.enorm(emb), mtp.hnorm(h[:, :-1])], dim=-1))
        pos = torch.arange(1, S).unsqueeze(0)
        pe = self.model.model.rotary_emb(z, position_ids=pos)
        o = mtp.block(z, attention_mask=mo.causal_mask(S - 1), position_ids=pos,
                      position_embeddings=pe, cache=None, use_cache=False)
        o = o[0] if isinstance(o, tuple) else o
        mlogits = self.model.lm_head(mtp.shared_norm(o))
        mce = F.cross_entropy(mlogits.flatten(0, 1).float(), x[:, 2:].flatten())
        return ce + self.a.mtp_weight * mce, ce, mce, None

    @torch.no_grad()
    def after_step(self):
        """DeepSeek-V3 auxiliary-loss-free balancing: nudge each router's correction bias."""
        if self.a.model == "deepseek_v3":
            for r in self.routers:
                load = self.loads.get(id(r))
                if load is None:
                    continue
                load = load.float()
                r.e_score_correction_bias += self.a.bias_gamma * torch.sign(load.mean() - load)
        self.loads = {}

    def balance(self) -> float:
        """max/mean expert load over the routers of the collected steps (1.0 = perfect)."""
        vals = []
        for r in self.routers:
            load = self.loads.get(id(r))
            if load is not None:
                vals.append((load.max() / load.float().mean()).item())
        return max(vals) if vals else float("nan")


@torch.no_grad()
def heldout_nll(model, stream: np.ndarray, seq: int, max_tokens: int | None = None) -> tuple[float, int]:
    """Mean next-token NLL over non-overlapping windows of the held-out stream."""
    model.eval()
    total, n = 0.0, 0
    limit = len(stream) if max_tokens is None else min(len(stream), max_tokens + 1)
    for s in range(0, limit - 1, seq):
        w = torch.from_numpy(stream[s : min(s + seq + 1, limit)]).unsqueeze(0)
        if w.shape[1] < 2:
            break
        logits = model(input_ids=w[:, :-1], use_cache=False).logits.float()
        total += F.cross_entropy(logits[0], w[0, 1:], reduction="sum").item()
        n += w.shape[1] - 1
    return total / n, n


# --------------------------------------------------------------------------------------
# Writing the fixture
# --------------------------------------------------------------------------------------


def chat_template(model: str) -> tuple[str, str]:
    """(template text, note) for the fixture's chat_template.jinja."""
    name = {"qwen3_moe": "qwen3_style.jinja", "deepseek_v3": "deepseek_style.jinja"}[model]
    return open(os.path.join(CHAT_TEMPLATES, name)).read(), f"tests/fixtures/chat_templates/{name}"


def write_checkpoint(tr: Trainer, tok: Tokenizer, out: str) -> None:
    """BF16 hub-layout shards + index, config, generation config, tokenizer, chat template."""
    mo.clean_dir(out)
    model = tr.model
    model.to(torch.bfloat16)
    if tr.mtp is not None:
        tr.mtp.to(torch.bfloat16)
        # MtpParts.hub_state_dict saves the holder: give it the (unused) embed/head back
        tr.mtp.holder.model.embed_tokens = model.model.embed_tokens
        tr.mtp.holder.lm_head = model.lm_head
    cfg = model.config
    cfg.output_router_logits = False
    cfg._attn_implementation = "eager"
    with tempfile.TemporaryDirectory() as tmp:
        mo.write_weights(model, tr.mtp, out, tmp, shard_bytes=SHARD_BYTES)
    mo.write_metadata(cfg, tok, out, model_max_length=cfg.max_position_embeddings)
    cj = json.load(open(os.path.join(out, "config.json")))
    cj["dtype"] = "bfloat16"
    mo.write_json(os.path.join(out, "config.json"), cj)
    tmpl, _ = chat_template(tr.a.model)
    with open(os.path.join(out, "chat_template.jinja"), "w") as f:
        f.write(tmpl)


def load_fixture_f32(family: str, out: str):
    """The committed BF16 weights loaded back by transformers as float32 (main model, MTP)."""
    cls = mo.model_class(family)
    cfg = transformers.AutoConfig.from_pretrained(out)
    L = cfg.num_hidden_layers
    old = cls._keys_to_ignore_on_load_unexpected
    cls._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{L}\..*"]
    try:
        m = cls.from_pretrained(out, attn_implementation="eager", dtype=torch.float32).eval()
    finally:
        cls._keys_to_ignore_on_load_unexpected = old
    mtp = None
    if family in mo.MTP_FAMILIES:
        mtp = mo.MtpParts(family, m.config, m, torch.Generator().manual_seed(0), 0.02).eval()
        mo.load_mtp_parts_(mtp, out, L)
    return m, mtp


def choose_oracle(family: str, model, mtp, tok: Tokenizer, heldout: list[str], seed: int):
    """Search held-out text for a prompt and evaluation window whose references are stable.

    Candidates: the first words of held-out paragraphs (8..16 tokens of prompt); eval_ids =
    the prompt plus the text that follows, ORACLE_EVAL_LEN tokens in all. The first candidate
    that passes every make_oracle stability check (logit margins, router and group gaps) wins.
    """
    eos = tok.token_to_id(mo.EOS_TOKEN)
    rng = np.random.default_rng(seed)
    paras = [p for d in heldout for p in d.split("\n") if len(p) > 200]
    order = rng.permutation(len(paras))
    tries = 0
    for i in order[:MAX_PROMPT_TRIES]:
        p = paras[i]
        ids = tok.encode(p, add_special_tokens=False).ids
        if len(ids) < ORACLE_EVAL_LEN or eos in ids[:ORACLE_EVAL_LEN]:
            continue
        words = p.split(" ")
        prompt = None
        for nw in range(3, 14):
            cand = " ".join(words[:nw])
            n = len(tok.encode(cand, add_special_tokens=False).ids)
            if 10 <= n <= 16 and ids[:n] == tok.encode(cand, add_special_tokens=False).ids:
                prompt = cand
                break
        if prompt is None:
            continue
        pids = tok.encode(prompt, add_special_tokens=False).ids
        tries += 1
        att = mo.reference_outputs(family, model, mtp, prompt, pids, ids[:ORACLE_EVAL_LEN], seed)
        if att.ok:
            att.oracle["prompt_source"] = "held-out corpus paragraph (see README.md)"
            att.oracle["candidates_tried"] = tries
            return att
        print(f"  oracle candidate {tries} rejected ({att.reason})", file=sys.stderr)
    raise RuntimeError(f"no stable oracle prompt in {tries} candidates")


def sample(model, tok: Tokenizer, prompt: str, n: int) -> str:
    """Greedy continuation of `prompt` (n tokens, stops at EOS)."""
    ids = tok.encode(prompt, add_special_tokens=False).ids
    g = transformers.GenerationConfig(do_sample=False, max_new_tokens=n, eos_token_id=tok.token_to_id(mo.EOS_TOKEN),
                                      pad_token_id=tok.token_to_id(mo.EOS_TOKEN))
    out = model.generate(torch.tensor([ids]), generation_config=g)
    return tok.decode(out[0, len(ids):].tolist())


# --------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------

DEFAULTS = {
    "qwen3_moe": dict(hidden=192, layers=4, heads=6, kv_heads=2, head_dim=32, inter=512, moe_inter=128,
                      experts=32, top_k=4, lr=3e-3),
    "deepseek_v3": dict(hidden=192, layers=4, heads=4, kv_heads=4, head_dim=48, inter=512, moe_inter=96,
                        experts=32, top_k=4, lr=3e-3),
}

# Shape variants of a family (--variant), applied over DEFAULTS before explicit flags.
VARIANTS = {
    ("qwen3_moe", "k256"): dict(hidden=256, layers=3, heads=4, kv_heads=2, head_dim=64, moe_inter=256,
                                experts=16, top_k=4),
}


def parse_args(argv=None):
    """Command-line interface."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=list(DEFAULTS), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--workdir", default="/tmp/moe_corpus", help="corpus download/unpack directory")
    p.add_argument("--deb", default=None, help="a python3.11-doc .deb already downloaded")
    p.add_argument("--minutes", type=float, default=45.0, help="training wall-clock budget")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (benchmarks)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1: on a busy 2-core machine 2 threads ran 8x slower)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--aux-coef", type=float, default=0.01, help="qwen3_moe router_aux_loss_coef")
    p.add_argument("--mtp-weight", type=float, default=0.3, help="deepseek_v3 MTP loss weight (lambda)")
    p.add_argument("--bias-gamma", type=float, default=1e-3, help="deepseek_v3 bias update speed")
    p.add_argument("--n-group", dest="n_group", type=int, default=4)
    p.add_argument("--topk-group", dest="topk_group", type=int, default=2)
    p.add_argument("--q-lora", dest="q_lora", type=int, default=96)
    p.add_argument("--kv-lora", dest="kv_lora", type=int, default=64)
    p.add_argument("--qk-nope", dest="qk_nope", type=int, default=32)
    p.add_argument("--qk-rope", dest="qk_rope", type=int, default=16)
    p.add_argument("--v-head", dest="v_head", type=int, default=32)
    for k in ("hidden", "layers", "heads", "kv_heads", "head_dim", "inter", "moe_inter", "experts", "top_k"):
        p.add_argument("--" + k.replace("_", "-"), dest=k, type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--variant", default=None, choices=sorted({v for _, v in VARIANTS}),
                   help="a named shape of the family (k256: every row a multiple of 256)")
    p.add_argument("--no-write", action="store_true", help="train only (benchmarks)")
    p.add_argument("--save-ckpt", default=None, help="save the f32 trained state here (torch.save)")
    p.add_argument("--load-ckpt", default=None, help="skip training: load a --save-ckpt file and write")
    a = p.parse_args(argv)
    if a.variant is not None and (a.model, a.variant) not in VARIANTS:
        p.error(f"--variant {a.variant} is not defined for --model {a.model}")
    shape = dict(DEFAULTS[a.model], **VARIANTS.get((a.model, a.variant), {}))
    for k, v in shape.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    return a


def main(argv=None) -> None:
    """Entry point."""
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    t0 = time.time()

    corpus = moe_corpus.prepare(a.workdir, a.deb)
    tok = train_tokenizer(corpus["train"], a.vocab)
    train_ids = token_stream(tok, corpus["train"])
    held_ids = token_stream(tok, corpus["heldout"])
    print(f"corpus: {len(train_ids)} train tokens, {len(held_ids)} held-out tokens "
          f"({time.time() - t0:.0f}s)", file=sys.stderr)

    cfg = build_config(a, tok.token_to_id(mo.EOS_TOKEN))
    tr = Trainer(a, cfg)
    n_params = sum(p.numel() for p in tr.parameters())
    print(f"parameters: {n_params}", file=sys.stderr)
    decay = [p for p in tr.parameters() if p.dim() >= 2]
    no_decay = [p for p in tr.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": a.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
    )
    rng = np.random.default_rng(a.seed)
    budget = a.minutes * 60.0
    if a.load_ckpt:
        ck = torch.load(a.load_ckpt, weights_only=False)
        tr.model.load_state_dict(ck["model"])
        if tr.mtp is not None:
            tr.mtp.load_state_dict(ck["mtp"])
        budget = 0.0
    step, tokens, t_train = 0, 0, time.time()
    log = []
    ema = None
    tr.train(True)
    while True:
        elapsed = time.time() - t_train
        if elapsed >= budget or (a.max_steps is not None and step >= a.max_steps):
            break
        frac = elapsed / budget
        lr = a.lr * min(1.0, (step + 1) / a.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = rng.integers(0, len(train_ids) - a.seq - 2, size=a.batch)
        x = torch.from_numpy(np.stack([train_ids[s : s + a.seq + 2] for s in starts]))
        if a.model == "qwen3_moe":
            x = x[:, :-1]
        loss, ce, mce, aux = tr.loss(x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tr.parameters(), 1.0)
        opt.step()
        bal = tr.balance()
        tr.after_step()
        step += 1
        tokens += a.batch * a.seq
        ema = ce.item() if ema is None else 0.98 * ema + 0.02 * ce.item()
        if step % 25 == 0 or step <= 3:
            rec = {"step": step, "tokens": tokens, "s": round(time.time() - t_train, 1), "lr": lr,
                   "ce": round(ce.item(), 4), "ce_ema": round(ema, 4), "max_over_mean_load": round(bal, 3)}
            if mce is not None:
                rec["mtp_ce"] = round(mce.item(), 4)
            if aux is not None:
                rec["aux"] = round(aux.item(), 4)
            log.append(rec)
            tps = tokens / (time.time() - t_train)
            print(json.dumps(rec) + f" tok/s={tps:.0f}", file=sys.stderr, flush=True)
    train_s = time.time() - t_train
    if a.load_ckpt:
        step, tokens, train_s, ema, log = ck["step"], ck["tokens"], ck["train_s"], ck["ema"], ck["log"]
    elif a.save_ckpt:
        torch.save({"model": tr.model.state_dict(), "mtp": tr.mtp.state_dict() if tr.mtp is not None else None,
                    "step": step, "tokens": tokens, "train_s": train_s, "ema": ema, "log": log}, a.save_ckpt)
    tr.train(False)
    f32_nll, n_held = heldout_nll(tr.model, held_ids, a.seq)
    print(f"trained {step} steps, {tokens} tokens, {train_s:.0f}s; held-out ppl (f32) {math.exp(f32_nll):.2f}",
          file=sys.stderr)
    if a.no_write:
        return

    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    write_checkpoint(tr, tok, out)
    model, mtp = load_fixture_f32(a.model, out)
    bf16_nll, _ = heldout_nll(model, held_ids, a.seq)
    mtp_acc = None
    if mtp is not None:
        mtp_acc = mtp_heldout_accuracy(model, mtp, held_ids, a.seq)
    att = choose_oracle(a.model, model, mtp, tok, corpus["heldout"], a.seed)
    mo.write_json(os.path.join(out, "oracle.json"), att.oracle)
    mo.verify_fixture(a.model, out, att)
    samples = [(p, sample(model, tok, p, 60)) for p in SAMPLE_PROMPTS]
    stats = {
        "model": a.model,
        "command": "python scripts/train_moe.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "parameters": n_params,
        "steps": step,
        "tokens_seen": tokens,
        "train_seconds": round(train_s, 1),
        "threads": a.threads,
        "final_train_ce_ema": round(ema, 4),
        "final_train_ce_last": log[-1]["ce"] if log else None,
        "heldout_tokens": n_held,
        "heldout_ppl_f32_before_bf16": round(math.exp(f32_nll), 3),
        "heldout_ppl_bf16_weights": round(math.exp(bf16_nll), 3),
        "heldout_mtp_top1": mtp_acc,
        "train_tokens_in_corpus": int(len(train_ids)),
        "epochs": round(tokens / len(train_ids), 3),
        "corpus": {k: v for k, v in corpus["source"].items()},
        "oracle_prompt": att.oracle["prompt_text"],
        "samples": samples,
        "log": log,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
    }
    write_card(a, cfg, stats, out)
    for f in os.listdir(out):
        os.chmod(os.path.join(out, f), 0o644)
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"wrote {out} ({size / 1e6:.2f} MB) in {time.time() - t0:.0f}s", file=sys.stderr)


SAMPLE_PROMPTS = [
    "The following example shows how to",
    "This module provides",
    "If the file does not exist,",
]


@torch.no_grad()
def mtp_heldout_accuracy(model, mtp, stream: np.ndarray, seq: int, max_tokens: int = 8192) -> float:
    """Teacher-forced MTP top-1 accuracy (predicting t+2) over held-out windows."""
    hit, n = 0, 0
    for s in range(0, min(len(stream), max_tokens) - 2, seq):
        w = stream[s : s + seq + 2]
        if len(w) < 3:
            break
        ids = torch.from_numpy(w[:-1]).unsqueeze(0)
        h = model.model(input_ids=ids, use_cache=False).last_hidden_state[0]
        toks = w[1:-1].tolist()
        _, lg = mtp.run(toks, h[: len(toks)], list(range(1, len(toks) + 1)))
        pred = lg.argmax(-1)
        hit += (pred == torch.from_numpy(w[2:])).sum().item()
        n += len(toks)
    return round(hit / n, 4)


def write_card(a, cfg, st: dict, out: str) -> None:
    """README.md (model card) and train_stats.json."""
    mo.write_json(os.path.join(out, "train_stats.json"), st)
    c = st["corpus"]
    _, tmpl_src = chat_template(a.model)
    arch = (
        f"Qwen3MoeForCausalLM: hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers (all sparse), "
        f"{cfg.num_attention_heads} query heads / {cfg.num_key_value_heads} KV heads (GQA), head_dim "
        f"{cfg.head_dim}, {cfg.num_experts} experts top-{cfg.num_experts_per_tok} (norm_topk_prob), "
        f"moe_intermediate {cfg.moe_intermediate_size}, vocab {cfg.vocab_size}; load balance by "
        f"transformers' load_balancing_loss_func, router_aux_loss_coef {cfg.router_aux_loss_coef}."
        if a.model == "qwen3_moe"
        else
        f"DeepseekV3ForCausalLM: hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers (layer 0 dense, "
        f"intermediate {cfg.intermediate_size}), MLA (q_lora {cfg.q_lora_rank}, kv_lora {cfg.kv_lora_rank}, "
        f"qk_nope {cfg.qk_nope_head_dim}, qk_rope {cfg.qk_rope_head_dim}, v_head {cfg.v_head_dim}, "
        f"{cfg.num_attention_heads} heads, YaRN RoPE), {cfg.n_routed_experts} routed experts top-"
        f"{cfg.num_experts_per_tok} with sigmoid scores, {cfg.n_group} groups / topk_group "
        f"{cfg.topk_group}, e_score_correction_bias, 1 shared expert, moe_intermediate "
        f"{cfg.moe_intermediate_size}, routed_scaling_factor {cfg.routed_scaling_factor}, vocab "
        f"{cfg.vocab_size}; one MTP layer (model.layers.{cfg.num_hidden_layers}.*) trained with the "
        f"next-next-token loss, weight {a.mtp_weight}; load balance by the auxiliary-loss-free bias "
        f"update, gamma {a.bias_gamma}."
    )
    lines = [
        f"# Trained {a.model} fixture" + (f" (variant {a.variant})" if a.variant else ""),
        "",
        "A small MoE language model trained from scratch by `scripts/train_moe.py` with "
        "transformers' own model class, saved in BF16 in hub layout. `oracle.json` holds "
        "transformers' references computed in float32 on exactly these BF16 weights (loaded back "
        "from this directory), as scripts/make_oracle.py computes them for the random fixtures.",
        "",
        "## Model",
        "",
        arch,
        "",
        f"Parameters: {st['parameters']} (training), BF16 files: see `model.safetensors.index.json`.",
        "",
        "## Corpus",
        "",
        f"The prose of Python's documentation: Debian package `{c['package']}` {c['version']} "
        f"(`{c['deb']}`, sha256 `{c['deb_sha256']}`), the reStructuredText sources "
        "`usr/share/doc/python3.11/html/_sources/**/*.rst.txt` turned into plain paragraphs by "
        "`scripts/moe_corpus.py` (markup, code, doctests, tables and the changelog dropped).",
        f"Licence: {c['licence']} (see the package's `_sources/license.rst.txt`).",
        f"Train: {c['train_docs']} documents, {c['train_chars']} characters, {st['train_tokens_in_corpus']} "
        f"tokens, text sha256 `{c['train_text_sha256']}`. Held out: {c['heldout_docs']} documents "
        f"(sha256(path)[0] < {moe_corpus.HELDOUT_BYTE}: {', '.join(c['heldout_files'])}), "
        f"{c['heldout_chars']} characters, text sha256 `{c['heldout_text_sha256']}`.",
        f"Tokenizer: byte-level BPE, vocab {cfg.vocab_size} (`<|endoftext|>` = {cfg.vocab_size - 1}, also "
        "the document separator), trained on the train split.",
        "",
        "## Training",
        "",
        f"    {st['command']}",
        "",
        f"torch {st['torch_version']}, transformers {st['transformers_version']}, CPU, {st['threads']} threads, "
        f"AdamW (betas 0.9/0.95, weight decay {a.weight_decay}), peak lr {a.lr}, warm-up {a.warmup} steps, "
        f"cosine to 10% over the {a.minutes:g}-minute budget, batch {a.batch} x {a.seq} tokens, gradient clip 1.0.",
        "",
        "| figure | value |",
        "| --- | --- |",
        f"| steps | {st['steps']} |",
        f"| tokens seen | {st['tokens_seen']} ({st['epochs']} epochs) |",
        f"| training wall time | {st['train_seconds']} s |",
        f"| final train loss (next-token CE, EMA 0.98) | {st['final_train_ce_ema']} |",
        f"| held-out perplexity, f32 weights before the BF16 cast | {st['heldout_ppl_f32_before_bf16']} |",
        f"| held-out perplexity, the committed BF16 weights | {st['heldout_ppl_bf16_weights']} "
        f"({st['heldout_tokens']} tokens) |",
    ]
    if st["heldout_mtp_top1"] is not None:
        lines.append(f"| held-out MTP top-1 (predicting t+2, teacher-forced) | {st['heldout_mtp_top1']} |")
    lines += [
        "",
        "Perplexity is per token of this tokenizer (not comparable across tokenizers). The full "
        "loss log is in `train_stats.json`.",
        "",
        "## Greedy samples (transformers, the BF16 weights in f32)",
        "",
    ]
    for p, s in st["samples"]:
        lines.append(f"- **{p}**{s}")
    lines += [
        "",
        "## Other files",
        "",
        f"- `chat_template.jinja`: a copy of `{tmpl_src}`, moestream's own template in the shape of "
        "the family's (the project does not redistribute the vendors' real templates; see "
        "tests/fixtures/chat_templates/README.md). The model was not trained on chat data.",
        f"- `oracle.json`: prompt `{st['oracle_prompt']}` from a held-out paragraph, eval_ids = the "
        f"prompt and the text that follows ({ORACLE_EVAL_LEN} tokens); the first candidate that "
        "passed every make_oracle stability check.",
        "",
    ]
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main()
