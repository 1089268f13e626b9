//! The engine core: one loaded [`Model`] stepping many [`Session`]s.
//!
//! A [`Session`] is one sequence: its prompt, KV cache, position, sampler,
//! and the tokens it has produced. [`Engine::step`] runs one forward for a
//! batch of sessions, each contributing its next positions: a pass of its
//! prompt (prefill: the prefilling sessions share one
//! [`Model::prefill_pass`], each taking whole [`PREFILL_CHUNK`]s) or its
//! last token (decode). Their rows go through the layers together
//! ([`Model::forward_pass_batch`]: layer-major, each layer over every row
//! before the next), so each MoE layer reads the union of the whole
//! batch's experts once. Sessions come and go while the engine
//! lives, and a session's tokens never depend on which others shared its
//! steps: per-row arithmetic is the same alone or batched.
//!
//! The generation loop, top-down:
//!
//! ```text
//! session = Session::new(model, prompt, opts)     // validate, size KV
//! while !session.is_done():
//!     engine.step([session])                      // prefill chunk or decode
//!         rows   = next positions of each session
//!         hidden = model.forward_pass_batch(rows)
//!         for each session whose prompt is in: sample from its last row
//! ```

use crate::engine::sampler::Sampler;
use crate::engine::spec_gate::{Gate, StepCost};
use crate::error::{Error, Result};
use crate::model::kv::KvCache;
use crate::model::profile::Profile;
use crate::model::{Model, PassProgress, PREFILL_CHUNK};
use std::sync::atomic::{AtomicU64, Ordering};

pub mod calibrate;
pub mod gbnf;
pub mod gen_config;
pub mod generate;
mod grammar;
pub mod kv_file;
mod logprobs;
mod pool;
pub mod runtime;
pub mod sampler;
pub mod spec_gate;
mod speculate;
pub use grammar::{Constraint, GrammarState, Grammars};
pub use logprobs::{token_logprobs, TokenLogprobs};
pub use pool::{Finished, PoolError, PoolEvent, SessionPool, SlotState};
pub use speculate::{
    ngram_propose, DraftSource, Drafters, MtpDraft, NgramDraft, SpecStats, Speculation,
};

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenOptions {
    pub max_tokens: usize,
    pub sampling: crate::engine::sampler::SamplingParams,
    /// Keep going past EOS until `max_tokens`.
    pub ignore_eos: bool,
    pub eos_ids: Vec<u32>,
    /// Draft tokens and verify them in one forward (lossless).
    pub speculation: Speculation,
    /// Constrain the output to a grammar, a JSON schema or a regex.
    pub constraint: Option<Constrained>,
    /// Added to these tokens' logits before each choice (OpenAI's
    /// `logit_bias`; -100 bans a token, 100 all but forces it).
    pub logit_bias: Vec<(u32, f32)>,
}

/// New tokens when nothing says how many (the command line's `-n`).
pub const MAX_TOKENS_DEFAULT: usize = 64;

impl Default for GenOptions {
    /// [`MAX_TOKENS_DEFAULT`] greedy tokens ([`SamplingParams`]'s
    /// defaults), stopping at no id, unconstrained, without speculation.
    ///
    /// [`SamplingParams`]: crate::engine::sampler::SamplingParams
    fn default() -> Self {
        GenOptions {
            max_tokens: MAX_TOKENS_DEFAULT,
            sampling: Default::default(),
            ignore_eos: false,
            eos_ids: Vec::new(),
            speculation: Speculation::Off,
            constraint: None,
            logit_bias: Vec::new(),
        }
    }
}

/// One sequence being generated.
pub struct Session {
    prompt: Vec<u32>,
    /// Prompt tokens already in the KV cache.
    fed: usize,
    /// Prompt tokens whose KV came from a reused prefix.
    reused: usize,
    kv: KvCache,
    sampler: Sampler,
    /// New tokens to produce at most (clamped to the context).
    max_tokens: usize,
    ignore_eos: bool,
    eos_ids: Vec<u32>,
    out: Vec<u32>,
    done: bool,
    /// The last row's logits (reused between steps).
    logits: Vec<f32>,
    /// The draft sources and the most tokens drafted per step.
    drafter: Option<Drafters>,
    /// This step's drafts (after the last token).
    drafts: Vec<u32>,
    /// The positions fed by a decode step: the last token, then drafts.
    feed: Vec<u32>,
    spec_stats: SpecStats,
    /// Whether this step drafts, from measured figures (`--speculate
    /// auto`); `None`: every step with a drafter drafts.
    gate: Option<Gate>,
    /// The output constraint's state, if any.
    grammar: Option<GrammarState>,
    /// A constraint that starts once the output holds its `after` text
    /// (then it moves into `grammar`), and the output's last bytes, fewer
    /// than that text's.
    trigger: Option<Constrained>,
    tail: Vec<u8>,
    /// Added to these logits before each choice.
    logit_bias: Vec<(u32, f32)>,
    /// With forks wanted ([`Session::want_forks`]): the last prompt
    /// position's hidden row, once the prompt is in.
    fork_row: Option<Vec<f32>>,
}

