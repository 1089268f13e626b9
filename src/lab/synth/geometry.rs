//! Synthetic models of real geometries (`moestream synth --geometry`):
//! random weights in the shapes of a real MoE model, written straight into
//! the quantized container (docs/FORMAT.md: int4 routed experts, int8 dense
//! weights, f32 norms and routers), one tensor at a time, so a model of tens
//! of GB is written without tens of GB of RAM.
//!
//! Routing: `--routing realistic` (the Qwen3 geometry's default) builds the
//! attention, embedding, lm_head and routers of [`super::realistic`], so
//! that popularity skew, temporal reuse and cross-layer predictability come
//! out as its knobs ask. `zipf` and `uniform` set popularity only — every
//! token routes independently and a router lookahead guesses nearly all of
//! the next layer's experts: expert popularity follows a Zipf law
//! (`--routing zipf`, exponent `--zipf-s`), or is near-uniform. Qwen3-MoE
//! routers have no bias term, so the skew goes in through the residual
//! stream: every token embedding carries a constant in dimension 0 that
//! dominates it, and each router row's weight on dimension 0 is the log of
//! its expert's popularity (a per-layer random permutation of the Zipf
//! ranks), scaled to the spread of the routers' noise. The realized
//! popularity is what the usage counters and `bench decode` then measure.
//!
//! Geometries: `qwen3-30b-a3b` (Qwen3-30B-A3B: hidden 2048, 48 layers, 128
//! experts of 768, top-8, GQA 32/4 heads of 128), `deepseek-v3` (hidden
//! 7168, 61 layers, 3 dense, 256 experts of 2048, MLA) and `glm5` (GLM-5:
//! hidden 6144, 78 layers, 3 dense, 256 experts of 2048, MLA + the DSA
//! indexer). The MLA families route by sigmoid scores plus a correction
//! bias, which carries the popularity directly. `--layers` and `--experts`
//! shrink a geometry for a smaller model of the same per-layer shapes;
//! `--hidden`, `--moe-inter` and `--top-k` change those shapes (small test
//! models).

use super::realistic::{self, Knobs, Part, RoutingPlan};
use super::{noise, write_json, write_tokenizer};
use crate::convert::writer::{FileWriter, Layout, ALIGN};
use crate::engine::sampler::Rng;
use crate::error::{Error, Result};
use crate::formats::quant::{QBits, QMatrix};
use crate::formats::weights::index::{scales_name, QUANT_META_PREFIX};
use serde_json::json;
use std::path::Path;

/// How a geometry routes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Routing {
    /// Popularity skew, temporal reuse and cross-layer predictability as
    /// the knobs ask ([`super::realistic`]; the Qwen3 family only).
    Realistic(Knobs),
    /// Popularity of the expert of rank r ∝ 1 / r^s.
    Zipf(f64),
    /// Every expert equally likely.
    Uniform,
}

impl Routing {
    /// The spelling of `synth --routing`.
    pub fn name(&self) -> &'static str {
        match self {
            Routing::Realistic(_) => "realistic",
            Routing::Zipf(_) => "zipf",
            Routing::Uniform => "uniform",
        }
    }
}

/// A geometry and how much of it to write.
#[derive(Clone, Debug)]
pub struct GeometrySpec {
    pub name: String,
    /// Decoder layers (default: the real model's).
    pub layers: Option<usize>,
    /// Routed experts per layer (default: the real model's).
    pub experts: Option<usize>,
    /// Vocabulary rows of the embedding and lm_head (default: the real
    /// model's; the tokenizer itself is small).
    pub vocab: Option<usize>,
    /// Hidden size, routed experts' width and experts per token (default:
    /// the real model's; smaller ones make small test models).
    pub hidden: Option<usize>,
    pub moe_inter: Option<usize>,
    pub top_k: Option<usize>,
    /// Leading dense layers of an MLA geometry (default: the real
    /// model's 3). Fewer keep a shrunk model's dense share of compute near
    /// the real one's (3 of 78 layers in GLM-5).
    pub dense_layers: Option<usize>,
    pub routing: Routing,
    pub seed: u64,
}

/// The shapes of one geometry.
#[derive(Clone, Debug)]
struct Shape {
    hidden: usize,
    layers: usize,
    experts: usize,
    top_k: usize,
    moe_inter: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    vocab: usize,
    /// Multi-head latent attention and sigmoid routing (DeepSeek-V3, GLM-5).
    mla: Option<Mla>,
    /// Attention, embedding, lm_head and routers from [`realistic`].
    realistic: bool,
}

/// The MLA families' extra shapes.
#[derive(Clone, Debug)]
struct Mla {
    model_type: &'static str,
    q_lora: usize,
    kv_lora: usize,
    nope: usize,
    rope: usize,
    v: usize,
    /// Leading dense layers and their MLP width.
    dense_layers: usize,
    dense_inter: usize,
    n_group: usize,
    topk_group: usize,
    /// DSA indexer: (heads, head dim, top-k).
    indexer: Option<(usize, usize, usize)>,
}

