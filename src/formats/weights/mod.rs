//! Checkpoint weights: the safetensors shard index ([`index`]), the
//! conversion of stored dtypes to f32 ([`dtype`]) and what a reader knows
//! of moestream's container ([`container`]).

pub mod container;
pub mod dtype;
pub mod index;

pub use index::{TensorEntry, WeightIndex};