impl Session {
    /// A session generating from `prompt` by `opts`. Refuses an empty
    /// prompt, ids outside the vocabulary, sampling settings out of range,
    /// a prompt longer than the context, and a request longer than the KV
    /// the RAM plan reserved. Its KV cache holds the whole request.
    pub fn new(model: &Model, prompt: &[u32], opts: &GenOptions) -> Result<Session> {
        Self::resume(model, prompt, opts, None)
    }

    /// [`Session::new`], continuing from `prefix`'s KV cache where its
    /// tokens start the prompt: those positions are not computed again
    /// ([`Session::reused`] counts them). The prefix's cache is truncated
    /// to the shared tokens and grown to hold the whole request.
    pub fn resume(
        model: &Model,
        prompt: &[u32],
        opts: &GenOptions,
        prefix: Option<Prefix>,
    ) -> Result<Session> {
        let positions = prompt.len() + Self::check(model, prompt, opts)?;
        let (kv, fed) = match prefix {
            Some(p) => {
                let reused = p.reusable(prompt);
                let mut kv = p.kv;
                kv.truncate(reused);
                kv.grow(positions);
                (kv, reused)
            }
            None => (model.new_kv(positions), 0),
        };
        Self::build(model, prompt, opts, kv, fed)
    }

    /// A session whose `kv` holds its prompt's first `fed` positions.
    fn build(
        model: &Model,
        prompt: &[u32],
        opts: &GenOptions,
        kv: KvCache,
        fed: usize,
    ) -> Result<Session> {
        let max_tokens = Self::check(model, prompt, opts)?;
        let positions = prompt.len() + max_tokens;
        // A constrained or biased session does not draft: its mask depends
        // on every token before it, and a draft is verified against
        // unbiased logits.
        let drafter = match (&opts.constraint, opts.logit_bias.is_empty()) {
            (None, true) => opts.speculation.drafters(model, positions)?,
            _ => None,
        };
        Ok(Session {
            prompt: prompt.to_vec(),
            fed,
            reused: fed,
            kv,
            sampler: Sampler::new(opts.sampling),
            max_tokens,
            ignore_eos: opts.ignore_eos,
            eos_ids: opts.eos_ids.clone(),
            out: Vec::with_capacity(max_tokens),
            done: max_tokens == 0,
            logits: Vec::new(),
            gate: drafter
                .as_ref()
                .filter(|_| opts.speculation.gated())
                .map(Drafters::gate),
            drafter,
            grammar: match &opts.constraint {
                Some(c) if c.after.is_empty() => Some(c.grammars.start(&c.constraint)?),
                _ => None,
            },
            trigger: opts.constraint.clone().filter(|c| !c.after.is_empty()),
            tail: Vec::new(),
            drafts: Vec::new(),
            feed: Vec::new(),
            spec_stats: SpecStats::default(),
            logit_bias: opts.logit_bias.clone(),
            fork_row: None,
        })
    }

    /// Keeps the last prompt position's hidden row once the prompt is in,
    /// so that [`Session::fork`] can start sequences from it.
    pub fn want_forks(&mut self, hidden: usize) {
        self.fork_row = Some(Vec::with_capacity(hidden));
    }

    /// A new sequence continuing this one's prompt by `opts` (another
    /// choice of one request): a copy of the prompt's KV and its first
    /// token sampled from the kept last row with its own sampler, so the
    /// prompt is computed once for every choice. Call right after the
    /// step that took the prompt in, on a session that
    /// [wanted forks](Session::want_forks). A fork does not draft (a
    /// drafter's state follows the rows it observed).
    pub fn fork(&mut self, model: &Model, opts: &GenOptions) -> Result<Session> {
        assert!(
            !self.in_prefill() && self.kv.len() == self.prompt.len(),
            "a session forks right after its prompt is in"
        );
        let row = self.fork_row.take().expect("forks were wanted");
        let positions = self.prompt.len() + Self::check(model, &self.prompt, opts)?;
        let kv = self.kv.fork(positions);
        let built = Self::build(model, &self.prompt, opts, kv, self.prompt.len());
        let result = built.and_then(|mut fork| {
            fork.reused = self.reused;
            fork.stop_speculating();
            fork.advance(0, model, &row)?;
            Ok(fork)
        });
        self.fork_row = Some(row);
        result
    }

