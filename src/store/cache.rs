//! One layer's expert cache: a fixed number of slots, some of them pinned
//! (the hot tier, never evicted), the rest filled on demand (the warm tier)
//! and evicted by the cache's [`Evictor`] (see [`super::policy`]). Lookups
//! are counted per tier.
//!
//! Slots are few (tens to a few hundred), so a flat vector with linear
//! scans beats any map here and keeps the order of entries deterministic:
//! slots stay in insertion order, which is how policies break ties.
//!
//! Of its `capacity` slots, only `limit` are usable now: the store raises
//! the limit as memory for more experts becomes available without page
//! faults (see `ExpertStore::begin`), so the cache grows no faster than its
//! buffers can be faulted in off the read path. A cache that is not gated
//! has `limit == capacity` from the start.
//!
//! The live store keeps experts here; the replay keeps `()`, with the same
//! policy code, so a replay makes the same decisions the run made.

use super::policy::{Evictor, Slot, View};

/// Hit and miss counters of one cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheCounters {
    /// Lookups served by a pinned entry.
    pub pinned_hits: u64,
    /// Lookups served by an unpinned entry.
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
}

/// A bounded cache of experts keyed by expert index.
pub struct SlotCache<V> {
    capacity: usize,
    /// Slots usable now, `slots.len() <= limit <= capacity`; only grows.
    limit: usize,
    /// Occupied slots in insertion order; `values[i]` belongs to `slots[i]`.
    slots: Vec<Slot>,
    values: Vec<V>,
    /// Counts lookups and insertions (the `last` of a slot).
    tick: u64,
    policy: Box<dyn Evictor>,
    pub counters: CacheCounters,
}

impl Clone for SlotCache<()> {
    /// The same slots, clock, counters and policy state (a ghost cache's
    /// copy).
    fn clone(&self) -> Self {
        SlotCache {
            counters: self.counters,
            ..self.shadow()
        }
    }
}

impl<V: Clone> SlotCache<V> {
    /// An empty cache of `capacity` slots, all usable, evicting by `policy`.
    pub fn new(capacity: usize, policy: Box<dyn Evictor>) -> SlotCache<V> {
        Self::gated(capacity, capacity, policy)
    }

    /// An empty cache of `capacity` slots of which `limit` are usable
    /// until [`SlotCache::grow`] raises it.
    pub fn gated(capacity: usize, limit: usize, mut policy: Box<dyn Evictor>) -> SlotCache<V> {
        let limit = limit.min(capacity);
        policy.on_limit(limit);
        SlotCache {
            capacity,
            limit,
            slots: Vec::with_capacity(capacity),
            values: Vec::with_capacity(capacity),
            tick: 0,
            policy,
            counters: CacheCounters::default(),
        }
    }

    /// Gates an empty cache: `limit` slots usable from now on.
    pub fn gate(&mut self, limit: usize) {
        assert!(self.slots.is_empty(), "only an empty cache is gated");
        self.limit = limit.min(self.capacity);
        self.policy.on_limit(self.limit);
    }

    fn find(&self, key: usize) -> Option<usize> {
        self.slots.iter().position(|s| s.key == key)
    }

    /// The value under `key`, counting a hit (pinned or not) or a miss.
    pub fn get(&mut self, key: usize) -> Option<V> {
        self.tick += 1;
        match self.find(key) {
            Some(i) => {
                let s = &mut self.slots[i];
                s.last = self.tick;
                if s.pinned {
                    self.counters.pinned_hits += 1;
                } else {
                    self.counters.hits += 1;
                }
                self.policy.on_hit(key);
                Some(self.values[i].clone())
            }
            None => {
                self.counters.misses += 1;
                self.policy.on_miss(key);
                None
            }
        }
    }

    /// Tells the policy a fetch of `keys` (sorted, unique) is about to be
    /// looked up, with `view` the usage after their selections (see
    /// [`Evictor::on_fetch`]).
    pub fn observe(&mut self, keys: &[usize], view: View) {
        self.policy.on_fetch(keys, view);
    }

    /// Tells the policy when `key` is next looked up (the replay's future;
    /// see [`Evictor::on_next_use`]).
    pub fn hint_next(&mut self, key: usize, at: u64) {
        self.policy.on_next_use(key, at);
    }

    /// Inserts (or refreshes) `key`. When full, evicts the policy's victim
    /// and returns its key; when the policy picks none (every slot pinned,
    /// or the incoming key is the worst to keep) nothing is inserted.
    /// `view` is the usage the policy may consult.
    pub fn insert(&mut self, key: usize, value: V, view: View) -> Option<usize> {
        self.tick += 1;
        if let Some(i) = self.find(key) {
            self.values[i] = value;
            self.slots[i].last = self.tick;
            return None;
        }
        if self.limit == 0 {
            return None;
        }
        let mut evicted = None;
        if self.slots.len() == self.limit {
            let i = self.policy.victim(key, &self.slots, view)?;
            assert!(!self.slots[i].pinned, "a policy evicted a pinned expert");
            let gone = self.slots.remove(i).key;
            self.values.remove(i);
            self.policy.on_evict(gone);
            self.counters.evictions += 1;
            evicted = Some(gone);
        }
        self.slots.push(Slot {
            key,
            last: self.tick,
            pinned: false,
        });
        self.values.push(value);
        self.policy.on_insert(key);
        assert!(self.slots.len() <= self.limit, "cache over its limit");
        evicted
    }

