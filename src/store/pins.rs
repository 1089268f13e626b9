//! Usage and pins: the hottest experts of a saved history are pinned at
//! load and re-picked between requests; the usage each layer keeps beside
//! its cache is saved back to the history.

use super::policy;
use super::usage::Usage;
use super::ExpertStore;
use crate::error::Result;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl ExpertStore {
    /// Usage counters of one expert.
    pub fn usage(&self, layer: usize, expert: usize) -> Usage {
        self.layers[layer].lock().usage[expert]
    }

    /// Loads the usage history saved at `path` and pins each layer's
    /// hottest experts (up to half the slots, scaled by the history's
    /// length). Returns the tokens of history and the experts pinned.
    pub fn pin_from_history(&self, path: &std::path::Path) -> Result<(u64, usize)> {
        let tokens = {
            let mut history = self.history.lock().expect("history lock");
            let tokens = history.load(path)?;
            for (l, cache) in self.layers.iter().enumerate() {
                cache.lock().usage.copy_from_slice(history.layer(l));
            }
            self.clock.store(history.clock(), Ordering::Relaxed);
            tokens
        };
        let mut pinned = 0;
        for layer in 0..self.layers.len() {
            let hot = {
                let state = self.layers[layer].lock();
                let slots = state.slots.capacity();
                let n = policy::pin_count(slots, tokens, self.top_k, state.usage.len());
                policy::hottest(&state.usage, n)
            };
            pinned += self.pin(layer, &hot)?;
        }
        Ok((tokens, pinned))
    }

    /// Fetches (when not cached) and pins `experts` of `layer`; returns how
    /// many are pinned.
    fn pin(&self, layer: usize, experts: &[usize]) -> Result<usize> {
        let missing = self.layers[layer].lock().uncached(experts);
        let mut got = Vec::with_capacity(missing.len());
        for &e in &missing {
            got.push((e, Arc::new(self.read(layer, e)?)));
        }
        let mut state = self.layers[layer].lock();
        // Pinned experts get slots of their own, gated or not.
        state.slots.grow(missing.len());
        state.insert(got.into_iter(), &self.clock);
        Ok(experts.iter().filter(|&&e| state.slots.pin(e)).count())
    }

    /// Re-picks every layer's pinned set from the current heats (between
    /// requests), with the anti-ping-pong margin. Returns the swaps made.
    pub fn repin(&self) -> Result<usize> {
        let mut swaps = 0;
        for layer in 0..self.layers.len() {
            let done = {
                let mut state = self.layers[layer].lock();
                let mut pinned = state.slots.pinned();
                if pinned.is_empty() {
                    continue;
                }
                let done = policy::repin(&mut pinned, &state.usage);
                for &(out, _) in &done {
                    state.slots.unpin(out);
                }
                done
            };
            let ins: Vec<usize> = done.iter().map(|s| s.1).collect();
            self.pin(layer, &ins)?;
            swaps += done.len();
        }
        Ok(swaps)
    }

    /// Saves the usage history to `path` (merged with what it holds now;
    /// temp file + rename).
    pub fn save_history(&self, path: &std::path::Path) -> Result<()> {
        let mut history = self.history.lock().expect("history lock");
        for (l, cache) in self.layers.iter().enumerate() {
            history.set_layer(l, &cache.lock().usage);
        }
        history.set_clock(self.clock.load(Ordering::Relaxed));
        history.save(path)
    }

    /// Experts pinned in `layer`.
    pub fn pinned(&self, layer: usize) -> Vec<usize> {
        self.layers[layer].lock().slots.pinned()
    }
}
