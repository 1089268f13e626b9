//! The embedded default model: a synthetic Qwen3-MoE-layout checkpoint with
//! random weights (BF16, sharded safetensors, per-expert tensors under hub
//! names), a byte-level BPE tokenizer trained on an embedded text, and
//! generation/config files. Its text is meaningless — the weights are
//! random — but every byte is read the way a real checkpoint's is.
//!
//! Written into a temporary directory and renamed into place, so an
//! interrupted generation never leaves a half-written model behind.

pub mod geometry;
pub mod presets;
pub mod realistic;

use crate::engine::sampler::Rng;
use crate::error::{Error, Result};
use half::bf16;
use safetensors::tensor::{Dtype, TensorView};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::Path;

/// Geometry of a synthetic model.
#[derive(Clone, Debug)]
pub struct SynthSpec {
    pub hidden: usize,
    pub layers: usize,
    pub experts: usize,
    pub top_k: usize,
    pub moe_inter: usize,
    pub dense_inter: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub seed: u64,
}

impl Default for SynthSpec {
    fn default() -> Self {
        SynthSpec {
            hidden: 512,
            layers: 8,
            experts: 32,
            top_k: 4,
            moe_inter: 256,
            dense_inter: 1024,
            heads: 8,
            kv_heads: 4,
            head_dim: 64,
            vocab: 512,
            seed: 1,
        }
    }
}

impl SynthSpec {
    /// Refuses a geometry no model can have (the config loader would
    /// refuse the result): a zero size, top-k of 0 or above the experts,
    /// heads that do not divide, or sizes past the config limits.
    pub fn validate(&self) -> Result<()> {
        let sizes = [
            ("hidden", self.hidden),
            ("layers", self.layers),
            ("experts", self.experts),
            ("top_k", self.top_k),
            ("moe_inter", self.moe_inter),
            ("dense_inter", self.dense_inter),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("vocab", self.vocab),
        ];
        for (name, n) in sizes {
            if n == 0 || n > 1 << 20 {
                return Err(Error::Request(format!(
                    "synthetic model: {name} {n} is outside 1..={}",
                    1 << 20
                )));
            }
        }
        if self.top_k > self.experts || self.experts > crate::formats::config::EXPERTS_MAX {
            return Err(Error::Request(format!(
                "synthetic model: top_k {} must be at most experts {} (at most {})",
                self.top_k,
                self.experts,
                crate::formats::config::EXPERTS_MAX
            )));
        }
        if !self.heads.is_multiple_of(self.kv_heads) || !self.head_dim.is_multiple_of(2) {
            return Err(Error::Request(format!(
                "synthetic model: heads {} must be a multiple of kv_heads {}, head_dim {} even",
                self.heads, self.kv_heads, self.head_dim
            )));
        }
        Ok(())
    }
}

/// Creates the synthetic model at `dir` unless it already exists.
/// Returns true when it was created now. Safe under concurrency: each
/// caller builds in a directory of its own and renames it into place; a
/// caller that loses the race removes its copy and uses the winner's.
pub fn ensure(dir: &Path, spec: &SynthSpec) -> Result<bool> {
    if dir.join("config.json").exists() {
        return Ok(false);
    }
    spec.validate()?;
    ensure_with(dir, |tmp| write(tmp, spec))
}

/// Makes the model directory `dir` by `write` into a fresh temporary
/// directory beside it, renamed into place (so concurrent first uses all
/// succeed, and none sees a partial model); `false` when it was there.
pub fn ensure_with(dir: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<bool> {
    if dir.join("config.json").exists() {
        return Ok(false);
    }
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| Error::file(parent, e))?;
    let prefix = format!(".{}.tmp-", file_name(dir));
    crate::fs::remove_stale(parent, &prefix);
    let tmp = parent.join(format!("{prefix}{}", crate::fs::write::unique_suffix()));
    std::fs::create_dir(&tmp).map_err(|e| Error::file(&tmp, e))?;
    let built =
        write(&tmp).and_then(|()| std::fs::rename(&tmp, dir).map_err(|e| Error::file(dir, e)));
    match built {
        Ok(()) => Ok(true),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            if dir.join("config.json").exists() {
                return Ok(false);
            }
            Err(e)
        }
    }
}

