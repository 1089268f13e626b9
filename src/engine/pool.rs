//! [`SessionPool`]: many requests over one engine, admitted, queued and
//! batched by the scheduler crate's policy, with finished sessions' KV
//! kept as prefixes that later requests continue from.

use super::{token_logprobs, Engine, Prefix, Session, TokenLogprobs};
use crate::engine::generate::GenOptions;
use crate::error::{Error, Result};
use crate::model::profile::Profile;
use crate::model::Model;
use moestream_scheduler::{Admission, Rejected, RequestId, Scheduler, SchedulerConfig};
use std::collections::HashMap;
use std::time::Instant;

/// What happened to a request of a [`SessionPool`].
#[derive(Clone, Debug, PartialEq)]
pub enum PoolEvent {
    /// It produced a token.
    Token(RequestId, u32),
    /// The log-probabilities of the token just produced (right after its
    /// `Token`), for a request that asked ([`SessionPool::want_logprobs`]).
    Logprobs(RequestId, TokenLogprobs),
    /// It produced its last token; [`SessionPool::take_finished`] has it.
    Finished(RequestId),
    /// It waited in the queue past the limit and was dropped unserved.
    Expired(RequestId),
    /// It failed (its forward failed, or it could not start when a slot
    /// freed); its slot is free again.
    Failed(RequestId, String),
}

/// A finished request: its prompt, the tokens it produced, and how many
/// prompt tokens continued a kept prefix instead of being prefilled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finished {
    pub prompt: Vec<u32>,
    pub tokens: Vec<u32>,
    pub reused: usize,
    /// Its output constraint completed (it ended there, not at EOS or
    /// the token limit).
    pub constraint_complete: bool,
}

/// A slot holding a running request (what llama-server's `/slots` lists).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotState {
    pub slot: usize,
    pub id: RequestId,
    pub prompt_tokens: usize,
    /// Tokens generated so far, and how many more it may generate.
    pub decoded: usize,
    pub remaining: usize,
}

/// Sessions admitted, queued and batched by the scheduler crate's policy:
/// a fixed number of KV slots (one running session each, its KV allocated
/// only when it gets one), a bounded queue in front of them, and batches of
/// at most `batch_max` running sessions per step, taken round-robin.
///
/// Up to `prefixes_max` ended sessions keep their KV as [`Prefix`]es
/// (most recently used last); a request whose prompt starts with one's
/// tokens continues from it, so a multi-turn chat never prefills the
/// conversation again.
///
/// Under a RAM plan the KV positions of running sessions and kept prefixes
/// together never exceed what the plan reserved (`Model::context_budget`):
/// the least recently used prefixes are dropped to make room, and a session
/// that would still pass it is refused when it should start. Callers size
/// `kv_slots` so that it cannot happen (see
/// [`SessionPool::slots_within_budget`]).
pub struct SessionPool<'m> {
    engine: Engine<'m>,
    scheduler: Scheduler,
    running: HashMap<RequestId, Session>,
    /// Requests waiting for a slot: checked, nothing allocated yet.
    waiting: HashMap<RequestId, (Vec<u32>, GenOptions)>,
    finished: HashMap<RequestId, Finished>,
    /// Requests that want log-probabilities, with how many alternatives.
    logprobs: HashMap<RequestId, usize>,
    prefixes: Vec<Prefix>,
    prefixes_max: usize,
    /// Bumped whenever the kept prefixes change.
    prefix_generation: u64,
    /// Events of work done between steps (a cancel promoting a request
    /// that then failed to start), handed out by the next step.
    pending: Vec<PoolEvent>,
    start: Instant,
}

