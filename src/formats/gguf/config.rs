//! A GGUF file's hyper-parameters (`{arch}.*` metadata, and which tensors
//! exist) as the Hugging Face config.json the engine's one config parser
//! reads, so a GGUF model is checked by exactly the rules a hub checkpoint
//! is. Where llama.cpp hard-codes a choice per architecture (Qwen3-MoE and
//! Mixtral renormalize the top-k weights; Qwen2-MoE and OLMoE do not), the
//! derived config states it. Errors name the GGUF key.

use super::file::{GgufFile, Value};
use super::Arch;
use crate::error::Result;
use serde_json::{json, Map, Value as Json};
use std::collections::HashSet;

/// Reads `{arch}.*` keys of one file.
struct Keys<'a> {
    file: &'a GgufFile,
    arch: &'static str,
}

impl Keys<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    fn opt(&self, k: &str) -> Option<&Value> {
        self.file.get(&self.key(k))
    }

    fn uint_opt(&self, k: &str) -> Result<Option<u64>> {
        match self.opt(k) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                self.file.error(format!(
                    "metadata `{}`: {v:?} is not a non-negative integer",
                    self.key(k)
                ))
            }),
        }
    }

    fn uint(&self, k: &str) -> Result<u64> {
        self.uint_opt(k)?.ok_or_else(|| {
            self.file
                .error(format!("metadata `{}` is missing", self.key(k)))
        })
    }

    /// An optional float key; NaN or infinite is refused (JSON has no
    /// such number: it would turn into null, and then into the default).
    fn float_opt(&self, k: &str) -> Result<Option<f64>> {
        match self.opt(k) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() => Ok(Some(x)),
                Some(x) => Err(self.file.error(format!(
                    "metadata `{}`: {x} is not a finite number",
                    self.key(k)
                ))),
                None => Err(self
                    .file
                    .error(format!("metadata `{}`: {v:?} is not a number", self.key(k)))),
            },
        }
    }

    fn bool_opt(&self, k: &str) -> Option<bool> {
        self.opt(k).and_then(Value::as_bool)
    }
}

/// The config.json of `file` (the first file of its set); `tensors` holds
/// every tensor name of the set, as GGUF spells them.
pub fn derive(file: &GgufFile, arch: Arch, tensors: &HashSet<String>) -> Result<Json> {
    let k = Keys {
        file,
        arch: arch.name(),
    };
    let blocks = k.uint("block_count")?;
    // Every block has tensors: a count above the set's tensors lies, and
    // is refused before anything is sized by it.
    if blocks > tensors.len() as u64 {
        return Err(file.error(format!(
            "metadata `{}` {blocks} is more blocks than the {} tensors of the file could hold",
            k.key("block_count"),
            tensors.len()
        )));
    }
    let nextn = k.uint_opt("nextn_predict_layers")?.unwrap_or(0);
    let layers = blocks
        .checked_sub(nextn)
        .filter(|&l| l > 0)
        .ok_or_else(|| {
            file.error(format!(
                "metadata `{}` {blocks} leaves no decoder layer beside {nextn} MTP layers",
                k.key("block_count")
            ))
        })?;
    let has = |t: &str| tensors.contains(t);
    let mut c = Map::new();
    c.insert("model_type".into(), json!(arch.model_type()));
    c.insert("num_hidden_layers".into(), json!(layers));
    c.insert("hidden_size".into(), json!(k.uint("embedding_length")?));
    c.insert(
        "num_attention_heads".into(),
        json!(k.uint("attention.head_count")?),
    );
    if let Some(kv) = k.uint_opt("attention.head_count_kv")? {
        c.insert("num_key_value_heads".into(), json!(kv));
    }
    c.insert("vocab_size".into(), json!(vocab_size(file, &k)?));
    c.insert(
        "max_position_embeddings".into(),
        json!(k.uint_opt("context_length")?.unwrap_or(4096)),
    );
    c.insert(
        "rms_norm_eps".into(),
        json!(k
            .float_opt("attention.layer_norm_rms_epsilon")?
            .unwrap_or(1e-6)),
    );
    c.insert(
        "rope_theta".into(),
        json!(k.float_opt("rope.freq_base")?.unwrap_or(10000.0)),
    );
    c.insert("tie_word_embeddings".into(), json!(!has("output.weight")));
    c.insert("num_experts".into(), json!(k.uint("expert_count")?));
    c.insert(
        "num_experts_per_tok".into(),
        json!(k.uint("expert_used_count")?),
    );
    let expert_ff = k.uint_opt("expert_feed_forward_length")?;
    let ff = k.uint_opt("feed_forward_length")?.or(expert_ff);
    c.insert("intermediate_size".into(), json!(ff.unwrap_or(0)));
    if let Some(e) = expert_ff {
        c.insert("moe_intermediate_size".into(), json!(e));
    }
    if let Some(w) = k.uint_opt("attention.sliding_window")? {
        c.insert("sliding_window".into(), json!(w));
        c.insert("use_sliding_window".into(), json!(w > 0));
    }
    if let Some(eos) = file
        .get("tokenizer.ggml.eos_token_id")
        .and_then(Value::as_u64)
    {
        c.insert("eos_token_id".into(), json!(eos));
    }
    match arch {
        Arch::Qwen3Moe | Arch::Qwen2Moe | Arch::Olmoe | Arch::Llama => {
            gqa(&k, arch, layers, &has, &mut c)?
        }
        Arch::Deepseek2 | Arch::Glm4Moe => sigmoid_routed(&k, arch, &has, &mut c)?,
    }
    if arch == Arch::Deepseek2 {
        mla(&k, &mut c)?;
    }
    Ok(Json::Object(c))
}

