//! The model: resident weights (embeddings, attention, norms, routers,
//! dense MLPs, shared experts, lm_head), the expert store for routed
//! experts, and the reference forward pass.
//!
//! [`Model::forward`] is the one top-down path every test anchors on: it
//! walks the layers for a chunk of `n` tokens at positions `start..start+n`
//! (prefill when n > 1, decode when n = 1), with the MoE routing visible
//! inline.

pub mod attention;
pub mod mlp;
pub mod moe;
pub mod names;
pub mod norm;
pub mod rope;

use crate::config::{Family, ModelConfig, QkNorm, RouterKind};
use crate::error::{Error, Result};
use crate::kernels::f32::matmul;
use crate::kv::KvCache;
use crate::profile::Profile;
use crate::store::{ExpertLocation, ExpertStore};
use crate::weights::WeightIndex;
use attention::{Attention, AttentionShape};
use mlp::Mlp;
use moe::{MoeBlock, SharedExpert};
use norm::rms_norm;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// The feed-forward part of a layer.
pub enum Ffn {
    Dense(Mlp),
    Moe(MoeBlock),
}

/// One decoder layer's resident weights.
pub struct Layer {
    pub input_norm: Vec<f32>,
    pub post_attn_norm: Vec<f32>,
    pub attn: Attention,
    pub ffn: Ffn,
}

/// A loaded model.
pub struct Model {
    pub cfg: ModelConfig,
    /// (vocab, hidden)
    pub embed: Vec<f32>,
    pub layers: Vec<Layer>,
    pub norm: Vec<f32>,
    /// (vocab, hidden); `None` when tied to `embed`.
    pub lm_head: Option<Vec<f32>>,
    pub shape: AttentionShape,
    pub store: ExpertStore,
}

/// Options for loading.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Routed experts cached per layer.
    pub expert_cache: usize,
    pub read_mode: moestream_io::ReadMode,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            expert_cache: 16,
            read_mode: moestream_io::ReadMode::Buffered,
        }
    }
}

impl Model {
    /// Loads config, indexes shards, reads the resident weights and locates
    /// (and shape-checks) every routed expert.
    pub fn load(dir: &Path, opts: &LoadOptions) -> Result<Model> {
        let cfg = ModelConfig::load(dir)?;
        let index = Arc::new(WeightIndex::open(dir, opts.read_mode)?);
        let (h, v) = (cfg.hidden_size, cfg.vocab_size);
        let embed = index.read_f32("model.embed_tokens.weight", &[v, h])?;
        let lm_head = if cfg.tie_word_embeddings && !index.contains("lm_head.weight") {
            None
        } else {
            Some(index.read_f32("lm_head.weight", &[v, h])?)
        };
        let norm = index.read_f32("model.norm.weight", &[h])?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        let mut locations = Vec::with_capacity(cfg.num_layers);
        for l in 0..cfg.num_layers {
            let (layer, locs) = load_layer(&cfg, &index, l)?;
            layers.push(layer);
            locations.push(locs);
        }
        let store = ExpertStore::new(
            index,
            locations,
            opts.expert_cache,
            h,
            cfg.moe_intermediate_size,
        );
        Ok(Model {
            shape: AttentionShape::new(&cfg),
            cfg,
            embed,
            layers,
            norm,
            lm_head,
            store,
        })
    }

    /// A KV cache able to hold `capacity` positions.
    pub fn new_kv(&self, capacity: usize) -> KvCache {
        KvCache::new(
            self.cfg.num_layers,
            self.cfg.num_kv_heads * self.cfg.head_dim,
            capacity,
        )
    }

    /// Checks every id is in the vocabulary.
    pub fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        for (position, &id) in tokens.iter().enumerate() {
            if id as usize >= self.cfg.vocab_size {
                return Err(Error::TokenOutOfVocab {
                    id,
                    position,
                    vocab_size: self.cfg.vocab_size,
                });
            }
        }
        Ok(())
    }

    /// The reference forward pass over `tokens` at positions `kv.len()..`.
    /// Returns logits `(n, vocab)` for every position when `all_logits`,
    /// else `(1, vocab)` for the last one.
    pub fn forward(
        &self,
        tokens: &[u32],
        kv: &mut KvCache,
        all_logits: bool,
        prof: &mut Profile,
    ) -> Result<Vec<f32>> {
        self.check_tokens(tokens)?;
        let n = tokens.len();
        assert!(n > 0, "forward of zero tokens");
        kv.reserve(n)?;
        let (h, start) = (self.cfg.hidden_size, kv.len());
        let mut x = vec![0f32; n * h]; // (n, hidden) residual stream
        for (t, &id) in tokens.iter().enumerate() {
            x[t * h..(t + 1) * h]
                .copy_from_slice(&self.embed[id as usize * h..(id as usize + 1) * h]);
        }
        let mut xn = vec![0f32; n * h]; // (n, hidden) normed input
        let mut y = vec![0f32; n * h]; // (n, hidden) block output
        for (l, layer) in self.layers.iter().enumerate() {
            self.norm_rows(&x, &layer.input_norm, &mut xn);
            let t0 = Instant::now();
            layer
                .attn
                .forward(&self.shape, &xn, n, start, &mut kv.layers[l], &mut y);
            prof.attention += t0.elapsed();
            add(&mut x, &y);
            self.norm_rows(&x, &layer.post_attn_norm, &mut xn);
            match &layer.ffn {
                Ffn::Dense(mlp) => mlp.forward(&xn, n, &mut y),
                Ffn::Moe(block) => block.forward(l, &self.store, &xn, n, prof, &mut y)?,
            }
            add(&mut x, &y);
        }
        kv.advance(n);
        let rows = if all_logits { 0..n } else { n - 1..n };
        let m = rows.len();
        let mut last = vec![0f32; m * h]; // (m, hidden)
        self.norm_rows(&x[rows.start * h..], &self.norm, &mut last);
        let mut logits = vec![0f32; m * self.cfg.vocab_size]; // (m, vocab)
        let head = self.lm_head.as_deref().unwrap_or(&self.embed);
        matmul(head, self.cfg.vocab_size, h, &last, m, &mut logits);
        Ok(logits)
    }

    fn norm_rows(&self, x: &[f32], w: &[f32], out: &mut [f32]) {
        let h = w.len();
        for (xr, or) in x.chunks_exact(h).zip(out.chunks_exact_mut(h)) {
            rms_norm(xr, w, self.cfg.rms_norm_eps, or);
        }
    }
}

fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

fn load_layer(
    cfg: &ModelConfig,
    index: &WeightIndex,
    l: usize,
) -> Result<(Layer, Vec<ExpertLocation>)> {
    let p = names::layer(l);
    let h = cfg.hidden_size;
    let attn = load_attention(cfg, index, &p)?;
    let (ffn, locs) = if cfg.sparse_layers[l] {
        let (block, locs) = load_moe(cfg, index, l)?;
        (Ffn::Moe(block), locs)
    } else {
        let mlp = load_mlp(
            index,
            &format!("{p}mlp."),
            ["gate_proj", "up_proj", "down_proj"],
            h,
            cfg.intermediate_size,
        )?;
        (Ffn::Dense(mlp), Vec::new())
    };
    let layer = Layer {
        input_norm: index.read_f32(&format!("{p}input_layernorm.weight"), &[h])?,
        post_attn_norm: index.read_f32(&format!("{p}post_attention_layernorm.weight"), &[h])?,
        attn,
        ffn,
    };
    Ok((layer, locs))
}

fn load_attention(cfg: &ModelConfig, index: &WeightIndex, p: &str) -> Result<Attention> {
    let h = cfg.hidden_size;
    let (qd, kd) = (
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
    );
    let a = format!("{p}self_attn.");
    let bias = |name: &str, len: usize, on: bool| -> Result<Option<Vec<f32>>> {
        if on {
            index.read_f32(&format!("{a}{name}.bias"), &[len]).map(Some)
        } else {
            Ok(None)
        }
    };
    let (qn, kn) = match cfg.qk_norm {
        QkNorm::None => (None, None),
        QkNorm::PerHead => (Some(cfg.head_dim), Some(cfg.head_dim)),
        QkNorm::Whole => (Some(qd), Some(kd)),
    };
    let norm = |name: &str, len: Option<usize>| -> Result<Option<Vec<f32>>> {
        len.map(|n| index.read_f32(&format!("{a}{name}.weight"), &[n]))
            .transpose()
    };
    Ok(Attention {
        wq: index.read_f32(&format!("{a}q_proj.weight"), &[qd, h])?,
        wk: index.read_f32(&format!("{a}k_proj.weight"), &[kd, h])?,
        wv: index.read_f32(&format!("{a}v_proj.weight"), &[kd, h])?,
        wo: index.read_f32(&format!("{a}o_proj.weight"), &[h, qd])?,
        bq: bias("q_proj", qd, cfg.qkv_bias)?,
        bk: bias("k_proj", kd, cfg.qkv_bias)?,
        bv: bias("v_proj", kd, cfg.qkv_bias)?,
        bo: bias("o_proj", h, cfg.o_bias)?,
        q_norm: norm("q_norm", qn)?,
        k_norm: norm("k_norm", kn)?,
    })
}

fn load_mlp(
    index: &WeightIndex,
    prefix: &str,
    parts: [&str; 3],
    h: usize,
    i: usize,
) -> Result<Mlp> {
    Ok(Mlp {
        gate: index.read_f32(&format!("{prefix}{}.weight", parts[0]), &[i, h])?,
        up: index.read_f32(&format!("{prefix}{}.weight", parts[1]), &[i, h])?,
        down: index.read_f32(&format!("{prefix}{}.weight", parts[2]), &[h, i])?,
        hidden: h,
        inter: i,
    })
}

fn load_moe(
    cfg: &ModelConfig,
    index: &WeightIndex,
    l: usize,
) -> Result<(MoeBlock, Vec<ExpertLocation>)> {
    let (h, e, i) = (cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size);
    let router = index.read_f32(names::pick(index, &names::router(cfg.family, l)), &[e, h])?;
    let p = names::layer(l);
    let shared = match cfg.shared_expert_intermediate_size {
        Some(si) => Some(SharedExpert {
            mlp: load_mlp(
                index,
                &format!("{p}mlp.shared_expert."),
                ["gate_proj", "up_proj", "down_proj"],
                h,
                si,
            )?,
            gate: names::optional(index, &format!("{p}mlp.shared_expert_gate.weight"), &[1, h])?,
        }),
        None => None,
    };
    let mut locs = Vec::with_capacity(e);
    for x in 0..e {
        let cands = names::expert(cfg.family, l, x);
        let [g, u, d] = names::pick3(index, &cands).clone();
        locs.push(ExpertLocation {
            parts: [
                (g.clone(), index.expect_shape(&g, &[i, h])?.clone()),
                (u.clone(), index.expect_shape(&u, &[i, h])?.clone()),
                (d.clone(), index.expect_shape(&d, &[h, i])?.clone()),
            ],
        });
    }
    let RouterKind::SoftmaxTopK { norm_topk_prob } = cfg.router;
    debug_assert!(cfg.family != Family::Mixtral || norm_topk_prob);
    let block = MoeBlock {
        router,
        num_experts: e,
        top_k: cfg.top_k,
        norm_topk_prob,
        shared,
    };
    Ok((block, locs))
}
