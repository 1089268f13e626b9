//! Eviction policies and pinning rules (SPEC §7).
//!
//! An [`Evictor`] decides which expert a full layer cache evicts. The same
//! policy objects drive the live cache ([`super::cache::SlotCache`] inside
//! the store) and the offline replay (`crate::lab::replay`, which drives a
//! `SlotCache<()>` from a recorded trace), so a replay of a run with the
//! run's policy and slots reproduces its hits and misses exactly.
//!
//! A policy is one file here: its state, its [`Evictor`] impl and its table
//! tests; [`EvictPolicy`] names the live ones, [`build`] every one by name.
//!
//! - `lru`: the least recently looked-up or inserted expert goes.
//! - `lfru`: decaying heat first, token recency breaks ties.
//! - `lfu`: lifetime selections first, then least recent.
//! - `least-stale`: the expert chosen the most tokens ago goes,
//!   the least heated of equally stale ones first (after SpecMD's
//!   Least-Stale). On realistic routing (next-token reuse 0.30) it misses
//!   25% less than lfru live and 1.58x Belady against lfru's 2.09x;
//!   results/policies.md.
//! - `arc`: adaptive replacement (Megiddo & Modha): recency and frequency
//!   lists sized by ghost hits.
//! - `auto` (default): per layer, whichever of least-stale and LFRU would
//!   have missed least on the layer's recent lookups (ghost caches measure
//!   it, [`Chooser`] decides with hysteresis): no single policy wins on
//!   every routing, and auto ends within 1-2% of the better one on both
//!   presets and both trained models' traces; results/policies.md.
//! - `belady`: Belady's MIN, the offline optimum; it needs every access's
//!   next use, so only the replay can run it.
//!
//! Every policy sees the cache's slots in insertion order and breaks ties
//! towards the earliest inserted; pinned slots are never victims. Hooks are
//! called without allocating, so a replay allocates nothing per access.

mod arc;
mod auto;
mod belady;
mod chooser;
mod least_stale;
mod lfru;
mod lfu;
mod lru;
mod pinning;

pub use arc::Adaptive;
pub use auto::{Auto, CANDIDATES};
pub use belady::Belady;
pub use chooser::Chooser;
pub use least_stale::LeastStale;
pub use lfru::{lfru_score, Lfru};
pub use lfu::Lfu;
pub use lru::Lru;
pub use pinning::{hottest, pin_count, repin, should_swap, CONFIDENCE_SELECTIONS};

use super::usage::Usage;

/// One occupied slot as a policy sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    pub key: usize,
    /// The cache's clock at the key's last lookup or insertion.
    pub last: u64,
    pub pinned: bool,
}

/// What a policy may read besides its own state: the layer's usage
/// counters (selections per token, decaying heat, last use) and the usage
/// clock (tokens forwarded).
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    pub usage: &'a [Usage],
    pub now: u64,
}

impl View<'_> {
    /// No usage recorded (policies that read none).
    pub const EMPTY: View<'static> = View { usage: &[], now: 0 };

    /// The usage of `key` (zeros for an expert the view does not cover).
    pub fn of(&self, key: usize) -> Usage {
        self.usage.get(key).copied().unwrap_or_default()
    }
}

/// An eviction policy of one layer's cache. The cache calls the hooks as
/// things happen and [`Evictor::victim`] when it must make room.
pub trait Evictor: Send {
    /// The name `--policy` and `replay --policy` take.
    fn name(&self) -> &'static str;

    /// The policy deciding victims now: the policy's own name, or for one
    /// that chooses among others (`auto`), the one it chose.
    fn active(&self) -> &'static str {
        self.name()
    }

    /// Times the active policy changed.
    fn switches(&self) -> u64 {
        0
    }

    /// Which of the full cache's `slots` (insertion order) to evict so that
    /// `incoming` fits: an index into `slots`, never a pinned one; `None`
    /// to insert nothing (every slot pinned, or `incoming` itself is the
    /// best victim).
    fn victim(&self, incoming: usize, slots: &[Slot], view: View) -> Option<usize>;

    /// The layer is about to look `keys` up (one fetch: the sorted union
    /// of its rows' experts), their selections already in `view`.
    fn on_fetch(&mut self, _keys: &[usize], _view: View) {}
    /// A lookup found `key` cached.
    fn on_hit(&mut self, _key: usize) {}
    /// A lookup did not find `key`.
    fn on_miss(&mut self, _key: usize) {}
    /// `key` took a slot.
    fn on_insert(&mut self, _key: usize) {}
    /// `key` left its slot.
    fn on_evict(&mut self, _key: usize) {}
    /// The usable slots became `limit` (at creation and when a gated cache
    /// grows).
    fn on_limit(&mut self, _limit: usize) {}
    /// `key`, looked up now, is next looked up at access `at` (`u64::MAX`:
    /// never). Only the replay knows; the live cache never calls it.
    fn on_next_use(&mut self, _key: usize, _at: u64) {}
    /// Whether the policy needs [`Evictor::on_next_use`] (the future).
    fn offline(&self) -> bool {
        false
    }

    /// A copy with the same state (the cache's dry runs use one).
    fn clone_box(&self) -> Box<dyn Evictor>;
}