/// The vocabulary: `{arch}.vocab_size`, else the token list's length.
fn vocab_size(file: &GgufFile, k: &Keys) -> Result<u64> {
    if let Some(v) = k.uint_opt("vocab_size")? {
        return Ok(v);
    }
    match file.get("tokenizer.ggml.tokens") {
        Some(Value::Array(t)) => Ok(t.len() as u64),
        _ => Err(file.error(format!(
            "neither `{}` nor `tokenizer.ggml.tokens` gives the vocabulary size",
            k.key("vocab_size")
        ))),
    }
}

/// Qwen3-MoE, Qwen2-MoE, OLMoE and Mixtral: softmax routers, GQA.
fn gqa(
    k: &Keys,
    arch: Arch,
    layers: u64,
    has: &dyn Fn(&str) -> bool,
    c: &mut Map<String, Json>,
) -> Result<()> {
    if let Some(d) = k.uint_opt("attention.key_length")? {
        c.insert("head_dim".into(), json!(d));
    }
    // llama.cpp's graphs: Qwen3-MoE and Mixtral renormalize, the others not.
    let norm = matches!(arch, Arch::Qwen3Moe | Arch::Llama);
    c.insert("norm_topk_prob".into(), json!(norm));
    let dense: Vec<u64> = (0..layers)
        .filter(|l| !has(&format!("blk.{l}.ffn_gate_inp.weight")))
        .collect();
    c.insert("mlp_only_layers".into(), json!(dense));
    c.insert("qkv_bias".into(), json!(has("blk.0.attn_q.bias")));
    c.insert("attention_bias".into(), json!(has("blk.0.attn_q.bias")));
    if let Some(s) = k.uint_opt("expert_shared_feed_forward_length")? {
        c.insert("shared_expert_intermediate_size".into(), json!(s));
    }
    if let Some(clip) = k.float_opt("attention.clamp_kqv")? {
        c.insert("clip_qkv".into(), json!(clip));
    }
    // llama.cpp stores Mixtral's q/k rows permuted for interleaved RoPE.
    c.insert("rope_interleave".into(), json!(arch == Arch::Llama));
    Ok(())
}

