//! Grouped-query attention (GQA; MHA when kv_heads == heads) with a KV
//! cache: q/k/v projections (optional biases), each family's q/k norm,
//! optional clipping, RoPE, causal softmax attention in f32, output
//! projection.

use super::norm::{rms_norm, rms_norm_rows};
use super::rope::Rope;
use super::Rows;
use crate::formats::config::{ModelConfig, QkNorm};
use crate::formats::tensor::Mat;
use crate::kernels::f32::dot;
use crate::layers::scratch::Scratch;
use crate::layers::tap::{self, Part};
use crate::model::kv::LayerKv;
use std::ops::Range;

/// One layer's attention weights.
pub struct Attention {
    /// (heads * head_dim, hidden)
    pub wq: Mat,
    /// (kv_heads * head_dim, hidden)
    pub wk: Mat,
    /// (kv_heads * head_dim, hidden)
    pub wv: Mat,
    /// (hidden, heads * head_dim)
    pub wo: Mat,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub bo: Option<Vec<f32>>,
    /// head_dim (PerHead) or heads*head_dim (Whole).
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// Attend only to the last `w` positions (sliding-window layers).
    pub window: Option<usize>,
}

/// Shapes and switches shared by every layer's attention.
pub struct AttentionShape {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub qk_norm: QkNorm,
    pub clip_qkv: Option<f32>,
    pub eps: f64,
    pub rope: Rope,
}

impl AttentionShape {
    /// From the model config.
    pub fn new(cfg: &ModelConfig) -> AttentionShape {
        AttentionShape {
            hidden: cfg.hidden_size,
            heads: cfg.num_heads,
            kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
            qk_norm: cfg.qk_norm,
            clip_qkv: cfg.clip_qkv,
            eps: cfg.rms_norm_eps,
            rope: Rope::new(&cfg.rope),
        }
    }
}

/// Adds `bias` to each row of `rows` (no-op for `None`).
pub fn add_bias(rows: &mut [f32], bias: &Option<Vec<f32>>) {
    if let Some(b) = bias {
        for row in rows.chunks_exact_mut(b.len()) {
            for (r, bv) in row.iter_mut().zip(b) {
                *r += bv;
            }
        }
    }
}

fn norm_heads(x: &mut [f32], w: &[f32], eps: f64) {
    let mut tmp = Scratch::zeroed(w.len());
    for head in x.chunks_exact_mut(w.len()) {
        rms_norm(head, w, eps, &mut tmp);
        head.copy_from_slice(&tmp);
    }
}

impl Attention {
    /// Attends `rows.n` new rows of `x` `(n, hidden)` stored at cache rows
    /// `start..start+n` (RoPE positions `rope_offset + start..`), appending
    /// their keys/values to `kv`; writes `(n, hidden)`.
    pub fn forward(
        &self,
        s: &AttentionShape,
        x: &[f32],
        rows: Rows,
        kv: &mut LayerKv,
        out: &mut [f32],
    ) {
        let Rows {
            n,
            start,
            rope_offset,
            ..
        } = rows;
        let LayerKv::Gqa { k: kc, v: vc } = kv else {
            panic!("GQA attention given a non-GQA cache layer");
        };
        let (qd, kd) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
        let mut q = Scratch::zeroed(n * qd); // (n, heads * head_dim)
        let mut k = Scratch::zeroed(n * kd); // (n, kv_heads * head_dim)
        let mut v = Scratch::zeroed(n * kd); // (n, kv_heads * head_dim)
        self.wq.matmul(x, n, &mut q);
        self.wk.matmul(x, n, &mut k);
        self.wv.matmul(x, n, &mut v);
        add_bias(&mut q, &self.bq);
        add_bias(&mut k, &self.bk);
        add_bias(&mut v, &self.bv);
        match (s.qk_norm, &self.q_norm, &self.k_norm) {
            (QkNorm::Whole, Some(qn), Some(kn)) => {
                rms_norm_rows(&mut q, qn, s.eps);
                rms_norm_rows(&mut k, kn, s.eps);
            }
            (QkNorm::PerHead, Some(qn), Some(kn)) => {
                norm_heads(&mut q, qn, s.eps);
                norm_heads(&mut k, kn, s.eps);
            }
            _ => {}
        }
        if let Some(c) = s.clip_qkv {
            for t in q.iter_mut().chain(k.iter_mut()).chain(v.iter_mut()) {
                *t = t.clamp(-c, c);
            }
        }
        for t in 0..n {
            let pos = rope_offset + start + t;
            s.rope
                .apply_heads(&mut q[t * qd..(t + 1) * qd], s.head_dim, 0, pos);
            s.rope
                .apply_heads(&mut k[t * kd..(t + 1) * kd], s.head_dim, 0, pos);
        }
        kc[start * kd..(start + n) * kd].copy_from_slice(&k);
        vc[start * kd..(start + n) * kd].copy_from_slice(&v);
        let mut ctx = Scratch::zeroed(n * qd); // (n, heads * head_dim)
        for t in 0..n {
            let q_row = &q[t * qd..(t + 1) * qd];
            let len = start + t + 1;
            let first = self.window.map_or(0, |w| len.saturating_sub(w));
            attend(s, q_row, kc, vc, first..len, &mut ctx[t * qd..(t + 1) * qd]);
        }
        tap::record(Part::AttnOut, &ctx, qd);
        self.wo.matmul(&ctx, n, out);
        add_bias(out, &self.bo);
    }
}

/// Attention of one query row over the cached positions `span`.
fn attend(
    s: &AttentionShape,
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    span: Range<usize>,
    ctx: &mut [f32],
) {
    let (d, kd) = (s.head_dim, s.kv_heads * s.head_dim);
    let group = s.heads / s.kv_heads;
    let scale = 1.0 / (d as f32).sqrt();
    let mut scores = Scratch::zeroed(span.len());
    for h in 0..s.heads {
        let kvh = h / group;
        let qh = &q[h * d..(h + 1) * d];
        for (p, sc) in span.clone().zip(scores.iter_mut()) {
            *sc = dot(qh, &kc[p * kd + kvh * d..p * kd + (kvh + 1) * d]) * scale;
        }
        softmax(&mut scores);
        let out = &mut ctx[h * d..(h + 1) * d];
        out.fill(0.0);
        for (p, w) in span.clone().zip(&scores) {
            let vp = &vc[p * kd + kvh * d..p * kd + (kvh + 1) * d];
            for (o, vv) in out.iter_mut().zip(vp) {
                *o += w * vv;
            }
        }
    }
}

/// In-place numerically stable softmax in f32.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}
