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
    ///
    /// The pipeline: route every token → look the union of experts up in the
    /// cache → submit every miss at once (prefetched ones are taken or
    /// promoted) → compute the hits while the reads fly → compute each miss
    /// as it lands → sum outputs in expert order (so the result does not
    /// depend on what was cached or when reads completed). Without
    /// pipelining, every read lands before any expert computes.
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
        // expert -> [(token, weight)], in expert order as transformers sums them.
        let mut users: BTreeMap<usize, Vec<(usize, f32)>> = BTreeMap::new();
        for t in 0..n {
            let r = self.router.route(&x[t * h..(t + 1) * h]);
            store.record_usage(layer, &r.experts);
            if n == 1 {
                store.score_predictions(layer, &r.experts);
            }
            for (e, w) in r.experts.into_iter().zip(r.weights) {
                users.entry(e).or_default().push((t, w));
            }
        }
        let ids: Vec<usize> = users.keys().copied().collect();
        let tokens: Vec<&[(usize, f32)]> = users.values().map(Vec::as_slice).collect();
        let (cached, mut pending) = store.begin(layer, &ids)?;
        let mut ys: Vec<Vec<f32>> = vec![Vec::new(); ids.len()]; // per expert (m, hidden)
        let mut apply = |e: usize, expert: &Mlp| {
            let i = ids
                .binary_search(&e)
                .expect("fetched experts were asked for");
            let start = Instant::now();
            ys[i] = apply_expert(expert, x, h, tokens[i]);
            prof.expert_matmul += start.elapsed();
        };
        if store.schedule.pipeline {
            // Hits compute while the misses are read; each miss computes as
            // it lands.
            for (&e, m) in ids.iter().zip(&cached) {
                if let Some(m) = m {
                    apply(e, m);
                }
            }
            while let Some((e, m)) = pending.next_expert()? {
                apply(e, &m);
            }
        } else {
            // Reads and compute never overlap: each wave of reads lands
            // before its experts (and, after the first, the hits) compute.
            let mut hits_done = false;
            loop {
                let wave = pending.next_wave()?;
                if !hits_done {
                    for (&e, m) in ids.iter().zip(&cached) {
                        if let Some(m) = m {
                            apply(e, m);
                        }
                    }
                    hits_done = true;
                }
                if wave.is_empty() {
                    break;
                }
                for (e, m) in wave {
                    apply(e, &m);
                }
            }
        }
        pending.finish();
        out.fill(0.0);
        for (toks, y) in tokens.iter().zip(&ys) {
            for (k, (t, w)) in toks.iter().enumerate() {
                for (o, yv) in out[t * h..(t + 1) * h]
                    .iter_mut()
                    .zip(&y[k * h..(k + 1) * h])
                {
                    *o += yv * w;
                }
            }
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

/// Runs `expert` on the rows of `x` listed in `toks`, `(toks.len(), hidden)`.
fn apply_expert(expert: &Mlp, x: &[f32], h: usize, toks: &[(usize, f32)]) -> Vec<f32> {
    let m = toks.len();
    let mut xs = vec![0f32; m * h]; // (m, hidden) gathered rows
    for (i, (t, _)) in toks.iter().enumerate() {
        xs[i * h..(i + 1) * h].copy_from_slice(&x[t * h..(t + 1) * h]);
    }
    let mut ys = vec![0f32; m * h]; // (m, hidden)
    expert.forward(&xs, m, &mut ys);
    ys
}
