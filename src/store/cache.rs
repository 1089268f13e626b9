//! One layer's expert cache: a fixed number of slots, some of them pinned
//! (the hot tier, never evicted), the rest filled on demand (the warm tier)
//! and evicted by a caller-given score (see [`super::policy`]): the lowest
//! scoring unpinned entry goes. Lookups are counted per tier.
//!
//! Slots are few (tens to a few hundred), so a flat vector with linear
//! scans beats any map here and keeps the order of entries deterministic.
//!
//! Of its `capacity` slots, only `limit` are usable now: the store raises
//! the limit as memory for more experts becomes available without page
//! faults (see `ExpertStore::begin`), so the cache grows no faster than its
//! buffers can be faulted in off the read path. A cache that is not gated
//! has `limit == capacity` from the start.

/// A cached value with its bookkeeping.
struct Entry<V> {
    key: usize,
    value: V,
    /// The cache's clock at the last lookup or insertion (LRU order).
    last: u64,
    pinned: bool,
}

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
    /// Slots usable now, `entries.len() <= limit <= capacity`; only grows.
    limit: usize,
    entries: Vec<Entry<V>>,
    tick: u64,
    pub counters: CacheCounters,
}

impl<V: Clone> SlotCache<V> {
    /// An empty cache of `capacity` slots, all usable.
    pub fn new(capacity: usize) -> SlotCache<V> {
        Self::gated(capacity, capacity)
    }

    /// An empty cache of `capacity` slots of which `limit` are usable
    /// until [`SlotCache::grow`] raises it.
    pub fn gated(capacity: usize, limit: usize) -> SlotCache<V> {
        SlotCache {
            capacity,
            limit: limit.min(capacity),
            entries: Vec::with_capacity(capacity),
            tick: 0,
            counters: CacheCounters::default(),
        }
    }

    /// The value under `key`, counting a hit (pinned or not) or a miss.
    pub fn get(&mut self, key: usize) -> Option<V> {
        self.tick += 1;
        match self.entries.iter_mut().find(|e| e.key == key) {
            Some(e) => {
                e.last = self.tick;
                if e.pinned {
                    self.counters.pinned_hits += 1;
                } else {
                    self.counters.hits += 1;
                }
                Some(e.value.clone())
            }
            None => {
                self.counters.misses += 1;
                None
            }
        }
    }

