//! [`SessionPool`]: many requests over one engine, admitted, queued and
//! batched by the scheduler crate's policy, with finished sessions' KV
//! kept as prefixes that later requests continue from. The choices of
//! one request share its prompt: the first prefills it, the others hold a
//! slot until then and fork its KV ([`SessionPool::submit_fork`]). What a
//! slot last left can be saved, erased, or restored from a file
//! (llama-server's `/slots/{id}` actions).

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
    /// Choices holding a slot until their leader's prompt is in (then
    /// they fork from it): the leader and the choice's options.
    forks: HashMap<RequestId, (RequestId, GenOptions)>,
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
    /// Per slot, the tokens of the prefix its last session left (or a
    /// restore put there): what `/slots/{id}?action=save` saves.
    slot_tokens: Vec<Option<Vec<u32>>>,
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
            forks: HashMap::new(),
            finished: HashMap::new(),
            logprobs: HashMap::new(),
            prefixes: Vec::new(),
            prefixes_max: 0,
            prefix_generation: 0,
            pending: Vec::new(),
            slot_tokens: vec![None; config.kv_slots],
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

    /// Admits another choice of request `leader` (the same prompt, `opts`
    /// its own sampling): while the leader prefills, the choice holds a
    /// slot and waits; once the leader's prompt is in, the choice starts
    /// from a copy of its KV, its first token sampled from the same last
    /// row ([`Session::fork`]), so the prompt is prefilled once for every
    /// choice. A leader queued or past its prompt leaves the choice to
    /// start on its own (continuing a kept prefix if one fits).
    pub fn submit_fork(
        &mut self,
        id: RequestId,
        leader: RequestId,
        opts: &GenOptions,
    ) -> std::result::Result<Admission, PoolError> {
        let prompt = match (self.running.get(&leader), self.waiting.get(&leader)) {
            (Some(s), _) => s.prompt().to_vec(),
            (None, Some((p, _))) => p.clone(),
            (None, None) => {
                let msg = format!("request {leader} is neither running nor waiting");
                return Err(Error::Request(msg).into());
            }
        };
        if !self.running.get(&leader).is_some_and(Session::in_prefill) {
            return self.submit(id, &prompt, opts);
        }
        let model = self.engine.model();
        Session::check(model, &prompt, opts)?;
        let admission = self.scheduler.submit(id, prompt.len(), self.now_ms())?;
        match admission {
            Admission::Running { .. } => {
                let session = self.running.get_mut(&leader).expect("checked above");
                session.want_forks(model.cfg.hidden_size);
                self.forks.insert(id, (leader, opts.clone()));
            }
            Admission::Queued { .. } => {
                self.waiting.insert(id, (prompt, opts.clone()));
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
        self.make_room(0, needed)?;
        Session::resume(model, prompt, opts, prefix)
    }

    /// Makes room for a session of `needed` KV positions within the RAM
    /// plan's, `outside` positions being held by sessions out of
    /// `running` (a step's batch): drops the least recently used prefixes
    /// while they are in the way, refuses when the running ones are.
    fn make_room(&mut self, outside: usize, needed: usize) -> Result<()> {
        let Some(budget) = self.engine.model().context_budget else {
            return Ok(());
        };
        while outside + self.positions_in_use() + needed > budget && !self.prefixes.is_empty() {
            self.prefixes.remove(0);
            self.prefix_generation += 1;
        }
        let in_use = outside + self.positions_in_use();
        if in_use + needed > budget {
            return Err(Error::Request(format!(
                "{} running sessions hold {in_use} KV positions; another {needed} would pass the {budget} the RAM plan reserved",
                self.running.len(),
            )));
        }
        Ok(())
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
        self.running.is_empty() && self.waiting.is_empty() && self.forks.is_empty()
    }

    /// Prompt positions prefilled so far, and the seconds of the steps
    /// that prefilled them ([`Engine::prefill_totals`]).
    pub fn prefill_totals(&self) -> (u64, f64) {
        self.engine.prefill_totals()
    }

    /// One batched step of the scheduler's next batch; returns what
    /// happened, in order. Finished sessions free their slots for the
    /// oldest waiting requests. A failed forward (or one interrupted by
    /// the model's [`Interrupt`](crate::model::progress::Interrupt)) fails
    /// the requests of its batch ([`PoolEvent::Failed`]), not the pool.
    pub fn step(&mut self, prof: &mut Profile) -> Vec<PoolEvent> {
        let mut events = std::mem::take(&mut self.pending);
        for id in self.scheduler.expire(self.now_ms()) {
            self.waiting.remove(&id);
            self.logprobs.remove(&id);
            events.push(PoolEvent::Expired(id));
        }
        // Choices waiting for their leader's prompt hold a slot, no session.
        let batch: Vec<RequestId> = (self.scheduler.next_batch().iter())
            .map(|b| b.0)
            .filter(|id| !self.forks.contains_key(id))
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
                for (id, _) in sessions {
                    let forks = self.forks_of(id);
                    for id in std::iter::once(id).chain(forks) {
                        self.forks.remove(&id);
                        self.logprobs.remove(&id);
                        events.push(PoolEvent::Failed(id, e.to_string()));
                        self.retire(id, &mut events);
                    }
                }
                return events;
            }
        };
        let forked = self.fork_choices(&mut sessions);
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
        for (id, fork) in forked {
            self.start_fork(id, fork, &mut events);
        }
        events
    }

    /// The choices waiting for `leader`'s prompt, by id.
    fn forks_of(&self, leader: RequestId) -> Vec<RequestId> {
        let mut ids: Vec<RequestId> = (self.forks.iter())
            .filter(|(_, f)| f.0 == leader)
            .map(|(&id, _)| id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Forks the waiting choices of every session of a step's batch
    /// whose prompt is now in (within the RAM plan's positions).
    fn fork_choices(
        &mut self,
        batch: &mut [(RequestId, Session)],
    ) -> Vec<(RequestId, Result<Session>)> {
        let mut out = Vec::new();
        if self.forks.is_empty() {
            return out;
        }
        let model = self.engine.model();
        for i in 0..batch.len() {
            if batch[i].1.in_prefill() {
                continue;
            }
            for id in self.forks_of(batch[i].0) {
                let (_, opts) = self.forks.remove(&id).expect("listed by forks_of");
                let outside: usize = batch.iter().map(|(_, s)| s.kv_positions()).sum();
                let forked: usize = (out.iter())
                    .filter_map(|(_, f): &(RequestId, Result<Session>)| f.as_ref().ok())
                    .map(Session::kv_positions)
                    .sum();
                let leader = &mut batch[i].1;
                let fork = Session::check(model, leader.prompt(), &opts)
                    .and_then(|n| self.make_room(outside + forked, leader.prompt().len() + n))
                    .and_then(|()| leader.fork(model, &opts));
                out.push((id, fork));
            }
        }
        out
    }

    /// Runs a forked choice from its first token (or fails it).
    fn start_fork(&mut self, id: RequestId, fork: Result<Session>, events: &mut Vec<PoolEvent>) {
        let session = match fork {
            Ok(s) => s,
            Err(e) => {
                self.logprobs.remove(&id);
                events.push(PoolEvent::Failed(id, e.to_string()));
                self.retire(id, events);
                return;
            }
        };
        let first = session.tokens()[0];
        events.push(PoolEvent::Token(id, first));
        if let Some(&top) = self.logprobs.get(&id) {
            let lp = token_logprobs(session.logits(), first, top);
            events.push(PoolEvent::Logprobs(id, lp));
        }
        if session.is_done() {
            self.finish(id, session);
            events.push(PoolEvent::Finished(id));
            self.retire(id, events);
        } else {
            self.running.insert(id, session);
        }
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
        self.keep_session(id, session);
    }

    /// Keeps an ended session's KV as a prefix (if prefixes are kept),
    /// remembered as what its slot holds.
    fn keep_session(&mut self, id: RequestId, session: Session) {
        if self.prefixes_max == 0 {
            return;
        }
        let prefix = session.into_prefix();
        if let Some(slot) = self.scheduler.slot_of(id) {
            self.slot_tokens[slot] = Some(prefix.tokens.clone());
        }
        self.keep_prefix(prefix);
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
            let mut events = Vec::new();
            self.release_forks(id, session.prompt(), &mut events);
            self.keep_session(id, session);
            self.retire(id, &mut events);
            self.pending.extend(events);
            return true;
        }
        if self.forks.remove(&id).is_some() {
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

    /// Refuses a slot that does not exist or runs a request now.
    fn idle_slot(&self, slot: usize) -> Result<()> {
        let slots = self.slot_tokens.len();
        if slot >= slots {
            return Err(Error::Request(format!(
                "slot {slot} does not exist; this server has {slots} (0 to {})",
                slots - 1
            )));
        }
        if self
            .scheduler
            .running_ids()
            .any(|id| self.scheduler.slot_of(id) == Some(slot))
        {
            return Err(Error::Request(format!(
                "slot {slot} is processing a request; ask again once it is idle"
            )));
        }
        Ok(())
    }

    /// The kept prefix idle slot `slot` holds (its last session's KV, or
    /// what was restored into it), if it is still kept.
    pub fn slot_prefix_mut(&mut self, slot: usize) -> Result<Option<&mut Prefix>> {
        self.idle_slot(slot)?;
        let Some(tokens) = &self.slot_tokens[slot] else {
            return Ok(None);
        };
        Ok(self.prefixes.iter_mut().find(|p| &p.tokens == tokens))
    }

    /// Drops what idle slot `slot` holds; returns the positions erased.
    pub fn erase_slot(&mut self, slot: usize) -> Result<usize> {
        self.idle_slot(slot)?;
        let Some(tokens) = self.slot_tokens[slot].take() else {
            return Ok(0);
        };
        let Some(i) = self.prefixes.iter().position(|p| p.tokens == tokens) else {
            return Ok(0);
        };
        let gone = self.prefixes.remove(i);
        self.prefix_generation += 1;
        Ok(gone.kv.len())
    }

    /// Puts `prefix` into idle slot `slot` (dropping what it held) as the
    /// most recently used kept prefix: the next request starting with its
    /// tokens continues from it. Returns its positions.
    pub fn restore_slot(&mut self, slot: usize, prefix: Prefix) -> Result<usize> {
        self.erase_slot(slot)?;
        let n = prefix.kv.len();
        self.slot_tokens[slot] = Some(prefix.tokens.clone());
        self.keep_prefix(prefix);
        Ok(n)
    }

    /// Starts the choices waiting for `leader` (cancelled before its
    /// prompt was in) on their own, from `prompt`.
    fn release_forks(&mut self, leader: RequestId, prompt: &[u32], events: &mut Vec<PoolEvent>) {
        for id in self.forks_of(leader) {
            let (_, opts) = self.forks.remove(&id).expect("listed by forks_of");
            match self.start(prompt, &opts) {
                Ok(session) => {
                    self.running.insert(id, session);
                }
                Err(e) => {
                    self.logprobs.remove(&id);
                    events.push(PoolEvent::Failed(id, e.to_string()));
                    self.retire(id, events);
                }
            }
        }
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
