//! Grouped-query attention (GQA; MHA when kv_heads == heads) with a KV
//! cache: q/k/v projections (optional biases), each family's q/k norm,
//! optional clipping, RoPE, causal softmax attention in f32, output
//! projection.

use super::norm::{rms_norm, rms_norm_rows};
use super::rope::Rope;
use super::Rows;
use crate::formats::config::{ModelConfig, QkNorm};
use crate::formats::tensor::Mat;
use crate::kernels::{attn, par_row_groups};
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
        let (kc, vc, q) = (&*kc, &*vc, &*q);
        // Rows are independent (each its own arithmetic, in its order), so
        // a prefill's rows spread over the kernel pool in groups that share
        // each cached key and value they read (at 16k positions attention
        // is most of a prefill, and it streams the cache).
        let span = |t: usize| {
            let len = start + t + 1;
            self.window.map_or(0, |w| len.saturating_sub(w))..len
        };
        let panels = HeadPanels::build(s, (kc, vc), span(0).start..start + n);
        let macs = 2 * n * (start + n) * qd;
        par_row_groups(&mut ctx, (qd, ROW_GROUP), macs, |t0, ctx_rows| {
            let m = ctx_rows.len() / qd;
            let spans: [Range<usize>; ROW_GROUP] = std::array::from_fn(|i| span(t0 + i.min(m - 1)));
            let q_rows = &q[t0 * qd..(t0 + m) * qd];
            attend_rows(s, q_rows, &panels, &spans[..m], ctx_rows);
        });
        tap::record(Part::AttnOut, &ctx, qd);
        self.wo.matmul(&ctx, n, out);
        add_bias(out, &self.bo);
    }
}

/// Query rows one task attends together: each cached key and value is
/// read once for all of them.
const ROW_GROUP: usize = 16;

/// Every KV head's cached keys and values over the positions a forward's
/// rows attend, laid out once for all of its rows: the keys transposed
/// into a panel of [`attn::BLOCK`]-position blocks, the values copied out
/// of the cache's interleaved heads into one contiguous run (its stride of
/// all heads defeats the prefetchers). The positions start at a block
/// boundary, so a row group's span begins at a whole block of the panel.
struct HeadPanels {
    /// `kv_heads` panels of `(blocks, head_dim, BLOCK)` keys.
    keys: Scratch,
    /// `kv_heads` runs of `(positions, head_dim)` values.
    values: Scratch,
    /// The cached positions held, from a block boundary.
    positions: Range<usize>,
    head_dim: usize,
}

impl HeadPanels {
    /// The panels of cached positions `positions` (the start rounded down
    /// to a block), one KV head a task on the kernel pool.
    fn build(
        s: &AttentionShape,
        (kc, vc): (&[f32], &[f32]),
        positions: Range<usize>,
    ) -> HeadPanels {
        let (d, kd) = (s.head_dim, s.kv_heads * s.head_dim);
        let positions = positions.start / attn::BLOCK * attn::BLOCK..positions.end;
        let n = positions.len();
        let (plen, vlen) = (attn::panel_len(n, d), n * d);
        let mut keys = Scratch::zeroed(s.kv_heads * plen);
        let mut values = Scratch::zeroed(s.kv_heads * vlen);
        let first = positions.start * kd;
        if n > 0 {
            par_row_groups(&mut keys, (plen, 1), n * kd, |h, panel| {
                let part = attn::KeyPart {
                    keys: &kc[first + h * d..],
                    stride: kd,
                    width: d,
                };
                attn::fill_panel(&[part], n, panel);
            });
            par_row_groups(&mut values, (vlen, 1), n * kd, |h, run| {
                for (j, row) in run.chunks_exact_mut(d).enumerate() {
                    row.copy_from_slice(&vc[first + j * kd + h * d..][..d]);
                }
            });
        }
        HeadPanels {
            keys,
            values,
            positions,
            head_dim: d,
        }
    }

    /// KV head `h`'s key panel and values from cached position `from` (a
    /// block boundary inside the positions held).
    fn head(&self, h: usize, from: usize) -> (&[f32], &[f32]) {
        let (d, n) = (self.head_dim, self.positions.len());
        let skip = from - self.positions.start;
        let (plen, vlen) = (attn::panel_len(n, d), n * d);
        let keys = &self.keys[h * plen..(h + 1) * plen][skip * d..];
        let values = &self.values[h * vlen..(h + 1) * vlen][skip * d..];
        (keys, values)
    }
}