    /// Inserts (or refreshes) `key`. When full, evicts the unpinned entry
    /// with the lowest `score(key, last)` (ties: the earliest inserted) and
    /// returns its key; when every slot is pinned nothing is inserted.
    pub fn insert(
        &mut self,
        key: usize,
        value: V,
        score: impl Fn(usize, u64) -> u64,
    ) -> Option<usize> {
        self.tick += 1;
        if let Some(e) = self.entries.iter_mut().find(|e| e.key == key) {
            e.value = value;
            e.last = self.tick;
            return None;
        }
        if self.limit == 0 {
            return None;
        }
        let mut evicted = None;
        if self.entries.len() == self.limit {
            let victim = self
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| !e.pinned)
                .min_by_key(|(_, e)| score(e.key, e.last))
                .map(|(i, _)| i);
            let i = victim?;
            evicted = Some(self.entries.remove(i).key);
            self.counters.evictions += 1;
        }
        self.entries.push(Entry {
            key,
            value,
            last: self.tick,
            pinned: false,
        });
        assert!(self.entries.len() <= self.limit, "cache over its limit");
        evicted
    }

    /// Makes `n` more slots usable (up to the capacity).
    pub fn grow(&mut self, n: usize) {
        self.limit = self.limit.saturating_add(n).min(self.capacity);
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
        match self.entries.iter_mut().find(|e| e.key == key) {
            Some(e) if e.pinned => true,
            Some(e) if pinned < self.capacity / 2 => {
                e.pinned = true;
                true
            }
            _ => false,
        }
    }

    /// Unpins `key` (it stays cached, now evictable).
    pub fn unpin(&mut self, key: usize) {
        if let Some(e) = self.entries.iter_mut().find(|e| e.key == key) {
            e.pinned = false;
        }
    }

    /// Keys of the pinned entries, in insertion order.
    pub fn pinned(&self) -> Vec<usize> {
        self.entries
            .iter()
            .filter(|e| e.pinned)
            .map(|e| e.key)
            .collect()
    }

    fn pinned_len(&self) -> usize {
        self.entries.iter().filter(|e| e.pinned).count()
    }

    /// For each of `keys`, whether it would still be cached after inserting
    /// all of them in order with [`SlotCache::insert`] and `score` (nothing
    /// is changed or counted). Lets a caller drop, as soon as it is used,
    /// a fetched value that would only be evicted again.
    pub fn survivors(&self, keys: &[usize], score: impl Fn(usize, u64) -> u64) -> Vec<bool> {
        let mut shadow: SlotCache<()> = SlotCache {
            capacity: self.capacity,
            limit: self.limit,
            entries: self
                .entries
                .iter()
                .map(|e| Entry {
                    key: e.key,
                    value: (),
                    last: e.last,
                    pinned: e.pinned,
                })
                .collect(),
            tick: self.tick,
            counters: CacheCounters::default(),
        };
        for &k in keys {
            shadow.insert(k, (), &score);
        }
        keys.iter().map(|&k| shadow.contains(k)).collect()
    }

    /// Whether some cached value satisfies `pred`.
    pub fn any_value(&self, pred: impl Fn(&V) -> bool) -> bool {
        self.entries.iter().any(|e| pred(&e.value))
    }

    /// Whether `key` is cached (no counting).
    pub fn contains(&self, key: usize) -> bool {
        self.entries.iter().any(|e| e.key == key)
    }

    /// Cached entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Slots.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// LRU: the score is the last-use clock.
    fn lru(_: usize, last: u64) -> u64 {
        last
    }

    /// `survivors` predicts exactly what a real insertion sequence keeps,
    /// under LRU and a frequency score, with pins and repeated keys.
    #[test]
    fn survivors_match_the_real_insertions() {
        let heat = |k: usize, last: u64| ((k as u64 * 7919) % 13) << 8 | last;
        for cap in 0..6 {
            for seq in [vec![5, 6, 7, 8, 9], vec![1, 9, 9, 2], vec![3], vec![]] {
                for score in [lru as fn(usize, u64) -> u64, heat] {
                    let mut c = SlotCache::new(cap);
                    for k in [1, 2, 3] {
                        c.insert(k, k, score);
                    }
                    c.pin(2);
                    c.get(1);
                    let predicted = c.survivors(&seq, score);
                    for &k in &seq {
                        c.insert(k, k, score);
                    }
                    let actual: Vec<bool> = seq.iter().map(|&k| c.contains(k)).collect();
                    assert_eq!(predicted, actual, "cap {cap} seq {seq:?}");
                }
            }
        }
    }

    #[test]
    fn counts_hits_per_tier_and_misses() {
        let mut c = SlotCache::new(4);
        assert_eq!(c.get(1), None);
        c.insert(1, "a", lru);
        c.insert(2, "b", lru);
        assert!(c.pin(1));
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
        let mut c = SlotCache::new(3);
        for k in [1, 2, 3] {
            c.insert(k, k * 10, lru);
        }
        c.get(1); // recency now: 2, 3, 1
        assert_eq!(c.insert(4, 40, lru), Some(2));
        assert_eq!(c.insert(5, 50, lru), Some(3));
        c.get(4);
        assert_eq!(c.insert(6, 60, lru), Some(1));
        assert_eq!(c.insert(7, 70, lru), Some(5));
        assert!(c.contains(4) && c.contains(6) && c.contains(7));
        assert_eq!((c.len(), c.counters.evictions), (3, 4));
    }

    #[test]
    fn the_score_picks_the_victim_and_pins_are_never_evicted() {
        // Score by key: lower keys are colder.
        let by_key = |k: usize, _| k as u64;
        let mut c = SlotCache::new(4);
        for k in [5, 1, 7, 3] {
            c.insert(k, (), by_key);
        }
        assert!(c.pin(1));
        assert!(c.pin(3));
        assert!(!c.pin(5), "at most half the slots are pinned");
        assert_eq!(c.insert(9, (), by_key), Some(5));
        assert_eq!(c.insert(2, (), by_key), Some(7));
        assert_eq!(c.pinned(), [1, 3]);
        c.unpin(1);
        assert_eq!(c.insert(8, (), by_key), Some(1));
    }

    #[test]
    fn pins_are_capped_at_half_and_an_empty_cache_inserts_nothing() {
        let mut c = SlotCache::new(2);
        c.insert(1, (), lru);
        c.insert(2, (), lru);
        assert!(c.pin(1));
        assert!(!c.pin(2));
        let mut z = SlotCache::new(0);
        assert_eq!(z.insert(1, (), lru), None);
        assert!(z.is_empty() && z.get(1).is_none());
    }

    #[test]
    fn a_gated_cache_uses_only_its_limit_and_grows_to_its_capacity() {
        let mut c = SlotCache::gated(4, 1);
        c.insert(1, (), lru);
        assert_eq!(c.insert(2, (), lru), Some(1));
        assert_eq!(c.survivors(&[3, 4], lru), [false, true]);
        c.grow(2);
        assert_eq!(c.survivors(&[3, 4], lru), [true, true]);
        assert_eq!(c.insert(3, (), lru), None);
        assert_eq!(c.insert(4, (), lru), None);
        assert_eq!(c.insert(5, (), lru), Some(2));
        c.grow(100);
        assert_eq!((c.limit(), c.capacity()), (4, 4));
        let mut z: SlotCache<()> = SlotCache::gated(3, 0);
        assert_eq!(z.insert(1, (), lru), None);
        assert!(z.is_empty());
    }

    #[test]
    fn reinsert_refreshes_without_evicting() {
        let mut c = SlotCache::new(2);
        c.insert(1, 1, lru);
        c.insert(2, 2, lru);
        assert_eq!(c.insert(1, 11, lru), None);
        assert_eq!(c.insert(3, 3, lru), Some(2));
        assert_eq!(c.get(1), Some(11));
    }
}
