//! Multi-head latent attention (DeepSeek-V3, GLM-5) over the compressed
//! cache: per position only the normalized latent (kv_lora_rank) and the
//! rotary key (qk_rope_head_dim) are stored.
//!
//! Query: q_b(rmsnorm(q_a(x))) (or q_proj(x)), each head `[nope | rope]`.
//! Latent: kv_a_proj_with_mqa(x) = `[latent | k_rope]`, latent RMS-normed,
//! k_rope rotated and shared by every head. Two ways to attend, same math:
//!
//! - **explicit** (prefill): reconstruct every position's per-head k_nope
//!   and v with one batched `kv_b` matmul, then ordinary attention;
//! - **absorb** (decode): fold kv_b's key half into the query
//!   (q_lat = W_kbᵀ q_nope), score latents directly, pool latents with the
//!   softmax weights, and project once through kv_b's value half.
//!
//! [`MlaMode::Auto`] picks the cheaper by a multiply-add count for the
//! tokens in flight. An optional DSA [`Indexer`] restricts each query to
//! its selected positions.

use super::attention::add_bias;
use super::dsa::{self, Indexer, IndexerShape, Selection};
use super::norm::rms_norm;
use super::rope::Rope;
use super::Rows;
use crate::formats::config::MlaConfig;
use crate::formats::tensor::Mat;
use crate::kernels::f32::{dot, matmul};
use crate::kernels::{attn, par_row_groups};
use crate::layers::scratch::{self, Scratch};
use crate::layers::tap::{self, Part};
use crate::model::kv::LayerKv;
use std::ops::Range;

/// Eps of q_a_layernorm and kv_a_layernorm (the module default, not rms_norm_eps).
const LORA_NORM_EPS: f64 = 1e-6;

/// How MLA attends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlaMode {
    Absorb,
    Explicit,
    Auto,
}

/// Whether the DSA indexer restricts attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DsaMode {
    /// Always score and select (as transformers does).
    On,
    /// Dense attention; indexer keys are still cached.
    Off,
    /// Select only when a query sees more than index_topk positions (the
    /// same output as `On`, without scoring when everything is kept).
    Auto,
}

/// The low-rank query path.
pub struct QLora {
    /// (q_lora, hidden)
    pub wa: Mat,
    pub ba: Option<Vec<f32>>,
    /// (q_lora,)
    pub norm: Vec<f32>,
    /// (heads * qk_head_dim, q_lora)
    pub wb: Mat,
}

/// One layer's MLA weights.
pub struct MlaAttention {
    pub q_lora: Option<QLora>,
    /// (heads * qk_head_dim, hidden), when there is no q_lora.
    pub wq: Option<Mat>,
    /// (kv_lora + rope, hidden)
    pub wkv_a: Mat,
    pub bkv_a: Option<Vec<f32>>,
    /// (kv_lora,)
    pub kv_a_norm: Vec<f32>,
    /// (heads * (nope + v), kv_lora), f32: the absorbed path reads its
    /// per-head key and value blocks directly.
    pub wkv_b: Vec<f32>,
    /// (hidden, heads * v)
    pub wo: Mat,
    pub bo: Option<Vec<f32>>,
    /// Present on GLM-5 "full" indexer layers.
    pub indexer: Option<Indexer>,
}

/// Geometry and switches shared by every MLA layer.
pub struct MlaShape {
    pub hidden: usize,
    pub heads: usize,
    pub cfg: MlaConfig,
    pub rope: Rope,
    pub mode: MlaMode,
    pub dsa: DsaMode,
    pub indexer: Option<IndexerShape>,
}

impl MlaShape {
    /// Whether `n` queries over `total` positions are cheaper explicitly.
    pub fn explicit_for(&self, n: usize, total: usize) -> bool {
        match self.mode {
            MlaMode::Absorb => false,
            MlaMode::Explicit => true,
            MlaMode::Auto => {
                let c = &self.cfg;
                let (l, h) = (c.kv_lora_rank, self.heads);
                let (nope, rope, v) = (c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim);
                let explicit = total * l * h * (nope + v) + n * total * h * (nope + rope + v);
                let absorb = n * h * (nope * l + total * (2 * l + rope) + l * v);
                explicit < absorb
            }
        }
    }
}

/// Per-query inputs of the attention core, `(n, ·)` each.
struct Queries<'a> {
    /// (n, heads * qk_head_dim), rope already applied.
    q: &'a [f32],
    start: usize,
    sel: &'a [Option<Vec<usize>>],
}

