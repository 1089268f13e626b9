//! Checked limits on every number (the hardening issue's defects 4, 5 and
//! 7): config values that would make NaN or abort, sampling settings out of
//! range, and absurd flags each get a clean error naming the setting, or
//! are clamped where a larger value only means "all" (the expert cache).
//! Each case is named after the fault.

mod common;

use common::{assert_clean_failure, fixture, moestream};
use serde_json::{json, Value};
use std::path::Path;

/// A copy of `family`'s fixture with `edit` applied to its config.json.
fn with_config(family: &str, edit: impl FnOnce(&mut Value)) -> tempfile::TempDir {
    let tmp = common::copy_fixture(family);
    let cpath = tmp.path().join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&cpath).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&cpath, v.to_string()).unwrap();
    tmp
}

fn run(dir: &Path, extra: &[&str]) -> common::Out {
    common::run_json(dir, extra)
}

#[test]
fn config_values_that_make_nan_or_abort_are_refused_by_name() {
    let cases: [(&str, &str, Value); 8] = [
        ("qwen3_moe", "rms_norm_eps", json!(-1e-6)),
        ("qwen3_moe", "rope_theta", json!(0.0)),
        (
            "qwen3_moe",
            "rope_parameters",
            json!({"rope_type": "linear", "factor": 0.0, "rope_theta": 1e6}),
        ),
        ("deepseek_v3", "routed_scaling_factor", json!(1e300)),
        ("olmoe", "clip_qkv", json!(-1.0)),
        ("qwen3_moe", "num_experts", json!(1_000_000_000u64)),
        ("qwen3_moe", "head_dim", json!(2048)),
        ("qwen3_moe", "hidden_size", json!(1u64 << 40)),
    ];
    for (family, field, value) in cases {
        let dir = with_config(family, |v| {
            if field == "rope_theta" {
                v["rope_parameters"][field] = value.clone();
            } else {
                v[field] = value.clone();
            }
        });
        let out = run(dir.path(), &[]);
        let name = if field == "rope_parameters" {
            "factor"
        } else if field == "head_dim" {
            "rotary"
        } else {
            field
        };
        assert_clean_failure(&out, &["config.json", name]);
    }
}

#[test]
fn sampling_settings_out_of_range_are_refused_by_name() {
    let dir = fixture("qwen3_moe");
    for (flag, value, name) in [
        ("--temperature", "NaN", "temperature"),
        ("--temperature", "-1", "temperature"),
        ("--top-p", "0", "top_p"),
        ("--top-p", "2", "top_p"),
        ("--top-p", "NaN", "top_p"),
    ] {
        let arg = format!("{flag}={value}");
        let out = run(&dir, &[arg.as_str()]);
        assert_clean_failure(&out, &[name]);
    }
}

#[test]
fn a_huge_expert_cache_means_every_expert() {
    let dir = fixture("qwen3_moe");
    let plain = run(&dir, &[]);
    assert!(plain.ok, "{}", plain.stderr);
    let tokens = |o: &common::Out| -> Value {
        serde_json::from_str::<Value>(o.stdout.trim()).unwrap()["token_ids"].clone()
    };
    for n in ["1000000000000", "18446744073709551615"] {
        let out = run(&dir, &["--expert-cache", n]);
        assert!(out.ok, "--expert-cache {n}: {}", out.stderr);
        assert_eq!(tokens(&out), tokens(&plain));
        // Clamped, and said so.
        let note = format!("--expert-cache {n}: using 8 (the experts of a layer)");
        assert!(out.stderr.contains(&note), "{}", out.stderr);
    }
}

#[test]
fn absurd_bench_and_thread_flags_are_refused() {
    let out = moestream(&["bench", "mem", "--reps", "0"]);
    assert_clean_failure(&out, &["--reps"]);
    let out = moestream(&["bench", "mem", "--mib", "100000000000"]);
    assert_clean_failure(&out, &["--mib"]);
    let start = std::time::Instant::now();
    let out = run(&fixture("qwen3_moe"), &["--threads", "20000"]);
    assert_clean_failure(&out, &["--threads"]);
    assert!(start.elapsed().as_secs() < 60);
}

