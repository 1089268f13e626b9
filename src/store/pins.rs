//! Usage and pins: every router selection updates the usage table; the
//! hottest experts of a saved history are pinned at load and re-picked
//! between requests.

use super::policy;
use super::usage::Usage;
use super::ExpertStore;
use crate::error::Result;
use std::sync::Arc;

impl ExpertStore {
    /// Records a router selection in the usage counters.
    pub fn record_usage(&self, layer: usize, experts: &[usize]) {
        self.usage
            .lock()
            .expect("usage lock")
            .record(layer, experts);
    }

    /// Advances the usage clock by `tokens` forwarded tokens.
    pub fn tick(&self, tokens: u64) {
        self.usage.lock().expect("usage lock").tick(tokens);
        self.trace_end_step(tokens);
    }

    /// Usage counters of one expert.
    pub fn usage(&self, layer: usize, expert: usize) -> Usage {
        self.usage.lock().expect("usage lock").get(layer, expert)
    }

    /// Loads the usage history saved at `path` and pins each layer's
    /// hottest experts (up to half the slots, scaled by the history's
    /// length). Returns the tokens of history and the experts pinned.
    pub fn pin_from_history(&self, path: &std::path::Path) -> Result<(u64, usize)> {
        let tokens = self.usage.lock().expect("usage lock").load(path)?;
        let mut pinned = 0;
        for layer in 0..self.locations.len() {
            let slots = self.caches[layer].lock().expect("cache lock").capacity();
            let n = policy::pin_count(slots, tokens, self.top_k, self.locations[layer].len());
            let hot = policy::hottest(self.usage.lock().expect("usage lock").layer(layer), n);
            pinned += self.pin(layer, &hot)?;
        }
        Ok((tokens, pinned))
    }

    /// Fetches (when not cached) and pins `experts` of `layer`; returns how
    /// many are pinned.
    fn pin(&self, layer: usize, experts: &[usize]) -> Result<usize> {
        let missing = self.uncached(layer, experts);
        let mut got = Vec::with_capacity(missing.len());
        for &e in &missing {
            got.push((e, Some(Arc::new(self.read(layer, e)?))));
        }
        // Pinned experts get slots of their own, gated or not.
        self.caches[layer]
            .lock()
            .expect("cache lock")
            .grow(missing.len());
        self.insert(layer, got.into_iter());
        let mut cache = self.caches[layer].lock().expect("cache lock");
        Ok(experts.iter().filter(|&&e| cache.pin(e)).count())
    }

    /// Re-picks every layer's pinned set from the current heats (between
    /// requests), with the anti-ping-pong margin. Returns the swaps made.
    pub fn repin(&self) -> Result<usize> {
        let mut swaps = 0;
        for layer in 0..self.locations.len() {
            let mut pinned = self.caches[layer].lock().expect("cache lock").pinned();
            if pinned.is_empty() {
                continue;
            }
            let done = {
                let usage = self.usage.lock().expect("usage lock");
                policy::repin(&mut pinned, usage.layer(layer))
            };
            for &(out, _) in &done {
                self.caches[layer].lock().expect("cache lock").unpin(out);
            }
            let ins: Vec<usize> = done.iter().map(|s| s.1).collect();
            self.pin(layer, &ins)?;
            swaps += done.len();
        }
        Ok(swaps)
    }

    /// Saves the usage history to `path` (temp file + rename).
    pub fn save_history(&self, path: &std::path::Path) -> Result<()> {
        self.usage.lock().expect("usage lock").save(path)
    }

    /// Experts pinned in `layer`.
    pub fn pinned(&self, layer: usize) -> Vec<usize> {
        self.caches[layer].lock().expect("cache lock").pinned()
    }
}
