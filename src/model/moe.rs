//! The sparse MoE block: the router picks `top_k` experts per token; the
//! block takes the union of experts over all tokens in the batch, fetches
//! each unique expert once from the [`ExpertStore`], applies it to every
//! token routed to it, and adds the weighted outputs (plus the optional
//! gated shared expert).

use super::mlp::Mlp;
use super::router::Router;
use crate::error::Result;
use crate::kernels::f32::dot;
use crate::profile::Profile;
use crate::store::ExpertStore;
use std::collections::BTreeMap;
use std::time::Instant;

/// A shared expert that every token passes through, optionally gated by
/// `sigmoid(gate · x)` (Qwen2-MoE; DeepSeek/GLM shared experts are ungated).
pub struct SharedExpert {
    pub mlp: Mlp,
    /// (hidden,) — the single row of `shared_expert_gate`.
    pub gate: Option<Vec<f32>>,
}

/// One MoE layer's resident part: the router and the shared expert.
pub struct MoeBlock {
    pub router: Router,
    pub shared: Option<SharedExpert>,
}

impl MoeBlock {
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
            let r = self.router.route(&x[t * h..(t + 1) * h]);
            store.record_usage(layer, &r.experts);
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
