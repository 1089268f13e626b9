//! Facts about the machine a model runs on: the memory cgroup it runs under
//! (and fresh ones to run a child in), the RAM a run may take by default,
//! and the disk under a model.

pub mod cgroup;
pub mod disk;
pub mod memory;

/// `bytes` in GB (10^9, as `--ram-gb` reads them).
pub fn gb(bytes: u64) -> f64 {
    bytes as f64 / 1e9
}
