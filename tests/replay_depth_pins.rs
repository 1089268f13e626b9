//! Prefetch depth 2 and pinning in the replay (docs/TRACE.md, Replay).
//! Depth 2 reads what depth 1 reads plus, within its allowance (the guess
//! from two layers back), the experts that guess adds, each once, and
//! every read is counted in `bytes_read`. `--pin N` pins N experts per
//! layer, the first half's hottest, and they never miss in the second
//! half. Bad `--prefetch` / `--pin` values are refused naming the flag.

mod common;

use common::moestream;
use moestream::formats::trace::read::{Fetch, LayerTrace, Run};
use moestream::lab::replay::{simulate, simulate_with, Outcome, Pin, Prefetch, Setup, Slots};
use proptest::prelude::*;
use std::ops::Range;

/// Bytes one expert costs in these traces.
const EXPERT_BYTES: u64 = 100;

/// One token of a layer: its selections and the lookahead's guesses from
/// one and from two layers back (both variants the same).
#[derive(Clone, Debug)]
struct Step {
    picks: Vec<usize>,
    guess: Option<Vec<usize>>,
    deeper: Option<Vec<usize>>,
}

fn step(picks: &[usize]) -> Step {
    Step {
        picks: picks.to_vec(),
        guess: None,
        deeper: None,
    }
}

/// `list` appended to `to`; its range there.
fn push(to: &mut Vec<usize>, list: &Option<Vec<usize>>) -> Option<Range<usize>> {
    let g = list.as_ref()?;
    let start = to.len();
    to.extend_from_slice(g);
    Some(start..to.len())
}

/// A layer of `experts` experts, one fetch (one row) per step.
fn layer_of(steps: &[Step], experts: usize) -> LayerTrace {
    let mut l = LayerTrace {
        n_experts: experts,
        expert_bytes: EXPERT_BYTES,
        ..LayerTrace::default()
    };
    for (t, s) in steps.iter().enumerate() {
        let mut ids = s.picks.clone();
        ids.sort_unstable();
        ids.dedup();
        let (i0, r0, p0) = (l.ids.len(), l.rows.len(), l.picks.len());
        l.ids.extend(ids);
        l.picks.extend_from_slice(&s.picks);
        l.rows.push(p0..l.picks.len());
        let guess = push(&mut l.guesses, &s.guess);
        let deeper = push(&mut l.guesses, &s.deeper);
        l.fetches.push(Fetch {
            clock: t as u64,
            slots: experts as u32,
            ids: i0..l.ids.len(),
            rows: r0..l.rows.len(),
            guess: [guess.clone(), guess],
            deeper: [deeper.clone(), deeper],
        });
    }
    l.fill_next();
    l
}

fn run_of(layers: Vec<LayerTrace>, tokens: u64) -> Run {
    Run {
        id: "r".into(),
        tokens,
        layers,
        ..Run::default()
    }
}

/// Every read is counted: a stalling miss or an expert read ahead.
fn assert_reads_counted(o: &Outcome, what: &str) {
    let reads = o.demand_misses + o.prefetch_reads;
    assert_eq!(o.bytes_read, reads * EXPERT_BYTES, "{what}: {o:?}");
}

fn distinct(max: usize) -> impl Strategy<Value = Vec<usize>> {
    proptest::collection::btree_set(0..8usize, 0..=max).prop_map(|s| s.into_iter().collect())
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let one = (
        proptest::collection::btree_set(0..8usize, 1..=3),
        proptest::option::of(distinct(4)),
        proptest::option::of(distinct(4)),
    )
        .prop_map(|(picks, guess, deeper)| Step {
            picks: picks.into_iter().collect(),
            guess,
            deeper,
        });
    proptest::collection::vec(one, 1..40)
}

