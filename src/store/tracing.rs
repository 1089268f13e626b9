//! The store's side of `--trace` ([`crate::formats::trace`]): where each event of a
//! layer's fetch is reported to the recorder. Every hook is a no-op on an
//! `Option` that is `None` unless a trace was started, so a store that
//! does not trace pays one branch per hook and allocates nothing.

use super::ExpertStore;
use crate::formats::trace::record::{LayerShape, Recorder};
use crate::formats::trace::{self, Tier};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

impl ExpertStore {
    /// Starts recording a routing trace into `path` (appended when the
    /// store finishes it or is dropped). Also scores both lookahead
    /// variants at every single-token layer (`Schedule::recall`), so every
    /// decode row carries both guesses; tokens do not change. Returns the
    /// run's id.
    pub fn start_trace(&mut self, path: &Path) -> trace::Result<String> {
        let shapes = self
            .locations
            .iter()
            .map(|l| LayerShape {
                n_experts: l.len() as u32,
                expert_bytes: l
                    .first()
                    .map_or(0, |loc| loc.parts.iter().map(|r| r.entry.len as u64).sum()),
            })
            .collect();
        let run = trace::run_id();
        self.trace = Some(Mutex::new(Recorder::new(path, run.clone(), shapes)?));
        self.schedule.recall = true;
        Ok(run)
    }

    /// Whether a trace is being recorded.
    pub fn tracing(&self) -> bool {
        self.trace.is_some()
    }

    fn recorder(&self) -> Option<std::sync::MutexGuard<'_, Recorder>> {
        self.trace.as_ref().map(|t| t.lock().expect("trace lock"))
    }

    /// One token's routing in `layer` (its chosen experts, best first,
    /// their weights and the router's top-k margin).
    pub fn trace_route(&self, layer: usize, experts: &[usize], weights: &[f32], margin: f32) {
        if let Some(mut t) = self.recorder() {
            t.route(layer, experts, weights, margin);
        }
    }

    /// A lookahead guess of `layer`'s experts (variant 0 = attn, 1 = output).
    pub(super) fn trace_guess(&self, layer: usize, variant: usize, experts: &[usize]) {
        if let Some(mut t) = self.recorder() {
            t.guess(layer, variant, experts);
        }
    }

    /// The cached experts of a fetch of `ids` (`cached[i]` is `Some` for a
    /// hit), pinned or warm.
    pub(super) fn trace_hits<T>(&self, layer: usize, ids: &[usize], cached: &[Option<T>]) {
        let Some(mut t) = self.recorder() else {
            return;
        };
        let cache = self.caches[layer].lock().expect("cache lock");
        for (&e, c) in ids.iter().zip(cached) {
            if c.is_some() {
                let tier = if cache.is_pinned(e) {
                    Tier::Pinned
                } else {
                    Tier::Warm
                };
                t.looked_up(layer, e, tier, 0);
            }
        }
    }

    /// A miss of a fetch: `Prefetched` (with the bytes, when the prefetch
    /// had already landed) or `Miss`.
    pub(super) fn trace_miss(&self, layer: usize, expert: usize, tier: Tier, bytes: u64) {
        if let Some(mut t) = self.recorder() {
            t.looked_up(layer, expert, tier, bytes);
        }
    }

    /// A read the fetch waited on landed.
    pub(super) fn trace_read(&self, layer: usize, expert: usize, bytes: u64, read_us: u64) {
        if let Some(mut t) = self.recorder() {
            t.read(layer, expert, bytes, read_us);
        }
    }

    /// The layer's fetch finished (its cache insertions done).
    pub(super) fn trace_end_fetch(&self, layer: usize) {
        if let Some(mut t) = self.recorder() {
            let slots = self.caches[layer].lock().expect("cache lock").limit();
            t.end_fetch(layer, slots);
        }
    }

    /// A forward of `tokens` tokens finished.
    pub(super) fn trace_end_step(&self, tokens: u64) {
        if let Some(mut t) = self.recorder() {
            t.end_step(tokens);
        }
    }

    /// Appends the trace recorded so far to its file and stops recording:
    /// the rows added and the file (`None` when not tracing). Otherwise
    /// that happens when the store is dropped.
    pub fn finish_trace(&mut self) -> trace::Result<Option<(u64, PathBuf)>> {
        match self.trace.take() {
            None => Ok(None),
            Some(t) => {
                let mut t = t.into_inner().expect("trace lock");
                t.finish().map(Some)
            }
        }
    }
}
