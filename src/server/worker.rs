//! The engine thread: it owns the model and its [`SessionPool`], takes
//! requests over a channel, and steps every active slot together, sending
//! each request its tokens as they come. The async side never runs a
//! forward; this thread never awaits.
//!
//! Each loop turn: take every waiting command (blocking only when nothing
//! runs), cancel requests whose client went away (their event channel is
//! closed), run one pool step, send its events, publish the metrics.

use super::kv_dir::KvDir;
use super::metrics::{Rate, Snapshot, LATENCY_BOUNDS_US};
use crate::engine::generate::GenOptions;
use crate::engine::{PoolError, PoolEvent, SessionPool, TokenLogprobs};
use crate::model::profile::Profile;
use crate::model::Model;
use moestream_scheduler::{RequestId, SchedulerConfig};
use std::collections::HashMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// What a request hears from the engine thread.
#[derive(Debug)]
pub enum Event {
    Token(u32),
    /// The log-probabilities of the token just sent.
    Logprobs(TokenLogprobs),
    /// It finished: the prompt tokens continued from kept KV, and whether
    /// its output constraint completed (what ended it).
    Done {
        reused: usize,
        constraint_complete: bool,
    },
    /// It failed (the message says why) or waited too long in the queue.
    Failed(String),
    Expired,
    /// Its prefill moved (sent after each step that prefilled some of it,
    /// before that step's token).
    Progress(Progress),
}

/// Where a request's prefill stands: `processed` of its prompt's `total`
/// positions are in its KV cache, `cache` of them continued from a kept
/// prefix (llama-server's `prompt_progress`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    pub processed: usize,
    pub total: usize,
    pub cache: usize,
}

/// A request for the engine thread: one choice per events channel, the
/// prompt prefilled once for all of them (choice `i` forks from the
/// first once its prompt is in, and samples with seed `seed + i`).
pub struct Submit {
    pub prompt: Vec<u32>,
    pub opts: GenOptions,
    /// Log-probabilities wanted, with this many alternatives.
    pub logprobs: Option<usize>,
    pub events: Vec<mpsc::UnboundedSender<Event>>,
    /// Whether the pool admitted it (running or queued).
    pub admitted: oneshot::Sender<Result<(), PoolError>>,
}

/// llama-server's `POST /slots/{id}?action=...`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlotAction {
    /// Save what the slot holds as this file of `--kv-dir`.
    Save(String),
    /// Put this file of `--kv-dir` into the slot.
    Restore(String),
    /// Drop what the slot holds.
    Erase,
}

/// A slot action for the engine thread (it runs between steps).
pub struct SlotRequest {
    pub slot: usize,
    pub action: SlotAction,
    pub reply: oneshot::Sender<crate::error::Result<SlotDone>>,
}

/// What a slot action did: the positions saved, restored or erased, the
/// file's bytes (0 for an erase) and the time it took.
#[derive(Clone, Copy, Debug)]
pub struct SlotDone {
    pub positions: usize,
    pub bytes: u64,
    pub ms: f64,
}

/// What the engine thread is told.
pub enum Command {
    Submit(Box<Submit>),
    Slot(SlotRequest),
    /// Stop admitting; finish what runs within the grace time, cancel the
    /// rest, save the KV, end.
    Shutdown {
        grace: Duration,
    },
}

/// The engine thread's settings.
pub struct WorkerConfig {
    pub scheduler: SchedulerConfig,
    pub kv_dir: Option<KvDir>,
}