fn file_name(dir: &Path) -> &str {
    dir.file_name().and_then(|n| n.to_str()).unwrap_or("model")
}

/// Writes every file of the synthetic model into `dir`.
pub fn write(dir: &Path, spec: &SynthSpec) -> Result<()> {
    let vocab = write_tokenizer(dir, spec.vocab)?;
    let spec = SynthSpec {
        vocab,
        ..spec.clone()
    };
    write_json(&dir.join("config.json"), &config_json(&spec))?;
    write_json(
        &dir.join("generation_config.json"),
        &json!({"eos_token_id": 0, "bos_token_id": 0}),
    )?;
    write_json(
        &dir.join("tokenizer_config.json"),
        &json!({"eos_token": "<|endoftext|>", "model_max_length": 4096}),
    )?;
    write_weights(dir, &spec)
}

fn config_json(s: &SynthSpec) -> serde_json::Value {
    json!({
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": s.vocab,
        "hidden_size": s.hidden,
        "intermediate_size": s.dense_inter,
        "moe_intermediate_size": s.moe_inter,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "num_experts": s.experts,
        "num_experts_per_tok": s.top_k,
        "norm_topk_prob": true,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [0],
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "moestream_synthetic": true
    })
}

pub(crate) fn write_json(path: &Path, v: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(v).expect("JSON values serialize");
    crate::fs::write(path, text.as_bytes())
}

const CORPUS: &str = include_str!("synth_corpus.txt");

/// Trains a byte-level BPE on the embedded corpus; returns its vocab size.
/// The alphabet is only the corpus's own (ASCII) characters, so every token
/// decodes to valid text and the random model prints words, not stray bytes.
pub(crate) fn write_tokenizer(dir: &Path, vocab: usize) -> Result<usize> {
    use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::{AddedToken, TokenizerBuilder};
    let path = dir.join("tokenizer.json");
    let err = |e: tokenizers::Error| Error::Tokenizer {
        path: path.clone(),
        reason: e.to_string(),
    };
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(vec![AddedToken::from("<|endoftext|>", true)])
        .build();
    let mut tok = TokenizerBuilder::<
        BPE,
        tokenizers::NormalizerWrapper,
        ByteLevel,
        ByteLevel,
        ByteLevel,
    >::new()
    .with_model(BPE::default())
    .with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)))
    .with_post_processor(Some(ByteLevel::default().trim_offsets(false)))
    .with_decoder(Some(ByteLevel::default()))
    .build()
    .map_err(err)?;
    tok.train(&mut trainer, CORPUS.lines()).map_err(err)?;
    tok.save(&path, false).map_err(err)?;
    Ok(tok.get_vocab_size(true))
}

/// `n` Uniform(-a, a) values with the std of `std`.
pub(crate) fn noise(rng: &mut Rng, n: usize, std: f32) -> Vec<f32> {
    let a = std * 3f32.sqrt();
    (0..n)
        .map(|_| (rng.next_f64() as f32 * 2.0 - 1.0) * a)
        .collect()
}

/// [`noise`] as BF16 bytes.
fn random_bf16(rng: &mut Rng, n: usize, std: f32) -> Vec<u8> {
    noise(rng, n, std)
        .into_iter()
        .flat_map(|v| bf16::from_f32(v).to_le_bytes())
        .collect()
}

fn ones_bf16(n: usize) -> Vec<u8> {
    (0..n).flat_map(|_| bf16::ONE.to_le_bytes()).collect()
}

/// One shard's tensors: name -> (shape, bytes).
type ShardTensors = BTreeMap<String, (Vec<usize>, Vec<u8>)>;

