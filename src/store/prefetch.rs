//! Router-lookahead prefetch: which state predicts the next layers'
//! experts ([`Lookahead`], [`Variant`]), the low-priority reads of a
//! prediction (landing outside the cache until a layer asks for them), and
//! the recall of predictions against what the layers then chose.

use super::fetch::{Inflight, PrefetchRead};
use super::ExpertStore;
use moestream_io::Priority;
use std::sync::atomic::Ordering;

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
pub(super) struct PrefetchTally {
    pub(super) issued: u64,
    pub(super) issued_bytes: u64,
    pub(super) used: u64,
    pub(super) late: u64,
    pub(super) used_bytes: u64,
}

/// One layer's lookahead predictions (per variant) and their scores.
#[derive(Clone, Debug, Default)]
pub(super) struct LayerRecall {
    /// The guess per variant, and whether it awaits scoring (the vectors
    /// are reused, so predicting allocates nothing once grown).
    predicted: [(bool, Vec<usize>); 2],
    /// (experts predicted and chosen, experts chosen) per variant.
    score: [(u64, u64); 2],
}

impl ExpertStore {
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
        let wanted = self.uncached(layer, experts);
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
        drop(recall);
        self.trace_guess(layer, variant as usize, experts);
    }

    /// The lookahead's guess of `layer` from `variant` into `out`, if one
    /// awaits scoring (made for the token now being routed); whether one
    /// did.
    pub(super) fn pending_guess_into(
        &self,
        layer: usize,
        variant: Variant,
        out: &mut Vec<usize>,
    ) -> bool {
        let recall = self.recall.lock().expect("recall lock");
        let (pending, guess) = &recall[layer].predicted[variant as usize];
        out.clear();
        if *pending {
            out.extend_from_slice(guess);
        }
        *pending
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
}
