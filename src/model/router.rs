//! Routers: which experts each token goes to, and with what weight.
//!
//! - Softmax top-k (Qwen, Mixtral, OLMoE): softmax over all experts in f32,
//!   the k largest, renormalized if `norm_topk_prob`.
//! - Sigmoid group-limited (DeepSeek-V3 `noaux_tc`, GLM): s = sigmoid(logit);
//!   choice = s + e_score_correction_bias; each group scores the sum of its
//!   two best choices; the best `topk_group` groups stay; top-k by choice
//!   among them; weights are the unbiased s of the winners, divided by their
//!   sum (+1e-20) if `norm_topk_prob`, times `routed_scaling_factor`.
//!
//! Opt-in cache-aware routing ([`Lean`]) multiplies the selection score of
//! each expert the cache holds by 1 + λ (before the groups for sigmoid
//! routers); the weights stay the winners' own scores, as the correction
//! bias changes selection only. Off, routing is exactly transformers'.

use super::attention::softmax;
use crate::formats::config::RouterKind;
use crate::kernels::f32::matvec;
use crate::layers::scratch::{self, Scratch};

/// The experts chosen for one token and their weights, best first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Route {
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
    /// The top-k margin: the k-th chosen expert's routing score less the
    /// best unchosen one's (softmax probability; sigmoid score plus
    /// correction bias, groups applied); +inf when none was left out.
    pub margin: f32,
    /// Chosen experts that exact routing would not have chosen (always 0
    /// without [`Lean`]).
    pub moved: usize,
}

/// Cache-aware routing: lean selection toward the experts a cache holds.
#[derive(Clone, Copy, Debug)]
pub struct Lean<'a> {
    /// Per expert, whether the layer's cache holds it.
    pub cached: &'a [bool],
    /// λ ≥ 0: a cached expert's selection score is multiplied by 1 + λ.
    pub lambda: f32,
}

impl Lean<'_> {
    /// Leans selection scores in place: cached experts' times 1 + λ.
    fn boost(&self, scores: &mut [f32]) {
        for (s, &held) in scores.iter_mut().zip(self.cached) {
            if held {
                *s *= 1.0 + self.lambda;
            }
        }
    }
}

/// Of `chosen`, those not in `exact`.
fn moved(chosen: &[usize], exact: &[usize]) -> usize {
    chosen.iter().filter(|e| !exact.contains(e)).count()
}

/// One MoE layer's router.
pub struct Router {
    /// (num_experts, hidden)
    pub weight: Vec<f32>,
    /// (num_experts,) — sigmoid routers only.
    pub correction_bias: Option<Vec<f32>>,
    pub kind: RouterKind,
    pub num_experts: usize,
    pub top_k: usize,
}

impl Router {
    /// Routes one token's normed hidden state `x`.
    pub fn route(&self, x: &[f32]) -> Route {
        let mut r = Route {
            experts: Vec::with_capacity(self.top_k),
            weights: Vec::with_capacity(self.top_k),
            margin: 0.0,
            moved: 0,
        };
        self.route_into(x, None, &mut r);
        r
    }

    /// [`Router::route`] into `out`, reusing its vectors (and scratch
    /// buffers): no allocation once they have grown. With `lean`, selection
    /// leans toward cached experts ([`Lean`]; lossy, opt-in).
    pub fn route_into(&self, x: &[f32], lean: Option<Lean>, out: &mut Route) {
        assert!(
            lean.is_none_or(|l| l.cached.len() == self.num_experts),
            "one cached flag per expert"
        );
        let mut logits = Scratch::zeroed(self.num_experts);
        matvec(&self.weight, self.num_experts, x.len(), x, &mut logits);
        match self.kind {
            RouterKind::SoftmaxTopK { norm_topk_prob } => {
                self.softmax_route(&mut logits, norm_topk_prob, lean, out)
            }
            RouterKind::SigmoidGrouped {
                n_group,
                topk_group,
                norm_topk_prob,
                routed_scaling_factor,
            } => self.sigmoid_route(
                &logits,
                (n_group, topk_group),
                norm_topk_prob,
                routed_scaling_factor,
                lean,
                out,
            ),
        }
    }

    fn softmax_route(&self, probs: &mut [f32], norm: bool, lean: Option<Lean>, out: &mut Route) {
        softmax(probs);
        out.moved = 0;
        match lean {
            None => out.margin = top_k_margin_into(probs, self.top_k, &mut out.experts),
            Some(lean) => scratch::with_vec::<usize, _>(|exact| {
                top_k_into(probs, self.top_k, exact);
                let mut choice = Scratch::zeroed(probs.len());
                choice.copy_from_slice(probs);
                lean.boost(&mut choice);
                out.margin = top_k_margin_into(&choice, self.top_k, &mut out.experts);
                out.moved = moved(&out.experts, exact);
            }),
        }
        out.weights.clear();
        out.weights.extend(out.experts.iter().map(|&e| probs[e]));
        if norm {
            let sum: f32 = out.weights.iter().sum();
            for w in &mut out.weights {
                *w /= sum;
            }
        }
    }

