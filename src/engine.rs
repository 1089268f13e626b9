//! The engine core: one loaded [`Model`] stepping many [`Session`]s.
//!
//! A [`Session`] is one sequence: its prompt, KV cache, position, sampler,
//! and the tokens it has produced. [`Engine::step`] runs one forward for a
//! batch of sessions, each contributing its next positions: a chunk of its
//! prompt (prefill, at most [`PREFILL_CHUNK`] positions) or its last token
//! (decode). Their rows go through the layers together
//! ([`Model::forward_hidden_batch`]), so each MoE layer reads the union of
//! the whole batch's experts once. Sessions come and go while the engine
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
//!         hidden = model.forward_hidden_batch(rows)
//!         for each session whose prompt is in: sample from its last row
//! ```

use crate::error::{Error, Result};
use crate::generate::GenOptions;
use crate::kv::KvCache;
use crate::model::{Model, PREFILL_CHUNK};
use crate::profile::Profile;
use crate::sampler::Sampler;
use moestream_scheduler::{Admission, Rejected, RequestId, Scheduler, SchedulerConfig};
use std::collections::HashMap;
use std::time::Instant;

/// One sequence being generated.
pub struct Session {
    prompt: Vec<u32>,
    /// Prompt tokens already in the KV cache.
    fed: usize,
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
}

impl Session {
    /// A session generating from `prompt` by `opts`. Refuses an empty
    /// prompt, ids outside the vocabulary, sampling settings out of range,
    /// a prompt longer than the context, and a request longer than the KV
    /// the RAM plan reserved. Its KV cache holds the whole request.
    pub fn new(model: &Model, prompt: &[u32], opts: &GenOptions) -> Result<Session> {
        let max_tokens = Self::check(model, prompt, opts)?;
        Ok(Session {
            prompt: prompt.to_vec(),
            fed: 0,
            kv: model.new_kv(prompt.len() + max_tokens),
            sampler: Sampler::new(opts.sampling),
            max_tokens,
            ignore_eos: opts.ignore_eos,
            eos_ids: opts.eos_ids.clone(),
            out: Vec::with_capacity(max_tokens),
            done: max_tokens == 0,
            logits: Vec::new(),
        })
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

    /// KV positions this session holds: its prompt and every token it may
    /// produce.
    pub fn kv_positions(&self) -> usize {
        self.prompt.len() + self.max_tokens
    }

    /// Whether the session has produced all it will.
    pub fn is_done(&self) -> bool {
        self.done
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
        }
        model.logits_into(last_row, &mut self.logits);
        if self.logits.iter().any(|x| !x.is_finite()) {
            return Err(Error::NonFinite {
                what: "the logits (lm_head)".into(),
            });
        }
        let id = self.sampler.sample(&self.logits);
        self.out.push(id);
        let eos = !self.ignore_eos && self.eos_ids.contains(&id);
        self.done = eos || self.out.len() == self.max_tokens;
        Ok(Some(id))
    }
}

/// One loaded model serving sessions.
pub struct Engine<'m> {
    model: &'m Model,
}

impl<'m> Engine<'m> {
    /// An engine over a loaded model.
    pub fn new(model: &'m Model) -> Engine<'m> {
        Engine { model }
    }

    /// The model.
    pub fn model(&self) -> &'m Model {
        self.model
    }

    /// One forward for every session of `sessions` that is not done (each
    /// contributing a prompt chunk or its last token), then one sampled
    /// token for each whose prompt is now in. Returns, per session, the
    /// token it produced this step, if any. Time spent is added to `prof`.
    pub fn step(
        &self,
        sessions: &mut [&mut Session],
        prof: &mut Profile,
    ) -> Result<Vec<Option<u32>>> {
        let mut produced = vec![None; sessions.len()];
        let active: Vec<usize> = (0..sessions.len())
            .filter(|&i| !sessions[i].is_done())
            .collect();
        if active.is_empty() {
            return Ok(produced);
        }
        let mut fed = Vec::with_capacity(active.len());
        let hidden = {
            let mut batch: Vec<(&[u32], &mut KvCache)> = Vec::with_capacity(active.len());
            for s in sessions.iter_mut().filter(|s| !s.done) {
                let Session {
                    prompt,
                    fed: at,
                    out,
                    kv,
                    ..
                } = &mut **s;
                let input: &[u32] = if *at < prompt.len() {
                    &prompt[*at..(*at + PREFILL_CHUNK).min(prompt.len())]
                } else {
                    &out[out.len() - 1..]
                };
                fed.push(input.len());
                batch.push((input, kv));
            }
            self.model.forward_hidden_batch(&mut batch, prof)?
        };
        let h = self.model.cfg.hidden_size;
        let mut row = 0;
        for (&i, &n) in active.iter().zip(&fed) {
            row += n;
            let last = &hidden[(row - 1) * h..row * h];
            produced[i] = sessions[i].advance(n, self.model, last)?;
        }
        Ok(produced)
    }
}

/// What happened to a request of a [`SessionPool`] in a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolEvent {
    /// It produced a token.
    Token(RequestId, u32),
    /// It produced its last token; its session is handed back.
    Finished(RequestId),
    /// It waited in the queue past the limit and was dropped unserved.
    Expired(RequestId),
}

/// Sessions admitted, queued and batched by the scheduler crate's policy:
/// a fixed number of KV slots (one running session each, its KV allocated
/// only when it gets one), a bounded queue in front of them, and batches of
/// at most `batch_max` running sessions per step, taken round-robin.
///
/// Under a RAM plan the running sessions' KV positions together never
/// exceed what the plan reserved (`Model::context_budget`): a session that
/// would pass it is refused when it should start. Callers size `kv_slots`
/// so that it cannot happen (see [`SessionPool::slots_within_budget`]).
pub struct SessionPool<'m> {
    engine: Engine<'m>,
    scheduler: Scheduler,
    running: HashMap<RequestId, Session>,
    /// Requests waiting for a slot: checked, nothing allocated yet.
    waiting: HashMap<RequestId, (Vec<u32>, GenOptions)>,
    finished: HashMap<RequestId, Session>,
    start: Instant,
}