/// Runs the engine loop over `model` until a shutdown command or until
/// every sender is gone; publishes metrics into `metrics`.
pub fn run(
    model: &Model,
    config: WorkerConfig,
    commands: Receiver<Command>,
    metrics: Arc<Mutex<Snapshot>>,
) {
    let slots = config.scheduler.kv_slots;
    let mut pool = SessionPool::new(model, config.scheduler);
    pool.keep_prefixes(slots);
    let mut w = Worker {
        pool,
        senders: HashMap::new(),
        next_id: 0,
        snap: Snapshot {
            ready: true,
            slots,
            ..Snapshot::default()
        },
        rate: Rate::default(),
        kv_dir: config.kv_dir,
        saved_generation: 0,
        prefilling: HashMap::new(),
    };
    w.restore();
    w.saved_generation = w.pool.prefix_generation();
    let mut prof = Profile::default();
    w.publish(model, &metrics, &prof);
    let mut deadline: Option<Instant> = None;
    loop {
        match w.take_commands(&commands, deadline.is_some()) {
            Ok(Some(grace)) => deadline = deadline.or(Some(deadline_after(grace))),
            Ok(None) => {}
            Err(()) => deadline = deadline.or(Some(Instant::now())),
        }
        w.cancel_abandoned();
        if deadline.is_some_and(|d| Instant::now() >= d) {
            w.cancel_all("the server is shutting down");
        }
        if !w.pool.is_idle() {
            let events = w.pool.step(&mut prof);
            let events = w.count(events);
            let events = w.progress(events);
            // Published before the events go out: a client that sees its
            // answer finds it counted.
            w.publish(model, &metrics, &prof);
            w.deliver(events);
        } else if deadline.is_some() {
            break;
        } else {
            w.save_if_changed();
            w.publish(model, &metrics, &prof);
        }
    }
    w.save_if_changed();
}

/// The KV directory a slot file goes in, or why there is none.
fn needs_dir(dir: &Option<KvDir>) -> crate::error::Result<&KvDir> {
    dir.as_ref().ok_or_else(|| {
        crate::error::Error::Request(
            "saving and restoring a slot need --kv-dir (the directory its files go in)".into(),
        )
    })
}

/// The moment `grace` from now; a grace past what an `Instant` holds is
/// as good as forever (a century), never an overflow.
pub fn deadline_after(grace: Duration) -> Instant {
    let now = Instant::now();
    let century = Duration::from_secs(100 * 365 * 86_400);
    now.checked_add(grace.min(century))
        .or_else(|| now.checked_add(Duration::from_secs(86_400)))
        .unwrap_or(now)
}

struct Worker<'m> {
    pool: SessionPool<'m>,
    senders: HashMap<RequestId, mpsc::UnboundedSender<Event>>,
    next_id: RequestId,
    snap: Snapshot,
    rate: Rate,
    kv_dir: Option<KvDir>,
    saved_generation: u64,
    /// Requests whose prefill is not done: the progress last sent.
    prefilling: HashMap<RequestId, Progress>,
}