impl MlaAttention {
    /// Attends `n` rows of `x` `(n, hidden)` at cache rows `start..`
    /// (RoPE positions `rope_offset + start..`), writing `(n, hidden)`.
    /// `selection` carries the DSA selection between layers: a full
    /// indexer layer replaces it, a shared layer reuses it.
    pub fn forward(
        &self,
        sh: &MlaShape,
        x: &[f32],
        rows: Rows,
        kv: &mut LayerKv,
        selection: &mut Option<Selection>,
        out: &mut [f32],
    ) {
        let Rows {
            n,
            start,
            rope_offset,
            attend_rows,
        } = rows;
        let LayerKv::Mla {
            latent,
            k_rope,
            index_k,
        } = kv
        else {
            panic!("MLA attention given a non-MLA cache layer");
        };
        let c = &sh.cfg;
        let (h, qk, l, r) = (
            sh.heads,
            c.qk_head_dim(),
            c.kv_lora_rank,
            c.qk_rope_head_dim,
        );
        let (q_resid, mut q) = self.queries(sh, x, n); // (n, q_lora), (n, heads * qk)
        for t in 0..n {
            let pos = rope_offset + start + t;
            sh.rope.apply_heads(
                &mut q[t * h * qk..(t + 1) * h * qk],
                qk,
                c.qk_nope_head_dim,
                pos,
            );
        }
        let mut ckv = Scratch::zeroed(n * (l + r)); // (n, kv_lora + rope)
        self.wkv_a.matmul(x, n, &mut ckv);
        add_bias(&mut ckv, &self.bkv_a);
        for (t, row) in ckv.chunks_exact_mut(l + r).enumerate() {
            let (lat, rot) = row.split_at_mut(l);
            let dst = &mut latent[(start + t) * l..(start + t + 1) * l];
            rms_norm(lat, &self.kv_a_norm, LORA_NORM_EPS, dst);
            sh.rope.apply_heads(rot, r, 0, rope_offset + start + t);
            k_rope[(start + t) * r..(start + t + 1) * r].copy_from_slice(rot);
        }
        if let (Some(ix), Some(ish)) = (&self.indexer, &sh.indexer) {
            ix.write_keys(ish, x, n, start, rope_offset, index_k);
            match sh.dsa {
                DsaMode::Off => {
                    if let Some(old) = selection.take() {
                        dsa::recycle(old);
                    }
                }
                DsaMode::On | DsaMode::Auto => {
                    let qr = q_resid
                        .as_deref()
                        .expect("config check: an indexer needs q_lora_rank");
                    let skip_short = sh.dsa == DsaMode::Auto;
                    let mut sel = selection.take().unwrap_or_else(dsa::spare);
                    let at = (n, start, rope_offset, skip_short);
                    ix.select_into(ish, x, qr, at, index_k, &mut sel);
                    *selection = Some(sel);
                }
            }
        }
        let vd = h * c.v_head_dim;
        let mut ctx = Scratch::zeroed(n * vd); // (n, heads * v_head_dim)
        scratch::with_vec::<Option<Vec<usize>>, _>(|all| {
            all.resize(n, None);
            let sel = selection.as_ref().unwrap_or(all);
            // Each group of `attend_rows` queries takes the path a chunk of
            // that many would (their keys are all in the cache already).
            let group = attend_rows.clamp(1, n);
            for (g, ctx) in ctx.chunks_mut(group * vd).enumerate() {
                let (lo, m) = (g * group, ctx.len() / vd);
                let queries = Queries {
                    q: &q[lo * h * qk..(lo + m) * h * qk],
                    start: start + lo,
                    sel: &sel[lo..lo + m],
                };
                if sh.explicit_for(m, start + lo + m) {
                    self.attend_explicit(sh, &queries, latent, k_rope, ctx);
                } else {
                    self.attend_absorbed(sh, &queries, latent, k_rope, ctx);
                }
            }
        });
        tap::record(Part::AttnOut, &ctx, vd);
        self.wo.matmul(&ctx, n, out);
        add_bias(out, &self.bo);
    }