    /// What [`Session::new`] refuses, without allocating anything (for a
    /// request that waits in a queue before it gets its KV cache). Returns
    /// the new tokens the session will produce at most.
    pub fn check(model: &Model, prompt: &[u32], opts: &GenOptions) -> Result<usize> {
        if prompt.is_empty() {
            return Err(Error::Request("the prompt is empty".into()));
        }
        opts.sampling.validate().map_err(Error::Request)?;
        model.check_tokens(prompt)?;
        let context_max = model.cfg.rope.max_position_embeddings;
        if prompt.len() > context_max {
            return Err(Error::Request(format!(
                "the prompt has {} tokens; the model's context is {context_max} (max_position_embeddings)",
                prompt.len()
            )));
        }
        // Generation stops when the context is full.
        let max_tokens = opts.max_tokens.min(context_max - prompt.len());
        if let Some(budgeted) = model.context_budget {
            if prompt.len() + max_tokens > budgeted {
                return Err(Error::ContextBudget {
                    needed: prompt.len() + max_tokens,
                    reserved: budgeted,
                });
            }
        }
        Ok(max_tokens)
    }

    /// KV positions this session holds: at least its prompt and every
    /// token it may produce.
    pub fn kv_positions(&self) -> usize {
        self.kv.capacity()
    }

    /// Prompt tokens whose KV came from a reused prefix (not prefilled).
    pub fn reused(&self) -> usize {
        self.reused
    }

    /// The last sampled position's logits (empty before the first token).
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    /// Ends the session, keeping its KV cache and the tokens whose
    /// positions it holds, for a later request that starts with them.
    pub fn into_prefix(self) -> Prefix {
        let n = self.kv.len();
        let mut tokens = self.prompt;
        tokens.extend_from_slice(&self.out);
        tokens.truncate(n);
        Prefix {
            tokens,
            kv: self.kv,
        }
    }

    /// Whether its output constraint is complete: nothing more may follow
    /// (false without a constraint).
    pub fn constraint_complete(&self) -> bool {
        self.grammar.as_ref().is_some_and(GrammarState::is_stopped)
    }

    /// Whether the session has produced all it will.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Prompt tokens in the KV cache so far.
    pub fn prefilled(&self) -> usize {
        self.fed
    }

    /// Whether some of the prompt is not in the KV cache yet.
    pub fn in_prefill(&self) -> bool {
        self.fed < self.prompt.len()
    }

    /// The prompt.
    pub fn prompt(&self) -> &[u32] {
        &self.prompt
    }

    /// The tokens produced so far.
    pub fn tokens(&self) -> &[u32] {
        &self.out
    }

