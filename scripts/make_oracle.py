#!/usr/bin/env python3
"""Build tiny random-weight MoE checkpoints and their Hugging Face reference outputs.

Every fixture directory written by this script is a complete, loadable Hugging Face
checkpoint (config.json, sharded safetensors with an index, tokenizer.json, ...) plus an
``oracle.json`` holding what transformers (the reference implementation) computes on it:
greedy tokens, teacher-forced argmax/NLL, full last-position logits and, for the families
with a multi-token-prediction (MTP) layer, MTP draft predictions.

Usage::

    python scripts/make_oracle.py --all                      # regenerate tests/fixtures/*
    python scripts/make_oracle.py --family mixtral --seed 3 --out /tmp/mx --hidden 48

Everything runs in float32 on the CPU with the eager attention implementation. The
script never downloads anything: configs are built locally and weights are random.
See scripts/README.md for the exact definitions of every oracle field.
"""

from __future__ import annotations

import argparse
import copy
import glob
import json
import math
import os
import sys
import tempfile
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch import nn

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES_DIR = os.path.join(REPO_ROOT, "tests", "fixtures")

EOS_TOKEN = "<|endoftext|>"
N_GREEDY = 20
EVAL_LEN = 24
MAX_SEED_TRIES = 200
SHARD_BYTES = 400_000
# Acceptance thresholds (see the `Checker` docstring).
LOGIT_MARGIN_REL = 1e-3
ROUTER_GAP = 1e-4
INDEXER_GAP = 1e-5

# A small embedded English corpus: the byte-level BPE tokenizer is trained on it.
CORPUS = """\
Once upon a time, in a quiet village by the sea, there lived an old fisherman and his daughter.
Every morning the fisherman walked down to the harbor before the sun came up over the hills.
He pushed his small wooden boat into the water and rowed out past the rocks where the fish were plenty.
His daughter stayed at home, baked fresh bread, and mended the nets that the storms had torn.
The people of the village said that she could read the weather better than anyone alive.
When the wind turned cold and the clouds grew dark, she would climb the hill and light a lamp.
The lamp told the boats that a storm was coming and that they should return to the harbor at once.
One winter night the storm came faster than anyone expected, and the waves rose higher than the houses.
The fisherman was still out at sea, far beyond the rocks, with his nets full of silver fish.
His daughter ran up the hill, lit the lamp, and kept it burning through the long and terrible night.
In the morning the sea was calm again, and a small wooden boat came slowly around the point.
The whole village cheered, and the fisherman said that the light on the hill had saved his life.
A computer is a machine that follows a list of instructions called a program.
The program tells the computer how to store numbers, how to add them, and how to compare them.
Modern computers can perform billions of simple operations every second without making a mistake.
Memory holds the data that the program is working on, while the disk keeps it when the power is off.
Reading from memory is fast, but reading from a disk takes much longer, so good programs plan ahead.
A cache keeps a copy of the data that was used recently, because it will probably be needed again soon.
When the cache is full, the oldest or least useful item is removed to make room for a new one.
Engineers measure how often the data is found in the cache and call this number the hit rate.
The little robot walked to the market to buy some fresh bread, a bag of apples, and a jar of honey.
It counted its coins carefully, because the baker did not like to wait for slow customers.
On the way home the robot met a cat sitting on a wall in the warm afternoon sun.
The cat asked the robot where it was going, and the robot said that it was going home for dinner.
Robots do not eat bread, said the cat, but the robot explained that the bread was for its friend.
Its friend was an old inventor who lived at the top of a tall house at the end of the street.
The inventor had built the robot many years ago, and they had been friends ever since that day.
Water boils at one hundred degrees at sea level, but it boils at a lower temperature on a high mountain.
The air on a mountain is thinner, so there is less pressure pushing down on the surface of the water.
Plants use the light of the sun to turn water and air into sugar, and they give off fresh oxygen.
Without plants there would be very little oxygen in the air, and most animals could not live.
The river runs from the mountains to the sea, carrying sand and stones that it picks up along the way.
Over thousands of years the river carves a deep valley through the hard rock of the hills.
Students who read every day learn new words quickly and find it easier to write their own stories.
A good story has a beginning, a middle, and an end, and it makes the reader want to know what happens next.
The teacher asked the class to write about a day they would never forget, and everyone began to think.
Some wrote about a trip to the sea, some about a new friend, and one wrote about a robot and a cat.
"""

SHORT_PROMPT = "The cat asked the robot where"
LONG_PROMPT = "The little robot walked to the market"

MTP_DEFINITION = (
    "MTP reference (DeepSeek-V3 definition, as implemented by transformers 5.24 "
    "modeling_layers.MtpLayer/MtpModel for deepseek_v3 and glm4_moe; computed the same way for "
    "glm_moe_dsa, which transformers does not wire up). Weights: model.layers.{L}.* with "
    "L=num_hidden_layers. One MTP row j combines main-model hidden h_j with the token at "
    "position j+1: x_j = eh_proj(concat(enorm(E[tok_{j+1}]), hnorm(h_j))) (embedding half "
    "first, eh_proj.weight is [H, 2H]); E is model.embed_tokens (model.layers.{L}.embed_tokens "
    "is an identical copy). The rows go through the MTP decoder block (a full decoder layer: "
    "input_layernorm, self_attn with its own causal attention over the MTP rows only, "
    "post_attention_layernorm, MoE mlp; for glm_moe_dsa the block's attention runs its own "
    "DSA indexer) with RoPE position id j+1 (the position of tok_{j+1}). out_j is the block "
    "output (residual stream, before any norm). MTP logits_j = shared_head.head("
    "shared_head.norm(out_j)); shared_head.head is identical to lm_head. logits_j predicts the "
    "token at position j+2. h_j is the main model's final hidden state AFTER the final "
    "model.norm (transformers' MTPCandidateGenerator feeds hidden_states[-1], which "
    "transformers ties to last_hidden_state, i.e. post-norm). one_step: teacher-forced over "
    "eval_ids, rows j=0..n-2 (tok_{j+1}=eval_ids[j+1]); one_step[j] = argmax logits_j; "
    "one_step_last_logits = logits_{n-2}. draft3: main model runs over prompt_ids (P tokens) "
    "giving h_0..h_{P-1}; g0 = greedy_ids[0]. MTP rows 0..P-1 use (h_j, tok_{j+1}) with "
    "tokens prompt_ids[1:] + [g0]; d1 = argmax logits_{P-1}. Then recursively for k=1,2: row "
    "P-1+k uses h = out_{P-2+k} (the previous MTP row's pre-norm block output, NOT normed) and "
    "token d_k at position P+k, attending causally to all earlier MTP rows; d_{k+1} = argmax of "
    "its logits. draft3 = [d1, d2, d3] (predictions for positions P+1, P+2, P+3); "
    "draft3_logits are the three full logit rows."
)