proptest! {
    #[test]
    fn depth_two_reads_at_most_its_allowance_more_than_depth_one(
        steps in steps(),
        slots in 0..=8usize,
        policy in proptest::sample::select(vec!["lru", "lfu", "lfru", "least-stale", "arc", "auto"]),
        from in 0..2usize,
    ) {
        let runs = [run_of(vec![layer_of(&steps, 8)], steps.len() as u64)];
        let sim = |p| simulate(&runs, policy, Slots::Fixed(slots), p);
        let (none, oracle) = (sim(Prefetch::None), sim(Prefetch::Oracle));
        let one = sim(Prefetch::Lookahead { from, depth: 1 });
        let two = sim(Prefetch::Lookahead { from, depth: 2 });
        for (o, what) in [(&none, "none"), (&oracle, "oracle"), (&one, "depth 1"), (&two, "depth 2")] {
            prop_assert_eq!((o.hits, o.misses), (none.hits, none.misses), "{} changed hits", what);
            assert_reads_counted(o, what);
        }
        prop_assert_eq!((none.prefetch_reads, oracle.demand_misses), (0, 0));
        prop_assert_eq!(oracle.prefetch_reads, oracle.misses);
        // The allowance: each step's guesses, each expert at most once.
        let size = |g: &Option<Vec<usize>>| g.as_ref().map_or(0, Vec::len) as u64;
        let guessed: u64 = steps.iter().map(|s| size(&s.guess)).sum();
        let deeper: u64 = steps.iter().map(|s| size(&s.deeper)).sum();
        prop_assert!(one.prefetch_reads <= guessed, "{:?}", one);
        prop_assert!(one.prefetch_reads <= two.prefetch_reads, "{:?} {:?}", one, two);
        prop_assert!(two.prefetch_reads <= one.prefetch_reads + deeper, "{:?} {:?}", one, two);
        prop_assert!(two.demand_misses <= one.demand_misses);
        let wasted = one.prefetch_wasted_bytes + deeper * EXPERT_BYTES;
        prop_assert!(two.prefetch_wasted_bytes <= wasted);
        // A deeper guess that repeats the nearer one reads nothing more,
        // and so does a trace without deeper guesses.
        for deeper in [|s: &Step| s.guess.clone(), |_: &Step| None] {
            let same: Vec<Step> = steps.iter().map(|s| Step { deeper: deeper(s), ..s.clone() }).collect();
            let runs = [run_of(vec![layer_of(&same, 8)], same.len() as u64)];
            let two = simulate(&runs, policy, Slots::Fixed(slots), Prefetch::Lookahead { from, depth: 2 });
            prop_assert_eq!(&two, &one);
        }
    }
}

fn lru_with(runs: &[Run], slots: usize, pin: Pin) -> Outcome {
    let setup = Setup {
        prefetch: Prefetch::None,
        pin,
    };
    simulate_with(runs, "lru", Slots::Fixed(slots), setup)
}

/// Three layers of 16 experts over `tokens` tokens: layer `l` picks its hot
/// set `5l..5l + n` on every token of the first half and every fourth of
/// the second, and one cold expert every token, cycling over `n + 1`.
fn hot_and_cold(n: usize, tokens: usize) -> Run {
    let layers = (0..3)
        .map(|l| {
            let hot: Vec<usize> = (5 * l..5 * l + n).collect();
            let steps: Vec<Step> = (0..tokens)
                .map(|t| {
                    let mut picks = vec![(5 * l + n + t % (n + 1)) % 16];
                    if t < tokens / 2 || t % 4 == 0 {
                        picks.extend(&hot);
                    }
                    step(&picks)
                })
                .collect();
            layer_of(&steps, 16)
        })
        .collect();
    run_of(layers, tokens as u64)
}

