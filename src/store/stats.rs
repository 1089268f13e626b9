//! What the store counts: hits per tier, misses, evictions, bytes read,
//! time compute waited on reads, read latency, prefetch use and waste, and
//! the fetches and reads of each layer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
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
    /// Reads the read service holds now and has not yet answered (a gauge:
    /// cancelled or unneeded reads still landing count until they do).
    pub reads_in_flight: u64,
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
    /// Times a layer's cache changed its active eviction policy (`auto`).
    pub policy_switches: u64,
    /// Early reads: a layer-major pass's reads of a layer's experts issued
    /// before its routing, while its attention runs
    /// ([`super::ExpertStore::read_early`]), and their bytes.
    pub early_issued: u64,
    pub early_issued_bytes: u64,
    /// Early reads the layer's routing then asked for.
    pub early_used: u64,
    /// Early reads no row was routed to: cancelled if not yet started,
    /// else dropped when the layer's fetch began; and their bytes.
    pub early_unneeded: u64,
    pub early_unneeded_bytes: u64,
    /// The most experts one layer's fetch held read and not yet handed
    /// out at once (demand reads in its window and the early reads it
    /// took over).
    pub read_window_peak: u64,
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
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// Prefetch counters.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct PrefetchTally {
    pub(super) issued: u64,
    pub(super) issued_bytes: u64,
    pub(super) used: u64,
    pub(super) late: u64,
    pub(super) used_bytes: u64,
}

/// What the store counts beside its caches and its read service: time
/// compute waited on reads, each read's latency, layer fetches, demand
/// reads and cache-aware routing. Counted inside a layer's fetch.
pub(crate) struct Stats {
    /// Time compute waited on reads, and the latency of each expert read,
    /// µs (from its batch's submission until its last byte landed).
    waits: Mutex<(Duration, hdrhistogram::Histogram<u64>)>,
    /// See [`StoreCounters::layer_fetches`].
    pub(crate) layer_fetches: AtomicU64,
    /// See [`StoreCounters::demand_reads`].
    pub(crate) demand_reads: AtomicU64,
    /// See [`StoreCounters::leaned_moved`].
    leaned_moved: AtomicU64,
    leaned_chosen: AtomicU64,
    prefetch: Mutex<PrefetchTally>,
    /// [`StoreCounters::early_issued`] and the early counts after it, in
    /// their order there.
    early: Mutex<[u64; 5]>,
    /// See [`StoreCounters::read_window_peak`].
    window_peak: AtomicU64,
}

impl Stats {
    pub(crate) fn new() -> Stats {
        Stats {
            waits: Mutex::new((
                Duration::ZERO,
                hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3)
                    .expect("valid histogram bounds"),
            )),
            layer_fetches: AtomicU64::new(0),
            demand_reads: AtomicU64::new(0),
            leaned_moved: AtomicU64::new(0),
            leaned_chosen: AtomicU64::new(0),
            prefetch: Mutex::new(PrefetchTally::default()),
            early: Mutex::new([0; 5]),
            window_peak: AtomicU64::new(0),
        }
    }

    /// Counts an early read issued, of `bytes`.
    pub(crate) fn early_issued(&self, bytes: u64) {
        let mut e = self.early.lock().expect("early stats lock");
        e[0] += 1;
        e[1] += bytes;
    }

    /// Counts an early read a layer then asked for.
    pub(crate) fn early_used(&self) {
        self.early.lock().expect("early stats lock")[2] += 1;
    }

    /// Counts an early read no row was routed to, of `bytes`.
    pub(crate) fn early_unneeded(&self, bytes: u64) {
        let mut e = self.early.lock().expect("early stats lock");
        e[3] += 1;
        e[4] += bytes;
    }

    /// Raises the read window's peak to `held` experts.
    pub(crate) fn window_held(&self, held: usize) {
        self.window_peak.fetch_max(held as u64, Ordering::Relaxed);
    }

    /// Counts cache-aware routing: `moved` of `chosen` experts differ from
    /// exact routing's.
    pub(crate) fn count_leaned(&self, (moved, chosen): (usize, usize)) {
        self.leaned_moved.fetch_add(moved as u64, Ordering::Relaxed);
        self.leaned_chosen
            .fetch_add(chosen as u64, Ordering::Relaxed);
    }

    /// Counts a prefetch read issued, of `bytes`.
    pub(crate) fn prefetch_issued(&self, bytes: u64) {
        let mut t = self.prefetch.lock().expect("prefetch stats lock");
        t.issued += 1;
        t.issued_bytes += bytes;
    }

    /// Counts a prefetched expert a layer asked for; `late` when it was
    /// still in flight then (promoted to demand).
    pub(crate) fn prefetch_used(&self, bytes: u64, late: bool) {
        let mut t = self.prefetch.lock().expect("prefetch stats lock");
        t.used += 1;
        t.used_bytes += bytes;
        t.late += u64::from(late);
    }

    /// The prefetch counts so far.
    pub(super) fn prefetch_tally(&self) -> PrefetchTally {
        *self.prefetch.lock().expect("prefetch stats lock")
    }

    /// Adds one layer's wait time and read latencies.
    pub(crate) fn record_reads(&self, stall: Duration, latencies: &[u64]) {
        let mut w = self.waits.lock().expect("stats lock");
        w.0 += stall;
        for &us in latencies {
            w.1.saturating_record(us.max(1));
        }
    }

    /// Mean and 99th-percentile expert read latency so far, µs (0 with no
    /// reads).
    pub(crate) fn read_latency_us(&self) -> (f64, u64) {
        let h = &self.waits.lock().expect("stats lock").1;
        if h.is_empty() {
            (0.0, 0)
        } else {
            (h.mean(), h.value_at_quantile(0.99))
        }
    }

    /// See [`super::ExpertStore::read_latency_histogram`].
    pub(crate) fn read_latency_histogram(&self, bounds_us: &[u64]) -> (Vec<u64>, u64, f64) {
        let h = &self.waits.lock().expect("stats lock").1;
        let below = bounds_us.iter().map(|&b| h.count_between(0, b)).collect();
        (below, h.len(), h.mean() * h.len() as f64)
    }

    /// Fills the counters this holds.
    pub(crate) fn fill(&self, c: &mut StoreCounters) {
        c.disk_time = self.waits.lock().expect("stats lock").0;
        c.layer_fetches = self.layer_fetches.load(Ordering::Relaxed);
        c.demand_reads = self.demand_reads.load(Ordering::Relaxed);
        c.leaned_moved = self.leaned_moved.load(Ordering::Relaxed);
        c.leaned_chosen = self.leaned_chosen.load(Ordering::Relaxed);
        let e = *self.early.lock().expect("early stats lock");
        [
            c.early_issued,
            c.early_issued_bytes,
            c.early_used,
            c.early_unneeded,
            c.early_unneeded_bytes,
        ] = e;
        c.read_window_peak = self.window_peak.load(Ordering::Relaxed);
    }
}
