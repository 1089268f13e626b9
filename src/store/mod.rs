//! The expert store: where routed experts live and how they reach compute.
//!
//! Each routed expert (gate, up, down) stays on disk until a router picks
//! it; then its bytes are read (one coalesced read when the three tensors
//! are adjacent in one shard) and kept, in their stored element type, in a
//! per-layer slot cache ([`cache`]) of bounded size. A layer's misses are
//! read together as one demand batch ([`moestream_io::ReadService`]: the io_uring reactor
//! thread, or a synchronous reader thread), each expert handed over as soon
//! as its last span lands ([`fetch`]). Router-lookahead prefetch reads a
//! later layer's predicted experts at lower priority; a prediction that
//! comes true saves a demand read, a wrong one is cancelled if it has not
//! started. Counters record hits, misses, bytes read, time compute waited
//! on reads, prefetch use and waste, and prediction recall; [`usage`]
//! records every router selection for tiering.
//!
//! The rooms: this file holds the store, its construction and a layer's
//! fetch (`begin`, the cache insertions it replays); `layout` where an
//! expert lives and how its slabs become an expert; `buffers` the warmed
//! read buffers and the cache gate; `prefetch` lookahead reads and recall;
//! `pins` usage and pinning; `stats` the counters; `tracing` the hooks of
//! `--trace` ([`crate::formats::trace`]); [`cache`] one layer's slots; [`fetch`] a layer's reads in flight; [`moestream_io::ReadService`] the read service;
//! [`budget`] the RAM plan; [`policy`] the eviction and pinning rules.

pub mod budget;
mod buffers;
pub mod cache;
pub mod fetch;
mod layout;
mod learned;
mod pins;
pub mod policy;
pub mod predictor;
mod prefetch;
mod stats;
mod tracing;
pub mod usage;

pub use layout::ExpertLocation;
pub(crate) use layout::SpanRead;
use prefetch::{LayerRecall, PrefetchTally};
pub use prefetch::{Lookahead, Variant};
pub use stats::StoreCounters;

use crate::error::{Error, Result};
use crate::formats::tensor::Mat;
use crate::formats::trace::Tier;
use crate::formats::weights::WeightIndex;
use crate::layers::mlp::Mlp;
use cache::SlotCache;
use fetch::{Pending, PrefetchRead};
use moestream_io::ReactorConfig;
use policy::{EvictPolicy, View};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use usage::UsageTable;

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
    reads: Box<dyn moestream_io::ReadService>,
    /// Per layer, its prefetch reads not yet consumed.
    prefetched: Vec<Mutex<Vec<PrefetchRead>>>,
    /// Prefetch reads issued and not yet consumed or dropped, all layers.
    prefetch_live: AtomicUsize,
    prefetch: Mutex<PrefetchTally>,
    /// Predictions waiting to be scored, and recall so far, per layer.
    recall: Mutex<Vec<LayerRecall>>,
    /// How often a guess at each rank was right, per variant (all layers).
    ranks: Mutex<prefetch::RankTally>,
    /// The learned lookahead predictor, if prefetch uses one, and its
    /// per-layer state.
    predictor: Option<Arc<predictor::Predictor>>,
    learned: Mutex<Vec<learned::LearnedLayer>>,
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
    /// Cache-aware routing: selections moved off exact routing, and all
    /// selections it made (see [`StoreCounters::leaned_moved`]).
    leaned_moved: std::sync::atomic::AtomicU64,
    leaned_chosen: std::sync::atomic::AtomicU64,
    pub(crate) demand_reads: std::sync::atomic::AtomicU64,
    /// The routing trace being recorded (`--trace`), if any.
    trace: Option<Mutex<crate::formats::trace::record::Recorder>>,
}

/// How the MoE layers use the store.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Schedule {
    /// Compute hits while misses are read, then each miss as it lands;
    /// otherwise wait for every read, then compute.
    pub pipeline: bool,
    /// Router-lookahead prefetch, if on.
    pub lookahead: Option<Lookahead>,
    /// Prefetch reads alive at once (see
    /// [`ScheduleOptions::prefetch_experts`]), 0 exactly when nothing
    /// prefetches.
    pub prefetch_experts_max: usize,
    /// Score the next layer's guess from both states (`attn` and
    /// `output`) at every single-token layer, prefetching or not: two
    /// router products per layer that decode does not otherwise need
    /// (f32 routers: ~1 GB per token on GLM-5). Without it only the
    /// variant prefetch uses is scored.
    pub recall: bool,
    /// Opt-in cache-aware routing (lossy): λ ≥ 0 multiplies the selection
    /// score of every expert a layer's cache holds by 1 + λ (the weights
    /// stay the experts' own). `None`: exact routing, transformers' tokens.
    pub cache_lean: Option<f32>,
}

