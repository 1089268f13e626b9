//! Machine measurements the engine's numbers are judged against (SPEC §5:
//! kernel throughput is reported against measured memory bandwidth).
//! [`mem`] owns the memory read-bandwidth probe behind `moestream bench mem`;
//! [`kernels`] the batched kernels against the integer peak behind
//! `moestream bench kernels`.

pub mod kernels;
pub mod mem;
