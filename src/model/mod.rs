//! The model: resident weights (embeddings, attention, norms, routers,
//! dense MLPs, shared experts, lm_head, the MTP head), the expert store for
//! routed experts, and the reference forward pass.
//!
//! [`Model::forward`] is the one top-down path every test anchors on: it
//! walks the layers for a chunk of `n` tokens at positions `start..start+n`
//! (prefill when n > 1, decode when n = 1), with the MoE routing visible
//! inline. Loading lives in [`load`], the MTP head in [`mtp`].

pub mod attention;
pub mod dsa;
pub mod footprint;
pub mod kv;
mod load;
mod locate;
pub mod mla;
pub mod moe;
pub mod mtp;
pub mod names;
mod options;
pub mod profile;
pub mod progress;
pub mod router;

/// Kept at their old paths: the layers live in [`crate::layers`].
pub use crate::layers::{mlp, norm, rope};

use crate::error::{Error, Result};
use crate::formats::config::ModelConfig;
use crate::formats::tensor::Mat;
use crate::layers::scratch::Scratch;
use crate::layers::tap::{self, Block, Part};
use crate::model::kv::{KvCache, KvLayout, LayerKv};
use crate::model::profile::Profile;
use crate::model::progress::Work;
use crate::store::{EarlyReads, ExpertStore, Variant};
use attention::{Attention, AttentionShape};
use dsa::Selections;
use mla::{DsaMode, MlaAttention, MlaMode, MlaShape};
use mlp::Mlp;
use moe::MoeBlock;
use norm::rms_norm;
use std::time::Instant;

pub use footprint::{check_budget, Footprint};
pub use options::LoadOptions;

/// The attention of a layer.
pub enum AttnBlock {
    Gqa(Box<Attention>),
    Mla(Box<MlaAttention>),
}

/// The feed-forward part of a layer.
pub enum Ffn {
    Dense(Mlp),
    Moe(MoeBlock),
}

/// One decoder layer's resident weights.
pub struct Layer {
    pub input_norm: Vec<f32>,
    pub post_attn_norm: Vec<f32>,
    pub attn: AttnBlock,
    pub ffn: Ffn,
}

/// Shapes shared by every layer's attention.
pub struct Shapes {
    pub gqa: AttentionShape,
    pub mla: Option<MlaShape>,
}

/// Positions per forward of a chunked prefill. A long prompt runs in
/// layer-major passes of [`Model::prefill_pass`] positions (a multiple of
/// this), attending chunk by chunk inside each pass so that every row gets
/// the arithmetic the chunks gave it.
pub const PREFILL_CHUNK: usize = 256;

/// A loaded model.
pub struct Model {
    pub cfg: ModelConfig,
    /// (vocab, hidden)
    pub embed: Mat,
    pub layers: Vec<Layer>,
    pub norm: Vec<f32>,
    /// (vocab, hidden); `None` when tied to `embed`.
    pub lm_head: Option<Mat>,
    pub shapes: Shapes,
    pub store: ExpertStore,
    /// The multi-token-prediction head, when the checkpoint has one.
    pub mtp: Option<mtp::Mtp>,
    /// The RAM plan, when loaded under a budget.
    pub plan: Option<crate::store::budget::BudgetPlan>,
    /// Positions the RAM plan reserved KV cache for (a request may not
    /// need more); `None` without a budget.
    pub context_budget: Option<usize>,
    /// What became of the saved usage history (pins), if there was one.
    pub history: Option<String>,
    /// Where long work on this model (a long prefill) reports progress.
    pub progress: crate::model::progress::Progress,
    /// Raised by another thread to stop a forward between layers and
    /// attention sub-chunks ([`Error::Interrupted`]); a forward stopped so
    /// leaves its KV caches at their length before it.
    pub interrupt: crate::model::progress::Interrupt,
    /// Positions each layer runs over before the next layer starts, in a
    /// long prefill: the RAM plan's pass (the whole context without a
    /// budget). Each routed expert is read at most once per layer per pass.
    pub prefill_pass: crate::store::budget::PrefillPass,
}

/// Where a prefill forward reports per-layer progress: its rows are
/// positions `done..done + rows` of a prompt of `total`.
#[derive(Clone, Copy, Debug)]
pub struct PassProgress {
    pub done: u64,
    pub total: u64,
}

