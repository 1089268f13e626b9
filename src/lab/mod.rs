//! The lab, apart from the runtime: the synthetic models (`synth`), routing
//! traces and their replay through eviction policies, benchmarks and sweeps,
//! the per-disk tuner and the quality comparison of a quantized model.

pub mod bench;
pub mod budget_sweep;
pub mod png;
pub mod quality;
pub mod replay;
pub mod synth;
