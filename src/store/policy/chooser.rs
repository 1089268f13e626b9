//! Which of a few eviction policies a layer's cache should run, chosen
//! from measured misses: the pure decision of `--policy auto`
//! ([`super::Auto`]). No single policy wins on every routing
//! (results/policies.md: least-stale leads where popularity drifts, LFRU
//! where it is stable), so each layer measures, on the lookups it actually
//! sees, how many misses every candidate would have had with the layer's
//! slots, and runs the one with the fewest.
//!
//! The chooser sees only counts: per step (one layer fetch), each
//! candidate's misses and the lookups. Misses are summed over windows of
//! [`WINDOW_LOOKUPS`] lookups; at each window's end a candidate's score
//! loses a quarter ([`DECAY_SHIFT`]) and gains the window's misses (a
//! memory of about four windows: long enough that windows alternating
//! between two candidates do not move the choice, short enough that a
//! change of regime is followed within a few windows).
//! The active candidate changes only at a window's end, only after
//! [`DWELL_WINDOWS`] windows with it, and only to a candidate whose score
//! is lower by more than 1/2^[`MARGIN_SHIFT`] of the active one's and by at
//! least [`MARGIN_MISSES`]: two candidates that miss alike never flap.
//!
//! Invariants: `active < N`; the score of a candidate never missing is 0;
//! the decision depends only on the sequence of steps (integers only), so
//! a replay of a trace makes the live run's choices.

/// Lookups a window holds before its misses enter the scores and the
/// choice is reconsidered (16 tokens of a top-4 layer, 8 of a top-8 one).
/// Chosen on the replays of results/policies.md: 256 followed the same
/// choices but late, which cost short traces up to 10% more misses.
pub const WINDOW_LOOKUPS: u64 = 64;

/// At each window's end a score loses `score >> DECAY_SHIFT` (a quarter).
pub const DECAY_SHIFT: u32 = 2;

/// A switch needs the best score lower than the active one's by more than
/// `active >> MARGIN_SHIFT` (1/16: 6%).
pub const MARGIN_SHIFT: u32 = 4;

/// ... and by at least this many misses (so a handful of misses in a
/// nearly all-hit layer does not move it).
pub const MARGIN_MISSES: u64 = 8;

/// Windows the active candidate runs at least before the next switch.
pub const DWELL_WINDOWS: u32 = 2;

/// The choice among `N` candidates, by index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chooser<const N: usize> {
    active: usize,
    /// Misses, decayed at every window's end before the window's are added.
    score: [u64; N],
    /// Misses in the open window.
    window: [u64; N],
    /// Lookups in the open window.
    lookups: u64,
    /// Windows closed since the last switch (or the start).
    dwell: u32,
    switches: u64,
}

impl<const N: usize> Chooser<N> {
    /// A chooser running candidate `active` first.
    pub fn new(active: usize) -> Chooser<N> {
        assert!(active < N, "the first candidate is one of the {N}");
        Chooser {
            active,
            score: [0; N],
            window: [0; N],
            lookups: 0,
            dwell: 0,
            switches: 0,
        }
    }

    /// The candidate to run now.
    pub fn active(&self) -> usize {
        self.active
    }

    /// Switches so far.
    pub fn switches(&self) -> u64 {
        self.switches
    }

    /// The scores of the last closed window (lower is better).
    pub fn scores(&self) -> [u64; N] {
        self.score
    }

    /// One step: `lookups` lookups, of which candidate `i` would have
    /// missed `misses[i]`. Returns whether the active candidate changed.
    pub fn step(&mut self, misses: [u64; N], lookups: u64) -> bool {
        for (w, m) in self.window.iter_mut().zip(misses) {
            *w += m;
        }
        self.lookups += lookups;
        if self.lookups < WINDOW_LOOKUPS {
            return false;
        }
        for (s, w) in self.score.iter_mut().zip(&mut self.window) {
            *s = *s - (*s >> DECAY_SHIFT) + std::mem::take(w);
        }
        self.lookups = 0;
        self.dwell = self.dwell.saturating_add(1);
        let best = self.best();
        if self.dwell < DWELL_WINDOWS || !self.beats(best) {
            return false;
        }
        self.active = best;
        self.dwell = 0;
        self.switches += 1;
        true
    }

    /// The candidate of the lowest score, the active one among equals,
    /// then the lowest index.
    fn best(&self) -> usize {
        (0..N)
            .min_by_key(|&i| (self.score[i], i != self.active, i))
            .expect("at least one candidate")
    }