impl Clone for Box<dyn Evictor> {
    fn clone(&self) -> Self {
        self.clone_box()
    }
}

/// The unpinned slot with the lowest `score`, the earliest inserted among
/// equals; `None` when every slot is pinned.
pub fn lowest<K: Ord>(slots: &[Slot], score: impl Fn(&Slot) -> K) -> Option<usize> {
    slots
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.pinned)
        .min_by_key(|(_, s)| score(s))
        .map(|(i, _)| i)
}

/// The policies the live cache can run (`--policy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EvictPolicy {
    /// Least recently used.
    Lru,
    /// Frequency first (decaying heat), recency breaks ties.
    Lfru,
    /// Lifetime selections first, recency breaks ties.
    Lfu,
    /// The expert chosen the most tokens ago.
    LeastStale,
    /// Adaptive replacement cache.
    Arc,
    /// Per layer, the candidate that would have missed least ([`Auto`]).
    #[default]
    Auto,
}

impl EvictPolicy {
    pub const ALL: [EvictPolicy; 6] = [
        EvictPolicy::Lru,
        EvictPolicy::Lfru,
        EvictPolicy::Lfu,
        EvictPolicy::LeastStale,
        EvictPolicy::Arc,
        EvictPolicy::Auto,
    ];

    pub fn name(self) -> &'static str {
        match self {
            EvictPolicy::Lru => "lru",
            EvictPolicy::Lfru => "lfru",
            EvictPolicy::Lfu => "lfu",
            EvictPolicy::LeastStale => "least-stale",
            EvictPolicy::Arc => "arc",
            EvictPolicy::Auto => "auto",
        }
    }

    /// The policy of `name`, if it is a live one.
    pub fn from_name(name: &str) -> Option<EvictPolicy> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// A fresh policy for a layer of `experts` experts.
    pub fn build(self, experts: usize) -> Box<dyn Evictor> {
        match self {
            EvictPolicy::Lru => Box::new(Lru),
            EvictPolicy::Lfru => Box::new(Lfru),
            EvictPolicy::Lfu => Box::new(Lfu),
            EvictPolicy::LeastStale => Box::new(LeastStale),
            EvictPolicy::Arc => Box::new(Adaptive::new(experts)),
            EvictPolicy::Auto => Box::new(Auto::new(experts)),
        }
    }
}

/// Every policy name [`build`] knows, live ones first.
pub const NAMES: [&str; 7] = ["lru", "lfru", "lfu", "least-stale", "arc", "auto", "belady"];

/// A fresh policy named `name` for a layer of `experts` experts, offline
/// ones included.
pub fn build(name: &str, experts: usize) -> Option<Box<dyn Evictor>> {
    if name == "belady" {
        return Some(Box::new(Belady::new(experts)));
    }
    EvictPolicy::from_name(name).map(|p| p.build(experts))
}

#[cfg(test)]
pub(crate) mod table {
    //! Drives a policy over hand-made access sequences the way a layer
    //! does: per step, every lookup of the step's (sorted, unique) experts,
    //! then the insertion of its misses in order.

    use super::super::cache::SlotCache;
    use super::super::usage::UsageTable;
    use super::*;

    /// A table row: (slots, steps, misses, experts held at the end).
    pub type Case = (usize, &'static [&'static [usize]], u64, &'static [usize]);

    /// Asserts every case of `policy`.
    pub fn check(policy: &str, cases: &[Case]) {
        for &(slots, steps, misses, held) in cases {
            assert_eq!(
                run(policy, slots, steps),
                (misses, held.to_vec()),
                "{policy}: {slots} slots, {steps:?}"
            );
        }
    }

    /// Misses of `policy` with `slots` slots over `steps` (one token per
    /// step; usage recorded as the live store records it); the final
    /// cached keys are returned sorted.
    pub fn run(name: &str, slots: usize, steps: &[&[usize]]) -> (u64, Vec<usize>) {
        let experts = 16;
        let mut usage = UsageTable::new(&[experts], 256);
        let mut cache: SlotCache<()> = SlotCache::new(slots, build(name, experts).unwrap());
        // Next use of each access, for Belady: the next step holding the key.
        let next_use = |i: usize, key: usize| {
            (i + 1..steps.len())
                .find(|&j| steps[j].contains(&key))
                .map_or(u64::MAX, |j| j as u64)
        };
        let mut misses = Vec::new();
        for (i, step) in steps.iter().enumerate() {
            usage.record(0, step);
            for &k in step.iter() {
                cache.hint_next(k, next_use(i, k));
            }
            let view = View {
                usage: usage.layer(0),
                now: usage.clock(),
            };
            cache.observe(step, view);
            misses.clear();
            misses.extend(step.iter().copied().filter(|&k| cache.get(k).is_none()));
            for &k in &misses {
                cache.insert(k, (), view);
            }
            usage.tick(1);
        }
        let mut held = cache.keys();
        held.sort_unstable();
        (cache.counters.misses, held)
    }
}
