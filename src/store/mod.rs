//! The expert store: where routed experts live and how they reach compute.
//!
//! Each routed expert (gate, up, down) stays on disk until a router picks
//! it; then its bytes are read through the shard's `moestream-io` reader
//! (one coalesced read when the three tensors are adjacent in one shard),
//! widened to f32 and kept in a per-layer LRU cache ([`lru`]) of bounded
//! size. Counters record hits, misses, bytes read and time spent on disk.

pub mod lru;
pub mod usage;

use crate::error::Result;
use crate::model::mlp::Mlp;
use crate::weights::dtype;
use crate::weights::{TensorEntry, WeightIndex};
use lru::Lru;
use moestream_io::{coalesce, ByteRange, CoalesceLimits};
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
}

/// Heats halve every this many forwarded tokens.
const HEAT_DECAY_TOKENS: u64 = 256;

impl ExpertStore {
    /// A store over `locations` with `capacity` cached experts per layer.
    /// Every location must already be shape-checked against (hidden, inter).
    pub fn new(
        index: Arc<WeightIndex>,
        locations: Vec<Vec<ExpertLocation>>,
        capacity: usize,
        hidden: usize,
        inter: usize,
    ) -> ExpertStore {
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

    /// The expert, from the layer's cache or read from disk on a miss.
    pub fn get(&self, layer: usize, expert: usize) -> Result<Arc<Mlp>> {
        if let Some(m) = self.caches[layer].lock().expect("cache lock").get(expert) {
            return Ok(m);
        }
        let mlp = Arc::new(self.read(layer, expert)?);
        self.caches[layer]
            .lock()
            .expect("cache lock")
            .insert(expert, mlp.clone());
        Ok(mlp)
    }

    /// Reads and widens one expert, bypassing the cache. The three tensors
    /// are coalesced per shard into as few reads as the limits allow (one,
    /// for the usual adjacent layout).
    pub fn read(&self, layer: usize, expert: usize) -> Result<Mlp> {
        let loc = &self.locations[layer][expert];
        let start = Instant::now();
        let mut mats: [Vec<f32>; 3] = Default::default();
        let mut bytes = 0u64;
        let mut order: Vec<usize> = (0..3).collect();
        order.sort_by_key(|&i| (loc.parts[i].1.shard, loc.parts[i].1.offset));
        for shard_parts in order.chunk_by(|&a, &b| loc.parts[a].1.shard == loc.parts[b].1.shard) {
            let shard = loc.parts[shard_parts[0]].1.shard;
            let ranges: Vec<ByteRange> = shard_parts
                .iter()
                .map(|&i| ByteRange {
                    offset: loc.parts[i].1.offset,
                    len: loc.parts[i].1.len as u64,
                })
                .collect();
            for merged in coalesce(&ranges, COALESCE) {
                let slab = self.index.shards[shard]
                    .reader
                    .read(merged.offset, merged.len as usize)?;
                bytes += merged.len;
                for &p in &merged.parts {
                    let (name, e) = &loc.parts[shard_parts[p]];
                    mats[shard_parts[p]] = widen(
                        &self.index,
                        name,
                        e,
                        &slab.bytes()[merged.window(ranges[p])],
                    )?;
                }
            }
        }
        let mut io = self.io.lock().expect("io lock");
        io.0 += bytes;
        io.1 += start.elapsed();
        let [gate, up, down] = mats;
        Ok(Mlp {
            gate,
            up,
            down,
            hidden: self.hidden,
            inter: self.inter,
        })
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

fn widen(index: &WeightIndex, name: &str, e: &TensorEntry, bytes: &[u8]) -> Result<Vec<f32>> {
    let dt = index.dtype(name, e)?;
    let mut out = vec![0f32; e.numel()];
    dtype::to_f32(dt, bytes, &mut out);
    Ok(out)
}
