//! What a model takes in RAM and on disk, from config.json and the shard
//! headers alone: no weight is read, so it works on a partial download
//! (shards holding only their headers) as well as on a whole model.
//!
//! [`Footprint::measure`] locates every routed expert exactly as loading
//! does (the same names, the same shape checks, so the same errors) and
//! sums the resident tensors as loading keeps them: matrices at their kept
//! width ([`WeightIndex::kept_bytes`]), vectors, routers and MLA's `kv_b`
//! widened to f32. [`check_budget`] is the one RAM-budget check: `run`
//! (through [`Model::load`](super::Model::load), before any weight is read)
//! and `moestream plan` both call it, so they accept and refuse the same
//! budgets with the same message.

use super::locate::{locate_experts, mtp_spec};
use super::options::LoadOptions;
use super::{names, PREFILL_CHUNK};
use crate::error::{Error, Result};
use crate::formats::config::{ModelConfig, RouterKind, SharedExperts};
use crate::formats::quant::policy::{layer_index, Class};
use crate::formats::weights::WeightIndex;
use crate::model::kv::KvLayout;
use crate::store::budget::{self, BudgetInput, BudgetPlan, PrefillPass};
use crate::store::ExpertLocation;
use std::collections::{BTreeMap, HashSet};

/// A model's byte counts, from headers.
#[derive(Clone, Debug, PartialEq)]
pub struct Footprint {
    /// Resident bytes as kept in RAM, by class name (`embed`, `attention`,
    /// `router`, `norm`, …; [`Class::name`]).
    pub resident: BTreeMap<&'static str, u64>,
    /// One routed expert in RAM (zero copy: its whole read buffer).
    pub expert_ram: u64,
    /// One routed expert's read spans on disk.
    pub expert_disk: u64,
    /// Every routed expert's read spans on disk, all layers together.
    pub experts_disk_total: u64,
    /// Experts are packed, so decoded in place in their read slab.
    pub expert_zero_copy: bool,
    /// Layers with routed experts (the MTP layer's included).
    pub moe_layers: usize,
    pub experts_per_layer: usize,
    pub top_k: usize,
    /// KV cache bytes per context position, all layers.
    pub kv_bytes_per_position: u64,
    /// Activation and logit bytes per position of a forward.
    pub activation_bytes_per_position: u64,
    /// Attention's workspace per cached position a query attends (see
    /// [`attention_bytes_per_position`]): part of the activations item.
    pub attention_bytes_per_position: u64,
    /// Bytes a layer-major prefill pass holds per position across a layer
    /// (no logits; see [`pass_bytes_per_position`]).
    pub pass_bytes_per_position: u64,
    /// A pass's temporaries per row of a sub-chunk (see
    /// [`pass_row_bytes`]).
    pub pass_row_bytes: u64,
    /// The model's longest context.
    pub context_max: usize,
}

impl Footprint {
    /// Measures the model of `cfg` from `index`'s headers (with the
    /// runtime quantizer set on `index`, if any, as loading sets it).
    pub fn measure(cfg: &ModelConfig, index: &WeightIndex) -> Result<Footprint> {
        let mut locations: Vec<ExpertLocation> = Vec::new();
        let mut moe_layers = 0;
        for l in (0..cfg.num_layers).filter(|&l| cfg.sparse_layers[l]) {
            locations.extend(locate_experts(cfg, index, l)?);
            moe_layers += 1;
        }
        let mtp = mtp_spec(cfg, index);
        if mtp.as_ref().is_some_and(|s| s.sparse) {
            locations.extend(locate_experts(cfg, index, cfg.num_layers)?);
            moe_layers += 1;
        }
        let first = locations.first();
        let kv: usize = (0..cfg.num_layers)
            .map(|l| {
                let k = kv_layout(cfg, l);
                k.attention_bytes_per_token() + k.index_bytes_per_token()
            })
            .sum();
        Ok(Footprint {
            resident: resident(cfg, index, &locations, mtp.is_some()),
            expert_ram: first.map_or(0, |loc| loc.ram_bytes(index)),
            expert_disk: first.map_or(0, ExpertLocation::disk_bytes),
            experts_disk_total: locations.iter().map(ExpertLocation::disk_bytes).sum(),
            expert_zero_copy: first.is_some_and(ExpertLocation::packed),
            moe_layers,
            experts_per_layer: cfg.num_experts,
            top_k: cfg.top_k,
            kv_bytes_per_position: kv as u64,
            activation_bytes_per_position: activation_bytes_per_position(cfg),
            attention_bytes_per_position: attention_bytes_per_position(cfg),
            pass_bytes_per_position: pass_bytes_per_position(cfg),
            pass_row_bytes: pass_row_bytes(cfg),
            context_max: cfg.rope.max_position_embeddings,
        })
    }