    /// Takes in a step that fed `fed` positions: once the prompt is all in,
    /// turns its last row's hidden state into logits and samples the next
    /// token (returned).
    fn advance(&mut self, fed: usize, model: &Model, last_row: &[f32]) -> Result<Option<u32>> {
        if self.in_prefill() {
            self.fed += fed;
            if self.in_prefill() {
                return Ok(None);
            }
            if let Some(row) = &mut self.fork_row {
                row.clear();
                row.extend_from_slice(last_row);
            }
        }
        self.logits_of(model, last_row)?;
        for &(id, bias) in &self.logit_bias {
            if let Some(l) = self.logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        if let Some(g) = &mut self.grammar {
            g.mask(&mut self.logits)?;
        }
        let id = self.sampler.sample(&self.logits, &self.prompt, &self.out);
        self.push(id);
        if self.trigger.is_some() {
            self.watch_trigger(id);
            return Ok(Some(id));
        }
        if let Some(g) = &mut self.grammar {
            let eos = self.eos_ids.contains(&id);
            if !eos {
                g.consume(id)?;
            }
            self.done |= eos || g.is_stopped();
        }
        Ok(Some(id))
    }

    /// Looks for the lazy constraint's text in the output up to token
    /// `id`; once it is there, the constraint holds from right after it.
    fn watch_trigger(&mut self, id: u32) {
        let Some(c) = &self.trigger else { return };
        self.tail.extend_from_slice(c.grammars.token_bytes(id));
        let marker = &c.after;
        let Some(at) = self
            .tail
            .windows(marker.len())
            .position(|w| w == &marker[..])
        else {
            let keep = self.tail.len().saturating_sub(marker.len() - 1);
            self.tail.drain(..keep);
            return;
        };
        let rest = &self.tail[at + marker.len()..];
        // What followed the marker in this token must start the calls;
        // if it cannot, the output stays free (the parser keeps it as text).
        if let Ok(g) = c.grammars.start_with(&c.constraint, rest) {
            self.done |= g.is_stopped();
            self.grammar = Some(g);
        }
        self.trigger = None;
        self.tail = Vec::new();
    }

    /// Turns one row's hidden state into `self.logits`, refusing
    /// non-finite ones.
    fn logits_of(&mut self, model: &Model, row: &[f32]) -> Result<()> {
        model.logits_into(row, &mut self.logits);
        if self.logits.iter().any(|x| !x.is_finite()) {
            return Err(Error::NonFinite {
                what: "the logits (lm_head)".into(),
            });
        }
        Ok(())
    }

    /// Appends a produced token; the session is done at EOS or the limit.
    fn push(&mut self, id: u32) {
        self.out.push(id);
        let eos = !self.ignore_eos && self.eos_ids.contains(&id);
        self.done = eos || self.out.len() == self.max_tokens;
    }

    /// Drafts with `source`, up to `k` tokens a step, from the next step
    /// on (a custom draft source; `GenOptions::speculation` names the
    /// built-in ones).
    pub fn set_drafter(&mut self, source: Box<dyn DraftSource>, k: usize) {
        self.drafter = Some(Drafters::new(vec![source], k));
    }

    /// Stops drafting (a request that wants per-token logprobs).
    pub fn stop_speculating(&mut self) {
        self.drafter = None;
        self.gate = None;
    }

    /// Puts drafting behind a fresh gate ([`spec_gate`]), as
    /// `Speculation::Auto` does (nothing without a drafter).
    pub fn gate_drafting(&mut self) {
        self.gate = self.drafter.as_ref().map(Drafters::gate);
    }

    /// What speculation did so far, with the gate's figures (taken here,
    /// not per step, so a gated decode step allocates nothing for them).
    pub fn spec_stats(&self) -> SpecStats {
        SpecStats {
            gate: self.gate.as_ref().map(Gate::stats),
            ..self.spec_stats.clone()
        }
    }
}

/// A KV cache kept after its session ended, with the tokens whose
/// positions it holds: a request starting with those tokens continues from
/// it instead of computing them again.
pub struct Prefix {
    pub tokens: Vec<u32>,
    pub kv: KvCache,
}

impl Prefix {
    /// Positions of this prefix a session for `prompt` can reuse: the
    /// tokens both start with, short of the prompt's last token (a session
    /// feeds at least one position to have logits to sample from).
    pub fn reusable(&self, prompt: &[u32]) -> usize {
        let common = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        common
            .min(self.kv.len())
            .min(prompt.len().saturating_sub(1))
    }
}

/// A constraint with the model's prepared tokenizer.
#[derive(Clone, Debug)]
pub struct Constrained {
    pub grammars: Grammars,
    pub constraint: Constraint,
    /// Empty: the constraint holds from the first token. Else it holds
    /// from right after this text (a tool call's opening marker) to the
    /// end, once the output has it; the output before is free. Should
    /// what follows the marker in the same token not start the
    /// constraint's language, the output stays free.
    pub after: Vec<u8>,
}

/// One loaded model serving sessions.
pub struct Engine<'m> {
    model: &'m Model,
    /// Prompt positions prefilled, and the time of the steps that did.
    prefill_tokens: AtomicU64,
    prefill_nanos: AtomicU64,
}

impl<'m> Engine<'m> {
    /// An engine over a loaded model.
    pub fn new(model: &'m Model) -> Engine<'m> {
        Engine {
            model,
            prefill_tokens: AtomicU64::new(0),
            prefill_nanos: AtomicU64::new(0),
        }
    }

    /// Prompt positions this engine prefilled, and the seconds of the
    /// steps that prefilled them (rows decoded alongside included).
    pub fn prefill_totals(&self) -> (u64, f64) {
        let nanos = self.prefill_nanos.load(Ordering::Relaxed);
        (
            self.prefill_tokens.load(Ordering::Relaxed),
            nanos as f64 / 1e9,
        )
    }

    /// The model.
    pub fn model(&self) -> &'m Model {
        self.model
    }