# --------------------------------------------------------------------------------------
# Shapes and per-family configuration
# --------------------------------------------------------------------------------------


@dataclass
class Shape:
    """Model geometry knobs shared by every family (family builders ignore what they lack)."""

    hidden: int = 64
    layers: int = 3
    experts: int = 8
    top_k: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16  # qwen3_moe, glm4_moe (others derive hidden / heads)
    inter: int = 96  # dense MLP intermediate size
    moe_inter: int = 32
    shared_inter: int = 48  # qwen2_moe shared expert
    norm_topk_prob: bool = True
    vocab: int = 384
    init_std: float = 0.15
    n_group: int = 1
    topk_group: int = 1
    q_lora: int = 48
    kv_lora: int = 32
    qk_nope: int = 16
    qk_rope: int = 16
    v_head: int = 12
    index_heads: int = 4
    index_head_dim: int = 32
    index_topk: int = 4
    prompt: str = SHORT_PROMPT
    qwen3_dense_layer: bool = True  # qwen3_moe: layer 1 a dense MLP (llama.cpp cannot run that)


# Committed fixtures: family -> (start seed, shape). `--all` regenerates exactly these.
ALL_FIXTURES: dict[str, tuple[int, Shape]] = {
    "qwen3_moe": (1, Shape(hidden=48, layers=3, top_k=2, norm_topk_prob=True)),
    "qwen2_moe": (2, Shape(hidden=64, layers=3, top_k=4, norm_topk_prob=False, shared_inter=48)),
    "mixtral": (3, Shape(hidden=64, layers=3, top_k=2, inter=32)),
    "olmoe": (4, Shape(hidden=64, layers=3, top_k=3, norm_topk_prob=False, inter=32)),
    "deepseek_v3": (
        5,
        Shape(hidden=64, layers=3, top_k=3, heads=4, kv_heads=4, n_group=4, topk_group=2, moe_inter=24),
    ),
    "glm4_moe": (6, Shape(hidden=56, layers=3, top_k=2, n_group=2, topk_group=1)),
    "glm_moe_dsa": (
        7,
        Shape(
            hidden=64, layers=3, top_k=2, heads=4, kv_heads=4, inter=64, moe_inter=24, qk_rope=8,
            index_heads=8, index_head_dim=16, prompt=LONG_PROMPT,
        ),
    ),
}
FAMILIES = list(ALL_FIXTURES)
MTP_FAMILIES = {"deepseek_v3", "glm4_moe", "glm_moe_dsa"}


def build_config(family: str, s: Shape, eos_id: int):
    """Return the transformers config object for `family` with geometry `s`."""
    T = transformers
    common = dict(
        vocab_size=s.vocab,
        hidden_size=s.hidden,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        initializer_range=s.init_std,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=None,
        max_position_embeddings=256,
    )
    if family == "qwen3_moe":
        cfg = T.Qwen3MoeConfig(
            **common,
            num_key_value_heads=s.kv_heads,
            head_dim=s.head_dim,
            intermediate_size=s.inter,
            moe_intermediate_size=s.moe_inter,
            num_experts=s.experts,
            num_experts_per_tok=s.top_k,
            norm_topk_prob=s.norm_topk_prob,
            # layer 1 is a dense MLP, the others are sparse MoE blocks
            mlp_only_layers=[1] if s.layers >= 2 and s.qwen3_dense_layer else [],
            decoder_sparse_step=1,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        )
    elif family == "qwen2_moe":
        assert s.hidden % s.heads == 0, "qwen2_moe derives head_dim = hidden / heads"
        cfg = T.Qwen2MoeConfig(
            **common,
            num_key_value_heads=s.kv_heads,
            intermediate_size=s.inter,
            moe_intermediate_size=s.moe_inter,
            shared_expert_intermediate_size=s.shared_inter,
            num_experts=s.experts,
            num_experts_per_tok=s.top_k,
            norm_topk_prob=s.norm_topk_prob,
            qkv_bias=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        )
    elif family == "mixtral":
        assert s.hidden % s.heads == 0, "mixtral derives head_dim = hidden / heads"
        cfg = T.MixtralConfig(
            **common,
            num_key_value_heads=s.kv_heads,
            intermediate_size=s.inter,  # Mixtral: per-expert intermediate size
            num_local_experts=s.experts,
            num_experts_per_tok=s.top_k,
            rms_norm_eps=1e-5,
            sliding_window=None,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        )
    elif family == "olmoe":
        assert s.hidden % s.heads == 0, "olmoe derives head_dim = hidden / heads"
        cfg = T.OlmoeConfig(
            **common,
            num_key_value_heads=s.kv_heads,
            intermediate_size=s.inter,  # OLMoE: per-expert intermediate size
            num_experts=s.experts,
            num_experts_per_tok=s.top_k,
            norm_topk_prob=s.norm_topk_prob,
            clip_qkv=None,
            attention_bias=False,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        )
    elif family == "deepseek_v3":
        factor, orig = 4.0, 32
        common["max_position_embeddings"] = int(orig * factor)
        cfg = T.DeepseekV3Config(
            **common,
            num_key_value_heads=s.heads,  # MLA: no GQA
            intermediate_size=s.inter,
            moe_intermediate_size=s.moe_inter,
            n_routed_experts=s.experts,
            num_experts_per_tok=s.top_k,
            n_shared_experts=1,
            n_group=s.n_group,
            topk_group=s.topk_group,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            first_k_dense_replace=1,
            q_lora_rank=s.q_lora,
            kv_lora_rank=s.kv_lora,
            qk_nope_head_dim=s.qk_nope,
            qk_rope_head_dim=s.qk_rope,
            v_head_dim=s.v_head,
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
            # hub DeepSeek-V3 configs carry these; transformers has no field for them
            scoring_func="sigmoid",
            topk_method="noaux_tc",
        )
    elif family == "glm4_moe":
        cfg = T.Glm4MoeConfig(
            **common,
            num_key_value_heads=s.kv_heads,
            head_dim=s.head_dim,
            intermediate_size=s.inter,
            moe_intermediate_size=s.moe_inter,
            n_routed_experts=s.experts,
            num_experts_per_tok=s.top_k,
            n_shared_experts=1,
            n_group=s.n_group,
            topk_group=s.topk_group,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            first_k_dense_replace=1,
            attention_bias=True,
            use_qk_norm=True,
            rms_norm_eps=1e-5,
            num_nextn_predict_layers=1,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 1000000.0,
                "partial_rotary_factor": 0.5,
            },
            scoring_func="sigmoid",
            topk_method="noaux_tc",
        )
    elif family == "glm_moe_dsa":
        indexer_types = ["full"] + ["shared" if i % 2 == 1 else "full" for i in range(1, s.layers)]
        cfg = T.GlmMoeDsaConfig(
            **common,
            num_key_value_heads=s.heads,  # MLA: no GQA
            intermediate_size=s.inter,
            moe_intermediate_size=s.moe_inter,
            n_routed_experts=s.experts,
            num_experts_per_tok=s.top_k,
            n_shared_experts=1,
            n_group=s.n_group,
            topk_group=s.topk_group,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            first_k_dense_replace=1,
            mlp_layer_types=["dense"] + ["sparse"] * (s.layers - 1),
            q_lora_rank=s.q_lora,
            kv_lora_rank=s.kv_lora,
            qk_nope_head_dim=s.qk_nope,
            qk_rope_head_dim=s.qk_rope,
            v_head_dim=s.v_head,
            index_topk=s.index_topk,
            index_n_heads=s.index_heads,
            index_head_dim=s.index_head_dim,
            indexer_types=indexer_types,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            # hub GLM-5 configs carry these; GlmMoeDsaConfig has no field for them
            num_nextn_predict_layers=1,
            scoring_func="sigmoid",
            topk_method="noaux_tc",
        )
    else:
        raise ValueError(f"unknown family {family!r}")
    cfg.architectures = [model_class(family).__name__]
    cfg._attn_implementation = "eager"
    return cfg


