//! `auto`: each layer runs whichever of [`CANDIDATES`] would have missed
//! least on its own recent lookups (the [`Chooser`] decides). No single
//! policy wins on every routing (results/policies.md): least-stale leads
//! on drifting popularity (the synthetic realistic routings and both
//! calibrated presets), LFRU on stable popularity (both trained models).
//!
//! How it measures: beside the real cache, one key-only cache per
//! candidate (a ghost, `SlotCache<()>` with that candidate's policy and
//! the real cache's usable slots) is run over every fetch the layer makes,
//! before the real lookups ([`Evictor::on_fetch`]): the same lookups, then
//! its own misses inserted with the same usage view. Its misses are what
//! the candidate would have missed; the ghost of the active candidate
//! makes the real cache's decisions exactly (as long as nothing is
//! pinned), so the comparison is the live hit rate against the ones the
//! other candidates would have had.
//!
//! Switching costs nothing: the candidates keep no state of their own (they
//! read the slots and the usage view), so the residents stay and the next
//! eviction is simply the new candidate's. ARC, whose lists would have to
//! be rebuilt from the residents, is not a candidate (it never led on any
//! trace).
//!
//! Cost per fetch: each ghost scans its slots once per lookup and once per
//! own miss, as the real cache does; nothing is allocated per access (the
//! miss list is sized to the layer's experts once).

use super::chooser::Chooser;
use super::{EvictPolicy, Evictor, Slot, View};
use crate::store::cache::SlotCache;

/// What `auto` chooses among; it starts with the first.
pub const CANDIDATES: [EvictPolicy; 2] = [EvictPolicy::LeastStale, EvictPolicy::Lfru];

const N: usize = CANDIDATES.len();

/// The policy of the candidate its ghosts show best.
#[derive(Clone)]
pub struct Auto {
    /// Per candidate: its policy, as the real cache runs it when active.
    live: [Box<dyn Evictor>; N],
    /// Per candidate: the cache it would have had.
    ghosts: [SlotCache<()>; N],
    chooser: Chooser<N>,
    /// A ghost's misses of one fetch (capacity: the layer's experts).
    missed: Vec<usize>,
}

impl Auto {
    /// `auto` for a layer of `experts` experts.
    pub fn new(experts: usize) -> Auto {
        Auto {
            live: CANDIDATES.map(|p| p.build(experts)),
            ghosts: CANDIDATES.map(|p| SlotCache::gated(experts, 0, p.build(experts))),
            chooser: Chooser::new(0),
            missed: Vec::with_capacity(experts),
        }
    }

    /// The candidate active now.
    pub fn active_policy(&self) -> EvictPolicy {
        CANDIDATES[self.chooser.active()]
    }

    /// Misses of each candidate's ghost so far.
    pub fn ghost_misses(&self) -> [u64; N] {
        std::array::from_fn(|i| self.ghosts[i].counters.misses)
    }
}