    /// Makes `n` more slots usable (up to the capacity).
    pub fn grow(&mut self, n: usize) {
        let limit = self.limit.saturating_add(n).min(self.capacity);
        if limit != self.limit {
            self.limit = limit;
            self.policy.on_limit(limit);
        }
    }

    /// Slots usable now.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Pins `key` if cached; pinned entries are never evicted. At most half
    /// the slots may be pinned (the rest stay for on-demand experts);
    /// returns whether `key` is now pinned.
    pub fn pin(&mut self, key: usize) -> bool {
        let pinned = self.pinned_len();
        let half = self.capacity / 2;
        match self.slots.iter_mut().find(|s| s.key == key) {
            Some(s) if s.pinned => true,
            Some(s) if pinned < half => {
                s.pinned = true;
                true
            }
            _ => false,
        }
    }

    /// Unpins `key` (it stays cached, now evictable).
    pub fn unpin(&mut self, key: usize) {
        if let Some(s) = self.slots.iter_mut().find(|s| s.key == key) {
            s.pinned = false;
        }
    }

    /// Keys of the pinned entries, in insertion order.
    pub fn pinned(&self) -> Vec<usize> {
        self.slots
            .iter()
            .filter(|s| s.pinned)
            .map(|s| s.key)
            .collect()
    }

    /// Whether `key` is cached and pinned.
    pub fn is_pinned(&self, key: usize) -> bool {
        self.slots.iter().any(|s| s.key == key && s.pinned)
    }

    fn pinned_len(&self) -> usize {
        self.slots.iter().filter(|s| s.pinned).count()
    }

    /// For each of `keys`, whether it would still be cached after inserting
    /// all of them in order with [`SlotCache::insert`] (nothing is changed
    /// or counted: a dry run on a copy of the slots and the policy). Lets a
    /// caller drop, as soon as it is used, a fetched value that would only
    /// be evicted again.
    pub fn survivors(&self, keys: &[usize], view: View) -> Vec<bool> {
        let mut shadow = self.shadow();
        for &k in keys {
            shadow.insert(k, (), view);
        }
        keys.iter().map(|&k| shadow.contains(k)).collect()
    }

    /// A copy holding no values: the same slots, clock and policy state
    /// (room for `capacity` slots reserved, as in a new cache).
    fn shadow(&self) -> SlotCache<()> {
        let mut slots = Vec::with_capacity(self.capacity);
        slots.extend_from_slice(&self.slots);
        SlotCache {
            capacity: self.capacity,
            limit: self.limit,
            slots,
            values: vec![(); self.slots.len()],
            tick: self.tick,
            policy: self.policy.clone_box(),
            counters: CacheCounters::default(),
        }
    }

    /// Whether some cached value satisfies `pred`.
    pub fn any_value(&self, pred: impl Fn(&V) -> bool) -> bool {
        self.values.iter().any(pred)
    }

    /// Whether `key` is cached (no counting).
    pub fn contains(&self, key: usize) -> bool {
        self.find(key).is_some()
    }

    /// Cached keys, in insertion order.
    pub fn keys(&self) -> Vec<usize> {
        self.slots.iter().map(|s| s.key).collect()
    }