def model_class(family: str):
    """The *ForCausalLM class of `family`."""
    T = transformers
    return {
        "qwen3_moe": T.Qwen3MoeForCausalLM,
        "qwen2_moe": T.Qwen2MoeForCausalLM,
        "mixtral": T.MixtralForCausalLM,
        "olmoe": T.OlmoeForCausalLM,
        "deepseek_v3": T.DeepseekV3ForCausalLM,
        "glm4_moe": T.Glm4MoeForCausalLM,
        "glm_moe_dsa": T.GlmMoeDsaForCausalLM,
    }[family]


def mtp_block_config(family: str, cfg):
    """Config for a 1-layer model whose layer 0 has the architecture of the MTP block.

    The MTP block is always a MoE layer (transformers' get_mtp_config sets
    first_k_dense_replace = 0); for glm_moe_dsa it runs its own ("full") DSA indexer.
    """
    mcfg = copy.deepcopy(cfg)
    mcfg.num_hidden_layers = 1
    mcfg.first_k_dense_replace = 0
    if family == "glm_moe_dsa":
        mcfg.mlp_layer_types = ["sparse"]
        mcfg.indexer_types = ["full"]
        mcfg.layer_types = ["indexed_attention"]
    mcfg._attn_implementation = "eager"
    return mcfg


# --------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------


def train_tokenizer(vocab: int) -> Tokenizer:
    """Train the byte-level BPE tokenizer shared by all fixtures (deterministic).

    256 byte symbols + merges fill ids 0..vocab-2; `<|endoftext|>` is the last id (vocab-1).
    """
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
    tok.train_from_iterator(CORPUS.splitlines(), trainer)
    tok.add_special_tokens([EOS_TOKEN])
    assert tok.get_vocab_size() == vocab, (tok.get_vocab_size(), vocab)
    assert tok.token_to_id(EOS_TOKEN) == vocab - 1
    return tok


# --------------------------------------------------------------------------------------
# Weight initialisation
# --------------------------------------------------------------------------------------


def _is_norm(module: nn.Module) -> bool:
    """True for RMSNorm variants and nn.LayerNorm."""
    return isinstance(module, nn.LayerNorm) or type(module).__name__.endswith("RMSNorm")


@torch.no_grad()
def randomize_(module: nn.Module, gen: torch.Generator, std: float) -> None:
    """Overwrite every parameter of `module` deterministically from `gen`.

    Matrices (Linear weights, fused expert tensors, router weights, embeddings): N(0, std).
    Biases (q/k/v biases, LayerNorm bias): N(0, std). Norm weights: U(0.8, 1.2) so that a
    forgotten norm weight is visible. e_score_correction_bias buffers: U(-0.15, 0.15).
    """
    for name, p in module.named_parameters():
        owner = module.get_submodule(name.rsplit(".", 1)[0]) if "." in name else module
        if name.endswith(".bias") or name == "bias":
            p.copy_(torch.randn(p.shape, generator=gen) * std)
        elif _is_norm(owner):
            p.copy_(0.8 + 0.4 * torch.rand(p.shape, generator=gen))
        else:
            p.copy_(torch.randn(p.shape, generator=gen) * std)
    for name, b in module.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.copy_((torch.rand(b.shape, generator=gen) * 2.0 - 1.0) * 0.15)


# --------------------------------------------------------------------------------------
# MTP
# --------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """The transformers RMSNorm (f32 mean of squares, weight applied after the cast back)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        """y = weight * x / sqrt(mean(x^2) + eps)."""
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class MtpParts(nn.Module):
    """The MTP layer model.layers.{L}.*: enorm, hnorm, eh_proj, a decoder block, shared head."""

    def __init__(self, family: str, cfg, main_model, gen: torch.Generator, std: float):
        super().__init__()
        H = cfg.hidden_size
        self.family = family
        self.block_cfg = mtp_block_config(family, cfg)
        # A throwaway 1-layer model: its layer 0 is the MTP decoder block. save_pretrained on it
        # yields the hub (per-expert) tensor names for the block.
        self.holder = model_class(family)(self.block_cfg).eval()
        randomize_(self.holder, gen, std)
        self.enorm = RMSNorm(H, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(H, cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * H, H, bias=False)
        self.shared_norm = RMSNorm(H, cfg.rms_norm_eps)
        randomize_(self.enorm, gen, std)
        randomize_(self.hnorm, gen, std)
        randomize_(self.eh_proj, gen, std)
        randomize_(self.shared_norm, gen, std)
        # shared_head.head and the layer's embed_tokens are copies of the main model's, as in
        # real DeepSeek-V3 / GLM checkpoints (transformers uses the main ones anyway).
        self.main = [main_model]  # list: do not register as a submodule

    @property
    def block(self):
        """The MTP decoder block module."""
        return self.holder.model.layers[0]

    def hub_state_dict(self, L: int, tmpdir: str) -> dict[str, torch.Tensor]:
        """The MTP tensors under real-checkpoint names model.layers.{L}.*."""
        d = os.path.join(tmpdir, "mtp_holder")
        self.holder.save_pretrained(d)
        out = {}
        for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
            with safe_open(f, framework="pt") as fh:
                for k in fh.keys():
                    if k.startswith("model.layers.0."):
                        out[f"model.layers.{L}." + k[len("model.layers.0.") :]] = fh.get_tensor(k)
        main = self.main[0]
        out[f"model.layers.{L}.enorm.weight"] = self.enorm.weight.detach().clone()
        out[f"model.layers.{L}.hnorm.weight"] = self.hnorm.weight.detach().clone()
        out[f"model.layers.{L}.eh_proj.weight"] = self.eh_proj.weight.detach().clone()
        out[f"model.layers.{L}.shared_head.norm.weight"] = self.shared_norm.weight.detach().clone()
        out[f"model.layers.{L}.shared_head.head.weight"] = main.lm_head.weight.detach().clone()
        out[f"model.layers.{L}.embed_tokens.weight"] = (
            main.model.embed_tokens.weight.detach().clone()
        )
        return {k: v.contiguous() for k, v in sorted(out.items())}

    @torch.no_grad()
    def run(self, tokens: list[int], h: torch.Tensor, positions: list[int]):
        """Run the MTP layer over rows (h[j], tokens[j], positions[j]) with causal attention.

        Returns (pre-norm block output [S, H], logits [S, V]).
        """
        main = self.main[0]
        ids = torch.tensor([tokens])
        emb = main.model.embed_tokens(ids)
        x = self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(h.unsqueeze(0))], dim=-1))
        out = run_decoder_layer(main, self.block, x, positions)
        logits = F.linear(self.shared_norm(out), main.lm_head.weight)
        return out[0], logits[0]