/// One sequence of a forward: its new tokens, its KV cache, and its DSA
/// selections (shared across the layers of one forward).
struct Seq<'a> {
    tokens: &'a [u32],
    kv: &'a mut KvCache,
    selections: Selections,
    /// MLA picks its attention path for every this many rows.
    attend_rows: usize,
}

impl Seq<'_> {
    /// This sequence's part of layer `l`.
    fn seg(&mut self, l: usize) -> Seg<'_> {
        Seg {
            rows: Rows {
                n: self.tokens.len(),
                start: self.kv.len(),
                rope_offset: 0,
                attend_rows: self.attend_rows,
            },
            kv: &mut self.kv.layers[l],
            selections: &mut self.selections,
        }
    }
}

/// One sequence's part of one layer: where its rows sit, that layer's KV,
/// and its DSA selections.
pub(crate) struct Seg<'a> {
    rows: Rows,
    kv: &'a mut LayerKv,
    selections: &'a mut Selections,
}

/// Where a chunk of rows sits: cache rows `start..`, RoPE positions
/// `rope_offset + start..`. MLA chooses between explicit and absorbed
/// attention for every `attend_rows` rows from `start` (a layer-major pass
/// attends as the chunks of a chunked prefill did; `usize::MAX`: once for
/// all `n`).
#[derive(Clone, Copy, Debug)]
pub struct Rows {
    pub n: usize,
    pub start: usize,
    pub rope_offset: usize,
    pub attend_rows: usize,
}

impl Model {
    /// The KV layout of `layer`.
    pub(crate) fn kv_layout(&self, layer: &Layer) -> KvLayout {
        match (&layer.attn, &self.cfg.mla) {
            (AttnBlock::Mla(a), Some(m)) => KvLayout::Mla {
                kv_lora: m.kv_lora_rank,
                rope: m.qk_rope_head_dim,
                index_dim: match (&a.indexer, &self.cfg.indexer) {
                    (Some(_), Some(ix)) => ix.head_dim,
                    _ => 0,
                },
            },
            _ => KvLayout::Gqa {
                kv_dim: self.cfg.num_kv_heads * self.cfg.head_dim,
            },
        }
    }

    /// A KV cache able to hold `capacity` positions.
    pub fn new_kv(&self, capacity: usize) -> KvCache {
        let layouts: Vec<KvLayout> = self.layers.iter().map(|l| self.kv_layout(l)).collect();
        KvCache::new(&layouts, capacity)
    }

    /// Sets how MLA attends and whether the DSA indexer restricts it.
    pub fn set_attention_modes(&mut self, mla: MlaMode, dsa: DsaMode) {
        if let Some(m) = &mut self.shapes.mla {
            m.mode = mla;
            m.dsa = dsa;
        }
    }

