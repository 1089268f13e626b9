//! Checkpoint weights: the safetensors shard index ([`index`]) and the
//! conversion of stored dtypes to f32 ([`dtype`]).

pub mod dtype;
pub mod index;

pub use index::{TensorEntry, WeightIndex};
