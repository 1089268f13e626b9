//! moestream-scheduler: who runs, who waits and who is turned away — pure
//! logic, no I/O, no clocks.
//!
//! What this crate owns:
//! - admission: a fixed number of KV slots (one per running sequence) and a
//!   bounded FIFO queue in front of them; a request that finds both full is
//!   [`Rejected::QueueFull`] (HTTP 429), and one that waits longer than the
//!   queue-wait limit is expired (also 429);
//! - the batching policy: running sequences share a forward pass, at most
//!   `batch_max` of them at a time, taken round-robin so none starves.
//!
//! Time is passed in by the caller as milliseconds (`now_ms`), so every
//! behaviour is a deterministic function of the calls made. Every request
//! accepted by [`Scheduler::submit`] is, at any moment, exactly one of:
//! running, queued, finished, expired — nothing is dropped silently.

mod config;
mod outcome;
mod scheduler;

pub use config::SchedulerConfig;
pub use outcome::{Admission, Promotion, Rejected, UnknownRequest};
pub use scheduler::{RequestId, Scheduler};