/// Geometries `synth --geometry` knows.
pub const GEOMETRIES: &[&str] = &["qwen3-30b-a3b", "deepseek-v3", "glm5", "glm5-mini"];

/// Qwen3-30B-A3B: its config.json.
fn qwen3_30b_a3b() -> Shape {
    Shape {
        hidden: 2048,
        layers: 48,
        experts: 128,
        top_k: 8,
        moe_inter: 768,
        heads: 32,
        kv_heads: 4,
        head_dim: 128,
        vocab: 151_936,
        mla: None,
        realistic: false,
    }
}

/// DeepSeek-V3 (671B): its config.json.
fn deepseek_v3() -> Shape {
    Shape {
        hidden: 7168,
        layers: 61,
        experts: 256,
        top_k: 8,
        moe_inter: 2048,
        heads: 128,
        kv_heads: 128,
        head_dim: 192,
        vocab: 129_280,
        realistic: false,
        mla: Some(Mla {
            model_type: "deepseek_v3",
            q_lora: 1536,
            kv_lora: 512,
            nope: 128,
            rope: 64,
            v: 128,
            dense_layers: 3,
            dense_inter: 18_432,
            n_group: 8,
            topk_group: 4,
            indexer: None,
        }),
    }
}

/// GLM-5 (744B): transformers' GlmMoeDsaConfig defaults.
fn glm5() -> Shape {
    Shape {
        hidden: 6144,
        layers: 78,
        experts: 256,
        top_k: 8,
        moe_inter: 2048,
        heads: 64,
        kv_heads: 64,
        head_dim: 256,
        vocab: 154_880,
        realistic: false,
        mla: Some(Mla {
            model_type: "glm_moe_dsa",
            q_lora: 2048,
            kv_lora: 512,
            nope: 192,
            rope: 64,
            v: 256,
            dense_layers: 3,
            dense_inter: 12_288,
            n_group: 1,
            topk_group: 1,
            indexer: Some((32, 128, 2048)),
        }),
    }
}

/// GLM-5's layer structure (MLA + DSA indexer, a dense layer, sigmoid
/// routing, shared experts) at small sizes: for tests and quick
/// experiments.
fn glm5_mini() -> Shape {
    Shape {
        hidden: 512,
        layers: 4,
        experts: 64,
        top_k: 8,
        moe_inter: 128,
        heads: 8,
        kv_heads: 8,
        head_dim: 64,
        vocab: 1024,
        realistic: false,
        mla: Some(Mla {
            model_type: "glm_moe_dsa",
            q_lora: 256,
            kv_lora: 128,
            nope: 32,
            rope: 32,
            v: 64,
            dense_layers: 1,
            dense_inter: 512,
            n_group: 1,
            topk_group: 1,
            indexer: Some((4, 32, 2048)),
        }),
    }
}

fn shape(spec: &GeometrySpec) -> Result<Shape> {
    let base = match spec.name.as_str() {
        "qwen3-30b-a3b" => qwen3_30b_a3b(),
        "deepseek-v3" => deepseek_v3(),
        "glm5" => glm5(),
        "glm5-mini" => glm5_mini(),
        other => {
            return Err(Error::Request(format!(
                "unknown geometry `{other}` (known: {})",
                GEOMETRIES.join(", ")
            )))
        }
    };
    let mut s = Shape {
        layers: spec.layers.unwrap_or(base.layers),
        experts: spec.experts.unwrap_or(base.experts),
        vocab: spec.vocab.unwrap_or(base.vocab).max(TOKENIZER_VOCAB),
        hidden: spec.hidden.unwrap_or(base.hidden),
        moe_inter: spec.moe_inter.unwrap_or(base.moe_inter),
        top_k: spec.top_k.unwrap_or(base.top_k),
        realistic: matches!(spec.routing, Routing::Realistic(_)),
        ..base
    };
    if s.layers == 0 || s.top_k == 0 || s.experts < s.top_k || s.hidden < 2 || s.moe_inter == 0 {
        return Err(Error::Request(format!(
            "layers, top-k, hidden and moe_inter must be positive and experts at least top-k ({})",
            s.top_k
        )));
    }
    if let Some(dense) = spec.dense_layers {
        set_dense_layers(&mut s, dense, &spec.name)?;
    }
    if s.realistic && s.mla.as_ref().is_some_and(|m| m.n_group > 1) {
        return Err(Error::Request(format!(
            "--routing realistic models plain top-k routing; `{}` routes within expert groups (n_group > 1): it takes zipf or uniform",
            spec.name
        )));
    }
    Ok(s)
}

/// Sets an MLA geometry's leading dense layers; at least one MoE layer
/// must remain.
fn set_dense_layers(s: &mut Shape, dense: usize, name: &str) -> Result<()> {
    let layers = s.layers;
    let Some(m) = s.mla.as_mut() else {
        return Err(Error::Request(format!(
            "dense_layers: `{name}` has no leading dense layers (the MLA geometries do)"
        )));
    };
    if dense >= layers {
        return Err(Error::Request(format!(
            "dense_layers {dense} leaves no MoE layer of {layers}"
        )));
    }
    m.dense_layers = dense;
    Ok(())
}

