//! The expert store: where routed experts live and how they reach compute.
//!
//! Each routed expert (gate, up, down) stays on disk until a router picks
//! it; then its bytes are read (one coalesced read when the three tensors
//! are adjacent in one shard) and kept, in their stored element type, in a
//! per-layer LRU cache ([`lru`]) of bounded size. A layer's misses are read
//! together: through the io_uring reactor as one batch, each expert handed
//! over as soon as its last span lands, or one by one through the shard
//! readers. Counters record hits, misses, bytes read and time spent waiting
//! on reads; [`usage`] records every router selection for tiering.

pub mod budget;
pub mod cache;
pub mod policy;
pub mod usage;

use crate::error::{Error, Result};
use crate::model::mlp::Mlp;
use crate::tensor::Mat;
use crate::weights::index::Resolved;
use crate::weights::{TensorEntry, WeightIndex};
use cache::SlotCache;
use moestream_io::{
    coalesce, BatchEvent, ByteRange, CoalesceLimits, OpenFile, Reactor, ReactorConfig,
    ReactorService, ReadMode, ReadReq, Slab,
};
use policy::EvictPolicy;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
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
struct SpanRead {
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
    pub bytes_read: u64,
    pub disk_time: Duration,
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
    io: Mutex<(u64, Duration)>,
    /// Latency of each expert read, µs: from the read's submission (the
    /// batch's, through the reactor) until its last byte landed.
    latency: Mutex<hdrhistogram::Histogram<u64>>,
    usage: Mutex<UsageTable>,
    /// Batches a layer's misses when io_uring works and every shard reader
    /// has a descriptor (not mmap; not drop, whose fadvise is per read).
    reactor: Option<ReactorService>,
    /// Per shard, its descriptor for reactor reads.
    files: Vec<Option<Arc<OpenFile>>>,
}

