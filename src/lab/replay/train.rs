//! Training the learned lookahead predictor (`moestream train-predictor`;
//! the scorer itself is [`crate::store::predictor`]) from a routing trace,
//! and its recall@k on held-out trace segments beside the router
//! lookahead's.
//!
//! Examples are decode tokens (single-row fetches) of every MoE layer M
//! that has an MoE layer L before it: the evidence is L's choice for the
//! token, M's choice for the previous token and the lookahead's guess of M
//! from L's post-attention state (the `attn` variant, which is known before
//! M routes); the answer is M's choice. Each run's examples split in time:
//! the first part trains, the last `holdout` share is held out. Training
//! is plain logistic regression (one output per expert) by stochastic
//! gradient descent.

use crate::formats::trace::read::{LayerTrace, Run};
use crate::store::predictor::{Evidence, LayerPredictor, Predictor, EXPERTS_MAX, VERSION};
use serde::Serialize;

/// How to train.
#[derive(Clone, Copy, Debug)]
pub struct TrainOptions {
    pub epochs: usize,
    pub learning_rate: f32,
    /// Share of each run's decode tokens held out (the last ones).
    pub holdout: f64,
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            epochs: 4,
            learning_rate: 0.05,
            holdout: 0.25,
        }
    }
}

/// One decode token at a layer: what is known before the layer routes it,
/// and what it chose.
struct Example {
    prev_layer: Vec<usize>,
    prev_token: Option<Vec<usize>>,
    /// The lookahead's guesses: attn, output.
    guess: [Option<Vec<usize>>; 2],
    chosen: Vec<usize>,
}

impl Example {
    fn evidence(&self, with_guess: bool) -> Evidence<'_> {
        Evidence {
            prev_layer: &self.prev_layer,
            prev_token: self.prev_token.as_deref(),
            guess: self.guess[0].as_deref().filter(|_| with_guess),
        }
    }
}

/// Recall@k on held-out tokens of one layer (or all): of the experts the
/// layer chose, the share each guesser named (`None`: nothing to score).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Recall {
    /// The MoE layer (`None` for the total).
    pub layer: Option<usize>,
    pub train_tokens: usize,
    pub heldout_tokens: usize,
    /// The predictor with every input, and without the lookahead's guess.
    pub learned: Option<f64>,
    pub learned_without_lookahead: Option<f64>,
    /// The router lookahead from the previous layer's post-attention state
    /// and from its output.
    pub lookahead_attn: Option<f64>,
    pub lookahead_output: Option<f64>,
    /// The layer's choice for the previous token.
    pub previous_token: Option<f64>,
}

/// Hits and chosen experts, per guesser, in [`Recall`]'s order.
#[derive(Clone, Copy, Default)]
struct Tally([(u64, u64); 5]);

impl Tally {
    fn add(&mut self, i: usize, guess: Option<&[usize]>, chosen: &[usize]) {
        if let Some(g) = guess {
            self.0[i].0 += chosen.iter().filter(|e| g.contains(e)).count() as u64;
            self.0[i].1 += chosen.len() as u64;
        }
    }

    fn merge(&mut self, o: &Tally) {
        for (a, b) in self.0.iter_mut().zip(&o.0) {
            (a.0, a.1) = (a.0 + b.0, a.1 + b.1);
        }
    }

    fn recall(&self, layer: Option<usize>, (train, held): (usize, usize)) -> Recall {
        let r = |i: usize| (self.0[i].1 > 0).then(|| self.0[i].0 as f64 / self.0[i].1 as f64);
        Recall {
            layer,
            train_tokens: train,
            heldout_tokens: held,
            learned: r(0),
            learned_without_lookahead: r(1),
            lookahead_attn: r(2),
            lookahead_output: r(3),
            previous_token: r(4),
        }
    }
}

/// The experts of row `r` of a layer.
fn picks(l: &LayerTrace, r: usize) -> Vec<usize> {
    l.picks[l.rows[r].clone()].to_vec()
}

/// The decode-token examples of layer `cur` after MoE layer `prev` in one
/// run (none when their fetches do not pair up forward by forward).
fn examples(prev: &LayerTrace, cur: &LayerTrace) -> Vec<Example> {
    if prev.fetches.len() != cur.fetches.len() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (i, (fp, fc)) in prev.fetches.iter().zip(&cur.fetches).enumerate() {
        if fp.rows.len() != 1 || fc.rows.len() != 1 {
            continue;
        }
        let prev_token = i
            .checked_sub(1)
            .map(|j| picks(cur, cur.fetches[j].rows.end - 1));
        let guess = fc.guess.clone().map(|g| g.map(|g| cur.guesses[g].to_vec()));
        out.push(Example {
            prev_layer: picks(prev, fp.rows.start),
            prev_token,
            guess,
            chosen: picks(cur, fc.rows.start),
        });
    }
    out
}

