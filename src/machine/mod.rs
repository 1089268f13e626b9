//! Facts about the machine a model runs on: the memory cgroup it runs under
//! (and fresh ones to run a child in) and the disk under a model.

pub mod cgroup;
pub mod disk;