/// Attention of query rows `q (m, heads * head_dim)` over the cached
/// positions `spans[i]` (row `i`'s, inside the positions `panels` hold),
/// into `ctx (m, heads * head_dim)`. Each row gets exactly the arithmetic
/// of attending alone: its scores are the same chains, its softmax runs
/// over its own span, and its output sums the values in position order;
/// only the kernels' tiles interleave the rows (`kernels::attn`). Per KV
/// head, the (row, head) pairs go through in batches of `attn::ROWS_MAX`
/// against the head's panel from the block where the rows' spans begin.
fn attend_rows(
    s: &AttentionShape,
    q: &[f32],
    panels: &HeadPanels,
    spans: &[Range<usize>],
    ctx: &mut [f32],
) {
    let (d, qd) = (s.head_dim, s.heads * s.head_dim);
    let group = s.heads / s.kv_heads;
    let scale = 1.0 / (d as f32).sqrt();
    let end = spans.iter().map(|r| r.end).max().unwrap_or(0);
    let base = spans.iter().map(|r| r.start).min().unwrap_or(0) / attn::BLOCK * attn::BLOCK;
    ctx.fill(0.0);
    if spans.iter().all(|r| r.is_empty()) {
        return;
    }
    let width = (end - base).div_ceil(attn::BLOCK) * attn::BLOCK;
    let mut scores = Scratch::zeroed(attn::ROWS_MAX * width); // (pairs, width)
    let pairs = spans.len() * group;
    for kvh in 0..s.kv_heads {
        let (panel, values) = panels.head(kvh, base);
        for c in (0..pairs).step_by(attn::ROWS_MAX) {
            let count = (pairs - c).min(attn::ROWS_MAX);
            let mut offsets = [0usize; attn::ROWS_MAX];
            let mut rel: [Range<usize>; attn::ROWS_MAX] = std::array::from_fn(|_| 0..0);
            for j in 0..count {
                let (i, h) = ((c + j) / group, kvh * group + (c + j) % group);
                offsets[j] = i * qd + h * d;
                rel[j] = spans[i].start - base..spans[i].end - base;
            }
            let (offsets, rel) = (&offsets[..count], &rel[..count]);
            let lo = rel.iter().map(|r| r.start).min().unwrap_or(0) / attn::BLOCK;
            let hi = rel
                .iter()
                .map(|r| r.end)
                .max()
                .unwrap_or(0)
                .div_ceil(attn::BLOCK);
            let rows = attn::QueryRows { q, offsets, dim: d };
            attn::scores(rows, panel, lo..hi, scale, (&mut scores, width));
            for (j, r) in rel.iter().enumerate() {
                attn::softmax(&mut scores[j * width + r.start..j * width + r.end]);
            }
            let wv = attn::Weighted {
                w: &scores,
                w_stride: width,
                v: values,
                v_stride: d,
                spans: rel,
            };
            attn::weighted_values(wv, (ctx, offsets), d);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::config::{RopeConfig, RopeScaling};

    fn shape(heads: usize, kv_heads: usize, head_dim: usize) -> AttentionShape {
        AttentionShape {
            hidden: heads * head_dim,
            heads,
            kv_heads,
            head_dim,
            qk_norm: QkNorm::None,
            clip_qkv: None,
            eps: 1e-6,
            rope: Rope::new(&RopeConfig {
                theta: 10000.0,
                scaling: RopeScaling::Default,
                rotary_dim: head_dim,
                interleaved: false,
                max_position_embeddings: 4096,
            }),
        }
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32
                    / 8_388_608.0
                    - 1.0
            })
            .collect()
    }

    /// Rows attended together get each row's bits alone, with causal and
    /// windowed spans of different lengths.
    #[test]
    fn rows_attended_together_equal_each_row_alone() {
        let s = shape(4, 2, 8);
        let (qd, kd, positions) = (32, 16, 40);
        let (kc, vc) = (values(positions * kd, 1), values(positions * kd, 2));
        let m = 7;
        let q = values(m * qd, 3);
        for window in [None, Some(5)] {
            let spans: Vec<Range<usize>> = (0..m)
                .map(|i| {
                    let len = 30 + i;
                    window.map_or(0, |w: usize| len - w)..len
                })
                .collect();
            let mut together = vec![f32::NAN; m * qd];
            let all = HeadPanels::build(&s, (&kc, &vc), spans[0].start..positions);
            attend_rows(&s, &q, &all, &spans, &mut together);
            for (i, span) in spans.iter().enumerate() {
                let mut alone = vec![f32::NAN; qd];
                let qi = &q[i * qd..(i + 1) * qd];
                let own = HeadPanels::build(&s, (&kc, &vc), span.clone());
                attend_rows(&s, qi, &own, std::slice::from_ref(span), &mut alone);
                let got = &together[i * qd..(i + 1) * qd];
                assert!(
                    got.iter()
                        .zip(&alone)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "row {i}, window {window:?}"
                );
                assert!(alone.iter().all(|v| v.is_finite()));
            }
        }
    }
}
