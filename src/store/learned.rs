//! Prefetch by the learned lookahead predictor ([`super::predictor`]):
//! once an MoE layer has routed a decode token, the next MoE layer's
//! experts the predictor guesses are read at prefetch priority, like the
//! router lookahead's, and the guess is scored when that layer routes.

use super::predictor::{Evidence, Predictor};
use super::prefetch::{Recall, Variant};
use crate::error::{Error, Result};
use std::sync::{Arc, Mutex};

/// The predictor's state between layers: per layer, its choice for the
/// last decode token, and the pending guess with its score.
#[derive(Clone, Debug, Default)]
pub(super) struct LearnedLayer {
    /// Empty until the layer has routed a decode token.
    last_choice: Vec<usize>,
    /// The guess, and whether it awaits scoring.
    guess: Vec<usize>,
    pending: bool,
    /// (guessed and chosen, chosen).
    score: (u64, u64),
}

thread_local! {
    /// Scores, the lookahead's guess and the predictor's guess, reused.
    static SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<usize>, Vec<usize>)> = Default::default();
}

/// The learned lookahead predictor, if prefetch uses one, and its
/// per-layer state: an observer of every single-token fetch.
#[derive(Default)]
pub(crate) struct Learned {
    predictor: Option<Arc<Predictor>>,
    layers: Mutex<Vec<LearnedLayer>>,
}

impl Learned {
    pub(crate) fn new(layers: usize) -> Learned {
        Learned {
            predictor: None,
            layers: Mutex::new(vec![LearnedLayer::default(); layers]),
        }
    }

    /// Uses `predictor` from now on (`None`: none). Refused when a layer it
    /// guesses, or the layer before, is not an MoE layer of this many
    /// experts (`experts(layer)`: 0 for a dense or missing layer).
    pub(crate) fn set(
        &mut self,
        predictor: Option<Arc<Predictor>>,
        experts: impl Fn(usize) -> usize,
    ) -> Result<()> {
        if let Some(p) = &predictor {
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
    /// layer's experts (with the router lookahead's pending guess of it,
    /// from `recall`, as evidence) and hands the guess to `prefetch`.
    /// Allocates nothing once its vectors have grown.
    pub(crate) fn step(
        &self,
        layer: usize,
        chosen: &[usize],
        recall: &Recall,
        prefetch: impl FnOnce(usize, &[usize]),
    ) {
        let Some(p) = &self.predictor else {
            return;
        };
        let mut state = self.layers.lock().expect("learned lock");
        let this = &mut state[layer];
        if std::mem::take(&mut this.pending) {
            let g = &this.guess;
            this.score.0 += chosen.iter().filter(|e| g.contains(e)).count() as u64;
            this.score.1 += chosen.len() as u64;
        }
        this.last_choice.clear();
        this.last_choice.extend_from_slice(chosen);
        let Some(next) = p.layers.iter().find(|l| l.prev_layer == layer) else {
            return;
        };
        SCRATCH.with_borrow_mut(|(scores, lookahead, guess)| {
            let seen = recall.pending_guess_into(next.layer, Variant::Attn, lookahead);
            let after = &mut state[next.layer];
            let ev = Evidence {
                prev_layer: chosen,
                prev_token: (!after.last_choice.is_empty()).then_some(&after.last_choice[..]),
                guess: seen.then_some(&lookahead[..]),
            };
            next.predict(&ev, scores, guess);
            after.guess.clear();
            after.guess.extend_from_slice(guess);
            after.pending = true;
            drop(state);
            prefetch(next.layer, guess);
        });
    }

    /// The predictor's recall over all layers: (guessed and chosen, chosen).
    pub(crate) fn recall(&self) -> (u64, u64) {
        let state = self.layers.lock().expect("learned lock");
        state
            .iter()
            .fold((0, 0), |(a, b), l| (a + l.score.0, b + l.score.1))
    }
}
