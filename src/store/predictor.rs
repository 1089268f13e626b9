//! A learned lookahead predictor (issue 14 item 4): per MoE layer M, a
//! linear scorer that guesses the experts M will choose for the current
//! token from what is known before M routes it:
//!
//! - the experts the previous MoE layer chose for this token;
//! - the experts M chose for the previous token;
//! - the router lookahead's guess of M (the next router applied to the
//!   previous layer's state), when there is one.
//!
//! `score(e) = bias[e] + Σ_a from_layer[a, e] + Σ_b from_token[b, e] +
//! guess · [e in the lookahead's guess]`, and the guess is the top-k
//! scores. It reads expert ids only: no model weights, so it lives in the
//! store. Trained offline from a routing trace by `moestream
//! train-predictor` (src/lab/replay/train.rs); saved as JSON.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The file format's version.
pub const VERSION: u32 = 1;

/// Most experts a predictor layer may have (`n_experts`, `n_prev`): its
/// `(n, n)` matrix is then 16 MiB (real MoE layers have 8 to 512).
pub const EXPERTS_MAX: usize = 1 << 11;

/// Most decoder layers a predictor may name (every `layer` is below it).
pub const LAYERS_MAX: usize = 1 << 14;

/// One MoE layer's scorer.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LayerPredictor {
    /// The MoE layer whose experts it guesses, and the MoE layer before it.
    pub layer: usize,
    pub prev_layer: usize,
    /// Experts of `layer` and of `prev_layer`.
    pub n_experts: usize,
    pub n_prev: usize,
    /// Experts to guess (the layer's top-k).
    pub k: usize,
    /// `(n_experts)`.
    pub bias: Vec<f32>,
    /// `(n_prev, n_experts)`: row `a` is added when the previous layer chose `a`.
    pub from_layer: Vec<f32>,
    /// `(n_experts, n_experts)`: row `b` is added when the previous token chose `b`.
    pub from_token: Vec<f32>,
    /// Added to every expert in the lookahead's guess.
    pub guess: f32,
}

/// What a [`LayerPredictor`] scores from.
#[derive(Clone, Copy, Debug)]
pub struct Evidence<'a> {
    pub prev_layer: &'a [usize],
    pub prev_token: Option<&'a [usize]>,
    pub guess: Option<&'a [usize]>,
}

impl LayerPredictor {
    /// A scorer that knows nothing yet: every expert at the prior log-odds
    /// of being chosen (k of n), every weight 0.
    pub fn blank(
        layer: usize,
        prev_layer: usize,
        (n_experts, n_prev, k): (usize, usize, usize),
    ) -> Self {
        let p = (k as f32 / n_experts.max(1) as f32).clamp(1e-4, 1.0 - 1e-4);
        LayerPredictor {
            layer,
            prev_layer,
            n_experts,
            n_prev,
            k,
            bias: vec![(p / (1.0 - p)).ln(); n_experts],
            from_layer: vec![0.0; n_prev * n_experts],
            from_token: vec![0.0; n_experts * n_experts],
            guess: 0.0,
        }
    }

    /// Every expert's score into `out`. Ids out of range are ignored (the
    /// evidence comes from a trace or a router of the same shapes).
    pub fn scores(&self, ev: &Evidence, out: &mut Vec<f32>) {
        let n = self.n_experts;
        out.clear();
        out.extend_from_slice(&self.bias);
        let mut add_row = |w: &[f32], row: usize| {
            if let Some(r) = w.get(row * n..(row + 1) * n) {
                out.iter_mut().zip(r).for_each(|(o, v)| *o += v);
            }
        };
        for &a in ev.prev_layer.iter().filter(|&&a| a < self.n_prev) {
            add_row(&self.from_layer, a);
        }
        for &b in ev.prev_token.unwrap_or(&[]).iter().filter(|&&b| b < n) {
            add_row(&self.from_token, b);
        }
        for &g in ev.guess.unwrap_or(&[]).iter().filter(|&&g| g < n) {
            out[g] += self.guess;
        }
    }

    /// The `k` best-scoring experts, best first (ties to the lower id), into
    /// `out`; `scores` is scratch.
    pub fn predict(&self, ev: &Evidence, scores: &mut Vec<f32>, out: &mut Vec<usize>) {
        self.scores(ev, scores);
        out.clear();
        out.extend(0..self.n_experts);
        out.sort_unstable_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        out.truncate(self.k);
    }

    /// Whether the vectors have the shapes the counts say.
    fn shapes_agree(&self) -> bool {
        let n = self.n_experts;
        self.bias.len() == n
            && Some(self.from_layer.len()) == self.n_prev.checked_mul(n)
            && Some(self.from_token.len()) == n.checked_mul(n)
    }