    fn sigmoid_route(
        &self,
        logits: &[f32],
        (n_group, topk_group): (usize, usize),
        norm: bool,
        scale: f32,
        lean: Option<Lean>,
        out: &mut Route,
    ) {
        let mut scores = Scratch::zeroed(logits.len());
        for (s, l) in scores.iter_mut().zip(logits) {
            *s = 1.0 / (1.0 + (-l).exp());
        }
        let groups = (n_group, topk_group);
        out.moved = 0;
        match lean {
            None => out.margin = self.sigmoid_select(&scores, groups, &mut out.experts),
            Some(lean) => scratch::with_vec::<usize, _>(|exact| {
                self.sigmoid_select(&scores, groups, exact);
                let mut leaned = Scratch::zeroed(scores.len());
                leaned.copy_from_slice(&scores);
                lean.boost(&mut leaned);
                out.margin = self.sigmoid_select(&leaned, groups, &mut out.experts);
                out.moved = moved(&out.experts, exact);
            }),
        }
        out.weights.clear();
        out.weights.extend(out.experts.iter().map(|&e| scores[e]));
        if norm {
            let denom = out.weights.iter().sum::<f32>() + 1e-20;
            for w in &mut out.weights {
                *w /= denom;
            }
        }
        for w in &mut out.weights {
            *w *= scale;
        }
    }

    /// Sigmoid selection from scores (the correction bias added, groups
    /// applied) into `out`; returns the top-k margin.
    fn sigmoid_select(
        &self,
        scores: &[f32],
        (n_group, topk_group): (usize, usize),
        out: &mut Vec<usize>,
    ) -> f32 {
        let mut choice = Scratch::zeroed(scores.len());
        match self.correction_bias.as_deref() {
            Some(b) => {
                for ((c, s), b) in choice.iter_mut().zip(scores.iter()).zip(b) {
                    *c = s + b;
                }
            }
            None => choice.copy_from_slice(scores),
        }
        let per_group = self.num_experts / n_group;
        let mut group_scores = Scratch::zeroed(n_group);
        for (gs, g) in group_scores.iter_mut().zip(choice.chunks_exact(per_group)) {
            *gs = top2_sum(g);
        }
        scratch::with_vec::<usize, _>(|kept| {
            top_k_into(&group_scores, topk_group, kept);
            for (g, chunk) in choice.chunks_exact_mut(per_group).enumerate() {
                if !kept.contains(&g) {
                    chunk.fill(f32::NEG_INFINITY);
                }
            }
        });
        top_k_margin_into(&choice, self.top_k, out)
    }
}

/// The sum of a group's two best values, best first (one value for a group
/// of one), as `top_k(g, 2)` would pick them.
fn top2_sum(g: &[f32]) -> f32 {
    let best = |skip: Option<usize>| {
        (0..g.len())
            .filter(|&i| Some(i) != skip)
            .min_by(|&a, &b| g[b].total_cmp(&g[a]).then(a.cmp(&b)))
    };
    let first = best(None);
    let second = first.and_then(|f| best(Some(f)));
    [first, second].into_iter().flatten().map(|i| g[i]).sum()
}

/// Indices of the `k` largest values, largest first; ties go to the lower index.
pub fn top_k(v: &[f32], k: usize) -> Vec<usize> {
    let mut out = Vec::with_capacity(v.len());
    top_k_into(v, k, &mut out);
    out
}

/// [`top_k`] into `out` (cleared first; no allocation once it can hold
/// `v.len()` indices). The order is total, so an unstable sort gives the
/// same result as a stable one.
pub fn top_k_into(v: &[f32], k: usize, out: &mut Vec<usize>) {
    top_k_margin_into(v, k, out);
}

