//! `moestream plan`: the RAM plan from headers only. Its byte counts are
//! those loading keeps (every family, quantized at load, a container); it
//! accepts and refuses exactly the budgets `run` does, with the same
//! message; and it works on a partial download (shards holding only their
//! headers) that `run` refuses.

mod common;

use common::{
    copy_fixture, fixture, moestream, moestream_env, read_shard, write_shard, Out, FAMILIES,
};
use moestream::formats::config::ModelConfig;
use moestream::formats::quant::policy::Policy;
use moestream::formats::weights::index::AtLoad;
use moestream::formats::weights::WeightIndex;
use moestream::model::{Footprint, LoadOptions, Model};
use moestream_io::ReadMode;
use serde_json::Value;
use std::path::Path;

/// The footprint from headers, with the runtime quantizer `policy` if any.
fn footprint(dir: &Path, policy: Option<Policy>) -> Footprint {
    let cfg = ModelConfig::load(dir).unwrap();
    let (mut index, _) = WeightIndex::open_headers(dir).unwrap();
    index.set_at_load(policy.map(|policy| AtLoad {
        policy,
        layers: cfg.num_layers,
    }));
    Footprint::measure(&cfg, &index).unwrap()
}

/// Headers predict what loading keeps: resident bytes to the byte, one
/// expert's bytes in RAM and on disk, and the MoE layers (MTP included).
fn assert_footprint_is_what_loading_keeps(dir: &Path, policy: Option<Policy>, what: &str) {
    let fp = footprint(dir, policy.clone());
    let opts = LoadOptions {
        quantize_at_load: policy,
        pin_history: false,
        ..LoadOptions::default()
    };
    let model = Model::load(dir, &opts).unwrap();
    assert_eq!(
        fp.resident_bytes(),
        model.store.index().resident_bytes(),
        "{what}: resident bytes by class {:?}",
        fp.resident
    );
    assert_eq!(
        Some((fp.expert_ram, fp.expert_disk)),
        model.store.expert_bytes(),
        "{what}"
    );
    assert_eq!(fp.expert_zero_copy, model.store.zero_copy(), "{what}");
    assert_eq!(fp.moe_layers, model.store.moe_layers(), "{what}");
}

#[test]
fn headers_predict_what_loading_keeps_in_every_family() {
    for family in FAMILIES {
        assert_footprint_is_what_loading_keeps(&fixture(family), None, family);
    }
    for family in ["qwen3_moe", "deepseek_v3_fp8", "glm_moe_dsa"] {
        let what = format!("{family} quantized at load");
        assert_footprint_is_what_loading_keeps(&fixture(family), Some(Policy::default()), &what);
    }
}

#[test]
fn headers_predict_what_a_container_keeps() {
    let out = tempfile::tempdir().unwrap();
    let c = moestream(&[
        "convert",
        "--input",
        fixture("qwen3_moe").to_str().unwrap(),
        "--output",
        out.path().to_str().unwrap(),
    ]);
    assert!(c.ok, "{}", c.stderr);
    assert_footprint_is_what_loading_keeps(out.path(), None, "container");
    assert!(footprint(out.path(), None).expert_zero_copy);
}

fn plan_json(dir: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["plan", "--model", dir.to_str().unwrap(), "--json"];
    if !extra.contains(&"--probe-seconds") {
        args.extend(["--probe-seconds", "0"]);
    }
    args.extend(extra);
    let out = moestream(&args);
    assert!(out.ok, "{}", out.stderr);
    serde_json::from_str(out.stdout.trim()).expect("one JSON object")
}

fn run_at(dir: &Path, gb: &str, extra: &[&str]) -> Out {
    let mut args = vec![
        "run",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        "1,2,3",
        "--max-tokens",
        "2",
        "--ram-gb",
        gb,
        "--json",
    ];
    // `run` with one prompt reserves KV for that request alone; `plan`
    // (no request) for 4096 positions. Compare them at the same context.
    if !extra.contains(&"--context") {
        args.extend(["--context", "4096"]);
    }
    args.extend(extra);
    moestream(&args)
}

/// The `error:` line of a failed command.
fn error_line(o: &Out) -> String {
    assert!(!o.ok, "expected a refusal: {}", o.stdout);
    o.stderr
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("no error line: {}", o.stderr))
        .to_string()
}

#[test]
fn plan_accepts_and_refuses_the_budgets_run_does_with_the_same_message() {
    for (family, extra) in [
        ("qwen3_moe", vec![]),
        ("glm_moe_dsa", vec!["--io", "buffered", "--context", "64"]),
    ] {
        let dir = fixture(family);
        let p = plan_json(&dir, &extra);
        let smallest = p["smallest_ram_gb"].as_f64().unwrap();
        let below = format!("{:.2}", smallest - 0.01);
        let at = format!("{smallest:.2}");
        // Below the smallest: both refuse, with one message.
        let mut plan_args = vec![
            "plan",
            "--model",
            dir.to_str().unwrap(),
            "--probe-seconds",
            "0",
            "--ram-gb",
            &below,
        ];
        plan_args.extend(&extra);
        let refused = moestream(&plan_args);
        let ran = run_at(&dir, &below, &extra);
        assert_eq!(error_line(&refused), error_line(&ran), "{family}");
        assert!(error_line(&ran).contains("--ram-gb"), "{family}");
        assert!(
            refused
                .stderr
                .contains(&format!("smallest budget that runs is --ram-gb {at}")),
            "{}",
            refused.stderr
        );
        // At the smallest: both run, with the same slots per layer.
        let mut with_budget = extra.clone();
        with_budget.extend(["--ram-gb", at.as_str()]);
        let planned = plan_json(&dir, &with_budget);
        let ran = run_at(&dir, &at, &extra);
        assert!(ran.ok, "{family} at --ram-gb {at}: {}", ran.stderr);
        let ran: Value = serde_json::from_str(ran.stdout.trim()).unwrap();
        assert_eq!(
            planned["budget"]["slots_per_layer"], ran["config"]["slots_per_layer"],
            "{family}"
        );
    }
}

