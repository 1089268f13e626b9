//! A layer's expert reads in flight, and the consumer side of the
//! pipeline.
//!
//! [`Inflight`] is one batch of expert reads (one or more coalesced spans
//! per expert) turning into complete experts as its events arrive, in
//! completion order. [`Pending`] is what a MoE layer holds while it works:
//! its demand reads for the misses, the prefetch reads of experts it turned
//! out to need, and the experts prefetch had already delivered. The layer
//! computes its hits, then takes experts from [`Pending::next_expert`] as
//! they land (or, a long prefill pass applying its experts in id order,
//! asks for each miss in turn by [`Pending::take`]), and
//! [`Pending::finish`] replays the cache insertions in the order asked
//! for, so the cache never depends on completion order.
//!
//! Memory stays bounded whatever the union's size (a long prefill can miss
//! every expert of a layer): at most `window` demand experts are read and
//! not yet handed out at once (those [`Pending::take`] holds for their
//! turn included), and an expert the cache would evict again
//! within the same layer (known up front, [`super::cache::SlotCache::survivors`])
//! is dropped as soon as it has been applied; the replay inserts a
//! placeholder for it, which is evicted before the replay ends.

use super::layer::{Clock, LayerCache};
use super::layout::Experts;
use super::stats::Stats;
use super::tracing::Trace;
use super::SpanRead;
use crate::error::{Error, Result};
use crate::layers::mlp::Mlp;
use crossbeam::channel::Select;
use moestream_io::SourceRead;
use moestream_io::{Batch, BatchEvent, IoError, Priority, ReadService, Slab};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one event of a batch meant.
pub(crate) enum Arrival {
    /// Expert `i` of the batch is complete: its slabs, span by span.
    Ready(usize, Vec<Slab>),
    /// An expert will not arrive: its read failed (with the error) or was
    /// cancelled (`None`).
    Lost(Option<Error>),
    /// The read service failed; nothing more of this batch arrives.
    Broken(Error),
}

/// One batch of expert reads in flight.
pub(crate) struct Inflight {
    pub batch: Batch,
    pub experts: Vec<usize>,
    pub plans: Vec<Vec<SpanRead>>,
    /// Read tag -> (expert index, span index).
    owner: Vec<(usize, usize)>,
    slabs: Vec<Vec<Option<Slab>>>,
    /// Spans still to land, per expert.
    left: Vec<usize>,
    /// Experts lost (failed or cancelled).
    lost: Vec<bool>,
    answered: usize,
    pub submitted: Instant,
    /// Bytes of each expert's spans.
    pub bytes: Vec<u64>,
}

impl Inflight {
    /// Submits every span of `experts` of `layer` (located by `at`) to
    /// `reads` as one batch.
    pub fn submit(
        at: &Experts,
        reads: &dyn ReadService,
        layer: usize,
        experts: Vec<usize>,
        priority: Priority,
    ) -> Inflight {
        let plans: Vec<Vec<SpanRead>> = experts.iter().map(|&e| at.plan(layer, e)).collect();
        let mut reqs = Vec::new();
        let mut owner = Vec::new();
        let mut bytes = Vec::with_capacity(plans.len());
        for (i, spans) in plans.iter().enumerate() {
            let mut b = 0;
            for (j, sp) in spans.iter().enumerate() {
                reqs.push(SourceRead {
                    tag: owner.len() as u64,
                    source: sp.shard,
                    offset: sp.offset,
                    len: sp.len,
                });
                owner.push((i, j));
                b += sp.len as u64;
            }
            bytes.push(b);
        }
        let slabs = plans
            .iter()
            .map(|p| p.iter().map(|_| None).collect())
            .collect();
        let left = plans.iter().map(Vec::len).collect();
        let lost = vec![false; plans.len()];
        let submitted = Instant::now();
        let batch = reads.submit(reqs, priority);
        Inflight {
            batch,
            experts,
            plans,
            owner,
            slabs,
            left,
            lost,
            answered: 0,
            submitted,
            bytes,
        }
    }

    /// Whether some read has not been answered yet.
    pub fn outstanding(&self) -> bool {
        self.answered < self.owner.len()
    }

    /// Applies one event; returns what it completed, if anything.
    pub fn on_event(&mut self, event: BatchEvent) -> Option<Arrival> {
        let (tag, result) = match event {
            BatchEvent::Done((tag, r)) => (tag, Some(r)),
            BatchEvent::Cancelled(tag) => (tag, None),
            BatchEvent::Failed(e) => {
                self.answered = self.owner.len();
                return Some(Arrival::Broken(e.into()));
            }
        };
        self.answered += 1;
        let (i, j) = self.owner[tag as usize];
        if self.lost[i] {
            return None;
        }
        match result {
            Some(Ok(slab)) => {
                self.slabs[i][j] = Some(slab);
                self.left[i] -= 1;
                if self.left[i] > 0 {
                    return None;
                }
                let got = self.slabs[i]
                    .iter_mut()
                    .map(|s| s.take().expect("every span landed"))
                    .collect();
                Some(Arrival::Ready(i, got))
            }
            Some(Err(e)) => {
                self.lost[i] = true;
                Some(Arrival::Lost(Some(e.into())))
            }
            None => {
                self.lost[i] = true;
                Some(Arrival::Lost(None))
            }
        }
    }