impl Default for Schedule {
    fn default() -> Self {
        ScheduleOptions::default().schedule(0, false)
    }
}

/// The schedule a run asks for: [`Schedule`] before the model is known.
/// Loading resolves it against the model's top-k ([`Self::schedule`]);
/// every field is read there.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScheduleOptions {
    /// See [`Schedule::pipeline`].
    pub pipeline: bool,
    /// See [`Schedule::lookahead`].
    pub lookahead: Option<Lookahead>,
    /// Prefetch reads alive at once while prefetching; `None` gives
    /// `(depth + 1) × top_k` for the lookahead (a layer issues the next
    /// `depth` layers' reads while its own prefetched reads are still
    /// alive) and `top_k` for a learned predictor alone.
    pub prefetch_experts: Option<usize>,
    /// See [`Schedule::recall`]; a learned predictor scores the guesses
    /// whatever this says (they are among its inputs).
    pub recall: bool,
    /// See [`Schedule::cache_lean`].
    pub cache_lean: Option<f32>,
}

impl Default for ScheduleOptions {
    fn default() -> Self {
        ScheduleOptions {
            pipeline: true,
            lookahead: None,
            prefetch_experts: None,
            recall: false,
            cache_lean: None,
        }
    }
}

impl ScheduleOptions {
    /// Prefetch reads alive at once for a model routing `top_k` experts
    /// per token, with or without a learned `predictor`: 0 without
    /// prefetch.
    pub fn prefetch_experts_max(&self, top_k: usize, predictor: bool) -> usize {
        match (self.lookahead, predictor) {
            (Some(a), _) => self
                .prefetch_experts
                .unwrap_or(a.depth.max(1).saturating_add(1).saturating_mul(top_k)),
            (None, true) => self.prefetch_experts.unwrap_or(top_k),
            (None, false) => 0,
        }
    }