impl Worker<'_> {
    /// Takes the waiting commands, blocking for one when nothing runs
    /// (and no shutdown is under way). Returns a shutdown's grace time,
    /// or `Err` once every sender is gone.
    fn take_commands(
        &mut self,
        commands: &Receiver<Command>,
        shutting_down: bool,
    ) -> Result<Option<Duration>, ()> {
        let mut shutdown = None;
        let mut block = self.pool.is_idle() && !shutting_down;
        loop {
            let cmd = if block {
                match commands.recv_timeout(Duration::from_millis(500)) {
                    Ok(c) => c,
                    Err(RecvTimeoutError::Timeout) => return Ok(shutdown),
                    Err(RecvTimeoutError::Disconnected) => return Err(()),
                }
            } else {
                match commands.try_recv() {
                    Ok(c) => c,
                    Err(std::sync::mpsc::TryRecvError::Empty) => return Ok(shutdown),
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => return Err(()),
                }
            };
            block = false;
            match cmd {
                Command::Submit(s) if shutdown.is_none() && !shutting_down => self.submit(*s),
                Command::Submit(s) => {
                    let _ = s
                        .admitted
                        .send(Err(PoolError::Request(crate::error::Error::Request(
                            "the server is shutting down".into(),
                        ))));
                }
                Command::Slot(r) => self.slot(r),
                Command::Shutdown { grace } => shutdown = Some(grace),
            }
        }
    }

    /// Admits every choice of a request, or none.
    fn submit(&mut self, s: Submit) {
        let mut ids: Vec<RequestId> = Vec::with_capacity(s.events.len());
        for choice in 0..s.events.len() {
            let id = self.next_id;
            self.next_id += 1;
            let mut opts = s.opts.clone();
            opts.sampling.seed = opts.sampling.seed.wrapping_add(choice as u64);
            let admitted = match ids.first() {
                None => self.pool.submit(id, &s.prompt, &opts),
                Some(&leader) => self.pool.submit_fork(id, leader, &opts),
            };
            if let Err(e) = admitted {
                // The choices admitted go too, the forks before their leader.
                for &id in ids.iter().rev() {
                    self.pool.cancel(id);
                }
                self.snap.requests_rejected += 1;
                let _ = s.admitted.send(Err(e));
                return;
            }
            ids.push(id);
        }
        // The first choice prefills the prompt (the others fork its KV):
        // its progress is the request's.
        let start = Progress {
            processed: 0,
            total: s.prompt.len(),
            cache: 0,
        };
        if let Some(&first) = ids.first() {
            self.prefilling.insert(first, start);
        }
        for (id, events) in ids.into_iter().zip(s.events) {
            if let Some(top) = s.logprobs {
                self.pool.want_logprobs(id, top);
            }
            self.senders.insert(id, events);
        }
        self.snap.prompt_tokens += s.prompt.len() as u64;
        let _ = s.admitted.send(Ok(()));
    }

    /// Runs a slot action and answers it.
    fn slot(&mut self, r: SlotRequest) {
        let started = Instant::now();
        let done = self
            .slot_action(r.slot, r.action)
            .map(|(positions, bytes)| SlotDone {
                positions,
                bytes,
                ms: started.elapsed().as_secs_f64() * 1e3,
            });
        let _ = r.reply.send(done);
    }

    /// A slot action: (positions, file bytes).
    fn slot_action(
        &mut self,
        slot: usize,
        action: SlotAction,
    ) -> crate::error::Result<(usize, u64)> {
        match action {
            SlotAction::Erase => Ok((self.pool.erase_slot(slot)?, 0)),
            SlotAction::Save(name) => {
                let dir = needs_dir(&self.kv_dir)?;
                let Some(prefix) = self.pool.slot_prefix_mut(slot)? else {
                    return Err(crate::error::Error::Request(format!(
                        "slot {slot} holds no KV (nothing ended in it yet, or it was erased or taken up by a later request)"
                    )));
                };
                let positions = prefix.kv.len();
                Ok((positions, dir.save_named(&name, prefix)?))
            }
            SlotAction::Restore(name) => {
                let dir = needs_dir(&self.kv_dir)?;
                self.pool.slot_prefix_mut(slot)?;
                let model = self.pool.engine().model();
                let layouts = model.new_kv(1).layouts().to_vec();
                let context = model.cfg.rope.max_position_embeddings;
                let positions_max = model.context_budget.unwrap_or(context).min(context);
                let (prefix, bytes) = dir.load_named(&name, &layouts, positions_max)?;
                Ok((self.pool.restore_slot(slot, prefix)?, bytes))
            }
        }
    }

    /// Cancels every request whose client stopped listening.
    fn cancel_abandoned(&mut self) {
        let gone: Vec<RequestId> = self
            .senders
            .iter()
            .filter(|(_, tx)| tx.is_closed())
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.senders.remove(&id);
            self.pool.cancel(id);
            self.snap.requests_failed += 1;
        }
    }

    fn cancel_all(&mut self, why: &str) {
        for (id, tx) in std::mem::take(&mut self.senders) {
            self.pool.cancel(id);
            let _ = tx.send(Event::Failed(why.into()));
            self.snap.requests_failed += 1;
        }
    }

    /// Counts a step's events into the metrics; returns each request's
    /// event to send.
    fn count(&mut self, events: Vec<PoolEvent>) -> Vec<(RequestId, Event)> {
        let mut out = Vec::with_capacity(events.len());
        for ev in events {
            let (id, event) = match ev {
                PoolEvent::Token(id, t) => {
                    self.snap.generated_tokens += 1;
                    (id, Event::Token(t))
                }
                PoolEvent::Logprobs(id, lp) => (id, Event::Logprobs(lp)),
                PoolEvent::Finished(id) => {
                    let finished = self.pool.take_finished(id);
                    let reused = finished.as_ref().map_or(0, |f| f.reused);
                    let constraint_complete = finished.is_some_and(|f| f.constraint_complete);
                    self.snap.requests_finished += 1;
                    self.snap.prompt_tokens_reused += reused as u64;
                    let done = Event::Done {
                        reused,
                        constraint_complete,
                    };
                    (id, done)
                }
                PoolEvent::Failed(id, e) => {
                    self.snap.requests_failed += 1;
                    (id, Event::Failed(e))
                }
                PoolEvent::Expired(id) => {
                    self.snap.requests_rejected += 1;
                    (id, Event::Expired)
                }
            };
            out.push((id, event));
        }
        out
    }

    /// A step's events with each prefilling request's progress ahead of
    /// them, where the step moved it (a request that finished in the step
    /// has its whole prompt in); a request whose prefill is done, or that
    /// ended, is not followed further.
    fn progress(&mut self, events: Vec<(RequestId, Event)>) -> Vec<(RequestId, Event)> {
        let mut out = Vec::with_capacity(events.len());
        let finished: Vec<RequestId> = events
            .iter()
            .filter(|(_, e)| matches!(e, Event::Done { .. }))
            .map(|(id, _)| *id)
            .collect();
        self.prefilling.retain(|id, last| {
            let now = match self.pool.session(*id) {
                Some(s) => Progress {
                    processed: s.prefilled(),
                    cache: s.reused(),
                    ..*last
                },
                None if finished.contains(id) => Progress {
                    processed: last.total,
                    ..*last
                },
                None => return self.senders.contains_key(id), // queued, or gone
            };
            if now.processed != last.processed {
                out.push((*id, Event::Progress(now)));
                *last = now;
            }
            now.processed < now.total
        });
        out.extend(events);
        out
    }

    /// Sends each request its events; a request's last event closes its
    /// channel.
    fn deliver(&mut self, events: Vec<(RequestId, Event)>) {
        for (id, event) in events {
            let last = !matches!(
                event,
                Event::Token(_) | Event::Logprobs(_) | Event::Progress(_)
            );
            if let Some(tx) = self.senders.get(&id) {
                let _ = tx.send(event);
            }
            if last {
                self.senders.remove(&id);
            }
        }
    }

    fn publish(&mut self, model: &Model, metrics: &Mutex<Snapshot>, prof: &Profile) {
        let c = model.store.counters();
        self.snap.expert_hits = c.hits + c.pinned_hits;
        self.snap.expert_misses = c.misses;
        self.snap.bytes_read = c.bytes_read;
        self.snap.expert_wait_seconds = c.disk_time.as_secs_f64();
        self.snap.expert_matmul_seconds = prof.expert_matmul.as_secs_f64();
        self.snap.attention_seconds = prof.attention.as_secs_f64();
        self.snap.policy_layers = model.store.active_policies();
        self.snap.policy_switches = c.policy_switches;
        let (below, count, sum) = model.store.read_latency_histogram(&LATENCY_BOUNDS_US);
        self.snap.latency_below = below;
        self.snap.latency_count = count;
        self.snap.latency_sum_us = sum;
        (self.snap.prefill_tokens, self.snap.prefill_seconds) = self.pool.prefill_totals();
        self.snap.queue_depth = self.pool.queued_count();
        self.snap.busy_slots = self.pool.running_count();
        self.snap.running = self.pool.slots();
        self.snap.tokens_per_second = self.rate.record(self.snap.generated_tokens);
        *metrics.lock().expect("metrics lock") = self.snap.clone();
    }

    /// Loads the saved prefixes of the KV directory, if one is set.
    fn restore(&mut self) {
        let Some(dir) = &mut self.kv_dir else { return };
        let slots = self.pool.prefixes_max();
        let start = Instant::now();
        for prefix in dir.restore(self.pool.engine().model(), slots) {
            self.snap.kv_restored_positions += prefix.tokens.len() as u64;
            self.pool.keep_prefix(prefix);
        }
        self.snap.kv_restore_seconds = start.elapsed().as_secs_f64();
    }

    /// Saves the kept prefixes when they changed since the last save.
    fn save_if_changed(&mut self) {
        let generation = self.pool.prefix_generation();
        let Some(dir) = &mut self.kv_dir else { return };
        if generation == self.saved_generation {
            return;
        }
        if let Err(e) = dir.save(self.pool.prefixes_mut()) {
            tracing::warn!("saving the KV: {e}");
            eprintln!("warning: saving the KV: {e}");
        }
        self.saved_generation = generation;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grace_past_what_an_instant_holds_is_a_far_deadline_not_a_panic() {
        let now = Instant::now();
        assert!(deadline_after(Duration::MAX) > now + Duration::from_secs(86_400));
        assert!(deadline_after(Duration::from_secs(u64::MAX)) > now);
        let short = deadline_after(Duration::from_secs(2));
        assert!(short >= now + Duration::from_secs(2) && short < now + Duration::from_secs(60));
    }
}