impl<'m> SessionPool<'m> {
    /// A pool over `model` with the scheduler's limits, keeping no prefix.
    pub fn new(model: &'m Model, config: SchedulerConfig) -> SessionPool<'m> {
        SessionPool {
            engine: Engine::new(model),
            scheduler: Scheduler::new(config),
            running: HashMap::new(),
            waiting: HashMap::new(),
            finished: HashMap::new(),
            logprobs: HashMap::new(),
            prefixes: Vec::new(),
            prefixes_max: 0,
            prefix_generation: 0,
            pending: Vec::new(),
            start: Instant::now(),
        }
    }

    /// Keeps up to `n` ended sessions' KV as prefixes (0: none).
    pub fn keep_prefixes(&mut self, n: usize) {
        self.prefixes_max = n;
        self.trim_prefixes();
    }

    /// How many ended sessions' KV are kept at most.
    pub fn prefixes_max(&self) -> usize {
        self.prefixes_max
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

    /// Starts a session for a request that got a slot: from the kept
    /// prefix it shares most tokens with, within the plan's KV positions
    /// (dropping the least recently used other prefixes to make room).
    fn start(&mut self, prompt: &[u32], opts: &GenOptions) -> Result<Session> {
        let model = self.engine.model();
        let positions = prompt.len() + Session::check(model, prompt, opts)?;
        let prefix = self.take_prefix(prompt);
        let needed = prefix
            .as_ref()
            .map_or(positions, |p| p.kv.capacity().max(positions));
        if let Some(budget) = model.context_budget {
            while self.positions_in_use() + needed > budget && !self.prefixes.is_empty() {
                self.prefixes.remove(0);
                self.prefix_generation += 1;
            }
            let in_use = self.positions_in_use();
            if in_use + needed > budget {
                return Err(Error::Request(format!(
                    "{} running sessions hold {in_use} KV positions; another {needed} would pass the {budget} the RAM plan reserved",
                    self.running.len(),
                )));
            }
        }
        Session::resume(model, prompt, opts, prefix)
    }

    /// KV positions held by running sessions and kept prefixes.
    fn positions_in_use(&self) -> usize {
        let running: usize = self.running.values().map(Session::kv_positions).sum();
        let kept: usize = self.prefixes.iter().map(|p| p.kv.capacity()).sum();
        running + kept
    }

    /// Removes and returns the kept prefix a session for `prompt` reuses
    /// most positions of, if any reuses one.
    fn take_prefix(&mut self, prompt: &[u32]) -> Option<Prefix> {
        let (best, reusable) = self
            .prefixes
            .iter()
            .enumerate()
            .map(|(i, p)| (i, p.reusable(prompt)))
            .max_by_key(|&(i, n)| (n, i))?;
        if reusable == 0 {
            return None;
        }
        self.prefix_generation += 1;
        Some(self.prefixes.remove(best))
    }

    /// Keeps `prefix` as the most recently used, dropping the least
    /// recently used beyond `prefixes_max`.
    pub fn keep_prefix(&mut self, prefix: Prefix) {
        if prefix.tokens.is_empty() {
            return;
        }
        self.prefixes.push(prefix);
        self.prefix_generation += 1;
        self.trim_prefixes();
    }

    fn trim_prefixes(&mut self) {
        let excess = self.prefixes.len().saturating_sub(self.prefixes_max);
        if excess > 0 {
            self.prefixes.drain(..excess);
            self.prefix_generation += 1;
        }
    }

    /// The kept prefixes, least recently used first.
    pub fn prefixes_mut(&mut self) -> &mut [Prefix] {
        &mut self.prefixes
    }

    /// A number that changes whenever the kept prefixes change.
    pub fn prefix_generation(&self) -> u64 {
        self.prefix_generation
    }

    /// Whether nothing is running or waiting.
    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    /// One batched step of the scheduler's next batch; returns what
    /// happened, in order. Finished sessions free their slots for the
    /// oldest waiting requests. A failed forward fails the requests of
    /// Prompt positions prefilled so far, and the seconds of the steps
    /// that prefilled them ([`Engine::prefill_totals`]).
    pub fn prefill_totals(&self) -> (u64, f64) {
        self.engine.prefill_totals()
    }

    /// its batch ([`PoolEvent::Failed`]), not the pool.
    pub fn step(&mut self, prof: &mut Profile) -> Vec<PoolEvent> {
        let mut events = std::mem::take(&mut self.pending);
        for id in self.scheduler.expire(self.now_ms()) {
            self.waiting.remove(&id);
            self.logprobs.remove(&id);
            events.push(PoolEvent::Expired(id));
        }
        let batch: Vec<RequestId> = self.scheduler.next_batch().iter().map(|b| b.0).collect();
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
                for (id, _) in sessions {
                    self.logprobs.remove(&id);
                    events.push(PoolEvent::Failed(id, e.to_string()));
                    self.retire(id, &mut events);
                }
                return events;
            }
        };
        for ((id, session), n) in sessions.into_iter().zip(produced) {
            let tokens = session.tokens();
            for &t in &tokens[tokens.len() - n..] {
                events.push(PoolEvent::Token(id, t));
            }
            // A session wanting logprobs does not draft: one token a step.
            if let (1, Some(&top)) = (n, self.logprobs.get(&id)) {
                let t = tokens[tokens.len() - 1];
                let lp = token_logprobs(session.logits(), t, top);
                events.push(PoolEvent::Logprobs(id, lp));
            }
            if session.is_done() {
                self.finish(id, session);
                events.push(PoolEvent::Finished(id));
                self.retire(id, &mut events);
            } else {
                self.running.insert(id, session);
            }
        }
        events
    }