/// DeepSeek-V3 and GLM-4.5: sigmoid routers with a correction bias,
/// leading dense layers, shared experts.
fn sigmoid_routed(
    k: &Keys,
    arch: Arch,
    has: &dyn Fn(&str) -> bool,
    c: &mut Map<String, Json>,
) -> Result<()> {
    match k.uint_opt("expert_gating_func")? {
        None | Some(2) => {}
        Some(g) => {
            return Err(k.file.error(format!(
                "metadata `{}` {g}: only sigmoid gating (2) is supported for {}",
                k.key("expert_gating_func"),
                k.arch
            )))
        }
    }
    c.insert("scoring_func".into(), json!("sigmoid"));
    c.insert("topk_method".into(), json!("noaux_tc"));
    let first_dense = k.uint_opt("leading_dense_block_count")?.unwrap_or(0);
    c.insert("first_k_dense_replace".into(), json!(first_dense));
    c.insert(
        "n_shared_experts".into(),
        json!(k.uint_opt("expert_shared_count")?.unwrap_or(0)),
    );
    c.insert(
        "n_group".into(),
        json!(k.uint_opt("expert_group_count")?.unwrap_or(1)),
    );
    c.insert(
        "topk_group".into(),
        json!(k.uint_opt("expert_group_used_count")?.unwrap_or(1)),
    );
    c.insert(
        "routed_scaling_factor".into(),
        json!(k.float_opt("expert_weights_scale")?.unwrap_or(1.0)),
    );
    c.insert(
        "norm_topk_prob".into(),
        json!(k.bool_opt("expert_weights_norm").unwrap_or(false)),
    );
    c.insert(
        "num_nextn_predict_layers".into(),
        json!(k.uint_opt("nextn_predict_layers")?.unwrap_or(0)),
    );
    if arch == Arch::Glm4Moe {
        let head_dim = k.uint("attention.key_length")?;
        c.insert("head_dim".into(), json!(head_dim));
        let rot = k.uint_opt("rope.dimension_count")?.unwrap_or(head_dim);
        c.insert(
            "partial_rotary_factor".into(),
            json!(rot as f64 / head_dim as f64),
        );
        c.insert("attention_bias".into(), json!(has("blk.0.attn_q.bias")));
        c.insert("use_qk_norm".into(), json!(has("blk.0.attn_q_norm.weight")));
    }
    Ok(())
}

/// DeepSeek-V3's MLA geometry and YaRN.
fn mla(k: &Keys, c: &mut Map<String, Json>) -> Result<()> {
    if let Some(r) = k.uint_opt("attention.q_lora_rank")? {
        c.insert("q_lora_rank".into(), json!(r));
    }
    let kv_lora = k.uint("attention.kv_lora_rank")?;
    let rope = k.uint("rope.dimension_count")?;
    let qk = k
        .uint_opt("attention.key_length_mla")?
        .unwrap_or(k.uint("attention.key_length")?);
    let v = k
        .uint_opt("attention.value_length_mla")?
        .unwrap_or(k.uint("attention.value_length")?);
    let nope = qk.checked_sub(rope).ok_or_else(|| {
        k.file.error(format!(
            "metadata `{}` {qk} is below the rotary dims {rope}",
            k.key("attention.key_length_mla")
        ))
    })?;
    c.insert("kv_lora_rank".into(), json!(kv_lora));
    c.insert("qk_rope_head_dim".into(), json!(rope));
    c.insert("qk_nope_head_dim".into(), json!(nope));
    c.insert("v_head_dim".into(), json!(v));
    c.insert("rope_interleave".into(), json!(true));
    let scaling = k.opt("rope.scaling.type").and_then(Value::as_str);
    if scaling == Some("yarn") {
        let factor = k.float_opt("rope.scaling.factor")?.unwrap_or(1.0);
        let orig = k
            .uint_opt("rope.scaling.original_context_length")?
            .unwrap_or(4096);
        // convert_hf_to_gguf stores 0.1 × mscale_all_dim as the log multiplier.
        let mscale_all = k
            .float_opt("rope.scaling.yarn_log_multiplier")?
            .map(|m| m / 0.1);
        let mut y = json!({
            "rope_type": "yarn", "factor": factor, "original_max_position_embeddings": orig,
            "beta_fast": k.float_opt("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
            "beta_slow": k.float_opt("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
            "mscale": 1.0,
        });
        if let Some(m) = mscale_all {
            y["mscale_all_dim"] = json!(m);
        }
        y["rope_theta"] = c["rope_theta"].clone();
        c.insert("rope_scaling".into(), y);
    } else if let Some(other) = scaling.filter(|s| *s != "none") {
        return Err(k.file.error(format!(
            "metadata `{}` `{other}` is not supported",
            k.key("rope.scaling.type")
        )));
    }
    Ok(())
}
