//! `Scheduler`: KV slots, the waiting queue and the round-robin batch.
//!
//! Invariants (checked by [`Scheduler::assert_invariants`] after every
//! mutation in debug builds):
//! - a slot is held by at most one request, and the request's record names
//!   that slot back: slots and running requests are in one-to-one
//!   correspondence;
//! - the batch rotation holds each running request exactly once;
//! - the queue holds at most `queue_max` requests, none of them running, no
//!   id twice;
//! - the queue is non-empty only while every slot is taken (a freed slot
//!   goes to the oldest queued request at once).

use std::collections::{HashMap, HashSet, VecDeque};

use crate::config::SchedulerConfig;
pub use crate::outcome::RequestId;
use crate::outcome::{Admission, Promotion, Rejected, UnknownRequest};

/// A request holding a KV slot.
#[derive(Clone, Copy, Debug)]
struct Running {
    slot: usize,
    prompt_tokens: usize,
}

/// A request waiting for a KV slot.
#[derive(Clone, Copy, Debug)]
struct Waiting {
    id: RequestId,
    prompt_tokens: usize,
    enqueued_ms: u64,
}

/// Admission, queueing and batching of requests.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    /// Slot index → the request holding it.
    slots: Vec<Option<RequestId>>,
    running: HashMap<RequestId, Running>,
    /// Running requests in round-robin order; the front goes next.
    rotation: VecDeque<RequestId>,
    /// Waiting requests, oldest first.
    queue: VecDeque<Waiting>,
}

impl Scheduler {
    /// A scheduler with every slot free and an empty queue; all memory is
    /// sized here.
    pub fn new(config: SchedulerConfig) -> Self {
        config.validate();
        Scheduler {
            config,
            slots: vec![None; config.kv_slots],
            running: HashMap::with_capacity(config.kv_slots),
            rotation: VecDeque::with_capacity(config.kv_slots),
            queue: VecDeque::with_capacity(config.queue_max),
        }
    }

    /// The limits.
    pub fn config(&self) -> SchedulerConfig {
        self.config
    }

    /// Admits `id` to a free slot, else queues it, else rejects it.
    pub fn submit(
        &mut self,
        id: RequestId,
        prompt_tokens: usize,
        now_ms: u64,
    ) -> Result<Admission, Rejected> {
        if self.contains(id) {
            return Err(Rejected::DuplicateId { id });
        }
        let admission = if let Some(slot) = self.free_slot() {
            self.admit(id, prompt_tokens, slot);
            Admission::Running { slot }
        } else if self.queue.len() < self.config.queue_max {
            self.queue.push_back(Waiting {
                id,
                prompt_tokens,
                enqueued_ms: now_ms,
            });
            Admission::Queued {
                position: self.queue.len() - 1,
            }
        } else {
            return Err(Rejected::QueueFull {
                kv_slots: self.config.kv_slots,
                queue_max: self.config.queue_max,
            });
        };
        self.debug_assert_invariants();
        Ok(admission)
    }

    /// Ends request `id`. A running request frees its slot, which goes to
    /// the oldest queued request (returned, so the caller can start it); a
    /// queued request (e.g. its client went away) just leaves the queue.
    pub fn finish(
        &mut self,
        id: RequestId,
        now_ms: u64,
    ) -> Result<Option<Promotion>, UnknownRequest> {
        if let Some(running) = self.running.remove(&id) {
            self.slots[running.slot] = None;
            self.rotation.retain(|&r| r != id);
            let promotion = self.promote(running.slot, now_ms);
            self.debug_assert_invariants();
            return Ok(promotion);
        }
        let position = self.queue_position(id).ok_or(UnknownRequest { id })?;
        self.queue.remove(position);
        self.debug_assert_invariants();
        Ok(None)
    }

    /// Removes and returns, oldest first, the queued requests that have
    /// waited longer than `queue_wait_ms_max` (the caller answers them 429).
    pub fn expire(&mut self, now_ms: u64) -> Vec<RequestId> {
        let wait_max = self.config.queue_wait_ms_max;
        let mut expired = Vec::new();
        self.queue.retain(|waiting| {
            let keep = now_ms.saturating_sub(waiting.enqueued_ms) <= wait_max;
            if !keep {
                expired.push(waiting.id);
            }
            keep
        });
        self.debug_assert_invariants();
        expired
    }

    /// The sequences for the next forward pass as `(id, slot)`: up to
    /// `batch_max` running requests, round-robin, so every running request
    /// is in at least one of any `ceil(running / batch_max)` consecutive
    /// batches.
    pub fn next_batch(&mut self) -> Vec<(RequestId, usize)> {
        let size = self.rotation.len().min(self.config.batch_max);
        let mut batch = Vec::with_capacity(size);
        for _ in 0..size {
            let id = self
                .rotation
                .pop_front()
                .expect("rotation holds `size` ids");
            batch.push((id, self.running[&id].slot));
            self.rotation.push_back(id);
        }
        self.debug_assert_invariants();
        batch
    }