/// Tokens of the trained tokenizer (the vocabulary is at least this).
const TOKENIZER_VOCAB: usize = 512;

/// Layers per output file.
const LAYERS_PER_FILE: usize = 4;
/// Sigmoid-router bias per nat of log-popularity (MLA families).
const ROUTER_BIAS_PER_NAT: f32 = 0.02;

/// The constant every token embedding carries in dimension 0.
const EMBED_DIM0: f32 = 4.0;
/// Std of the other embedding dimensions and of the dense weights' noise.
const EMBED_STD: f32 = 0.02;

/// What one output tensor holds.
#[derive(Clone, Debug)]
enum Fill {
    /// f32 ones (norm weights).
    Ones,
    /// int8 rows, Uniform noise of this std.
    Int8(f32),
    /// int4 rows, uniform integers in [-7, 7], scale giving this std.
    Int4(f32),
    /// The embedding (int8): dimension 0 constant, the rest noise.
    Embed,
    /// A router (f32): noise, with the popularity bias in dimension 0.
    Router { layer: usize },
    /// f32 zeros (biases).
    Zeros,
    /// An MLA router (f32 noise; its bias is a separate tensor).
    Int8Router,
    /// The sigmoid router's `e_score_correction_bias` (f32): the popularity.
    RouterBias { layer: usize },
    /// A tensor of realistic routing (int8 rows, or f32).
    Real { part: Part, int8: bool },
}

struct Planned {
    name: String,
    rows: usize,
    cols: usize,
    fill: Fill,
    /// Starts a routed expert (aligned to 4096).
    aligned: bool,
}

fn tensors_of_file(s: &Shape, f: usize, files: usize) -> Vec<Planned> {
    let t = |name: String, rows, cols, fill| Planned {
        name,
        rows,
        cols,
        fill,
        aligned: false,
    };
    let h = s.hidden;
    let mut out = Vec::new();
    let real = |part, int8, plain| match s.realistic {
        true => Fill::Real { part, int8 },
        false => plain,
    };
    if f == 0 {
        out.push(t(
            "model.embed_tokens.weight".into(),
            s.vocab,
            h,
            real(Part::Embed, true, Fill::Embed),
        ));
    }
    let layers = f * LAYERS_PER_FILE..((f + 1) * LAYERS_PER_FILE).min(s.layers);
    if let Some(m) = &s.mla {
        mla_layers(s, m, layers.clone(), &mut out);
    }
    for l in layers.clone().filter(|_| s.mla.is_none()) {
        gqa_layer(s, l, &mut out);
    }
    let first_moe = s.mla.as_ref().map_or(0, |m| m.dense_layers);
    for l in layers.filter(|&l| l >= first_moe) {
        for e in 0..s.experts {
            let p = format!("model.layers.{l}.mlp.experts.{e}.");
            let up = (h as f32).sqrt().recip();
            let down = EMBED_STD / s.moe_inter as f32;
            let mut g = t(
                format!("{p}gate_proj.weight"),
                s.moe_inter,
                h,
                Fill::Int4(up),
            );
            g.aligned = true;
            out.push(g);
            out.push(t(
                format!("{p}up_proj.weight"),
                s.moe_inter,
                h,
                Fill::Int4(up),
            ));
            out.push(t(
                format!("{p}down_proj.weight"),
                h,
                s.moe_inter,
                Fill::Int4(down),
            ));
        }
    }
    if f + 1 == files {
        out.push(t("model.norm.weight".into(), h, 1, Fill::Ones));
        out.push(t(
            "lm_head.weight".into(),
            s.vocab,
            h,
            real(Part::LmHead, true, Fill::Int8(EMBED_STD)),
        ));
    }
    out
}

/// The norms, attention and router of GQA layer `l` (its routed experts
/// follow, aligned); realistic routing's tensors where it is on.
fn gqa_layer(s: &Shape, l: usize, out: &mut Vec<Planned>) {
    let mut t = |name: String, (rows, cols): (usize, usize), fill, real: Option<(Part, bool)>| {
        let fill = match real.filter(|_| s.realistic) {
            Some((part, int8)) => Fill::Real { part, int8 },
            None => fill,
        };
        out.push(Planned {
            name,
            rows,
            cols,
            fill,
            aligned: false,
        });
    };
    let (h, hd) = (s.hidden, s.head_dim);
    let (qd, kd) = (s.heads * hd, s.kv_heads * hd);
    let p = format!("model.layers.{l}.");
    let a = format!("{p}self_attn.");
    let dense = Fill::Int8((h as f32).sqrt().recip());
    for norm in ["input_layernorm", "post_attention_layernorm"] {
        t(format!("{p}{norm}.weight"), (h, 1), Fill::Ones, None);
    }
    let f32_part = |part| Some((part, false));
    let int8_part = |part| Some((part, true));
    t(
        format!("{a}q_norm.weight"),
        (hd, 1),
        Fill::Ones,
        f32_part(Part::QNorm(l)),
    );
    t(
        format!("{a}k_norm.weight"),
        (hd, 1),
        Fill::Ones,
        f32_part(Part::KNorm(l)),
    );
    t(
        format!("{a}q_proj.weight"),
        (qd, h),
        dense.clone(),
        int8_part(Part::QProj(l)),
    );
    t(
        format!("{a}k_proj.weight"),
        (kd, h),
        dense.clone(),
        int8_part(Part::KProj(l)),
    );
    t(
        format!("{a}v_proj.weight"),
        (kd, h),
        dense,
        int8_part(Part::VProj(l)),
    );
    // Small outputs keep the residual stream dominated by dimension 0.
    let small = Fill::Int8(EMBED_STD / qd as f32);
    t(
        format!("{a}o_proj.weight"),
        (h, qd),
        small,
        int8_part(Part::OProj(l)),
    );
    let router = Fill::Router { layer: l };
    t(
        format!("{p}mlp.gate.weight"),
        (s.experts, h),
        router,
        f32_part(Part::Router(l)),
    );
}

