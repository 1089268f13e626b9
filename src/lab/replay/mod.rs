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
//! and a wrong guess costs its bytes; at depth 2 also the guess made two
//! layers before (the union, each expert read once, as the live
//! prefetcher skips reads already on their way); `oracle` reads exactly
//! the misses ahead. The live prefetcher's read budget and its per-rank
//! precision gate are not simulated: every guessed expert not cached is
//! read.
//!
//! Pinning ([`Pin`]) needs a usage history, which the runtime loads from
//! an earlier session: the replay takes each run's first half as that
//! history (its selections counted, nothing cached), then pins the
//! hottest experts of each layer as the store does ([`policy::hottest`],
//! the count by [`policy::pin_count`] or given) into an empty cache and
//! counts hits and misses over the second half only.
//!
//! The simulation allocates nothing per access: caches, usage counters
//! and the miss list are sized per layer before its fetches run.

pub mod knobs;
pub mod plot;
pub mod report;
pub mod setup;
pub mod train;

use crate::formats::trace::read::{Fetch, LayerTrace, Run};
use crate::store::cache::SlotCache;
use crate::store::policy::{self, Evictor, View};
use crate::store::usage::UsageTable;
use rayon::prelude::*;

pub use setup::{Pin, Prefetch, Setup};

/// Heats halve every this many tokens, as in the store.
pub use crate::store::HEAT_DECAY_TOKENS;

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
    /// Experts read ahead (a lookahead's guesses not cached, each once per
    /// fetch; the oracle's misses); their bytes are in `bytes_read`.
    pub prefetch_reads: u64,
    /// Prefetched bytes no lookup asked for.
    pub prefetch_wasted_bytes: u64,
    pub tokens: u64,
    /// Misses over Belady's at the same slots (filled by [`replay`]).
    pub ratio_to_belady: Option<f64>,
    /// Times a layer's cache changed its active policy (`auto`), and how
    /// many layers ended on each active policy.
    pub switches: u64,
    pub ended: std::collections::BTreeMap<String, usize>,
    /// Experts pinned, summed over runs and layers ([`Pin`]).
    pub pinned: u64,
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

/// A layer's empty cache of `slots` under `p`.
fn new_cache(l: &LayerTrace, slots: Slots, p: Box<dyn Evictor>) -> SlotCache<()> {
    match slots {
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
    }
}

/// Counts the selections of `fetches` (the history) into `usage`, as the
/// run that saved it did.
fn count_usage(l: &LayerTrace, fetches: &[Fetch], usage: &mut UsageTable) {
    for f in fetches {
        usage.tick(f.clock.saturating_sub(usage.clock()));
        for r in &l.rows[f.rows.clone()] {
            usage.record(0, &l.picks[r.clone()]);
        }
    }
}

/// Pins the `n` hottest experts of `usage` into the empty `cache`, as the
/// store pins a history's (their slots made usable first); returns how
/// many are pinned.
fn pin_hottest(cache: &mut SlotCache<()>, usage: &UsageTable, n: usize) -> u64 {
    let hot = policy::hottest(usage.layer(0), n);
    cache.grow(hot.len());
    let view = View {
        usage: usage.layer(0),
        now: usage.clock(),
    };
    for &e in &hot {
        cache.insert(e, (), view);
    }
    hot.iter().filter(|&&e| cache.pin(e)).count() as u64
}

/// The experts read ahead of fetch `f` (not cached, each once) into `ahead`.
fn read_ahead(
    l: &LayerTrace,
    f: &Fetch,
    prefetch: Prefetch,
    cache: &SlotCache<()>,
    ahead: &mut Vec<usize>,
) {
    ahead.clear();
    let Prefetch::Lookahead { from, depth } = prefetch else {
        return;
    };
    let deeper = if depth >= 2 { &f.deeper[from] } else { &None };
    for g in [&f.guess[from], deeper].into_iter().flatten() {
        for &e in &l.guesses[g.clone()] {
            if !cache.contains(e) && !ahead.contains(&e) {
                ahead.push(e);
            }
        }
    }
}