    /// Whether expert `i` was lost (its read failed or was cancelled).
    pub fn is_lost(&self, i: usize) -> bool {
        self.lost[i]
    }

    /// Applies every event already waiting, without blocking.
    pub fn poll(&mut self) -> Vec<Arrival> {
        let mut out = Vec::new();
        while self.outstanding() {
            match self.batch.events.try_recv() {
                Ok(ev) => out.extend(self.on_event(ev)),
                Err(_) => break,
            }
        }
        out
    }
}

/// A prefetched expert read: its own one-expert batch, so it can be
/// promoted or cancelled alone.
pub(crate) struct PrefetchRead {
    pub expert: usize,
    pub read: Inflight,
    /// The assembled expert, once it landed.
    pub ready: Option<Arc<Mlp>>,
    /// An early read (issued before the layer's routing, see
    /// [`super::ExpertStore::read_early`]), not a lookahead prefetch.
    pub early: bool,
}

/// Where an expert of a [`Pending`] comes from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    Demand,
    Prefetch,
}

/// What a [`Pending`] borrows of the store: the experts' locations, the
/// layer's cache, the read service, and the counters and the trace told
/// of its reads.
#[derive(Clone, Copy)]
pub(crate) struct Parts<'s> {
    pub(crate) experts: &'s Experts,
    pub(crate) cache: &'s LayerCache,
    pub(crate) clock: &'s Clock,
    pub(crate) reads: &'s dyn ReadService,
    pub(crate) stats: &'s Stats,
    pub(crate) trace: &'s Trace,
}

/// One layer's fetch in progress (see the module docs).
pub struct Pending<'s> {
    parts: Parts<'s>,
    layer: usize,
    /// Every miss, in the order asked for, and whether it survives the
    /// layer's cache insertions.
    misses: Vec<(usize, bool)>,
    /// Misses to read, not yet submitted.
    queue: std::collections::VecDeque<usize>,
    /// Demand experts submitted and not yet handed out.
    outstanding: usize,
    /// Bound on `outstanding` (a refill tops it up).
    window: usize,
    /// No refills while a wave is collected.
    hold: bool,
    demand: Vec<Inflight>,
    /// Prefetch reads of wanted experts, still in flight (promoted).
    awaited: Vec<PrefetchRead>,
    /// Experts that arrived before they were asked for.
    ready: Vec<(usize, Arc<Mlp>)>,
    /// Demand experts landed before [`Pending::take`] asked for them
    /// (still counted in `outstanding`).
    landed: Vec<(usize, Arc<Mlp>)>,
    /// Every expert handed out, for the cache.
    fetched: Vec<(usize, Arc<Mlp>)>,
    /// Early reads taken over and not yet handed out: counted in
    /// `outstanding`, so the window bounds them with the demand reads.
    counted: Vec<usize>,
    /// Time blocked waiting for reads.
    stall: Duration,
    latencies: Vec<u64>,
}

/// What a fetch starts with: experts already landed (id, weights), reads
/// in flight it awaits, and the early reads among both (ids).
pub(crate) type Started = (Vec<(usize, Arc<Mlp>)>, Vec<PrefetchRead>, Vec<usize>);

