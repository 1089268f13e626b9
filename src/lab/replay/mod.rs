//! Offline replay of a routing trace ([`crate::formats::trace`]) against eviction
//! policies: each layer's cache is simulated with the live cache's own
//! code (`SlotCache<()>` and the [`crate::store::policy`] objects), so a
//! replay with the run's policy and slots gives the run's hits and misses
//! exactly (when the run pinned nothing and started without a usage
//! history: both feed the live policies state the trace does not hold).
//!
//! Per fetch, as the store does it: the usage clock advances to the
//! fetch's forward, every row's selections are recorded in the usage
//! counters, the policy is told of the fetch (`auto` runs its ghosts
//! there), every expert of the union is looked up (in expert order),
//! then the misses are inserted in the same order. Belady is told, before
//! the lookups, when each expert is next looked up.
//!
//! Prefetch changes no hit or miss (prefetched experts land outside the
//! cache) but which misses stall and how many bytes are read: `none` reads
//! every miss on demand; `lookahead` reads the run's recorded guess for
//! the layer (those not cached) ahead, so a guessed miss costs no stall
//! and a wrong guess costs its bytes; `oracle` reads exactly the misses
//! ahead.
//!
//! The simulation allocates nothing per access: caches, usage counters
//! and the miss list are sized per layer before its fetches run.

pub mod knobs;
pub mod plot;
pub mod report;
pub mod train;

use crate::formats::trace::read::{LayerTrace, Run};
use crate::store::cache::SlotCache;
use crate::store::policy::{self, View};
use crate::store::usage::UsageTable;
use rayon::prelude::*;

/// Heats halve every this many tokens, as in the store.
pub use crate::store::HEAT_DECAY_TOKENS;

/// How misses reach the cache in the simulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefetch {
    /// Every miss is a demand read.
    None,
    /// The run's lookahead guess of the variant (0 = attn, 1 = output) is
    /// read ahead.
    Lookahead(usize),
    /// Exactly the misses are read ahead (the best any prefetch can do).
    Oracle,
}

impl Prefetch {
    /// `none`, `lookahead` (the attn guess, as `--prefetch on` reads it),
    /// `lookahead:attn`, `lookahead:output` or `oracle`.
    pub fn parse(s: &str) -> Option<Prefetch> {
        match s {
            "none" => Some(Prefetch::None),
            "lookahead" | "lookahead:attn" => Some(Prefetch::Lookahead(0)),
            "lookahead:output" => Some(Prefetch::Lookahead(1)),
            "oracle" => Some(Prefetch::Oracle),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Prefetch::None => "none",
            Prefetch::Lookahead(0) => "lookahead",
            Prefetch::Lookahead(_) => "lookahead:output",
            Prefetch::Oracle => "oracle",
        }
    }
}

/// Cache slots per layer in a simulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slots {
    /// This many (at most the layer's experts), all usable.
    Fixed(usize),
    /// What the run had: each fetch's recorded usable slots.
    Traced,
}

impl Slots {
    pub fn name(self) -> String {
        match self {
            Slots::Fixed(n) => n.to_string(),
            Slots::Traced => "trace".to_owned(),
        }
    }
}

/// What one policy did with one slot count over the trace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    pub policy: String,
    pub slots: String,
    pub hits: u64,
    pub misses: u64,
    /// Misses no prefetch covered (compute waits on them).
    pub demand_misses: u64,
    /// Demand and prefetch reads, bytes.
    pub bytes_read: u64,
    /// Prefetched bytes no lookup asked for.
    pub prefetch_wasted_bytes: u64,
    pub tokens: u64,
    /// Misses over Belady's at the same slots (filled by [`replay`]).
    pub ratio_to_belady: Option<f64>,
    /// Times a layer's cache changed its active policy (`auto`), and how
    /// many layers ended on each active policy.
    pub switches: u64,
    pub ended: std::collections::BTreeMap<String, usize>,
}

impl Outcome {
    pub fn accesses(&self) -> u64 {
        self.hits + self.misses
    }

    /// Whether the policy chose among others (some layer ended on another
    /// policy, or switched).
    pub fn chose(&self) -> bool {
        self.switches > 0 || self.ended.keys().any(|p| *p != self.policy)
    }

    pub fn hit_rate(&self) -> f64 {
        per(self.hits, self.accesses())
    }

    pub fn misses_per_token(&self) -> f64 {
        per(self.misses, self.tokens)
    }

    pub fn bytes_per_token(&self) -> f64 {
        per(self.bytes_read, self.tokens)
    }
}

