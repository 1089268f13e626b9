//! `--policy auto` against the fixed policies on a trace of each locality
//! regime (results/policies.md): the two calibrated presets, where
//! least-stale leads, and the two trained models, where LFRU leads. At 10%,
//! 25% and 50% residency, auto's misses end within a few percent of the
//! best fixed live policy's on every trace, though no fixed policy does.
//!
//! The traces are committed (tests/fixtures/traces; how each was recorded
//! is in its README) and replayed with the live cache's own code, so this
//! is what a run with those slots would count.

use moestream::formats::trace::read::{read, Run};
use moestream::lab::replay::{replay, Prefetch, Slots};
use std::path::Path;

/// Auto may miss at most this much more than the best fixed policy.
const SLACK: f64 = 1.03;

/// The live policies auto is compared with.
const FIXED: [&str; 5] = ["lru", "lfu", "lfru", "least-stale", "arc"];

fn trace(name: &str) -> Vec<Run> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/traces")
        .join(format!("{name}.parquet"));
    read(&path, None).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Misses per policy (FIXED, then auto) at each of `slots`.
fn misses(runs: &[Run], slots: &[usize]) -> Vec<(usize, Vec<(String, u64)>)> {
    let mut policies = FIXED.to_vec();
    policies.push("auto");
    let s: Vec<Slots> = slots.iter().map(|&n| Slots::Fixed(n)).collect();
    let out = replay(runs, &policies, &s, Prefetch::None);
    slots
        .iter()
        .map(|&n| {
            let row = out
                .iter()
                .filter(|o| o.slots == n.to_string())
                .map(|o| (o.policy.clone(), o.misses))
                .collect();
            (n, row)
        })
        .collect()
}

/// Auto within SLACK of the best fixed policy at every slot count; returns
/// (slot count, best fixed policy) per slot count.
fn auto_tracks_the_best(name: &str, slots: &[usize]) -> Vec<(usize, String)> {
    let runs = trace(name);
    let mut best_of = Vec::new();
    for (n, row) in misses(&runs, slots) {
        let auto = row.iter().find(|(p, _)| p == "auto").unwrap().1;
        let (best, least) = row
            .iter()
            .filter(|(p, _)| p != "auto")
            .min_by_key(|(_, m)| *m)
            .unwrap();
        eprintln!("{name} @ {n}: auto {auto}, best {best} {least}: {row:?}");
        assert!(
            auto as f64 <= *least as f64 * SLACK,
            "{name} at {n} slots: auto misses {auto}, {best} {least} ({row:?})"
        );
        best_of.push((n, best.clone()));
    }
    best_of
}

#[test]
fn auto_tracks_least_stale_on_the_weak_locality_preset() {
    auto_tracks_the_best("weak-locality", &[1, 2, 4]);
}

#[test]
fn auto_tracks_least_stale_on_the_strong_locality_preset() {
    let best = auto_tracks_the_best("strong-locality", &[6, 16, 32]);
    assert!(best.iter().all(|(_, p)| p == "least-stale"), "{best:?}");
}

#[test]
fn auto_tracks_lfru_on_the_trained_qwen3_trace() {
    let best = auto_tracks_the_best("trained-qwen3_moe", &[3, 8, 16]);
    assert!(best[1..].iter().all(|(_, p)| p == "lfru"), "{best:?}");
}

#[test]
fn auto_tracks_lfru_on_the_trained_deepseek_trace() {
    auto_tracks_the_best("trained-deepseek_v3", &[3, 8, 16]);
}
