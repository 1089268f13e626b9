//! The sparse MoE block: the router picks `top_k` experts per token; the
//! block takes the union of experts over all tokens in the batch, fetches
//! each unique expert once from the [`ExpertStore`], applies it to every
//! token routed to it, and adds the weighted outputs (plus the optional
//! gated shared expert).
//!
//! Each row's outputs are summed in expert order, as transformers sums
//! them. [`MoeBlock::forward`] keeps one output row per (expert, row) pair
//! and sums them at the end, so its experts may land in any order;
//! [`MoeBlock::forward_streamed`] (a long prefill pass) applies the experts
//! in id order and adds each one's rows as soon as they are computed, the
//! same additions in the same order, so it holds no more than one
//! expert's block of rows at a time.

use super::mlp::Mlp;
use super::norm::rms_norm;
use super::router::{Lean, Route, Router};
use crate::error::Result;
use crate::kernels::f32::dot;
use crate::layers::scratch::Scratch;
use crate::layers::tap::Block;
use crate::model::profile::Profile;
use crate::store::{ExpertStore, Routes};
use std::cell::RefCell;
use std::sync::Arc;
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
        // The layer's reusable lists (no allocation once grown); put back
        // when done, so a decode step allocates nothing.
        let mut w = WORK.with(|w| std::mem::take(&mut *w.borrow_mut()));
        let mut shared = None;
        let res = self.routed(layer, store, x, n, prof, out, &mut w, &mut shared);
        w.routes.clear();
        w.cached.clear();
        WORK.with(|slot| *slot.borrow_mut() = w);
        res?;
        if let Some(ys) = shared.or_else(|| self.shared_rows(x, n)) {
            add(out, &ys);
        }
        Ok(())
    }

    /// The routed experts' part of [`MoeBlock::forward`].
    #[allow(clippy::too_many_arguments)]
    fn routed(
        &self,
        layer: usize,
        store: &ExpertStore,
        x: &[f32],
        n: usize,
        prof: &mut Profile,
        out: &mut [f32],
        w: &mut Work,
        shared: &mut Option<Scratch>,
    ) -> Result<()> {
        let h = x.len() / n;
        let lambda = store.schedule.cache_lean;
        if lambda.is_some() {
            store.cached_mask(layer, &mut w.held);
        }
        for t in 0..n {
            let lean = lambda.map(|lambda| Lean {
                cached: &w.held,
                lambda,
            });
            self.router
                .route_into(&x[t * h..(t + 1) * h], lean, &mut w.route);
            let r = &w.route;
            let moved = lean.is_some().then_some(r.moved);
            w.routes.push(&r.experts, &r.weights, r.margin, moved);
        }
        // (expert, token, weight), sorted by expert then token: the order
        // transformers sums them in.
        w.routes.seal();
        let mut pending = store.fetch(layer, &w.routes, &mut w.cached)?;
        let (ids, pairs, cached) = (w.routes.ids(), w.routes.pairs(), &w.cached);
        // Row k holds the output of pair k's expert on pair k's token.
        let mut ys = Scratch::zeroed(pairs.len() * h);
        let routes = &w.routes;
        let mut apply = |e: usize, expert: &Mlp| {
            let std::ops::Range { start: lo, end: hi } = routes.pairs_of(e);
            let start = Instant::now();
            apply_expert(e, expert, x, h, &pairs[lo..hi], &mut ys[lo * h..hi * h]);
            prof.expert_matmul += start.elapsed();
        };
        if store.schedule.pipeline {
            // Hits and the shared expert compute while the misses are read;
            // each miss computes as it lands.
            for (&e, m) in ids.iter().zip(cached) {
                if let Some(m) = m {
                    apply(e, m);
                }
            }
            *shared = self.shared_rows(x, n);
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
                    for (&e, m) in ids.iter().zip(cached) {
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
        for (k, &(_, t, wt)) in pairs.iter().enumerate() {
            for (o, yv) in out[t * h..(t + 1) * h]
                .iter_mut()
                .zip(&ys[k * h..(k + 1) * h])
            {
                *o += yv * wt;
            }
        }
        Ok(())
    }

    /// [`MoeBlock::forward`] over every row of a layer-major pass, with
    /// bounded temporaries: `x`'s rows are normed as they are used (never
    /// all held), the router's decision is kept for every row, and the
    /// experts are applied in id order (hits from the cache, misses read in
    /// id order by [`ExpertStore::fetch_in_order`] and taken as they land,
    /// the reads running ahead while earlier experts compute), each to its
    /// rows `sub` at a time, each block's weighted rows added to `out` at
    /// once: every row gets its experts' outputs added in expert order, as
    /// [`MoeBlock::forward`] adds them, so the sums are the same bits. An
    /// expert is dropped once its rows are done, unless the cache keeps it.
    /// The shared expert follows, `sub` rows at a time.
    pub fn forward_streamed(
        &self,
        layer: usize,
        store: &ExpertStore,
        x: &NormedRows,
        sub: usize,
        prof: &mut Profile,
        out: &mut [f32],
    ) -> Result<()> {
        let mut w = WORK.with(|w| std::mem::take(&mut *w.borrow_mut()));
        let res = self.routed_streamed(layer, store, x, sub, prof, out, &mut w);
        w.routes.clear();
        w.cached.clear();
        WORK.with(|slot| *slot.borrow_mut() = w);
        res?;
        let (n, h) = (x.rows(), x.hidden());
        for lo in (0..n).step_by(sub) {
            let m = sub.min(n - lo);
            let mut xs = Scratch::zeroed(m * h); // (m, hidden) normed rows
            for (i, row) in xs.chunks_exact_mut(h).enumerate() {
                x.row_into(lo + i, row);
            }
            if let Some(ys) = self.shared_rows(&xs, m) {
                add(&mut out[lo * h..(lo + m) * h], &ys);
            }
        }
        Ok(())
    }

    /// The routed experts' part of [`MoeBlock::forward_streamed`].
    #[allow(clippy::too_many_arguments)]
    fn routed_streamed(
        &self,
        layer: usize,
        store: &ExpertStore,
        x: &NormedRows,
        sub: usize,
        prof: &mut Profile,
        out: &mut [f32],
        w: &mut Work,
    ) -> Result<()> {
        let lambda = store.schedule.cache_lean;
        if lambda.is_some() {
            store.cached_mask(layer, &mut w.held);
        }
        let mut row = Scratch::zeroed(x.hidden()); // (hidden) one normed row
        for t in 0..x.rows() {
            x.row_into(t, &mut row);
            let lean = lambda.map(|lambda| Lean {
                cached: &w.held,
                lambda,
            });
            self.router.route_into(&row, lean, &mut w.route);
            let r = &w.route;
            let moved = lean.is_some().then_some(r.moved);
            w.routes.push(&r.experts, &r.weights, r.margin, moved);
        }
        w.routes.seal();
        let mut pending = store.fetch_in_order(layer, &w.routes, &mut w.cached)?;
        out.fill(0.0);
        let overlap = store.schedule.pipeline;
        for (&e, hit) in w.routes.ids().iter().zip(&w.cached) {
            let expert = match hit {
                Some(m) => m.clone(),
                None => pending.take(e, overlap)?,
            };
            let start = Instant::now();
            let pairs = &w.routes.pairs()[w.routes.pairs_of(e)];
            for block in pairs.chunks(sub) {
                add_expert_rows(e, &expert, x, block, out);
            }
            prof.expert_matmul += start.elapsed();
        }
        pending.finish();
        Ok(())
    }

    /// The experts this block's router picks (exact routing) for at most
    /// `rows` of `x`'s rows, spread evenly over them, in id order: a guess,
    /// made before the layer's attention, of the union its routing will
    /// fetch. `experts` is the layer's number of routed experts.
    pub fn guess_union(&self, x: &NormedRows, rows: usize, experts: usize) -> Vec<usize> {
        let n = x.rows();
        let step = n.div_ceil(rows.max(1)).max(1);
        let mut picked = vec![false; experts];
        let mut row = Scratch::zeroed(x.hidden()); // (hidden) one normed row
        let mut route = Route::default();
        for t in (0..n).step_by(step) {
            x.row_into(t, &mut row);
            self.router.route_into(&row, None, &mut route);
            for &e in &route.experts {
                if let Some(p) = picked.get_mut(e) {
                    *p = true;
                }
            }
        }
        (0..experts).filter(|&e| picked[e]).collect()
    }

    /// The shared expert's output rows `(n, hidden)`, gated where it has a
    /// gate; `None` without a shared expert. Added to the routed sum last,
    /// whenever it was computed, so the result does not depend on when.
    fn shared_rows(&self, x: &[f32], n: usize) -> Option<Scratch> {
        let shared = self.shared.as_ref()?;
        let h = x.len() / n;
        let mut ys = Scratch::zeroed(n * h);
        shared.mlp.forward(Block::Shared, x, n, &mut ys);
        if let Some(gw) = &shared.gate {
            for (xr, yr) in x.chunks_exact(h).zip(ys.chunks_exact_mut(h)) {
                let g = 1.0 / (1.0 + (-dot(gw, xr)).exp());
                yr.iter_mut().for_each(|y| *y *= g);
            }
        }
        Some(ys)
    }
}

fn add(out: &mut [f32], ys: &[f32]) {
    for (o, y) in out.iter_mut().zip(ys) {
        *o += y;
    }
}

/// The lists one MoE forward reuses.
#[derive(Default)]
struct Work {
    route: Route,
    /// The layer's routing decision, as the store takes it.
    routes: Routes,
    cached: Vec<Option<Arc<Mlp>>>,
    /// Per expert, whether the layer's cache holds it (cache-aware routing).
    held: Vec<bool>,
}

thread_local! {
    static WORK: RefCell<Work> = RefCell::new(Work::default());
}

/// Runs `expert` (routed expert `e`) on the tokens of `pairs` (its rows of
/// `x`), writing one `(hidden)` row per pair into `ys`.
fn apply_expert(
    e: usize,
    expert: &Mlp,
    x: &[f32],
    h: usize,
    pairs: &[(usize, usize, f32)],
    ys: &mut [f32],
) {
    let m = pairs.len();
    let mut xs = Scratch::zeroed(m * h); // (m, hidden) gathered rows
    for (i, &(_, t, _)) in pairs.iter().enumerate() {
        xs[i * h..(i + 1) * h].copy_from_slice(&x[t * h..(t + 1) * h]);
    }
    expert.forward(Block::Expert(e as u32), &xs, m, ys);
}

/// The rows of `x` `(n, hidden)` normed by `weight`, one at a time: what a
/// layer-major pass's MoE reads instead of holding every normed row.
pub struct NormedRows<'a> {
    pub x: &'a [f32],
    /// (hidden,)
    pub weight: &'a [f32],
    pub eps: f64,
}