    /// `(q_resid, q)`: the normed q latent (when q_lora) and `(n, heads * qk)`.
    fn queries(&self, sh: &MlaShape, x: &[f32], n: usize) -> (Option<Scratch>, Scratch) {
        let qd = sh.heads * sh.cfg.qk_head_dim();
        let mut q = Scratch::zeroed(n * qd);
        match (&self.q_lora, &self.wq) {
            (Some(ql), _) => {
                let rank = ql.norm.len();
                let mut qa = Scratch::zeroed(n * rank); // (n, q_lora)
                ql.wa.matmul(x, n, &mut qa);
                add_bias(&mut qa, &ql.ba);
                let mut normed = Scratch::zeroed(n * rank);
                for (a, o) in qa.chunks_exact(rank).zip(normed.chunks_exact_mut(rank)) {
                    rms_norm(a, &ql.norm, LORA_NORM_EPS, o);
                }
                tap::record(Part::QLatent, &normed, rank);
                ql.wb.matmul(&normed, n, &mut q);
                (Some(normed), q)
            }
            (None, Some(wq)) => {
                wq.matmul(x, n, &mut q);
                (None, q)
            }
            (None, None) => unreachable!("loader guarantees a query projection"),
        }
    }

    /// Reconstructs one head's k_nope and v of every position at a time
    /// (that head's rows of kv_b: `total x (nope + v)` floats, where all
    /// heads at once would hold `heads` times as many: 2 GB at 16k
    /// positions of DeepSeek-V3), then attends that head for every query:
    /// through the panel kernels (`kernels::attn`, keys `[k_nope |
    /// k_rope]`); a DSA-selected row's keys and values gathered into a
    /// panel of their own (the same arithmetic as dense).
    fn attend_explicit(
        &self,
        sh: &MlaShape,
        qs: &Queries,
        latent: &[f32],
        k_rope: &[f32],
        ctx: &mut [f32],
    ) {
        let c = &sh.cfg;
        let (h, l, r) = (sh.heads, c.kv_lora_rank, c.qk_rope_head_dim);
        let (nope, vd, qk) = (c.qk_nope_head_dim, c.v_head_dim, c.qk_head_dim());
        let total = qs.start + qs.sel.len();
        let hw = nope + vd;
        let macs = qs.sel.len() * total * (qk + vd);
        let mut kvb = Scratch::zeroed(total * hw); // (total, nope + v) of one head
        let mut panel = Scratch::zeroed(attn::panel_len(total, qk)); // (blocks, qk, BLOCK)
        for hh in 0..h {
            let w_head = &self.wkv_b[hh * hw * l..(hh + 1) * hw * l];
            matmul(w_head, hw, l, &latent[..total * l], total, &mut kvb);
            let kvb: &[f32] = &kvb;
            let keys = [
                attn::KeyPart {
                    keys: kvb,
                    stride: hw,
                    width: nope,
                },
                attn::KeyPart {
                    keys: k_rope,
                    stride: r,
                    width: r,
                },
            ];
            attn::fill_panel(&keys, total, &mut panel);
            let dense = DensePairs {
                q: qs.q,
                panel: &panel,
                dim: qk,
                scale: c.softmax_scale,
                values: (&kvb[nope..], hw),
            };
            par_row_groups(ctx, (h * vd, attn::ROWS_MAX), macs, |t0, part| {
                let rows = (t0..t0 + part.len() / (h * vd)).filter(|&t| qs.sel[t].is_none());
                let pairs = rows.map(|t| {
                    let span_end = qs.start + t + 1;
                    ((t * h + hh) * qk, span_end, (t - t0) * h * vd + hh * vd)
                });
                dense.attend(pairs, vd, part);
                for t in (t0..t0 + part.len() / (h * vd)).filter(|&t| qs.sel[t].is_some()) {
                    let positions = qs.sel[t].as_deref().unwrap_or_default();
                    let mut sel_panel = Scratch::zeroed(attn::panel_len(positions.len(), qk));
                    attn::fill_panel_at(&keys, positions, &mut sel_panel);
                    let mut values = Scratch::zeroed(positions.len() * vd); // (selected, v)
                    for (row, &p) in values.chunks_exact_mut(vd).zip(positions) {
                        row.copy_from_slice(&kvb[p * hw + nope..(p + 1) * hw]);
                    }
                    let selected = DensePairs {
                        panel: &sel_panel,
                        values: (&values, vd),
                        ..dense
                    };
                    let pair = (
                        (t * h + hh) * qk,
                        positions.len(),
                        (t - t0) * h * vd + hh * vd,
                    );
                    selected.attend(std::iter::once(pair), vd, part);
                }
            });
        }
    }

