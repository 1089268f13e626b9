//! What the store counts: hits per tier, misses, evictions, bytes read,
//! time compute waited on reads, read latency, prefetch use and waste, and
//! the fetches and reads of each layer.

use super::ExpertStore;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Counters of the store (summed over layers).
#[derive(Clone, Copy, Debug, Default)]
pub struct StoreCounters {
    /// Lookups served by pinned (hot-tier) experts.
    pub pinned_hits: u64,
    /// Lookups served by unpinned cached (warm-tier) experts.
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    /// Bytes the read path completed (demand and prefetch).
    pub bytes_read: u64,
    /// Time compute was blocked waiting for expert reads.
    pub disk_time: Duration,
    /// Time the read path had reads in flight.
    pub disk_busy: Duration,
    /// Prefetch reads issued, and their bytes.
    pub prefetch_issued: u64,
    pub prefetch_issued_bytes: u64,
    /// Prefetched experts a layer then asked for (a miss it did not wait
    /// on, or waited on less), and how many of them were still in flight.
    pub prefetch_used: u64,
    pub prefetch_late: u64,
    /// Bytes prefetch read (or is reading) for experts no layer asked for.
    pub prefetch_wasted_bytes: u64,
    /// Layer fetches begun: one per MoE layer per forward, whatever the
    /// number of rows or sequences in it (each fetches its rows' union).
    pub layer_fetches: u64,
    /// Experts submitted as demand reads.
    pub demand_reads: u64,
    /// Cache-aware routing: chosen experts exact routing would not have
    /// chosen, and all experts it chose (both 0 when it is off).
    pub leaned_moved: u64,
    pub leaned_chosen: u64,
}

impl StoreCounters {
    /// Lookups of any kind.
    pub fn lookups(&self) -> u64 {
        self.pinned_hits + self.hits + self.misses
    }

    /// (pinned + warm hits) / lookups, or 0 with no lookups.
    pub fn hit_rate(&self) -> f64 {
        ratio(self.pinned_hits + self.hits, self.lookups())
    }

    /// Pinned hits / lookups.
    pub fn pinned_hit_rate(&self) -> f64 {
        ratio(self.pinned_hits, self.lookups())
    }

    /// Warm (unpinned cached) hits / lookups.
    pub fn warm_hit_rate(&self) -> f64 {
        ratio(self.hits, self.lookups())
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

impl ExpertStore {
    /// Adds one layer's wait time and read latencies.
    pub(crate) fn record_reads(&self, stall: Duration, latencies: &[u64]) {
        *self.stall.lock().expect("stall lock") += stall;
        let mut h = self.latency.lock().expect("latency lock");
        for &us in latencies {
            h.saturating_record(us.max(1));
        }
    }

    /// Mean and 99th-percentile expert read latency so far, µs (0 with no
    /// reads).
    pub fn read_latency_us(&self) -> (f64, u64) {
        let h = self.latency.lock().expect("latency lock");
        if h.is_empty() {
            (0.0, 0)
        } else {
            (h.mean(), h.value_at_quantile(0.99))
        }
    }

    /// The expert read latencies so far as a cumulative histogram: per
    /// bound (µs), the reads that took at most it; then the count of reads
    /// and their summed latency (µs).
    pub fn read_latency_histogram(&self, bounds_us: &[u64]) -> (Vec<u64>, u64, f64) {
        let h = self.latency.lock().expect("latency lock");
        let below = bounds_us.iter().map(|&b| h.count_between(0, b)).collect();
        (below, h.len(), h.mean() * h.len() as f64)
    }

    /// Counters summed over layers.
    pub fn counters(&self) -> StoreCounters {
        let mut c = StoreCounters::default();
        for cache in &self.caches {
            let l = cache.lock().expect("cache lock").counters;
            c.pinned_hits += l.pinned_hits;
            c.hits += l.hits;
            c.misses += l.misses;
            c.evictions += l.evictions;
        }
        let r = self.reads.counters();
        c.bytes_read = r.demand_bytes + r.prefetch_bytes;
        c.disk_busy = r.busy;
        c.disk_time = *self.stall.lock().expect("stall lock");
        let t = *self.prefetch.lock().expect("prefetch lock");
        c.prefetch_issued = t.issued;
        c.prefetch_issued_bytes = t.issued_bytes;
        c.prefetch_used = t.used;
        c.prefetch_late = t.late;
        c.layer_fetches = self.layer_fetches.load(Ordering::Relaxed);
        c.demand_reads = self.demand_reads.load(Ordering::Relaxed);
        c.leaned_moved = self.leaned_moved.load(Ordering::Relaxed);
        c.leaned_chosen = self.leaned_chosen.load(Ordering::Relaxed);
        // Issued and never asked for, less what was cancelled unread (a
        // wrong guess still in flight counts: it will be read).
        c.prefetch_wasted_bytes = t
            .issued_bytes
            .saturating_sub(t.used_bytes + r.cancelled_bytes);
        c
    }
}
