//! Tensor names of each family, as hub checkpoints spell them. Where a
//! family has two spellings (Mixtral's `block_sparse_moe.*.w1` and the
//! transformers-5 `mlp.*.gate_proj`), both are listed and the first present
//! in the checkpoint wins.

use crate::error::Result;
use crate::formats::config::Family;
use crate::formats::weights::WeightIndex;

/// Prefix of layer `l`.
pub fn layer(l: usize) -> String {
    format!("model.layers.{l}.")
}

/// Candidate names of the router weight of layer `l`.
pub fn router(family: Family, l: usize) -> Vec<String> {
    let p = layer(l);
    match family {
        Family::Mixtral => vec![
            format!("{p}block_sparse_moe.gate.weight"),
            format!("{p}mlp.gate.weight"),
        ],
        _ => vec![format!("{p}mlp.gate.weight")],
    }
}

/// Candidate (gate, up, down) names of routed expert `e` of layer `l`.
pub fn expert(family: Family, l: usize, e: usize) -> Vec<[String; 3]> {
    let p = layer(l);
    let hub = [
        format!("{p}mlp.experts.{e}.gate_proj.weight"),
        format!("{p}mlp.experts.{e}.up_proj.weight"),
        format!("{p}mlp.experts.{e}.down_proj.weight"),
    ];
    match family {
        Family::Mixtral => vec![
            [
                format!("{p}block_sparse_moe.experts.{e}.w1.weight"),
                format!("{p}block_sparse_moe.experts.{e}.w3.weight"),
                format!("{p}block_sparse_moe.experts.{e}.w2.weight"),
            ],
            hub,
        ],
        _ => vec![hub],
    }
}

/// The first candidate present in `index`; if none is, the first candidate
/// (so the `MissingTensor` error names the canonical spelling).
pub fn pick<'a>(index: &WeightIndex, candidates: &'a [String]) -> &'a str {
    candidates
        .iter()
        .find(|c| index.contains(c))
        .unwrap_or(&candidates[0])
}

/// Like [`pick`] for (gate, up, down) triples.
pub fn pick3<'a>(index: &WeightIndex, candidates: &'a [[String; 3]]) -> &'a [String; 3] {
    candidates
        .iter()
        .find(|c| index.contains(&c[0]))
        .unwrap_or(&candidates[0])
}

/// Reads an optional tensor: `Ok(None)` when absent.
pub fn optional(index: &WeightIndex, name: &str, shape: &[usize]) -> Result<Option<Vec<f32>>> {
    if index.contains(name) {
        index.read_f32(name, shape).map(Some)
    } else {
        Ok(None)
    }
}