def causal_mask(S: int, dtype=torch.float32) -> torch.Tensor:
    """Additive [1, 1, S, S] causal mask (0 on/below the diagonal, finfo.min above)."""
    m = torch.full((S, S), torch.finfo(dtype).min, dtype=dtype).triu(1)
    return m[None, None]


def run_decoder_layer(main_model, layer, x: torch.Tensor, positions: list[int]) -> torch.Tensor:
    """Apply one transformers decoder layer to x [1, S, H] with the main model's RoPE."""
    pos = torch.tensor([positions])
    pe = main_model.model.rotary_emb(x, position_ids=pos)
    out = layer(
        x,
        attention_mask=causal_mask(x.shape[1]),
        position_ids=pos,
        position_embeddings=pe,
        cache=None,
        use_cache=False,
    )
    if isinstance(out, tuple):  # glm_moe_dsa layers return (hidden, topk_indices)
        out = out[0]
    return out


# --------------------------------------------------------------------------------------
# Stability checks
# --------------------------------------------------------------------------------------


def logit_margin_rel(logits: torch.Tensor) -> torch.Tensor:
    """(top1 - top2) / max|logit| for every row of a [N, V] tensor."""
    top = logits.float().topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]) / logits.float().abs().max(dim=-1).values


class Checker:
    """Forward hooks that measure how close every discrete decision is to a tie.

    * softmax routers: gap between the k-th and (k+1)-th routing probability;
    * sigmoid routers (noaux_tc): gap between the topk_group-th and next group score
      (sum of the top-2 biased scores of each group) and between the k-th and (k+1)-th
      biased choice score among the experts of the selected groups;
    * DSA indexers: for every query with more than index_topk visible keys, the gap between
      the index_topk-th and next index score (and a recomputation cross-check).
    The hooks only inspect cache-free full forwards; disable them around generate().
    """

    def __init__(self):
        self.enabled = True
        self.router_gap = math.inf
        self.group_gap = math.inf
        self.indexer_gap = math.inf
        self.indexer_selections = 0
        self.indexer_mismatch = False
        self.handles = []

    def attach(self, root: nn.Module) -> None:
        """Register hooks on every router and indexer below `root`."""
        for _, m in root.named_modules():
            n = type(m).__name__
            if n.endswith("TopKRouter") or n.endswith("TopkRouter"):
                self.handles.append(m.register_forward_hook(self._router_hook))
            elif n.endswith("Indexer"):
                self.handles.append(m.register_forward_hook(self._indexer_hook, with_kwargs=True))

    def detach(self) -> None:
        """Remove all hooks."""
        for h in self.handles:
            h.remove()
        self.handles = []

    @torch.no_grad()
    def _router_hook(self, mod, args, out):
        """Measure routing gaps for one router call."""
        if not self.enabled:
            return
        x = args[0].reshape(-1, mod.hidden_dim).float()
        logits = F.linear(x, mod.weight.float())
        k = mod.top_k
        if hasattr(mod, "e_score_correction_bias"):
            choice = logits.sigmoid() + mod.e_score_correction_bias
            G = mod.num_group
            E = choice.shape[-1]
            if G > 1:
                gs = choice.view(-1, G, E // G).topk(2, dim=-1).values.sum(-1)
                srt = gs.sort(dim=-1, descending=True).values
                self.group_gap = min(
                    self.group_gap, (srt[:, mod.topk_group - 1] - srt[:, mod.topk_group]).min().item()
                )
                gidx = gs.topk(mod.topk_group, dim=-1).indices
                gmask = torch.zeros_like(gs).scatter_(1, gidx, 1.0)
                emask = gmask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E).bool()
                choice = choice.masked_fill(~emask, float("-inf"))
            srt = choice.sort(dim=-1, descending=True).values
            gap = srt[:, k - 1] - srt[:, k]
        else:
            probs = logits.softmax(dim=-1)
            srt = probs.sort(dim=-1, descending=True).values
            gap = srt[:, k - 1] - srt[:, k]
        self.router_gap = min(self.router_gap, gap.min().item())

    @torch.no_grad()
    def _indexer_hook(self, mod, args, kwargs, out):
        """Recompute the DSA index scores of one indexer call and measure the top-k gap."""
        if not self.enabled:
            return
        if kwargs.get("cache") is not None:
            raise RuntimeError("indexer checks need cache-free forwards")
        x, q_resid, (cos, sin), mask = args[0], args[1], args[2], args[3]
        scores = dsa_index_scores(mod, x, q_resid, cos, sin)  # [B, S, T]
        B, S, T = scores.shape
        for b in range(B):
            for i in range(S):
                valid = mask[b, i] if mask.dtype == torch.bool else mask[b, i] == 0
                nv = int(valid.sum())
                if nv <= mod.index_topk:
                    continue
                v = scores[b, i][valid]
                srt = v.sort(descending=True).values
                self.indexer_gap = min(
                    self.indexer_gap, (srt[mod.index_topk - 1] - srt[mod.index_topk]).item()
                )
                self.indexer_selections += 1
                mine = set(torch.nonzero(valid).flatten()[v.topk(mod.index_topk).indices].tolist())
                theirs = set(out[b, i].tolist())
                if mine != theirs:
                    self.indexer_mismatch = True


