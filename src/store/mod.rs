//! The expert store: where routed experts live and how they reach compute.
//!
//! Each routed expert (gate, up, down) stays on disk until a router picks
//! it; then its bytes are read (one coalesced read when the three tensors
//! are adjacent in one shard) and kept, in their stored element type, in a
//! per-layer slot cache of bounded size. A MoE layer hands the store its
//! routing decision ([`Routes`]) in one call, [`ExpertStore::fetch`]: the
//! store tells its observers (the usage each layer's eviction policy and
//! pinning consult, the `--trace` recorder, the lookahead's recall and the
//! learned predictor, which may start prefetch reads of the next layer),
//! looks the union up, takes what prefetch delivered, and submits the
//! misses as one demand batch ([`moestream_io::ReadService`]: the io_uring
//! reactor thread, or a synchronous reader thread). The [`Pending`] fetch
//! it returns hands each expert over as its last span lands, then replays
//! the cache insertions in id order. Router-lookahead prefetch reads a
//! later layer's predicted experts at lower priority; a prediction that
//! comes true saves a demand read, a wrong one is cancelled if it has not
//! started.
//!
//! The types, each with its lock beside its data: [`layout`]'s `Experts`
//! (where every expert lives, how slabs become an expert; fixed at load),
//! [`layer`]'s `LayerCache` (one layer's slots and usage under one lock),
//! [`prefetch`]'s `Prefetcher` (lookahead reads in flight) and `Recall`,
//! [`learned`]'s `Learned`, [`tracing`]'s `Trace`, [`stats`]'s `Stats`
//! (waits, latencies, fetch counts). [`fetch`] is a layer's reads in
//! flight; `pins` the pinning of hot experts; `buffers` the warmed read
//! buffers and the cache gate; [`budget`] the RAM plan; [`policy`] the
//! eviction and pinning rules; [`usage`] the usage history on disk.

pub mod budget;
mod buffers;
pub mod cache;
pub mod fetch;
mod layer;
mod layout;
mod learned;
mod pins;
pub mod policy;
pub mod predictor;
mod prefetch;
mod routes;
mod stats;
mod tracing;
pub mod usage;

pub use layout::ExpertLocation;
pub(crate) use layout::SpanRead;
pub use prefetch::{Lookahead, Variant};
pub use routes::Routes;
pub use stats::StoreCounters;

use crate::error::{Error, Result};
use crate::formats::trace::record::LayerShape;
use crate::formats::trace::{self, Tier};
use crate::formats::weights::WeightIndex;
use crate::layers::mlp::Mlp;
use fetch::{Arrival, Parts, Pending};
use layer::{Clock, LayerCache};
use layout::Experts;
use learned::Learned;
use moestream_io::{ReactorConfig, ReadService};
use policy::EvictPolicy;
use prefetch::{Prefetcher, Recall, RANKS_MAX};
use stats::Stats;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tracing::Trace;
use usage::UsageTable;

/// The order a layer's misses are read in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadOrder {
    /// Most rows first, so the experts with the most work land first.
    MostRowsFirst,
    /// Id order, as a layer applying its experts in id order takes them.
    Ids,
}

/// Routed experts of every MoE layer, streamed from disk into slot caches.
pub struct ExpertStore {
    experts: Experts,
    /// Per layer (dense layers have none of its experts).
    layers: Vec<LayerCache>,
    /// The usage clock every layer's usage is stamped with.
    clock: Clock,
    /// The usage history as loaded (what a save adds this run to).
    history: Mutex<UsageTable>,
    policy: EvictPolicy,
    /// Experts routed per token (for the pinning confidence).
    top_k: usize,
    /// The read path: io_uring when it works and every shard reader has a
    /// descriptor (not mmap; not drop, whose fadvise is per read), else a
    /// synchronous reader thread.
    reads: Box<dyn ReadService>,
    /// How misses are read, and why: said at load, not only in `--json`.
    read_path: &'static str,
    prefetcher: Prefetcher,
    /// Early reads in flight (see [`ExpertStore::read_early`]).
    early: Prefetcher,
    recall: Recall,
    learned: Learned,
    trace: Trace,
    stats: Stats,
    /// How layers use the store (pipelining, lookahead).
    pub schedule: Schedule,
    /// The caches grow only into read buffers already faulted in (see
    /// [`ExpertStore::warm_buffers`]).
    gated: AtomicBool,
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
    /// Which experts a layer-major pass reads while a layer's attention
    /// runs, before its routing ([`ExpertStore::read_early`]); `None`: its
    /// reads start after the routing. Only with `pipeline`.
    pub early: Option<EarlyReads>,
}