    /// Prompt positions each of `prefilling` sessions feeds in one step:
    /// an equal share of the prefill pass in whole chunks, at least one
    /// chunk (so every session moves, and chunk boundaries stay where a
    /// chunked prefill put them).
    fn pass_share(&self, prefilling: usize) -> usize {
        let pass = self.model.prefill_pass.positions;
        if pass < PREFILL_CHUNK {
            return pass.max(1);
        }
        (pass / prefilling.max(1) / PREFILL_CHUNK).max(1) * PREFILL_CHUNK
    }

    /// One forward for every session of `sessions` that is not done (each
    /// contributing a prompt chunk, or its last token and any drafts),
    /// then the tokens of each whose prompt is now in: one sampled token,
    /// or with drafts the accepted ones and the target's next. Returns,
    /// per session, how many tokens it produced this step (the last of
    /// [`Session::tokens`]). Time spent is added to `prof`.
    pub fn step(&self, sessions: &mut [&mut Session], prof: &mut Profile) -> Result<Vec<usize>> {
        let mut produced = vec![0; sessions.len()];
        let active: Vec<usize> = (0..sessions.len())
            .filter(|&i| !sessions[i].is_done())
            .collect();
        if active.is_empty() {
            return Ok(produced);
        }
        let started = std::time::Instant::now();
        let gated = active.iter().any(|&i| sessions[i].gate.is_some());
        let bytes_before = gated.then(|| self.model.store.counters().bytes_read);
        let mut prefilled = 0;
        let mut fed = Vec::with_capacity(active.len());
        let prefilling = sessions
            .iter()
            .filter(|s| !s.done && s.in_prefill())
            .count();
        let share = self.pass_share(prefilling);
        let mut progress = None;
        let hidden = {
            let mut batch: Vec<(&[u32], &mut KvCache)> = Vec::with_capacity(active.len());
            for s in sessions.iter_mut().filter(|s| !s.done) {
                s.prepare_feed(self.model, prof)?;
                let Session {
                    prompt,
                    fed: at,
                    feed,
                    kv,
                    ..
                } = &mut **s;
                let input: &[u32] = if *at < prompt.len() {
                    if prefilling == 1 && prompt.len() > PREFILL_CHUNK {
                        progress = Some(PassProgress {
                            done: *at as u64,
                            total: prompt.len() as u64,
                        });
                    }
                    let input = &prompt[*at..(*at + share).min(prompt.len())];
                    prefilled += input.len();
                    input
                } else {
                    feed
                };
                fed.push(input.len());
                batch.push((input, kv));
            }
            self.model.forward_pass_batch(&mut batch, progress, prof)?
        };
        if prefilled > 0 {
            let nanos = started.elapsed().as_nanos() as u64;
            self.prefill_tokens
                .fetch_add(prefilled as u64, Ordering::Relaxed);
            self.prefill_nanos.fetch_add(nanos, Ordering::Relaxed);
        }
        let h = self.model.cfg.hidden_size;
        let mut row = 0;
        // Decode steps: the session, its accepted drafts.
        let mut decoded = Vec::with_capacity(active.len());
        for (&i, &n) in active.iter().zip(&fed) {
            let rows = &hidden[row * h..(row + n) * h];
            row += n;
            let s = &mut *sessions[i];
            let start = s.kv.len() - n;
            let decoding = !s.in_prefill();
            let accepted;
            (produced[i], accepted) = if !decoding || s.drafts.is_empty() {
                let n = s.advance(n, self.model, &rows[(n - 1) * h..])?.is_some() as usize;
                (n, 0)
            } else {
                s.verify(self.model, rows)?
            };
            if decoding {
                decoded.push((i, accepted));
            }
            s.observe(self.model, rows, start, prof)?;
        }
        if let Some(before) = bytes_before {
            let cost = StepCost {
                seconds: started.elapsed().as_secs_f64(),
                bytes: self
                    .model
                    .store
                    .counters()
                    .bytes_read
                    .saturating_sub(before),
            };
            for (i, accepted) in decoded {
                sessions[i].record_gate(cost, accepted, produced[i]);
            }
        }
        Ok(produced)
    }
}