impl<'m> SessionPool<'m> {
    /// A pool over `model` with the scheduler's limits.
    pub fn new(model: &'m Model, config: SchedulerConfig) -> SessionPool<'m> {
        SessionPool {
            engine: Engine::new(model),
            scheduler: Scheduler::new(config),
            running: HashMap::new(),
            waiting: HashMap::new(),
            finished: HashMap::new(),
            start: Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Admits a request: it runs from the next step if a slot is free, else
    /// waits in the queue. A request the model cannot serve is an error
    /// (checked now, not when it reaches a slot); a full queue is
    /// [`PoolError::Busy`].
    pub fn submit(
        &mut self,
        id: RequestId,
        prompt: &[u32],
        opts: &GenOptions,
    ) -> std::result::Result<Admission, PoolError> {
        Session::check(self.engine.model(), prompt, opts)?;
        let now = self.now_ms();
        let admission = self.scheduler.submit(id, prompt.len(), now)?;
        match admission {
            Admission::Running { .. } => match self.start(prompt, opts) {
                Ok(session) => {
                    self.running.insert(id, session);
                }
                Err(e) => {
                    let _ = self.scheduler.finish(id, now);
                    return Err(e.into());
                }
            },
            Admission::Queued { .. } => {
                self.waiting.insert(id, (prompt.to_vec(), opts.clone()));
            }
        }
        Ok(admission)
    }

    /// The most sessions of up to `positions` KV positions each that fit
    /// the model's RAM plan at once (at least 1), capped at `wanted`.
    pub fn slots_within_budget(model: &Model, positions: usize, wanted: usize) -> usize {
        match model.context_budget {
            Some(budget) => (budget / positions.max(1)).clamp(1, wanted.max(1)),
            None => wanted.max(1),
        }
    }

    /// Starts a session for a request that got a slot, within the plan's
    /// KV positions.
    fn start(&self, prompt: &[u32], opts: &GenOptions) -> Result<Session> {
        let session = Session::new(self.engine.model(), prompt, opts)?;
        if let Some(budget) = self.engine.model().context_budget {
            let in_use: usize = self.running.values().map(Session::kv_positions).sum();
            if in_use + session.kv_positions() > budget {
                return Err(Error::Request(format!(
                    "{} running sessions hold {in_use} KV positions; another {} would pass the {budget} the RAM plan reserved",
                    self.running.len(),
                    session.kv_positions()
                )));
            }
        }
        Ok(session)
    }

    /// Whether nothing is running or waiting.
    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    /// One batched step of the scheduler's next batch; returns what
    /// happened, in order. Finished sessions free their slots for the
    /// oldest waiting requests.
    pub fn step(&mut self, prof: &mut Profile) -> Result<Vec<PoolEvent>> {
        let mut events: Vec<PoolEvent> = self
            .scheduler
            .expire(self.now_ms())
            .into_iter()
            .map(|id| {
                self.waiting.remove(&id);
                PoolEvent::Expired(id)
            })
            .collect();
        let batch: Vec<RequestId> = self
            .scheduler
            .next_batch()
            .into_iter()
            .map(|b| b.0)
            .collect();
        let mut sessions: Vec<(RequestId, Session)> = batch
            .iter()
            .map(|id| {
                (
                    *id,
                    self.running.remove(id).expect("a running id has a session"),
                )
            })
            .collect();
        let produced = {
            let mut refs: Vec<&mut Session> = sessions.iter_mut().map(|s| &mut s.1).collect();
            self.engine.step(&mut refs, prof)
        };
        let produced = match produced {
            Ok(p) => p,
            Err(e) => {
                self.running.extend(sessions);
                return Err(e);
            }
        };
        for ((id, session), token) in sessions.into_iter().zip(produced) {
            if let Some(t) = token {
                events.push(PoolEvent::Token(id, t));
            }
            if session.is_done() {
                events.push(PoolEvent::Finished(id));
                self.finished.insert(id, session);
                self.retire(id)?;
            } else {
                self.running.insert(id, session);
            }
        }
        Ok(events)
    }

    /// Frees `id`'s slot and starts the request promoted into it.
    fn retire(&mut self, id: RequestId) -> Result<()> {
        let now = self.now_ms();
        let promoted = self
            .scheduler
            .finish(id, now)
            .expect("a finished session was running");
        if let Some(p) = promoted {
            let (prompt, opts) = self
                .waiting
                .remove(&p.id)
                .expect("a promoted id was waiting");
            let session = self.start(&prompt, &opts)?;
            self.running.insert(p.id, session);
        }
        Ok(())
    }

    /// Takes a finished request's session (its tokens), once.
    pub fn take_finished(&mut self, id: RequestId) -> Option<Session> {
        self.finished.remove(&id)
    }

    /// Sessions running now (holding a slot).
    pub fn running_count(&self) -> usize {
        self.scheduler.running_count()
    }

    /// Requests waiting for a slot.
    pub fn queued_count(&self) -> usize {
        self.scheduler.queued_count()
    }
}

/// Why a [`SessionPool`] refused a request.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The model cannot serve it (bad prompt, settings, length).
    #[error(transparent)]
    Request(#[from] Error),
    /// Every slot is busy and the queue is full (or the id is in use).
    #[error(transparent)]
    Busy(#[from] Rejected),
}