    /// Whether candidate `i` is better than the active one by the margin.
    fn beats(&self, i: usize) -> bool {
        let (a, b) = (self.score[self.active], self.score[i]);
        let gain = a.saturating_sub(b);
        gain > a >> MARGIN_SHIFT && gain >= MARGIN_MISSES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `windows` whole windows, candidate misses per window as given
    /// (one step per window), and returns the active candidate after each.
    fn run<const N: usize>(first: usize, windows: &[[u64; N]]) -> (Vec<usize>, u64) {
        let mut c = Chooser::<N>::new(first);
        let active = windows
            .iter()
            .map(|&m| {
                c.step(m, WINDOW_LOOKUPS);
                c.active()
            })
            .collect();
        (active, c.switches())
    }

    #[test]
    fn switches_to_the_candidate_that_misses_less_after_the_dwell() {
        // (first, per-window misses, active after each window, switches)
        type Row = (usize, &'static [[u64; 2]], &'static [usize], u64);
        let table: [Row; 7] = [
            // 1 misses 20% less: the switch waits for the second window.
            (0, &[[100, 80], [100, 80], [100, 80]], &[0, 1, 1], 1),
            // Equal misses: never moves.
            (
                0,
                &[[90, 90], [90, 90], [90, 90], [90, 90]],
                &[0, 0, 0, 0],
                0,
            ),
            // 5% better is inside the margin (1/16 of the active score).
            (
                0,
                &[[100, 95], [100, 95], [100, 95], [100, 95]],
                &[0, 0, 0, 0],
                0,
            ),
            // 10% better is outside it.
            (0, &[[100, 90], [100, 90], [100, 90]], &[0, 1, 1], 1),
            // A large relative gain of few misses is not enough.
            (
                0,
                &[[2, 1], [2, 1], [2, 1], [2, 1], [2, 1]],
                &[0, 0, 0, 0, 0],
                0,
            ),
            // The active one is already the best.
            (1, &[[100, 50], [100, 50], [100, 50]], &[1, 1, 1], 0),
            // Nothing missed at all.
            (0, &[[0, 0], [0, 0], [0, 0]], &[0, 0, 0], 0),
        ];
        for (first, windows, want, switches) in table {
            assert_eq!(
                run(first, windows),
                (want.to_vec(), switches),
                "{first} {windows:?}"
            );
        }
    }

    #[test]
    fn follows_a_change_of_regime_without_flapping() {
        // 1 is better for 4 windows, then 0 for 6, then they tie for 6.
        let mut w = vec![[100, 70]; 4];
        w.extend([[60, 100]; 6]);
        w.extend([[80, 80]; 6]);
        let (active, switches) = run(0, &w);
        // The first window of the new regime already switches back: the
        // old regime's lead has decayed by then.
        assert_eq!(active, [0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(switches, 2);
        // Alternating windows: the memory averages them, so after the
        // first decision the active candidate stays.
        let w: Vec<[u64; 2]> = (0..16)
            .map(|i| if i % 2 == 0 { [100, 80] } else { [80, 100] })
            .collect();
        let (active, switches) = run(0, &w);
        assert_eq!(switches, 1, "{active:?}");
    }

    #[test]
    fn a_window_closes_only_after_its_lookups() {
        let mut c = Chooser::<2>::new(0);
        // Two windows' worth of misses arrive in small steps; nothing is
        // decided until the first window's lookups are in.
        for _ in 0..WINDOW_LOOKUPS / 8 - 1 {
            assert!(!c.step([8, 0], 8));
        }
        assert_eq!(c.scores(), [0, 0]);
        assert!(!c.step([8, 0], 8));
        assert_eq!(c.scores(), [WINDOW_LOOKUPS, 0]);
        for _ in 0..WINDOW_LOOKUPS / 8 - 1 {
            assert!(!c.step([8, 0], 8));
        }
        assert!(c.step([8, 0], 8), "the second window switches");
        assert_eq!((c.active(), c.switches()), (1, 1));
        assert_eq!(c.scores(), [WINDOW_LOOKUPS * 7 / 4, 0]);
    }

    #[test]
    fn three_candidates_pick_the_best_and_ties_keep_the_active() {
        let (active, _) = run(0, &[[100, 60, 50], [100, 60, 50]]);
        assert_eq!(active, [0, 2]);
        let (active, _) = run(2, &[[50, 50, 50], [50, 50, 50], [40, 40, 50]]);
        assert_eq!(active, [2, 2, 0], "equal best: the lowest index");
    }
}
