//! The store's side of `--trace` ([`crate::formats::trace`]): an observer
//! of every fetch, told each event of it. Every hook is a no-op on an
//! `Option` that is `None` unless a trace was started, so a store that
//! does not trace pays one branch per hook and allocates nothing.

use super::cache::SlotCache;
use crate::formats::trace::record::{LayerShape, Recorder};
use crate::formats::trace::{self, Tier};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

/// The routing trace being recorded, if any.
#[derive(Default)]
pub(crate) struct Trace(Option<Mutex<Recorder>>);

impl Trace {
    /// Starts recording into `path` for layers of `shapes` (appended when
    /// the trace is dropped). Returns the run's id.
    pub(crate) fn start(&mut self, path: &Path, shapes: Vec<LayerShape>) -> trace::Result<String> {
        let run = trace::run_id();
        self.0 = Some(Mutex::new(Recorder::new(path, run.clone(), shapes)?));
        Ok(run)
    }

    /// Whether a trace is being recorded.
    pub(crate) fn on(&self) -> bool {
        self.0.is_some()
    }

    fn recorder(&self) -> Option<MutexGuard<'_, Recorder>> {
        self.0.as_ref().map(|t| t.lock().expect("trace lock"))
    }

    /// One token's routing in `layer` (its chosen experts, best first,
    /// their weights and the router's top-k margin).
    pub(crate) fn route(&self, layer: usize, experts: &[usize], weights: &[f32], margin: f32) {
        if let Some(mut t) = self.recorder() {
            t.route(layer, experts, weights, margin);
        }
    }

    /// A lookahead guess of `layer`'s experts (`which`: see
    /// [`Recorder::guess`]).
    pub(crate) fn guess(&self, layer: usize, which: usize, experts: &[usize]) {
        if let Some(mut t) = self.recorder() {
            t.guess(layer, which, experts);
        }
    }

    /// The cached experts of a fetch of `ids` (`cached[i]` is `Some` for a
    /// hit), pinned or warm by `cache`.
    pub(crate) fn hits<T, V: Clone>(
        &self,
        layer: usize,
        ids: &[usize],
        cached: &[Option<T>],
        cache: &SlotCache<V>,
    ) {
        let Some(mut t) = self.recorder() else {
            return;
        };
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
    pub(crate) fn miss(&self, layer: usize, expert: usize, tier: Tier, bytes: u64) {
        if let Some(mut t) = self.recorder() {
            t.looked_up(layer, expert, tier, bytes);
        }
    }

    /// A read the fetch waited on landed.
    pub(crate) fn read(&self, layer: usize, expert: usize, bytes: u64, read_us: u64) {
        if let Some(mut t) = self.recorder() {
            t.read(layer, expert, bytes, read_us);
        }
    }

    /// The layer's fetch finished (its cache insertions done), leaving
    /// `slots` usable.
    pub(crate) fn end_fetch(&self, layer: usize, slots: usize) {
        if let Some(mut t) = self.recorder() {
            t.end_fetch(layer, slots);
        }
    }

    /// A forward of `tokens` tokens finished.
    pub(crate) fn end_step(&self, tokens: u64) {
        if let Some(mut t) = self.recorder() {
            t.end_step(tokens);
        }
    }
}