/// [`top_k_into`], returning the margin: the k-th largest value less the
/// (k+1)-th (+inf when there is no (k+1)-th, or k is 0).
pub fn top_k_margin_into(v: &[f32], k: usize, out: &mut Vec<usize>) -> f32 {
    out.clear();
    out.extend(0..v.len());
    out.sort_unstable_by(|&a, &b| v[b].total_cmp(&v[a]).then(a.cmp(&b)));
    let margin = match (k.checked_sub(1).and_then(|i| out.get(i)), out.get(k)) {
        (Some(&kth), Some(&next)) => v[kth] - v[next],
        _ => f32::INFINITY,
    };
    out.truncate(k);
    margin
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_orders_and_breaks_ties_low_first() {
        assert_eq!(top_k(&[0.1, 0.5, 0.5, 0.2], 3), vec![1, 2, 3]);
    }

    #[test]
    fn the_margin_is_the_kth_less_the_next() {
        let mut out = Vec::new();
        // (values, k, margin)
        let table: [(&[f32], usize, f32); 4] = [
            (&[0.1, 0.5, 0.25, 0.2], 2, 0.05),
            (&[0.1, 0.5, 0.5, 0.2], 1, 0.0),
            (&[0.1, 0.5], 2, f32::INFINITY),
            (&[0.1, 0.5], 0, f32::INFINITY),
        ];
        for (v, k, want) in table {
            let m = top_k_margin_into(v, k, &mut out);
            assert!((m - want).abs() < 1e-6 || m == want, "{v:?} k={k}: {m}");
            assert_eq!(out, top_k(v, k));
        }
    }

    #[test]
    fn softmax_route_renormalizes_when_asked() {
        let r = Router {
            weight: vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0],
            correction_bias: None,
            kind: RouterKind::SoftmaxTopK {
                norm_topk_prob: true,
            },
            num_experts: 3,
            top_k: 2,
        };
        let route = r.route(&[2.0, 0.0]);
        assert_eq!(route.experts, vec![0, 2]);
        assert!((route.weights.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }

    /// Leaning toward cached experts: (probabilities via identity logits,
    /// cached, λ) → (experts, moved). Weights stay the unleaned softmax.
    #[test]
    fn softmax_leans_toward_cached_experts_within_lambda() {
        let r = Router {
            weight: (0..16).map(|i| f32::from(i % 5 == 0)).collect(),
            correction_bias: None,
            kind: RouterKind::SoftmaxTopK {
                norm_topk_prob: false,
            },
            num_experts: 4,
            top_k: 2,
        };
        // logits 2.0, 1.9, 1.0, 0.0: probabilities ≈ .415, .376, .153, .056.
        let x = [2.0f32, 1.9, 1.0, 0.0];
        let exact = r.route(&x);
        let table: [(&[bool], f32, &[usize], usize); 5] = [
            (&[false; 4], 5.0, &[0, 1], 0),
            (&[false, false, true, false], 0.0, &[0, 1], 0),
            (&[false, false, true, false], 1.0, &[0, 1], 0),
            (&[false, false, true, false], 2.0, &[2, 0], 1),
            (&[false, false, true, true], 9.0, &[2, 3], 2),
        ];
        for (cached, lambda, want, moved) in table {
            let mut route = Route::default();
            r.route_into(&x, Some(Lean { cached, lambda }), &mut route);
            assert_eq!(route.experts, want, "{cached:?} λ={lambda}");
            assert_eq!(route.moved, moved, "{cached:?} λ={lambda}");
            for (e, w) in route.experts.iter().zip(&route.weights) {
                let i = exact.experts.iter().position(|x| x == e);
                if let Some(i) = i {
                    assert_eq!(*w, exact.weights[i], "unleaned weight");
                }
            }
        }
    }

    /// 4 experts in 2 groups; the bias favours expert 3 for choice, but the
    /// weight is its unbiased score; group 0 is dropped by topk_group = 1.
    #[test]
    fn sigmoid_route_limits_groups_and_weights_by_unbiased_score() {
        // logits = identity rows: expert e's logit is x[e].
        let mut weight = vec![0f32; 16];
        for e in 0..4 {
            weight[e * 4 + e] = 1.0;
        }
        let r = Router {
            weight,
            correction_bias: Some(vec![0.0, 0.0, 0.0, 0.5]),
            kind: RouterKind::SigmoidGrouped {
                n_group: 2,
                topk_group: 1,
                norm_topk_prob: false,
                routed_scaling_factor: 2.0,
            },
            num_experts: 4,
            top_k: 2,
        };
        let x = [3.0f32, 2.9, 0.0, 0.1];
        let route = r.route(&x);
        // group 0 choice sum ≈ 0.953 + 0.948; group 1 ≈ 0.5 + 1.025 → group 0 wins.
        assert_eq!(route.experts, vec![0, 1]);
        let s0 = 1.0 / (1.0 + (-3.0f32).exp());
        assert!((route.weights[0] - 2.0 * s0).abs() < 1e-6);
        // With a large bias the other group wins and the weight stays unbiased.
        let r2 = Router {
            correction_bias: Some(vec![0.0, 0.0, 0.0, 2.0]),
            ..r
        };
        let route = r2.route(&x);
        assert_eq!(route.experts, vec![3, 2]);
        let s3 = 1.0 / (1.0 + (-0.1f32).exp());
        assert!((route.weights[0] - 2.0 * s3).abs() < 1e-6);
    }
}
