//! Importance files: what `moestream calibrate --out FILE` records and
//! `convert --importance FILE` weights the quantization error with. For
//! every calibrated input, the mean square of each column over the rows
//! that passed through it (llama.cpp's imatrix idea: an error in a weight
//! costs in proportion to the square of the input it multiplies), and how
//! many rows that was. Stored as safetensors: one F32 `[cols]` tensor per
//! input, the row counts as JSON in the header metadata.
//!
//! Keys name inputs, not tensors (q, k and v read one input):
//! `layers.L.attn_in`, `layers.L.attn_out`, `layers.L.q_latent`,
//! `layers.L.dense.in|down`, `layers.L.shared.in|down`,
//! `layers.L.expert.E.in|down`, and `head`. [`key_of_tensor`] says which
//! input a checkpoint tensor reads.

use crate::error::{Error, Result};
use crate::formats::quant::policy::layer_index;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Header metadata key of the row counts (JSON: key → rows).
pub const ROWS_KEY: &str = "moestream.importance.rows";
/// Header metadata key of the number of calibration tokens.
pub const TOKENS_KEY: &str = "moestream.importance.tokens";

/// One input's statistics.
#[derive(Clone, Debug, PartialEq)]
pub struct Column {
    /// Per column, the mean square of the input over `rows` rows.
    pub mean_squares: Vec<f32>,
    pub rows: u64,
}

/// A whole importance file.
#[derive(Clone, Debug, PartialEq)]
pub struct Importance {
    /// Where it was read from (named in errors).
    pub origin: PathBuf,
    pub inputs: BTreeMap<String, Column>,
    /// Tokens the calibration ran over.
    pub tokens: u64,
}

impl Importance {
    /// The file's bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let bytes: Vec<(&String, Vec<u8>)> = self
            .inputs
            .iter()
            .map(|(k, c)| {
                (
                    k,
                    c.mean_squares
                        .iter()
                        .flat_map(|v| v.to_le_bytes())
                        .collect(),
                )
            })
            .collect();
        let refuse = |reason: String| self.refused("the header", reason);
        let mut views = Vec::with_capacity(bytes.len());
        for ((k, b), c) in bytes.iter().zip(self.inputs.values()) {
            let view = TensorView::new(Dtype::F32, vec![c.mean_squares.len()], b)
                .map_err(|e| refuse(format!("{k}: {e}")))?;
            views.push((k.as_str(), view));
        }
        let rows: BTreeMap<&String, u64> = self.inputs.iter().map(|(k, c)| (k, c.rows)).collect();
        let meta = HashMap::from([
            (
                ROWS_KEY.to_string(),
                serde_json::to_string(&rows).expect("a map"),
            ),
            (TOKENS_KEY.to_string(), self.tokens.to_string()),
        ]);
        safetensors::serialize(views, Some(meta)).map_err(|e| refuse(e.to_string()))
    }

    /// Writes the file (through the one writer).
    pub fn write(&self, path: &Path) -> Result<()> {
        crate::fs::write(path, &self.to_bytes()?)
    }

    /// Reads and checks a file: every tensor F32 and one-dimensional, every
    /// value finite and non-negative, a row count for every input.
    pub fn read(path: &Path) -> Result<Importance> {
        let bytes = crate::fs::read(path, crate::fs::read::IMPORTANCE)?;
        Importance::parse(path, &bytes)
    }

    /// [`Importance::read`] of bytes already read from `origin`.
    pub fn parse(origin: &Path, bytes: &[u8]) -> Result<Importance> {
        let mut imp = Importance {
            origin: origin.to_path_buf(),
            inputs: BTreeMap::new(),
            tokens: 0,
        };
        let st = SafeTensors::deserialize(bytes)
            .map_err(|e| imp.refused("the header", format!("not a safetensors file: {e}")))?;
        let (_, meta) = SafeTensors::read_metadata(bytes)
            .map_err(|e| imp.refused("the header", e.to_string()))?;
        let md = meta.metadata().clone().unwrap_or_default();
        let rows: BTreeMap<String, u64> = md
            .get(ROWS_KEY)
            .and_then(|s| serde_json::from_str(s).ok())
            .ok_or_else(|| imp.refused(ROWS_KEY, "missing or not a JSON map of counts".into()))?;
        imp.tokens = md
            .get(TOKENS_KEY)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| imp.refused(TOKENS_KEY, "missing or not a count".into()))?;
        for (name, view) in st.tensors() {
            let column = imp.column(&name, &view, &rows)?;
            imp.inputs.insert(name, column);
        }
        Ok(imp)
    }

    /// One checked input of [`Importance::parse`].
    fn column(
        &self,
        name: &str,
        view: &TensorView,
        rows: &BTreeMap<String, u64>,
    ) -> Result<Column> {
        if view.dtype() != Dtype::F32 || view.shape().len() != 1 {
            let why = format!("{:?} {:?}: want one F32 column", view.dtype(), view.shape());
            return Err(self.refused(name, why));
        }
        let mean_squares: Vec<f32> = view
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        if let Some(i) = mean_squares
            .iter()
            .position(|v| !(v.is_finite() && *v >= 0.0))
        {
            let why = format!(
                "column {i} is {}: want a finite mean square",
                mean_squares[i]
            );
            return Err(self.refused(name, why));
        }
        let rows = *rows
            .get(name)
            .ok_or_else(|| self.refused(name, format!("no row count in {ROWS_KEY}")))?;
        Ok(Column { mean_squares, rows })
    }

    /// The column weights for tensor `name` of `cols` columns: `None` where
    /// the file has no input for it or saw it fewer than `min_rows` times
    /// (a rarely routed expert: too few rows to weight by); refused where
    /// the input's width is not `cols` (a file of another model).
    pub fn weights_for(&self, name: &str, cols: usize, min_rows: u64) -> Result<Option<&[f32]>> {
        let Some(c) = key_of_tensor(name).and_then(|k| self.inputs.get(&k)) else {
            return Ok(None);
        };
        if c.mean_squares.len() != cols {
            let why = format!(
                "its input has {} columns, the tensor {cols} (a file of another model?)",
                c.mean_squares.len()
            );
            return Err(self.refused(name, why));
        }
        Ok((c.rows >= min_rows).then_some(c.mean_squares.as_slice()))
    }

    fn refused(&self, at: &str, reason: String) -> Error {
        Error::Importance {
            path: self.origin.clone(),
            at: at.to_string(),
            reason,
        }
    }
}

