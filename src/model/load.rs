//! Loading a checkpoint into a [`Model`]: the resident weights are read and
//! kept in their stored width (vectors as f32); routed experts are only
//! located and shape-checked (the [`ExpertStore`] reads them on demand).

use super::attention::{Attention, AttentionShape};
use super::dsa::{Indexer, IndexerShape};
use super::footprint::{check_budget, Footprint};
use super::locate::{locate_experts, mtp_spec, LayerSpec};
use super::mla::{MlaAttention, MlaShape, QLora};
use super::mlp::Mlp;
use super::moe::{MoeBlock, SharedExpert};
use super::mtp::Mtp;
use super::options::LoadOptions;
use super::rope::Rope;
use super::router::Router;
use super::{names, AttnBlock, Ffn, Layer, Model, Shapes};
use crate::error::{Error, Result};
use crate::formats::config::{ModelConfig, QkNorm, RouterKind, SharedExperts};
use crate::formats::weights::index::AtLoad;
use crate::formats::weights::WeightIndex;
use crate::model::progress::Work;
use crate::store::{ExpertLocation, ExpertStore};
use std::path::Path;
use std::sync::Arc;

impl Model {
    /// Loads config, indexes shards, reads the resident weights and locates
    /// (and shape-checks) every routed expert, including the MTP layer's.
    pub fn load(dir: &Path, opts: &LoadOptions) -> Result<Model> {
        if let Some(lambda) = opts.schedule.cache_lean {
            if !(lambda.is_finite() && lambda >= 0.0) {
                return Err(Error::Setting {
                    name: "cache_lean",
                    reason: format!("λ must be a finite number ≥ 0, not {lambda}"),
                });
            }
        }
        let cfg = ModelConfig::load(dir)?;
        let mut index = WeightIndex::open(dir, opts.read_mode)?;
        index.set_at_load(opts.quantize_at_load.clone().map(|policy| AtLoad {
            policy,
            layers: cfg.num_layers,
        }));
        // Headers only: a budget that cannot fit is refused before any
        // weight is read, by the check `moestream plan` makes.
        let footprint = if opts.ram_budget.is_some() || opts.progress.is_on() {
            Some(Footprint::measure(&cfg, &index)?)
        } else {
            None
        };
        let plan = match (opts.ram_budget, &footprint) {
            (Some(budget), Some(fp)) => Some(check_budget(fp, budget, opts)?),
            _ => None,
        };
        let resident_total = footprint.as_ref().map_or(0, Footprint::resident_bytes);
        let loaded = |index: &WeightIndex| {
            opts.progress
                .report(Work::Load, index.resident_bytes(), resident_total)
        };
        let index = Arc::new(index);
        let (h, v) = (cfg.hidden_size, cfg.vocab_size);
        let embed = index.read_mat("model.embed_tokens.weight", v, h)?;
        let lm_head = if cfg.tie_word_embeddings && !index.contains("lm_head.weight") {
            None
        } else {
            Some(index.read_mat("lm_head.weight", v, h)?)
        };
        let norm = index.read_f32("model.norm.weight", &[h])?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        let mut locations = Vec::with_capacity(cfg.num_layers + 1);
        for l in 0..cfg.num_layers {
            let spec = LayerSpec {
                index: l,
                sparse: cfg.sparse_layers[l],
                indexer: cfg.indexer.as_ref().is_some_and(|ix| ix.full_layers[l]),
            };
            let (layer, locs) = load_layer(&cfg, &index, &spec)?;
            layers.push(layer);
            locations.push(locs);
            loaded(&index);
        }
        let mtp = match load_mtp(&cfg, &index)? {
            Some((head, locs)) => {
                locations.push(locs);
                Some(head)
            }
            None => None,
        };
        opts.progress
            .report(Work::Load, resident_total, resident_total);
        // From here on the shards are read at random (experts).
        for shard in &index.shards {
            shard.reader.expect_random();
        }
        let store = ExpertStore::new(
            index,
            locations,
            opts.expert_cache,
            (h, cfg.moe_intermediate_size),
            opts.io_reactor,
            (opts.policy, cfg.top_k),
        )?;
        let mut store = store;
        store.schedule = opts.schedule.schedule(cfg.top_k, opts.predictor.is_some());
        store.set_predictor(opts.predictor.clone())?;
        let shapes = shapes(&cfg, opts);
        let prefill_pass = super::footprint::unbudgeted_pass(&cfg, opts.context);
        let mut model = Model {
            shapes,
            cfg,
            embed,
            layers,
            norm,
            lm_head,
            store,
            mtp,
            plan: None,
            context_budget: None,
            history: None,
            progress: opts.progress.clone(),
            interrupt: Default::default(),
            prefill_pass,
        };
        if let Some(plan) = plan {
            model.prefill_pass = plan.prefill_pass;
            model.store.set_slots(plan.slots_per_layer);
            model.plan = Some(plan);
            model.context_budget = Some(opts.context.min(model.cfg.rope.max_position_embeddings));
        }
        model.store.warm_buffers();
        let history = crate::store::usage::history_path(dir);
        if let Some(history) = history.ok().filter(|h| opts.pin_history && h.exists()) {
            model.history = Some(match model.store.pin_from_history(&history) {
                Ok((tokens, pinned)) => format!(
                    "usage history: {tokens} tokens, {pinned} experts pinned ({})",
                    history.display()
                ),
                Err(e) => format!("usage history ignored: {e}"),
            });
        }
        Ok(model)
    }
}