    /// The policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// The policy deciding victims now (see [`Evictor::active`]).
    pub fn active_policy(&self) -> &'static str {
        self.policy.active()
    }

    /// Times the active policy changed (see [`Evictor::switches`]).
    pub fn policy_switches(&self) -> u64 {
        self.policy.switches()
    }

    /// Cached entries.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Slots.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::super::policy::{self, lowest, Lru, NAMES};
    use super::super::usage::Usage;
    use super::*;

    fn lru() -> Box<dyn Evictor> {
        Box::new(Lru)
    }

    /// Scores by key: lower keys are colder.
    #[derive(Clone, Copy)]
    struct ByKey;

    impl Evictor for ByKey {
        fn name(&self) -> &'static str {
            "by-key"
        }
        fn victim(&self, _: usize, slots: &[Slot], _: View) -> Option<usize> {
            lowest(slots, |s| s.key)
        }
        fn clone_box(&self) -> Box<dyn Evictor> {
            Box::new(*self)
        }
    }

    /// `survivors` predicts exactly what a real insertion sequence keeps,
    /// under every policy (stateful ones included: the dry run copies the
    /// state), with pins, repeated keys and a usage view.
    #[test]
    fn survivors_match_the_real_insertions() {
        let usage: Vec<Usage> = (0..10u64)
            .map(|k| Usage {
                count: (k * 7919) % 13,
                heat: ((k * 31) % 5) as u32,
                last_use: k % 3,
            })
            .collect();
        let view = View {
            usage: &usage,
            now: 4,
        };
        for cap in 0..6 {
            for seq in [vec![5, 6, 7, 8, 9], vec![1, 9, 9, 2], vec![3], vec![]] {
                for name in NAMES {
                    let mut c = SlotCache::new(cap, policy::build(name, 10).unwrap());
                    for (i, k) in [1, 2, 3, 5, 6, 7, 8, 9].into_iter().enumerate() {
                        c.hint_next(k, (i as u64 * 5) % 7);
                    }
                    for k in [1, 2, 3] {
                        c.insert(k, k, view);
                    }
                    c.pin(2);
                    c.get(1);
                    let predicted = c.survivors(&seq, view);
                    for &k in &seq {
                        c.insert(k, k, view);
                    }
                    let actual: Vec<bool> = seq.iter().map(|&k| c.contains(k)).collect();
                    assert_eq!(predicted, actual, "{name}: cap {cap} seq {seq:?}");
                }
            }
        }
    }

    #[test]
    fn counts_hits_per_tier_and_misses() {
        let mut c = SlotCache::new(4, lru());
        assert_eq!(c.get(1), None);
        c.insert(1, "a", View::EMPTY);
        c.insert(2, "b", View::EMPTY);
        assert!(c.pin(1));
        assert!(c.is_pinned(1) && !c.is_pinned(2) && !c.is_pinned(3));
        assert_eq!(c.get(1), Some("a"));
        assert_eq!(c.get(2), Some("b"));
        assert_eq!(
            c.counters,
            CacheCounters {
                pinned_hits: 1,
                hits: 1,
                misses: 1,
                evictions: 0
            }
        );
    }

    #[test]
    fn evicts_least_recently_used_in_order() {
        let mut c = SlotCache::new(3, lru());
        let v = View::EMPTY;
        for k in [1, 2, 3] {
            c.insert(k, k * 10, v);
        }
        c.get(1); // recency now: 2, 3, 1
        assert_eq!(c.insert(4, 40, v), Some(2));
        assert_eq!(c.insert(5, 50, v), Some(3));
        c.get(4);
        assert_eq!(c.insert(6, 60, v), Some(1));
        assert_eq!(c.insert(7, 70, v), Some(5));
        assert!(c.contains(4) && c.contains(6) && c.contains(7));
        assert_eq!((c.len(), c.counters.evictions), (3, 4));
        assert_eq!(c.keys(), [4, 6, 7]);
    }

    #[test]
    fn the_policy_picks_the_victim_and_pins_are_never_evicted() {
        let mut c = SlotCache::new(4, Box::new(ByKey));
        let v = View::EMPTY;
        for k in [5, 1, 7, 3] {
            c.insert(k, (), v);
        }
        assert!(c.pin(1));
        assert!(c.pin(3));
        assert!(!c.pin(5), "at most half the slots are pinned");
        assert_eq!(c.insert(9, (), v), Some(5));
        assert_eq!(c.insert(2, (), v), Some(7));
        assert_eq!(c.pinned(), [1, 3]);
        c.unpin(1);
        assert_eq!(c.insert(8, (), v), Some(1));
        assert_eq!(c.policy_name(), "by-key");
    }

    #[test]
    fn pins_are_capped_at_half_and_an_empty_cache_inserts_nothing() {
        let mut c = SlotCache::new(2, lru());
        c.insert(1, (), View::EMPTY);
        c.insert(2, (), View::EMPTY);
        assert!(c.pin(1));
        assert!(!c.pin(2));
        let mut z = SlotCache::new(0, lru());
        assert_eq!(z.insert(1, (), View::EMPTY), None);
        assert!(z.is_empty() && z.get(1).is_none());
    }

    #[test]
    fn a_gated_cache_uses_only_its_limit_and_grows_to_its_capacity() {
        let v = View::EMPTY;
        let mut c = SlotCache::gated(4, 1, lru());
        c.insert(1, (), v);
        assert_eq!(c.insert(2, (), v), Some(1));
        assert_eq!(c.survivors(&[3, 4], v), [false, true]);
        c.grow(2);
        assert_eq!(c.survivors(&[3, 4], v), [true, true]);
        assert_eq!(c.insert(3, (), v), None);
        assert_eq!(c.insert(4, (), v), None);
        assert_eq!(c.insert(5, (), v), Some(2));
        c.grow(100);
        assert_eq!((c.limit(), c.capacity()), (4, 4));
        let mut z: SlotCache<()> = SlotCache::new(3, lru());
        z.gate(0);
        assert_eq!(z.insert(1, (), v), None);
        assert!(z.is_empty());
    }

    #[test]
    fn reinsert_refreshes_without_evicting() {
        let mut c = SlotCache::new(2, lru());
        let v = View::EMPTY;
        c.insert(1, 1, v);
        c.insert(2, 2, v);
        assert_eq!(c.insert(1, 11, v), None);
        assert_eq!(c.insert(3, 3, v), Some(2));
        assert_eq!(c.get(1), Some(11));
    }
}
