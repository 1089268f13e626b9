//! Errors of the `moestream` crate: one typed enum for everything that can go
//! wrong while loading or running a model. Every variant names the file,
//! tensor or config field at fault, so a user can act on the message.
//!
//! Programmer errors (broken invariants) are assertions, not variants here.

use std::path::PathBuf;

/// Result alias for the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can fail when loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be opened, read or written.
    #[error("{path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A read through the I/O layer failed (carries op, path, offset, length).
    #[error(transparent)]
    Io(#[from] moestream_io::IoError),
    /// A weight is NaN or infinite (checked at load for resident weights and
    /// at convert for every tensor).
    #[error(
        "tensor `{name}`: element {index} is not finite (NaN or Inf); the checkpoint is corrupt"
    )]
    NonFiniteWeight { name: String, index: usize },
    /// A scale of a packed or block-quantized weight is NaN or infinite
    /// (checked where its bytes enter: at load, and as a streamed expert
    /// lands, before it is cached). `at` names the row or block.
    #[error(
        "tensor `{name}`: the scale of {at} is not finite (NaN or Inf); the checkpoint is corrupt"
    )]
    NonFiniteScale { name: String, at: String },
    /// An activation or logit became NaN or infinite during a forward:
    /// refused rather than turned into a token.
    #[error("non-finite values in {what} (a weight or an activation overflowed); no token is chosen from them")]
    NonFinite { what: String },
    /// config.json (or another JSON file) is missing a field or holds a bad value.
    #[error("{path}: field `{field}`: {reason}")]
    Config {
        path: PathBuf,
        field: String,
        reason: String,
    },
    /// config.json names a `model_type` this engine does not implement.
    #[error("{path}: unknown architecture: model_type `{model_type}` (supported: {supported})")]
    UnknownArchitecture {
        path: PathBuf,
        model_type: String,
        supported: String,
    },
    /// A safetensors shard is malformed: bad header, or offsets past the end of the file.
    #[error("{path}: {reason}")]
    Shard { path: PathBuf, reason: String },
    /// The checkpoint lacks a tensor the architecture needs.
    #[error("missing tensor `{name}` (not in any shard of {dir})")]
    MissingTensor { name: String, dir: PathBuf },
    /// A tensor is stored with a dtype the engine does not read.
    #[error("{path}: tensor `{name}` has unsupported dtype {dtype} (supported: F32, BF16, F16)")]
    Dtype {
        path: PathBuf,
        name: String,
        dtype: String,
    },
    /// A tensor's shape disagrees with the config.
    #[error("{path}: tensor `{name}` has shape {got:?}, config implies {expected:?}")]
    Shape {
        path: PathBuf,
        name: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    /// tokenizer.json could not be loaded or used.
    #[error("{path}: tokenizer: {reason}")]
    Tokenizer { path: PathBuf, reason: String },
    /// A token id is not in the vocabulary.
    #[error("token id {id} at position {position} is out of vocabulary (vocab_size {vocab_size})")]
    TokenOutOfVocab {
        id: u32,
        position: usize,
        vocab_size: usize,
    },
    /// The RAM budget cannot hold the model's resident set and slack.
    #[error("{0}")]
    Budget(String),
    /// A request needs more KV positions than the RAM plan reserved (the
    /// planned context setting).
    #[error("the request needs {needed} positions; the RAM plan reserved KV cache for {reserved} (raise the planned context)")]
    ContextBudget { needed: usize, reserved: usize },
    /// A conversion's output directory already holds files: a model, or a
    /// conversion (`conversion`) that resuming would continue.
    #[error("the output {} already holds {}; refusing to overwrite it (forcing replaces it once the new container is complete), or choose an empty directory", path.display(), if *conversion { "a conversion (moestream-convert.json) that resuming continues" } else { "files (a model?)" })]
    OutputOccupied { path: PathBuf, conversion: bool },
    /// A load or run setting with a value it cannot take.
    #[error("setting `{name}`: {reason}")]
    Setting { name: &'static str, reason: String },
    /// A request asks for something the engine cannot do.
    #[error("bad request: {0}")]
    Request(String),
    /// A saved KV file that cannot be used (corrupt, truncated, or of
    /// another model); it is recomputed, never used.
    #[error("{path}: KV file refused: {reason}")]
    KvFile { path: PathBuf, reason: String },
    /// An importance file (`calibrate`'s output) that cannot be read or
    /// does not fit the tensors it is applied to; `at` names the tensor or
    /// the field.
    #[error("{}: importance file refused at {at}: {reason}", path.display())]
    Importance {
        path: PathBuf,
        at: String,
        reason: String,
    },
    /// A chat template that cannot be loaded or rendered: bad syntax, a
    /// `raise_exception` from the template itself, an unknown filter or
    /// method. `origin` names where the template came from (a file, or a
    /// tokenizer_config.json field).
    #[error("chat template {origin}: {reason}")]
    ChatTemplate { origin: String, reason: String },
    /// A file refused before it is read or written: not a regular file (a
    /// FIFO, device, socket or directory), over its kind's size limit, or
    /// an output that is one of the command's inputs.
    #[error("{path}: {reason}")]
    FileRefused { path: PathBuf, reason: String },
    /// Long work (a prefill) stopped at a boundary because another thread
    /// raised its [`Interrupt`](crate::model::progress::Interrupt).
    #[error("interrupted: the work was asked to stop (the server is shutting down)")]
    Interrupted,
}

impl Error {
    /// Wraps an `std::io::Error` with the path it concerns.
    pub fn file(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::File {
            path: path.into(),
            source,
        }
    }

    /// A config error naming the field.
    pub fn config(path: impl Into<PathBuf>, field: &str, reason: impl Into<String>) -> Self {
        Error::Config {
            path: path.into(),
            field: field.to_string(),
            reason: reason.into(),
        }
    }
}