#[test]
fn plan_prints_resident_classes_slack_slots_and_the_smallest_budget() {
    let dir = fixture("qwen3_moe");
    let p = plan_json(&dir, &["--ram-gb", "0.2"]);
    let classes = p["resident_bytes"].as_object().unwrap();
    for class in ["embed", "attention", "router", "norm"] {
        assert!(classes[class].as_u64().unwrap() > 0, "{class}: {p}");
    }
    let sum: u64 = classes.values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(sum, p["resident_total_bytes"].as_u64().unwrap());
    let b = &p["budget"];
    let slack: Vec<&str> = b["slack"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s[0].as_str().unwrap())
        .collect();
    for item in ["in-flight experts", "KV pool", "activations", "runtime"] {
        assert!(slack.contains(&item), "{item}: {slack:?}");
    }
    assert_eq!(b["slots_per_layer"], 8, "0.2 GB holds every expert");
    assert!(p["experts"]["disk_bytes"].as_u64().unwrap() > 0);
    assert!(p["smallest_ram_gb"].as_f64().unwrap() <= p["all_experts_ram_gb"].as_f64().unwrap());
    assert!(p["prediction"].is_null() && p["prediction_note"].is_string());
    // The text form names the same things.
    let text = moestream(&[
        "plan",
        "--model",
        dir.to_str().unwrap(),
        "--ram-gb",
        "0.2",
        "--probe-seconds",
        "0",
    ]);
    assert!(text.ok, "{}", text.stderr);
    for needle in [
        "resident weights",
        "slack: KV pool",
        "slots per layer",
        "smallest budget that runs: --ram-gb",
        "cold on disk",
    ] {
        assert!(text.stdout.contains(needle), "{needle}: {}", text.stdout);
    }
}

#[test]
fn a_short_probe_gives_a_prediction() {
    let p = plan_json(
        &fixture("qwen3_moe"),
        &["--ram-gb", "0.2", "--probe-seconds", "0.05"],
    );
    let x = &p["prediction"];
    assert!(x["tok_per_s"].as_f64().unwrap() > 0.0, "{p}");
    assert!(x["mb_read_per_token"].as_f64().unwrap() >= 0.0);
    assert!(x["source"].as_str().unwrap().contains("disk probe"));
}

/// A partial download: config, tokenizer and index whole, every shard cut
/// right after its header.
fn partial_download() -> tempfile::TempDir {
    let dir = copy_fixture("qwen3_moe");
    for e in std::fs::read_dir(dir.path()).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            let (header, _) = read_shard(&p);
            write_shard(&p, &header, &[]);
        }
    }
    dir
}

#[test]
fn plan_works_on_a_partial_download_that_run_refuses() {
    let partial = partial_download();
    let whole = plan_json(&fixture("qwen3_moe"), &["--ram-gb", "0.1"]);
    let p = plan_json(partial.path(), &["--ram-gb", "0.1"]);
    assert_eq!(p["download"]["complete_shards"], 0);
    assert_eq!(p["download"]["partial"].as_array().unwrap().len(), 2);
    for key in [
        "resident_bytes",
        "resident_total_bytes",
        "experts",
        "smallest_ram_gb",
    ] {
        assert_eq!(p[key], whole[key], "{key}");
    }
    assert_eq!(
        p["budget"]["slots_per_layer"],
        whole["budget"]["slots_per_layer"]
    );
    let ran = run_at(partial.path(), "0.1", &[]);
    common::assert_clean_failure(&ran, &["truncated"]);
    let text = moestream(&[
        "plan",
        "--model",
        partial.path().to_str().unwrap(),
        "--probe-seconds",
        "0",
    ]);
    assert!(text.stdout.contains("partial download"), "{}", text.stdout);
}

#[test]
fn plan_takes_a_hub_id() {
    let cache = tempfile::tempdir().unwrap();
    let m = cache.path().join("models--acme--tiny");
    let snap = m.join("snapshots/0123abc");
    std::fs::create_dir_all(m.join("refs")).unwrap();
    std::fs::create_dir_all(&snap).unwrap();
    for e in std::fs::read_dir(fixture("qwen3_moe")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, snap.join(p.file_name().unwrap())).unwrap();
    }
    std::fs::write(m.join("refs/main"), "0123abc").unwrap();
    let out = moestream_env(
        &[
            "plan",
            "--model",
            "acme/tiny",
            "--probe-seconds",
            "0",
            "--json",
        ],
        &[("HF_HUB_CACHE", cache.path().to_str().unwrap())],
    );
    assert!(out.ok, "{}", out.stderr);
    let p: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(p["family"], "qwen3_moe");
}

#[test]
fn header_only_index_refuses_reads_past_the_cut() {
    let partial = partial_download();
    let (index, extents) = WeightIndex::open_headers(partial.path()).unwrap();
    assert!(extents.iter().all(|e| !e.complete()));
    assert!(WeightIndex::open(partial.path(), ReadMode::Buffered).is_err());
    let shape = index.entry("model.norm.weight").unwrap().shape.clone();
    let e = index.read_f32("model.norm.weight", &shape).unwrap_err();
    assert!(!e.to_string().is_empty());
}