/// The experts a layer-major pass reads early, while a layer's attention
/// and router run: over hundreds of rows nearly every expert of a layer
/// is needed. Either way the reads go in id (file) order, the order the
/// pass applies its experts in, within [`ExpertStore::early_allowance`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EarlyReads {
    /// The layer's first experts in file order.
    Files,
    /// The experts the layer's router picks for a sample of the rows'
    /// input to the layer (the previous layer's output), in file order.
    Guess,
}

impl EarlyReads {
    pub fn name(self) -> &'static str {
        match self {
            EarlyReads::Files => "files",
            EarlyReads::Guess => "guess",
        }
    }
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
            early: Some(EarlyReads::Files),
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
        shape: (usize, usize),
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
        let layers = locations
            .iter()
            .map(|l| LayerCache::new(capacity, l.len(), policy.build(l.len())))
            .collect();
        let counts: Vec<usize> = locations.iter().map(Vec::len).collect();
        let n = locations.len();
        Ok(ExpertStore {
            experts: Experts::new(index, locations, shape),
            layers,
            clock: Clock::new(0),
            history: Mutex::new(UsageTable::new(&counts, HEAT_DECAY_TOKENS)),
            policy,
            top_k,
            reads,
            read_path,
            prefetcher: Prefetcher::new(n),
            early: Prefetcher::new(n),
            recall: Recall::new(n),
            learned: Learned::new(n),
            trace: Trace::default(),
            stats: Stats::new(),
            schedule: Schedule::default(),
            gated: AtomicBool::new(false),
        })
    }

    /// Begins `layer`'s fetch of the experts `routes` chose (sealed): tells
    /// the observers (cache-aware routing's counts, each row's usage, the
    /// trace, and for a single row the lookahead's recall and the learned
    /// predictor, which may prefetch the next layer), then looks the union
    /// up, counting hits and misses, and reads the misses in order of the
    /// rows each is applied to, most first, so the experts with the most
    /// work land first (ties in id order). Fills `cached` with the cached
    /// experts of [`Routes::ids`] (`None` for a miss) and returns the
    /// fetch, from which every miss arrives.
    pub fn fetch(
        &self,
        layer: usize,
        routes: &Routes,
        cached: &mut Vec<Option<Arc<Mlp>>>,
    ) -> Result<Pending<'_>> {
        self.observe(layer, routes);
        let order = ReadOrder::MostRowsFirst;
        self.begin(layer, routes.ids(), routes.rows_per_id(), cached, order)
    }

    /// [`ExpertStore::fetch`] reading the misses in id order (file order),
    /// for a layer that applies its experts in id order and takes each
    /// miss by [`Pending::take`]: the next expert it needs was always
    /// asked for first, so the read window never fills with experts it
    /// cannot use yet.
    pub fn fetch_in_order(
        &self,
        layer: usize,
        routes: &Routes,
        cached: &mut Vec<Option<Arc<Mlp>>>,
    ) -> Result<Pending<'_>> {
        self.observe(layer, routes);
        let order = ReadOrder::Ids;
        self.begin(layer, routes.ids(), routes.rows_per_id(), cached, order)
    }

    /// Runs the observers of a routing decision (see [`ExpertStore::fetch`]).
    fn observe(&self, layer: usize, routes: &Routes) {
        let leaned = routes.leaned();
        if leaned.1 > 0 {
            self.stats.count_leaned(leaned);
        }
        {
            let mut state = self.layers[layer].lock();
            for t in 0..routes.len() {
                state.record(routes.row(t).experts, &self.clock);
            }
        }
        if self.trace.on() {
            for t in 0..routes.len() {
                let r = routes.row(t);
                self.trace.route(layer, r.experts, r.weights, r.margin);
            }
        }
        if routes.len() == 1 {
            let chosen = routes.row(0).experts;
            self.recall.score(layer, chosen);
            self.learned
                .step(layer, chosen, &self.recall, |next, guess| {
                    self.prefetch(next, guess)
                });
        }
    }

    /// What a fetch of `layer` borrows.
    fn parts(&self, layer: usize) -> Parts<'_> {
        Parts {
            experts: &self.experts,
            cache: &self.layers[layer],
            clock: &self.clock,
            reads: self.reads.as_ref(),
            stats: &self.stats,
            trace: &self.trace,
        }
    }

    /// Starts a layer's fetch of the union `ids` (sorted, unique), `rows`
    /// the rows each is applied to: looks them up, takes what prefetch
    /// already delivered, promotes prefetch reads of wanted experts still
    /// in flight, cancels the layer's other prefetch reads, and submits the
    /// remaining misses as one demand batch. The cache's insertions stay in
    /// id order, so what it holds afterwards does not depend on `rows`.
    fn begin(
        &self,
        layer: usize,
        ids: &[usize],
        rows: &[usize],
        cached: &mut Vec<Option<Arc<Mlp>>>,
        order: ReadOrder,
    ) -> Result<Pending<'_>> {
        assert_eq!(rows.len(), ids.len(), "one row count per expert");
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "a layer fetches a sorted union of distinct experts"
        );
        self.stats.layer_fetches.fetch_add(1, Ordering::Relaxed);
        {
            let mut state = self.layers[layer].lock();
            state.lookup_into(ids, cached, &self.clock);
            self.trace.hits(layer, ids, cached, &state.slots);
        }
        let mut prefetched = self.prefetcher.take(layer);
        prefetched.extend(self.early.take(layer));
        self.land(layer, &mut prefetched);
        let mut early = Vec::new();
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
                self.trace.miss(layer, e, Tier::Miss, 0);
                to_read.push(e);
                continue;
            };
            let p = prefetched.swap_remove(at);
            if p.early && (p.ready.is_some() || p.read.outstanding() && !p.read.is_lost(0)) {
                self.stats.early_used();
                early.push(e);
            }
            if let Some(m) = p.ready {
                if !p.early {
                    self.stats.prefetch_used(p.read.bytes[0], false);
                }
                self.trace.miss(layer, e, Tier::Prefetched, p.read.bytes[0]);
                ready.push((e, m));
            } else if p.read.outstanding() && !p.read.is_lost(0) {
                self.reads.promote(p.read.batch.id);
                self.trace.miss(layer, e, Tier::Prefetched, 0);
                awaited.push(p);
            } else {
                if p.early {
                    self.stats.early_unneeded(p.read.bytes[0]);
                }
                self.trace.miss(layer, e, Tier::Miss, 0);
                to_read.push(e);
            }
        }
        // Wrong guesses: drop their reads that have not started.
        for p in prefetched {
            if p.early {
                self.stats.early_unneeded(p.read.bytes[0]);
            }
            if p.read.outstanding() {
                self.reads.cancel(p.read.batch.id);
            }
        }
        if order == ReadOrder::MostRowsFirst {
            // Stable: ties keep id order.
            to_read.sort_by_key(|e| std::cmp::Reverse(rows[ids.partition_point(|i| i < e)]));
        }
        self.grow_into_spare_buffers(layer, misses.len());
        let survives = self.layers[layer].lock().survivors(&misses, &self.clock);
        let misses = misses.into_iter().zip(survives).collect();
        // Early reads taken over count in the window: one place stays
        // free for demand reads (within `early_allowance`'s bound).
        let window = self.top_k.max(1).max(early.len() + 1);
        Ok(Pending::new(
            self.parts(layer),
            layer,
            (ready, awaited, early),
            misses,
            to_read,
            window,
        ))
    }

    /// Lands whatever of `prefetched` (reads of `layer`) already arrived.
    fn land(&self, layer: usize, prefetched: &mut [fetch::PrefetchRead]) {
        for p in prefetched.iter_mut() {
            for arrival in p.read.poll() {
                if let Arrival::Ready(_, slabs) = arrival {
                    // A prefetch that fails to decode is simply not used; a
                    // demand read of it reports the error.
                    p.ready = self
                        .experts
                        .assemble(layer, p.expert, &p.read.plans[0], slabs)
                        .ok()
                        .map(Arc::new);
                }
            }
        }
    }

    /// Per expert of `layer`, whether its cache holds it (nothing counted),
    /// into `out`: what cache-aware routing leans toward.
    pub fn cached_mask(&self, layer: usize, out: &mut Vec<bool>) {
        self.layers[layer].lock().cached_mask(out);
    }

    /// Advances the usage clock by `tokens` forwarded tokens (heats decay
    /// every [`HEAT_DECAY_TOKENS`]).
    pub fn tick(&self, tokens: u64) {
        let before = self.clock.fetch_add(tokens, Ordering::Relaxed);
        let passes = usage::decay_passes(before, tokens, HEAT_DECAY_TOKENS);
        if passes > 0 {
            for layer in &self.layers {
                usage::decay(&mut layer.lock().usage, passes);
            }
        }
        self.trace.end_step(tokens);
    }

    /// Reads ahead the guesses of `experts` (a lookahead's guess of
    /// `layer` from `variant`, best first) at the ranks whose guesses have
    /// been right often enough; see [`Self::prefetch`].
    pub fn prefetch_ranked(&self, layer: usize, variant: Variant, experts: &[usize]) {
        // On the stack: no allocation per guess.
        let mut keep = [0usize; RANKS_MAX];
        let kept = self.recall.confident_ranks(variant, experts, &mut keep);
        self.prefetch(layer, &keep[..kept]);
    }

    /// Starts low-priority reads of `experts` of `layer` (a lookahead
    /// prediction), skipping those cached or already on their way, within
    /// the prefetch budget. The reads land outside the cache; nothing is
    /// evicted until the layer asks for them.
    pub fn prefetch(&self, layer: usize, experts: &[usize]) {
        let max = self.schedule.prefetch_experts_max;
        if max == 0 || self.experts.locations[layer].is_empty() {
            return;
        }
        let wanted = self.layers[layer].lock().uncached(experts);
        self.prefetcher.issue(
            layer,
            wanted,
            (max, false),
            (&self.experts, self.reads.as_ref(), &self.stats),
        );
    }

    /// Experts a layer's early reads may hold at once: one less than the
    /// plan's budget for reads (its `in-flight experts` item, top-k, idle
    /// while the layer's attention runs, and the prefetch item's experts);
    /// 0 unless the schedule reads early. A fetch counts the early reads
    /// it takes over in its read window and keeps one place free for the
    /// demand read it needs next (an early read later in id order waits
    /// for its turn), so no more than [`Self::read_budget`] experts are
    /// ever held read and not yet applied.
    pub fn early_allowance(&self) -> usize {
        if self.schedule.early.is_none() || !self.schedule.pipeline {
            return 0;
        }
        self.read_budget().saturating_sub(1)
    }

    /// Experts the plan lets reads hold at once: the `in-flight experts`
    /// item (top-k) and the prefetch item.
    pub fn read_budget(&self) -> usize {
        self.top_k.max(1) + self.schedule.prefetch_experts_max
    }

    /// Starts early reads of `layer`'s experts (`candidates`, in the order
    /// to read them: a layer-major pass's guess of what its routing will
    /// pick, given before the layer's attention), skipping those cached or
    /// already on their way, at most [`Self::early_allowance`] live. The
    /// layer's next fetch takes over those it needs and cancels or drops
    /// the rest ([`StoreCounters::early_unneeded`]). Returns how many
    /// reads it started.
    pub fn read_early(&self, layer: usize, candidates: impl IntoIterator<Item = usize>) -> usize {
        let max = self.early_allowance();
        if max == 0 || self.experts.locations[layer].is_empty() {
            return 0;
        }
        let wanted: Vec<usize> = {
            let state = self.layers[layer].lock();
            candidates
                .into_iter()
                .filter(|&e| !state.slots.contains(e))
                .take(max)
                .collect()
        };
        self.early.issue(
            layer,
            wanted,
            (max, true),
            (&self.experts, self.reads.as_ref(), &self.stats),
        )
    }

    /// Records a lookahead prediction of `layer`'s experts (scored when the
    /// layer routes its next single token).
    pub fn predict(&self, layer: usize, variant: Variant, experts: &[usize]) {
        self.recall.predict(layer, variant, experts);
        self.trace.guess(layer, variant as usize, experts);
    }

    /// Records in the trace (when one is recorded) a lookahead guess of
    /// `layer`'s experts made two decoder layers before it, what a lookahead
    /// of depth 2 reads ahead (not scored).
    pub fn trace_deeper_guess(&self, layer: usize, variant: Variant, experts: &[usize]) {
        self.trace.guess(layer, 2 + variant as usize, experts);
    }

    /// Uses `predictor` from now on (`None`: none). Refused when a layer it
    /// guesses, or the layer before, is not an MoE layer of this many
    /// experts.
    pub fn set_predictor(&mut self, predictor: Option<Arc<predictor::Predictor>>) -> Result<()> {
        let locations = &self.experts.locations;
        self.learned
            .set(predictor, |l| locations.get(l).map_or(0, Vec::len))
    }

    /// Starts recording a routing trace into `path` (appended when the
    /// store is dropped). Also scores both lookahead
    /// variants at every single-token layer (`Schedule::recall`), so every
    /// decode row carries both guesses, and from two layers back as well;
    /// tokens do not change. Returns the run's id.
    pub fn start_trace(&mut self, path: &Path) -> trace::Result<String> {
        let shapes = self
            .experts
            .locations
            .iter()
            .map(|l| LayerShape {
                n_experts: l.len() as u32,
                expert_bytes: l
                    .first()
                    .map_or(0, |loc| loc.parts.iter().map(|r| r.entry.len as u64).sum()),
            })
            .collect();
        let run = self.trace.start(path, shapes)?;
        self.schedule.recall = true;
        Ok(run)
    }

    /// Whether a trace is being recorded.
    pub fn tracing(&self) -> bool {
        self.trace.on()
    }

    /// Number of experts in `layer` (0 for dense layers).
    pub fn experts_in(&self, layer: usize) -> usize {
        self.experts.locations[layer].len()
    }

    /// The shard index the experts are read through.
    pub fn index(&self) -> &WeightIndex {
        &self.experts.index
    }

    /// Resizes every MoE layer's cache to `slots` (emptying it: called at
    /// load, before anything is cached).
    pub fn set_slots(&mut self, slots: usize) {
        for (cache, locs) in self.layers.iter_mut().zip(&self.experts.locations) {
            // More slots than the layer has experts would never fill.
            cache.reset_slots(slots, self.policy.build(locs.len()));
        }
    }

    /// Number of layers with routed experts.
    pub fn moe_layers(&self) -> usize {
        self.experts
            .locations
            .iter()
            .filter(|l| !l.is_empty())
            .count()
    }

    /// Cache slots of `layer`.
    pub fn slots(&self, layer: usize) -> usize {
        self.layers[layer].lock().slots.capacity()
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

    /// Reads one expert, bypassing the cache.
    pub fn read(&self, layer: usize, expert: usize) -> Result<Mlp> {
        self.experts.read(layer, expert)
    }

    /// Bytes one routed expert takes in RAM and on disk (its read spans).
    pub fn expert_bytes(&self) -> Option<(u64, u64)> {
        self.experts.expert_bytes()
    }

    /// Whether experts are packed, so decoded in place in their slabs.
    pub fn zero_copy(&self) -> bool {
        self.experts.zero_copy()
    }

    /// Counters summed over layers.
    pub fn counters(&self) -> StoreCounters {
        let mut c = StoreCounters::default();
        for cache in &self.layers {
            let state = cache.lock();
            let l = state.slots.counters;
            c.pinned_hits += l.pinned_hits;
            c.hits += l.hits;
            c.misses += l.misses;
            c.evictions += l.evictions;
            c.policy_switches += state.slots.policy_switches();
        }
        let r = self.reads.counters();
        c.bytes_read = r.demand_bytes + r.prefetch_bytes;
        c.disk_busy = r.busy;
        c.reads_in_flight = r.in_flight;
        self.stats.fill(&mut c);
        let t = self.stats.prefetch_tally();
        c.prefetch_issued = t.issued;
        c.prefetch_issued_bytes = t.issued_bytes;
        c.prefetch_used = t.used;
        c.prefetch_late = t.late;
        // Issued and never asked for, less what was cancelled unread (a
        // wrong guess still in flight counts: it will be read).
        c.prefetch_wasted_bytes = t
            .issued_bytes
            .saturating_sub(t.used_bytes + r.cancelled_bytes);
        c
    }

    /// The eviction policy asked for (`--policy`).
    pub fn policy(&self) -> EvictPolicy {
        self.policy
    }

    /// The policies the MoE layers' caches run now (for `auto`, each
    /// layer's choice), with how many layers run each, by name.
    pub fn active_policies(&self) -> std::collections::BTreeMap<&'static str, usize> {
        let mut by = std::collections::BTreeMap::new();
        for (cache, locs) in self.layers.iter().zip(&self.experts.locations) {
            if !locs.is_empty() {
                *by.entry(cache.lock().slots.active_policy()).or_insert(0) += 1;
            }
        }
        by
    }

    /// Mean and 99th-percentile expert read latency so far, µs (0 with no
    /// reads).
    pub fn read_latency_us(&self) -> (f64, u64) {
        self.stats.read_latency_us()
    }

    /// The expert read latencies so far as a cumulative histogram: per
    /// bound (µs), the reads that took at most it; then the count of reads
    /// and their summed latency (µs).
    pub fn read_latency_histogram(&self, bounds_us: &[u64]) -> (Vec<u64>, u64, f64) {
        self.stats.read_latency_histogram(bounds_us)
    }

    /// The precision of the lookahead's guesses by rank (best first), per
    /// variant: `None` for a rank never scored.
    pub fn rank_precision(&self, variant: Variant) -> Vec<Option<f64>> {
        self.recall.rank_precision(variant)
    }

    /// Lookahead recall per layer and variant: the share of chosen experts
    /// the prediction had (`None` for a layer never predicted).
    pub fn recall(&self) -> Vec<[Option<f64>; 2]> {
        self.recall.per_layer()
    }

    /// Recall summed over layers, per variant: (predicted and chosen, chosen).
    pub fn recall_totals(&self) -> [(u64, u64); 2] {
        self.recall.totals()
    }

    /// The predictor's recall over all layers: (guessed and chosen, chosen).
    pub fn learned_recall(&self) -> (u64, u64) {
        self.learned.recall()
    }
}
