//! Generation through the CLI: EOS stops a run unless `--ignore-eos`,
//! seeded sampling reproduces, `--top-k 1` is greedy, and text mode streams
//! text then ends with the stats line.

mod common;

use common::{moestream, tiny_model};
use serde_json::Value;
use std::path::Path;

fn run_json(dir: &Path, extra: &[&str]) -> Vec<u32> {
    let mut args = vec![
        "run",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        "5,6,7",
        "--json",
    ];
    args.extend(extra);
    let out = moestream(&args);
    assert!(out.ok, "{}", out.stderr);
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    v["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn eos_stops_generation_unless_ignored() {
    let dir = tiny_model();
    let all = run_json(dir.path(), &["--max-tokens", "8", "--ignore-eos"]);
    assert_eq!(all.len(), 8);
    let eos = all[2];
    let first = all.iter().position(|t| *t == eos).unwrap();
    std::fs::write(
        dir.path().join("generation_config.json"),
        format!("{{\"eos_token_id\": [{eos}]}}"),
    )
    .unwrap();
    let stopped = run_json(dir.path(), &["--max-tokens", "8"]);
    assert_eq!(
        stopped,
        all[..=first].to_vec(),
        "stops at (and includes) the first EOS"
    );
    assert_eq!(
        run_json(dir.path(), &["--max-tokens", "8", "--ignore-eos"]),
        all
    );
}

#[test]
fn seeded_sampling_reproduces_and_top_k_one_is_greedy() {
    let dir = tiny_model();
    let sample = [
        "--max-tokens",
        "12",
        "--ignore-eos",
        "--temperature",
        "1.5",
        "--top-p",
        "0.95",
    ];
    let a = run_json(dir.path(), &[&sample[..], &["--seed", "9"]].concat());
    let b = run_json(dir.path(), &[&sample[..], &["--seed", "9"]].concat());
    assert_eq!(a, b);
    let greedy = run_json(dir.path(), &["--max-tokens", "12", "--ignore-eos"]);
    let k1 = run_json(
        dir.path(),
        &[&sample[..], &["--top-k", "1", "--seed", "3"]].concat(),
    );
    assert_eq!(greedy, k1);
}

#[test]
fn an_unseeded_sampled_run_draws_a_fresh_seed_prints_it_and_repeats_with_it() {
    let dir = tiny_model();
    let sample = ["--max-tokens", "24", "--ignore-eos", "--temperature", "1.5"];
    let seed_of = |stderr: &str| {
        let line = stderr.lines().find_map(|l| l.strip_prefix("seed: "));
        line.and_then(|l| l.split_whitespace().next())
            .map(str::to_string)
    };
    let (a, b) = (run_out(dir.path(), &sample), run_out(dir.path(), &sample));
    let (sa, sb) = (seed_of(&a.stderr).unwrap(), seed_of(&b.stderr).unwrap());
    assert_ne!(sa, sb, "two runs, one seed");
    let ids =
        |o: &common::Out| serde_json::from_str::<Value>(&o.stdout).unwrap()["token_ids"].clone();
    assert_ne!(ids(&a), ids(&b), "two unseeded runs gave one sample");
    let again = run_out(dir.path(), &[&sample[..], &["--seed", &sa]].concat());
    assert_eq!(ids(&again), ids(&a), "--seed {sa} repeats the run");
    assert_eq!(seed_of(&again.stderr), None, "a given seed is not echoed");
    let greedy = run_out(dir.path(), &["--max-tokens", "4"]);
    assert_eq!(seed_of(&greedy.stderr), None, "greedy needs no seed");
}

/// `run --json` with `extra` (as [`run_json`], stdout and stderr kept).
fn run_out(dir: &Path, extra: &[&str]) -> common::Out {
    let d = dir.to_str().unwrap();
    let mut args = vec!["run", "--model", d, "--prompt-ids", "5,6,7", "--json"];
    args.extend(extra);
    let out = moestream(&args);
    assert!(out.ok, "{}", out.stderr);
    out
}

#[test]
fn text_mode_streams_then_prints_the_stats_line() {
    let dir = tiny_model();
    let out = moestream(&[
        "run",
        "--model",
        dir.path().to_str().unwrap(),
        "--prompt",
        "the engine",
        "--max-tokens",
        "5",
        "--ignore-eos",
    ]);
    assert!(out.ok, "{}", out.stderr);
    let line = out.stderr.lines().last().unwrap();
    for part in [
        "5 tokens",
        "tok/s",
        "expert hit rate",
        "peak RSS",
        "disk",
        "expert-matmul",
        "attention",
        "other",
    ] {
        assert!(line.contains(part), "stats line lacks `{part}`: {line}");
    }
}

#[test]
fn generation_stops_at_the_model_context() {
    let dir = tiny_model();
    let path = dir.path().join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v["max_position_embeddings"] = 10.into();
    std::fs::write(&path, v.to_string()).unwrap();
    // 3 prompt tokens + 7 new fill the 10-position context.
    assert_eq!(
        run_json(dir.path(), &["--max-tokens", "1000000", "--ignore-eos"]).len(),
        7
    );
    let long: Vec<String> = (0..11).map(|i| (i + 1).to_string()).collect();
    let out = moestream(&[
        "run",
        "--model",
        dir.path().to_str().unwrap(),
        "--prompt-ids",
        &long.join(","),
        "--json",
    ]);
    assert!(!out.ok && out.stdout.is_empty());
    assert!(
        out.stderr.contains("max_position_embeddings"),
        "{}",
        out.stderr
    );
}

/// A prompt forwarded in chunks gives bit-identical logits at every position
/// to one forward, in every family (attention, MLA, DSA, sliding window).
/// MLA is pinned to one attention path: `auto` picks by tokens in flight,
/// and the two paths agree only to rounding.
#[test]
fn chunked_prefill_gives_identical_logits() {
    use moestream::model::profile::Profile;
    use moestream::model::{LoadOptions, Model};
    for family in [
        "qwen3_moe",
        "qwen2_moe",
        "mixtral_sliding_window",
        "olmoe",
        "deepseek_v3",
        "glm4_moe",
        "glm_moe_dsa",
    ] {
        let dir = common::fixture(family);
        let ids = common::u32s(&common::oracle_at(&dir)["eval_ids"]);
        let opts = LoadOptions {
            mla: moestream::model::mla::MlaMode::Explicit,
            ..LoadOptions::default()
        };
        let model = Model::load(&dir, &opts).unwrap();
        let mut prof = Profile::default();
        let mut kv = model.new_kv(ids.len());
        let whole = model.forward(&ids, &mut kv, true, &mut prof).unwrap();
        for chunk in [1, 3, 7] {
            let mut kv = model.new_kv(ids.len());
            let parts = model
                .forward_chunked(&ids, &mut kv, true, &mut prof, chunk)
                .unwrap();
            assert!(
                whole
                    .iter()
                    .zip(&parts)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{family}: chunk {chunk} changes the logits"
            );
            assert_eq!(whole.len(), parts.len());
        }
    }
}