    /// The store's schedule for a model routing `top_k` experts per token.
    pub fn schedule(&self, top_k: usize, predictor: bool) -> Schedule {
        Schedule {
            pipeline: self.pipeline,
            lookahead: self.lookahead,
            prefetch_experts_max: self.prefetch_experts_max(top_k, predictor),
            recall: self.recall || predictor,
            cache_lean: self.cache_lean,
        }
    }
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
pub const HEAT_DECAY_TOKENS: u64 = 256;

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
        let expert_disk = locations.iter().flatten().next().map_or(0, |loc| {
            loc.parts.iter().map(|r| r.entry.len).sum::<usize>()
        });
        let config = ReactorConfig {
            depth: REACTOR_DEPTH,
            inflight_bytes_max: reactor_inflight_bytes(expert_disk),
            ..ReactorConfig::default()
        };
        let sources = index.shards.iter().map(|s| s.reader.clone()).collect();
        let (reads, read_path) =
            moestream_io::read_service(sources, use_reactor, config, moestream_io::shared_pool())
                .map_err(|e| {
                Error::Io(moestream_io::IoError::Ring {
                    op: "spawn the expert reader thread",
                    source: e,
                })
            })?;
        let caches = locations
            .iter()
            .map(|l| Mutex::new(SlotCache::new(capacity.min(l.len()), policy.build(l.len()))))
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
            ranks: Mutex::new(Default::default()),
            predictor: None,
            learned: Mutex::new(vec![Default::default(); layers]),
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
            leaned_moved: Default::default(),
            leaned_chosen: Default::default(),
            demand_reads: Default::default(),
            trace: None,
        })
    }

    /// Number of experts in `layer` (0 for dense layers).
    pub fn experts_in(&self, layer: usize) -> usize {
        self.locations[layer].len()
    }

    /// Per expert of `layer`, whether its cache holds it (nothing counted),
    /// into `out`.
    pub(crate) fn cached_mask(&self, layer: usize, out: &mut Vec<bool>) {
        let cache = self.caches[layer].lock().expect("cache lock");
        out.clear();
        out.extend((0..self.locations[layer].len()).map(|e| cache.contains(e)));
    }

    /// Counts one token's cache-aware routing: `moved` of its `chosen`
    /// experts differ from exact routing's.
    pub(crate) fn count_leaned(&self, moved: usize, chosen: usize) {
        self.leaned_moved.fetch_add(moved as u64, Ordering::Relaxed);
        self.leaned_chosen
            .fetch_add(chosen as u64, Ordering::Relaxed);
    }

    /// Those of `experts` the layer's cache does not hold (nothing counted).
    pub(crate) fn uncached(&self, layer: usize, experts: &[usize]) -> Vec<usize> {
        let cache = self.caches[layer].lock().expect("cache lock");
        experts
            .iter()
            .copied()
            .filter(|&e| !cache.contains(e))
            .collect()
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
        self.begin_by_rows(layer, ids, &[], cached)
    }

    /// [`ExpertStore::begin`] reading the misses in order of `rows` (the
    /// rows each of `ids` is applied to), most first, so that the experts
    /// with the most work land first and compute while the rest stream in
    /// (ties, and an empty `rows`, in id order). The cache's insertions
    /// stay in id order, so what it holds afterwards does not depend on
    /// `rows`.
    pub fn begin_by_rows(
        &self,
        layer: usize,
        ids: &[usize],
        rows: &[usize],
        cached: &mut Vec<Option<Arc<Mlp>>>,
    ) -> Result<Pending<'_>> {
        assert!(
            rows.is_empty() || rows.len() == ids.len(),
            "one row count per expert"
        );
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "a layer fetches a sorted union of distinct experts"
        );
        self.layer_fetches.fetch_add(1, Ordering::Relaxed);
        self.lookup_into(layer, ids, cached);
        self.trace_hits(layer, ids, cached);
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
                self.trace_miss(layer, e, Tier::Miss, 0);
                to_read.push(e);
                continue;
            };
            let p = prefetched.swap_remove(at);
            if let Some(m) = p.ready {
                self.prefetch_used(p.read.bytes[0], false);
                self.trace_miss(layer, e, Tier::Prefetched, p.read.bytes[0]);
                ready.push((e, m));
            } else if p.read.outstanding() && !p.read.is_lost(0) {
                self.reads.promote(p.read.batch.id);
                self.trace_miss(layer, e, Tier::Prefetched, 0);
                awaited.push(p);
            } else {
                self.trace_miss(layer, e, Tier::Miss, 0);
                to_read.push(e);
            }
        }
        // Wrong guesses: drop their reads that have not started.
        for p in prefetched {
            if p.read.outstanding() {
                self.reads.cancel(p.read.batch.id);
            }
        }
        if !rows.is_empty() {
            // Stable: ties keep id order.
            to_read.sort_by_key(|e| std::cmp::Reverse(rows[ids.partition_point(|i| i < e)]));
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

    /// For each of `misses` (in insertion order), whether it would stay in
    /// the layer's cache after they are all inserted.
    fn survivors(&self, layer: usize, misses: &[usize]) -> Vec<bool> {
        if misses.is_empty() {
            return Vec::new();
        }
        let usage = self.usage.lock().expect("usage lock");
        let view = View {
            usage: usage.layer(layer),
            now: usage.clock(),
        };
        let cache = self.caches[layer].lock().expect("cache lock");
        cache.survivors(misses, view)
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
        let view = View {
            usage: usage.layer(layer),
            now: usage.clock(),
        };
        let mut cache = self.caches[layer].lock().expect("cache lock");
        for (e, mlp) in fetched {
            if let Some(mlp) = mlp {
                cache.insert(e, mlp, view);
            }
        }
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
            let policy = self.policy.build(locs.len());
            *cache = Mutex::new(SlotCache::new(slots.min(locs.len()), policy));
        }
    }

    /// Number of layers with routed experts.
    pub fn moe_layers(&self) -> usize {
        self.locations.iter().filter(|l| !l.is_empty()).count()
    }

    /// Cache slots of `layer`.
    pub fn slots(&self, layer: usize) -> usize {
        self.caches[layer].lock().expect("cache lock").capacity()
    }

    /// How misses are read, and why that path (e.g. "a reader thread
    /// (io_uring is unavailable here)").
    pub fn read_path(&self) -> &'static str {
        self.read_path
    }

    /// Whether misses are read through the io_uring reactor.
    pub fn uses_reactor(&self) -> bool {
        self.read_path == moestream_io::REACTOR_PATH
    }
}