    /// All resident bytes.
    pub fn resident_bytes(&self) -> u64 {
        self.resident.values().sum()
    }

    /// The RAM plan's input for `budget` bytes under `opts` (its context,
    /// read mode and prefetch).
    pub fn budget_input(&self, budget: u64, opts: &LoadOptions) -> BudgetInput {
        let context = opts.context.min(self.context_max).max(1);
        BudgetInput {
            budget,
            resident: self.resident_bytes(),
            expert_ram: self.expert_ram,
            expert_disk: self.expert_disk,
            expert_zero_copy: self.expert_zero_copy,
            moe_layers: self.moe_layers,
            experts_per_layer: self.experts_per_layer,
            top_k: self.top_k,
            kv: self.kv_bytes_per_position.saturating_mul(context as u64),
            activations: activations_bytes(self.activation_bytes_per_position, context)
                .saturating_add(
                    self.attention_bytes_per_position
                        .saturating_mul(context as u64),
                ),
            pass_bytes_per_position: self.pass_bytes_per_position,
            pass_row_bytes: self.pass_row_bytes,
            pass_granule: PREFILL_CHUNK,
            context,
            page_cache: opts.read_mode != moestream_io::ReadMode::Direct,
            prefetch_experts: opts.prefetch_experts_max(self.top_k),
            inputs: opts.input_bytes,
        }
    }
}

/// The RAM budget check shared by loading and `moestream plan`: the plan
/// for `budget` bytes, or [`Error::Budget`] saying (with the numbers) why
/// it cannot fit.
pub fn check_budget(fp: &Footprint, budget: u64, opts: &LoadOptions) -> Result<BudgetPlan> {
    budget::plan(&fp.budget_input(budget, opts)).map_err(Error::Budget)
}

/// The activations item of the RAM plan for `context` positions: the
/// largest chunked forward, logits of every row included.
fn activations_bytes(per_position: u64, context: usize) -> u64 {
    per_position.saturating_mul(context.min(PREFILL_CHUNK) as u64)
}

/// Attention's workspace per cached position, which grows with the
/// context rather than with the rows of a forward: GQA's key panels and
/// contiguous values of every KV head (built once per layer forward) and
/// each kernel-pool thread's scores of a batch of query rows (f32 each); MLA's one head of reconstructed keys and values (explicit
/// path), one panel of keys (the explicit path's `[k_nope | k_rope]` of a
/// head or the absorbed path's `[latent | k_rope]`, the wider), each pool
/// thread's scores of a batch of query pairs and, with a DSA indexer, its
/// gathered panel and values of a selected query; a DSA indexer's scores
/// and ranking of every position.
pub(crate) fn attention_bytes_per_position(cfg: &ModelConfig) -> u64 {
    let (f, u) = (4, std::mem::size_of::<usize>());
    let threads = crate::kernels::pool::threads();
    let batch = crate::kernels::attn::ROWS_MAX;
    let attention = match &cfg.mla {
        Some(m) => {
            let (nope, rope) = (m.qk_nope_head_dim, m.qk_rope_head_dim);
            let panel = (nope + rope).max(m.kv_lora_rank + rope);
            let gathered = cfg
                .indexer
                .as_ref()
                .map_or(0, |_| panel + m.kv_lora_rank.max(m.v_head_dim));
            f * (nope + m.v_head_dim + panel) + threads * f * (batch + gathered)
        }
        None => cfg.num_kv_heads * 2 * cfg.head_dim * f + threads * batch * f,
    };
    let indexer = cfg.indexer.as_ref().map_or(0, |_| f + u);
    (attention + indexer) as u64
}

