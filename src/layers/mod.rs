//! The layers below both the model and the expert store: the SwiGLU MLP
//! (every dense, shared and routed expert is one), RMSNorm and RoPE. They
//! know matrices and activations, nothing of files, caches or families, so
//! the store can hold experts without importing the model.

pub mod mlp;
pub mod norm;
pub mod rope;
pub mod scratch;
pub mod tap;