fn shapes(cfg: &ModelConfig, opts: &LoadOptions) -> Shapes {
    let gqa = AttentionShape::new(cfg);
    let mla = cfg.mla.as_ref().map(|m| {
        let rope = Rope::new(&cfg.rope);
        MlaShape {
            hidden: cfg.hidden_size,
            heads: cfg.num_heads,
            cfg: m.clone(),
            indexer: cfg.indexer.as_ref().map(|ix| IndexerShape {
                hidden: cfg.hidden_size,
                q_lora: m.q_lora_rank.unwrap_or(0),
                heads: ix.n_heads,
                head_dim: ix.head_dim,
                topk: ix.topk,
                rope: rope.with_interleaved(true),
            }),
            rope,
            mode: opts.mla,
            dsa: opts.dsa,
        }
    });
    Shapes { gqa, mla }
}

fn load_layer(
    cfg: &ModelConfig,
    index: &WeightIndex,
    spec: &LayerSpec,
) -> Result<(Layer, Vec<ExpertLocation>)> {
    let p = names::layer(spec.index);
    let h = cfg.hidden_size;
    let attn = if cfg.mla.is_some() {
        AttnBlock::Mla(Box::new(load_mla(cfg, index, &p, spec.indexer)?))
    } else {
        let mut a = load_attention(cfg, index, &p)?;
        a.window = cfg.sliding_window.get(spec.index).copied().flatten();
        AttnBlock::Gqa(Box::new(a))
    };
    let (ffn, locs) = if spec.sparse {
        let (block, locs) = load_moe(cfg, index, spec.index)?;
        (Ffn::Moe(block), locs)
    } else {
        let parts = ["gate_proj", "up_proj", "down_proj"];
        let mlp = load_mlp(index, &format!("{p}mlp."), parts, h, cfg.intermediate_size)?;
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

fn bias(index: &WeightIndex, name: &str, len: usize, on: bool) -> Result<Option<Vec<f32>>> {
    if on {
        index.read_f32(name, &[len]).map(Some)
    } else {
        Ok(None)
    }
}

fn load_attention(cfg: &ModelConfig, index: &WeightIndex, p: &str) -> Result<Attention> {
    let h = cfg.hidden_size;
    let (qd, kd) = (
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
    );
    let a = format!("{p}self_attn.");
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
        wq: index.read_mat(&format!("{a}q_proj.weight"), qd, h)?,
        wk: index.read_mat(&format!("{a}k_proj.weight"), kd, h)?,
        wv: index.read_mat(&format!("{a}v_proj.weight"), kd, h)?,
        wo: index.read_mat(&format!("{a}o_proj.weight"), h, qd)?,
        bq: bias(index, &format!("{a}q_proj.bias"), qd, cfg.qkv_bias)?,
        bk: bias(index, &format!("{a}k_proj.bias"), kd, cfg.qkv_bias)?,
        bv: bias(index, &format!("{a}v_proj.bias"), kd, cfg.qkv_bias)?,
        bo: bias(index, &format!("{a}o_proj.bias"), h, cfg.o_bias)?,
        q_norm: norm("q_norm", qn)?,
        k_norm: norm("k_norm", kn)?,
        window: None,
    })
}