/// Logistic regression by SGD: every expert's log-odds of being chosen.
fn fit(p: &mut LayerPredictor, train: &[&Example], with_guess: bool, o: &TrainOptions) {
    let n = p.n_experts;
    let mut grad = Vec::with_capacity(n);
    for _ in 0..o.epochs {
        for ex in train {
            p.scores(&ex.evidence(with_guess), &mut grad);
            grad.iter_mut().for_each(|s| *s = 1.0 / (1.0 + (-*s).exp()));
            for &c in ex.chosen.iter().filter(|&&c| c < n) {
                grad[c] -= 1.0;
            }
            step(p, ex, &grad, with_guess, o.learning_rate);
        }
    }
}

/// One gradient step on `ex` (`grad`: per expert, d loss / d score).
fn step(p: &mut LayerPredictor, ex: &Example, grad: &[f32], with_guess: bool, lr: f32) {
    let n = p.n_experts;
    let sub = |row: &mut [f32]| row.iter_mut().zip(grad).for_each(|(w, g)| *w -= lr * g);
    sub(&mut p.bias);
    for &a in ex.prev_layer.iter().filter(|&&a| a < p.n_prev) {
        sub(&mut p.from_layer[a * n..(a + 1) * n]);
    }
    for &b in ex.prev_token.iter().flatten().filter(|&&b| b < n) {
        sub(&mut p.from_token[b * n..(b + 1) * n]);
    }
    if let (true, Some(g)) = (with_guess, &ex.guess[0]) {
        p.guess -= lr * g.iter().filter(|&&e| e < n).map(|&e| grad[e]).sum::<f32>();
    }
}

/// Scores every guesser on the held-out examples.
fn score(full: &LayerPredictor, bare: &LayerPredictor, held: &[&Example]) -> Tally {
    let mut t = Tally::default();
    let (mut s, mut top) = (Vec::new(), Vec::new());
    for ex in held {
        full.predict(&ex.evidence(true), &mut s, &mut top);
        t.add(0, Some(&top), &ex.chosen);
        bare.predict(&ex.evidence(false), &mut s, &mut top);
        t.add(1, Some(&top), &ex.chosen);
        t.add(2, ex.guess[0].as_deref(), &ex.chosen);
        t.add(3, ex.guess[1].as_deref(), &ex.chosen);
        t.add(4, ex.prev_token.as_deref(), &ex.chosen);
    }
    t
}

/// (training examples, held-out examples): each run's first part and its
/// last `holdout` share.
fn split(runs: &[Vec<Example>], holdout: f64) -> (Vec<&Example>, Vec<&Example>) {
    let (mut train, mut held) = (Vec::new(), Vec::new());
    for ex in runs {
        let cut = ((ex.len() as f64) * (1.0 - holdout)).ceil() as usize;
        train.extend(ex[..cut.min(ex.len())].iter());
        held.extend(ex[cut.min(ex.len())..].iter());
    }
    (train, held)
}

/// The outcome of [`train`]: the predictor, recall per layer, recall over
/// all layers.
pub type Trained = (Predictor, Vec<Recall>, Recall);

/// Trains a predictor on `runs` (one model's traces) and measures it.
/// Refused (before anything is sized by it) when a layer has more experts
/// than a predictor holds ([`crate::store::predictor::EXPERTS_MAX`]).
pub fn train(runs: &[Run], o: &TrainOptions) -> Result<Trained, String> {
    let moe: Vec<usize> = runs.first().map_or(Vec::new(), |r| {
        (0..r.layers.len())
            .filter(|&l| !r.layers[l].fetches.is_empty())
            .collect()
    });
    let (mut layers, mut per_layer, mut total) = (Vec::new(), Vec::new(), Tally::default());
    let (mut train_n, mut held_n) = (0, 0);
    for w in moe.windows(2) {
        let (prev, cur) = (w[0], w[1]);
        let per_run: Vec<Vec<Example>> = runs
            .iter()
            .filter(|r| r.layers.len() > cur)
            .map(|r| examples(&r.layers[prev], &r.layers[cur]))
            .collect();
        let (train, held) = split(&per_run, o.holdout);
        let Some(k) = train.first().map(|e| e.chosen.len()) else {
            continue;
        };
        let shape = |l: usize| runs[0].layers[l].n_experts;
        if let Some(l) = [prev, cur].into_iter().find(|&l| shape(l) > EXPERTS_MAX) {
            return Err(format!(
                "layer {l} has {} experts; a predictor holds at most {EXPERTS_MAX} a layer",
                shape(l)
            ));
        }
        let blank = LayerPredictor::blank(cur, prev, (shape(cur), shape(prev), k.min(shape(cur))));
        let (mut full, mut bare) = (blank.clone(), blank);
        fit(&mut full, &train, true, o);
        fit(&mut bare, &train, false, o);
        let t = score(&full, &bare, &held);
        total.merge(&t);
        (train_n, held_n) = (train_n + train.len(), held_n + held.len());
        per_layer.push(t.recall(Some(cur), (train.len(), held.len())));
        layers.push(full);
    }
    let predictor = Predictor {
        version: VERSION,
        layers,
    };
    Ok((predictor, per_layer, total.recall(None, (train_n, held_n))))
}
