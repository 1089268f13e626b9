//! Quality of a quantized model against a reference: logits of a first
//! `eval --save-logits` run (on the f32 model) saved to a safetensors file,
//! and compared by a later `eval --ref-logits` run: top-1 agreement and the
//! KL divergence `KL(P_ref ‖ P_model)` at every position.

use crate::engine::sampler::argmax;
use crate::error::{Error, Result};
use serde::Serialize;
use std::path::Path;

/// Saves `logits` `(ids.len(), vocab)` for the token `ids` to `path`.
pub fn save_logits(path: &Path, ids: &[u32], logits: &[f32], vocab: usize) -> Result<()> {
    assert_eq!(
        logits.len(),
        ids.len() * vocab,
        "logits do not match the ids"
    );
    let lb: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
    let ib: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
    let views = [
        (
            "logits",
            safetensors::tensor::TensorView::new(
                safetensors::Dtype::F32,
                vec![ids.len(), vocab],
                &lb,
            )
            .expect("shape matches bytes"),
        ),
        (
            "ids",
            safetensors::tensor::TensorView::new(safetensors::Dtype::U32, vec![ids.len()], &ib)
                .expect("shape matches bytes"),
        ),
    ];
    let bytes = safetensors::serialize(views, None)
        .map_err(|e| Error::Request(format!("serializing logits: {e}")))?;
    crate::fs::write(path, &bytes)
}

/// Reference logits: the ids they were computed on and `(ids, vocab)` values.
pub struct RefLogits {
    pub ids: Vec<u32>,
    pub vocab: usize,
    pub logits: Vec<f32>,
}

/// Loads a file written by [`save_logits`].
pub fn load_logits(path: &Path) -> Result<RefLogits> {
    let bytes = crate::fs::read(path, crate::fs::read::LOGITS)?;
    let bad = |why: String| Error::Shard {
        path: path.to_path_buf(),
        reason: format!("not a reference-logits file: {why}"),
    };
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| bad(e.to_string()))?;
    let get = |name: &str, dt: safetensors::Dtype| {
        let t = st.tensor(name).map_err(|e| bad(format!("`{name}`: {e}")))?;
        if t.dtype() != dt {
            return Err(bad(format!("`{name}` is {:?}, expected {dt:?}", t.dtype())));
        }
        Ok(t)
    };
    let l = get("logits", safetensors::Dtype::F32)?;
    let i = get("ids", safetensors::Dtype::U32)?;
    let [t, vocab] = l.shape() else {
        return Err(bad(format!(
            "`logits` has shape {:?}, expected 2-D",
            l.shape()
        )));
    };
    if i.shape() != [*t] {
        return Err(bad("`ids` and `logits` disagree in length".into()));
    }
    let f = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    Ok(RefLogits {
        ids: i
            .data()
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        vocab: *vocab,
        logits: f(l.data()),
    })
}

/// How a model's logits compare with the reference's.
#[derive(Clone, Debug, Serialize)]
pub struct Agreement {
    pub positions: usize,
    /// Positions whose argmax equals the reference's.
    pub top1_matched: usize,
    pub top1_agreement: f64,
    /// Mean over positions of KL(P_ref ‖ P_model), nats.
    pub mean_kl: f64,
    pub max_kl: f64,
}

/// Log-softmax in f64.
fn log_softmax(l: &[f32]) -> Vec<f64> {
    let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = l.iter().map(|v| (*v as f64 - max).exp()).sum::<f64>().ln() + max;
    l.iter().map(|v| *v as f64 - lse).collect()
}

/// Compares `logits` computed on `ids` with the reference.
pub fn compare(reference: &RefLogits, ids: &[u32], logits: &[f32]) -> Result<Agreement> {
    if reference.ids != ids {
        return Err(Error::Request(
            "the reference logits were computed on different token ids".into(),
        ));
    }
    let v = reference.vocab;
    if logits.len() != ids.len() * v {
        return Err(Error::Request(format!(
            "the reference has vocab {v}, this model {}",
            logits.len() / ids.len().max(1)
        )));
    }
    let (mut matched, mut sum, mut max) = (0, 0f64, 0f64);
    for (r, m) in reference.logits.chunks_exact(v).zip(logits.chunks_exact(v)) {
        matched += usize::from(argmax(r) == argmax(m));
        let (lr, lm) = (log_softmax(r), log_softmax(m));
        let kl: f64 = lr.iter().zip(&lm).map(|(a, b)| a.exp() * (a - b)).sum();
        let kl = kl.max(0.0);
        sum += kl;
        max = max.max(kl);
    }
    let n = ids.len();
    Ok(Agreement {
        positions: n,
        top1_matched: matched,
        top1_agreement: matched as f64 / n as f64,
        mean_kl: sum / n as f64,
        max_kl: max,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_logits_round_trip_and_compare() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ref.safetensors");
        let ids = [3u32, 1, 4];
        let logits = [0.0f32, 1.0, 2.0, 2.0, 1.0, 0.0, 1.0, 1.0, 3.0];
        save_logits(&p, &ids, &logits, 3).unwrap();
        let r = load_logits(&p).unwrap();
        assert_eq!((r.ids.as_slice(), r.vocab), (&ids[..], 3));
        let same = compare(&r, &ids, &logits).unwrap();
        assert_eq!(same.top1_matched, 3);
        assert!(same.mean_kl.abs() < 1e-12);
        let mut other = logits;
        other[0] = 5.0; // position 0 now argmax 0
        let d = compare(&r, &ids, &other).unwrap();
        assert_eq!(d.top1_matched, 2);
        assert!(d.mean_kl > 0.1 && d.max_kl >= d.mean_kl);
        assert!(compare(&r, &[3, 1, 5], &logits).is_err());
    }
}
