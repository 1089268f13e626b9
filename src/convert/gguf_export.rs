//! Exports a model the engine loads (a hub checkpoint or a moestream
//! container) as a GGUF file llama.cpp runs: llama.cpp's tensor names and
//! `qwen3moe.*` metadata, routed experts stacked `[E, rows, cols]`, every
//! matrix re-encoded as one block type (Q4_0, Q8_0, Q2_K–Q6_K, or F32), norms and
//! routers in F32 as llama.cpp keeps them, and the byte-level BPE tokenizer
//! as `tokenizer.ggml.*`. It is what puts the same weights in front of both
//! engines for a head-to-head (results/gguf-vs-llamacpp.md). Qwen3-MoE only:
//! other families are refused by name.

use super::gguf_write::{write_gguf, TensorSpec};
use crate::error::{Error, Result};
use crate::formats::config::{Family, ModelConfig, QkNorm};
use crate::formats::gguf::file::{Array, Value};
use crate::formats::weights::WeightIndex;
use crate::kernels::ggml::{self, BlockType};
use std::io::Write;
use std::path::Path;

/// Where one output tensor's rows come from.
enum Source {
    /// A matrix `(rows, cols)` under its hub name.
    Mat(String, usize, usize),
    /// A vector under its hub name.
    Vector(String, usize),
    /// Part `p` (0 gate, 1 up, 2 down) of every routed expert of a layer.
    Experts(usize, usize),
}

/// One output tensor: its header entry and where its data comes from.
struct Planned {
    spec: TensorSpec,
    source: Source,
}

/// Writes `model` to `out` with every matrix as `ty` (`None`: F32). Returns
/// the tensors written.
pub fn export(
    model: &Path,
    out: &Path,
    ty: Option<BlockType>,
    progress: &dyn Fn(u64, u64),
) -> Result<usize> {
    let cfg = ModelConfig::load(model)?;
    if cfg.family != Family::Qwen3Moe {
        return Err(Error::Request(format!(
            "GGUF export supports qwen3_moe models; {} is {}",
            model.display(),
            cfg.family.model_type()
        )));
    }
    if let Some(l) = cfg.sparse_layers.iter().position(|s| !s) {
        return Err(Error::Request(format!(
            "layer {l} is a dense MLP; llama.cpp's qwen3moe needs every layer MoE"
        )));
    }
    let index = WeightIndex::open(model, moestream_io::ReadMode::Buffered)?;
    let plan = plan(&cfg, ty);
    let mut metadata = hparams(&cfg);
    metadata.extend(tokenizer(model, cfg.vocab_size)?);
    let specs: Vec<TensorSpec> = plan.iter().map(|p| p.spec.clone()).collect();
    let total: u64 = specs.iter().map(TensorSpec::bytes).sum();
    let mut done = 0u64;
    write_gguf(out, &metadata, &specs, |i, w| {
        write_tensor(&index, &cfg, &plan[i], w)?;
        done += specs[i].bytes();
        progress(done, total);
        Ok(())
    })?;
    Ok(specs.len())
}