    /// Weight absorption: scores against latents, pools latents, projects
    /// the pooled latent once through kv_b's value rows. Rows without a
    /// DSA selection score and pool through the panel kernels (keys
    /// `[latent | k_rope]`, shared by every head: one panel for all);
    /// a DSA-selected row through a panel of its gathered keys.
    fn attend_absorbed(
        &self,
        sh: &MlaShape,
        qs: &Queries,
        latent: &[f32],
        k_rope: &[f32],
        ctx: &mut [f32],
    ) {
        let c = &sh.cfg;
        let (h, l, r) = (sh.heads, c.kv_lora_rank, c.qk_rope_head_dim);
        let (nope, vd) = (c.qk_nope_head_dim, c.v_head_dim);
        let total = qs.start + qs.sel.len();
        let macs = qs.sel.len() * h * (nope * l + total * (2 * l + r) + l * vd);
        let any_dense = qs.sel.iter().any(|s| s.is_none());
        let positions = if any_dense { total } else { 0 };
        let mut panel = Scratch::zeroed(attn::panel_len(positions, l + r)); // (blocks, l + r, BLOCK)
        let keys = [
            attn::KeyPart {
                keys: latent,
                stride: l,
                width: l,
            },
            attn::KeyPart {
                keys: k_rope,
                stride: r,
                width: r,
            },
        ];
        attn::fill_panel(&keys, positions, &mut panel);
        let panel: &[f32] = &panel;
        par_row_groups(ctx, (h * vd, QUERY_GROUP), macs, |t0, part| {
            for (i, row) in part.chunks_exact_mut(h * vd).enumerate() {
                let t = t0 + i;
                let Some(positions) = qs.sel[t].as_deref() else {
                    let keys = (latent, panel, qs.start + t + 1);
                    self.absorbed_row(sh, qs, t, keys, row);
                    continue;
                };
                let mut sel_panel = Scratch::zeroed(attn::panel_len(positions.len(), l + r));
                attn::fill_panel_at(&keys, positions, &mut sel_panel);
                let mut values = Scratch::zeroed(positions.len() * l); // (selected, kv_lora)
                for (v, &p) in values.chunks_exact_mut(l).zip(positions) {
                    v.copy_from_slice(&latent[p * l..(p + 1) * l]);
                }
                self.absorbed_row(sh, qs, t, (&values, &sel_panel, positions.len()), row);
            }
        });
    }

    /// Query row `t` over `n` keys (its positions, or its DSA selection's
    /// gathered): every head's `[q_lat | q_rope]` against the panel of
    /// `[latent | k_rope]`, shared by every head, latents pooled and
    /// projected per head.
    fn absorbed_row(
        &self,
        sh: &MlaShape,
        qs: &Queries,
        t: usize,
        (latent, panel, n): (&[f32], &[f32], usize),
        row: &mut [f32],
    ) {
        let c = &sh.cfg;
        let (h, l, r) = (sh.heads, c.kv_lora_rank, c.qk_rope_head_dim);
        let (nope, vd, qk) = (c.qk_nope_head_dim, c.v_head_dim, c.qk_head_dim());
        let dim = l + r;
        let mut q_cat = Scratch::zeroed(attn::ROWS_MAX * dim); // (pairs, kv_lora + rope)
        let mut pooled = Scratch::zeroed(attn::ROWS_MAX * l); // (pairs, kv_lora)
        for h0 in (0..h).step_by(attn::ROWS_MAX) {
            let heads = h0..(h0 + attn::ROWS_MAX).min(h);
            for (j, hh) in heads.clone().enumerate() {
                let q = &qs.q[(t * h + hh) * qk..(t * h + hh + 1) * qk];
                let (q_lat, q_rot) = q_cat[j * dim..(j + 1) * dim].split_at_mut(l);
                self.absorb_query(c, hh, &q[..nope], q_lat);
                q_rot.copy_from_slice(&q[nope..]);
            }
            pooled.fill(0.0);
            let dense = DensePairs {
                q: &q_cat,
                panel,
                dim,
                scale: c.softmax_scale,
                values: (latent, l),
            };
            dense.attend(
                (0..heads.len()).map(|j| (j * dim, n, j * l)),
                l,
                &mut pooled,
            );
            for (j, hh) in heads.enumerate() {
                let o = &mut row[hh * vd..(hh + 1) * vd];
                self.project_pooled(c, hh, &pooled[j * l..(j + 1) * l], o);
            }
        }
    }