/// Reads in flight at once through the reactor.
const REACTOR_DEPTH: u32 = 32;

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
    ) -> ExpertStore {
        let files: Vec<Option<Arc<OpenFile>>> =
            index.shards.iter().map(|s| s.reader.open_file()).collect();
        let batchable = index
            .shards
            .iter()
            .all(|s| s.reader.open_file().is_some() && s.reader.effective_mode() != ReadMode::Drop);
        let reactor = if use_reactor && batchable && Reactor::probe().is_ok() {
            let config = ReactorConfig {
                depth: REACTOR_DEPTH,
                ..ReactorConfig::default()
            };
            Reactor::new(config, moestream_io::shared_pool())
                .and_then(ReactorService::spawn)
                .ok()
        } else {
            None
        };
        let caches = locations
            .iter()
            .map(|l| Mutex::new(SlotCache::new(if l.is_empty() { 0 } else { capacity })))
            .collect();
        let counts: Vec<usize> = locations.iter().map(Vec::len).collect();
        let usage_table = Mutex::new(UsageTable::new(&counts, HEAT_DECAY_TOKENS));
        ExpertStore {
            index,
            locations,
            caches,
            policy,
            top_k,
            hidden,
            inter,
            io: Mutex::new((0, Duration::ZERO)),
            latency: Mutex::new(
                hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3)
                    .expect("valid histogram bounds"),
            ),
            usage: usage_table,
            reactor,
            files,
        }
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

    /// Looks `experts` up in the layer's cache, counting each as a hit or a
    /// miss; `None` for a miss.
    pub fn lookup(&self, layer: usize, experts: &[usize]) -> Vec<Option<Arc<Mlp>>> {
        let mut cache = self.caches[layer].lock().expect("cache lock");
        experts.iter().map(|&e| cache.get(e)).collect()
    }

    /// Reads `experts` of `layer` from disk, inserts each into the layer's
    /// cache and hands it to `sink` as soon as it is complete. With the
    /// io_uring reactor, all their reads are in flight at once and experts
    /// are handed over in completion order; otherwise one after another.
    pub fn fetch(
        &self,
        layer: usize,
        experts: &[usize],
        mut sink: impl FnMut(usize, Arc<Mlp>),
    ) -> Result<()> {
        // Bytes read and time spent waiting on reads (widening to f32 excluded).
        let mut bytes = 0u64;
        let mut wait = Duration::ZERO;
        let mut latencies: Vec<u64> = Vec::with_capacity(experts.len());
        // Experts go to the sink as they complete, but into the cache in the
        // order asked for, so what the LRU later evicts never depends on
        // which read finished first.
        let mut fetched: Vec<Option<Arc<Mlp>>> = vec![None; experts.len()];
        let mut done = |e: usize, mlp: Mlp| {
            let mlp = Arc::new(mlp);
            let i = experts
                .iter()
                .position(|&x| x == e)
                .expect("fetched experts were asked for");
            fetched[i] = Some(mlp.clone());
            sink(e, mlp);
        };
        let res = match &self.reactor {
            Some(reactor) if experts.len() > 1 => {
                let timing = (&mut bytes, &mut wait, &mut latencies);
                self.fetch_batched(reactor, layer, experts, timing, &mut done)
            }
            _ => experts.iter().try_for_each(|&e| {
                let spans = self.plan(layer, e);
                let mut slabs = Vec::with_capacity(spans.len());
                let start = Instant::now();
                for sp in &spans {
                    slabs.push(self.index.shards[sp.shard].reader.read(sp.offset, sp.len)?);
                    bytes += sp.len as u64;
                }
                let took = start.elapsed();
                wait += took;
                latencies.push(took.as_micros() as u64);
                done(e, self.assemble(layer, e, &spans, &slabs)?);
                Ok(())
            }),
        };
        self.insert(layer, experts.iter().copied().zip(fetched));
        let mut io = self.io.lock().expect("io lock");
        io.0 += bytes;
        io.1 += wait;
        drop(io);
        let mut h = self.latency.lock().expect("latency lock");
        for us in latencies {
            h.saturating_record(us.max(1));
        }
        res
    }

    /// All spans of all `experts` submitted as one reactor batch; an expert
    /// is assembled when its last span completes.
    fn fetch_batched(
        &self,
        reactor: &ReactorService,
        layer: usize,
        experts: &[usize],
        (bytes, wait, latencies): (&mut u64, &mut Duration, &mut Vec<u64>),
        done: &mut impl FnMut(usize, Mlp),
    ) -> Result<()> {
        let plans: Vec<Vec<SpanRead>> = experts.iter().map(|&e| self.plan(layer, e)).collect();
        let mut reqs = Vec::new();
        let mut owner = Vec::new(); // tag -> (expert slot, span index)
        for (i, spans) in plans.iter().enumerate() {
            for (j, sp) in spans.iter().enumerate() {
                let file = self.files[sp.shard]
                    .clone()
                    .expect("reactor only with descriptor-backed readers");
                reqs.push(ReadReq {
                    tag: owner.len() as u64,
                    file,
                    offset: sp.offset,
                    len: sp.len,
                });
                owner.push((i, j));
                *bytes += sp.len as u64;
            }
        }
        let mut slabs: Vec<Vec<Option<Slab>>> = plans
            .iter()
            .map(|p| p.iter().map(|_| None).collect())
            .collect();
        let mut left: Vec<usize> = plans.iter().map(Vec::len).collect();
        let mut first_err: Option<Error> = None;
        let mut assembling = Duration::ZERO;
        let start = Instant::now();
        // Each expert is assembled and handed over as soon as its last span
        // lands, while the rest of the batch is still in flight.
        let mut ring_err: Option<Error> = None;
        let n = reqs.len();
        let events = reactor.submit(reqs);
        let mut received = 0;
        for event in events.iter().take(n) {
            received += 1;
            let (tag, slab) = match event {
                BatchEvent::Done(d) => d,
                BatchEvent::Failed(e) => {
                    ring_err = Some(e.into());
                    break;
                }
            };
            if first_err.is_some() {
                continue;
            }
            let (i, j) = owner[tag as usize];
            match slab {
                Ok(slab) => slabs[i][j] = Some(slab),
                Err(e) => {
                    first_err = Some(e.into());
                    continue;
                }
            }
            left[i] -= 1;
            if left[i] == 0 {
                latencies.push(start.elapsed().as_micros() as u64);
                let t = Instant::now();
                let got: Vec<Slab> = slabs[i]
                    .iter_mut()
                    .map(|s| s.take().expect("every span completed"))
                    .collect();
                match self.assemble(layer, experts[i], &plans[i], &got) {
                    Ok(mlp) => done(experts[i], mlp),
                    Err(e) => first_err = Some(e),
                }
                assembling += t.elapsed();
            }
        }
        *wait += start.elapsed().saturating_sub(assembling);
        if let Some(e) = ring_err {
            return Err(e);
        }
        if received < n {
            return Err(Error::Io(moestream_io::IoError::Ring {
                op: "reactor batch",
                source: std::io::Error::other(
                    "the reactor thread stopped before the batch completed",
                ),
            }));
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        Ok(())
    }

    /// The coalesced reads of one expert: per shard, its tensors (and
    /// scales) merged into as few spans as the limits allow (one, for the
    /// container's contiguous layout).
    fn plan(&self, layer: usize, expert: usize) -> Vec<SpanRead> {
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

    /// Decodes the bytes of `spans` (read into `slabs`) into the expert.
    fn assemble(
        &self,
        layer: usize,
        expert: usize,
        spans: &[SpanRead],
        slabs: &[Slab],
    ) -> Result<Mlp> {
        let loc = &self.locations[layer][expert];
        let mut bytes: [Option<&[u8]>; 6] = [None; 6];
        for (sp, slab) in spans.iter().zip(slabs) {
            for (part, window) in &sp.parts {
                bytes[*part] = Some(&slab.bytes()[window.clone()]);
            }
        }
        let mut mats = Vec::with_capacity(3);
        for (i, r) in loc.parts.iter().enumerate() {
            let data = bytes[2 * i].expect("the spans cover every part");
            mats.push(self.index.decode_mat(r, data, bytes[2 * i + 1])?);
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

    /// Inserts fetched experts into the layer's cache, evicting by policy.
    fn insert(&self, layer: usize, fetched: impl Iterator<Item = (usize, Option<Arc<Mlp>>)>) {
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
            let n = if locs.is_empty() { 0 } else { slots };
            *cache = Mutex::new(SlotCache::new(n));
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

    /// Bytes one expert of `layer` takes in RAM and on disk (its read spans).
    pub fn expert_bytes(&self) -> Option<(u64, u64)> {
        let layer = self.locations.iter().position(|l| !l.is_empty())?;
        let loc = self.locations[layer].first()?;
        let ram = loc.parts.iter().map(|r| self.index.kept_bytes(r)).sum();
        let disk = self.plan(layer, 0).iter().map(|s| s.len as u64).sum();
        Some((ram, disk))
    }

    /// Reads one expert, bypassing the cache.
    pub fn read(&self, layer: usize, expert: usize) -> Result<Mlp> {
        let spans = self.plan(layer, expert);
        let slabs = spans
            .iter()
            .map(|sp| self.index.shards[sp.shard].reader.read(sp.offset, sp.len))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        self.assemble(layer, expert, &spans, &slabs)
    }

    /// Whether misses are read through the io_uring reactor.
    pub fn uses_reactor(&self) -> bool {
        self.reactor.is_some()
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
        let io = self.io.lock().expect("io lock");
        c.bytes_read = io.0;
        c.disk_time = io.1;
        c
    }
}