    /// Number of running requests (slots in use).
    pub fn running_count(&self) -> usize {
        self.running.len()
    }

    /// Number of queued requests.
    pub fn queued_count(&self) -> usize {
        self.queue.len()
    }

    /// The running requests' ids, in no particular order.
    pub fn running_ids(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.running.keys().copied()
    }

    /// The queued requests' ids, oldest first.
    pub fn queued_ids(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.queue.iter().map(|waiting| waiting.id)
    }

    /// The slot held by `id`, if it is running.
    pub fn slot_of(&self, id: RequestId) -> Option<usize> {
        self.running.get(&id).map(|running| running.slot)
    }

    /// How many requests are ahead of `id` in the queue, if it is queued.
    pub fn queue_position(&self, id: RequestId) -> Option<usize> {
        self.queue.iter().position(|waiting| waiting.id == id)
    }

    /// The prompt length `id` was submitted with, if it is running or queued.
    pub fn prompt_tokens(&self, id: RequestId) -> Option<usize> {
        let running = self.running.get(&id).map(|r| r.prompt_tokens);
        running.or_else(|| {
            let position = self.queue_position(id)?;
            Some(self.queue[position].prompt_tokens)
        })
    }

    /// Panics if any invariant in the module docs is violated.
    pub fn assert_invariants(&self) {
        assert_eq!(self.slots.len(), self.config.kv_slots, "slot table resized");
        let mut held = 0;
        for (slot, holder) in self.slots.iter().enumerate() {
            let Some(id) = holder else { continue };
            held += 1;
            let record = self.running.get(id);
            assert_eq!(
                record.map(|r| r.slot),
                Some(slot),
                "slot {slot} held by {id}"
            );
        }
        assert_eq!(held, self.running.len(), "running requests without a slot");
        let rotation: HashSet<_> = self.rotation.iter().collect();
        assert_eq!(rotation.len(), self.rotation.len(), "id twice in rotation");
        assert_eq!(rotation.len(), self.running.len(), "rotation != running");
        assert!(rotation.iter().all(|id| self.running.contains_key(id)));
        self.assert_queue_invariants(held);
    }

    fn assert_queue_invariants(&self, held: usize) {
        assert!(
            self.queue.len() <= self.config.queue_max,
            "queue over limit"
        );
        let queued: HashSet<_> = self.queued_ids().collect();
        assert_eq!(queued.len(), self.queue.len(), "id twice in queue");
        assert!(
            queued.iter().all(|id| !self.running.contains_key(id)),
            "queued and running"
        );
        let full = held == self.config.kv_slots;
        assert!(
            self.queue.is_empty() || full,
            "requests wait beside a free slot"
        );
    }

    fn debug_assert_invariants(&self) {
        if cfg!(debug_assertions) {
            self.assert_invariants();
        }
    }

    fn contains(&self, id: RequestId) -> bool {
        self.running.contains_key(&id) || self.queue_position(id).is_some()
    }

    /// The lowest free slot.
    fn free_slot(&self) -> Option<usize> {
        self.slots.iter().position(Option::is_none)
    }

    fn admit(&mut self, id: RequestId, prompt_tokens: usize, slot: usize) {
        assert!(self.slots[slot].is_none(), "slot {slot} already held");
        self.slots[slot] = Some(id);
        self.running.insert(
            id,
            Running {
                slot,
                prompt_tokens,
            },
        );
        self.rotation.push_back(id);
    }

