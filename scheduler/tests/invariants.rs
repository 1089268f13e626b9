//! Random sequences of submit / finish / expire / batch calls never break
//! the scheduler's invariants and never lose a request: every submitted id
//! is, at every step, exactly one of running, queued, finished, expired or
//! rejected, and the scheduler agrees with that model.

use std::collections::{BTreeMap, BTreeSet};

use moestream_scheduler::{Admission, RequestId, Scheduler, SchedulerConfig};
use proptest::prelude::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Running,
    Queued,
    Finished,
    Expired,
    Rejected,
}

#[derive(Clone, Debug)]
enum Call {
    Submit {
        prompt_tokens: usize,
    },
    /// Finish the live request at this index (modulo the live count).
    Finish(usize),
    Expire,
    Batch,
    Wait {
        ms: u64,
    },
}

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        4 => (0usize..4096).prop_map(|prompt_tokens| Call::Submit { prompt_tokens }),
        3 => any::<usize>().prop_map(Call::Finish),
        1 => Just(Call::Expire),
        2 => Just(Call::Batch),
        2 => (0u64..400).prop_map(|ms| Call::Wait { ms }),
    ]
}

struct Model {
    fates: BTreeMap<RequestId, Fate>,
    next_id: RequestId,
    now_ms: u64,
}

impl Model {
    fn with(&self, fate: Fate) -> BTreeSet<RequestId> {
        self.fates
            .iter()
            .filter(|(_, f)| **f == fate)
            .map(|(id, _)| *id)
            .collect()
    }

    fn live(&self) -> Vec<RequestId> {
        let mut live: Vec<_> = self.with(Fate::Running).into_iter().collect();
        live.extend(self.with(Fate::Queued));
        live
    }

    fn apply(&mut self, scheduler: &mut Scheduler, call: Call) {
        match call {
            Call::Submit { prompt_tokens } => self.submit(scheduler, prompt_tokens),
            Call::Finish(index) => self.finish(scheduler, index),
            Call::Expire => {
                for id in scheduler.expire(self.now_ms) {
                    assert_eq!(self.fates.insert(id, Fate::Expired), Some(Fate::Queued));
                }
            }
            Call::Batch => self.batch(scheduler),
            Call::Wait { ms } => self.now_ms += ms,
        }
    }

    fn submit(&mut self, scheduler: &mut Scheduler, prompt_tokens: usize) {
        let id = self.next_id;
        self.next_id += 1;
        let fate = match scheduler.submit(id, prompt_tokens, self.now_ms) {
            Ok(Admission::Running { .. }) => Fate::Running,
            Ok(Admission::Queued { position }) => {
                assert_eq!(position, self.with(Fate::Queued).len());
                Fate::Queued
            }
            Err(rejected) => {
                assert_eq!(rejected.http_status(), 429);
                Fate::Rejected
            }
        };
        self.fates.insert(id, fate);
    }

    fn finish(&mut self, scheduler: &mut Scheduler, index: usize) {
        let live = self.live();
        if live.is_empty() {
            return;
        }
        let id = live[index % live.len()];
        let promoted = scheduler.finish(id, self.now_ms).expect("live id is known");
        let was = self.fates.insert(id, Fate::Finished);
        if let Some(promotion) = promoted {
            assert_eq!(was, Some(Fate::Running), "only a freed slot promotes");
            let oldest = *self.with(Fate::Queued).first().expect("a queued request");
            assert_eq!(promotion.id, oldest, "FIFO promotion");
            self.fates.insert(promotion.id, Fate::Running);
        }
    }

    fn batch(&mut self, scheduler: &mut Scheduler) {
        let batch = scheduler.next_batch();
        let config = scheduler.config();
        let running = self.with(Fate::Running);
        assert_eq!(batch.len(), running.len().min(config.batch_max));
        let ids: BTreeSet<_> = batch.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids.len(), batch.len(), "id twice in a batch");
        assert!(ids.is_subset(&running));
        for (id, slot) in batch {
            assert_eq!(scheduler.slot_of(id), Some(slot));
        }
    }

    fn check_agrees(&self, scheduler: &Scheduler) {
        scheduler.assert_invariants();
        let running: BTreeSet<_> = scheduler.running_ids().collect();
        let queued: BTreeSet<_> = scheduler.queued_ids().collect();
        assert_eq!(running, self.with(Fate::Running));
        assert_eq!(queued, self.with(Fate::Queued));
        assert_eq!(self.fates.len() as u64, self.next_id, "every id has a fate");
    }
}

fn config() -> impl Strategy<Value = SchedulerConfig> {
    (1usize..6, 0usize..5, 0u64..1000, 1usize..4).prop_map(
        |(kv_slots, queue_max, queue_wait_ms_max, batch_max)| SchedulerConfig {
            kv_slots,
            queue_max,
            queue_wait_ms_max,
            batch_max,
        },
    )
}

proptest! {
    #[test]
    fn random_calls_keep_invariants_and_lose_nothing(
        config in config(),
        calls in prop::collection::vec(call(), 0..200),
    ) {
        let mut scheduler = Scheduler::new(config);
        let mut model = Model { fates: BTreeMap::new(), next_id: 0, now_ms: 0 };
        for call in calls {
            model.apply(&mut scheduler, call);
            model.check_agrees(&scheduler);
        }
        // Drain: finishing everything live ends every request.
        while !model.live().is_empty() {
            model.apply(&mut scheduler, Call::Finish(0));
            model.check_agrees(&scheduler);
        }
        let ended = [Fate::Finished, Fate::Expired, Fate::Rejected];
        prop_assert!(model.fates.values().all(|fate| ended.contains(fate)));
        prop_assert_eq!((scheduler.running_count(), scheduler.queued_count()), (0, 0));
    }
}