    /// Checks every id is in the vocabulary.
    pub fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        for (position, &id) in tokens.iter().enumerate() {
            if id as usize >= self.cfg.vocab_size {
                return Err(Error::TokenOutOfVocab {
                    id,
                    position,
                    vocab_size: self.cfg.vocab_size,
                });
            }
        }
        Ok(())
    }

    /// The reference forward pass over `tokens` at positions `kv.len()..`.
    /// Returns logits `(n, vocab)` for every position when `all_logits`,
    /// else `(1, vocab)` for the last one.
    pub fn forward(
        &self,
        tokens: &[u32],
        kv: &mut KvCache,
        all_logits: bool,
        prof: &mut Profile,
    ) -> Result<Vec<f32>> {
        let mut logits = Vec::new();
        self.forward_into(tokens, kv, all_logits, prof, &mut logits)?;
        Ok(logits)
    }

    /// [`Model::forward`] writing the logits into `logits` (resized; no
    /// allocation once it has held them): with every expert cached, a
    /// decode step through here allocates nothing (tested).
    pub fn forward_into(
        &self,
        tokens: &[u32],
        kv: &mut KvCache,
        all_logits: bool,
        prof: &mut Profile,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        let n = tokens.len();
        let hidden = self.forward_hidden(tokens, kv, prof)?; // (n, hidden), final-normed
        let h = self.cfg.hidden_size;
        let first = if all_logits { 0 } else { n - 1 };
        self.logits_into(&hidden[first * h..], logits);
        if logits.iter().any(|x| !x.is_finite()) {
            return Err(Error::NonFinite {
                what: "the logits (lm_head)".into(),
            });
        }
        Ok(())
    }

    /// [`Model::forward`] over `tokens` in chunks of at most `chunk`
    /// positions, so a long prompt's activations stay bounded (the RAM plan
    /// budgets one chunk). Chunking changes no result (with a fixed MLA
    /// path): every position sees the same cached keys and the same per-row
    /// arithmetic.
    pub fn forward_chunked(
        &self,
        tokens: &[u32],
        kv: &mut KvCache,
        all_logits: bool,
        prof: &mut Profile,
        chunk: usize,
    ) -> Result<Vec<f32>> {
        assert!(chunk > 0, "chunk must be positive");
        let mut out = Vec::new();
        for (i, part) in tokens.chunks(chunk).enumerate() {
            let last = (i + 1) * chunk >= tokens.len();
            if all_logits || last {
                out.extend(self.forward(part, kv, all_logits, prof)?);
            } else {
                self.forward_hidden(part, kv, prof)?;
            }
        }
        Ok(out)
    }

    /// Runs the decoder over `tokens` and returns the final-normed hidden
    /// states `(n, hidden)` (the MTP head's input).
    pub fn forward_hidden(
        &self,
        tokens: &[u32],
        kv: &mut KvCache,
        prof: &mut Profile,
    ) -> Result<Scratch> {
        let mut seqs = [Seq {
            tokens,
            kv,
            selections: Selections::default(),
            attend_rows: usize::MAX,
        }];
        self.forward_hidden_seqs(&mut seqs, usize::MAX, None, prof)
    }

    /// One forward over several sequences at once (a batched step): each
    /// attends over its own KV cache at its own positions; norms, routers,
    /// MLPs and experts run over all their rows together, so each MoE
    /// layer fetches the union of every row's experts once. Returns the
    /// final-normed hidden states of every row, sequence after sequence.
    /// Per-row arithmetic does not depend on the other rows, so each
    /// sequence gets exactly what it would get alone.
    ///
    /// It is a layer-major pass: MLA picks its attention path for every
    /// [`PREFILL_CHUNK`] rows of a sequence (so a pass of many chunks gives
    /// each row the bits the chunks did), and with `progress` each layer
    /// done is reported. Over more rows than the pass's sub-chunk
    /// ([`PrefillPass::sub_rows`](crate::store::budget::PrefillPass)), each
    /// layer holds only the residual stream, its block output and the
    /// routing for every row; attention and the MLPs run a sub-chunk at a
    /// time, and the routed experts one after another (see
    /// [`MoeBlock::forward_streamed`]), each read at most once.
    pub fn forward_pass_batch(
        &self,
        batch: &mut [(&[u32], &mut KvCache)],
        progress: Option<PassProgress>,
        prof: &mut Profile,
    ) -> Result<Scratch> {
        let sub = self.prefill_pass.sub_rows;
        assert!(
            sub > 0 && sub.is_multiple_of(PREFILL_CHUNK),
            "a pass's sub-chunk is whole chunks (so its rows attend as the chunks did)"
        );
        let mut seqs: Vec<Seq> = batch
            .iter_mut()
            .map(|(tokens, kv)| Seq {
                tokens,
                kv,
                selections: Selections::default(),
                attend_rows: PREFILL_CHUNK,
            })
            .collect();
        self.forward_hidden_seqs(&mut seqs, sub, progress, prof)
    }

    /// A long prompt's prefill in layer-major passes of
    /// [`Model::prefill_pass`] positions (see [`Model::forward_pass_batch`]):
    /// the same logits, bit for bit, as [`Model::forward_chunked`] with
    /// [`PREFILL_CHUNK`], reading each routed expert at most once per layer
    /// per pass. Logits are computed a chunk of rows at a time (all of
    /// them with `all_logits`, else the last row's).
    pub fn prefill(
        &self,
        tokens: &[u32],
        kv: &mut KvCache,
        all_logits: bool,
        prof: &mut Profile,
    ) -> Result<Vec<f32>> {
        let h = self.cfg.hidden_size;
        let total = tokens.len() as u64;
        let mut out = Vec::new();
        let mut done = 0;
        for pass in tokens.chunks(self.prefill_pass.positions.max(1)) {
            let progress = Some(PassProgress { done, total });
            let hidden = self.forward_pass_batch(&mut [(pass, &mut *kv)], progress, prof)?;
            done += pass.len() as u64;
            let last = done == total;
            let first = if all_logits {
                0
            } else if last {
                pass.len() - 1
            } else {
                pass.len()
            };
            for rows in hidden[first * h..].chunks(PREFILL_CHUNK * h) {
                let at = out.len();
                out.resize(at + rows.len() / h * self.cfg.vocab_size, 0.0);
                let head = self.lm_head.as_ref().unwrap_or(&self.embed);
                tap::record_head(rows, h);
                head.matmul(rows, rows.len() / h, &mut out[at..]);
            }
        }
        if out.iter().any(|x| !x.is_finite()) {
            return Err(Error::NonFinite {
                what: "the logits (lm_head)".into(),
            });
        }
        Ok(out)
    }

    /// Sets the prefill pass to `positions` (at most the RAM plan's: a
    /// longer pass would outgrow what the plan set aside).
    pub fn set_prefill_pass(&mut self, positions: usize) -> Result<()> {
        let most = match &self.plan {
            Some(p) => p.prefill_pass.positions,
            None => usize::MAX,
        };
        if positions == 0 || positions > most {
            return Err(Error::Setting {
                name: "prefill_pass",
                reason: format!("{positions} positions: must be 1..={most} (the RAM plan's pass)"),
            });
        }
        self.prefill_pass.positions = positions;
        Ok(())
    }

    /// The decoder over `seqs`' rows, attention and MLPs `sub` rows at a
    /// time; the final-normed hidden states of every row.
    fn forward_hidden_seqs(
        &self,
        seqs: &mut [Seq],
        sub: usize,
        progress: Option<PassProgress>,
        prof: &mut Profile,
    ) -> Result<Scratch> {
        let h = self.cfg.hidden_size;
        let mut n = 0;
        for s in seqs.iter_mut() {
            self.check_tokens(s.tokens)?;
            assert!(!s.tokens.is_empty(), "forward of zero tokens");
            s.kv.reserve(s.tokens.len())?;
            n += s.tokens.len();
        }
        let ids = seqs.iter().flat_map(|s| s.tokens.iter());
        let mut x = self.embed_ids(ids, n); // (n, hidden) residual stream
        for (l, layer) in self.layers.iter().enumerate() {
            if let [one] = seqs {
                // One sequence: no list to allocate (decode allocates nothing).
                self.layer_forward(l, layer, &mut x, &mut [one.seg(l)], sub, prof)?;
            } else {
                let mut segs: Vec<Seg> = seqs.iter_mut().map(|s| s.seg(l)).collect();
                self.layer_forward(l, layer, &mut x, &mut segs, sub, prof)?;
            }
            if x.iter().any(|v| !v.is_finite()) {
                return Err(Error::NonFinite {
                    what: format!("the residual stream after layer {l}"),
                });
            }
            self.interrupt.check()?;
            if let Some(p) = progress {
                let layers = self.layers.len() as u64;
                let part = n as u64 * (l as u64 + 1) / layers;
                self.progress.report(Work::Prefill, p.done + part, p.total);
            }
        }
        for s in seqs.iter_mut() {
            s.selections.recycle();
            s.kv.advance(s.tokens.len());
        }
        self.store.tick(n as u64);
        // The final norm in place: (n, hidden)
        let mut row = Scratch::zeroed(h);
        for xr in x.chunks_exact_mut(h) {
            row.copy_from_slice(xr);
            rms_norm(&row, &self.norm, self.cfg.rms_norm_eps, xr);
        }
        Ok(x)
    }

    /// `(m, vocab)` logits of `(m, hidden)` final-normed rows.
    pub fn logits(&self, hidden: &[f32]) -> Vec<f32> {
        let mut logits = Vec::new();
        self.logits_into(hidden, &mut logits);
        logits
    }

    /// [`Model::logits`] into `logits` (resized).
    pub fn logits_into(&self, hidden: &[f32], logits: &mut Vec<f32>) {
        let (h, v) = (self.cfg.hidden_size, self.cfg.vocab_size);
        let m = hidden.len() / h;
        logits.clear();
        logits.resize(m * v, 0.0); // (m, vocab)
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        tap::record_head(hidden, h);
        head.matmul(hidden, m, logits);
    }

    /// Embedding rows of `tokens`, `(n, hidden)`.
    /// The embedding rows of `n` token ids, in order.
    fn embed_ids<'t>(&self, ids: impl Iterator<Item = &'t u32>, n: usize) -> Scratch {
        let h = self.cfg.hidden_size;
        let mut x = Scratch::zeroed(n * h);
        for (row, &id) in x.chunks_exact_mut(h).zip(ids) {
            self.embed.row_into(id as usize, row);
        }
        x
    }

    fn embed_rows(&self, tokens: &[u32]) -> Scratch {
        self.embed_ids(tokens.iter(), tokens.len())
    }

    /// One decoder layer over `x` `(n, hidden)` in place, `x` holding the
    /// rows of `segs` one sequence after another:
    /// rmsnorm → attention (per sequence) → residual → rmsnorm →
    /// (MoE | dense MLP, all rows) → residual. Attention runs `sub` rows of
    /// a sequence at a time; over more than `sub` rows, so do the MLPs and
    /// the MoE streams its experts ([`Model::ffn_streamed`]).
    /// `l` is the layer's index in the expert store.
    fn layer_forward(
        &self,
        l: usize,
        layer: &Layer,
        x: &mut [f32],
        segs: &mut [Seg],
        sub: usize,
        prof: &mut Profile,
    ) -> Result<()> {
        let n = x.len() / self.cfg.hidden_size;
        tap::at_layer(l);
        if n > sub {
            self.read_early(l, layer, x, sub);
        }
        let mut at = 0;
        for s in segs.iter_mut() {
            self.attend(layer, x, s, at, sub, prof)?;
            at += s.rows.n;
        }
        if n == 1 {
            self.look_ahead(l, x, Variant::Attn);
        }
        if n > sub {
            return self.ffn_streamed(l, layer, x, sub, prof);
        }
        let mut xn = Scratch::zeroed(x.len()); // (n, hidden) normed input
        let mut y = Scratch::zeroed(x.len()); // (n, hidden) block output
        self.norm_rows(x, &layer.post_attn_norm, &mut xn);
        match &layer.ffn {
            Ffn::Dense(mlp) => mlp.forward(Block::Dense, &xn, n, &mut y),
            Ffn::Moe(block) => block.forward(l, &self.store, &xn, n, prof, &mut y)?,
        }
        add(x, &y);
        if n == 1 {
            self.look_ahead(l, x, Variant::Output);
        }
        Ok(())
    }

    /// Starts layer `l`'s early reads, before its attention over the `x`
    /// `(n, hidden)` rows of a layer-major pass (`schedule.early`): the
    /// first experts in file order, or those the layer's router picks for
    /// at most `sub` of the rows as they enter the layer (in file order).
    fn read_early(&self, l: usize, layer: &Layer, x: &[f32], sub: usize) {
        let Ffn::Moe(block) = &layer.ffn else {
            return;
        };
        if self.store.early_allowance() == 0 {
            return;
        }
        match self.store.schedule.early {
            None => {}
            Some(EarlyReads::Files) => {
                self.store.read_early(l, 0..self.store.experts_in(l));
            }
            Some(EarlyReads::Guess) => {
                let norm = moe::NormedRows {
                    x,
                    weight: &layer.post_attn_norm,
                    eps: self.cfg.rms_norm_eps,
                };
                let guess = block.guess_union(&norm, sub, self.store.experts_in(l));
                self.store.read_early(l, guess);
            }
        }
    }

    /// Attention of one sequence (its rows start at row `at` of `x`), a
    /// sub-chunk of at most `sub` rows at a time: rmsnorm → attention →
    /// residual. A row's attention reads only its own row and the cache,
    /// whose earlier rows the sub-chunks before it wrote.
    fn attend(
        &self,
        layer: &Layer,
        x: &mut [f32],
        s: &mut Seg,
        at: usize,
        sub: usize,
        prof: &mut Profile,
    ) -> Result<()> {
        let h = self.cfg.hidden_size;
        let rows = s.rows;
        for (c, lo) in (0..rows.n).step_by(sub).enumerate() {
            if c > 0 {
                self.interrupt.check()?;
            }
            let part = Rows {
                n: sub.min(rows.n - lo),
                start: rows.start + lo,
                ..rows
            };
            let span = (at + lo) * h..(at + lo + part.n) * h;
            let mut xn = Scratch::zeroed(part.n * h); // (m, hidden) normed input
            let mut y = Scratch::zeroed(part.n * h); // (m, hidden) attention output
            self.norm_rows(&x[span.clone()], &layer.input_norm, &mut xn);
            tap::record(Part::AttnIn, &xn, h);
            let t0 = Instant::now();
            match &layer.attn {
                AttnBlock::Gqa(a) => a.forward(&self.shapes.gqa, &xn, part, s.kv, &mut y),
                AttnBlock::Mla(a) => {
                    let sh = self
                        .shapes
                        .mla
                        .as_ref()
                        .expect("MLA layers come with an MLA shape");
                    a.forward(sh, &xn, part, s.kv, s.selections.part(c), &mut y)
                }
            }
            prof.attention += t0.elapsed();
            add(&mut x[span], &y);
        }
        Ok(())
    }

    /// The feed-forward half of a layer over more rows than a sub-chunk:
    /// a dense MLP a sub-chunk at a time (its rows normed as they go), or
    /// the MoE block streaming its experts over every row's routing, its
    /// output summed into one `(n, hidden)` buffer, then the residual.
    fn ffn_streamed(
        &self,
        l: usize,
        layer: &Layer,
        x: &mut [f32],
        sub: usize,
        prof: &mut Profile,
    ) -> Result<()> {
        let h = self.cfg.hidden_size;
        let norm = &layer.post_attn_norm;
        match &layer.ffn {
            Ffn::Dense(mlp) => {
                for rows in x.chunks_mut(sub * h) {
                    let mut xn = Scratch::zeroed(rows.len()); // (m, hidden)
                    let mut y = Scratch::zeroed(rows.len()); // (m, hidden)
                    self.norm_rows(rows, norm, &mut xn);
                    mlp.forward(Block::Dense, &xn, rows.len() / h, &mut y);
                    add(rows, &y);
                }
            }
            Ffn::Moe(block) => {
                let mut y = Scratch::zeroed(x.len()); // (n, hidden) block output
                let normed = moe::NormedRows {
                    x,
                    weight: norm,
                    eps: self.cfg.rms_norm_eps,
                };
                block.forward_streamed(l, &self.store, &normed, sub, prof, &mut y)?;
                add(x, &y);
            }
        }
        Ok(())
    }

    /// Router lookahead from layer `l`'s residual `x` (one token). When
    /// lookahead prefetch is on from this variant, applies each of the
    /// `depth` next MoE layers' routers (after that layer's own norm) to
    /// it and starts reading the guessed experts; the next layer's guess is
    /// kept for the recall stats. With `schedule.recall`, the next layer is
    /// guessed (and scored) from both variants even without prefetch; with a
    /// trace, the layer after it too (recorded, not scored).
    fn look_ahead(&self, l: usize, x: &[f32], variant: Variant) {
        let schedule = self.store.schedule;
        let prefetch = schedule
            .lookahead
            .filter(|a| a.from == variant && schedule.prefetch_experts_max > 0);
        if prefetch.is_none() && !schedule.recall {
            return;
        }
        let depth = prefetch.map_or(1, |a| a.depth.max(1));
        // A trace also records the guess two layers ahead (what depth 2
        // reads): one more router product per layer and token.
        let guessed = if self.store.tracing() {
            depth.max(2)
        } else {
            depth
        };
        let mut xn = Scratch::zeroed(x.len());
        LOOKAHEAD.with(|guess| {
            let mut guess = guess.borrow_mut();
            for j in l + 1..(l + 1 + guessed).min(self.layers.len()) {
                let next = &self.layers[j];
                let Ffn::Moe(block) = &next.ffn else {
                    continue;
                };
                rms_norm(x, &next.post_attn_norm, self.cfg.rms_norm_eps, &mut xn);
                block.router.route_into(&xn, None, &mut guess);
                if prefetch.is_some() && j <= l + depth {
                    self.store.prefetch_ranked(j, variant, &guess.experts);
                }
                if j == l + 1 {
                    self.store.predict(j, variant, &guess.experts);
                } else if j == l + 2 {
                    self.store.trace_deeper_guess(j, variant, &guess.experts);
                }
            }
        });
    }

    fn norm_rows(&self, x: &[f32], w: &[f32], out: &mut [f32]) {
        let h = w.len();
        for (xr, or) in x.chunks_exact(h).zip(out.chunks_exact_mut(h)) {
            rms_norm(xr, w, self.cfg.rms_norm_eps, or);
        }
    }
}

thread_local! {
    /// The lookahead's reused routing result.
    static LOOKAHEAD: std::cell::RefCell<router::Route> = std::cell::RefCell::new(router::Route::default());
}

fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}