    /// Gives the freed `slot` to the oldest queued request.
    fn promote(&mut self, slot: usize, now_ms: u64) -> Option<Promotion> {
        let waiting = self.queue.pop_front()?;
        self.admit(waiting.id, waiting.prompt_tokens, slot);
        Some(Promotion {
            id: waiting.id,
            slot,
            waited_ms: now_ms.saturating_sub(waiting.enqueued_ms),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(kv_slots: usize, queue_max: usize, batch_max: usize) -> SchedulerConfig {
        SchedulerConfig {
            kv_slots,
            queue_max,
            queue_wait_ms_max: 1000,
            batch_max,
        }
    }

    #[test]
    fn spec_figure_twenty_requests_five_slots_no_queue() {
        let mut scheduler = Scheduler::new(config(5, 0, 5));
        let results: Vec<_> = (0..20).map(|id| scheduler.submit(id, 10, 0)).collect();
        let running: Vec<_> = results.iter().filter(|r| r.is_ok()).collect();
        let rejected: Vec<_> = results.iter().filter_map(|r| r.err()).collect();
        assert_eq!(running.len(), 5);
        assert_eq!(rejected.len(), 15);
        assert!(rejected.iter().all(|r| r.http_status() == 429));
        for (id, result) in results.iter().enumerate().take(5) {
            assert_eq!(*result, Ok(Admission::Running { slot: id }));
        }
        assert_eq!(
            (scheduler.running_count(), scheduler.queued_count()),
            (5, 0)
        );
    }

    #[test]
    fn finish_admits_oldest_queued() {
        let mut scheduler = Scheduler::new(config(2, 2, 2));
        assert_eq!(
            scheduler.submit(1, 5, 0),
            Ok(Admission::Running { slot: 0 })
        );
        assert_eq!(
            scheduler.submit(2, 5, 0),
            Ok(Admission::Running { slot: 1 })
        );
        assert_eq!(
            scheduler.submit(3, 5, 10),
            Ok(Admission::Queued { position: 0 })
        );
        assert_eq!(
            scheduler.submit(4, 7, 20),
            Ok(Admission::Queued { position: 1 })
        );
        let full = scheduler.submit(5, 5, 30).unwrap_err();
        assert!(matches!(full, Rejected::QueueFull { .. }));
        let promoted = scheduler.finish(1, 110).unwrap();
        assert_eq!(
            promoted,
            Some(Promotion {
                id: 3,
                slot: 0,
                waited_ms: 100
            })
        );
        assert_eq!(scheduler.slot_of(3), Some(0));
        assert_eq!(scheduler.queue_position(4), Some(0));
        assert_eq!(scheduler.prompt_tokens(4), Some(7));
    }

    #[test]
    fn finish_of_queued_request_cancels_it() {
        let mut scheduler = Scheduler::new(config(1, 2, 1));
        scheduler.submit(1, 1, 0).unwrap();
        scheduler.submit(2, 1, 0).unwrap();
        scheduler.submit(3, 1, 0).unwrap();
        assert_eq!(scheduler.finish(2, 5), Ok(None));
        assert_eq!(scheduler.queue_position(3), Some(0));
        assert_eq!(scheduler.finish(2, 5), Err(UnknownRequest { id: 2 }));
        assert_eq!(scheduler.finish(1, 6).unwrap().map(|p| p.id), Some(3));
        assert_eq!(scheduler.finish(3, 7), Ok(None));
        assert_eq!(
            (scheduler.running_count(), scheduler.queued_count()),
            (0, 0)
        );
    }

    #[test]
    fn duplicate_id_is_rejected() {
        let mut scheduler = Scheduler::new(config(1, 1, 1));
        scheduler.submit(1, 1, 0).unwrap();
        scheduler.submit(2, 1, 0).unwrap();
        for id in [1, 2] {
            let err = scheduler.submit(id, 1, 0).unwrap_err();
            assert_eq!(err, Rejected::DuplicateId { id });
            assert_eq!(err.http_status(), 409);
        }
    }

    #[test]
    fn expire_removes_only_requests_past_the_limit() {
        let mut scheduler = Scheduler::new(config(1, 5, 1));
        scheduler.submit(1, 1, 0).unwrap();
        for (id, at) in [(2, 0), (3, 500), (4, 900)] {
            scheduler.submit(id, 1, at).unwrap();
        }
        assert!(
            scheduler.expire(1000).is_empty(),
            "exactly at the limit stays"
        );
        assert_eq!(scheduler.expire(1001), vec![2]);
        assert_eq!(scheduler.expire(1901), vec![3, 4]);
        assert_eq!(scheduler.running_ids().collect::<Vec<_>>(), vec![1]);
        let late = Rejected::QueueWaitExpired {
            waited_ms: 1001,
            queue_wait_ms_max: 1000,
        };
        assert_eq!(late.http_status(), 429);
    }

    #[test]
    fn batches_rotate_round_robin() {
        let mut scheduler = Scheduler::new(config(5, 0, 2));
        for id in 0..5 {
            scheduler.submit(id, 1, 0).unwrap();
        }
        let ids = |batch: Vec<(RequestId, usize)>| {
            batch.into_iter().map(|(id, _)| id).collect::<Vec<_>>()
        };
        assert_eq!(ids(scheduler.next_batch()), vec![0, 1]);
        assert_eq!(ids(scheduler.next_batch()), vec![2, 3]);
        assert_eq!(ids(scheduler.next_batch()), vec![4, 0]);
        scheduler.finish(1, 0).unwrap();
        assert_eq!(ids(scheduler.next_batch()), vec![2, 3]);
        assert_eq!(ids(scheduler.next_batch()), vec![4, 0]);
    }

    #[test]
    fn batch_pairs_ids_with_their_slots() {
        let mut scheduler = Scheduler::new(config(3, 0, 8));
        for id in [10, 20, 30] {
            scheduler.submit(id, 1, 0).unwrap();
        }
        scheduler.finish(20, 0).unwrap();
        scheduler.submit(40, 1, 0).unwrap();
        let mut batch = scheduler.next_batch();
        batch.sort();
        assert_eq!(batch, vec![(10, 0), (30, 2), (40, 1)]);
        let mut empty = Scheduler::new(config(1, 0, 1));
        assert!(empty.next_batch().is_empty());
    }

    #[test]
    #[should_panic(expected = "at least one KV slot")]
    fn zero_slots_is_a_programmer_error() {
        Scheduler::new(config(0, 0, 1));
    }
}
