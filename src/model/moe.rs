//! The sparse MoE block: the router picks `top_k` experts per token; the
//! block takes the union of experts over all tokens in the batch, fetches
//! each unique expert once from the [`ExpertStore`], applies it to every
//! token routed to it, and adds the weighted outputs (plus the optional
//! gated shared expert).

use super::attention::softmax;
use super::mlp::Mlp;
use crate::error::Result;
use crate::kernels::f32::{dot, matvec};
use crate::profile::Profile;
use crate::store::ExpertStore;
use std::collections::BTreeMap;
use std::time::Instant;

/// A shared expert that every token passes through, optionally gated by
/// `sigmoid(gate · x)` (Qwen2-MoE).
pub struct SharedExpert {
    pub mlp: Mlp,
    /// (hidden,) — the single row of `shared_expert_gate`.
    pub gate: Option<Vec<f32>>,
}

/// One MoE layer's resident part: the router and the shared expert.
pub struct MoeBlock {
    /// (num_experts, hidden)
    pub router: Vec<f32>,
    pub num_experts: usize,
    pub top_k: usize,
    pub norm_topk_prob: bool,
    pub shared: Option<SharedExpert>,
}

/// The experts chosen for one token and their weights, best first.
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
}

impl MoeBlock {
    /// Softmax over all experts, top-k, renormalized if configured.
    pub fn route(&self, x: &[f32]) -> Route {
        let mut probs = vec![0f32; self.num_experts];
        matvec(&self.router, self.num_experts, x.len(), x, &mut probs);
        softmax(&mut probs);
        let experts = top_k(&probs, self.top_k);
        let mut weights: Vec<f32> = experts.iter().map(|&e| probs[e]).collect();
        if self.norm_topk_prob {
            let sum: f32 = weights.iter().sum();
            for w in &mut weights {
                *w /= sum;
            }
        }
        Route { experts, weights }
    }

    /// Applies the block to `n` rows of `x` `(n, hidden)`, writing `(n, hidden)`.
    pub fn forward(
        &self,
        layer: usize,
        store: &ExpertStore,
        x: &[f32],
        n: usize,
        prof: &mut Profile,
        out: &mut [f32],
    ) -> Result<()> {
        let h = x.len() / n;
        out.fill(0.0);
        // expert -> [(token, weight)], in expert order as transformers sums them.
        let mut users: BTreeMap<usize, Vec<(usize, f32)>> = BTreeMap::new();
        for t in 0..n {
            let r = self.route(&x[t * h..(t + 1) * h]);
            for (e, w) in r.experts.into_iter().zip(r.weights) {
                users.entry(e).or_default().push((t, w));
            }
        }
        for (e, toks) in users {
            let expert = store.get(layer, e)?;
            let start = Instant::now();
            let m = toks.len();
            let mut xs = vec![0f32; m * h]; // (m, hidden) gathered rows
            for (i, (t, _)) in toks.iter().enumerate() {
                xs[i * h..(i + 1) * h].copy_from_slice(&x[t * h..(t + 1) * h]);
            }
            let mut ys = vec![0f32; m * h]; // (m, hidden)
            expert.forward(&xs, m, &mut ys);
            for (i, (t, w)) in toks.iter().enumerate() {
                for (o, y) in out[t * h..(t + 1) * h]
                    .iter_mut()
                    .zip(&ys[i * h..(i + 1) * h])
                {
                    *o += y * w;
                }
            }
            prof.expert_matmul += start.elapsed();
        }
        if let Some(shared) = &self.shared {
            let mut ys = vec![0f32; n * h]; // (n, hidden)
            shared.mlp.forward(x, n, &mut ys);
            for t in 0..n {
                let g = match &shared.gate {
                    Some(gw) => 1.0 / (1.0 + (-dot(gw, &x[t * h..(t + 1) * h])).exp()),
                    None => 1.0,
                };
                for (o, y) in out[t * h..(t + 1) * h]
                    .iter_mut()
                    .zip(&ys[t * h..(t + 1) * h])
                {
                    *o += g * y;
                }
            }
        }
        Ok(())
    }
}

/// Indices of the `k` largest values, largest first; ties go to the lower index.
pub fn top_k(v: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[b].total_cmp(&v[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_orders_and_breaks_ties_low_first() {
        assert_eq!(top_k(&[0.1, 0.5, 0.5, 0.2], 3), vec![1, 2, 3]);
    }

    #[test]
    fn route_renormalizes_when_asked() {
        let block = MoeBlock {
            router: vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0],
            num_experts: 3,
            top_k: 2,
            norm_topk_prob: true,
            shared: None,
        };
        let r = block.route(&[2.0, 0.0]);
        assert_eq!(r.experts, vec![0, 2]);
        assert!((r.weights.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }
}