/// The attention, norms, dense MLPs, routers and shared experts of MLA
/// layers `layers` (their routed experts follow, aligned).
fn mla_layers(s: &Shape, m: &Mla, layers: std::ops::Range<usize>, out: &mut Vec<Planned>) {
    let t = |name: String, rows, cols, fill| Planned {
        name,
        rows,
        cols,
        fill,
        aligned: false,
    };
    // Realistic routing's tensors where it is on (int8 rows, or f32).
    let real = |part, int8, plain| match s.realistic {
        true => Fill::Real { part, int8 },
        false => plain,
    };
    let h = s.hidden;
    let std = |fan_in: usize| (fan_in as f32).sqrt().recip();
    for l in layers {
        let p = format!("model.layers.{l}.");
        let a = format!("{p}self_attn.");
        out.push(t(format!("{p}input_layernorm.weight"), h, 1, Fill::Ones));
        out.push(t(
            format!("{p}post_attention_layernorm.weight"),
            h,
            1,
            Fill::Ones,
        ));
        out.push(t(
            format!("{a}q_a_proj.weight"),
            m.q_lora,
            h,
            real(Part::QA(l), true, Fill::Int8(std(h))),
        ));
        out.push(t(
            format!("{a}q_a_layernorm.weight"),
            m.q_lora,
            1,
            Fill::Ones,
        ));
        let qk = m.nope + m.rope;
        out.push(t(
            format!("{a}q_b_proj.weight"),
            s.heads * qk,
            m.q_lora,
            real(Part::QB(l), true, Fill::Int8(std(m.q_lora))),
        ));
        out.push(t(
            format!("{a}kv_a_proj_with_mqa.weight"),
            m.kv_lora + m.rope,
            h,
            real(Part::KvA(l), true, Fill::Int8(std(h))),
        ));
        out.push(t(
            format!("{a}kv_a_layernorm.weight"),
            m.kv_lora,
            1,
            Fill::Ones,
        ));
        let kvb = s.heads * (m.nope + m.v);
        out.push(t(
            format!("{a}kv_b_proj.weight"),
            kvb,
            m.kv_lora,
            real(Part::KvB(l), true, Fill::Int8(std(m.kv_lora))),
        ));
        let small = EMBED_STD / (s.heads * m.v) as f32;
        out.push(t(
            format!("{a}o_proj.weight"),
            h,
            s.heads * m.v,
            real(Part::OProj(l), true, Fill::Int8(small)),
        ));
        if let Some((ih, id, _)) = m.indexer {
            let x = format!("{a}indexer.");
            out.push(t(
                format!("{x}wq_b.weight"),
                ih * id,
                m.q_lora,
                Fill::Int8(std(m.q_lora)),
            ));
            out.push(t(format!("{x}wk.weight"), id, h, Fill::Int8(std(h))));
            out.push(t(format!("{x}k_norm.weight"), id, 1, Fill::Ones));
            out.push(t(format!("{x}k_norm.bias"), id, 1, Fill::Zeros));
            out.push(t(
                format!("{x}weights_proj.weight"),
                ih,
                h,
                Fill::Int8(std(h)),
            ));
        }
        let mlp = |prefix: String, inter: usize, out: &mut Vec<Planned>| {
            out.push(t(
                format!("{prefix}gate_proj.weight"),
                inter,
                h,
                Fill::Int8(std(h)),
            ));
            out.push(t(
                format!("{prefix}up_proj.weight"),
                inter,
                h,
                Fill::Int8(std(h)),
            ));
            let down = EMBED_STD / inter as f32;
            out.push(t(
                format!("{prefix}down_proj.weight"),
                h,
                inter,
                Fill::Int8(down),
            ));
        };
        if l < m.dense_layers {
            mlp(format!("{p}mlp."), m.dense_inter, out);
        } else {
            out.push(t(
                format!("{p}mlp.gate.weight"),
                s.experts,
                h,
                real(Part::Router(l), false, Fill::Int8Router),
            ));
            out.push(t(
                format!("{p}mlp.gate.e_score_correction_bias"),
                s.experts,
                1,
                // Realistic routing's popularity is in the router's logits.
                if s.realistic {
                    Fill::Zeros
                } else {
                    Fill::RouterBias { layer: l }
                },
            ));
            mlp(format!("{p}mlp.shared_experts."), s.moe_inter, out);
        }
    }
}

