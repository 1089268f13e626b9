//! `SchedulerConfig`: the scheduler's limits, all explicit and fixed at
//! start. Invariant (checked by [`SchedulerConfig::validate`]): there is at
//! least one KV slot and a batch holds at least one sequence.

/// The scheduler's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// KV cache slots: the most sequences running at once.
    pub kv_slots: usize,
    /// The most requests waiting for a slot; 0 rejects as soon as all slots
    /// are busy.
    pub queue_max: usize,
    /// The longest a request may wait in the queue, in milliseconds.
    pub queue_wait_ms_max: u64,
    /// The most sequences sharing one forward pass.
    pub batch_max: usize,
}

impl SchedulerConfig {
    /// Panics on a configuration no scheduler can serve (a programmer error;
    /// user-facing flags are checked before they get here).
    pub fn validate(&self) {
        assert!(self.kv_slots > 0, "scheduler needs at least one KV slot");
        assert!(
            self.batch_max > 0,
            "a batch must hold at least one sequence"
        );
    }
}
