//! Routing traces and their replay, end to end through the CLI: a run
//! recorded with `--trace` replays, with the run's policy and slots, to
//! exactly the run's hits and misses (every live policy, with and without
//! prefetch); traces of several runs concatenate in one file; tracing
//! never changes tokens; the Parquet columns hold what docs/TRACE.md says.

mod common;

use common::moestream;
use moestream::synth::{self, SynthSpec};
use std::path::Path;

/// A small synthetic model: 3 MoE layers (layer 0 is dense) of 12
/// experts, top-2.
fn model() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = SynthSpec {
        hidden: 32,
        layers: 4,
        experts: 12,
        top_k: 2,
        moe_inter: 16,
        dense_inter: 24,
        heads: 4,
        kv_heads: 2,
        head_dim: 8,
        vocab: 300,
        seed: 11,
    };
    synth::write(dir.path(), &spec).expect("write synthetic model");
    dir
}

/// `run --json` with `extra` flags; (the JSON object, the traced run's id
/// if `--trace` was given).
fn run(dir: &Path, extra: &[&str]) -> (serde_json::Value, Option<String>) {
    let mut args = vec![
        "run",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        "5,9,2,7,11,3",
        "--max-tokens",
        "24",
        "--ignore-eos",
        "--json",
    ];
    args.extend(extra);
    let out = moestream(&args);
    assert!(out.ok, "{}", out.stderr);
    let id = out
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("trace: recording run "))
        .map(|l| l.split(' ').next().unwrap().to_owned());
    (serde_json::from_str(&out.stdout).unwrap(), id)
}

/// `replay --json` of `trace` with `extra` flags.
fn replay(trace: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["replay", "--trace", trace.to_str().unwrap(), "--json"];
    args.extend(extra);
    let out = moestream(&args);
    assert!(out.ok, "{}", out.stderr);
    serde_json::from_str(&out.stdout).unwrap()
}

fn v_stats(v: &serde_json::Value) -> serde_json::Value {
    v["stats"].clone()
}

fn v_f64(v: &serde_json::Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key} in {v}"))
}

fn hits_misses(stats: &serde_json::Value) -> (u64, u64) {
    (
        stats["expert_hits"].as_u64().unwrap(),
        stats["expert_misses"].as_u64().unwrap(),
    )
}

#[test]
fn a_replay_reproduces_the_runs_hits_and_misses() {
    let dir = model();
    let tmp = tempfile::tempdir().unwrap();
    let trace = tmp.path().join("t.parquet");
    let t = trace.to_str().unwrap();
    let (plain, _) = run(dir.path(), &["--expert-cache", "3"]);
    // (policy, slots, prefetch)
    let cases = [
        ("lfru", "3", "off"),
        ("lru", "3", "off"),
        ("lfu", "4", "off"),
        ("least-stale", "2", "off"),
        ("arc", "3", "off"),
        ("lfru", "3", "on"),
        ("arc", "5", "on"),
    ];
    let mut ids = Vec::new();
    for (policy, slots, prefetch) in cases {
        let flags = [
            "--expert-cache",
            slots,
            "--policy",
            policy,
            "--prefetch",
            prefetch,
            "--trace",
            t,
        ];
        let (v, id) = run(dir.path(), &flags);
        assert_eq!(v["token_ids"], plain["token_ids"], "tracing changed tokens");
        let id = id.expect("the run names its trace run");
        let r = replay(
            &trace,
            &["--run", &id, "--slots", slots, "--policy", policy],
        );
        let o = &r["outcomes"][0];
        let (hits, misses) = hits_misses(&v["stats"]);
        assert_eq!(
            (o["hits"].as_u64().unwrap(), o["misses"].as_u64().unwrap()),
            (hits, misses),
            "{policy} with {slots} slots, prefetch {prefetch}"
        );
        // The guesses in the trace score as the run scored them.
        for variant in ["attn", "output"] {
            let key = format!("recall_{variant}");
            let (ran, traced) = (v_f64(&v_stats(&v), &key), v_f64(&r["routing"], &key));
            assert!((ran - traced).abs() < 1e-9, "{key}: {ran} vs {traced}");
        }
        // The trace's own tiers say the same.
        assert_eq!(r["recorded"]["hits"].as_u64(), Some(hits));
        assert_eq!(r["recorded"]["misses"].as_u64(), Some(misses));
        // The replay's tokens are the run's forwarded tokens (the last
        // sampled token is never forwarded).
        let s = &v["stats"];
        let forwarded = s["prompt_tokens"].as_u64().unwrap() + s["tokens"].as_u64().unwrap() - 1;
        assert_eq!(r["tokens"].as_u64(), Some(forwarded));
        ids.push(id);
    }
    // Every run landed in the one file, in order.
    let all = replay(&trace, &["--slots", "3", "--policy", "lru"]);
    let runs: Vec<String> = all["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(runs, ids);
    // Nothing but the trace is left next to it (part and temp files go).
    let mut names: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["t.parquet", "t.parquet.lock"]);
}