/// Every tensor of the file, in file order.
fn plan(cfg: &ModelConfig, ty: Option<BlockType>) -> Vec<Planned> {
    let (h, hd) = (cfg.hidden_size, cfg.head_dim);
    let (q, kv) = (cfg.num_heads * hd, cfg.num_kv_heads * hd);
    let mat_ty = |cols: usize| match ty {
        Some(t) if cols.is_multiple_of(t.block_elems()) => t.ggml_id(),
        _ => 0,
    };
    let mat = |gguf: String, hub: String, rows: usize, cols: usize| Planned {
        spec: TensorSpec {
            name: gguf,
            dims: vec![cols as u64, rows as u64],
            ty: mat_ty(cols),
        },
        source: Source::Mat(hub, rows, cols),
    };
    let vector = |gguf: String, hub: String, len: usize| Planned {
        spec: TensorSpec {
            name: gguf,
            dims: vec![len as u64],
            ty: 0,
        },
        source: Source::Vector(hub, len),
    };
    let mut out = vec![
        mat(
            "token_embd.weight".into(),
            "model.embed_tokens.weight".into(),
            cfg.vocab_size,
            h,
        ),
        vector("output_norm.weight".into(), "model.norm.weight".into(), h),
    ];
    if !cfg.tie_word_embeddings {
        out.push(mat(
            "output.weight".into(),
            "lm_head.weight".into(),
            cfg.vocab_size,
            h,
        ));
    }
    for l in 0..cfg.num_layers {
        let (b, p) = (format!("blk.{l}."), format!("model.layers.{l}."));
        out.push(vector(
            format!("{b}attn_norm.weight"),
            format!("{p}input_layernorm.weight"),
            h,
        ));
        for (g, hub, rows, cols) in [
            ("attn_q", "q_proj", q, h),
            ("attn_k", "k_proj", kv, h),
            ("attn_v", "v_proj", kv, h),
            ("attn_output", "o_proj", h, q),
        ] {
            out.push(mat(
                format!("{b}{g}.weight"),
                format!("{p}self_attn.{hub}.weight"),
                rows,
                cols,
            ));
        }
        if cfg.qk_norm == QkNorm::PerHead {
            out.push(vector(
                format!("{b}attn_q_norm.weight"),
                format!("{p}self_attn.q_norm.weight"),
                hd,
            ));
            out.push(vector(
                format!("{b}attn_k_norm.weight"),
                format!("{p}self_attn.k_norm.weight"),
                hd,
            ));
        }
        out.push(vector(
            format!("{b}ffn_norm.weight"),
            format!("{p}post_attention_layernorm.weight"),
            h,
        ));
        let router = mat(
            format!("{b}ffn_gate_inp.weight"),
            format!("{p}mlp.gate.weight"),
            cfg.num_experts,
            h,
        );
        out.push(Planned {
            spec: TensorSpec {
                ty: 0,
                ..router.spec
            },
            ..router
        });
        let (e, m) = (cfg.num_experts as u64, cfg.moe_intermediate_size);
        for (part, g, rows, cols) in [
            (0, "ffn_gate_exps", m, h),
            (1, "ffn_up_exps", m, h),
            (2, "ffn_down_exps", h, m),
        ] {
            out.push(Planned {
                spec: TensorSpec {
                    name: format!("{b}{g}.weight"),
                    dims: vec![cols as u64, rows as u64, e],
                    ty: mat_ty(cols),
                },
                source: Source::Experts(l, part),
            });
        }
    }
    out
}

/// Streams one tensor's bytes: rows read, widened and re-encoded.
fn write_tensor(
    index: &WeightIndex,
    cfg: &ModelConfig,
    p: &Planned,
    w: &mut dyn Write,
) -> Result<()> {
    let ty = BlockType::from_ggml_id(p.spec.ty);
    match &p.source {
        Source::Vector(name, len) => emit(&index.read_f32(name, &[*len])?, *len, None, w),
        Source::Mat(name, rows, cols) => {
            emit(&index.read_mat(name, *rows, *cols)?.to_f32(), *cols, ty, w)
        }
        Source::Experts(layer, part) => {
            let parts = ["gate_proj", "up_proj", "down_proj"];
            let (h, m) = (cfg.hidden_size, cfg.moe_intermediate_size);
            let (rows, cols) = if *part == 2 { (h, m) } else { (m, h) };
            for e in 0..cfg.num_experts {
                let name = format!(
                    "model.layers.{layer}.mlp.experts.{e}.{}.weight",
                    parts[*part]
                );
                emit(&index.read_mat(&name, rows, cols)?.to_f32(), cols, ty, w)?;
            }
            Ok(())
        }
    }
}

/// Writes rows of `cols` f32 values as `ty` blocks (`None`: F32).
fn emit(values: &[f32], cols: usize, ty: Option<BlockType>, w: &mut dyn Write) -> Result<()> {
    let io = |e| Error::Request(format!("writing the GGUF file: {e}"));
    let Some(ty) = ty else {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        return w.write_all(&bytes).map_err(io);
    };
    let rb = ty.row_bytes(cols).expect("planned only for whole blocks");
    let mut buf = vec![0u8; values.len() / cols * rb];
    for (row, out) in values.chunks_exact(cols).zip(buf.chunks_exact_mut(rb)) {
        ggml::quantize_row(ty, row, out);
    }
    w.write_all(&buf).map_err(io)
}

