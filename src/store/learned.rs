//! Prefetch by the learned lookahead predictor ([`super::predictor`]):
//! once an MoE layer has routed a decode token, the next MoE layer's
//! experts the predictor guesses are read at prefetch priority, like the
//! router lookahead's, and the guess is scored when that layer routes.

use super::predictor::{Evidence, Predictor};
use super::prefetch::Variant;
use super::ExpertStore;
use crate::error::{Error, Result};
use std::sync::Arc;

/// The predictor's state between layers: per layer, its choice for the
/// last decode token, and the pending guess with its score.
#[derive(Clone, Debug, Default)]
pub(super) struct LearnedLayer {
    last_choice: Option<Vec<usize>>,
    guess: Option<Vec<usize>>,
    /// (guessed and chosen, chosen).
    score: (u64, u64),
}

impl ExpertStore {
    /// Uses `predictor` from now on (`None`: none). Refused when a layer it
    /// guesses, or the layer before, is not an MoE layer of this many
    /// experts.
    pub fn set_predictor(&mut self, predictor: Option<Arc<Predictor>>) -> Result<()> {
        if let Some(p) = &predictor {
            let experts = |l: usize| self.locations.get(l).map_or(0, Vec::len);
            if let Some(l) = p
                .layers
                .iter()
                .find(|l| experts(l.layer) != l.n_experts || experts(l.prev_layer) != l.n_prev)
            {
                return Err(Error::Setting {
                    name: "predictor",
                    reason: format!(
                        "it guesses layer {} ({} experts, after layer {} of {}); this model's layers {} and {} have {} and {}",
                        l.layer, l.n_experts, l.prev_layer, l.n_prev, l.layer, l.prev_layer,
                        experts(l.layer), experts(l.prev_layer)
                    ),
                });
            }
        }
        self.predictor = predictor;
        Ok(())
    }

    /// After `layer` routed one decode token to `chosen`: scores the
    /// predictor's pending guess of this layer, then guesses the next MoE
    /// layer's experts and starts reading them.
    pub(crate) fn learned_step(&self, layer: usize, chosen: &[usize]) {
        let Some(p) = &self.predictor else {
            return;
        };
        let mut state = self.learned.lock().expect("learned lock");
        let this = &mut state[layer];
        if let Some(g) = this.guess.take() {
            this.score.0 += chosen.iter().filter(|e| g.contains(e)).count() as u64;
            this.score.1 += chosen.len() as u64;
        }
        this.last_choice = Some(chosen.to_vec());
        let Some(next) = p.layers.iter().find(|l| l.prev_layer == layer) else {
            return;
        };
        let lookahead = self.pending_guess(next.layer, Variant::Attn);
        let ev = Evidence {
            prev_layer: chosen,
            prev_token: state[next.layer].last_choice.as_deref(),
            guess: lookahead.as_deref(),
        };
        let (mut scores, mut guess) = (Vec::new(), Vec::new());
        next.predict(&ev, &mut scores, &mut guess);
        state[next.layer].guess = Some(guess.clone());
        drop(state);
        self.prefetch(next.layer, &guess);
    }

    /// The predictor's recall over all layers: (guessed and chosen, chosen).
    pub fn learned_recall(&self) -> (u64, u64) {
        let state = self.learned.lock().expect("learned lock");
        state
            .iter()
            .fold((0, 0), |(a, b), l| (a + l.score.0, b + l.score.1))
    }
}