/// Flags whose values overflowed a sum or product, sized a vector, or
/// panicked in `Duration::from_secs_f64` (issue 31): each refused before
/// use, naming the flag and its range.
#[test]
fn flags_that_overflowed_or_panicked_are_refused_with_their_range() {
    let big = "18446744073709551615";
    let model = fixture("qwen3_moe");
    let m = model.to_str().unwrap();
    let cases: [(&[&str], &str); 12] = [
        (
            &[
                "run",
                "--model",
                m,
                "--prompt-ids",
                "1",
                "--prefetch",
                "on",
                "--prefetch-depth",
                big,
            ],
            "--prefetch-depth 18446744073709551615 is outside 1..=64",
        ),
        (
            &["run", "--model", m, "--prompt-ids", "1", "--context", "0"],
            "--context 0 is outside 1..=16777216",
        ),
        (
            &[
                "run",
                "--model",
                m,
                "--prompt-ids",
                "1",
                "--ram-gb",
                "1e300",
            ],
            "--ram-gb 1e300 is outside (0, 1000000.0] GB",
        ),
        (
            &["bench", "mem", "--reps", big],
            "--reps 18446744073709551615 is outside 1..=10000",
        ),
        (
            &["bench", "verify", "--model", m, "--pairs", big],
            "--pairs 18446744073709551615 is outside 1..=10000",
        ),
        (
            &["bench", "serve", "--model", m, "--clients", big],
            "--clients 18446744073709551615 is outside 1..=4096",
        ),
        (
            &["bench", "serve", "--model", m, "--rounds", big],
            "--rounds 18446744073709551615 is outside 1..=10000",
        ),
        (
            &["bench", "serve", "--model", m, "--slots", big],
            "--slots 18446744073709551615 is outside 1..=4096",
        ),
        (
            &["plan", "--model", m, "--probe-seconds", "1e300"],
            "--probe-seconds 1e300 is outside 0..=600.0 seconds",
        ),
        (
            &["tune", "--model", m, "--rounds", big, "--dry-run"],
            "--rounds 18446744073709551615 is outside 1..=10000",
        ),
        (
            &["tune", "--model", m, "--cell-seconds", "1e300", "--dry-run"],
            "--cell-seconds 1e300 is outside 0..=600.0 seconds",
        ),
        (
            &[
                "train-predictor",
                "--trace",
                "t.parquet",
                "--out",
                "p.json",
                "--epochs",
                big,
            ],
            "--epochs 18446744073709551615 is outside 1..=10000",
        ),
    ];
    for (args, needle) in cases {
        assert_clean_failure(&moestream(args), &[needle]);
    }
}

/// `run --max-tokens 2^64 - 1` overflowed the prompt length plus it (the
/// context the plan reserves); now the sum saturates and is clamped.
#[test]
fn a_huge_max_tokens_does_not_overflow_the_planned_context() {
    let dir = fixture("qwen3_moe");
    let m = dir.to_str().unwrap();
    let budget = ["--ram-gb", "4", "--prompt-ids", "1,2,3"];
    let args = [
        &["run", "--model", m, "--max-tokens", "18446744073709551615"][..],
        &budget[..],
    ]
    .concat();
    let out = moestream(&args);
    assert!(out.ok && !out.stderr.contains("panicked"), "{}", out.stderr);
}

#[test]
fn eval_text_and_prompt_files_are_planned_as_the_inputs_item_or_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixture("qwen3_moe");
    let model = model.to_str().unwrap();
    // 2 MB of text: ~0.5 GB to tokenize, past a 0.3 GB budget; refused
    // by the plan before a byte of it is tokenized.
    let big = dir.path().join("big.txt");
    std::fs::write(&big, "word ".repeat(400_000)).unwrap();
    let out = moestream(&[
        "eval",
        "--model",
        model,
        "--text",
        big.to_str().unwrap(),
        "--ram-gb",
        "0.3",
    ]);
    assert_clean_failure(&out, &["inputs"]);
    // A small text is planned: the item appears in the printed plan.
    let small = dir.path().join("small.txt");
    std::fs::write(
        &small,
        "The following example shows how to use it. ".repeat(20),
    )
    .unwrap();
    let out = moestream(&[
        "eval",
        "--model",
        model,
        "--text",
        small.to_str().unwrap(),
        "--ram-gb",
        "0.5",
    ]);
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stderr.contains(", inputs 0.2 MiB"), "{}", out.stderr);
    // --prompts: the file and its longest line's tokenizing.
    let prompts = dir.path().join("prompts.txt");
    std::fs::write(&prompts, "hi\nthere\n").unwrap();
    let out = moestream(&[
        "run",
        "--model",
        model,
        "--prompts",
        prompts.to_str().unwrap(),
        "-n",
        "1",
        "--ram-gb",
        "0.5",
    ]);
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stderr.contains(", inputs "), "{}", out.stderr);
}

#[test]
fn a_prompt_too_big_to_tokenize_within_the_budget_is_refused_before_tokenizing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.txt");
    std::fs::write(&file, "word ".repeat(400_000)).unwrap();
    let model = fixture("qwen3_moe");
    let out = moestream(&[
        "run",
        "--model",
        model.to_str().unwrap(),
        "-f",
        file.to_str().unwrap(),
        "-n",
        "1",
        "--ram-gb",
        "0.3",
    ]);
    assert_clean_failure(&out, &["tokenizing it takes about"]);
}
