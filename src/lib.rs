//! moestream: run Mixture-of-Experts LLMs far larger than RAM by keeping the
//! always-on weights resident and streaming routed experts from disk.
//!
//! The data path of one layer: route → look up the expert cache → read the
//! misses → compute → add. See docs/ARCHITECTURE.md.
//!
//! Rooms, top to bottom (an arrow only points down; tests/architecture.rs
//! checks it): `cli` (the command line, in the binary), [`server`] (the OpenAI API),
//! [`lab`] (synthetic models, traces, replay, benches, tune), [`inspect`]
//! (plan, doctor, status), [`engine`] (sessions, generation, sampling,
//! speculation, grammars), [`convert`] (the writers: container, GGUF),
//! [`model`] (the forward pass and its KV cache), [`store`] (routed experts:
//! disk → per-layer cache), [`layers`] (MLP, norms, RoPE), [`formats`]
//! (model files as they come), [`kernels`] (scalar + SIMD), and the ground
//! floor: [`machine`] (cgroup, disk), [`fs`] (bounded reads, safe writes,
//! state directories) and [`error`].

pub mod convert;
pub mod engine;
pub mod error;
pub mod formats;
pub mod fs;
pub mod inspect;
pub mod kernels;
pub mod lab;
pub mod layers;
pub mod machine;
pub mod model;
pub mod server;
pub mod store;

pub use error::{Error, Result};