/// Simulates `layer` under `policy` with `slots`, adding to `out`; with
/// pins, fetches before token `split` are the history.
fn layer(l: &LayerTrace, name: &str, slots: Slots, setup: Setup, split: u64, out: &mut Outcome) {
    let n = l.n_experts.max(l.ids.iter().max().map_or(0, |&m| m + 1));
    let p = policy::build(name, n).expect("a known policy");
    let offline = p.offline();
    let mut cache = new_cache(l, slots, p);
    let mut usage = UsageTable::new(&[n], HEAT_DECAY_TOKENS);
    let first = match setup.pin {
        Pin::None => 0,
        _ => l.fetches.partition_point(|f| f.clock < split),
    };
    if setup.pin != Pin::None {
        count_usage(l, &l.fetches[..first], &mut usage);
        let top_k = l.rows.iter().map(|r| r.len()).max().unwrap_or(0);
        let want = setup.pin.count(cache.capacity(), split, top_k, n);
        out.pinned += pin_hottest(&mut cache, &usage, want);
    }
    let mut misses = Vec::with_capacity(n);
    let mut ahead = Vec::with_capacity(n);
    for f in &l.fetches[first..] {
        count_usage(l, std::slice::from_ref(f), &mut usage);
        let ids = &l.ids[f.ids.clone()];
        if offline {
            for (&e, &next) in ids.iter().zip(&l.next[f.ids.clone()]) {
                cache.hint_next(e, next);
            }
        }
        // A lookahead read is issued before the layer looks anything up.
        read_ahead(l, f, setup.prefetch, &cache, &mut ahead);
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
        count_reads(l, ids, &misses, &ahead, setup.prefetch, out);
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

/// Adds one fetch's stalls and reads to `out`: of its `misses`, those
/// `ahead` covered do not stall; every expert read ahead costs its bytes.
fn count_reads(
    l: &LayerTrace,
    ids: &[usize],
    misses: &[usize],
    ahead: &[usize],
    prefetch: Prefetch,
    out: &mut Outcome,
) {
    let covered = match prefetch {
        Prefetch::None => 0,
        Prefetch::Oracle => misses.len(),
        Prefetch::Lookahead { .. } => misses.iter().filter(|e| ahead.contains(e)).count(),
    };
    let wasted = ahead.iter().filter(|e| !ids.contains(e)).count();
    let demand = misses.len() - covered;
    out.demand_misses += demand as u64;
    let ahead_reads = match prefetch {
        Prefetch::None => 0,
        Prefetch::Oracle => misses.len(),
        Prefetch::Lookahead { .. } => ahead.len(),
    };
    out.prefetch_reads += ahead_reads as u64;
    let reads = demand + ahead_reads;
    // Saturating: the trace's byte counts are bounded
    // (`trace::read::EXPERT_BYTES_MAX`), their sums over a long trace
    // are not.
    let bytes = |n: usize| (n as u64).saturating_mul(l.expert_bytes);
    out.bytes_read = out.bytes_read.saturating_add(bytes(reads));
    out.prefetch_wasted_bytes = out.prefetch_wasted_bytes.saturating_add(bytes(wasted));
}

/// Simulates every run of the trace (each from empty caches and usage)
/// under `policy` with `slots`.
pub fn simulate(runs: &[Run], name: &str, slots: Slots, prefetch: Prefetch) -> Outcome {
    simulate_with(runs, name, slots, Setup::prefetch(prefetch))
}

/// [`simulate`] with pins: with any [`Pin`] but `None`, each run's first
/// half is the history and only its second half's tokens are counted.
pub fn simulate_with(runs: &[Run], name: &str, slots: Slots, setup: Setup) -> Outcome {
    let mut out = Outcome {
        policy: name.to_owned(),
        slots: slots.name(),
        ..Outcome::default()
    };
    for r in runs {
        let split = match setup.pin {
            Pin::None => 0,
            _ => r.tokens / 2,
        };
        out.tokens = out.tokens.saturating_add(r.tokens - split);
        for l in r.layers.iter().filter(|l| !l.fetches.is_empty()) {
            layer(l, name, slots, setup, split, &mut out);
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
    replay_with(runs, policies, slots, Setup::prefetch(prefetch))
}

/// [`replay`] with pins. Belady, the reference, pins nothing but replays
/// the same tokens (with pins, each run's second half).
pub fn replay_with(runs: &[Run], policies: &[&str], slots: &[Slots], setup: Setup) -> Vec<Outcome> {
    let reference = Setup {
        pin: match setup.pin {
            Pin::None => Pin::None,
            _ => Pin::Count(0),
        },
        ..setup
    };
    let mut jobs: Vec<(usize, &str, Setup)> = Vec::new();
    for (i, _) in slots.iter().enumerate() {
        for &p in policies {
            jobs.push((i, p, if p == "belady" { reference } else { setup }));
        }
        if !policies.contains(&"belady") {
            jobs.push((i, "belady", reference));
        }
    }
    let done: Vec<Outcome> = jobs
        .par_iter()
        .map(|&(i, p, s)| simulate_with(runs, p, slots[i], s))
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
        run_with(steps, &[])
    }

    /// [`run_of`] whose step `t` also has the depth-2 guesses `deeper[t]`
    /// (both variants; none past its end).
    fn run_with(steps: &[&[usize]], deeper: &[&[usize]]) -> Run {
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
            let guess = (t > 0).then_some(g0..l.guesses.len());
            let d0 = l.guesses.len();
            let deep = deeper.get(t).map(|d| {
                l.guesses.extend_from_slice(d);
                d0..l.guesses.len()
            });
            l.fetches.push(Fetch {
                clock: t as u64,
                slots: 2,
                ids: i0..l.ids.len(),
                rows: r0..l.rows.len(),
                guess: [guess.clone(), guess],
                deeper: [deep.clone(), deep],
            });
        }
        l.fill_next();
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
        let ahead = &replay(&runs, &["lru"], &s, Prefetch::ATTN)[0];
        assert_eq!((none.misses, oracle.misses, ahead.misses), (8, 8, 8));
        assert_eq!((none.demand_misses, oracle.demand_misses), (8, 0));
        assert_eq!((none.bytes_read, oracle.bytes_read), (800, 800));
        // The guess (last token's pair) is cached, so nothing is read ahead.
        assert_eq!((ahead.demand_misses, ahead.prefetch_wasted_bytes), (8, 0));
        // A trace whose guesses are right: every miss but the first is covered.
        let runs = [run_of(&[&[1], &[1], &[1]])];
        let one = &replay(&runs, &["lru"], &[Slots::Fixed(0)], Prefetch::ATTN)[0];
        assert_eq!((one.misses, one.demand_misses, one.bytes_read), (3, 1, 300));
    }

    #[test]
    fn depth_two_reads_the_union_of_both_guesses_once() {
        // Nothing cached (0 slots). The depth-1 guess (the previous step's
        // experts) is always wrong, the depth-2 one always right.
        let steps: [&[usize]; 4] = [&[1], &[2], &[3], &[4]];
        let runs = [run_with(&steps, &[&[], &[2], &[3], &[4]])];
        let s = [Slots::Fixed(0)];
        // (prefetch, demand misses, bytes read, bytes wasted)
        let table = [
            (Prefetch::None, 4, 400, 0),
            (Prefetch::ATTN, 4, 700, 300),
            (Prefetch::Lookahead { from: 1, depth: 1 }, 4, 700, 300),
            (Prefetch::Lookahead { from: 0, depth: 2 }, 1, 700, 300),
            (Prefetch::Lookahead { from: 1, depth: 2 }, 1, 700, 300),
            (Prefetch::Oracle, 0, 400, 0),
        ];
        for (p, demand, bytes, wasted) in table {
            let o = &replay(&runs, &["lru"], &s, p)[0];
            assert_eq!(o.misses, 4, "{}", p.name());
            let got = (o.demand_misses, o.bytes_read, o.prefetch_wasted_bytes);
            assert_eq!(got, (demand, bytes, wasted), "{}", p.name());
        }
        // Both guesses name the expert: it is read once.
        let runs = [run_with(&[&[1], &[1], &[1]], &[&[], &[1], &[1]])];
        let deep = Prefetch::Lookahead { from: 0, depth: 2 };
        let o = &replay(&runs, &["lru"], &s, deep)[0];
        assert_eq!((o.demand_misses, o.bytes_read), (1, 300));
        // A trace without depth-2 guesses reads at depth 2 what depth 1 reads.
        let runs = [run_of(&steps)];
        let (one, two) = (
            &replay(&runs, &["lru"], &s, Prefetch::ATTN)[0],
            &replay(&runs, &["lru"], &s, deep)[0],
        );
        assert_eq!(
            (one.demand_misses, one.bytes_read),
            (two.demand_misses, two.bytes_read)
        );
    }

    #[test]
    fn pins_come_from_the_first_half_and_count_the_second() {
        // History (tokens 0-3): expert 1 every token. Then, at 2 slots:
        // without pins LRU never hits; with 1 pinned, 1 hits twice.
        let steps: [&[usize]; 8] = [
            &[1, 2],
            &[1, 3],
            &[1, 4],
            &[1, 5],
            &[1, 2],
            &[3, 4],
            &[1, 5],
            &[6, 7],
        ];
        let runs = [run_of(&steps)];
        // (pin, pinned, hits, misses, tokens counted)
        let table = [
            (Pin::None, 0, 4, 12, 8), // the whole trace, nothing pinned
            (Pin::Count(0), 0, 0, 8, 4),
            (Pin::Count(1), 1, 2, 6, 4),
            (Pin::Count(5), 1, 2, 6, 4), // at most half of 2 slots
            (Pin::Share(50_00), 1, 2, 6, 4),
            // 4 tokens of top-2 of 8: 1 selection per expert, 1 · 1/9 → 0.
            (Pin::History, 0, 0, 8, 4),
        ];
        for (pin, pinned, hits, misses, tokens) in table {
            let setup = Setup {
                prefetch: Prefetch::None,
                pin,
            };
            let o = simulate_with(&runs, "lru", Slots::Fixed(2), setup);
            let got = (o.pinned, o.hits, o.misses, o.tokens);
            assert_eq!(got, (pinned, hits, misses, tokens), "{pin:?}");
        }
        // Belady, the reference, pins nothing over the same second half.
        let setup = Setup {
            prefetch: Prefetch::None,
            pin: Pin::Count(1),
        };
        let out = replay_with(&runs, &["lru", "belady"], &[Slots::Fixed(2)], setup);
        assert_eq!((out[1].pinned, out[1].tokens), (0, 4));
        let belady = out[1].misses as f64;
        assert_eq!(out[0].ratio_to_belady, Some(6.0 / belady));
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
