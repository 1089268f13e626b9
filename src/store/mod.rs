//! The expert store: where routed experts live and how they reach compute.
//!
//! Each routed expert (gate, up, down) stays on disk until a router picks
//! it; then its bytes are read (one coalesced read when the three tensors
//! are adjacent in one shard) and kept, in their stored element type, in a
//! per-layer slot cache ([`cache`]) of bounded size. A layer's misses are
//! read together as one demand batch ([`reads`]: the io_uring reactor
//! thread, or a synchronous reader thread), each expert handed over as soon
//! as its last span lands ([`fetch`]). Router-lookahead prefetch reads a
//! later layer's predicted experts at lower priority; a prediction that
//! comes true saves a demand read, a wrong one is cancelled if it has not
//! started. Counters record hits, misses, bytes read, time compute waited
//! on reads, prefetch use and waste, and prediction recall; [`usage`]
//! records every router selection for tiering.

pub mod budget;
pub mod cache;
pub mod fetch;
pub mod policy;
pub(crate) mod reads;
pub mod usage;

use crate::error::{Error, Result};
use crate::model::mlp::Mlp;
use crate::tensor::Mat;
use crate::weights::index::Resolved;
use crate::weights::{TensorEntry, WeightIndex};
use cache::SlotCache;
use fetch::{Inflight, Pending, PrefetchRead};
use moestream_io::{
    coalesce, ByteRange, CoalesceLimits, Priority, Reactor, ReactorConfig, ReactorService,
    ReadMode, Slab,
};
use policy::EvictPolicy;
use reads::{Reads, SyncReader};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use usage::{Usage, UsageTable};

/// How an expert's tensors merge into reads: any gap up to 64 KiB is read
/// through rather than split; one read never exceeds 1 GiB.
const COALESCE: CoalesceLimits = CoalesceLimits {
    merged_bytes_max: 1 << 30,
    gap_bytes_max: 64 << 10,
};

/// The three tensors of one routed expert on disk.
#[derive(Clone, Debug)]
pub struct ExpertLocation {
    /// gate, up, down, each with its storage and companion (scales).
    pub parts: [Resolved; 3],
}

impl ExpertLocation {
    /// The byte ranges to read: part `2i` is tensor `i`'s data, `2i + 1`
    /// its companion (absent for float tensors).
    fn ranges(&self) -> Vec<(usize, &TensorEntry)> {
        let mut out = Vec::with_capacity(6);
        for (i, r) in self.parts.iter().enumerate() {
            out.push((2 * i, &r.entry));
            if let Some(c) = r.companion() {
                out.push((2 * i + 1, c));
            }
        }
        out
    }
}

/// One coalesced read of an expert: a span of one shard, and the expert
/// ranges (see [`ExpertLocation::ranges`]) it holds as byte windows into it.
pub(crate) struct SpanRead {
    shard: usize,
    offset: u64,
    len: usize,
    parts: Vec<(usize, Range<usize>)>,
}

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

/// Routed experts of every MoE layer, streamed from disk into slot caches.
pub struct ExpertStore {
    index: Arc<WeightIndex>,
    /// `[layer][expert]`; empty for dense layers.
    locations: Vec<Vec<ExpertLocation>>,
    caches: Vec<Mutex<SlotCache<Arc<Mlp>>>>,
    policy: EvictPolicy,
    /// Experts routed per token (for the pinning confidence).
    top_k: usize,
    hidden: usize,
    inter: usize,
    /// Time compute waited on reads.
    stall: Mutex<Duration>,
    /// Latency of each expert read, µs: from its batch's submission until
    /// its last byte landed.
    latency: Mutex<hdrhistogram::Histogram<u64>>,
    usage: Mutex<UsageTable>,
    /// The read path: io_uring when it works and every shard reader has a
    /// descriptor (not mmap; not drop, whose fadvise is per read), else a
    /// synchronous reader thread.
    reads: Reads,
    /// Per layer, its prefetch reads not yet consumed.
    prefetched: Vec<Mutex<Vec<PrefetchRead>>>,
    /// Prefetch reads issued and not yet consumed or dropped, all layers.
    prefetch_live: AtomicUsize,
    prefetch: Mutex<PrefetchTally>,
    /// Predictions waiting to be scored, and recall so far, per layer.
    recall: Mutex<Vec<LayerRecall>>,
    /// How layers use the store (pipelining, lookahead).
    pub schedule: Schedule,
    /// Stands in, during a cache replay, for an expert that is evicted
    /// again before the replay ends (never computed with).
    placeholder: Arc<Mlp>,
    /// The caches grow only into read buffers already faulted in (see
    /// [`ExpertStore::warm_buffers`]).
    gated: std::sync::atomic::AtomicBool,
    /// How misses are read, and why: said at load, not only in `--json`.
    read_path: &'static str,
    /// See [`StoreCounters::layer_fetches`] and
    /// [`StoreCounters::demand_reads`].
    layer_fetches: std::sync::atomic::AtomicU64,
    pub(crate) demand_reads: std::sync::atomic::AtomicU64,
}

