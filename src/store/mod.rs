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

pub mod lru;
pub mod usage;

use crate::error::{Error, Result};
use crate::model::mlp::Mlp;
use crate::tensor::Mat;
use crate::weights::{TensorEntry, WeightIndex};
use lru::Lru;
use moestream_io::{
    coalesce, ByteRange, CoalesceLimits, OpenFile, Reactor, ReactorConfig, ReadMode, ReadReq, Slab,
};
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
    /// gate, up, down (with their tensor names, for errors).
    pub parts: [(String, TensorEntry); 3],
}

/// One coalesced read of an expert: a span of one shard, and the expert
/// parts (0 gate, 1 up, 2 down) it holds as byte windows into the span.
struct SpanRead {
    shard: usize,
    offset: u64,
    len: usize,
    parts: Vec<(usize, Range<usize>)>,
}

/// Counters of the store (summed over layers).
#[derive(Clone, Copy, Debug, Default)]
pub struct StoreCounters {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub bytes_read: u64,
    pub disk_time: Duration,
}

impl StoreCounters {
    /// hits / (hits + misses), or 0 with no lookups.
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            0.0
        } else {
            self.hits as f64 / total as f64
        }
    }
}

/// Routed experts of every MoE layer, streamed from disk into LRU caches.
pub struct ExpertStore {
    index: Arc<WeightIndex>,
    /// `[layer][expert]`; empty for dense layers.
    locations: Vec<Vec<ExpertLocation>>,
    caches: Vec<Mutex<Lru<Arc<Mlp>>>>,
    hidden: usize,
    inter: usize,
    io: Mutex<(u64, Duration)>,
    usage: Mutex<UsageTable>,
    /// Batches a layer's misses when io_uring works and every shard reader
    /// has a descriptor (not mmap; not drop, whose fadvise is per read).
    reactor: Option<Mutex<Reactor>>,
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
                .ok()
                .map(Mutex::new)
        } else {
            None
        };
        let caches = locations
            .iter()
            .map(|_| Mutex::new(Lru::new(capacity)))
            .collect();
        let counts: Vec<usize> = locations.iter().map(Vec::len).collect();
        let usage_table = Mutex::new(UsageTable::new(&counts, HEAT_DECAY_TOKENS));
        ExpertStore {
            index,
            locations,
            caches,
            hidden,
            inter,
            io: Mutex::new((0, Duration::ZERO)),
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
                self.fetch_batched(reactor, layer, experts, (&mut bytes, &mut wait), &mut done)
            }
            _ => experts.iter().try_for_each(|&e| {
                let spans = self.plan(layer, e);
                let mut slabs = Vec::with_capacity(spans.len());
                for sp in &spans {
                    let start = Instant::now();
                    slabs.push(self.index.shards[sp.shard].reader.read(sp.offset, sp.len)?);
                    wait += start.elapsed();
                    bytes += sp.len as u64;
                }
                done(e, self.assemble(layer, e, &spans, &slabs)?);
                Ok(())
            }),
        };
        let mut cache = self.caches[layer].lock().expect("cache lock");
        for (&e, mlp) in experts.iter().zip(fetched) {
            if let Some(mlp) = mlp {
                cache.insert(e, mlp);
            }
        }
        drop(cache);
        let mut io = self.io.lock().expect("io lock");
        io.0 += bytes;
        io.1 += wait;
        res
    }

    /// All spans of all `experts` submitted as one reactor batch; an expert
    /// is assembled when its last span completes.
    fn fetch_batched(
        &self,
        reactor: &Mutex<Reactor>,
        layer: usize,
        experts: &[usize],
        (bytes, wait): (&mut u64, &mut Duration),
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
        let ring = reactor
            .lock()
            .expect("reactor lock")
            .submit_batch_with(reqs, |(tag, slab)| {
                if first_err.is_some() {
                    return;
                }
                let (i, j) = owner[tag as usize];
                match slab {
                    Ok(slab) => slabs[i][j] = Some(slab),
                    Err(e) => {
                        first_err = Some(e.into());
                        return;
                    }
                }
                left[i] -= 1;
                if left[i] == 0 {
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
            });
        *wait += start.elapsed().saturating_sub(assembling);
        ring?;
        if let Some(e) = first_err {
            return Err(e);
        }
        Ok(())
    }

    /// The coalesced reads of one expert: per shard, its tensors merged into
    /// as few spans as the limits allow (one, for the usual adjacent layout).
    fn plan(&self, layer: usize, expert: usize) -> Vec<SpanRead> {
        let loc = &self.locations[layer][expert];
        let mut order: Vec<usize> = (0..3).collect();
        order.sort_by_key(|&i| (loc.parts[i].1.shard, loc.parts[i].1.offset));
        let mut spans = Vec::new();
        for shard_parts in order.chunk_by(|&a, &b| loc.parts[a].1.shard == loc.parts[b].1.shard) {
            let ranges: Vec<ByteRange> = shard_parts
                .iter()
                .map(|&i| ByteRange {
                    offset: loc.parts[i].1.offset,
                    len: loc.parts[i].1.len as u64,
                })
                .collect();
            for merged in coalesce(&ranges, COALESCE) {
                spans.push(SpanRead {
                    shard: loc.parts[shard_parts[0]].1.shard,
                    offset: merged.offset,
                    len: merged.len as usize,
                    parts: merged
                        .parts
                        .iter()
                        .map(|&p| (shard_parts[p], merged.window(ranges[p])))
                        .collect(),
                });
            }
        }
        spans
    }

    /// Widens the bytes of `spans` (read into `slabs`) into the expert.
    fn assemble(
        &self,
        layer: usize,
        expert: usize,
        spans: &[SpanRead],
        slabs: &[Slab],
    ) -> Result<Mlp> {
        let loc = &self.locations[layer][expert];
        let mut mats: [Option<Mat>; 3] = Default::default();
        for (sp, slab) in spans.iter().zip(slabs) {
            for (part, window) in &sp.parts {
                let (name, e) = &loc.parts[*part];
                let dt = self.index.dtype(name, e)?;
                let bytes = &slab.bytes()[window.clone()];
                mats[*part] = Some(Mat::from_bytes(dt, bytes, e.shape[0], e.shape[1]));
            }
        }
        let [gate, up, down] = mats.map(|m| m.expect("the spans cover every part"));
        Ok(Mlp {
            gate,
            up,
            down,
            hidden: self.hidden,
            inter: self.inter,
        })
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

    /// Counters summed over layers.
    pub fn counters(&self) -> StoreCounters {
        let mut c = StoreCounters::default();
        for cache in &self.caches {
            let l = cache.lock().expect("cache lock");
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