/// The packing of a quantized fill; `None` for f32.
fn bits(fill: &Fill) -> Option<QBits> {
    match fill {
        Fill::Int4(_) => Some(QBits::Int4),
        Fill::Int8(_) | Fill::Embed | Fill::Real { int8: true, .. } => Some(QBits::Int8),
        _ => None,
    }
}

/// The (name, dtype, shape, bytes) output tensors of one planned tensor.
fn outputs(p: &Planned) -> Vec<(String, &'static str, Vec<usize>, u64)> {
    let (r, c) = (p.rows, p.cols);
    if let Some(bits) = bits(&p.fill) {
        let rb = bits.row_bytes(c);
        return vec![
            (p.name.clone(), "U8", vec![r, rb], (r * rb) as u64),
            (scales_name(&p.name), "F32", vec![r], r as u64 * 4),
        ];
    }
    let shape = if c == 1 { vec![r] } else { vec![r, c] };
    vec![(p.name.clone(), "F32", shape, (r * c) as u64 * 4)]
}

/// Log-popularity of every expert of `layer`: Zipf ranks under a per-layer
/// random permutation, or all equal.
fn log_popularity(s: &Shape, routing: Routing, layer: usize, seed: u64) -> Vec<f32> {
    let Routing::Zipf(z) = routing else {
        return vec![0.0; s.experts];
    };
    let mut rng = Rng::new(seed ^ 0x5eed_0000 ^ layer as u64);
    let mut rank: Vec<usize> = (0..s.experts).collect();
    for i in (1..rank.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        rank.swap(i, j);
    }
    rank.iter()
        .map(|&r| -(z * ((r + 1) as f64).ln()) as f32)
        .collect()
}

/// Streams the bytes of one planned tensor into `w`.
fn fill(
    w: &mut FileWriter,
    p: &Planned,
    s: &Shape,
    spec: &GeometrySpec,
    real: Option<&RoutingPlan>,
    rng: &mut Rng,
) -> Result<()> {
    let (rows, cols) = (p.rows, p.cols);
    let f32_bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    match p.fill {
        Fill::Ones => w.write(&p.name, &f32_bytes(&vec![1.0; rows])),
        Fill::Zeros => w.write(&p.name, &f32_bytes(&vec![0.0; rows])),
        Fill::Int8Router => {
            let v = noise(rng, rows * cols, (cols as f32).sqrt().recip());
            w.write(&p.name, &f32_bytes(&v))
        }
        Fill::RouterBias { layer } => {
            // Sigmoid scores of unit-variance logits spread by ~0.2; the
            // bias is the log-popularity in a tenth of that unit per nat.
            let lp = log_popularity(s, spec.routing, layer, spec.seed);
            let v: Vec<f32> = lp.iter().map(|x| x * ROUTER_BIAS_PER_NAT).collect();
            w.write(&p.name, &f32_bytes(&v))
        }
        Fill::Router { layer } => {
            // A router logit's noise has std ≈ std · x̂ · √h, with x̂ the
            // normalized size of the other dimensions; the bias is in units
            // of it, carried by dimension 0 (normalized size x0).
            let std = 0.02f32;
            let mut v = noise(rng, rows * cols, std);
            let rms = rms_of_embedding(s.hidden);
            let x0 = EMBED_DIM0 / rms;
            let logit_noise = std * (s.hidden as f32).sqrt() * EMBED_STD / rms;
            for (e, lp) in log_popularity(s, spec.routing, layer, spec.seed)
                .iter()
                .enumerate()
            {
                v[e * cols] = lp * logit_noise / x0;
            }
            w.write(&p.name, &f32_bytes(&v))
        }
        Fill::Int4(std) => {
            let rb = QBits::Int4.row_bytes(cols);
            let mut data = vec![0u8; rows * rb];
            for b in data.iter_mut() {
                let lo = 1 + (rng.next_u64() % 15) as u8;
                let hi = 1 + (rng.next_u64() % 15) as u8;
                *b = lo | (hi << 4);
            }
            if cols % 2 == 1 {
                for r in 0..rows {
                    data[r * rb + rb - 1] = (data[r * rb + rb - 1] & 0x0F) | 0x80;
                }
            }
            // q uniform in [-7, 7]: std √(224/12) ≈ 4.32.
            let scale = std / (224f32 / 12.0).sqrt();
            w.write(&p.name, &data)?;
            w.write(&scales_name(&p.name), &f32_bytes(&vec![scale; rows]))
        }
        Fill::Int8(std) => write_int8(w, p, |n| noise(rng, n * cols, std)),
        Fill::Embed => write_int8(w, p, |n| {
            let mut v = noise(rng, n * cols, EMBED_STD);
            for r in 0..n {
                v[r * cols] = EMBED_DIM0;
            }
            v
        }),
        Fill::Real { part, int8 } => {
            let plan = real.expect("realistic tensors are planned with a realistic plan");
            if int8 {
                let mut r0 = 0;
                write_int8(w, p, |n| {
                    r0 += n;
                    plan.rows(part, r0 - n, n, cols)
                })
            } else {
                w.write(&p.name, &f32_bytes(&plan.rows(part, 0, rows, cols)))
            }
        }
    }
}

