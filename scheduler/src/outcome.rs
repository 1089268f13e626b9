//! What the scheduler answers: [`Admission`] for an accepted request,
//! [`Rejected`] for a refused one (with the HTTP status the server sends),
//! [`Promotion`] when a queued request gets a slot, and [`UnknownRequest`]
//! for an id it does not hold.

/// A request's id, chosen by the caller; unique among live requests.
pub type RequestId = u64;

/// Where an accepted request went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// It holds KV slot `slot` and runs from the next batch on.
    Running { slot: usize },
    /// It waits; `position` requests are ahead of it (0 = next).
    Queued { position: usize },
}

/// Why a request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    /// Every KV slot is busy and the queue is full.
    #[error("server busy: all {kv_slots} KV slots in use and {queue_max} requests queued")]
    QueueFull { kv_slots: usize, queue_max: usize },
    /// The request waited in the queue longer than the limit (reported by
    /// [`crate::Scheduler::expire`]; the server builds this variant).
    #[error("server busy: waited {waited_ms} ms in the queue (limit {queue_wait_ms_max} ms)")]
    QueueWaitExpired {
        waited_ms: u64,
        queue_wait_ms_max: u64,
    },
    /// The id is already running or queued.
    #[error("request id {id} is already admitted")]
    DuplicateId { id: RequestId },
}

impl Rejected {
    /// The HTTP status the server answers with.
    pub fn http_status(&self) -> u16 {
        match self {
            Rejected::QueueFull { .. } | Rejected::QueueWaitExpired { .. } => 429,
            Rejected::DuplicateId { .. } => 409,
        }
    }
}

/// A queued request that was given a freed slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Promotion {
    pub id: RequestId,
    pub slot: usize,
    /// Time it spent in the queue.
    pub waited_ms: u64,
}

/// An id that is neither running nor queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("request {id} is neither running nor queued")]
pub struct UnknownRequest {
    pub id: RequestId,
}