@torch.no_grad()
def dsa_index_scores(mod, x, q_resid, cos, sin) -> torch.Tensor:
    """GLM-MoE-DSA lightning indexer scores [B, S, T] (no mask), as in transformers 5.24.

    q = wq_b(q_resid) split per head into [rope | nope] (rope FIRST, qk_rope_head_dim wide),
    k = LayerNorm(wk(x)) (single head, weight+bias, eps 1e-6), same split; interleaved RoPE
    (pairs (0,1),(2,3),...) on the rope part of q and k; s[h,i,j] = relu(q_h,i . k_j / sqrt(D));
    w = weights_proj(x) / sqrt(n_heads); score[i,j] = sum_h w[i,h] * s[h,i,j].
    """
    B, S, _ = x.shape
    H, D, R = mod.n_heads, mod.head_dim, mod.qk_rope_head_dim
    q = mod.wq_b(q_resid).view(B, S, H, D)
    k = mod.k_norm(mod.wk(x))  # [B, S, D]
    c = cos[..., : cos.shape[-1] // 2]  # [B, S, R/2]
    s_ = sin[..., : sin.shape[-1] // 2]

    def rope(t, c, s_):
        """Interleaved rotation of the first R dims; output re-packed as [evens', odds'] like HF."""
        r, p = t[..., :R], t[..., R:]
        a, b = r[..., 0::2], r[..., 1::2]
        return torch.cat([a * c - b * s_, b * c + a * s_, p], dim=-1)

    q = rope(q, c.unsqueeze(2), s_.unsqueeze(2))
    k = rope(k, c, s_)
    sc = torch.einsum("bshd,btd->bhst", q.float(), k.float()) * mod.softmax_scale
    sc = F.relu(sc)
    w = mod.weights_proj(x).float() * (H**-0.5)  # [B, S, H]
    return torch.einsum("bsh,bhst->bst", w, sc)


# --------------------------------------------------------------------------------------
# Reference computation
# --------------------------------------------------------------------------------------


@dataclass
class Attempt:
    """Outcome of building one candidate model for one seed."""

    ok: bool
    reason: str
    model: object = None
    mtp: object = None
    oracle: dict = None


def f32_list(t: torch.Tensor) -> list[float]:
    """Exact float32 values as Python floats (JSON round-trips them exactly)."""
    return [float(v) for v in t.detach().to(torch.float32).flatten().tolist()]


@torch.no_grad()
def try_seed(family: str, s: Shape, seed: int, tok: Tokenizer) -> Attempt:
    """Build the model for `seed`, compute the oracle and run every stability check."""
    eos_id = tok.token_to_id(EOS_TOKEN)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    cfg = build_config(family, s, eos_id)
    model = model_class(family)(cfg).eval()
    randomize_(model, gen, s.init_std)
    mtp = MtpParts(family, cfg, model, gen, s.init_std).eval() if family in MTP_FAMILIES else None

    prompt_ids = tok.encode(s.prompt, add_special_tokens=False).ids
    P = len(prompt_ids)
    rng = np.random.default_rng(seed)
    extra = [int(v) for v in rng.integers(0, s.vocab - 1, size=EVAL_LEN - P)]  # never EOS
    eval_ids = prompt_ids + extra
    return reference_outputs(family, model, mtp, s.prompt, prompt_ids, eval_ids, seed)


@torch.no_grad()
def reference_outputs(
    family: str, model, mtp, prompt_text: str, prompt_ids: list[int], eval_ids: list[int], seed: int
) -> Attempt:
    """Compute the oracle of `model` (and `mtp`) and run every stability check.

    Shared with scripts/train_moe.py, which calls it on trained weights loaded back from disk.
    """
    cfg = model.config
    eos_id = cfg.eos_token_id
    P = len(prompt_ids)
    chk = Checker()
    chk.attach(model)
    if mtp is not None:
        chk.attach(mtp.holder)
    try:
        # Greedy decoding with transformers' generate (KV cache), EOS ignored.
        chk.enabled = False
        gcfg = transformers.GenerationConfig(
            do_sample=False, max_new_tokens=N_GREEDY, eos_token_id=None, bos_token_id=None,
            pad_token_id=eos_id, use_cache=True,
        )
        model.generation_config.eos_token_id = None  # generate() merges these defaults
        out = model.generate(torch.tensor([prompt_ids]), generation_config=gcfg)
        greedy = out[0, P:].tolist()
        chk.enabled = True
        if len(greedy) != N_GREEDY:
            return Attempt(False, f"generate returned {len(greedy)} tokens")
        if eos_id in greedy:
            return Attempt(False, "greedy output contains EOS")

        # Cache-free forward over prompt + greedy: must reproduce every greedy step.
        full = model(torch.tensor([prompt_ids + greedy]), use_cache=False).logits[0]
        step_logits = full[P - 1 : P - 1 + N_GREEDY]
        if step_logits.argmax(-1).tolist() != greedy:
            return Attempt(False, "cached generate != cache-free greedy")
        margins = [logit_margin_rel(step_logits).min().item()]

        # Teacher-forced evaluation sequence.
        captured = {}
        hk = model.model.norm.register_forward_hook(lambda m, a, o: captured.__setitem__("h", o))
        ev = model(torch.tensor([eval_ids]), use_cache=False).logits[0]
        hk.remove()
        h_eval = captured["h"][0]  # post-final-norm hidden states [n, H]
        margins.append(logit_margin_rel(ev).min().item())
        lsm = ev.double().log_softmax(-1)
        nll = [-lsm[i, eval_ids[i + 1]].item() for i in range(len(eval_ids) - 1)]

        oracle = {
            "family": family,
            "seed": seed,
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
            "prompt_text": prompt_text,
            "prompt_ids": prompt_ids,
            "greedy_ids": greedy,
            "eval_ids": eval_ids,
            "argmax": ev.argmax(-1).tolist(),
            "nll": nll,
            "last_logits": f32_list(ev[-1]),
        }

        if mtp is not None:
            n = len(eval_ids)
            _, lg = mtp.run(eval_ids[1:], h_eval[: n - 1], list(range(1, n)))
            margins.append(logit_margin_rel(lg).min().item())
            one_step = lg.argmax(-1).tolist()
            one_step_last = lg[-1]

            # draft3: main model over the prompt, then recursive MTP drafting.
            captured.clear()
            hk = model.model.norm.register_forward_hook(lambda m, a, o: captured.__setitem__("h", o))
            model(torch.tensor([prompt_ids]), use_cache=False)
            hk.remove()
            hs = list(captured["h"][0])  # h_0 .. h_{P-1}
            toks = prompt_ids[1:] + [greedy[0]]
            drafts, draft_logits = [], []
            for k in range(3):
                outs, lg = mtp.run(toks, torch.stack(hs), list(range(1, len(toks) + 1)))
                d = int(lg[-1].argmax())
                margins.append(logit_margin_rel(lg[-1:]).min().item())
                drafts.append(d)
                draft_logits.append(f32_list(lg[-1]))
                hs.append(outs[-1])  # pre-norm MTP output feeds the next step
                toks.append(d)
            oracle["mtp"] = {
                "definition": MTP_DEFINITION,
                "layer_index": cfg.num_hidden_layers,
                "one_step": one_step,
                "one_step_last_logits": f32_list(one_step_last),
                "draft3": drafts,
                "draft3_logits": draft_logits,
            }

        oracle["checks"] = {
            "min_logit_margin_rel": min(margins),
            "min_router_gap": chk.router_gap,
            "min_group_gap": None if math.isinf(chk.group_gap) else chk.group_gap,
            "min_indexer_gap": None if math.isinf(chk.indexer_gap) else chk.indexer_gap,
            "indexer_selections_checked": chk.indexer_selections,
            "thresholds": {
                "logit_margin_rel": LOGIT_MARGIN_REL,
                "router_gap": ROUTER_GAP,
                "indexer_gap": INDEXER_GAP,
            },
        }
    finally:
        chk.detach()

    if min(margins) <= LOGIT_MARGIN_REL:
        return Attempt(False, f"logit margin {min(margins):.2e}")
    if chk.router_gap <= ROUTER_GAP:
        return Attempt(False, f"router gap {chk.router_gap:.2e}")
    if chk.group_gap <= ROUTER_GAP:
        return Attempt(False, f"group gap {chk.group_gap:.2e}")
    if chk.indexer_gap <= INDEXER_GAP:
        return Attempt(False, f"indexer gap {chk.indexer_gap:.2e}")
    if family == "glm_moe_dsa" and chk.indexer_selections == 0:
        return Attempt(False, "no indexer selection happened")
    if chk.indexer_mismatch:
        raise RuntimeError("indexer recomputation disagrees with transformers despite a clear gap")
    return Attempt(True, "ok", model, mtp, oracle)


# --------------------------------------------------------------------------------------
# Writing and verifying a fixture directory
# --------------------------------------------------------------------------------------

OWNED_PATTERNS = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "oracle.json",
    "model.safetensors.index.json",
    "model-*-of-*.safetensors",
    "model.safetensors",
]


def clean_dir(out: str) -> None:
    """Remove the files this script writes from `out` (and nothing else)."""
    os.makedirs(out, exist_ok=True)
    for pat in OWNED_PATTERNS:
        for f in glob.glob(os.path.join(out, pat)):
            os.remove(f)


def write_json(path: str, obj) -> None:
    """Write JSON with sorted keys and a trailing newline."""
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


def write_weights(
    model, mtp: MtpParts | None, out: str, tmp: str, shard_bytes: int = SHARD_BYTES
) -> list[str]:
    """Write sharded safetensors (+ index) under hub tensor names; returns shard names.

    The main model goes through transformers' save_pretrained (which un-fuses experts into
    one tensor per expert and applies the hub renames, e.g. Mixtral block_sparse_moe/w1-w3).
    The shards are then rewritten unchanged, plus one extra shard with the MTP layer.
    """
    sp = os.path.join(tmp, "save_pretrained")
    model.save_pretrained(sp, max_shard_size=shard_bytes)
    index = json.load(open(os.path.join(sp, "model.safetensors.index.json")))
    groups: dict[str, list[str]] = {}
    for k, f in index["weight_map"].items():
        groups.setdefault(f, []).append(k)
    shards = [dict() for _ in sorted(groups)]
    for i, f in enumerate(sorted(groups)):
        with safe_open(os.path.join(sp, f), framework="pt") as fh:
            for k in sorted(groups[f]):
                shards[i][k] = fh.get_tensor(k)
    if mtp is not None:
        shards.append(mtp.hub_state_dict(model.config.num_hidden_layers, tmp))
    n = len(shards)
    assert n >= 2, "need at least two shards"
    weight_map, total_size, total_params, names = {}, 0, 0, []
    for i, tensors in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        names.append(name)
        save_file(tensors, os.path.join(out, name), metadata={"format": "pt"})
        for k, t in tensors.items():
            weight_map[k] = name
            total_size += t.numel() * t.element_size()
            total_params += t.numel()
    write_json(
        os.path.join(out, "model.safetensors.index.json"),
        {
            "metadata": {"total_parameters": total_params, "total_size": total_size},
            "weight_map": dict(sorted(weight_map.items())),
        },
    )
    return names


def write_fixture(family: str, att: Attempt, tok: Tokenizer, out: str) -> None:
    """Write every file of one fixture directory."""
    clean_dir(out)
    model, cfg = att.model, att.model.config
    with tempfile.TemporaryDirectory() as tmp:
        write_weights(model, att.mtp, out, tmp)
    write_metadata(cfg, tok, out)
    write_json(os.path.join(out, "oracle.json"), att.oracle)
    for f in os.listdir(out):
        os.chmod(os.path.join(out, f), 0o644)


def write_metadata(cfg, tok: Tokenizer, out: str, model_max_length: int = 256) -> None:
    """config.json, generation_config.json, tokenizer.json and tokenizer_config.json."""
    eos_id = tok.token_to_id(EOS_TOKEN)
    cfg.save_pretrained(out)
    cj = json.load(open(os.path.join(out, "config.json")))
    write_json(os.path.join(out, "config.json"), cj)
    write_json(
        os.path.join(out, "generation_config.json"),
        {"eos_token_id": eos_id, "do_sample": False, "transformers_version": transformers.__version__},
    )
    tok.save(os.path.join(out, "tokenizer.json"), pretty=True)
    write_json(
        os.path.join(out, "tokenizer_config.json"),
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": EOS_TOKEN,
            "bos_token": None,
            "pad_token": None,
            "unk_token": None,
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": model_max_length,
        },
    )


