//! The DSA lightning indexer (GLM-5): picks, per query, the `index_topk`
//! past positions attention may look at.
//!
//! Per query row: q = wq_b(q_resid) split into `index_heads` heads of
//! `[rope | nope]` (rope slice first, unlike MLA); one key per position,
//! k = LayerNorm(wk(x)) (with bias, eps 1e-6), same split; interleaved RoPE
//! on both rope slices. score(s) = Σ_h w_h · relu(q_h · k_s / √d), with
//! w = weights_proj(x) / √heads. The top `index_topk` visible positions
//! are kept; when no more than `index_topk` are visible every one is kept,
//! and the selection is `None` so attention runs its dense loop (output
//! bit-identical to dense attention). Keys and scores stay f32.

use super::rope::Rope;
use super::router::top_k_into;
use crate::formats::tensor::Mat;
use crate::kernels::f32::dot;
use crate::layers::scratch::{self, Scratch};

/// Positions each query row may attend to: `None` = every visible one.
pub type Selection = Vec<Option<Vec<usize>>>;

/// One layer's indexer weights.
pub struct Indexer {
    /// (heads * head_dim, q_lora_rank)
    pub wq_b: Mat,
    /// (head_dim, hidden)
    pub wk: Mat,
    /// (head_dim,) LayerNorm weight and bias.
    pub k_norm_w: Vec<f32>,
    pub k_norm_b: Vec<f32>,
    /// (heads, hidden)
    pub weights_proj: Mat,
}

/// Geometry shared by every indexer of a model.
pub struct IndexerShape {
    pub hidden: usize,
    pub q_lora: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub topk: usize,
    /// Interleaved RoPE over the leading `rope_dim` dims of each head.
    pub rope: Rope,
}

/// LayerNorm eps of the indexer key.
const K_NORM_EPS: f64 = 1e-6;

fn layer_norm(x: &mut [f32], w: &[f32], b: &[f32]) {
    let n = x.len() as f64;
    let mean = x.iter().map(|v| *v as f64).sum::<f64>() / n;
    let var = x.iter().map(|v| (*v as f64 - mean).powi(2)).sum::<f64>() / n;
    let inv = 1.0 / (var + K_NORM_EPS).sqrt();
    for ((v, wv), bv) in x.iter_mut().zip(w).zip(b) {
        *v = ((*v as f64 - mean) * inv) as f32 * wv + bv;
    }
}

impl Indexer {
    /// Computes the indexer keys of `n` new rows of `x` `(n, hidden)` and
    /// writes them to `index_k` rows `start..start+n`.
    pub fn write_keys(
        &self,
        sh: &IndexerShape,
        x: &[f32],
        n: usize,
        start: usize,
        rope_offset: usize,
        index_k: &mut [f32],
    ) {
        let d = sh.head_dim;
        let mut k = Scratch::zeroed(n * d); // (n, head_dim)
        self.wk.matmul(x, n, &mut k);
        for (t, row) in k.chunks_exact_mut(d).enumerate() {
            layer_norm(row, &self.k_norm_w, &self.k_norm_b);
            sh.rope.apply_heads(row, d, 0, rope_offset + start + t);
        }
        index_k[start * d..(start + n) * d].copy_from_slice(&k);
    }

    /// The selection of each of `n` query rows at cache rows `start..`,
    /// scoring against `index_k` rows `0..=row` (keys must be written).
    /// With `skip_short`, rows that see no more than `topk` positions are
    /// not scored (`None`: all kept); otherwise they are scored and every
    /// visible position is listed.
    #[allow(clippy::too_many_arguments)]
    pub fn select(
        &self,
        sh: &IndexerShape,
        x: &[f32],
        q_resid: &[f32],
        n: usize,
        start: usize,
        rope_offset: usize,
        index_k: &[f32],
        skip_short: bool,
    ) -> Selection {
        let mut out = Vec::new();
        let at = (n, start, rope_offset, skip_short);
        self.select_into(sh, x, q_resid, at, index_k, &mut out);
        out
    }

