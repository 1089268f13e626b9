//! One MoE layer's cache and usage under one lock: its slots
//! ([`SlotCache`]) and the usage of its experts (what the eviction policy
//! consults), so a routing decision's bookkeeping and the cache insertions
//! it leads to take one lock per layer. The usage clock is the store's
//! (one tick per forwarded token, shared by every layer).

use super::cache::SlotCache;
use super::policy::{Evictor, View};
use super::usage::{self, Usage};
use crate::layers::mlp::Mlp;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// One layer's slots and usage.
pub(crate) struct LayerState {
    pub(crate) slots: SlotCache<Arc<Mlp>>,
    /// Per expert of the layer.
    pub(crate) usage: Vec<Usage>,
}

/// [`LayerState`] behind its lock.
pub(crate) struct LayerCache(Mutex<LayerState>);

/// The usage clock: tokens forwarded (and loaded from the history).
pub(crate) type Clock = AtomicU64;

impl LayerCache {
    /// An empty cache of `slots` (at most `experts`) for a layer of
    /// `experts` experts, evicting by `policy`.
    pub(crate) fn new(slots: usize, experts: usize, policy: Box<dyn Evictor>) -> LayerCache {
        LayerCache(Mutex::new(LayerState {
            slots: SlotCache::new(slots.min(experts), policy),
            usage: vec![Usage::default(); experts],
        }))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, LayerState> {
        self.0.lock().expect("layer cache lock")
    }

    /// Replaces the slots (emptying the cache), keeping the usage.
    pub(crate) fn reset_slots(&mut self, slots: usize, policy: Box<dyn Evictor>) {
        let state = self.0.get_mut().expect("layer cache lock");
        let experts = state.usage.len();
        state.slots = SlotCache::new(slots.min(experts), policy);
    }
}

impl LayerState {
    /// The usage the policy may consult at `clock`.
    fn view<'a>(usage: &'a [Usage], clock: &Clock) -> View<'a> {
        View {
            usage,
            now: clock.load(Ordering::Relaxed),
        }
    }

    /// Records that `experts` were selected now.
    pub(crate) fn record(&mut self, experts: &[usize], clock: &Clock) {
        usage::record(&mut self.usage, experts, clock.load(Ordering::Relaxed));
    }

    /// Per expert, whether the cache holds it (nothing counted), into `out`.
    pub(crate) fn cached_mask(&self, out: &mut Vec<bool>) {
        out.clear();
        out.extend((0..self.usage.len()).map(|e| self.slots.contains(e)));
    }

    /// Those of `experts` the cache does not hold (nothing counted).
    pub(crate) fn uncached(&self, experts: &[usize]) -> Vec<usize> {
        experts
            .iter()
            .copied()
            .filter(|&e| !self.slots.contains(e))
            .collect()
    }

    /// Looks `experts` (a fetch's sorted union) up into `out` (cleared
    /// first), counting each as a hit or a miss; `None` for a miss. The
    /// policy is told of the fetch first ([`SlotCache::observe`]).
    pub(crate) fn lookup_into(
        &mut self,
        experts: &[usize],
        out: &mut Vec<Option<Arc<Mlp>>>,
        clock: &Clock,
    ) {
        self.slots.observe(experts, Self::view(&self.usage, clock));
        out.clear();
        out.extend(experts.iter().map(|&e| self.slots.get(e)));
    }

    /// For each of `misses` (in insertion order), whether it would stay in
    /// the cache after they are all inserted.
    pub(crate) fn survivors(&self, misses: &[usize], clock: &Clock) -> Vec<bool> {
        if misses.is_empty() {
            return Vec::new();
        }
        self.slots.survivors(misses, Self::view(&self.usage, clock))
    }

    /// Inserts fetched experts, evicting by policy.
    pub(crate) fn insert(
        &mut self,
        fetched: impl Iterator<Item = (usize, Arc<Mlp>)>,
        clock: &Clock,
    ) {
        let view = Self::view(&self.usage, clock);
        for (e, mlp) in fetched {
            self.slots.insert(e, mlp, view);
        }
    }
}