impl NormedRows<'_> {
    /// Width of a row.
    pub fn hidden(&self) -> usize {
        self.weight.len()
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.x.len() / self.hidden()
    }

    /// Row `t`, normed, into `out` `(hidden)`.
    pub fn row_into(&self, t: usize, out: &mut [f32]) {
        let h = self.hidden();
        rms_norm(&self.x[t * h..(t + 1) * h], self.weight, self.eps, out);
    }
}

/// Runs routed expert `e` on the rows of `pairs` (normed as gathered) and
/// adds each output row, times its weight, to its row of `out`.
fn add_expert_rows(
    e: usize,
    expert: &Mlp,
    x: &NormedRows,
    pairs: &[(usize, usize, f32)],
    out: &mut [f32],
) {
    let (m, h) = (pairs.len(), x.hidden());
    let mut xs = Scratch::zeroed(m * h); // (m, hidden) gathered rows
    for (i, &(_, t, _)) in pairs.iter().enumerate() {
        x.row_into(t, &mut xs[i * h..(i + 1) * h]);
    }
    let mut ys = Scratch::zeroed(m * h); // (m, hidden)
    expert.forward(Block::Expert(e as u32), &xs, m, &mut ys);
    for (k, &(_, t, wt)) in pairs.iter().enumerate() {
        for (o, yv) in out[t * h..(t + 1) * h]
            .iter_mut()
            .zip(&ys[k * h..(k + 1) * h])
        {
            *o += yv * wt;
        }
    }
}