/// Quantizes `p` to int8 a block of rows at a time (an embedding is
/// large), `block(n)` giving the next `n` rows.
fn write_int8(
    w: &mut FileWriter,
    p: &Planned,
    mut block: impl FnMut(usize) -> Vec<f32>,
) -> Result<()> {
    const BLOCK: usize = 4096;
    let mut scales = Vec::with_capacity(p.rows);
    for r0 in (0..p.rows).step_by(BLOCK) {
        let n = BLOCK.min(p.rows - r0);
        let q = QMatrix::quantize(&block(n), n, p.cols, QBits::Int8);
        w.write_part(&p.name, &q.data)?;
        scales.extend_from_slice(&q.scales);
    }
    let bytes: Vec<u8> = scales.iter().flat_map(|x| x.to_le_bytes()).collect();
    w.write(&scales_name(&p.name), &bytes)
}

/// RMS of an embedding row: dimension 0 constant, the rest noise.
fn rms_of_embedding(h: usize) -> f32 {
    ((EMBED_DIM0 * EMBED_DIM0 + (h - 1) as f32 * EMBED_STD * EMBED_STD) / h as f32).sqrt()
}

/// Writes the model into `dir` (created; must not hold a model). Shows a
/// progress bar when `progress`.
pub fn write(dir: &Path, spec: &GeometrySpec, progress: bool) -> Result<()> {
    write_clamped(
        dir,
        spec,
        progress,
        realistic::Clamp::default(),
        &mut |_| {},
    )
}