impl Evictor for Auto {
    fn name(&self) -> &'static str {
        "auto"
    }

    fn active(&self) -> &'static str {
        self.active_policy().name()
    }

    fn switches(&self) -> u64 {
        self.chooser.switches()
    }

    fn victim(&self, incoming: usize, slots: &[Slot], view: View) -> Option<usize> {
        self.live[self.chooser.active()].victim(incoming, slots, view)
    }

    fn on_limit(&mut self, limit: usize) {
        for g in &mut self.ghosts {
            if g.is_empty() {
                g.gate(limit);
            } else {
                g.grow(limit.saturating_sub(g.limit()));
            }
        }
    }

    fn on_fetch(&mut self, keys: &[usize], view: View) {
        let mut misses = [0u64; N];
        for (g, m) in self.ghosts.iter_mut().zip(&mut misses) {
            self.missed.clear();
            for &k in keys {
                if g.get(k).is_none() {
                    self.missed.push(k);
                }
            }
            for &k in &self.missed {
                g.insert(k, (), view);
            }
            *m = self.missed.len() as u64;
        }
        self.chooser.step(misses, keys.len() as u64);
    }

    fn clone_box(&self) -> Box<dyn Evictor> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::super::table::{check, run, Case};
    use super::super::{build, View};
    use super::*;
    use crate::store::usage::UsageTable;

    #[test]
    fn starts_as_least_stale() {
        // Too few lookups to close a window: exactly least-stale's table.
        let table: [Case; 2] = [
            (2, &[&[1, 2], &[2], &[3], &[2]], 3, &[2, 3]),
            (2, &[&[2], &[1, 2], &[3], &[2]], 3, &[2, 3]),
        ];
        check("auto", &table);
    }

    /// Stable popularity: a scan of 12 experts, one a token, and two hot
    /// experts each every 4th token: recency evicts the hot ones before
    /// they return (least-stale misses them), heat keeps them (LFRU).
    fn hot_and_scan(tokens: usize) -> Vec<Vec<usize>> {
        (0..tokens)
            .map(|t| {
                let mut s = vec![2 + t % 12];
                match t % 4 {
                    0 => s.push(0),
                    2 => s.push(1),
                    _ => {}
                }
                s.sort_unstable();
                s
            })
            .collect()
    }

    /// Drifting popularity: 12 experts in turn, each chosen for 6 tokens in
    /// a row, a new one every 3 tokens: recency predicts, while every
    /// expert's heat is alike, so LFRU evicts the one half through its run.
    fn bursts(tokens: usize) -> Vec<Vec<usize>> {
        (0..tokens)
            .map(|t| {
                let mut s = vec![(t / 3) % 12, (t / 3 + 11) % 12];
                s.sort_unstable();
                s
            })
            .collect()
    }

    fn misses(policy: &str, slots: usize, steps: &[Vec<usize>]) -> u64 {
        let steps: Vec<&[usize]> = steps.iter().map(Vec::as_slice).collect();
        run(policy, slots, &steps).0
    }

    #[test]
    fn ends_near_the_better_candidate_of_each_regime() {
        let tokens = 4000;
        for (name, steps) in [("hot", hot_and_scan(tokens)), ("bursts", bursts(tokens))] {
            let ls = misses("least-stale", 3, &steps);
            let lfru = misses("lfru", 3, &steps);
            let auto = misses("auto", 3, &steps);
            let best = ls.min(lfru);
            assert!(ls != lfru, "{name}: the regime separates the candidates");
            assert!(
                auto as f64 <= best as f64 * 1.05,
                "{name}: auto {auto}, least-stale {ls}, lfru {lfru}"
            );
        }
    }

    #[test]
    fn the_active_ghost_makes_the_real_caches_decisions() {
        // Drive a real cache and check the active candidate's ghost holds
        // what it holds, fetch after fetch, switches included.
        let steps = hot_and_scan(3000);
        let experts = 16;
        let mut usage = UsageTable::new(&[experts], 256);
        let mut cache: SlotCache<()> = SlotCache::new(3, build("auto", experts).unwrap());
        let mut auto = Auto::new(experts);
        auto.on_limit(3);
        for step in &steps {
            usage.record(0, step);
            let view = View {
                usage: usage.layer(0),
                now: usage.clock(),
            };
            cache.observe(step, view);
            auto.on_fetch(step, view);
            let active = auto.chooser.active();
            let misses: Vec<usize> = step
                .iter()
                .copied()
                .filter(|&k| cache.get(k).is_none())
                .collect();
            for k in misses {
                cache.insert(k, (), view);
            }
            usage.tick(1);
            if auto.switches() == 0 {
                let mut a = cache.keys();
                let mut b = auto.ghosts[active].keys();
                a.sort_unstable();
                b.sort_unstable();
                assert_eq!(a, b);
            }
        }
        assert_eq!(cache.active_policy(), "lfru", "the hot expert's regime");
        assert_eq!(cache.policy_switches(), 1);
        assert_eq!(auto.active_policy(), EvictPolicy::Lfru);
    }
}