/// Activation and logit bytes per position of a forward (f32): logits,
/// hidden-sized rows and a dense MLP's rows.
fn activation_bytes_per_position(cfg: &ModelConfig) -> u64 {
    let per_position = cfg.vocab_size + 16 * cfg.hidden_size + 3 * widest(cfg);
    4 * per_position as u64
}

/// The widest MLP row: a dense MLP's, or a token's routed experts' together.
fn widest(cfg: &ModelConfig) -> usize {
    cfg.intermediate_size
        .max(cfg.moe_intermediate_size * cfg.top_k)
}

/// The prefill pass of a model loaded without a RAM budget: the whole
/// `context` in one pass (nothing bounds its activations, as nothing
/// bounds its KV cache).
pub fn unbudgeted_pass(cfg: &ModelConfig, context: usize) -> PrefillPass {
    let context = context.min(cfg.rope.max_position_embeddings).max(1);
    budget::prefill_pass(
        u64::MAX,
        (pass_bytes_per_position(cfg), pass_row_bytes(cfg)),
        PREFILL_CHUNK,
        context,
    )
}

/// Bytes one position of a layer-major prefill pass holds for a whole
/// layer: the residual stream and the block output being summed (`hidden`
/// each; the normed input is recomputed per sub-chunk and per routed row,
/// and the final norm is taken in place), the routing entries (each
/// selected expert's pair, id and weight, the row's end and margin) and a
/// DSA query's selected positions. Per-row temporaries are
/// [`pass_row_bytes`], held for one sub-chunk at a time.
fn pass_bytes_per_position(cfg: &ModelConfig) -> u64 {
    let floats = 2 * cfg.hidden_size;
    let pair = std::mem::size_of::<(usize, usize, f32)>();
    let entry = pair + std::mem::size_of::<usize>() + std::mem::size_of::<f32>();
    let row = std::mem::size_of::<usize>() + std::mem::size_of::<f32>();
    let routing = cfg.top_k * entry + row;
    let selection = cfg
        .indexer
        .as_ref()
        .map_or(0, |ix| ix.topk * std::mem::size_of::<usize>());
    (4 * floats + routing + selection) as u64
}

/// A layer-major pass's temporaries per row of a sub-chunk, the largest of
/// its phases (each frees its buffers before the next starts): attention
/// (the normed rows, the block output, the per-row projections, a DSA
/// indexer's query and head weights), a routed expert's rows (gathered
/// input, gate, up, output) and a dense MLP's or the shared expert's rows
/// (normed input, gate, up, output).
fn pass_row_bytes(cfg: &ModelConfig) -> u64 {
    let h = cfg.hidden_size;
    let projections = match &cfg.mla {
        // q, context, the q latent (and its normed copy), [latent | rope].
        Some(m) => {
            cfg.num_heads * (m.qk_head_dim() + m.v_head_dim)
                + 2 * m.q_lora_rank.unwrap_or(0)
                + m.kv_lora_rank
                + m.qk_rope_head_dim
        }
        // q, k, v, context.
        None => 2 * (cfg.num_heads + cfg.num_kv_heads) * cfg.head_dim,
    };
    let indexer = cfg
        .indexer
        .as_ref()
        .map_or(0, |ix| ix.n_heads * ix.head_dim + ix.n_heads + ix.head_dim);
    let attention = 2 * h + projections + indexer;
    let dense = if cfg.sparse_layers.iter().all(|&s| s) {
        0
    } else {
        cfg.intermediate_size
    };
    let shared = match cfg.shared_experts {
        SharedExperts::None => 0,
        SharedExperts::Gated(size) | SharedExperts::Plain(size) => size,
    };
    let mlp = 2 * h + 2 * dense.max(shared).max(cfg.moe_intermediate_size);
    4 * attention.max(mlp) as u64
}