/// The `general.*` and `qwen3moe.*` keys llama.cpp reads.
fn hparams(cfg: &ModelConfig) -> Vec<(String, Value)> {
    let a = "qwen3moe";
    let u = |v: usize| Value::U32(v as u32);
    vec![
        ("general.architecture".into(), Value::Str(a.into())),
        ("general.name".into(), Value::Str("moestream export".into())),
        (format!("{a}.block_count"), u(cfg.num_layers)),
        (
            format!("{a}.context_length"),
            u(cfg.rope.max_position_embeddings),
        ),
        (format!("{a}.embedding_length"), u(cfg.hidden_size)),
        (format!("{a}.feed_forward_length"), u(cfg.intermediate_size)),
        (
            format!("{a}.expert_feed_forward_length"),
            u(cfg.moe_intermediate_size),
        ),
        (format!("{a}.attention.head_count"), u(cfg.num_heads)),
        (format!("{a}.attention.head_count_kv"), u(cfg.num_kv_heads)),
        (format!("{a}.attention.key_length"), u(cfg.head_dim)),
        (format!("{a}.attention.value_length"), u(cfg.head_dim)),
        (
            format!("{a}.rope.freq_base"),
            Value::F32(cfg.rope.theta as f32),
        ),
        (
            format!("{a}.attention.layer_norm_rms_epsilon"),
            Value::F32(cfg.rms_norm_eps as f32),
        ),
        (format!("{a}.expert_count"), u(cfg.num_experts)),
        (format!("{a}.expert_used_count"), u(cfg.top_k)),
    ]
}

/// `tokenizer.*`: a GGUF source's own keys as they are; else those of a
/// byte-level BPE tokenizer.json (GPT-2's pre-tokenizer), padded with
/// unused tokens up to the embedding's rows.
fn tokenizer(model: &Path, vocab_size: usize) -> Result<Vec<(String, Value)>> {
    if crate::formats::gguf::is_gguf(model) {
        let g = crate::formats::gguf::GgufModel::open(model)?;
        let mut keys: Vec<(String, Value)> = g.files[0]
            .metadata
            .iter()
            .filter(|(k, _)| k.starts_with("tokenizer."))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        keys.sort_by(|a, b| a.0.cmp(&b.0));
        return Ok(keys);
    }
    let doc = crate::formats::model_files::read(model, "tokenizer.json")?
        .ok_or_else(|| Error::Request(format!("{}: no tokenizer.json", model.display())))?;
    let bad = |why: &str| Error::Tokenizer {
        path: doc.path.clone(),
        reason: format!("GGUF export: {why}"),
    };
    let j: serde_json::Value = serde_json::from_str(&doc.text).map_err(|e| bad(&e.to_string()))?;
    let byte_level =
        j["pre_tokenizer"]["type"] == "ByteLevel" && j["pre_tokenizer"]["use_regex"] != false;
    if j["model"]["type"] != "BPE" || !byte_level {
        return Err(bad(
            "only byte-level BPE with GPT-2's pre-tokenizer is exported",
        ));
    }
    let vocab = j["model"]["vocab"]
        .as_object()
        .ok_or_else(|| bad("model.vocab missing"))?;
    let mut tokens: Vec<Option<String>> = vec![None; vocab_size.max(vocab.len())];
    let mut types = vec![1i32; tokens.len()];
    for (tok, id) in vocab {
        let id = id
            .as_u64()
            .filter(|&i| (i as usize) < tokens.len())
            .ok_or_else(|| bad("an id is out of range"))?;
        tokens[id as usize] = Some(tok.clone());
    }
    for t in j["added_tokens"].as_array().into_iter().flatten() {
        if let (Some(id), Some(c)) = (t["id"].as_u64(), t["content"].as_str()) {
            if let Some(slot) = tokens.get_mut(id as usize) {
                *slot = Some(c.to_string());
                types[id as usize] = if t["special"] == true { 3 } else { 4 };
            }
        }
    }
    let tokens: Vec<String> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            t.unwrap_or_else(|| {
                types[i] = 5;
                format!("[PAD{i}]")
            })
        })
        .collect();
    let merges: Vec<String> = j["model"]["merges"]
        .as_array()
        .ok_or_else(|| bad("model.merges missing"))?
        .iter()
        .map(|m| match m {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Array(p) => format!(
                "{} {}",
                p[0].as_str().unwrap_or(""),
                p[1].as_str().unwrap_or("")
            ),
            _ => String::new(),
        })
        .collect();
    let eos = crate::formats::tokenizer::eos_ids(model)?
        .first()
        .copied()
        .unwrap_or(0);
    Ok(vec![
        ("tokenizer.ggml.model".into(), Value::Str("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::Str("gpt-2".into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(Array::Str(tokens)),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(Array::I32(types)),
        ),
        (
            "tokenizer.ggml.merges".into(),
            Value::Array(Array::Str(merges)),
        ),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(eos)),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(eos)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
    ])
}