    /// Asks for each token's log-probability of request `id`, with the
    /// `top` most likely alternatives.
    pub fn want_logprobs(&mut self, id: RequestId, top: usize) {
        self.logprobs.insert(id, top);
        if let Some(s) = self.running.get_mut(&id) {
            s.stop_speculating();
        }
    }

    /// Records a finished session and keeps its KV as a prefix.
    fn finish(&mut self, id: RequestId, session: Session) {
        self.logprobs.remove(&id);
        let finished = Finished {
            prompt: session.prompt.clone(),
            tokens: session.out.clone(),
            reused: session.reused,
            constraint_complete: session.constraint_complete(),
        };
        self.finished.insert(id, finished);
        if self.prefixes_max > 0 {
            self.keep_prefix(session.into_prefix());
        }
    }

    /// Frees `id`'s slot and starts the request promoted into it (a
    /// promoted request that cannot start fails, freeing the slot again).
    fn retire(&mut self, id: RequestId, events: &mut Vec<PoolEvent>) {
        let mut freed = Some(id);
        while let Some(id) = freed.take() {
            let now = self.now_ms();
            let promoted = self
                .scheduler
                .finish(id, now)
                .expect("a retired request was running");
            let Some(p) = promoted else { break };
            let (prompt, opts) = self
                .waiting
                .remove(&p.id)
                .expect("a promoted id was waiting");
            match self.start(&prompt, &opts) {
                Ok(mut session) => {
                    if self.logprobs.contains_key(&p.id) {
                        session.stop_speculating();
                    }
                    self.running.insert(p.id, session);
                }
                Err(e) => {
                    events.push(PoolEvent::Failed(p.id, e.to_string()));
                    freed = Some(p.id);
                }
            }
        }
    }

    /// Ends request `id` wherever it is (its client went away): a running
    /// session frees its slot within this call and keeps its KV as a
    /// prefix; a queued request leaves the queue. Returns whether `id` was
    /// known. Events of requests promoted into the freed slot come with the
    /// next step.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        self.logprobs.remove(&id);
        if let Some(session) = self.running.remove(&id) {
            if self.prefixes_max > 0 {
                self.keep_prefix(session.into_prefix());
            }
            let mut events = Vec::new();
            self.retire(id, &mut events);
            self.pending.extend(events);
            return true;
        }
        if self.waiting.remove(&id).is_some() {
            let _ = self.scheduler.finish(id, self.now_ms());
            return true;
        }
        false
    }

    /// Takes a finished request's result, once.
    pub fn take_finished(&mut self, id: RequestId) -> Option<Finished> {
        self.finished.remove(&id)
    }

    /// The running session of `id` (to read its logits after a token).
    pub fn session(&self, id: RequestId) -> Option<&Session> {
        self.running.get(&id)
    }

    /// Sessions running now (holding a slot).
    pub fn running_count(&self) -> usize {
        self.scheduler.running_count()
    }

    /// The slots running a request, by slot number.
    pub fn slots(&self) -> Vec<SlotState> {
        let mut out: Vec<SlotState> = self
            .running
            .iter()
            .filter_map(|(&id, s)| {
                Some(SlotState {
                    slot: self.scheduler.slot_of(id)?,
                    id,
                    prompt_tokens: s.prompt.len(),
                    decoded: s.out.len(),
                    remaining: s.max_tokens.saturating_sub(s.out.len()),
                })
            })
            .collect();
        out.sort_by_key(|s| s.slot);
        out
    }

    /// Requests waiting for a slot.
    pub fn queued_count(&self) -> usize {
        self.scheduler.queued_count()
    }

    /// The engine.
    pub fn engine(&self) -> &Engine<'m> {
        &self.engine
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