fn load_mla(
    cfg: &ModelConfig,
    index: &WeightIndex,
    p: &str,
    with_indexer: bool,
) -> Result<MlaAttention> {
    let m = cfg.mla.as_ref().expect("load_mla on an MLA config");
    let (h, heads) = (cfg.hidden_size, cfg.num_heads);
    let (l, r, qk, vd) = (
        m.kv_lora_rank,
        m.qk_rope_head_dim,
        m.qk_head_dim(),
        m.v_head_dim,
    );
    let a = format!("{p}self_attn.");
    let b = m.attention_bias;
    let (q_lora, wq) = match m.q_lora_rank {
        Some(rank) => (
            Some(QLora {
                wa: index.read_mat(&format!("{a}q_a_proj.weight"), rank, h)?,
                ba: bias(index, &format!("{a}q_a_proj.bias"), rank, b)?,
                norm: index.read_f32(&format!("{a}q_a_layernorm.weight"), &[rank])?,
                wb: index.read_mat(&format!("{a}q_b_proj.weight"), heads * qk, rank)?,
            }),
            None,
        ),
        None => (
            None,
            Some(index.read_mat(&format!("{a}q_proj.weight"), heads * qk, h)?),
        ),
    };
    let indexer = if with_indexer {
        let ix = cfg
            .indexer
            .as_ref()
            .expect("indexer layers come with an indexer config");
        let rank = m.q_lora_rank.ok_or_else(|| {
            Error::config(
                &cfg.path,
                "q_lora_rank",
                "the DSA indexer needs q_lora_rank (its queries read the q latent)",
            )
        })?;
        let d = ix.head_dim;
        let x = format!("{a}indexer.");
        Some(Indexer {
            wq_b: index.read_mat(&format!("{x}wq_b.weight"), ix.n_heads * d, rank)?,
            wk: index.read_mat(&format!("{x}wk.weight"), d, h)?,
            k_norm_w: index.read_f32(&format!("{x}k_norm.weight"), &[d])?,
            k_norm_b: index.read_f32(&format!("{x}k_norm.bias"), &[d])?,
            weights_proj: index.read_mat(&format!("{x}weights_proj.weight"), ix.n_heads, h)?,
        })
    } else {
        None
    };
    Ok(MlaAttention {
        q_lora,
        wq,
        wkv_a: index.read_mat(&format!("{a}kv_a_proj_with_mqa.weight"), l + r, h)?,
        bkv_a: bias(index, &format!("{a}kv_a_proj_with_mqa.bias"), l + r, b)?,
        kv_a_norm: index.read_f32(&format!("{a}kv_a_layernorm.weight"), &[l])?,
        wkv_b: index.read_f32(
            &format!("{a}kv_b_proj.weight"),
            &[heads * (m.qk_nope_head_dim + vd), l],
        )?,
        wo: index.read_mat(&format!("{a}o_proj.weight"), h, heads * vd)?,
        bo: bias(index, &format!("{a}o_proj.bias"), h, b)?,
        indexer,
    })
}

pub(super) fn load_mlp(
    index: &WeightIndex,
    prefix: &str,
    parts: [&str; 3],
    h: usize,
    i: usize,
) -> Result<Mlp> {
    Ok(Mlp {
        gate: index.read_mat(&format!("{prefix}{}.weight", parts[0]), i, h)?,
        up: index.read_mat(&format!("{prefix}{}.weight", parts[1]), i, h)?,
        down: index.read_mat(&format!("{prefix}{}.weight", parts[2]), h, i)?,
        hidden: h,
        inter: i,
    })
}