/// The key of the input checkpoint tensor `name` reads, where calibration
/// records one (kv_b, embeddings, routers and the MTP head's own
/// projections have none, and are quantized unweighted).
pub fn key_of_tensor(name: &str) -> Option<String> {
    if name == "lm_head.weight" {
        return Some("head".into());
    }
    let l = layer_index(name)?;
    let rest = name.strip_prefix(&format!("model.layers.{l}."))?;
    let rest = rest.strip_suffix(".weight")?;
    let input = attention_input(rest).or_else(|| mlp_input(rest))?;
    Some(format!("layers.{l}.{input}"))
}

/// `attn_in`, `attn_out` or `q_latent` for a `self_attn.…` projection.
fn attention_input(rest: &str) -> Option<String> {
    let proj = rest.strip_prefix("self_attn.")?;
    let key = match proj {
        "q_proj"
        | "k_proj"
        | "v_proj"
        | "q_a_proj"
        | "kv_a_proj_with_mqa"
        | "indexer.wk"
        | "indexer.weights_proj" => "attn_in",
        "o_proj" => "attn_out",
        "q_b_proj" | "indexer.wq_b" => "q_latent",
        _ => return None,
    };
    Some(key.into())
}

/// `dense.in`, `shared.down`, `expert.E.in`, … for an MLP projection.
fn mlp_input(rest: &str) -> Option<String> {
    let side = |proj: &str| match proj {
        "gate_proj" | "up_proj" | "w1" | "w3" => Some("in"),
        "down_proj" | "w2" => Some("down"),
        _ => None,
    };
    let body = rest
        .strip_prefix("mlp.")
        .or_else(|| rest.strip_prefix("block_sparse_moe."))?;
    if let Some(e) = body.strip_prefix("experts.") {
        let (e, proj) = e.split_once('.')?;
        let e: usize = e.parse().ok()?;
        return Some(format!("expert.{e}.{}", side(proj)?));
    }
    for shared in ["shared_experts.", "shared_expert."] {
        if let Some(proj) = body.strip_prefix(shared) {
            return Some(format!("shared.{}", side(proj)?));
        }
    }
    Some(format!("dense.{}", side(body)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_spelling_finds_its_input() {
        let cases = [
            (
                "model.layers.2.self_attn.k_proj.weight",
                Some("layers.2.attn_in"),
            ),
            (
                "model.layers.2.self_attn.kv_a_proj_with_mqa.weight",
                Some("layers.2.attn_in"),
            ),
            (
                "model.layers.2.self_attn.o_proj.weight",
                Some("layers.2.attn_out"),
            ),
            (
                "model.layers.2.self_attn.q_b_proj.weight",
                Some("layers.2.q_latent"),
            ),
            ("model.layers.2.self_attn.kv_b_proj.weight", None),
            (
                "model.layers.0.mlp.down_proj.weight",
                Some("layers.0.dense.down"),
            ),
            (
                "model.layers.1.mlp.experts.7.up_proj.weight",
                Some("layers.1.expert.7.in"),
            ),
            (
                "model.layers.1.block_sparse_moe.experts.3.w2.weight",
                Some("layers.1.expert.3.down"),
            ),
            (
                "model.layers.1.mlp.shared_experts.gate_proj.weight",
                Some("layers.1.shared.in"),
            ),
            (
                "model.layers.1.mlp.shared_expert.down_proj.weight",
                Some("layers.1.shared.down"),
            ),
            ("model.layers.1.mlp.gate.weight", None),
            ("model.layers.1.mlp.shared_expert_gate.weight", None),
            ("model.embed_tokens.weight", None),
            ("lm_head.weight", Some("head")),
            ("model.layers.1.self_attn.q_proj.bias", None),
        ];
        for (name, want) in cases {
            assert_eq!(key_of_tensor(name).as_deref(), want, "{name}");
        }
    }

    fn sample() -> Importance {
        let column = |v: Vec<f32>, rows| Column {
            mean_squares: v,
            rows,
        };
        Importance {
            origin: "mem".into(),
            inputs: BTreeMap::from([
                (
                    "layers.0.attn_in".to_string(),
                    column(vec![1.0, 0.5, 2.0], 40),
                ),
                (
                    "layers.0.expert.1.in".to_string(),
                    column(vec![3.0, 0.0, 1.0], 2),
                ),
            ]),
            tokens: 40,
        }
    }

    #[test]
    fn a_file_round_trips_and_answers_by_tensor() {
        let imp = sample();
        let back = Importance::parse(Path::new("mem"), &imp.to_bytes().unwrap()).unwrap();
        assert_eq!(back, imp);
        let q = "model.layers.0.self_attn.q_proj.weight";
        assert_eq!(
            back.weights_for(q, 3, 16).unwrap(),
            Some(&[1.0, 0.5, 2.0][..])
        );
        let rare = "model.layers.0.mlp.experts.1.gate_proj.weight";
        assert_eq!(back.weights_for(rare, 3, 16).unwrap(), None, "too few rows");
        assert!(back.weights_for(rare, 3, 2).unwrap().is_some());
        let other = "model.layers.5.self_attn.q_proj.weight";
        assert_eq!(back.weights_for(other, 3, 1).unwrap(), None);
        let e = back.weights_for(q, 4, 1).unwrap_err().to_string();
        assert!(e.contains(q) && e.contains("3 columns"), "{e}");
    }

    #[test]
    fn lying_files_are_refused_naming_the_field() {
        let mut imp = sample();
        imp.inputs.get_mut("layers.0.attn_in").unwrap().mean_squares[1] = f32::NAN;
        let e = Importance::parse(Path::new("x.imp"), &imp.to_bytes().unwrap()).unwrap_err();
        assert!(e.to_string().contains("layers.0.attn_in"), "{e}");
        let e = Importance::parse(Path::new("x.imp"), b"not a file").unwrap_err();
        assert!(e.to_string().contains("x.imp"), "{e}");
        // A tensor without a row count.
        let b = safetensors::serialize(
            [(
                "k",
                TensorView::new(Dtype::F32, vec![1], &[0, 0, 0, 0]).unwrap(),
            )],
            Some(HashMap::from([
                (ROWS_KEY.to_string(), "{}".to_string()),
                (TOKENS_KEY.to_string(), "1".to_string()),
            ])),
        )
        .unwrap();
        let e = Importance::parse(Path::new("x.imp"), &b)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no row count"), "{e}");
    }
}
