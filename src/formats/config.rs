//! Model configuration: reads a Hugging Face `config.json` (both the
//! transformers-5 and the hub spellings of each field) into one normalized
//! [`ModelConfig`] that the rest of the engine uses. Every missing or bad
//! field is an [`Error::Config`] naming that field.

use crate::error::{Error, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The model families the engine implements (config.json `model_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Qwen3Moe,
    Qwen2Moe,
    Mixtral,
    Olmoe,
    DeepseekV3,
    Glm4Moe,
    GlmMoeDsa,
}

impl Family {
    /// Every family with its config.json `model_type`: the one place the
    /// strings are spelled.
    pub const ALL: [(Family, &'static str); 7] = [
        (Family::Qwen3Moe, "qwen3_moe"),
        (Family::Qwen2Moe, "qwen2_moe"),
        (Family::Mixtral, "mixtral"),
        (Family::Olmoe, "olmoe"),
        (Family::DeepseekV3, "deepseek_v3"),
        (Family::Glm4Moe, "glm4_moe"),
        (Family::GlmMoeDsa, "glm_moe_dsa"),
    ];

    /// All supported `model_type` strings, comma-separated.
    pub fn supported() -> String {
        Self::ALL.map(|(_, name)| name).join(", ")
    }

    fn parse(model_type: &str) -> Option<Family> {
        Self::ALL
            .iter()
            .find(|(_, name)| *name == model_type)
            .map(|(f, _)| *f)
    }

    /// The config.json spelling.
    pub fn model_type(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(f, _)| *f == self)
            .map(|(_, name)| *name)
            .expect("every family is in Family::ALL")
    }

    /// Whether the family uses multi-head latent attention.
    pub fn is_mla(self) -> bool {
        matches!(self, Family::DeepseekV3 | Family::GlmMoeDsa)
    }

    /// Whether the family routes with sigmoid scores + correction bias.
    pub fn is_sigmoid_routed(self) -> bool {
        matches!(
            self,
            Family::DeepseekV3 | Family::Glm4Moe | Family::GlmMoeDsa
        )
    }
}

/// Where the q/k normalization sits, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// RMSNorm over each head's `head_dim` (Qwen3-MoE).
    PerHead,
    /// RMSNorm over the whole q (or k) projection (OLMoE).
    Whole,
}

/// How the router turns logits into expert weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RouterKind {
    /// softmax over all experts, top-k, optionally renormalized.
    SoftmaxTopK { norm_topk_prob: bool },
    /// DeepSeek-V3 `noaux_tc`: sigmoid scores; choice = score + correction
    /// bias, group-limited top-k; weights are the unbiased scores of the
    /// winners, optionally renormalized, times `routed_scaling_factor`.
    SigmoidGrouped {
        n_group: usize,
        topk_group: usize,
        norm_topk_prob: bool,
        routed_scaling_factor: f32,
    },
}

/// Multi-head latent attention geometry (DeepSeek-V3, GLM-5).
#[derive(Clone, Debug, PartialEq)]
pub struct MlaConfig {
    /// `None`: a plain `q_proj` (DeepSeek-V2-Lite style).
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    /// Softmax scale: qk_head_dim^-0.5, times yarn's mscale² where configured.
    pub softmax_scale: f32,
    /// Biases on q_a_proj, kv_a_proj_with_mqa and o_proj.
    pub attention_bias: bool,
}

impl MlaConfig {
    /// nope + rope.
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }
}

/// The DSA lightning indexer (GLM-5).
#[derive(Clone, Debug, PartialEq)]
pub struct IndexerConfig {
    pub n_heads: usize,
    pub head_dim: usize,
    pub topk: usize,
    /// `full_layers[l]`: layer `l` runs its own indexer; otherwise it reuses
    /// the previous full layer's selection ("shared").
    pub full_layers: Vec<bool>,
}

/// Shared experts every token passes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedExperts {
    None,
    /// Qwen2-MoE: one shared expert of this size, gated by sigmoid(gate · x).
    Gated(usize),
    /// DeepSeek/GLM: `n_shared_experts × moe_intermediate_size`, ungated.
    Plain(usize),
}

/// RoPE frequency scaling, as in transformers' `ROPE_INIT_FUNCTIONS`.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    Default,
    Linear {
        factor: f64,
    },
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
    Yarn {
        factor: f64,
        original_max_position_embeddings: f64,
        beta_fast: f64,
        beta_slow: f64,
        mscale: Option<f64>,
        mscale_all_dim: Option<f64>,
        attention_factor: Option<f64>,
        truncate: bool,
    },
}

/// Rotary position embedding parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    pub theta: f64,
    pub scaling: RopeScaling,
    /// Number of leading dims of each head that rotate (even).
    pub rotary_dim: usize,
    /// true: pairs (2i, 2i+1) rotate together; false: (i, i + d/2) (rotate_half).
    pub interleaved: bool,
    pub max_position_embeddings: usize,
}

/// The normalized model configuration.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub path: PathBuf,
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Intermediate size of dense (non-MoE) MLP layers.
    pub intermediate_size: usize,
    /// Intermediate size of each routed expert.
    pub moe_intermediate_size: usize,
    pub num_experts: usize,
    pub top_k: usize,
    pub router: RouterKind,
    /// `sparse_layers[l]`: layer `l` is MoE (else dense MLP).
    pub sparse_layers: Vec<bool>,
    pub shared_experts: SharedExperts,
    pub rms_norm_eps: f64,
    pub rope: RopeConfig,
    pub qkv_bias: bool,
    pub o_bias: bool,
    pub qk_norm: QkNorm,
    pub clip_qkv: Option<f32>,
    /// `sliding_window[l]`: layer `l` attends only to its last `w` positions.
    pub sliding_window: Vec<Option<usize>>,
    pub tie_word_embeddings: bool,
    /// Multi-head latent attention (replaces the GQA fields' use) if set.
    pub mla: Option<MlaConfig>,
    /// The DSA indexer, if the family has one.
    pub indexer: Option<IndexerConfig>,
    /// Multi-token-prediction layers stored after the decoder layers.
    pub mtp_layers: usize,
}

/// Field reader over a config.json object that names the field in every error.
struct Fields<'a> {
    path: &'a Path,
    v: &'a Value,
}

impl Fields<'_> {
    fn get(&self, names: &[&str]) -> Option<&Value> {
        names
            .iter()
            .find_map(|n| self.v.get(*n).filter(|x| !x.is_null()))
    }

    fn err(&self, field: &str, reason: impl Into<String>) -> Error {
        Error::config(self.path, field, reason)
    }

    /// An optional integer; every integer field is a size or a count, so
    /// anything over [`SIZE_MAX`] is refused (no product of two of them
    /// can overflow).
    fn usize_opt(&self, names: &[&str]) -> Result<Option<usize>> {
        let Some(x) = self.get(names) else {
            return Ok(None);
        };
        let n = x.as_u64().ok_or_else(|| {
            self.err(
                names[0],
                format!("expected a non-negative integer, got {x}"),
            )
        })?;
        if n > SIZE_MAX as u64 {
            return Err(self.err(names[0], format!("{n} is over the supported {SIZE_MAX}")));
        }
        Ok(Some(n as usize))
    }

    fn usize(&self, names: &[&str]) -> Result<usize> {
        self.usize_opt(names)?
            .ok_or_else(|| self.err(names[0], "missing"))
    }

    fn f64_opt(&self, names: &[&str]) -> Result<Option<f64>> {
        match self.get(names) {
            None => Ok(None),
            Some(x) => x
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.err(names[0], format!("expected a number, got {x}"))),
        }
    }

    fn bool_or(&self, names: &[&str], default: bool) -> Result<bool> {
        match self.get(names) {
            None => Ok(default),
            Some(x) => x
                .as_bool()
                .ok_or_else(|| self.err(names[0], format!("expected true/false, got {x}"))),
        }
    }

    fn usize_list(&self, name: &str) -> Result<Vec<usize>> {
        match self.get(&[name]) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_u64()
                        .filter(|&n| n <= SIZE_MAX as u64)
                        .map(|n| n as usize)
                        .ok_or_else(|| self.err(name, format!("expected integers, got {x}")))
                })
                .collect(),
            Some(x) => Err(self.err(name, format!("expected a list, got {x}"))),
        }
    }

    fn positive(&self, names: &[&str]) -> Result<usize> {
        self.positive_max(names, SIZE_MAX)
    }

    /// A required integer in `1..=max`.
    fn positive_max(&self, names: &[&str], max: usize) -> Result<usize> {
        let n = self.usize(names)?;
        if n == 0 {
            return Err(self.err(names[0], "must be > 0"));
        }
        if n > max {
            return Err(self.err(names[0], format!("{n} is over the supported {max}")));
        }
        Ok(n)
    }

    /// An optional float that must be finite and in `(lo, hi]`, else
    /// `default`.
    fn f64_in(&self, names: &[&str], default: f64, (lo, hi): (f64, f64)) -> Result<f64> {
        let x = self.f64_opt(names)?.unwrap_or(default);
        check_in(self, names[0], x, (lo, hi))
    }
}

/// The largest size any config field may give (dimensions, vocabulary,
/// layers): far above every real model, far below what overflows a plan.
const SIZE_MAX: usize = 1 << 24;

/// The most routed experts a layer may have.
pub const EXPERTS_MAX: usize = 1 << 16;

/// The widest rotary slice the RoPE kernels handle.
pub const ROTARY_DIM_MAX: usize = 1024;

/// Refuses `x` unless it is finite and in `(lo, hi]`.
fn check_in(f: &Fields, name: &str, x: f64, (lo, hi): (f64, f64)) -> Result<f64> {
    if x.is_finite() && x > lo && x <= hi {
        Ok(x)
    } else {
        Err(f.err(name, format!("{x} is outside ({lo}, {hi}]")))
    }
}

impl ModelConfig {
    /// Builds the normalized config from parsed JSON (`path` only names errors).
    pub fn from_json(path: &Path, v: &Value) -> Result<ModelConfig> {
        let f = Fields { path, v };
        let model_type = f
            .get(&["model_type"])
            .and_then(Value::as_str)
            .ok_or_else(|| f.err("model_type", "missing"))?;
        let family = Family::parse(model_type).ok_or_else(|| Error::UnknownArchitecture {
            path: path.to_path_buf(),
            model_type: model_type.to_string(),
            supported: Family::supported(),
        })?;
        let hidden_size = f.positive(&["hidden_size"])?;
        let (num_heads, num_kv_heads, head_dim) = heads(&f, family, hidden_size)?;
        let num_layers = f.positive(&["num_hidden_layers"])?;
        let num_experts = f.positive_max(
            &["num_experts", "num_local_experts", "n_routed_experts"],
            EXPERTS_MAX,
        )?;
        let top_k = f.positive(&["num_experts_per_tok"])?;
        if top_k > num_experts {
            return Err(f.err(
                "num_experts_per_tok",
                format!("{top_k} exceeds the number of experts {num_experts}"),
            ));
        }
        let intermediate_size = f.positive(&["intermediate_size"])?;
        let moe_intermediate_size = match family {
            Family::Mixtral | Family::Olmoe => intermediate_size,
            _ => f.positive(&["moe_intermediate_size"])?,
        };
        let router = router_kind(&f, family, num_experts, top_k)?;
        let sparse_layers = sparse_layers(&f, family, num_layers)?;
        let shared_experts = shared_experts(&f, family, moe_intermediate_size)?;
        let (qkv_bias, o_bias, qk_norm) = attention_flags(&f, family)?;
        let clip_qkv = match f.f64_opt(&["clip_qkv"])? {
            Some(c) => Some(check_in(&f, "clip_qkv", c, (0.0, 1e9))? as f32),
            None => None,
        };
        let sliding_window = sliding_windows(&f, family, num_layers)?;
        let mla = if family.is_mla() {
            Some(mla_config(&f)?)
        } else {
            None
        };
        let rope = match &mla {
            Some(m) => {
                let interleaved =
                    family == Family::GlmMoeDsa || f.bool_or(&["rope_interleave"], true)?;
                rope_config(&f, m.qk_rope_head_dim, interleaved)?
            }
            // Hub GQA checkpoints rotate halves; a GGUF llama file stores
            // q/k rows permuted for interleaved pairs (its config says so).
            None => rope_config(&f, head_dim, f.bool_or(&["rope_interleave"], false)?)?,
        };
        let mla = mla.map(|m| MlaConfig {
            softmax_scale: mla_softmax_scale(&m, &rope),
            ..m
        });
        let indexer = match family {
            Family::GlmMoeDsa => Some(indexer_config(&f, num_layers, mla.as_ref())?),
            _ => None,
        };
        Ok(ModelConfig {
            path: path.to_path_buf(),
            family,
            vocab_size: f.positive(&["vocab_size"])?,
            hidden_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim: mla.as_ref().map_or(head_dim, MlaConfig::qk_head_dim),
            intermediate_size,
            moe_intermediate_size,
            num_experts,
            top_k,
            router,
            sparse_layers,
            shared_experts,
            rms_norm_eps: f.f64_in(&["rms_norm_eps"], 1e-6, (0.0, 1.0))?,
            rope,
            qkv_bias,
            o_bias,
            qk_norm,
            clip_qkv,
            sliding_window,
            tie_word_embeddings: f.bool_or(&["tie_word_embeddings"], false)?,
            mla,
            indexer,
            mtp_layers: f
                .usize_opt(&["num_nextn_predict_layers", "num_mtp_layers"])?
                .unwrap_or(0),
        })
    }
}

/// (heads, kv heads, head dim). MLA families take their head dims from the
/// MLA fields, so a missing `head_dim` is not an error for them.
fn heads(f: &Fields, family: Family, hidden: usize) -> Result<(usize, usize, usize)> {
    let num_heads = f.positive(&["num_attention_heads"])?;
    let num_kv_heads = f.usize_opt(&["num_key_value_heads"])?.unwrap_or(num_heads);
    if num_kv_heads == 0 || !num_heads.is_multiple_of(num_kv_heads) {
        return Err(f.err(
            "num_key_value_heads",
            format!("{num_kv_heads} does not divide num_attention_heads {num_heads}"),
        ));
    }
    let head_dim = match f.usize_opt(&["head_dim"])? {
        Some(d) => d,
        None if family.is_mla() || hidden.is_multiple_of(num_heads) => hidden / num_heads,
        None => {
            return Err(f.err(
                "head_dim",
                "missing and hidden_size % num_attention_heads != 0",
            ));
        }
    };
    Ok((num_heads, num_kv_heads, head_dim))
}

/// The shared experts of each family.
fn shared_experts(f: &Fields, family: Family, moe_inter: usize) -> Result<SharedExperts> {
    Ok(match family {
        Family::Qwen2Moe => match f.usize_opt(&["shared_expert_intermediate_size"])? {
            Some(0) | None => SharedExperts::None,
            Some(n) => SharedExperts::Gated(n),
        },
        Family::DeepseekV3 | Family::Glm4Moe | Family::GlmMoeDsa => {
            match f.usize_opt(&["n_shared_experts"])?.unwrap_or(1) {
                0 => SharedExperts::None,
                n => SharedExperts::Plain(n * moe_inter),
            }
        }
        Family::Qwen3Moe | Family::Mixtral | Family::Olmoe => SharedExperts::None,
    })
}

/// (q/k/v bias, o bias, q/k norm) of the GQA families, as transformers
/// builds each family's attention.
fn attention_flags(f: &Fields, family: Family) -> Result<(bool, bool, QkNorm)> {
    let qkv_bias = match family {
        Family::Qwen2Moe => f.bool_or(&["qkv_bias"], true)?,
        _ => f.bool_or(&["attention_bias"], false)?,
    };
    let o_bias = match family {
        Family::Qwen2Moe | Family::Mixtral | Family::Glm4Moe => false,
        _ => f.bool_or(&["attention_bias"], false)?,
    };
    let qk_norm = match family {
        Family::Qwen3Moe => QkNorm::PerHead,
        Family::Olmoe => QkNorm::Whole,
        Family::Glm4Moe if f.bool_or(&["use_qk_norm"], false)? => QkNorm::PerHead,
        _ => QkNorm::None,
    };
    Ok((qkv_bias, o_bias, qk_norm))
}

/// The router of each family, with the sigmoid families' group checks.
fn router_kind(f: &Fields, family: Family, num_experts: usize, top_k: usize) -> Result<RouterKind> {
    if !family.is_sigmoid_routed() {
        let norm_topk_prob = family == Family::Mixtral || f.bool_or(&["norm_topk_prob"], false)?;
        return Ok(RouterKind::SoftmaxTopK { norm_topk_prob });
    }
    if let Some(func) = f.get(&["scoring_func"]).and_then(Value::as_str) {
        if func != "sigmoid" {
            return Err(f.err(
                "scoring_func",
                format!("`{func}` is not supported (only sigmoid)"),
            ));
        }
    }
    let (group_default, scale_default) = match family {
        Family::DeepseekV3 => (8, 2.5),
        Family::Glm4Moe => (1, 1.0),
        _ => (1, 2.5),
    };
    let n_group = f.usize_opt(&["n_group"])?.unwrap_or(group_default);
    let topk_group = f.usize_opt(&["topk_group"])?.unwrap_or(n_group.min(4));
    if n_group == 0 || !num_experts.is_multiple_of(n_group) {
        return Err(f.err(
            "n_group",
            format!("{n_group} does not divide the {num_experts} routed experts"),
        ));
    }
    if topk_group == 0 || topk_group > n_group {
        return Err(f.err(
            "topk_group",
            format!("{topk_group} must be in 1..={n_group} (n_group)"),
        ));
    }
    if top_k > topk_group * (num_experts / n_group) {
        return Err(f.err(
            "num_experts_per_tok",
            format!("{top_k} exceeds the experts in the {topk_group} kept groups"),
        ));
    }
    Ok(RouterKind::SigmoidGrouped {
        n_group,
        topk_group,
        norm_topk_prob: f.bool_or(&["norm_topk_prob"], true)?,
        routed_scaling_factor: f.f64_in(&["routed_scaling_factor"], scale_default, (0.0, 1e4))?
            as f32,
    })
}

/// MLA geometry; the softmax scale is filled in once RoPE is known.
fn mla_config(f: &Fields) -> Result<MlaConfig> {
    let q_lora_rank = f.usize_opt(&["q_lora_rank"])?;
    if q_lora_rank == Some(0) {
        return Err(f.err("q_lora_rank", "must be > 0 or null"));
    }
    Ok(MlaConfig {
        q_lora_rank,
        kv_lora_rank: f.positive(&["kv_lora_rank"])?,
        qk_nope_head_dim: f.positive(&["qk_nope_head_dim"])?,
        qk_rope_head_dim: f.positive(&["qk_rope_head_dim"])?,
        v_head_dim: f.positive(&["v_head_dim"])?,
        softmax_scale: 0.0,
        attention_bias: f.bool_or(&["attention_bias"], false)?,
    })
}

/// qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)² under yarn
/// (transformers' `yarn_apply_mscale`).
fn mla_softmax_scale(m: &MlaConfig, rope: &RopeConfig) -> f32 {
    let base = (m.qk_head_dim() as f64).powf(-0.5);
    let mscale = match rope.scaling {
        RopeScaling::Yarn {
            factor,
            mscale_all_dim: Some(all),
            ..
        } if all != 0.0 && factor > 1.0 => 0.1 * all * factor.ln() + 1.0,
        _ => 1.0,
    };
    (base * mscale * mscale) as f32
}

/// The DSA indexer: heads, dims, top-k and which layers run their own.
fn indexer_config(f: &Fields, num_layers: usize, mla: Option<&MlaConfig>) -> Result<IndexerConfig> {
    let topk = f.usize(&["index_topk"])?;
    if topk == 0 {
        return Err(f.err("index_topk", "must be > 0"));
    }
    let head_dim = f.positive(&["index_head_dim"])?;
    let rope = mla.map_or(0, |m| m.qk_rope_head_dim);
    if head_dim < rope {
        return Err(f.err(
            "index_head_dim",
            format!("{head_dim} is smaller than qk_rope_head_dim {rope}"),
        ));
    }
    let full_layers = indexer_pattern(f, num_layers)?;
    if full_layers.first() == Some(&false) {
        return Err(f.err(
            "indexer_types",
            "layer 0 must be \"full\" (a shared layer needs an earlier full one)",
        ));
    }
    Ok(IndexerConfig {
        n_heads: f.positive(&["index_n_heads"])?,
        head_dim,
        topk,
        full_layers,
    })
}

/// `indexer_types`, else `index_topk_pattern` ("F"/"S"), else the
/// `index_topk_freq` / `index_skip_topk_offset` schedule.
fn indexer_pattern(f: &Fields, num_layers: usize) -> Result<Vec<bool>> {
    let parse = |field: &str, items: Vec<String>| -> Result<Vec<bool>> {
        if items.len() != num_layers {
            return Err(f.err(
                field,
                format!("has {} entries for {num_layers} layers", items.len()),
            ));
        }
        items
            .iter()
            .map(|t| match t.as_str() {
                "full" | "F" => Ok(true),
                "shared" | "S" => Ok(false),
                other => Err(f.err(field, format!("unknown indexer type `{other}`"))),
            })
            .collect()
    };
    let strings = |v: &Value| -> Option<Vec<String>> {
        match v {
            Value::Array(a) => a.iter().map(|x| x.as_str().map(str::to_string)).collect(),
            Value::String(s) => Some(s.chars().map(|c| c.to_string()).collect()),
            _ => None,
        }
    };
    for field in ["indexer_types", "index_topk_pattern"] {
        if let Some(v) = f.get(&[field]) {
            let items =
                strings(v).ok_or_else(|| f.err(field, "expected a list of \"full\"/\"shared\""))?;
            return parse(field, items);
        }
    }
    let freq = f.usize_opt(&["index_topk_freq"])?.unwrap_or(1).max(1);
    let offset = f.usize_opt(&["index_skip_topk_offset"])?.unwrap_or(2);
    Ok((0..num_layers)
        .map(|i| (i + 1).saturating_sub(offset) % freq == 0)
        .collect())
}

/// Per-layer sliding windows, as transformers applies them: Mixtral's
/// `sliding_window` on every layer; Qwen3-MoE's when `use_sliding_window`;
/// Qwen2-MoE's on the layers `layer_types` marks "sliding_attention"
/// (derived from `max_window_layers` when absent).
fn sliding_windows(f: &Fields, family: Family, num_layers: usize) -> Result<Vec<Option<usize>>> {
    let window = |on: bool| -> Result<Option<usize>> {
        match (on, f.usize_opt(&["sliding_window"])?) {
            (true, Some(0)) => Err(f.err("sliding_window", "must be > 0")),
            (true, w) => Ok(w),
            (false, _) => Ok(None),
        }
    };
    match family {
        Family::Mixtral => Ok(vec![window(true)?; num_layers]),
        Family::Qwen3Moe => Ok(vec![
            window(f.bool_or(&["use_sliding_window"], false)?)?;
            num_layers
        ]),
        Family::Qwen2Moe => {
            let on = f.bool_or(&["use_sliding_window"], false)?;
            let max_window_layers = f.usize_opt(&["max_window_layers"])?.unwrap_or(28);
            let types: Vec<bool> = match f.get(&["layer_types"]) {
                Some(Value::Array(a)) => {
                    if a.len() != num_layers {
                        return Err(f.err(
                            "layer_types",
                            format!("has {} entries for {num_layers} layers", a.len()),
                        ));
                    }
                    a.iter()
                        .map(|t| t.as_str() == Some("sliding_attention"))
                        .collect()
                }
                _ => (0..num_layers)
                    .map(|i| on && i % 2 == 0 && i < max_window_layers)
                    .collect(),
            };
            let w = if types.iter().any(|t| *t) {
                window(true)?
            } else {
                None
            };
            Ok(types.iter().map(|t| if *t { w } else { None }).collect())
        }
        _ => Ok(vec![None; num_layers]),
    }
}

/// Which layers are MoE: Qwen's `mlp_only_layers` / `decoder_sparse_step` rule;
/// DeepSeek/GLM's `first_k_dense_replace` (or GLM-5's `mlp_layer_types`);
/// every layer for Mixtral and OLMoE.
fn sparse_layers(f: &Fields, family: Family, num_layers: usize) -> Result<Vec<bool>> {
    match family {
        Family::Qwen3Moe | Family::Qwen2Moe => {
            let dense = f.usize_list("mlp_only_layers")?;
            let step = f.usize_opt(&["decoder_sparse_step"])?.unwrap_or(1);
            if step == 0 {
                return Err(f.err("decoder_sparse_step", "must be > 0"));
            }
            Ok((0..num_layers)
                .map(|l| !dense.contains(&l) && (l + 1) % step == 0)
                .collect())
        }
        Family::Mixtral | Family::Olmoe => Ok(vec![true; num_layers]),
        Family::DeepseekV3 | Family::Glm4Moe | Family::GlmMoeDsa => {
            if let Some(v) = f.get(&["mlp_layer_types"]) {
                let items = v
                    .as_array()
                    .ok_or_else(|| f.err("mlp_layer_types", "expected a list"))?;
                if items.len() != num_layers {
                    return Err(f.err(
                        "mlp_layer_types",
                        format!("has {} entries for {num_layers} layers", items.len()),
                    ));
                }
                return items
                    .iter()
                    .map(|x| match x.as_str() {
                        Some("sparse") => Ok(true),
                        Some("dense") => Ok(false),
                        _ => Err(f.err("mlp_layer_types", format!("unknown entry {x}"))),
                    })
                    .collect();
            }
            let default = if family == Family::Glm4Moe { 1 } else { 3 };
            let k = f.usize_opt(&["first_k_dense_replace"])?.unwrap_or(default);
            Ok((0..num_layers).map(|l| l >= k).collect())
        }
    }
}

/// RoPE parameters from `rope_parameters` (transformers 5) or
/// `rope_theta` + `rope_scaling` (hub), with `partial_rotary_factor`.
fn rope_config(f: &Fields, head_dim: usize, interleaved: bool) -> Result<RopeConfig> {
    let params = f.get(&["rope_parameters"]);
    let scaling = f.get(&["rope_scaling"]);
    let pick = |name: &str| -> Option<&Value> {
        params
            .and_then(|p| p.get(name))
            .or_else(|| scaling.and_then(|s| s.get(name)))
            .filter(|x| !x.is_null())
    };
    let num = |name: &str| -> Result<Option<f64>> {
        match pick(name) {
            None => Ok(None),
            Some(x) => x.as_f64().map(Some).ok_or_else(|| {
                f.err(
                    &format!("rope_parameters.{name}"),
                    format!("expected a number, got {x}"),
                )
            }),
        }
    };
    let theta = match num("rope_theta")? {
        Some(t) => t,
        None => f.f64_opt(&["rope_theta"])?.unwrap_or(10000.0),
    };
    check_in(f, "rope_theta", theta, (0.0, 1e15))?;
    let max_pos = match f.get(&["max_position_embeddings"]) {
        None => 4096,
        Some(_) => f.positive(&["max_position_embeddings"])?,
    };
    let rope_type = pick("rope_type")
        .or_else(|| pick("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let need = |name: &str| -> Result<f64> {
        let x = num(name)?.ok_or_else(|| {
            f.err(
                &format!("rope_parameters.{name}"),
                format!("required by rope_type {rope_type}"),
            )
        })?;
        check_in(f, &format!("rope_parameters.{name}"), x, (0.0, 1e9))
    };
    let scaling = match rope_type {
        "default" => RopeScaling::Default,
        "linear" => RopeScaling::Linear {
            factor: need("factor")?,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: need("factor")?,
            low_freq_factor: need("low_freq_factor")?,
            high_freq_factor: need("high_freq_factor")?,
            original_max_position_embeddings: need("original_max_position_embeddings")?,
        },
        "yarn" => RopeScaling::Yarn {
            factor: need("factor")?,
            original_max_position_embeddings: num("original_max_position_embeddings")?
                .unwrap_or(max_pos as f64),
            beta_fast: num("beta_fast")?.unwrap_or(32.0),
            beta_slow: num("beta_slow")?.unwrap_or(1.0),
            mscale: num("mscale")?,
            mscale_all_dim: num("mscale_all_dim")?,
            attention_factor: num("attention_factor")?,
            truncate: pick("truncate").and_then(Value::as_bool).unwrap_or(true),
        },
        other => {
            return Err(f.err(
                "rope_parameters.rope_type",
                format!("unsupported rope type `{other}`"),
            ))
        }
    };
    let partial = match num("partial_rotary_factor")? {
        Some(p) => p,
        None => f.f64_opt(&["partial_rotary_factor"])?.unwrap_or(1.0),
    };
    let rotary_dim = (head_dim as f64 * partial) as usize;
    if !rotary_dim.is_multiple_of(2)
        || rotary_dim == 0
        || rotary_dim > head_dim
        || rotary_dim > ROTARY_DIM_MAX
    {
        return Err(f.err(
            "partial_rotary_factor",
            format!(
                "gives rotary dim {rotary_dim} for head_dim {head_dim} (at most {ROTARY_DIM_MAX})"
            ),
        ));
    }
    Ok(RopeConfig {
        theta,
        scaling,
        rotary_dim,
        interleaved,
        max_position_embeddings: max_pos,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({"model_type": "qwen3_moe", "vocab_size": 100, "hidden_size": 32,
               "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
               "num_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 64,
               "moe_intermediate_size": 16, "mlp_only_layers": [1]})
    }

    #[test]
    fn parses_qwen3() {
        let c = ModelConfig::from_json(Path::new("c.json"), &base()).unwrap();
        assert_eq!(c.head_dim, 8);
        assert_eq!(c.sparse_layers, vec![true, false]);
        assert_eq!(c.rope.theta, 10000.0);
    }

    #[test]
    fn unknown_model_type_names_it() {
        let mut v = base();
        v["model_type"] = json!("llama_moe_x");
        let e = ModelConfig::from_json(Path::new("c.json"), &v)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("llama_moe_x") && e.contains("unknown architecture"),
            "{e}"
        );
    }

    #[test]
    fn missing_field_names_it() {
        let mut v = base();
        v.as_object_mut().unwrap().remove("hidden_size");
        let e = ModelConfig::from_json(Path::new("c.json"), &v)
            .unwrap_err()
            .to_string();
        assert!(e.contains("hidden_size"), "{e}");
    }

    #[test]
    fn qwen2_sliding_layers_follow_max_window_layers() {
        let mut v = base();
        v["model_type"] = json!("qwen2_moe");
        v["num_hidden_layers"] = json!(5);
        v["use_sliding_window"] = json!(true);
        v["sliding_window"] = json!(64);
        v["max_window_layers"] = json!(3);
        let c = ModelConfig::from_json(Path::new("c.json"), &v).unwrap();
        assert_eq!(c.sliding_window, vec![Some(64), None, Some(64), None, None]);
        v["use_sliding_window"] = json!(false);
        let c = ModelConfig::from_json(Path::new("c.json"), &v).unwrap();
        assert_eq!(c.sliding_window, vec![None; 5]);
    }

    #[test]
    fn rope_parameters_spelling() {
        let mut v = base();
        v["rope_parameters"] = json!({"rope_theta": 5e5, "rope_type": "default"});
        let c = ModelConfig::from_json(Path::new("c.json"), &v).unwrap();
        assert_eq!(c.rope.theta, 5e5);
    }
}