    /// [`Indexer::select`] into `out`, reusing its rows' vectors (with a
    /// recycled selection, no allocation once they have grown). `at` is
    /// `(n, start, rope_offset, skip_short)`.
    pub fn select_into(
        &self,
        sh: &IndexerShape,
        x: &[f32],
        q_resid: &[f32],
        (n, start, rope_offset, skip_short): (usize, usize, usize, bool),
        index_k: &[f32],
        out: &mut Selection,
    ) {
        let (h, d) = (sh.heads, sh.head_dim);
        for row in out.drain(n.min(out.len())..) {
            keep_row(row);
        }
        out.resize_with(n, || None);
        if skip_short && start + n <= sh.topk {
            out.iter_mut().for_each(|r| keep_row(r.take()));
            return;
        }
        let mut q = Scratch::zeroed(n * h * d); // (n, heads * head_dim)
        self.wq_b.matmul(q_resid, n, &mut q);
        let mut w = Scratch::zeroed(n * h); // (n, heads)
        self.weights_proj.matmul(x, n, &mut w);
        let w_scale = (h as f32).powf(-0.5);
        let softmax_scale = (d as f32).powf(-0.5);
        // Sized for the whole cache up front, so a growing context never
        // reallocates them.
        let positions_max = index_k.len() / d;
        scratch::with_vec::<f32, _>(|scores| {
            scores.reserve(positions_max);
            for (t, slot) in out.iter_mut().enumerate() {
                let row = start + t;
                if skip_short && row < sh.topk {
                    keep_row(slot.take());
                    continue;
                }
                let qt = &mut q[t * h * d..(t + 1) * h * d];
                sh.rope.apply_heads(qt, d, 0, rope_offset + row);
                scores.clear();
                scores.resize(row + 1, 0f32);
                for (hh, qh) in qt.chunks_exact(d).enumerate() {
                    let wh = w[t * h + hh] * w_scale;
                    for (s, sc) in scores.iter_mut().enumerate() {
                        let r = (dot(qh, &index_k[s * d..(s + 1) * d]) * softmax_scale).max(0.0);
                        *sc += wh * r;
                    }
                }
                // The ranking of every position is one scratch vector; a
                // row keeps only its top-k (a row holding the ranking's
                // capacity would make a pass hold rows x context).
                let keep = slot.get_or_insert_with(spare_row);
                keep.reserve(sh.topk.min(positions_max));
                scratch::with_vec::<usize, _>(|order| {
                    order.reserve(positions_max);
                    top_k_into(scores, sh.topk, order);
                    keep.clear();
                    keep.extend_from_slice(order);
                });
                keep.sort_unstable();
            }
        });
    }
}

thread_local! {
    /// Selections recycled between forwards.
    static SPARE: std::cell::RefCell<Vec<Selection>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Row vectors of rows that became `None`, for later rows.
    static ROWS: std::cell::RefCell<Vec<Vec<usize>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Keeps a dropped row's vector for reuse.
fn keep_row(row: Option<Vec<usize>>) {
    if let Some(mut v) = row {
        v.clear();
        let _ = ROWS.try_with(|r| {
            let mut r = r.borrow_mut();
            if r.len() < 64 {
                r.push(v);
            }
        });
    }
}

/// A row vector (a kept one when there is one).
fn spare_row() -> Vec<usize> {
    ROWS.try_with(|r| r.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// A selection to fill (a recycled one when there is one).
pub fn spare() -> Selection {
    SPARE
        .try_with(|s| s.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Gives a selection back for a later forward.
pub fn recycle(sel: Selection) {
    let _ = SPARE.try_with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < 4 {
            s.push(sel);
        }
    });
}

/// One sequence's DSA selections over a forward, one per sub-chunk of its
/// rows (a layer-major pass attends a sub-chunk at a time): a full indexer
/// layer replaces a sub-chunk's selection, a shared layer reuses it. The
/// first needs no list, so a decode step allocates nothing.
#[derive(Default)]
pub struct Selections {
    first: Option<Selection>,
    rest: Vec<Option<Selection>>,
}

impl Selections {
    /// Sub-chunk `c`'s selection.
    pub fn part(&mut self, c: usize) -> &mut Option<Selection> {
        if c == 0 {
            return &mut self.first;
        }
        if self.rest.len() < c {
            self.rest.resize_with(c, || None);
        }
        &mut self.rest[c - 1]
    }

    /// Gives every selection back for a later forward.
    pub fn recycle(&mut self) {
        let rest = self.rest.drain(..).flatten();
        for sel in self.first.take().into_iter().chain(rest) {
            recycle(sel);
        }
    }
}
