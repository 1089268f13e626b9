//! What loading a model is asked to do: cache size, read mode, budget,
//! policy, schedule and the rest, with their defaults.

use super::mla::{DsaMode, MlaMode};
use super::progress::Progress;
use crate::formats::quant::policy::Policy;
use crate::store::policy::EvictPolicy;
use crate::store::ScheduleOptions;

/// Options for loading.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Routed experts cached per layer.
    pub expert_cache: usize,
    pub read_mode: moestream_io::ReadMode,
    pub mla: MlaMode,
    pub dsa: DsaMode,
    /// Batch each layer's expert misses through the io_uring reactor (when
    /// the kernel supports it); otherwise read them one by one.
    pub io_reactor: bool,
    /// Quantize float and FP8 tensors by this policy as they load (the
    /// runtime quantizer; a container's packed tensors are used as stored).
    pub quantize_at_load: Option<Policy>,
    /// RAM budget in bytes: expert slots per layer are planned to fit it
    /// (overriding `expert_cache`).
    pub ram_budget: Option<u64>,
    /// Which cached expert a full cache evicts.
    pub policy: EvictPolicy,
    /// Pin each layer's hottest experts from the model's usage history
    /// (kept under the cache directory, [`crate::store::usage::history_path`]),
    /// if there is one.
    pub pin_history: bool,
    /// Context the KV pool is budgeted for (clamped to the model's maximum).
    pub context: usize,
    /// Pipelining, prefetch and the router's scoring, as asked; loading
    /// resolves them against the model's top-k into the store's
    /// [`crate::store::Schedule`].
    pub schedule: ScheduleOptions,
    /// A learned lookahead predictor: after each MoE layer routes a decode
    /// token, the next MoE layer's guessed experts are read ahead (in
    /// place of the router lookahead's reads).
    pub predictor: Option<std::sync::Arc<crate::store::predictor::Predictor>>,
    /// Where loading reports the resident bytes read so far (and the model
    /// keeps it for prefill progress); off by default.
    pub progress: Progress,
    /// Bytes the command's own inputs hold while the model runs (a text
    /// being tokenized, a prompts file, reference logits: see
    /// [`crate::formats::tokenizer::TOKENIZE_BYTES_PER_BYTE`]), planned as
    /// the `inputs` item of the RAM plan.
    pub input_bytes: u64,
}

impl LoadOptions {
    /// Prefetch reads alive at once for a model routing `top_k` experts
    /// per token: 0 without prefetch.
    pub fn prefetch_experts_max(&self, top_k: usize) -> usize {
        self.schedule
            .prefetch_experts_max(top_k, self.predictor.is_some())
    }
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            expert_cache: 16,
            read_mode: moestream_io::ReadMode::Buffered,
            mla: MlaMode::Auto,
            dsa: DsaMode::Auto,
            io_reactor: true,
            quantize_at_load: None,
            ram_budget: None,
            policy: EvictPolicy::default(),
            pin_history: true,
            context: 4096,
            schedule: ScheduleOptions::default(),
            predictor: None,
            progress: Progress::default(),
            input_bytes: 0,
        }
    }
}
