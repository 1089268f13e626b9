//! llama.cpp's tensor names (gguf-py's `TENSOR_NAMES`) → the Hugging Face
//! names the model loader asks for. A stacked expert tensor
//! (`blk.N.ffn_gate_exps.weight`, `[E, rows, cols]`) maps to a template
//! with `{e}` that the index expands into one entry per expert.

use super::Arch;

/// What a GGUF tensor becomes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mapped {
    /// One tensor of this name.
    One(String),
    /// A stacked expert tensor: expert `e` is named `template` with `{e}`
    /// replaced.
    Stacked(String),
    /// The split MLA key/value up-projection of newer converters
    /// (`attn_k_b` or `attn_v_b`), rebuilt into `kv_b_proj` by the index.
    KvBPart { layer: usize, value: bool },
    /// A tensor the engine does not use (e.g. `rope_freqs`).
    Unused,
}

/// Per-layer names: (GGUF suffix after `blk.N.`, HF suffix after
/// `model.layers.N.`), shared by every architecture.
const LAYER: &[(&str, &str)] = &[
    ("attn_norm.weight", "input_layernorm.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    (
        "post_attention_norm.weight",
        "post_attention_layernorm.weight",
    ),
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_q.bias", "self_attn.q_proj.bias"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_k.bias", "self_attn.k_proj.bias"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_v.bias", "self_attn.v_proj.bias"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    ("attn_output.bias", "self_attn.o_proj.bias"),
    ("attn_q_norm.weight", "self_attn.q_norm.weight"),
    ("attn_k_norm.weight", "self_attn.k_norm.weight"),
    ("attn_q_a.weight", "self_attn.q_a_proj.weight"),
    ("attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight"),
    ("attn_q_b.weight", "self_attn.q_b_proj.weight"),
    (
        "attn_kv_a_mqa.weight",
        "self_attn.kv_a_proj_with_mqa.weight",
    ),
    ("attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight"),
    ("attn_kv_b.weight", "self_attn.kv_b_proj.weight"),
    ("ffn_gate_inp.weight", "mlp.gate.weight"),
    ("exp_probs_b.bias", "mlp.gate.e_score_correction_bias"),
    ("ffn_gate.weight", "mlp.gate_proj.weight"),
    ("ffn_up.weight", "mlp.up_proj.weight"),
    ("ffn_down.weight", "mlp.down_proj.weight"),
    ("ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight"),
    ("nextn.eh_proj.weight", "eh_proj.weight"),
    ("nextn.enorm.weight", "enorm.weight"),
    ("nextn.hnorm.weight", "hnorm.weight"),
    ("nextn.shared_head_head.weight", "shared_head.head.weight"),
    ("nextn.shared_head_norm.weight", "shared_head.norm.weight"),
    ("nextn.embed_tokens.weight", "embed_tokens.weight"),
];

/// Stacked routed experts: (GGUF suffix, HF projection).
const EXPERTS: &[(&str, &str)] = &[
    ("ffn_gate_exps.weight", "gate_proj"),
    ("ffn_up_exps.weight", "up_proj"),
    ("ffn_down_exps.weight", "down_proj"),
];

/// Shared experts: (GGUF suffix, HF projection).
const SHARED: &[(&str, &str)] = &[
    ("ffn_gate_shexp.weight", "gate_proj"),
    ("ffn_up_shexp.weight", "up_proj"),
    ("ffn_down_shexp.weight", "down_proj"),
];

/// Maps GGUF tensor `name` of a file of `arch`; `None` for a name this
/// architecture does not have.
pub fn map(arch: Arch, name: &str) -> Option<Mapped> {
    let top = match name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        "rope_freqs.weight" => return Some(Mapped::Unused),
        _ => None,
    };
    if let Some(hf) = top {
        return Some(Mapped::One(hf.to_string()));
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let p = format!("model.layers.{layer}.");
    if let Some((_, hf)) = LAYER.iter().find(|(g, _)| *g == tail) {
        return Some(Mapped::One(format!("{p}{hf}")));
    }
    if let Some((_, proj)) = EXPERTS.iter().find(|(g, _)| *g == tail) {
        return Some(Mapped::Stacked(format!(
            "{p}mlp.experts.{{e}}.{proj}.weight"
        )));
    }
    if let Some((_, proj)) = SHARED.iter().find(|(g, _)| *g == tail) {
        let shared = match arch {
            Arch::Qwen2Moe => "shared_expert",
            _ => "shared_experts",
        };
        return Some(Mapped::One(format!("{p}mlp.{shared}.{proj}.weight")));
    }
    match tail {
        "attn_k_b.weight" => Some(Mapped::KvBPart {
            layer,
            value: false,
        }),
        "attn_v_b.weight" => Some(Mapped::KvBPart { layer, value: true }),
        "attn_rot_embd.weight" => Some(Mapped::Unused),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_each_kind_of_name() {
        let one = |s: &str| Some(Mapped::One(s.to_string()));
        let cases = [
            (
                Arch::Qwen3Moe,
                "token_embd.weight",
                one("model.embed_tokens.weight"),
            ),
            (Arch::Qwen3Moe, "output.weight", one("lm_head.weight")),
            (
                Arch::Qwen3Moe,
                "blk.12.attn_q_norm.weight",
                one("model.layers.12.self_attn.q_norm.weight"),
            ),
            (
                Arch::Glm4Moe,
                "blk.0.post_attention_norm.weight",
                one("model.layers.0.post_attention_layernorm.weight"),
            ),
            (
                Arch::Qwen2Moe,
                "blk.1.ffn_up_shexp.weight",
                one("model.layers.1.mlp.shared_expert.up_proj.weight"),
            ),
            (
                Arch::Deepseek2,
                "blk.1.ffn_up_shexp.weight",
                one("model.layers.1.mlp.shared_experts.up_proj.weight"),
            ),
            (
                Arch::Olmoe,
                "blk.2.ffn_down_exps.weight",
                Some(Mapped::Stacked(
                    "model.layers.2.mlp.experts.{e}.down_proj.weight".into(),
                )),
            ),
            (
                Arch::Deepseek2,
                "blk.3.attn_v_b.weight",
                Some(Mapped::KvBPart {
                    layer: 3,
                    value: true,
                }),
            ),
            (Arch::Llama, "rope_freqs.weight", Some(Mapped::Unused)),
            (Arch::Llama, "blk.x.attn_q.weight", None),
            (Arch::Llama, "blk.0.something_new.weight", None),
        ];
        for (arch, name, want) in cases {
            assert_eq!(map(arch, name), want, "{name}");
        }
    }
}
