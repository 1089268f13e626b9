//! Facts about the machine a model runs on: the memory cgroup it runs under
//! (and fresh ones to run a child in) and the RAM a run may take by default.
//! (The disk under a model is [`crate::inspect::disk`]: it reads the model's
//! files.)

pub mod cgroup;
pub mod memory;

/// `bytes` in GB (10^9, as `--ram-gb` reads them).
pub fn gb(bytes: u64) -> f64 {
    bytes as f64 / 1e9
}