fn per(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// Simulates `layer` under `policy` with `slots`, adding to `out`.
fn layer(l: &LayerTrace, name: &str, slots: Slots, prefetch: Prefetch, out: &mut Outcome) {
    let n = l.n_experts.max(l.ids.iter().max().map_or(0, |&m| m + 1));
    let p = policy::build(name, n).expect("a known policy");
    let offline = p.offline();
    let mut cache: SlotCache<()> = match slots {
        Slots::Fixed(s) => SlotCache::new(s.min(l.n_experts.max(1)), p),
        Slots::Traced => {
            let cap = l
                .fetches
                .iter()
                .map(|f| f.slots as usize)
                .max()
                .unwrap_or(0);
            SlotCache::gated(cap, 0, p)
        }
    };
    let mut usage = UsageTable::new(&[n], HEAT_DECAY_TOKENS);
    let mut misses = Vec::with_capacity(n);
    let mut ahead = Vec::with_capacity(n);
    for f in &l.fetches {
        usage.tick(f.clock.saturating_sub(usage.clock()));
        for r in &l.rows[f.rows.clone()] {
            usage.record(0, &l.picks[r.clone()]);
        }
        let ids = &l.ids[f.ids.clone()];
        if offline {
            for (&e, &next) in ids.iter().zip(&l.next[f.ids.clone()]) {
                cache.hint_next(e, next);
            }
        }
        // A lookahead read is issued before the layer looks anything up.
        ahead.clear();
        if let Prefetch::Lookahead(v) = prefetch {
            if let Some(g) = &f.guess[v] {
                ahead.extend(l.guesses[g.clone()].iter().filter(|&&e| !cache.contains(e)));
            }
        }
        cache.observe(
            ids,
            View {
                usage: usage.layer(0),
                now: usage.clock(),
            },
        );
        misses.clear();
        for &e in ids {
            if cache.get(e).is_none() {
                misses.push(e);
            }
        }
        let covered = match prefetch {
            Prefetch::None => 0,
            Prefetch::Oracle => misses.len(),
            Prefetch::Lookahead(_) => misses.iter().filter(|e| ahead.contains(e)).count(),
        };
        let wasted = ahead.iter().filter(|e| !ids.contains(e)).count();
        let demand = misses.len() - covered;
        out.demand_misses += demand as u64;
        let reads = match prefetch {
            Prefetch::Lookahead(_) => demand + ahead.len(),
            _ => misses.len(),
        };
        // Saturating: the trace's byte counts are bounded
        // (`trace::read::EXPERT_BYTES_MAX`), their sums over a long trace
        // are not.
        let bytes = |n: usize| (n as u64).saturating_mul(l.expert_bytes);
        out.bytes_read = out.bytes_read.saturating_add(bytes(reads));
        out.prefetch_wasted_bytes = out.prefetch_wasted_bytes.saturating_add(bytes(wasted));
        if slots == Slots::Traced {
            cache.grow((f.slots as usize).saturating_sub(cache.limit()));
        }
        let view = View {
            usage: usage.layer(0),
            now: usage.clock(),
        };
        for &e in &misses {
            cache.insert(e, (), view);
        }
    }
    out.hits += cache.counters.hits + cache.counters.pinned_hits;
    out.misses += cache.counters.misses;
    out.switches += cache.policy_switches();
    *out.ended
        .entry(cache.active_policy().to_owned())
        .or_default() += 1;
}

/// Simulates every run of the trace (each from empty caches and usage)
/// under `policy` with `slots`.
pub fn simulate(runs: &[Run], name: &str, slots: Slots, prefetch: Prefetch) -> Outcome {
    let mut out = Outcome {
        policy: name.to_owned(),
        slots: slots.name(),
        ..Outcome::default()
    };
    for r in runs {
        out.tokens = out.tokens.saturating_add(r.tokens);
        for l in r.layers.iter().filter(|l| !l.fetches.is_empty()) {
            layer(l, name, slots, prefetch, &mut out);
        }
    }
    out
}

/// Every policy at every slot count (in parallel), each with its ratio to
/// Belady's misses at the same slots (Belady is simulated whether asked
/// for or not). Outcomes come slot count by slot count, policies in the
/// order given.
pub fn replay(
    runs: &[Run],
    policies: &[&str],
    slots: &[Slots],
    prefetch: Prefetch,
) -> Vec<Outcome> {
    let mut jobs: Vec<(usize, &str)> = Vec::new();
    for (i, _) in slots.iter().enumerate() {
        for &p in policies {
            jobs.push((i, p));
        }
        if !policies.contains(&"belady") {
            jobs.push((i, "belady"));
        }
    }
    let done: Vec<Outcome> = jobs
        .par_iter()
        .map(|&(i, p)| simulate(runs, p, slots[i], prefetch))
        .collect();
    let mut out = Vec::new();
    for (i, s) in slots.iter().enumerate() {
        let belady = done
            .iter()
            .zip(&jobs)
            .find(|(_, j)| j.0 == i && j.1 == "belady")
            .map(|(o, _)| o.misses)
            .expect("belady runs at every slot count");
        for &p in policies {
            let mut o = done
                .iter()
                .zip(&jobs)
                .find(|(_, j)| j.0 == i && j.1 == p)
                .map(|(o, _)| o.clone())
                .expect("every job ran");
            debug_assert_eq!(o.slots, s.name());
            o.ratio_to_belady = Some(match (o.misses, belady) {
                (0, 0) => 1.0,
                (m, b) => m as f64 / b as f64,
            });
            out.push(o);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::trace::read::Fetch;

    /// One layer of 8 experts whose fetches are `steps` (one token each).
    fn run_of(steps: &[&[usize]]) -> Run {
        let mut l = LayerTrace {
            n_experts: 8,
            expert_bytes: 100,
            ..LayerTrace::default()
        };
        for (t, s) in steps.iter().enumerate() {
            let (i0, r0, g0) = (l.ids.len(), l.rows.len(), l.guesses.len());
            l.ids.extend_from_slice(s);
            let p0 = l.picks.len();
            l.picks.extend_from_slice(s);
            l.rows.push(p0..l.picks.len());
            // The guess: the previous step's experts.
            if t > 0 {
                l.guesses.extend_from_slice(steps[t - 1]);
            }
            l.fetches.push(Fetch {
                clock: t as u64,
                slots: 2,
                ids: i0..l.ids.len(),
                rows: r0..l.rows.len(),
                guess: [(t > 0).then_some(g0..l.guesses.len()), None],
            });
        }
        let mut next = vec![u64::MAX; l.ids.len()];
        for (f, fetch) in l.fetches.iter().enumerate() {
            for k in fetch.ids.clone() {
                next[k] = (f + 1..l.fetches.len())
                    .find(|&g| l.ids[l.fetches[g].ids.clone()].contains(&l.ids[k]))
                    .map_or(u64::MAX, |g| g as u64);
            }
        }
        l.next = next;
        Run {
            id: "r".into(),
            tokens: steps.len() as u64,
            layers: vec![LayerTrace::default(), l],
            ..Run::default()
        }
    }

    #[test]
    fn ratios_are_to_belady_at_the_same_slots() {
        let runs = [run_of(&[&[1, 2], &[3], &[1, 2], &[3], &[1, 2], &[3]])];
        let out = replay(
            &runs,
            &["lru", "belady"],
            &[Slots::Fixed(2), Slots::Fixed(3)],
            Prefetch::None,
        );
        let got: Vec<(&str, &str, u64, u64)> = out
            .iter()
            .map(|o| (o.policy.as_str(), o.slots.as_str(), o.hits, o.misses))
            .collect();
        // 2 slots: LRU hits twice (2 in step 2, 1 in step 4); Belady
        // keeps 1 and 2 and lets 3 pass the cache.
        // 3 slots: everything fits after the first 3 misses.
        assert_eq!(
            got,
            [
                ("lru", "2", 2, 7),
                ("belady", "2", 4, 5),
                ("lru", "3", 6, 3),
                ("belady", "3", 6, 3)
            ]
        );
        assert_eq!(out[0].ratio_to_belady, Some(1.4));
        assert_eq!(out[2].ratio_to_belady, Some(1.0));
        assert_eq!(out[0].bytes_read, 700);
        assert_eq!(out[0].tokens, 6);
    }

    #[test]
    fn prefetch_moves_stalls_and_bytes_not_misses() {
        // Alternating pairs: the previous token's experts are never right.
        let runs = [run_of(&[&[1, 2], &[3, 4], &[1, 2], &[3, 4]])];
        let s = [Slots::Fixed(2)];
        let none = &replay(&runs, &["lru"], &s, Prefetch::None)[0];
        let oracle = &replay(&runs, &["lru"], &s, Prefetch::Oracle)[0];
        let ahead = &replay(&runs, &["lru"], &s, Prefetch::Lookahead(0))[0];
        assert_eq!((none.misses, oracle.misses, ahead.misses), (8, 8, 8));
        assert_eq!((none.demand_misses, oracle.demand_misses), (8, 0));
        assert_eq!((none.bytes_read, oracle.bytes_read), (800, 800));
        // The guess (last token's pair) is cached, so nothing is read ahead.
        assert_eq!((ahead.demand_misses, ahead.prefetch_wasted_bytes), (8, 0));
        // A trace whose guesses are right: every miss but the first is covered.
        let runs = [run_of(&[&[1], &[1], &[1]])];
        let one = &replay(&runs, &["lru"], &[Slots::Fixed(0)], Prefetch::Lookahead(0))[0];
        assert_eq!((one.misses, one.demand_misses, one.bytes_read), (3, 1, 300));
    }

    #[test]
    fn traced_slots_follow_the_recorded_limits() {
        let runs = [run_of(&[&[1], &[2], &[1], &[2]])];
        let traced = simulate(&runs, "lru", Slots::Traced, Prefetch::None);
        let fixed = simulate(&runs, "lru", Slots::Fixed(2), Prefetch::None);
        assert_eq!((traced.hits, traced.misses), (fixed.hits, fixed.misses));
        assert_eq!((traced.hits, traced.misses), (2, 2));
    }
}
