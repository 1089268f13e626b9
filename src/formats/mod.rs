//! Model files as they come: config.json, generation_config.json, the tokenizer,
//! the safetensors shard index and the container, GGUF reading, chat templates,
//! the hub cache, weight matrices in their stored element type and the packed
//! (quantized) formats. Reading only: the writers live in [`crate::convert`].

pub mod chat;
pub mod config;
pub mod gguf;
pub mod hub;
pub mod model_files;
pub mod quant;
pub mod tensor;
pub mod tokenizer;
pub mod trace;
pub mod weights;
