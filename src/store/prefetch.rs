//! Router-lookahead prefetch: which state predicts the next layers'
//! experts ([`Lookahead`], [`Variant`]), the low-priority reads of a
//! prediction ([`Prefetcher`]: landing outside the cache until a layer
//! asks for them), and the recall of predictions against what the layers
//! then chose ([`Recall`], an observer of every single-token fetch).

use super::fetch::{Inflight, PrefetchRead};
use super::layout::Experts;
use super::stats::Stats;
use moestream_io::{Priority, ReadService};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

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
struct RankTally([[(u64, u64); RANKS_MAX]; 2]);

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

/// The lookahead's reads in flight: per layer, its prefetch reads not yet
/// consumed, with the bound on how many live at once and their counts.
pub(crate) struct Prefetcher {
    /// Per layer, its prefetch reads not yet consumed.
    prefetched: Vec<Mutex<Vec<PrefetchRead>>>,
    /// Prefetch reads issued and not yet consumed or dropped, all layers.
    live: AtomicUsize,
}

impl Prefetcher {
    pub(crate) fn new(layers: usize) -> Prefetcher {
        Prefetcher {
            prefetched: (0..layers).map(|_| Mutex::new(Vec::new())).collect(),
            live: AtomicUsize::new(0),
        }
    }

    /// Takes every prefetch read of `layer` (its fetch consumes or drops
    /// them).
    pub(crate) fn take(&self, layer: usize) -> Vec<PrefetchRead> {
        let taken = std::mem::take(&mut *self.prefetched[layer].lock().expect("prefetch lock"));
        self.live.fetch_sub(taken.len(), Ordering::Relaxed);
        taken
    }

    /// Starts low-priority reads of `wanted` (experts of `layer` its cache
    /// does not hold), skipping those already on their way, while fewer
    /// than `max` reads of this prefetcher are live; counts them in
    /// `stats` (as early reads with `early`, see
    /// [`super::ExpertStore::read_early`]). Returns how many it started.
    pub(crate) fn issue(
        &self,
        layer: usize,
        wanted: Vec<usize>,
        (max, early): (usize, bool),
        (experts, reads, stats): (&Experts, &dyn ReadService, &Stats),
    ) -> usize {
        let mut started = 0;
        let mut pf = self.prefetched[layer].lock().expect("prefetch lock");
        for e in wanted {
            if pf.iter().any(|p| p.expert == e) {
                continue;
            }
            if self.live.load(Ordering::Relaxed) >= max {
                break;
            }
            let read = Inflight::submit(experts, reads, layer, vec![e], Priority::Prefetch);
            if early {
                stats.early_issued(read.bytes[0]);
            } else {
                stats.prefetch_issued(read.bytes[0]);
            }
            self.live.fetch_add(1, Ordering::Relaxed);
            started += 1;
            pf.push(PrefetchRead {
                expert: e,
                read,
                ready: None,
                early,
            });
        }
        started
    }
}

/// The lookahead's predictions and how often they come true: per layer
/// the guesses awaiting scoring and their recall, and per variant the
/// precision of each guess rank.
#[derive(Default)]
pub(crate) struct Recall(Mutex<RecallState>);

#[derive(Default)]
struct RecallState {
    layers: Vec<LayerRecall>,
    ranks: RankTally,
}

impl Recall {
    pub(crate) fn new(layers: usize) -> Recall {
        Recall(Mutex::new(RecallState {
            layers: vec![LayerRecall::default(); layers],
            ranks: RankTally::default(),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RecallState> {
        self.0.lock().expect("recall lock")
    }

    /// Of `experts` (a guess, best first), those at the ranks whose guesses
    /// have been right often enough ([`confident`]), into `keep`; returns
    /// how many. A guess is at most top-k long (≤ RANKS_MAX here; longer
    /// ones are cut, as their ranks share the last count).
    pub(crate) fn confident_ranks(
        &self,
        variant: Variant,
        experts: &[usize],
        keep: &mut [usize; RANKS_MAX],
    ) -> usize {
        let state = self.lock();
        let tally = &state.ranks.0[variant as usize];
        let mut kept = 0;
        for (r, &e) in experts.iter().take(RANKS_MAX).enumerate() {
            let (hit, scored) = tally[r];
            if confident(hit, scored) {
                keep[kept] = e;
                kept += 1;
            }
        }
        kept
    }

    /// Records a lookahead prediction of `layer`'s experts (scored when the
    /// layer routes its next single token).
    pub(crate) fn predict(&self, layer: usize, variant: Variant, experts: &[usize]) {
        let mut state = self.lock();
        let (pending, guess) = &mut state.layers[layer].predicted[variant as usize];
        guess.clear();
        guess.extend_from_slice(experts);
        *pending = true;
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
        let state = self.lock();
        let (pending, guess) = &state.layers[layer].predicted[variant as usize];
        out.clear();
        if *pending {
            out.extend_from_slice(guess);
        }
        *pending
    }

    /// Scores the pending predictions of `layer` against the experts it
    /// chose.
    pub(crate) fn score(&self, layer: usize, chosen: &[usize]) {
        let mut state = self.lock();
        let RecallState { layers, ranks } = &mut *state;
        let r = &mut layers[layer];
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

    /// See [`super::ExpertStore::rank_precision`].
    pub(crate) fn rank_precision(&self, variant: Variant) -> Vec<Option<f64>> {
        self.lock().ranks.0[variant as usize]
            .iter()
            .map(|&(hit, n)| (n > 0).then(|| hit as f64 / n as f64))
            .collect()
    }

    /// See [`super::ExpertStore::recall`].
    pub(crate) fn per_layer(&self) -> Vec<[Option<f64>; 2]> {
        self.lock()
            .layers
            .iter()
            .map(|r| {
                r.score
                    .map(|(hit, all)| (all > 0).then(|| hit as f64 / all as f64))
            })
            .collect()
    }

    /// See [`super::ExpertStore::recall_totals`].
    pub(crate) fn totals(&self) -> [(u64, u64); 2] {
        let mut t = [(0, 0); 2];
        for r in self.lock().layers.iter() {
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