fn load_moe(
    cfg: &ModelConfig,
    index: &WeightIndex,
    l: usize,
) -> Result<(MoeBlock, Vec<ExpertLocation>)> {
    let (h, e) = (cfg.hidden_size, cfg.num_experts);
    let p = names::layer(l);
    let router_name = names::pick(index, &names::router(cfg.family, l)).to_string();
    let correction_bias = match cfg.router {
        RouterKind::SigmoidGrouped { .. } => {
            Some(index.read_f32(&format!("{p}mlp.gate.e_score_correction_bias"), &[e])?)
        }
        RouterKind::SoftmaxTopK { .. } => None,
    };
    let parts = ["gate_proj", "up_proj", "down_proj"];
    let shared = match cfg.shared_experts {
        SharedExperts::None => None,
        SharedExperts::Gated(si) => Some(SharedExpert {
            mlp: load_mlp(index, &format!("{p}mlp.shared_expert."), parts, h, si)?,
            gate: names::optional(index, &format!("{p}mlp.shared_expert_gate.weight"), &[1, h])?,
        }),
        SharedExperts::Plain(si) => Some(SharedExpert {
            mlp: load_mlp(index, &format!("{p}mlp.shared_experts."), parts, h, si)?,
            gate: None,
        }),
    };
    let locs = locate_experts(cfg, index, l)?;
    let router = Router {
        weight: index.read_f32(&router_name, &[e, h])?,
        correction_bias,
        kind: cfg.router,
        num_experts: e,
        top_k: cfg.top_k,
    };
    Ok((MoeBlock { router, shared }, locs))
}

/// The MTP head at layer index `num_layers`, if the config announces one
/// and the checkpoint holds its weights (hub conversions sometimes drop it).
fn load_mtp(cfg: &ModelConfig, index: &WeightIndex) -> Result<Option<(Mtp, Vec<ExpertLocation>)>> {
    let Some(spec) = mtp_spec(cfg, index) else {
        return Ok(None);
    };
    let p = names::layer(spec.index);
    let h = cfg.hidden_size;
    let (block, locs) = load_layer(cfg, index, &spec)?;
    let head_name = format!("{p}shared_head.head.weight");
    let head = if index.contains(&head_name) {
        Some(index.read_mat(&head_name, cfg.vocab_size, h)?)
    } else {
        None
    };
    let mtp = Mtp {
        enorm: index.read_f32(&format!("{p}enorm.weight"), &[h])?,
        hnorm: index.read_f32(&format!("{p}hnorm.weight"), &[h])?,
        eh_proj: index.read_mat(&format!("{p}eh_proj.weight"), h, 2 * h)?,
        block,
        norm: index.read_f32(&format!("{p}shared_head.norm.weight"), &[h])?,
        head,
        store_layer: spec.index,
    };
    Ok(Some((mtp, locs)))
}

#[cfg(test)]
mod tests {
    use super::LoadOptions;
    use crate::store::{Lookahead, Variant};

    /// The prefetch budget by setting: (depth + 1) × top-k by default, the
    /// explicit count when given, top-k for a learned predictor alone, and 0
    /// without lookahead.
    #[test]
    fn prefetch_budget_by_setting() {
        let with = |depth: usize, explicit: Option<usize>| {
            let mut o = LoadOptions::default();
            o.schedule.lookahead = Some(Lookahead {
                from: Variant::Attn,
                depth,
            });
            o.schedule.prefetch_experts = explicit;
            o
        };
        for (opts, top_k, want) in [
            (LoadOptions::default(), 8, 0),
            (with(1, None), 8, 16),
            (with(2, None), 8, 24),
            (with(0, None), 2, 4),
            (with(1, Some(5)), 8, 5),
            (with(usize::MAX, None), 8, usize::MAX),
        ] {
            assert_eq!(opts.prefetch_experts_max(top_k), want);
        }
    }
}
