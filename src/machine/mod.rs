//! Facts about the machine a model runs on: the memory cgroup it runs under,
//! and fresh ones to run a child in. (The disk under a model is
//! [`crate::inspect::disk`]: it reads the model's files.)

pub mod cgroup;
