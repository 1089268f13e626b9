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
use crate::kernels::par_row_groups;
use crate::layers::scratch::{self, Scratch};
use crate::layers::tap::{self, Part};
use crate::model::kv::LayerKv;

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
    /// positions of DeepSeek-V3), then attends that head for every query.
    /// Each value is the same dot as in one batched matmul.
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
        for hh in 0..h {
            let w_head = &self.wkv_b[hh * hw * l..(hh + 1) * hw * l];
            matmul(w_head, hw, l, &latent[..total * l], total, &mut kvb);
            let kvb: &[f32] = &kvb;
            par_each_query(qs, ctx, macs, |t, positions, scores, row| {
                let q = &qs.q[(t * h + hh) * qk..(t * h + hh + 1) * qk];
                let kv_at = |s: usize| &kvb[s * hw..(s + 1) * hw];
                let score = |s: usize| {
                    (dot(&q[..nope], &kv_at(s)[..nope])
                        + dot(&q[nope..], &k_rope[s * r..(s + 1) * r]))
                        * c.softmax_scale
                };
                let o = &mut row[hh * vd..(hh + 1) * vd];
                softmax_pool(positions, scores, score, |s| &kv_at(s)[nope..], o);
            });
        }
    }

    /// Weight absorption: scores against latents, pools latents, projects
    /// the pooled latent once through kv_b's value rows.
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
        let (nope, vd, qk) = (c.qk_nope_head_dim, c.v_head_dim, c.qk_head_dim());
        let total = qs.start + qs.sel.len();
        let macs = qs.sel.len() * h * (nope * l + total * (2 * l + r) + l * vd);
        par_each_query(qs, ctx, macs, |t, positions, scores, row| {
            let mut q_lat = Scratch::zeroed(l); // (kv_lora,)
            let mut pooled = Scratch::zeroed(l); // (kv_lora,)
            for hh in 0..h {
                let q = &qs.q[(t * h + hh) * qk..(t * h + hh + 1) * qk];
                let w_head = &self.wkv_b[hh * (nope + vd) * l..(hh + 1) * (nope + vd) * l];
                // q_lat = W_kbᵀ q_nope, W_kb = the head's first `nope` rows of kv_b.
                q_lat.fill(0.0);
                for (i, qi) in q[..nope].iter().enumerate() {
                    for (a, w) in q_lat.iter_mut().zip(&w_head[i * l..(i + 1) * l]) {
                        *a += qi * w;
                    }
                }
                let score = |s: usize| {
                    (dot(&q_lat, &latent[s * l..(s + 1) * l])
                        + dot(&q[nope..], &k_rope[s * r..(s + 1) * r]))
                        * c.softmax_scale
                };
                softmax_pool(
                    positions,
                    scores,
                    score,
                    |s| &latent[s * l..(s + 1) * l],
                    &mut pooled,
                );
                let o = &mut row[hh * vd..(hh + 1) * vd];
                for (j, ov) in o.iter_mut().enumerate() {
                    *ov = dot(&w_head[(nope + j) * l..(nope + j + 1) * l], &pooled);
                }
            }
        });
    }
}

/// Query rows one kernel-pool task attends in turn.
const QUERY_GROUP: usize = 4;

/// Calls `f(t, positions, scores, row)` for every query row `t`: the
/// positions a query at cache row `start + t` attends (its selection, or
/// all of `0..=start + t`), a scores buffer, and its `(heads * v)` row of
/// `ctx`. Rows go to the kernel pool in groups of [`QUERY_GROUP`] when
/// `macs` is worth it; each row's arithmetic is the same on any thread.
fn par_each_query(
    qs: &Queries,
    ctx: &mut [f32],
    macs: usize,
    f: impl Fn(usize, &[usize], &mut Vec<f32>, &mut [f32]) + Sync,
) {
    let row_len = ctx.len() / qs.sel.len();
    par_row_groups(ctx, (row_len, QUERY_GROUP), macs, |t0, part| {
        scratch::with_vec::<usize, _>(|all| {
            scratch::with_vec::<f32, _>(|scores| {
                for (i, row) in part.chunks_exact_mut(row_len).enumerate() {
                    let t = t0 + i;
                    let positions: &[usize] = match &qs.sel[t] {
                        Some(v) => v,
                        None => {
                            all.clear();
                            all.extend(0..=qs.start + t);
                            all
                        }
                    };
                    f(t, positions, scores, row);
                }
            })
        })
    });
}

/// `out = Σ_s softmax(score)(s) · value(s)` over `positions`, in f32.
fn softmax_pool<'a>(
    positions: &[usize],
    scores: &mut Vec<f32>,
    score: impl Fn(usize) -> f32,
    value: impl Fn(usize) -> &'a [f32],
    out: &mut [f32],
) {
    scores.clear();
    scores.extend(positions.iter().map(|&s| score(s)));
    crate::kernels::attn::softmax(scores);
    out.fill(0.0);
    for (&s, p) in positions.iter().zip(scores.iter()) {
        for (o, v) in out.iter_mut().zip(value(s)) {
            *o += p * v;
        }
    }
}