    /// What is wrong with a loaded scorer, if anything: every count in
    /// range (1 to [`EXPERTS_MAX`] experts, k of them at most, layers below
    /// [`LAYERS_MAX`], the previous layer before this one), the vectors of
    /// the counts' shapes, every weight finite.
    fn fault(&self) -> Option<String> {
        let experts = 1..=EXPERTS_MAX;
        let (n, p) = (self.n_experts, self.n_prev);
        if !experts.contains(&n) || !experts.contains(&p) {
            return Some(format!(
                "{n} experts ({p} before it): each must be in 1..={EXPERTS_MAX}"
            ));
        }
        if !(1..=n).contains(&self.k) {
            return Some(format!("k {} is outside 1..={n}", self.k));
        }
        if self.layer >= LAYERS_MAX || self.prev_layer >= self.layer {
            return Some(format!(
                "previous layer {}: must be before it, and it below {LAYERS_MAX}",
                self.prev_layer
            ));
        }
        if !self.shapes_agree() {
            return Some(format!(
                "weights do not match {n} experts ({p} before it), k {}",
                self.k
            ));
        }
        let weights = [&self.bias, &self.from_layer, &self.from_token];
        let named = ["bias", "from_layer", "from_token"];
        for (w, name) in weights.iter().zip(named) {
            if let Some(i) = w.iter().position(|x| !x.is_finite()) {
                return Some(format!("`{name}` element {i} is not finite"));
            }
        }
        (!self.guess.is_finite()).then(|| format!("`guess` {} is not finite", self.guess))
    }
}

/// A trained predictor: a scorer per MoE layer that has a previous one.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Predictor {
    pub version: u32,
    pub layers: Vec<LayerPredictor>,
}

impl Predictor {
    /// The scorer of `layer`, if it has one.
    pub fn layer(&self, layer: usize) -> Option<&LayerPredictor> {
        self.layers.iter().find(|l| l.layer == layer)
    }

    /// Writes it as JSON (a temp file renamed over `path`).
    pub fn save(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_vec(self).map_err(|e| Error::file(path, e.into()))?;
        crate::fs::write(path, &text)
    }

    /// Reads a predictor saved by [`Predictor::save`], checking its version
    /// and every layer's shapes.
    pub fn load(path: &Path) -> Result<Predictor> {
        let text = crate::fs::read(path, crate::fs::read::PREDICTOR)?;
        let p: Predictor = serde_json::from_slice(&text)
            .map_err(|e| Error::config(path, "(the whole file)", e.to_string()))?;
        let bad = |field: &str, reason: String| Error::config(path, field, reason);
        if p.version != VERSION {
            return Err(bad(
                "version",
                format!("{} (this build reads {VERSION})", p.version),
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for l in &p.layers {
            if let Some(why) = l.fault() {
                return Err(bad("layers", format!("layer {}: {why}", l.layer)));
            }
            if !seen.insert(l.layer) {
                return Err(bad("layers", format!("layer {} appears twice", l.layer)));
            }
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_add_the_rows_of_the_evidence() {
        let mut p = LayerPredictor::blank(3, 1, (4, 2, 2));
        p.bias = vec![0.0; 4];
        let n = 4;
        p.from_layer[n + 2] = 1.0; // previous layer's expert 1 → expert 2
        p.from_token[3 * n] = 0.5; // previous token's expert 3 → expert 0
        p.guess = 0.25;
        let ev = Evidence {
            prev_layer: &[1, 7],
            prev_token: Some(&[3]),
            guess: Some(&[0, 1]),
        };
        let (mut s, mut top) = (Vec::new(), Vec::new());
        p.scores(&ev, &mut s);
        assert_eq!(s, vec![0.75, 0.25, 1.0, 0.0]);
        p.predict(&ev, &mut s, &mut top);
        assert_eq!(top, vec![2, 0]);
    }

    #[test]
    fn save_and_load_round_trip_and_refuse_bad_shapes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.json");
        let mut p = Predictor {
            version: VERSION,
            layers: vec![LayerPredictor::blank(1, 0, (8, 8, 2))],
        };
        p.save(&path).unwrap();
        assert_eq!(Predictor::load(&path).unwrap(), p);
        p.layers[0].from_token.pop();
        p.save(&path).unwrap();
        let e = Predictor::load(&path).unwrap_err().to_string();
        assert!(e.contains("layer 1") && e.contains("p.json"), "{e}");
    }
}
