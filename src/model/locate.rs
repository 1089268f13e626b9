//! Where a checkpoint's routed experts and MTP layer live, found from the
//! shard headers alone (nothing is read): what loading and the footprint
//! both need.

use super::names;
use crate::error::Result;
use crate::formats::config::ModelConfig;
use crate::formats::weights::WeightIndex;
use crate::store::ExpertLocation;

/// What a layer has, beyond what the config says of every layer.
pub(super) struct LayerSpec {
    pub(super) index: usize,
    pub(super) sparse: bool,
    pub(super) indexer: bool,
}

/// Where each routed expert of layer `l` lives, its three tensors
/// shape-checked (headers only).
pub(super) fn locate_experts(
    cfg: &ModelConfig,
    index: &WeightIndex,
    l: usize,
) -> Result<Vec<ExpertLocation>> {
    let (h, i) = (cfg.hidden_size, cfg.moe_intermediate_size);
    let mut locs = Vec::with_capacity(cfg.num_experts);
    for x in 0..cfg.num_experts {
        let cands = names::expert(cfg.family, l, x);
        let [g, u, d] = names::pick3(index, &cands).clone();
        locs.push(ExpertLocation {
            parts: [
                index.expect_shape(&g, &[i, h])?,
                index.expect_shape(&u, &[i, h])?,
                index.expect_shape(&d, &[h, i])?,
            ],
        });
    }
    Ok(locs)
}

/// The MTP layer loading reads, if any: the config announces one and the
/// checkpoint holds its weights (hub conversions sometimes drop it).
pub(super) fn mtp_spec(cfg: &ModelConfig, index: &WeightIndex) -> Option<LayerSpec> {
    let l = cfg.num_layers;
    let p = names::layer(l);
    if cfg.mtp_layers == 0 || !index.contains(&format!("{p}eh_proj.weight")) {
        return None;
    }
    Some(LayerSpec {
        index: l,
        sparse: index.contains(&format!("{p}mlp.gate.weight")),
        indexer: cfg.indexer.is_some()
            && index.contains(&format!("{p}self_attn.indexer.wq_b.weight")),
    })
}