/// How the MoE layers use the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Compute hits while misses are read, then each miss as it lands;
    /// otherwise wait for every read, then compute.
    pub pipeline: bool,
    /// Router-lookahead prefetch, if on.
    pub lookahead: Option<Lookahead>,
    /// Prefetch reads alive at once: resolved at load (`LoadOptions::
    /// prefetch_experts`, by default lookahead depth × top-k), and 0
    /// exactly when no lookahead prefetches.
    pub prefetch_experts_max: usize,
    /// Score the next layer's guess from both states (`attn` and
    /// `output`) at every single-token layer, prefetching or not: two
    /// router products per layer that decode does not otherwise need
    /// (f32 routers: ~1 GB per token on GLM-5). Without it only the
    /// variant prefetch uses is scored.
    pub recall: bool,
}

impl Default for Schedule {
    fn default() -> Self {
        Schedule {
            pipeline: true,
            lookahead: None,
            prefetch_experts_max: 0,
            recall: false,
        }
    }
}

/// Router-lookahead: which state predicts the next layers' experts, and
/// how many MoE layers ahead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lookahead {
    pub from: Variant,
    pub depth: usize,
}

/// The state a lookahead prediction applies layer L+1's router to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// Layer L's residual after its attention (issued before L's experts
    /// run: the most lead time).
    Attn = 0,
    /// Layer L's output (issued before L+1's attention: the better guess).
    Output = 1,
}

impl Variant {
    pub const ALL: [Variant; 2] = [Variant::Attn, Variant::Output];

    pub fn name(self) -> &'static str {
        match self {
            Variant::Attn => "attn",
            Variant::Output => "output",
        }
    }
}

/// Prefetch counters.
#[derive(Clone, Copy, Debug, Default)]
struct PrefetchTally {
    issued: u64,
    issued_bytes: u64,
    used: u64,
    late: u64,
    used_bytes: u64,
}

/// One layer's lookahead predictions (per variant) and their scores.
#[derive(Clone, Debug, Default)]
struct LayerRecall {
    /// The guess per variant, and whether it awaits scoring (the vectors
    /// are reused, so predicting allocates nothing once grown).
    predicted: [(bool, Vec<usize>); 2],
    /// (experts predicted and chosen, experts chosen) per variant.
    score: [(u64, u64); 2],
}

/// Reads in flight at once through the reactor (a bound; the byte bound
/// below is usually the tighter one).
const REACTOR_DEPTH: u32 = 32;

/// Bytes the kernel reads at once: two experts, at least 16 MiB. This
/// disk gains little from depth, and reads sharing it finish together:
/// with GLM-5's 19 MB experts, 8 reads at once made the first expert land
/// only when all had (decode 0.21 s/token), two at a time lets compute start
/// on the first while the rest are read (0.20 s/token, same bytes).
fn reactor_inflight_bytes(expert_disk: usize) -> usize {
    (2 * expert_disk).max(16 << 20)
}

/// Heats halve every this many forwarded tokens.
const HEAT_DECAY_TOKENS: u64 = 256;