impl<'s> Pending<'s> {
    /// `misses` are every cache miss in the order asked for, with whether
    /// each survives the cache insertions; `to_read` those neither
    /// prefetched nor awaited; `early` the early reads among `ready` and
    /// `awaited`, which count in the window until handed out (so demand
    /// reads start only as they leave it).
    pub(crate) fn new(
        parts: Parts<'s>,
        layer: usize,
        (ready, awaited, early): Started,
        misses: Vec<(usize, bool)>,
        to_read: Vec<usize>,
        window: usize,
    ) -> Pending<'s> {
        assert!(window > 0, "the read window must be positive");
        parts.stats.window_held(early.len());
        let mut p = Pending {
            parts,
            layer,
            misses,
            queue: to_read.into(),
            outstanding: early.len(),
            window,
            hold: false,
            demand: Vec::new(),
            awaited,
            ready,
            landed: Vec::new(),
            fetched: Vec::new(),
            counted: early,
            stall: Duration::ZERO,
            latencies: Vec::new(),
        };
        p.refill();
        p
    }

    /// Submits queued misses, as one batch, up to the window.
    fn refill(&mut self) {
        let n = self
            .window
            .saturating_sub(self.outstanding)
            .min(self.queue.len());
        let experts: Vec<usize> = self.queue.drain(..n).collect();
        self.read(experts);
    }

    /// Submits demand reads of `experts`.
    fn read(&mut self, experts: Vec<usize>) {
        if experts.is_empty() {
            return;
        }
        self.outstanding += experts.len();
        self.parts.stats.window_held(self.outstanding);
        self.parts
            .stats
            .demand_reads
            .fetch_add(experts.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let Parts {
            experts: at, reads, ..
        } = self.parts;
        let batch = Inflight::submit(at, reads, self.layer, experts, Priority::Demand);
        self.demand.push(batch);
    }

    /// Keeps `mlp` for the cache if it survives the layer's insertions;
    /// an early read handed out leaves the window, which is topped up.
    fn keep(&mut self, e: usize, mlp: &Arc<Mlp>) {
        if self.misses.iter().any(|&(m, survives)| m == e && survives) {
            self.fetched.push((e, mlp.clone()));
        }
        if let Some(i) = self.counted.iter().position(|&c| c == e) {
            self.counted.swap_remove(i);
            self.handed_out();
        }
    }

    /// The next expert to arrive, blocking until one lands; `None` when
    /// every asked-for expert has been handed out.
    pub fn next_expert(&mut self) -> Result<Option<(usize, Arc<Mlp>)>> {
        if let Some((e, m)) = self.ready.pop() {
            self.keep(e, &m);
            return Ok(Some((e, m)));
        }
        let Some((source, e, m)) = self.arrive()? else {
            return Ok(None);
        };
        if source == Source::Demand {
            self.handed_out();
        }
        self.keep(e, &m);
        Ok(Some((e, m)))
    }

    /// Miss `e`, blocking until it lands; the experts landing before it
    /// wait for their turn, still counted in the read window, so the
    /// window bounds what is read and not yet applied (with
    /// [`ExpertStore::fetch_in_order`](super::ExpertStore::fetch_in_order)
    /// and misses taken in id order, `e` was asked for before any of
    /// them). With `overlap` off, reads and compute never overlap: every
    /// read in flight lands before `e` is handed out.
    pub fn take(&mut self, e: usize, overlap: bool) -> Result<Arc<Mlp>> {
        loop {
            if let Some(i) = self.ready.iter().position(|r| r.0 == e) {
                let (e, m) = self.ready.swap_remove(i);
                self.keep(e, &m);
                return Ok(m);
            }
            if let Some(i) = self.landed.iter().position(|r| r.0 == e) {
                let (e, m) = self.landed.swap_remove(i);
                self.outstanding -= 1;
                if overlap {
                    self.refill();
                }
                self.keep(e, &m);
                return Ok(m);
            }
            // Not here yet: ask for what the window allows and wait (for
            // one expert, or without overlap for the whole wave).
            self.refill();
            let mut got = 0;
            while let Some((source, k, m)) = self.arrive()? {
                got += 1;
                match source {
                    Source::Demand => self.landed.push((k, m)),
                    Source::Prefetch => self.ready.push((k, m)),
                }
                if overlap {
                    break;
                }
            }
            assert!(
                got > 0,
                "expert {e} of layer {} was never asked for",
                self.layer
            );
        }
    }

    /// A demand expert left the window: tops the window up (unless a
    /// wave is being collected).
    fn handed_out(&mut self) {
        self.outstanding -= 1;
        if !self.hold {
            self.refill();
        }
    }

    /// The next expert to land, blocking: (source, expert, assembled), or
    /// `None` with nothing outstanding. A demand expert still counts in
    /// the window until it is handed out.
    fn arrive(&mut self) -> Result<Option<(Source, usize, Arc<Mlp>)>> {
        loop {
            let Some((source, k, event)) = self.wait()? else {
                return Ok(None);
            };
            let read = match source {
                Source::Demand => &mut self.demand[k],
                Source::Prefetch => &mut self.awaited[k].read,
            };
            let Some(arrival) = read.on_event(event) else {
                continue;
            };
            match (arrival, source) {
                (Arrival::Ready(i, slabs), source) => {
                    let e = self.assemble(source, k, i, slabs)?;
                    return Ok(Some((source, e.0, e.1)));
                }
                (Arrival::Lost(Some(e)), Source::Demand) | (Arrival::Broken(e), Source::Demand) => {
                    return Err(e)
                }
                (Arrival::Lost(None), Source::Demand) => {
                    unreachable!("demand reads are never cancelled")
                }
                // A prefetch read that failed or was dropped: read it again
                // as demand (its error, if real, will come back there).
                (Arrival::Lost(..) | Arrival::Broken(_), Source::Prefetch) => {
                    let e = self.awaited[k].expert;
                    self.read(vec![e]);
                }
            }
        }
    }

    /// Assembles expert `i` of read `k` of `source` from its slabs,
    /// recording its latency (and, for a prefetch, that it was used).
    fn assemble(
        &mut self,
        source: Source,
        k: usize,
        i: usize,
        slabs: Vec<Slab>,
    ) -> Result<(usize, Arc<Mlp>)> {
        let (e, plan, submitted, bytes, early) = match source {
            Source::Demand => {
                let b = &self.demand[k];
                (b.experts[i], &b.plans[i], b.submitted, b.bytes[i], false)
            }
            Source::Prefetch => {
                let a = &self.awaited[k];
                (
                    a.expert,
                    &a.read.plans[0],
                    a.read.submitted,
                    a.read.bytes[0],
                    a.early,
                )
            }
        };
        let us = submitted.elapsed().as_micros() as u64;
        self.latencies.push(us);
        if self.parts.trace.on() {
            self.parts.trace.read(self.layer, e, bytes, us);
        }
        let mlp = Arc::new(self.parts.experts.assemble(self.layer, e, plan, slabs)?);
        if source == Source::Prefetch && !early {
            self.parts.stats.prefetch_used(bytes, true);
        }
        Ok((e, mlp))
    }

    /// Blocks until some outstanding read answers: (source, index, event),
    /// or `None` with nothing outstanding.
    fn wait(&mut self) -> Result<Option<(Source, usize, BatchEvent)>> {
        let outstanding = self.demand.iter().any(Inflight::outstanding)
            || self.awaited.iter().any(|a| a.read.outstanding());
        if !outstanding {
            return Ok(None);
        }
        let mut sel = Select::new();
        let mut map = Vec::new();
        for (i, d) in self.demand.iter().enumerate() {
            if d.outstanding() {
                sel.recv(&d.batch.events);
                map.push((Source::Demand, i));
            }
        }
        for (i, a) in self.awaited.iter().enumerate() {
            if a.read.outstanding() {
                sel.recv(&a.read.batch.events);
                map.push((Source::Prefetch, i));
            }
        }
        if map.is_empty() {
            return Ok(None);
        }
        let start = Instant::now();
        let op = sel.select();
        let (source, k) = map[op.index()];
        let rx = match source {
            Source::Demand => &self.demand[k].batch.events,
            Source::Prefetch => &self.awaited[k].read.batch.events,
        };
        let event = op.recv(rx).unwrap_or_else(|_| {
            BatchEvent::Failed(IoError::Ring {
                op: "expert read",
                source: std::io::Error::other("the read thread stopped mid-batch"),
            })
        });
        self.stall += start.elapsed();
        Ok(Some((source, k, event)))
    }

    /// The next wave of experts for a layer that never computes while
    /// reading: submits the next window of misses, then waits for every
    /// read in flight. Empty when every expert has been handed out.
    pub fn next_wave(&mut self) -> Result<Vec<(usize, Arc<Mlp>)>> {
        self.refill();
        self.hold = true;
        let mut wave = Vec::new();
        let got = loop {
            match self.next_expert() {
                Ok(Some(x)) => wave.push(x),
                Ok(None) => break Ok(wave),
                Err(e) => break Err(e),
            }
        };
        self.hold = false;
        got
    }

    /// Replays the layer's cache insertions in the order asked for (kept
    /// experts, placeholders for the ones that would not survive) and
    /// records stall time and latencies. Every miss must have been handed
    /// out.
    pub fn finish(self) {
        assert!(
            self.queue.is_empty() && self.outstanding == 0 && self.landed.is_empty(),
            "a layer finished with expert reads outstanding"
        );
        let fetched = self.fetched;
        let placeholder = &self.parts.experts.placeholder;
        let replay = self.misses.iter().map(|&(e, survives)| {
            let kept = fetched
                .iter()
                .find(|(k, _)| *k == e)
                .map(|(_, m)| m.clone());
            assert_eq!(kept.is_some(), survives, "expert {e}: kept iff it survives");
            (e, kept.unwrap_or_else(|| placeholder.clone()))
        });
        let slots = {
            let mut state = self.parts.cache.lock();
            state.insert(replay, self.parts.clock);
            assert!(
                !state.slots.any_value(|m| Arc::ptr_eq(m, placeholder)),
                "a placeholder expert survived the cache replay of layer {}",
                self.layer
            );
            state.slots.limit()
        };
        self.parts.trace.end_fetch(self.layer, slots);
        self.parts.stats.record_reads(self.stall, &self.latencies);
    }
}