    /// `q_lat = W_kbᵀ q_nope`, W_kb = head `hh`'s first `nope` rows of kv_b.
    fn absorb_query(&self, c: &MlaConfig, hh: usize, q_nope: &[f32], q_lat: &mut [f32]) {
        let (l, hw) = (c.kv_lora_rank, c.qk_nope_head_dim + c.v_head_dim);
        let w_head = &self.wkv_b[hh * hw * l..(hh + 1) * hw * l];
        q_lat.fill(0.0);
        for (i, qi) in q_nope.iter().enumerate() {
            for (a, w) in q_lat.iter_mut().zip(&w_head[i * l..(i + 1) * l]) {
                *a += qi * w;
            }
        }
    }

    /// Head `hh`'s output: its value rows of kv_b times the pooled latent.
    fn project_pooled(&self, c: &MlaConfig, hh: usize, pooled: &[f32], o: &mut [f32]) {
        let (l, nope, hw) = (
            c.kv_lora_rank,
            c.qk_nope_head_dim,
            c.qk_nope_head_dim + c.v_head_dim,
        );
        let w_head = &self.wkv_b[hh * hw * l..(hh + 1) * hw * l];
        for (j, ov) in o.iter_mut().enumerate() {
            *ov = dot(&w_head[(nope + j) * l..(nope + j + 1) * l], pooled);
        }
    }
}

/// Query pairs that attend every position before their span's end,
/// through the panel kernels: up to `attn::ROWS_MAX` at a time, scored,
/// softmaxed and summed over the values. Each pair's arithmetic is the
/// same in any batch (`kernels::attn`).
struct DensePairs<'a> {
    /// Holds every pair's query (`dim` floats at its offset).
    q: &'a [f32],
    /// The keys' panel.
    panel: &'a [f32],
    dim: usize,
    scale: f32,
    /// Position `p`'s value at `values.0[p * values.1..]`.
    values: (&'a [f32], usize),
}

impl DensePairs<'_> {
    /// Attends each `(query offset, span end, out offset)` pair over
    /// positions `0..span end`, adding `out_dim` floats at its out offset.
    fn attend(
        &self,
        pairs: impl Iterator<Item = (usize, usize, usize)>,
        out_dim: usize,
        out: &mut [f32],
    ) {
        let mut batch = [(0usize, 0usize, 0usize); attn::ROWS_MAX];
        let mut k = 0;
        for pair in pairs {
            batch[k] = pair;
            k += 1;
            if k == attn::ROWS_MAX {
                self.attend_batch(&batch, out_dim, out);
                k = 0;
            }
        }
        if k > 0 {
            self.attend_batch(&batch[..k], out_dim, out);
        }
    }

    fn attend_batch(&self, batch: &[(usize, usize, usize)], out_dim: usize, out: &mut [f32]) {
        let mut offsets = [0usize; attn::ROWS_MAX];
        let mut outs = [0usize; attn::ROWS_MAX];
        let mut spans: [Range<usize>; attn::ROWS_MAX] = std::array::from_fn(|_| 0..0);
        for (j, &(q, end, o)) in batch.iter().enumerate() {
            (offsets[j], spans[j], outs[j]) = (q, 0..end, o);
        }
        let k = batch.len();
        let end = spans[..k].iter().map(|s| s.end).max().unwrap_or(0);
        let width = end.div_ceil(attn::BLOCK) * attn::BLOCK;
        let mut scores = Scratch::zeroed(k * width); // (pairs, width)
        let rows = attn::QueryRows {
            q: self.q,
            offsets: &offsets[..k],
            dim: self.dim,
        };
        attn::scores(
            rows,
            self.panel,
            0..width / attn::BLOCK,
            self.scale,
            (&mut scores, width),
        );
        for (j, span) in spans[..k].iter().enumerate() {
            attn::softmax(&mut scores[j * width..j * width + span.end]);
        }
        let wv = attn::Weighted {
            w: &scores,
            w_stride: width,
            v: self.values.0,
            v_stride: self.values.1,
            spans: &spans[..k],
        };
        attn::weighted_values(wv, (out, &outs[..k]), out_dim);
    }
}

/// Query rows one kernel-pool task attends in turn on the absorbed path.
const QUERY_GROUP: usize = 4;