impl ExpertStore {
    /// A store over `locations` with `capacity` cached experts per layer.
    /// Every location must already be shape-checked against (hidden, inter).
    /// With `use_reactor`, misses go through io_uring when it is available.
    pub fn new(
        index: Arc<WeightIndex>,
        locations: Vec<Vec<ExpertLocation>>,
        capacity: usize,
        (hidden, inter): (usize, usize),
        use_reactor: bool,
        (policy, top_k): (EvictPolicy, usize),
    ) -> Result<ExpertStore> {
        let batchable = index
            .shards
            .iter()
            .all(|s| s.reader.open_file().is_some() && s.reader.effective_mode() != ReadMode::Drop);
        let expert_disk = locations.iter().flatten().next().map_or(0, |loc| {
            loc.parts.iter().map(|r| r.entry.len).sum::<usize>()
        });
        let config = ReactorConfig {
            depth: REACTOR_DEPTH,
            inflight_bytes_max: reactor_inflight_bytes(expert_disk),
            ..ReactorConfig::default()
        };
        let (service, read_path) = if !use_reactor {
            (None, "a reader thread (asked for)")
        } else if !batchable {
            (
                None,
                "a reader thread (this read mode has no descriptor io_uring can read, or drops pages per read)",
            )
        } else if Reactor::probe().is_err() {
            (None, "a reader thread (io_uring is unavailable here)")
        } else {
            match Reactor::new(config, moestream_io::shared_pool()).and_then(ReactorService::spawn)
            {
                Ok(s) => (Some(s), "the io_uring reactor"),
                Err(_) => (
                    None,
                    "a reader thread (the io_uring reactor failed to start)",
                ),
            }
        };
        let reads = match service {
            Some(service) => Reads::Reactor {
                service,
                files: index
                    .shards
                    .iter()
                    .map(|s| s.reader.open_file().expect("checked batchable"))
                    .collect(),
            },
            None => Reads::Sync(SyncReader::spawn(index.clone()).map_err(|e| {
                Error::Io(moestream_io::IoError::Ring {
                    op: "spawn the expert reader thread",
                    source: e,
                })
            })?),
        };
        let caches = locations
            .iter()
            .map(|l| Mutex::new(SlotCache::new(capacity.min(l.len()))))
            .collect();
        let counts: Vec<usize> = locations.iter().map(Vec::len).collect();
        let usage_table = Mutex::new(UsageTable::new(&counts, HEAT_DECAY_TOKENS));
        let layers = locations.len();
        Ok(ExpertStore {
            index,
            locations,
            caches,
            policy,
            top_k,
            hidden,
            inter,
            stall: Mutex::new(Duration::ZERO),
            latency: Mutex::new(
                hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3)
                    .expect("valid histogram bounds"),
            ),
            usage: usage_table,
            reads,
            prefetched: (0..layers).map(|_| Mutex::new(Vec::new())).collect(),
            prefetch_live: AtomicUsize::new(0),
            prefetch: Mutex::new(PrefetchTally::default()),
            recall: Mutex::new(vec![LayerRecall::default(); layers]),
            schedule: Schedule::default(),
            placeholder: Arc::new(Mlp {
                gate: Mat::f32(0, 0, Vec::new()),
                up: Mat::f32(0, 0, Vec::new()),
                down: Mat::f32(0, 0, Vec::new()),
                hidden: 0,
                inter: 0,
            }),
            gated: std::sync::atomic::AtomicBool::new(false),
            read_path,
            layer_fetches: Default::default(),
            demand_reads: Default::default(),
        })
    }

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
    }

    /// Usage counters of one expert.
    pub fn usage(&self, layer: usize, expert: usize) -> Usage {
        self.usage.lock().expect("usage lock").get(layer, expert)
    }

    /// Number of experts in `layer` (0 for dense layers).
    pub fn experts_in(&self, layer: usize) -> usize {
        self.locations[layer].len()
    }

    /// Looks `experts` up in the layer's cache into `out` (cleared first),
    /// counting each as a hit or a miss; `None` for a miss.
    pub fn lookup_into(&self, layer: usize, experts: &[usize], out: &mut Vec<Option<Arc<Mlp>>>) {
        out.clear();
        let mut cache = self.caches[layer].lock().expect("cache lock");
        out.extend(experts.iter().map(|&e| cache.get(e)));
    }

    /// Starts a layer's fetch of the union `ids` (sorted, unique): looks
    /// them up (counting hits and misses), takes what prefetch already
    /// delivered, promotes prefetch reads of wanted experts still in
    /// flight, cancels the layer's other prefetch reads, and submits the
    /// remaining misses as one demand batch. Fills `cached` with the cached
    /// experts (`None` for a miss) and returns the fetch, from which every
    /// miss arrives.
    pub fn begin(
        &self,
        layer: usize,
        ids: &[usize],
        cached: &mut Vec<Option<Arc<Mlp>>>,
    ) -> Result<Pending<'_>> {
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "a layer fetches a sorted union of distinct experts"
        );
        self.layer_fetches.fetch_add(1, Ordering::Relaxed);
        self.lookup_into(layer, ids, cached);
        let mut prefetched =
            std::mem::take(&mut *self.prefetched[layer].lock().expect("prefetch lock"));
        self.prefetch_live
            .fetch_sub(prefetched.len(), Ordering::Relaxed);
        // Land whatever already arrived.
        for p in prefetched.iter_mut() {
            for arrival in p.read.poll() {
                if let fetch::Arrival::Ready(_, slabs) = arrival {
                    // A prefetch that fails to decode is simply not used; a
                    // demand read of it reports the error.
                    p.ready = self
                        .assemble(layer, p.expert, &p.read.plans[0], slabs)
                        .ok()
                        .map(Arc::new);
                }
            }
        }
        let mut ready = Vec::new();
        let mut awaited = Vec::new();
        let mut to_read = Vec::new();
        let mut misses = Vec::new();
        for (&e, c) in ids.iter().zip(cached.iter()) {
            if c.is_some() {
                continue;
            }
            misses.push(e);
            let Some(at) = prefetched.iter().position(|p| p.expert == e) else {
                to_read.push(e);
                continue;
            };
            let p = prefetched.swap_remove(at);
            if let Some(m) = p.ready {
                self.prefetch_used(p.read.bytes[0], false);
                ready.push((e, m));
            } else if p.read.outstanding() && !p.read.is_lost(0) {
                self.reads.promote(p.read.batch.id);
                awaited.push(p);
            } else {
                to_read.push(e);
            }
        }
        // Wrong guesses: drop their reads that have not started.
        for p in prefetched {
            if p.read.outstanding() {
                self.reads.cancel(p.read.batch.id);
            }
        }
        self.grow_into_spare_buffers(layer, misses.len());
        let survives = self.survivors(layer, &misses);
        let misses = misses.into_iter().zip(survives).collect();
        let window = self.top_k.max(1);
        Ok(Pending::new(
            self,
            layer,
            (ready, awaited),
            misses,
            to_read,
            window,
        ))
    }

    /// A gated cache (see [`ExpertStore::warm_buffers`]) grows by at most
    /// `misses` slots, and only into idle pooled buffers beyond the plan's
    /// in-flight and prefetch items (2 x top-k, plus the prefetch reads):
    /// this layer's reads then take buffers already faulted in, and the
    /// experts they evict give theirs back.
    fn grow_into_spare_buffers(&self, layer: usize, misses: usize) {
        if misses == 0 || !self.gated.load(Ordering::Relaxed) {
            return;
        }
        let idle = moestream_io::shared_pool().idle_class_buffers();
        let reserve = 2 * self.top_k + self.schedule.prefetch_experts_max;
        let spare = idle.saturating_sub(reserve);
        self.caches[layer]
            .lock()
            .expect("cache lock")
            .grow(spare.min(misses));
    }

    /// Counts a prefetched expert a layer asked for; `late` when it was
    /// still in flight then (promoted to demand).
    pub(crate) fn prefetch_used(&self, bytes: u64, late: bool) {
        let mut t = self.prefetch.lock().expect("prefetch lock");
        t.used += 1;
        t.used_bytes += bytes;
        t.late += u64::from(late);
    }

    /// Starts low-priority reads of `experts` of `layer` (a lookahead
    /// prediction), skipping those cached or already on their way, within
    /// the prefetch budget. The reads land outside the cache; nothing is
    /// evicted until the layer asks for them.
    pub fn prefetch(&self, layer: usize, experts: &[usize]) {
        let max = self.schedule.prefetch_experts_max;
        if max == 0 || self.locations[layer].is_empty() {
            return;
        }
        let wanted: Vec<usize> = {
            let cache = self.caches[layer].lock().expect("cache lock");
            experts
                .iter()
                .copied()
                .filter(|&e| !cache.contains(e))
                .collect()
        };
        let mut pf = self.prefetched[layer].lock().expect("prefetch lock");
        for e in wanted {
            if pf.iter().any(|p| p.expert == e) {
                continue;
            }
            if self.prefetch_live.load(Ordering::Relaxed) >= max {
                break;
            }
            let read = Inflight::submit(self, layer, vec![e], Priority::Prefetch);
            {
                let mut t = self.prefetch.lock().expect("prefetch lock");
                t.issued += 1;
                t.issued_bytes += read.bytes[0];
            }
            self.prefetch_live.fetch_add(1, Ordering::Relaxed);
            pf.push(PrefetchRead {
                expert: e,
                read,
                ready: None,
            });
        }
    }

    /// Records a lookahead prediction of `layer`'s experts (scored when the
    /// layer routes its next single token).
    pub fn predict(&self, layer: usize, variant: Variant, experts: &[usize]) {
        let mut recall = self.recall.lock().expect("recall lock");
        let (pending, guess) = &mut recall[layer].predicted[variant as usize];
        guess.clear();
        guess.extend_from_slice(experts);
        *pending = true;
    }

    /// Scores the pending predictions of `layer` against the experts it
    /// chose.
    pub fn score_predictions(&self, layer: usize, chosen: &[usize]) {
        let mut recall = self.recall.lock().expect("recall lock");
        let r = &mut recall[layer];
        for v in Variant::ALL {
            let (pending, guess) = &mut r.predicted[v as usize];
            if std::mem::take(pending) {
                let hit = chosen.iter().filter(|e| guess.contains(e)).count();
                r.score[v as usize].0 += hit as u64;
                r.score[v as usize].1 += chosen.len() as u64;
            }
        }
    }

    /// Lookahead recall per layer and variant: the share of chosen experts
    /// the prediction had (`None` for a layer never predicted).
    pub fn recall(&self) -> Vec<[Option<f64>; 2]> {
        let recall = self.recall.lock().expect("recall lock");
        recall
            .iter()
            .map(|r| {
                r.score
                    .map(|(hit, all)| (all > 0).then(|| hit as f64 / all as f64))
            })
            .collect()
    }

    /// Recall summed over layers, per variant: (predicted and chosen, chosen).
    pub fn recall_totals(&self) -> [(u64, u64); 2] {
        let recall = self.recall.lock().expect("recall lock");
        let mut t = [(0, 0); 2];
        for r in recall.iter() {
            for (t, s) in t.iter_mut().zip(&r.score) {
                t.0 += s.0;
                t.1 += s.1;
            }
        }
        t
    }

    /// Adds one layer's wait time and read latencies.
    pub(crate) fn record_reads(&self, stall: Duration, latencies: &[u64]) {
        *self.stall.lock().expect("stall lock") += stall;
        let mut h = self.latency.lock().expect("latency lock");
        for &us in latencies {
            h.saturating_record(us.max(1));
        }
    }

    /// The coalesced reads of one expert: per shard, its tensors (and
    /// scales) merged into as few spans as the limits allow (one, for the
    /// container's contiguous layout).
    pub(crate) fn plan(&self, layer: usize, expert: usize) -> Vec<SpanRead> {
        let mut ranges = self.locations[layer][expert].ranges();
        ranges.sort_by_key(|(_, e)| (e.shard, e.offset));
        let mut spans = Vec::new();
        for same_shard in ranges.chunk_by(|a, b| a.1.shard == b.1.shard) {
            let byte_ranges: Vec<ByteRange> = same_shard
                .iter()
                .map(|(_, e)| ByteRange {
                    offset: e.offset,
                    len: e.len as u64,
                })
                .collect();
            for merged in coalesce(&byte_ranges, COALESCE) {
                spans.push(SpanRead {
                    shard: same_shard[0].1.shard,
                    offset: merged.offset,
                    len: merged.len as usize,
                    parts: merged
                        .parts
                        .iter()
                        .map(|&p| (same_shard[p].0, merged.window(byte_ranges[p])))
                        .collect(),
                });
            }
        }
        spans
    }

    /// Decodes the expert from `slabs` (one per span of `spans`). Packed
    /// tensors stay in their slab (zero copy); others are decoded out.
    pub(crate) fn assemble(
        &self,
        layer: usize,
        expert: usize,
        spans: &[SpanRead],
        slabs: Vec<Slab>,
    ) -> Result<Mlp> {
        let loc = &self.locations[layer][expert];
        let slabs: Vec<Arc<Slab>> = slabs.into_iter().map(Arc::new).collect();
        let mut parts: [Option<(&Arc<Slab>, Range<usize>)>; 6] = Default::default();
        for (sp, slab) in spans.iter().zip(&slabs) {
            for (part, window) in &sp.parts {
                parts[*part] = Some((slab, window.clone()));
            }
        }
        let mut mats = Vec::with_capacity(3);
        for (i, r) in loc.parts.iter().enumerate() {
            let data = parts[2 * i].clone().expect("the spans cover every part");
            mats.push(
                self.index
                    .decode_mat_in(r, data, parts[2 * i + 1].clone())?,
            );
        }
        let [gate, up, down]: [Mat; 3] = match mats.try_into() {
            Ok(m) => m,
            Err(_) => unreachable!("an expert has exactly three parts"),
        };
        Ok(Mlp {
            gate,
            up,
            down,
            hidden: self.hidden,
            inter: self.inter,
        })
    }

    /// For each of `misses` (in insertion order), whether it would stay in
    /// the layer's cache after they are all inserted.
    fn survivors(&self, layer: usize, misses: &[usize]) -> Vec<bool> {
        if misses.is_empty() {
            return Vec::new();
        }
        let usage = self.usage.lock().expect("usage lock");
        let now = usage.clock();
        let cache = self.caches[layer].lock().expect("cache lock");
        match self.policy {
            EvictPolicy::Lru => cache.survivors(misses, |_, last| last),
            EvictPolicy::Lfru => {
                cache.survivors(misses, |k, _| policy::lfru_score(usage.get(layer, k), now))
            }
        }
    }

    /// Asserts the replay left no placeholder in the layer's cache.
    pub(crate) fn check_no_placeholder(&self, layer: usize) {
        let cache = self.caches[layer].lock().expect("cache lock");
        assert!(
            !cache.any_value(|m| Arc::ptr_eq(m, &self.placeholder)),
            "a placeholder expert survived the cache replay of layer {layer}"
        );
    }

    /// Inserts fetched experts into the layer's cache, evicting by policy.
    pub(crate) fn insert(
        &self,
        layer: usize,
        fetched: impl Iterator<Item = (usize, Option<Arc<Mlp>>)>,
    ) {
        let usage = self.usage.lock().expect("usage lock");
        let now = usage.clock();
        let mut cache = self.caches[layer].lock().expect("cache lock");
        for (e, mlp) in fetched {
            if let Some(mlp) = mlp {
                match self.policy {
                    EvictPolicy::Lru => cache.insert(e, mlp, |_, last| last),
                    EvictPolicy::Lfru => {
                        cache.insert(e, mlp, |k, _| policy::lfru_score(usage.get(layer, k), now))
                    }
                };
            }
        }
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
        let missing: Vec<usize> = {
            let cache = self.caches[layer].lock().expect("cache lock");
            experts
                .iter()
                .copied()
                .filter(|&e| !cache.contains(e))
                .collect()
        };
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

    /// The shard index the experts are read through.
    pub fn index(&self) -> &WeightIndex {
        &self.index
    }

    /// Resizes every MoE layer's cache to `slots` (emptying it: called at
    /// load, before anything is cached).
    pub fn set_slots(&mut self, slots: usize) {
        for (cache, locs) in self.caches.iter_mut().zip(&self.locations) {
            // More slots than the layer has experts would never fill.
            *cache = Mutex::new(SlotCache::new(slots.min(locs.len())));
        }
    }

    /// Starts faulting in, on idle CPU, the read buffers the cache will
    /// hold once full, and gates the caches: each grows only into idle
    /// buffers warming has provided (they start empty, at limit 0, and
    /// reach their slots as fast as memory can be faulted in off the read
    /// path). Called at load, before anything is cached. Buffers to warm: slots x MoE layers, plus the plan's in-flight item
    /// (2 x top-k: reads landing while the experts they evict are in use)
    /// and the prefetch reads, in one size that fits any of
    /// this model's expert reads. Only for zero-copy experts, whose read
    /// buffers the cache keeps; a float expert is decoded out and its
    /// buffer recycled at once. Without this, every miss until the cache
    /// fills reads into fresh pages and pays their faults inside the read
    /// (the larger the cache, the more such misses: 75 slots decoded slower
    /// than 22 on the Qwen3-30B shapes).
    pub fn warm_buffers(&self) {
        let Some(layer) = self.locations.iter().position(|l| !l.is_empty()) else {
            return;
        };
        let spans = self.plan(layer, 0);
        if !self.zero_copy() || spans.len() != 1 {
            return;
        }
        // A direct read covers the 4096-aligned superset of its span.
        let class = moestream_io::align_up(spans[0].len) + moestream_io::ALIGN;
        let slots: usize = (0..self.locations.len()).map(|l| self.slots(l)).sum();
        let held = slots
            .saturating_add(2 * self.top_k)
            .saturating_add(self.schedule.prefetch_experts_max);
        moestream_io::shared_pool().warm(class, held);
        // From now on a cache grows only into buffers warming provided.
        for cache in &self.caches {
            let mut c = cache.lock().expect("cache lock");
            *c = SlotCache::gated(c.capacity(), 0);
        }
        self.gated.store(true, Ordering::Relaxed);
    }

    /// Number of layers with routed experts.
    pub fn moe_layers(&self) -> usize {
        self.locations.iter().filter(|l| !l.is_empty()).count()
    }

    /// Cache slots of `layer`.
    pub fn slots(&self, layer: usize) -> usize {
        self.caches[layer].lock().expect("cache lock").capacity()
    }

    /// Bytes one expert of `layer` takes in RAM and on disk (its read spans).
    pub fn expert_bytes(&self) -> Option<(u64, u64)> {
        let layer = self.locations.iter().position(|l| !l.is_empty())?;
        let loc = self.locations[layer].first()?;
        let kept: u64 = loc.parts.iter().map(|r| self.index.kept_bytes(r)).sum();
        let disk: u64 = self.plan(layer, 0).iter().map(|s| s.len as u64).sum();
        // A zero-copy expert keeps its whole read buffer (4096-rounded).
        let ram = if self.zero_copy() {
            kept.max(moestream_io::align_up(disk as usize) as u64)
        } else {
            kept
        };
        Some((ram, disk))
    }

    /// Whether experts are packed, so decoded in place in their slabs.
    pub fn zero_copy(&self) -> bool {
        self.locations.iter().flatten().next().is_some_and(|loc| {
            loc.parts
                .iter()
                .all(|r| matches!(r.stored, crate::weights::index::Stored::Quant { .. }))
        })
    }

    /// Reads one expert, bypassing the cache.
    pub fn read(&self, layer: usize, expert: usize) -> Result<Mlp> {
        let spans = self.plan(layer, expert);
        let slabs = spans
            .iter()
            .map(|sp| self.index.shards[sp.shard].reader.read(sp.offset, sp.len))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        self.assemble(layer, expert, &spans, slabs)
    }

    /// How misses are read, and why that path (e.g. "a reader thread
    /// (io_uring is unavailable here)").
    pub fn read_path(&self) -> &'static str {
        self.read_path
    }

    /// Whether misses are read through the io_uring reactor.
    pub fn uses_reactor(&self) -> bool {
        self.reads.is_reactor()
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
        // Issued and never asked for, less what was cancelled unread (a
        // wrong guess still in flight counts: it will be read).
        c.prefetch_wasted_bytes = t
            .issued_bytes
            .saturating_sub(t.used_bytes + r.cancelled_bytes);
        c
    }
}