@torch.no_grad()
def verify_fixture(family: str, out: str, att: Attempt) -> None:
    """Reload the written fixture through transformers and re-check the oracle.

    * from_pretrained(out) must give bit-identical eval logits (validates tensor names and
      the per-expert layout), and the tokenizer must round-trip the prompt;
    * MTP families: a 1-layer model built from the model.layers.{L}.* tensors (renamed to
      layer 0) must reproduce the MTP block exactly; for deepseek_v3 and glm4_moe
      transformers' own MtpModel is loaded from the fixture and must reproduce one_step.
    """
    cls = model_class(family)
    L = att.model.config.num_hidden_layers
    old_ignore = cls._keys_to_ignore_on_load_unexpected
    # The class only ignores the hub layer number (e.g. 61 for DeepSeek-V3); point it at our L
    # so the main load skips the MTP layer and MtpModel finds it.
    cls._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{L}\..*"]
    try:
        _verify_fixture(family, out, att, cls, L)
    finally:
        cls._keys_to_ignore_on_load_unexpected = old_ignore


@torch.no_grad()
def _verify_fixture(family: str, out: str, att: Attempt, cls, L: int) -> None:
    """Body of verify_fixture (runs with the MTP layer number patched into the class)."""
    o = json.load(open(os.path.join(out, "oracle.json")))
    m = cls.from_pretrained(out, attn_implementation="eager", dtype=torch.float32).eval()
    ids = torch.tensor([o["eval_ids"]])
    ref = att.model(ids).logits
    got = m(ids).logits
    if not torch.equal(ref, got):
        raise RuntimeError(f"{family}: reloaded logits differ by {(ref - got).abs().max().item()}")
    if got[0, -1].tolist() != o["last_logits"]:
        raise RuntimeError(f"{family}: last_logits mismatch after reload")
    _verify_expert_layout(family, out, att.model)
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(out, "tokenizer.json"))
    if hf_tok.encode(o["prompt_text"], add_special_tokens=False) != o["prompt_ids"]:
        raise RuntimeError(f"{family}: tokenizer round trip failed")

    if att.mtp is not None:
        _verify_mtp_block(family, out, att, L)
        if family in ("deepseek_v3", "glm4_moe"):
            _verify_with_hf_mtp(m, o, att)


