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

/// Ranks of a guess that get precision counts (guesses past it count in
/// the last).
pub(super) const RANKS_MAX: usize = 64;
/// A guess rank with fewer scored guesses than this is read ahead anyway.
const RANK_SAMPLES_MIN: u64 = 16;
/// A guess rank right less often than this is not read ahead. Disk-bound,
/// a right guess saves about one read's stall and a wrong one costs one
/// read's disk time, so the break-even precision is about one half.
const RANK_PRECISION_MIN: f64 = 0.5;

/// (guesses right, guesses scored) per variant and rank (the lookahead's
/// guesses come best first).
#[derive(Clone, Debug)]
pub(crate) struct RankTally([[(u64, u64); RANKS_MAX]; 2]);

impl Default for RankTally {
    fn default() -> Self {
        RankTally([[(0, 0); RANKS_MAX]; 2])
    }
}

/// Whether guesses at a rank right `hit` times of `scored` are worth
/// reading ahead: until `RANK_SAMPLES_MIN` are scored, yes; then when
/// their precision reaches `RANK_PRECISION_MIN`.
fn confident(hit: u64, scored: u64) -> bool {
    scored < RANK_SAMPLES_MIN || hit as f64 >= RANK_PRECISION_MIN * scored as f64
}

impl ExpertStore {
    /// Reads ahead the guesses of `experts` (a lookahead's guess of
    /// `layer` from `variant`, best first) at the ranks whose guesses have
    /// been right often enough ([`confident`]); see [`Self::prefetch`].
    pub fn prefetch_ranked(&self, layer: usize, variant: Variant, experts: &[usize]) {
        // On the stack: a guess is at most top-k long (≤ RANKS_MAX here;
        // longer ones are cut, as their ranks share the last count).
        let mut keep = [0usize; RANKS_MAX];
        let mut kept = 0;
        let ranks = self.ranks.lock().expect("rank lock");
        let tally = &ranks.0[variant as usize];
        for (r, &e) in experts.iter().take(RANKS_MAX).enumerate() {
            let (hit, scored) = tally[r];
            if confident(hit, scored) {
                keep[kept] = e;
                kept += 1;
            }
        }
        drop(ranks);
        self.prefetch(layer, &keep[..kept]);
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
        let mut ranks = self.ranks.lock().expect("rank lock");
        let r = &mut recall[layer];
        for v in Variant::ALL {
            let (pending, guess) = &mut r.predicted[v as usize];
            if std::mem::take(pending) {
                let hit = chosen.iter().filter(|e| guess.contains(e)).count();
                r.score[v as usize].0 += hit as u64;
                r.score[v as usize].1 += chosen.len() as u64;
                for (rank, e) in guess.iter().enumerate() {
                    let t = &mut ranks.0[v as usize][rank.min(RANKS_MAX - 1)];
                    t.0 += u64::from(chosen.contains(e));
                    t.1 += 1;
                }
            }
        }
    }

    /// The precision of the lookahead's guesses by rank (best first), per
    /// variant: `None` for a rank never scored.
    pub fn rank_precision(&self, variant: Variant) -> Vec<Option<f64>> {
        let ranks = self.ranks.lock().expect("rank lock");
        ranks.0[variant as usize]
            .iter()
            .map(|&(hit, n)| (n > 0).then(|| hit as f64 / n as f64))
            .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_is_read_ahead_until_measured_then_by_its_precision() {
        // (right, scored, read ahead)
        let table = [
            (0, 0, true),
            (0, RANK_SAMPLES_MIN - 1, true),
            (0, RANK_SAMPLES_MIN, false),
            (8, 16, true),
            (7, 16, false),
            (90, 100, true),
            (49, 100, false),
            (50, 100, true),
        ];
        for (hit, scored, want) in table {
            assert_eq!(confident(hit, scored), want, "{hit} of {scored}");
        }
    }
}