/// The tensors of the model, grouped by shard.
fn tensors(s: &SynthSpec) -> Vec<ShardTensors> {
    let mut rng = Rng::new(s.seed);
    let (h, qd, kd) = (s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim);
    let mut shards = vec![BTreeMap::new(), BTreeMap::new()];
    let mut put = |shard: usize, name: String, shape: Vec<usize>, bytes: Vec<u8>| {
        shards[shard].insert(name, (shape, bytes));
    };
    put(
        0,
        "model.embed_tokens.weight".into(),
        vec![s.vocab, h],
        random_bf16(&mut rng, s.vocab * h, 1.0),
    );
    for l in 0..s.layers {
        let shard = usize::from(l >= s.layers / 2);
        let p = format!("model.layers.{l}.");
        let fan = |n: usize| 1.0 / (n as f32).sqrt();
        let mats = [
            ("self_attn.q_proj.weight", vec![qd, h]),
            ("self_attn.k_proj.weight", vec![kd, h]),
            ("self_attn.v_proj.weight", vec![kd, h]),
            ("self_attn.o_proj.weight", vec![h, qd]),
        ];
        for (name, shape) in mats {
            let n = shape[0] * shape[1];
            put(
                shard,
                format!("{p}{name}"),
                shape.clone(),
                random_bf16(&mut rng, n, fan(shape[1])),
            );
        }
        for name in ["self_attn.q_norm.weight", "self_attn.k_norm.weight"] {
            put(
                shard,
                format!("{p}{name}"),
                vec![s.head_dim],
                ones_bf16(s.head_dim),
            );
        }
        for name in ["input_layernorm.weight", "post_attention_layernorm.weight"] {
            put(shard, format!("{p}{name}"), vec![h], ones_bf16(h));
        }
        let mut mlp = |prefix: String, i: usize, rng: &mut Rng| {
            for (part, shape) in [
                ("gate_proj", [i, h]),
                ("up_proj", [i, h]),
                ("down_proj", [h, i]),
            ] {
                let b = random_bf16(rng, i * h, fan(shape[1]));
                put(shard, format!("{prefix}{part}.weight"), shape.to_vec(), b);
            }
        };
        if l == 0 {
            mlp(format!("{p}mlp."), s.dense_inter, &mut rng);
        } else {
            for e in 0..s.experts {
                mlp(format!("{p}mlp.experts.{e}."), s.moe_inter, &mut rng);
            }
            let router = random_bf16(&mut rng, s.experts * h, fan(h) * 4.0);
            put(
                shard,
                format!("{p}mlp.gate.weight"),
                vec![s.experts, h],
                router,
            );
        }
    }
    put(1, "model.norm.weight".into(), vec![h], ones_bf16(h));
    put(
        1,
        "lm_head.weight".into(),
        vec![s.vocab, h],
        random_bf16(&mut rng, s.vocab * h, 1.0 / (h as f32).sqrt() * 4.0),
    );
    shards
}

fn write_weights(dir: &Path, s: &SynthSpec) -> Result<()> {
    let shards = tensors(s);
    let count = shards.len();
    let mut weight_map = serde_json::Map::new();
    for (i, shard) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{count:05}.safetensors", i + 1);
        let path = dir.join(&file);
        let views: Vec<(String, TensorView)> = shard
            .iter()
            .map(|(name, (shape, bytes))| {
                let view = TensorView::new(Dtype::BF16, shape.clone(), bytes)
                    .expect("shape matches bytes");
                (name.clone(), view)
            })
            .collect();
        safetensors::serialize_to_file(views, None, &path).map_err(|e| Error::Shard {
            path: path.clone(),
            reason: format!("write failed: {e}"),
        })?;
        for name in shard.keys() {
            weight_map.insert(name.clone(), json!(file));
        }
    }
    write_json(
        &dir.join("model.safetensors.index.json"),
        &json!({"metadata": {}, "weight_map": weight_map}),
    )
}