/// The KV layout of decoder layer `l` (as [`super::Model::kv_layout`] gives
/// it for the loaded layer).
fn kv_layout(cfg: &ModelConfig, l: usize) -> KvLayout {
    match &cfg.mla {
        Some(m) => KvLayout::Mla {
            kv_lora: m.kv_lora_rank,
            rope: m.qk_rope_head_dim,
            index_dim: match &cfg.indexer {
                Some(ix) if ix.full_layers[l] => ix.head_dim,
                _ => 0,
            },
        },
        None => KvLayout::Gqa {
            kv_dim: cfg.num_kv_heads * cfg.head_dim,
        },
    }
}

/// Resident bytes by class: every tensor loading reads, as it keeps it.
fn resident(
    cfg: &ModelConfig,
    index: &WeightIndex,
    experts: &[ExpertLocation],
    mtp: bool,
) -> BTreeMap<&'static str, u64> {
    let routed: HashSet<&str> = experts
        .iter()
        .flat_map(|loc| loc.parts.iter().map(|r| r.name.as_str()))
        .collect();
    let mut out = BTreeMap::new();
    for (name, e) in index.iter() {
        if routed.contains(name.as_str()) || !loaded(cfg, index, name, mtp) {
            continue;
        }
        // A tensor loading never reads is not resident; one it reads and
        // cannot resolve fails the load anyway.
        let Ok(r) = index.resolve(name) else {
            continue;
        };
        let bytes = if widened(name, e.shape.len()) {
            r.shape.iter().product::<usize>() as u64 * 4
        } else {
            index.kept_bytes(&r)
        };
        let class = Class::of(name, &r.shape, cfg.num_layers);
        *out.entry(class.name()).or_insert(0) += bytes;
    }
    out
}

/// Whether loading reads tensor `name`: not a companion (scales) of
/// another, not padding, not a layer past the model's (the MTP layer only
/// when it loads, and never its copy of the embeddings), and not a
/// correction bias a softmax router has no use for.
fn loaded(cfg: &ModelConfig, index: &WeightIndex, name: &str, mtp: bool) -> bool {
    let companion = [".scales", "_scale_inv"]
        .iter()
        .any(|suffix| name.strip_suffix(suffix).is_some_and(|b| index.contains(b)));
    if companion || name.starts_with("__pad__.") {
        return false;
    }
    if name.ends_with("e_score_correction_bias")
        && matches!(cfg.router, RouterKind::SoftmaxTopK { .. })
    {
        return false;
    }
    match layer_index(name) {
        Some(l) if l > cfg.num_layers => false,
        Some(l) if l == cfg.num_layers => {
            mtp && !name.starts_with(&format!("{}embed_tokens.", names::layer(l)))
        }
        _ => true,
    }
}

/// Whether loading widens `name` to f32 whatever its stored width: every
/// vector, the routers (and Qwen2-MoE's shared-expert gate), and MLA's
/// `kv_b_proj`, whose halves are folded into queries and outputs.
fn widened(name: &str, ndim: usize) -> bool {
    ndim != 2
        || name.ends_with("mlp.gate.weight")
        || name.ends_with("block_sparse_moe.gate.weight")
        || name.ends_with("shared_expert_gate.weight")
        || name.ends_with("self_attn.kv_b_proj.weight")
}
