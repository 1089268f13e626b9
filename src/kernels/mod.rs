//! Compute kernels. Each format lives in its own folder with the scalar
//! reference (always compiled) beside its SIMD versions; the best version is
//! picked once at run time from the CPU's features ([`cpu`]).

pub mod cpu;
pub mod f32;