@torch.no_grad()
def _verify_expert_layout(family: str, out: str, model) -> None:
    """Independently check the per-expert tensors against the fused in-memory experts.

    transformers keeps experts.gate_up_proj [E, 2I, H] (gate rows first, then up rows) and
    experts.down_proj [E, H, I]; the files must hold gate_proj = gate_up_proj[e, :I],
    up_proj = gate_up_proj[e, I:], down_proj = down_proj[e] (Mixtral: w1, w3, w2).
    """
    saved = {}
    for f in sorted(glob.glob(os.path.join(out, "model-*.safetensors"))):
        with safe_open(f, framework="pt") as fh:
            for k in fh.keys():
                saved[k] = fh.get_tensor(k)
    names = ("w1", "w3", "w2") if family == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    checked = 0
    for name, mod in model.named_modules():
        if not isinstance(getattr(mod, "gate_up_proj", None), nn.Parameter):
            continue
        prefix = name.replace(".mlp.", ".block_sparse_moe.") if family == "mixtral" else name
        I = mod.down_proj.shape[-1]
        for e in range(mod.gate_up_proj.shape[0]):
            want = (mod.gate_up_proj[e, :I], mod.gate_up_proj[e, I:], mod.down_proj[e])
            for n, w in zip(names, want):
                if not torch.equal(saved[f"{prefix}.{e}.{n}.weight"], w):
                    raise RuntimeError(f"{family}: {prefix}.{e}.{n}.weight does not match")
                checked += 1
    if checked == 0:
        raise RuntimeError(f"{family}: no fused experts found")


@torch.no_grad()
def load_mtp_parts_(mtp: MtpParts, out: str, L: int) -> None:
    """Overwrite `mtp` with the model.layers.{L}.* tensors of the fixture in `out` (as float32).

    The decoder block goes through from_pretrained of a 1-layer model (hub per-expert names
    -> fused experts), enorm/hnorm/eh_proj/shared_head.norm are copied directly.
    """
    tensors, parts = {}, {}
    for f in sorted(glob.glob(os.path.join(out, "model-*.safetensors"))):
        with safe_open(f, framework="pt") as fh:
            for k in fh.keys():
                if k.startswith(f"model.layers.{L}."):
                    rest = k[len(f"model.layers.{L}.") :]
                    if rest.split(".")[0] in ("enorm", "hnorm", "eh_proj", "shared_head", "embed_tokens"):
                        parts[rest] = fh.get_tensor(k).float()
                        continue
                    tensors["model.layers.0." + rest] = fh.get_tensor(k).float()
                elif not k.startswith("model.layers."):
                    tensors[k] = fh.get_tensor(k).float()
    with tempfile.TemporaryDirectory() as tmp:
        save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        mtp.block_cfg.save_pretrained(tmp)
        m1 = model_class(mtp.family).from_pretrained(
            tmp, attn_implementation="eager", dtype=torch.float32
        ).eval()
    mtp.holder = m1
    mtp.enorm.weight.copy_(parts["enorm.weight"])
    mtp.hnorm.weight.copy_(parts["hnorm.weight"])
    mtp.eh_proj.weight.copy_(parts["eh_proj.weight"])
    mtp.shared_norm.weight.copy_(parts["shared_head.norm.weight"])
    main = mtp.main[0]
    if not torch.equal(parts["shared_head.head.weight"], main.lm_head.weight):
        raise RuntimeError("MTP shared_head.head differs from lm_head")
    if not torch.equal(parts["embed_tokens.weight"], main.model.embed_tokens.weight):
        raise RuntimeError("MTP embed_tokens differs from model.embed_tokens")