#[test]
fn the_columns_hold_what_the_run_did() {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{UInt32Type, UInt64Type};
    let dir = model();
    let tmp = tempfile::tempdir().unwrap();
    let trace = tmp.path().join("t.parquet");
    let (v, _) = run(
        dir.path(),
        &["--expert-cache", "3", "--trace", trace.to_str().unwrap()],
    );
    let s = &v["stats"];
    let forwarded = s["prompt_tokens"].as_u64().unwrap() + s["tokens"].as_u64().unwrap() - 1;
    let batches: Vec<_> = moestream::trace::write::batches(&trace)
        .unwrap()
        .map(|b| b.unwrap())
        .collect();
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    assert_eq!(
        rows as u64,
        forwarded * 3,
        "one row per token and MoE layer"
    );
    let mut bytes = 0;
    let mut guessed = 0;
    for b in &batches {
        let col = |n: &str| b.column_by_name(n).unwrap();
        let experts = col("experts").as_list::<i32>();
        let weights = col("weights").as_list::<i32>();
        let read = col("bytes_read").as_list::<i32>();
        let tier = col("tier").as_list::<i32>();
        let read_us = col("read_us").as_list::<i32>();
        let row = col("row").as_primitive::<UInt32Type>().values();
        let token = col("token").as_primitive::<UInt64Type>().values();
        for i in 0..b.num_rows() {
            assert_eq!(experts.value(i).len(), 2, "top-2");
            let w = weights.value(i);
            let w = w.as_primitive::<arrow_array::types::Float32Type>();
            assert!(w.values().iter().all(|&x| x > 0.0));
            bytes += read
                .value(i)
                .as_primitive::<UInt64Type>()
                .values()
                .iter()
                .sum::<u64>();
            // A hit has no latency; a charged miss has one.
            let tiers = tier.value(i);
            let us = read_us.value(i);
            for k in 0..2 {
                let t = tiers.as_string::<i32>().value(k);
                assert!(["warm", "miss"].contains(&t), "{t}");
                if t == "warm" {
                    assert!(us.is_null(k));
                }
            }
            // Prefill rows (row > 0 or the first forward) have no guess.
            if !col("guess_attn").is_null(i) {
                guessed += 1;
                assert_eq!(row[i], 0);
                assert!(token[i] >= 6, "decode tokens only");
            }
        }
    }
    assert_eq!(bytes, s["expert_bytes_read"].as_u64().unwrap());
    assert!(guessed > 0, "decode rows carry the lookahead's guesses");
}

#[test]
fn replay_refuses_what_it_cannot_read() {
    let tmp = tempfile::tempdir().unwrap();
    let bogus = tmp.path().join("x.parquet");
    std::fs::write(&bogus, b"not parquet").unwrap();
    let out = moestream(&["replay", "--trace", bogus.to_str().unwrap()]);
    assert!(!out.ok);
    assert!(out.stderr.contains("x.parquet"), "{}", out.stderr);
    let out = moestream(&[
        "replay",
        "--trace",
        bogus.to_str().unwrap(),
        "--policy",
        "mru",
    ]);
    assert!(
        !out.ok && out.stderr.contains("unknown policy `mru`"),
        "{}",
        out.stderr
    );
}