#[test]
fn n_pinned_experts_per_layer_come_from_the_first_half_and_never_miss() {
    const TOKENS: usize = 40;
    for n in 1..=3 {
        // 2n slots: n pinned, n left for the cold experts, which cycle
        // over n + 1 and so always miss under LRU. Every hot lookup of the
        // second half hits (pinned), every cold one misses.
        let runs = [hot_and_cold(n, TOKENS)];
        let second = TOKENS - TOKENS / 2;
        let hot_lookups = (TOKENS / 2..TOKENS).filter(|t| t % 4 == 0).count();
        for pin in [Pin::Count(n), Pin::Share(50_00)] {
            let o = lru_with(&runs, 2 * n, pin);
            assert_eq!(o.pinned, 3 * n as u64, "n = {n}, {pin:?}");
            assert_eq!(o.tokens, second as u64);
            assert_eq!(o.misses, 3 * second as u64, "n = {n}, {pin:?}: {o:?}");
            assert_eq!(o.hits, 3 * (n * hot_lookups) as u64, "n = {n}, {pin:?}");
        }
        // Nothing pinned over the same second half: the cold experts
        // evict the hot ones, which then miss.
        let o = lru_with(&runs, 2 * n, Pin::Count(0));
        assert_eq!((o.pinned, o.tokens), (0, second as u64));
        assert_ne!(
            (o.misses, o.hits),
            (3 * second as u64, 3 * (n * hot_lookups) as u64)
        );
    }
}

#[test]
fn the_pins_are_the_first_halfs_hottest_not_the_second_halfs() {
    // 3 experts per token: the first half picks 0-2, the second 3-5, so at
    // 6 slots only a pin chosen from the first half leaves 3-5 to miss
    // once each on their first lookup.
    let steps: Vec<Step> = (0..20)
        .map(|t| step(if t < 10 { &[0, 1, 2] } else { &[3, 4, 5] }))
        .collect();
    let runs = [run_of(vec![layer_of(&steps, 8)], 20)];
    let o = lru_with(&runs, 6, Pin::Count(3));
    assert_eq!((o.pinned, o.misses, o.hits), (3, 3, 27), "{o:?}");
}

/// A replay of the committed 3-token trace (version 1) with `args`.
fn replay(args: &[&str]) -> common::Out {
    let trace = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/traces/qwen3_moe-3-tokens.parquet"
    );
    let mut all = vec!["replay", "--trace", trace];
    all.extend_from_slice(args);
    moestream(&all)
}

#[test]
fn bad_prefetch_and_pin_values_are_refused_naming_the_flag() {
    let cases: [(&[&str], &str); 7] = [
        (&["--pin", "120%"], "--pin: `120%`"),
        (&["--pin", "-1"], "--pin: `-1`"),
        (&["--pin=-1"], "--pin: `-1`"),
        (&["--pin", "12.345%"], "--pin: `12.345%`"),
        (&["--pin", "half"], "--pin: `half`"),
        (
            &["--prefetch", "lookahead:attn:0"],
            "--prefetch: `lookahead:attn:0`",
        ),
        (
            &["--prefetch", "lookahead:attn:3"],
            "--prefetch: `lookahead:attn:3`",
        ),
    ];
    for (args, want) in cases {
        let out = replay(args);
        assert!(
            !out.ok && out.stderr.contains(want),
            "{args:?}: {}",
            out.stderr
        );
    }
}

#[test]
fn depth_two_on_a_version_1_trace_is_refused_naming_the_column() {
    for (variant, column) in [("attn", "guess_attn_2"), ("output", "guess_output_2")] {
        let out = replay(&["--prefetch", &format!("lookahead:{variant}:2")]);
        assert!(!out.ok, "{variant}: {}", out.stdout);
        assert!(
            out.stderr.contains(column) && out.stderr.contains("version-1"),
            "{variant}: {}",
            out.stderr
        );
    }
    // Depth 1 and pins read the same file.
    let out = replay(&[
        "--prefetch",
        "lookahead:output",
        "--pin",
        "25%",
        "--slots",
        "4",
    ]);
    assert!(out.ok, "{}", out.stderr);
}
