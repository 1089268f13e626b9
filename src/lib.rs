//! moestream: run Mixture-of-Experts LLMs far larger than RAM by keeping the
//! always-on weights resident and streaming routed experts from disk.
//!
//! The data path of one layer: route → look up the expert cache → read the
//! misses → compute → add. See docs/ARCHITECTURE.md.
//!
//! Modules, in data-path order: [`config`] (config.json), [`weights`]
//! (safetensors shard index, dtypes), [`tokenizer`], [`chat`] (chat
//! templates, rendered as transformers does), [`model`] (the
//! reference forward pass and its layers), [`store`] (routed experts:
//! disk → per-layer cache), [`kernels`] (scalar + SIMD), [`kv`],
//! [`sampler`], [`generate`] (generation, teacher-forced eval),
//! [`synth`] (the embedded synthetic default model), [`tensor`] (weight
//! matrices in their kept element type), [`profile`].

pub mod bench;
pub mod budget_sweep;
pub mod cgroup;
pub mod chat;
pub mod config;
pub mod convert;
pub mod disk;
pub mod doctor;
pub mod engine;
pub mod error;
pub mod fs;
pub mod gen_config;
pub mod generate;
pub mod gguf;
pub mod hub;
pub mod kernels;
pub mod kv;
pub mod kv_file;
pub mod layers;
pub mod model;
pub mod model_files;
pub mod plan;
pub mod profile;
pub mod progress;
pub mod quality;
pub mod quant;
pub mod replay;
pub mod runtime;
pub mod sampler;
pub mod scratch;
pub mod server;
pub mod state;
pub mod status;
pub mod store;
pub mod synth;
pub mod tensor;
pub mod tokenizer;
pub mod trace;
pub mod tune;
pub mod weights;

pub use error::{Error, Result};