/// [`write()`], realistic routing's knobs that `clamp` names moved into the
/// geometry's reach when out of it, each move told to `note` before the
/// model is written.
pub fn write_clamped(
    dir: &Path,
    spec: &GeometrySpec,
    progress: bool,
    clamp: realistic::Clamp,
    note: &mut dyn FnMut(&str),
) -> Result<()> {
    let s = shape(spec)?;
    if dir.join("config.json").exists() {
        return Err(Error::Request(format!(
            "{} already holds a model",
            dir.display()
        )));
    }
    let real = match spec.routing {
        Routing::Realistic(knobs) => {
            let (plan, notes) = RoutingPlan::clamped(&realistic_dims(&s), knobs, clamp, spec.seed)?;
            notes.iter().for_each(|n| note(n));
            Some(plan)
        }
        _ => None,
    };
    std::fs::create_dir_all(dir).map_err(|e| Error::file(dir, e))?;
    let files = s.layers.div_ceil(LAYERS_PER_FILE);
    let plans: Vec<Vec<Planned>> = (0..files).map(|f| tensors_of_file(&s, f, files)).collect();
    let total: u64 = plans.iter().flatten().flat_map(outputs).map(|o| o.3).sum();
    let bar = if progress {
        let b = indicatif::ProgressBar::new(total);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "synth [{bar:40}] {bytes}/{total_bytes} eta {eta}",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut weight_map = serde_json::Map::new();
    let mut rng = Rng::new(spec.seed);
    for (f, plan) in plans.iter().enumerate() {
        let fname = format!("model-{:05}-of-{files:05}.safetensors", f + 1);
        let mut layout = Layout::new(&f.to_string());
        layout
            .metadata
            .insert("moestream.container".into(), "1".into());
        layout.metadata.insert("format".into(), "pt".into());
        for p in plan {
            if p.aligned {
                layout.align();
            }
            for (name, dtype, shape, len) in outputs(p) {
                layout.push(name.clone(), dtype, shape, len);
                weight_map.insert(name, fname.clone().into());
            }
            if let Some(bits) = bits(&p.fill) {
                layout.metadata.insert(
                    format!("{QUANT_META_PREFIX}{}", p.name),
                    json!({"bits": bits.bits(), "cols": p.cols}).to_string(),
                );
            }
        }
        layout.align();
        debug_assert_eq!(layout.data_len() % ALIGN, 0);
        let mut w = FileWriter::create(&dir.join(&fname), layout)?;
        for p in plan {
            while w.write_padding()? {}
            fill(&mut w, p, &s, spec, real.as_ref(), &mut rng)?;
            bar.inc(outputs(p).iter().map(|o| o.3).sum());
        }
        while w.write_padding()? {}
        w.finish()?;
    }
    bar.finish_and_clear();
    let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    crate::fs::write(
        &dir.join("model.safetensors.index.json"),
        &serde_json::to_vec_pretty(&index).expect("JSON serializes"),
    )?;
    write_tokenizer(dir, TOKENIZER_VOCAB)?;
    let mut cfg = config(&s);
    cfg["moestream_routing"] = routing_json(spec.routing, real.as_ref());
    write_json(&dir.join("config.json"), &cfg)?;
    write_json(
        &dir.join("generation_config.json"),
        &json!({"eos_token_id": 0, "bos_token_id": 0}),
    )?;
    write_json(
        &dir.join("tokenizer_config.json"),
        &json!({"eos_token": "<|endoftext|>", "model_max_length": 40960}),
    )
}

/// RoPE base of the Qwen3 geometry, and of the MLA ones (config.json).
const QWEN3_ROPE_THETA: f64 = 1_000_000.0;
const MLA_ROPE_THETA: f64 = 10_000.0;

/// The shapes realistic routing is built into.
fn realistic_dims(s: &Shape) -> realistic::Dims {
    let gqa = realistic::Dims {
        hidden: s.hidden,
        layers: s.layers,
        experts: s.experts,
        top_k: s.top_k,
        heads: s.heads,
        kv_heads: s.kv_heads,
        head_dim: s.head_dim,
        rope_dim: s.head_dim,
        rope_theta: QWEN3_ROPE_THETA,
        mla: None,
    };
    match &s.mla {
        None => gqa,
        Some(m) => realistic::Dims {
            kv_heads: s.heads,
            head_dim: m.v,
            rope_dim: m.rope,
            rope_theta: MLA_ROPE_THETA,
            mla: Some(realistic::MlaDims {
                q_lora: m.q_lora,
                kv_lora: m.kv_lora,
                nope: m.nope,
                rope: m.rope,
                v: m.v,
            }),
            ..gqa
        },
    }
}

/// How the model routes, for config.json (informational: the loader
/// ignores it): the routing, its knobs and realistic routing's calibration.
fn routing_json(routing: Routing, real: Option<&RoutingPlan>) -> serde_json::Value {
    let mut v = json!({"routing": routing.name()});
    if let Routing::Zipf(z) = routing {
        v["zipf_s"] = z.into();
    }
    if let Some(p) = real {
        let (c, k) = (p.calibration, p.knobs);
        let (width, rho) = p.window();
        v["knobs"] = json!({"top10_share": k.top10_share, "reuse": k.reuse, "recall": k.recall});
        v["calibration"] = json!({
            "pop_scale": c.pop_scale,
            "fresh": c.fresh,
            "persist": c.persist,
            "window_tokens": width,
            "window_rho": rho,
            "predicted": {
                "top10_share": c.predicted.top10_share,
                "reuse": c.predicted.reuse,
                "recall": c.predicted.recall,
            },
        });
    }
    v
}

fn config(s: &Shape) -> serde_json::Value {
    if let Some(m) = &s.mla {
        return mla_config(s, m);
    }
    json!({
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": s.vocab,
        "hidden_size": s.hidden,
        "intermediate_size": 6144,
        "moe_intermediate_size": s.moe_inter,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "num_experts": s.experts,
        "num_experts_per_tok": s.top_k,
        "norm_topk_prob": true,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "rms_norm_eps": 1e-6,
        "rope_theta": QWEN3_ROPE_THETA,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": false,
        "attention_bias": false,
        "moestream_synthetic": true,
    })
}

fn mla_config(s: &Shape, m: &Mla) -> serde_json::Value {
    let dense = m.dense_layers.min(s.layers);
    let mut c = json!({
        "model_type": m.model_type,
        "vocab_size": s.vocab,
        "hidden_size": s.hidden,
        "intermediate_size": m.dense_inter,
        "moe_intermediate_size": s.moe_inter,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.heads,
        "n_routed_experts": s.experts,
        "n_shared_experts": 1,
        "num_experts_per_tok": s.top_k,
        "first_k_dense_replace": dense,
        "n_group": m.n_group,
        "topk_group": m.topk_group,
        "norm_topk_prob": true,
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "q_lora_rank": m.q_lora,
        "kv_lora_rank": m.kv_lora,
        "qk_nope_head_dim": m.nope,
        "qk_rope_head_dim": m.rope,
        "v_head_dim": m.v,
        "rms_norm_eps": 1e-6,
        "rope_interleave": true,
        "rope_theta": MLA_ROPE_THETA,
        "max_position_embeddings": 16384,
        "num_nextn_predict_layers": 0,
        "tie_word_embeddings": false,
        "attention_bias": false,
        "moestream_synthetic": true,
    });
    if let Some((ih, id, topk)) = m.indexer {
        c["index_n_heads"] = ih.into();
        c["index_head_dim"] = id.into();
        c["index_topk"] = topk.into();
        c["mlp_layer_types"] = (0..s.layers)
            .map(|l| if l < dense { "dense" } else { "sparse" })
            .collect::<Vec<_>>()
            .into();
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_layers_are_set_for_mla_geometries_only() {
        let spec = |name: &str, layers, dense| GeometrySpec {
            name: name.into(),
            layers: Some(layers),
            experts: Some(16),
            vocab: None,
            hidden: None,
            moe_inter: None,
            top_k: None,
            dense_layers: dense,
            routing: Routing::Uniform,
            seed: 1,
        };
        let dense = |s: Shape| s.mla.map(|m| m.dense_layers);
        assert_eq!(dense(shape(&spec("glm5", 4, None)).unwrap()), Some(3));
        assert_eq!(dense(shape(&spec("glm5", 4, Some(1))).unwrap()), Some(1));
        assert_eq!(
            dense(shape(&spec("deepseek-v3", 4, Some(0))).unwrap()),
            Some(0)
        );
        let e = shape(&spec("glm5", 4, Some(4))).unwrap_err().to_string();
        assert!(e.contains("dense_layers 4 leaves no MoE layer of 4"), "{e}");
        let e = shape(&spec("qwen3-30b-a3b", 4, Some(1)))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("dense_layers") && e.contains("qwen3-30b-a3b"),
            "{e}"
        );
    }

    #[test]
    fn zipf_popularity_is_a_permutation_of_the_ranks() {
        let s = shape(&GeometrySpec {
            name: "qwen3-30b-a3b".into(),
            layers: Some(1),
            experts: Some(16),
            vocab: None,
            hidden: None,
            moe_inter: None,
            top_k: None,
            dense_layers: None,
            routing: Routing::Zipf(1.0),
            seed: 1,
        })
        .unwrap();
        let mut lp = log_popularity(&s, Routing::Zipf(1.0), 0, 1);
        lp.sort_by(|a, b| b.total_cmp(a));
        let want: Vec<f32> = (1..=16).map(|r| -((r as f64).ln()) as f32).collect();
        assert_eq!(lp, want);
        assert_ne!(
            log_popularity(&s, Routing::Zipf(1.0), 0, 1),
            log_popularity(&s, Routing::Zipf(1.0), 1, 1),
            "each layer has its own hot experts"
        );
        assert!(log_popularity(&s, Routing::Uniform, 0, 1)
            .iter()
            .all(|v| *v == 0.0));
    }

    #[test]
    fn every_geometry_writes_a_config_the_engine_parses() {
        for name in GEOMETRIES {
            let spec = GeometrySpec {
                name: name.to_string(),
                layers: Some(5),
                experts: Some(16),
                vocab: None,
                hidden: None,
                moe_inter: None,
                top_k: None,
                dense_layers: None,
                routing: Routing::Zipf(1.0),
                seed: 1,
            };
            let s = shape(&spec).unwrap();
            let dir = tempfile::tempdir().unwrap();
            write_json(&dir.path().join("config.json"), &config(&s)).unwrap();
            let cfg = crate::formats::config::ModelConfig::load(dir.path()).unwrap();
            assert_eq!(
                (cfg.num_layers, cfg.num_experts, cfg.top_k),
                (5, 16, 8),
                "{name}"
            );
            let planned: Vec<Planned> = (0..2).flat_map(|f| tensors_of_file(&s, f, 2)).collect();
            let experts = planned.iter().filter(|p| p.aligned).count();
            let moe_layers = 5 - s.mla.as_ref().map_or(0, |m| m.dense_layers);
            assert_eq!(
                experts,
                moe_layers * 16,
                "{name}: one aligned start per expert"
            );
        }
    }

    #[test]
    fn realistic_routing_plans_its_tensors_for_gqa_and_mla() {
        let spec = |name: &str| GeometrySpec {
            name: name.into(),
            layers: Some(3),
            experts: Some(8),
            vocab: None,
            hidden: Some(256),
            moe_inter: Some(32),
            top_k: Some(2),
            dense_layers: None,
            routing: Routing::Realistic(Knobs::DEFAULT),
            seed: 1,
        };
        let s = shape(&spec("qwen3-30b-a3b")).unwrap();
        assert_eq!((s.hidden, s.moe_inter, s.top_k), (256, 32, 2));
        let real = tensors_of_file(&s, 0, 1)
            .iter()
            .filter(|p| matches!(p.fill, Fill::Real { .. }))
            .count();
        // The embedding and lm_head, and per layer q/k/v/o, q/k norms and
        // the router.
        assert_eq!(real, 2 + 3 * 7);
        // GLM-5 shapes (1 dense layer then 2 MoE): per layer q_a, q_b,
        // kv_a, kv_b, o; per MoE layer the router.
        let s = shape(&GeometrySpec {
            dense_layers: Some(1),
            ..spec("glm5-mini")
        })
        .unwrap();
        let real = tensors_of_file(&s, 0, 1)
            .iter()
            .filter(|p| matches!(p.fill, Fill::Real { .. }))
            .count();
        assert_eq!(real, 2 + 3 * 5 + 2);
        let e = shape(&spec("deepseek-v3")).unwrap_err().to_string();
        assert!(e.contains("zipf or uniform"), "{e}");
    }

    #[test]
    fn unknown_geometries_and_empty_shapes_are_refused() {
        let spec = |name: &str, experts| GeometrySpec {
            name: name.into(),
            layers: None,
            experts,
            vocab: None,
            hidden: None,
            moe_inter: None,
            top_k: None,
            dense_layers: None,
            routing: Routing::Uniform,
            seed: 1,
        };
        assert!(shape(&spec("gpt-9", None))
            .unwrap_err()
            .to_string()
            .contains("qwen3-30b-a3b"));
        assert!(shape(&spec("qwen3-30b-a3b", Some(4))).is_err());
    }
}