@torch.no_grad()
def _verify_mtp_block(family: str, out: str, att: Attempt, L: int) -> None:
    """Load model.layers.{L}.* as layer 0 of a 1-layer model and compare the block output."""
    with tempfile.TemporaryDirectory() as tmp:
        tensors = {}
        for f in sorted(glob.glob(os.path.join(out, "model-*.safetensors"))):
            with safe_open(f, framework="pt") as fh:
                for k in fh.keys():
                    if k.startswith(f"model.layers.{L}."):
                        rest = k[len(f"model.layers.{L}.") :]
                        if rest.split(".")[0] in ("enorm", "hnorm", "eh_proj", "shared_head", "embed_tokens"):
                            continue
                        tensors["model.layers.0." + rest] = fh.get_tensor(k)
                    elif not k.startswith("model.layers."):
                        tensors[k] = fh.get_tensor(k)
        save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        att.mtp.block_cfg.save_pretrained(tmp)
        m1 = model_class(family).from_pretrained(tmp, attn_implementation="eager").eval()
    x = torch.randn(1, 9, att.model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    pos = list(range(3, 12))
    a = run_decoder_layer(att.model, att.mtp.block, x, pos)
    b = run_decoder_layer(att.model, m1.model.layers[0], x, pos)
    if not torch.equal(a, b):
        raise RuntimeError(f"{family}: MTP block reload differs by {(a - b).abs().max().item()}")


@torch.no_grad()
def _verify_with_hf_mtp(main, o: dict, att: Attempt) -> None:
    """Check the MTP oracle against transformers' own MTP code, loaded from the fixture.

    * MtpModel.forward_layer over eval_ids must reproduce one_step (argmax, last logits);
    * generate(use_mtp=True) must draft draft3[0] right after the prefill (this pins the
      post-final-norm hidden state and the j+1 position convention) and still produce
      greedy_ids.
    """
    from transformers.modeling_layers import MtpModel

    mtp = MtpModel.from_pretrained(main).eval()
    ids = o["eval_ids"]
    n = len(ids)
    h = main.model(torch.tensor([ids])).last_hidden_state
    hid = mtp.forward_layer(
        0, h[:, : n - 1], torch.tensor([list(range(1, n))]), None, input_ids=torch.tensor([ids[1:]])
    )
    logits = mtp._project_to_logits(hid)[0]
    if logits.argmax(-1).tolist() != o["mtp"]["one_step"]:
        raise RuntimeError("transformers MtpModel one_step argmax differs from the oracle")
    diff = (logits[-1] - torch.tensor(o["mtp"]["one_step_last_logits"])).abs().max().item()
    if diff > 1e-5:
        raise RuntimeError(f"transformers MtpModel last logits differ by {diff}")

    drafted = []
    orig = MtpModel.forward

    def spy(self, *args, **kwargs):
        """Record the tokens MtpModel drafts."""
        res = orig(self, *args, **kwargs)
        drafted.append(res[0][0].tolist())
        return res

    MtpModel.forward = spy
    try:
        gcfg = transformers.GenerationConfig(
            do_sample=False, max_new_tokens=N_GREEDY, eos_token_id=None, pad_token_id=0, use_mtp=True
        )
        P = len(o["prompt_ids"])
        out = main.generate(torch.tensor([o["prompt_ids"]]), generation_config=gcfg)
    finally:
        MtpModel.forward = orig
    if out[0, P:].tolist() != o["greedy_ids"]:
        raise RuntimeError("generate(use_mtp=True) changed the greedy output")
    if not drafted or drafted[0] != o["mtp"]["draft3"][:1]:
        raise RuntimeError(f"generate(use_mtp=True) drafted {drafted[:1]}, oracle {o['mtp']['draft3'][:1]}")


# --------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------


def generate(family: str, seed: int, s: Shape, out: str, verbose: bool = True) -> dict:
    """Search seeds from `seed` until every check passes, then write and verify `out`."""
    tok = train_tokenizer(s.vocab)
    n_prompt = len(tok.encode(s.prompt, add_special_tokens=False).ids)
    if not 8 <= n_prompt <= 16:
        raise ValueError(f"prompt has {n_prompt} tokens; need 8..16")
    if family == "glm_moe_dsa" and n_prompt <= s.index_topk:
        raise ValueError("glm_moe_dsa prompt must be longer than index_topk")
    for attempt in range(MAX_SEED_TRIES):
        att = try_seed(family, s, seed + attempt, tok)
        if att.ok:
            break
        if verbose:
            print(f"  {family}: seed {seed + attempt} rejected ({att.reason})", file=sys.stderr)
    else:
        raise RuntimeError(f"{family}: no acceptable seed in {MAX_SEED_TRIES} tries")
    write_fixture(family, att, tok, out)
    verify_fixture(family, out, att)
    if verbose:
        size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
        c = att.oracle["checks"]
        print(
            f"{family}: seed {att.oracle['seed']} -> {out} ({size / 1e6:.2f} MB); "
            f"margin {c['min_logit_margin_rel']:.2e} router {c['min_router_gap']:.2e} "
            f"group {c['min_group_gap']} indexer {c['min_indexer_gap']}"
        )
    return att.oracle


def parse_args(argv=None):
    """Command-line interface."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--all", action="store_true", help="regenerate tests/fixtures/<family>/ for every family")
    p.add_argument("--families", default=None, help="with --all: comma-separated subset")
    p.add_argument("--family", choices=FAMILIES)
    p.add_argument("--seed", type=int, default=None, help="first seed to try (default: the committed one)")
    p.add_argument("--out", default=None, help="output directory")
    p.add_argument("--hidden", type=int)
    p.add_argument("--layers", type=int)
    p.add_argument("--experts", type=int)
    p.add_argument("--top-k", dest="top_k", type=int)
    p.add_argument("--norm-topk-prob", dest="norm_topk_prob", type=int, choices=[0, 1])
    p.add_argument("--heads", type=int)
    p.add_argument("--kv-heads", dest="kv_heads", type=int)
    p.add_argument("--head-dim", dest="head_dim", type=int)
    p.add_argument("--inter", type=int, help="dense MLP intermediate size (Mixtral/OLMoE: expert size)")
    p.add_argument("--moe-inter", dest="moe_inter", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--init-std", dest="init_std", type=float)
    p.add_argument("--n-group", dest="n_group", type=int)
    p.add_argument("--topk-group", dest="topk_group", type=int)
    p.add_argument("--index-topk", dest="index_topk", type=int)
    p.add_argument("--prompt", type=str)
    p.add_argument("--all-sparse", dest="all_sparse", action="store_true",
                   help="qwen3_moe: no dense layer (every layer MoE, as llama.cpp's qwen3moe requires)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    """Entry point."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if args.all:
        fams = args.families.split(",") if args.families else FAMILIES
        for fam in fams:
            seed, shape = ALL_FIXTURES[fam]
            generate(fam, seed, shape, os.path.join(FIXTURES_DIR, fam))
        return
    if not args.family or not args.out:
        raise SystemExit("need --all, or --family and --out")
    seed, shape = ALL_FIXTURES[args.family]
    overrides = {
        k: getattr(args, k)
        for k in (
            "hidden", "layers", "experts", "top_k", "heads", "kv_heads", "head_dim", "inter",
            "moe_inter", "vocab", "init_std", "n_group", "topk_group", "index_topk", "prompt",
        )
        if getattr(args, k) is not None
    }
    if args.all_sparse:
        overrides["qwen3_dense_layer"] = False
    if args.norm_topk_prob is not None:
        overrides["norm_topk_prob"] = bool(args.norm_topk_prob)
    shape = replace(shape, **overrides)
    generate(args.family, args.seed if args.seed is not None else seed, shape, args.out)


if __name__ == "__main__":
    main()
