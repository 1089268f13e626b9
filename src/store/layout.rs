//! Where a routed expert lives on disk and how its bytes become an
//! expert: its three tensors ([`ExpertLocation`]), the coalesced reads that
//! fetch them ([`Experts::plan`]; their byte counts, which the RAM plan
//! uses, in [`ExpertLocation`]), and the decoding of the landed slabs
//! (packed matrices stay windows of their slab: zero copy). [`Experts`]
//! holds every layer's locations; it never changes after load.

use crate::error::Result;
use crate::formats::tensor::{Mat, MatData};
use crate::formats::weights::index::Resolved;
use crate::formats::weights::{TensorEntry, WeightIndex};
use crate::layers::mlp::Mlp;
use moestream_io::{coalesce, ByteRange, CoalesceLimits, Slab};
use std::ops::Range;
use std::sync::Arc;

/// Refuses a landed packed or block-quantized expert matrix whose row or
/// block scales are not finite, before it is cached (see
/// [`crate::formats::weights::index::check_finite`]). The scales are a small share
/// of the bytes (4 bytes a row; 2 or 4 bytes a GGUF block), so this costs
/// little beside the read. Float parts are left to the forward's residual
/// check: a NaN there reaches the output, and scanning every weight would
/// cost a pass over the expert (the runtime quantizer checks the floats it
/// narrows).
fn check_scales(name: &str, m: &Mat) -> Result<()> {
    match m.data {
        MatData::Q(_) | MatData::Grouped(_) | MatData::Ggml { .. } => {
            crate::formats::weights::index::check_finite(name, m)
        }
        MatData::F32(_) | MatData::Bf16(_) => Ok(()),
    }
}

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

    /// Bytes of its read spans on disk (the coalesced reads that fetch it).
    pub fn disk_bytes(&self) -> u64 {
        spans(self).iter().map(|s| s.len as u64).sum()
    }

    /// Whether every part is a packed container tensor or GGUF blocks
    /// (decoded in place in its read slab: zero copy).
    pub fn packed(&self) -> bool {
        use crate::formats::weights::index::Stored;
        self.parts
            .iter()
            .all(|r| matches!(r.stored, Stored::Quant { .. } | Stored::Ggml(_)))
    }

    /// Bytes the expert takes in RAM once cached: its decoded parts, or,
    /// zero copy, its read buffers (see [`ExpertLocation::read_buffer_bytes`]).
    pub fn ram_bytes(&self, index: &crate::formats::weights::WeightIndex) -> u64 {
        let kept: u64 = self.parts.iter().map(|r| index.kept_bytes(r)).sum();
        if self.packed() {
            kept.max(self.read_buffer_bytes())
        } else {
            kept
        }
    }

    /// Bytes of the buffers its reads land in, at most: each span's direct
    /// read covers the 4096-aligned superset of the span, one page more
    /// than the span rounded up when the span starts off a page boundary
    /// (GGUF tensors are 32-aligned; container experts start on a page).
    pub fn read_buffer_bytes(&self) -> u64 {
        use moestream_io::{align_up, ALIGN};
        spans(self)
            .iter()
            .map(|s| {
                let straddle = if s.offset % ALIGN as u64 == 0 {
                    0
                } else {
                    ALIGN
                };
                (align_up(s.len) + straddle) as u64
            })
            .sum()
    }
}

/// The coalesced reads of `loc`: per shard, its tensors (and scales)
/// merged into as few spans as the limits allow (one, for the container's
/// contiguous layout).
fn spans(loc: &ExpertLocation) -> Vec<SpanRead> {
    let mut ranges = loc.ranges();
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

/// One coalesced read of an expert: a span of one shard, and the expert
/// ranges (see [`ExpertLocation::ranges`]) it holds as byte windows into it.
pub(crate) struct SpanRead {
    pub(crate) shard: usize,
    pub(crate) offset: u64,
    pub(crate) len: usize,
    parts: Vec<(usize, Range<usize>)>,
}

/// Where every routed expert of every layer lives, and how to decode it.
pub(crate) struct Experts {
    pub(crate) index: Arc<WeightIndex>,
    /// `[layer][expert]`; empty for dense layers.
    pub(crate) locations: Vec<Vec<ExpertLocation>>,
    pub(crate) hidden: usize,
    pub(crate) inter: usize,
    /// Stands in, during a cache replay, for an expert that is evicted
    /// again before the replay ends (never computed with).
    pub(crate) placeholder: Arc<Mlp>,
}

impl Experts {
    /// The locations of every layer's experts, of shape (hidden, inter).
    pub(crate) fn new(
        index: Arc<WeightIndex>,
        locations: Vec<Vec<ExpertLocation>>,
        (hidden, inter): (usize, usize),
    ) -> Experts {
        Experts {
            index,
            locations,
            hidden,
            inter,
            placeholder: Arc::new(Mlp {
                gate: Mat::f32(0, 0, Vec::new()),
                up: Mat::f32(0, 0, Vec::new()),
                down: Mat::f32(0, 0, Vec::new()),
                hidden: 0,
                inter: 0,
            }),
        }
    }

    /// The coalesced reads of one expert: per shard, its tensors (and
    /// scales) merged into as few spans as the limits allow (one, for the
    /// container's contiguous layout).
    pub(crate) fn plan(&self, layer: usize, expert: usize) -> Vec<SpanRead> {
        spans(&self.locations[layer][expert])
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
            let m = self
                .index
                .decode_mat_in(r, data, parts[2 * i + 1].clone())?;
            check_scales(&r.name, &m)?;
            mats.push(m);
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

    /// Reads one expert, bypassing the cache.
    pub fn read(&self, layer: usize, expert: usize) -> Result<Mlp> {
        let spans = self.plan(layer, expert);
        let slabs = spans
            .iter()
            .map(|sp| self.index.shards[sp.shard].reader.read(sp.offset, sp.len))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        self.assemble(layer, expert, &spans, slabs)
    }

    /// Bytes one routed expert takes in RAM and on disk (its read spans);
    /// every expert of a model has the same shape. `None` without experts.
    pub fn expert_bytes(&self) -> Option<(u64, u64)> {
        let loc = self.locations.iter().flatten().next()?;
        Some((loc.ram_bytes(&self.index), loc.disk_bytes()))
    }

    /// Whether experts are packed, so decoded in place in their slabs.
    pub fn zero_copy(&self) -> bool {
        self.locations
            .iter()
            .flatten()
            .next()
            .is_some_and(ExpertLocation::packed)
    }
}
