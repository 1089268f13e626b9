//! A bounded least-recently-used map from expert id to value: the per-layer
//! RAM cache of routed experts. Capacity is a hard limit; every lookup is
//! counted as a hit or a miss, every displacement as an eviction.

/// LRU cache with at most `capacity` entries (capacity 0 caches nothing).
pub struct Lru<V> {
    capacity: usize,
    /// (key, value, last-use tick); unordered, scanned on eviction (capacity
    /// is a per-layer expert count, at most a few hundred).
    entries: Vec<(usize, V, u64)>,
    tick: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
}

impl<V: Clone> Lru<V> {
    /// An empty cache holding at most `capacity` values.
    pub fn new(capacity: usize) -> Lru<V> {
        Lru {
            capacity,
            entries: Vec::with_capacity(capacity),
            tick: 0,
            hits: 0,
            misses: 0,
            evictions: 0,
        }
    }

    /// Looks `key` up, counting a hit (and refreshing its recency) or a miss.
    pub fn get(&mut self, key: usize) -> Option<V> {
        self.tick += 1;
        match self.entries.iter_mut().find(|e| e.0 == key) {
            Some(e) => {
                e.2 = self.tick;
                self.hits += 1;
                Some(e.1.clone())
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// Inserts `key`, evicting the least recently used entry when full.
    /// Returns the evicted key, if any.
    pub fn insert(&mut self, key: usize, value: V) -> Option<usize> {
        if self.capacity == 0 {
            return None;
        }
        self.tick += 1;
        if let Some(e) = self.entries.iter_mut().find(|e| e.0 == key) {
            e.1 = value;
            e.2 = self.tick;
            return None;
        }
        let mut evicted = None;
        if self.entries.len() == self.capacity {
            let (i, _) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.2)
                .expect("capacity > 0 and full implies non-empty");
            evicted = Some(self.entries.swap_remove(i).0);
            self.evictions += 1;
        }
        self.entries.push((key, value, self.tick));
        debug_assert!(self.entries.len() <= self.capacity);
        evicted
    }

    /// Number of cached entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `key` is cached (does not count or refresh).
    pub fn contains(&self, key: usize) -> bool {
        self.entries.iter().any(|e| e.0 == key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_hits_and_misses() {
        let mut c = Lru::new(2);
        assert_eq!(c.get(1), None);
        c.insert(1, "a");
        assert_eq!(c.get(1), Some("a"));
        assert_eq!((c.hits, c.misses), (1, 1));
    }

    #[test]
    fn evicts_least_recently_used_in_order() {
        let mut c = Lru::new(3);
        for k in [1, 2, 3] {
            c.insert(k, k * 10);
        }
        c.get(1); // order of recency now: 2, 3, 1
        assert_eq!(c.insert(4, 40), Some(2));
        assert_eq!(c.insert(5, 50), Some(3));
        c.get(4);
        assert_eq!(c.insert(6, 60), Some(1));
        assert_eq!(c.insert(7, 70), Some(5));
        assert!(c.contains(4) && c.contains(6) && c.contains(7));
        assert_eq!((c.len(), c.evictions), (3, 4));
    }

    #[test]
    fn capacity_zero_never_caches() {
        let mut c = Lru::new(0);
        assert_eq!(c.insert(1, 1), None);
        assert_eq!(c.get(1), None);
        assert!(c.is_empty());
    }

    #[test]
    fn reinsert_refreshes_without_evicting() {
        let mut c = Lru::new(2);
        c.insert(1, 1);
        c.insert(2, 2);
        assert_eq!(c.insert(1, 11), None);
        assert_eq!(c.insert(3, 3), Some(2));
        assert_eq!(c.get(1), Some(11));
    }
}
