//! `moestream doctor` and `moestream status` on fixtures, without the disk
//! probe (`--probe-seconds 0`): a sound model passes its checks (exit 0),
//! a truncated shard, a budget that cannot fit and a broken tokenizer fail
//! with a fix (exit 1); `--json` gives every check; `status` summarizes
//! model and machine.

mod common;

use common::{copy_fixture, fixture, moestream, read_shard, write_shard, Out};
use serde_json::Value;
use std::path::Path;

fn doctor(dir: &Path, extra: &[&str]) -> (Out, Value) {
    let mut args = vec![
        "doctor",
        "--model",
        dir.to_str().unwrap(),
        "--probe-seconds",
        "0",
        "--json",
    ];
    args.extend(extra);
    let out = moestream(&args);
    let v = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("{e}: {} / {}", out.stdout, out.stderr));
    (out, v)
}

/// The check named `name`.
fn check<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check `{name}`: {v}"))
}

#[test]
fn a_sound_model_passes_and_every_check_is_reported() {
    let (out, v) = doctor(&fixture("qwen3_moe"), &[]);
    let failed: Vec<&Value> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "fail")
        .collect();
    // The machine's own checks may warn (no io_uring in a container), but
    // nothing about a sound model fails, unless this machine's memory
    // limit is below the model's smallest budget.
    let memory_fails = check(&v, "memory")["status"] == "fail";
    assert_eq!(out.ok, failed.is_empty(), "{failed:?}");
    assert!(failed.is_empty() || memory_fails, "{failed:?}");
    for name in [
        "io_uring",
        "transparent huge pages",
        "cpu features",
        "config",
        "shards",
        "ram budget",
        "tokenizer",
        "chat template",
        "O_DIRECT",
        "read-ahead",
        "disk probe",
        "memory",
    ] {
        let c = check(&v, name);
        assert!(!c["detail"].as_str().unwrap().is_empty(), "{name}");
        assert_eq!(c["status"] != "ok", c["fix"].is_string(), "{name}: {c}");
    }
    assert_eq!(check(&v, "disk probe")["detail"], "skipped");
    assert_eq!(check(&v, "shards")["status"], "ok");
    assert_eq!(check(&v, "tokenizer")["status"], "ok");
}

#[test]
fn a_truncated_shard_fails_with_a_fix_and_exit_status_1() {
    let dir = copy_fixture("qwen3_moe");
    let shard = dir.path().join("model-00002-of-00002.safetensors");
    let (header, data) = read_shard(&shard);
    write_shard(&shard, &header, &data[..data.len() / 2]);
    let (out, v) = doctor(dir.path(), &[]);
    assert!(!out.ok);
    assert_eq!(v["ok"], false);
    let c = check(&v, "shards");
    assert_eq!(c["status"], "fail");
    assert!(c["detail"]
        .as_str()
        .unwrap()
        .contains("model-00002-of-00002"));
    assert!(c["fix"].as_str().unwrap().contains("download"));
}

#[test]
fn a_budget_that_cannot_fit_fails_with_the_smallest_that_does() {
    let (out, v) = doctor(&fixture("qwen3_moe"), &["--ram-gb", "0.01"]);
    assert!(!out.ok);
    let c = check(&v, "ram budget");
    assert_eq!(c["status"], "fail");
    assert!(c["detail"].as_str().unwrap().contains("too small"), "{c}");
    assert!(c["fix"].as_str().unwrap().contains("--ram-gb"), "{c}");
}

#[test]
fn a_broken_tokenizer_and_template_are_named() {
    let dir = copy_fixture("qwen3_moe");
    std::fs::write(dir.path().join("tokenizer.json"), "{not json").unwrap();
    let mut cfg: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("tokenizer_config.json")).unwrap(),
    )
    .unwrap();
    cfg["chat_template"] = Value::from("{% for m in messages %}{{ m.content ");
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        serde_json::to_string(&cfg).unwrap(),
    )
    .unwrap();
    let (out, v) = doctor(dir.path(), &[]);
    assert!(!out.ok);
    assert_eq!(check(&v, "tokenizer")["status"], "fail");
    assert_eq!(check(&v, "chat template")["status"], "fail");
}

#[test]
fn the_text_report_prints_a_fix_under_each_problem() {
    let out = moestream(&[
        "doctor",
        "--model",
        fixture("qwen3_moe").to_str().unwrap(),
        "--probe-seconds",
        "0",
        "--ram-gb",
        "0.01",
    ]);
    assert!(!out.ok);
    let lines: Vec<&str> = out.stdout.lines().collect();
    let i = lines
        .iter()
        .position(|l| l.starts_with("FAIL") && l.contains("ram budget"))
        .unwrap_or_else(|| panic!("{}", out.stdout));
    assert!(lines[i + 1].contains("fix:"), "{}", out.stdout);
    assert!(lines.last().unwrap().contains("failures"));
}

#[test]
fn doctor_without_a_model_checks_the_machine() {
    let out = moestream(&["doctor", "--json"]);
    let v: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert!(check(&v, "cpu features")["detail"]
        .as_str()
        .unwrap()
        .contains("kernels dispatch to"));
    assert!(v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["name"] != "shards"));
}

#[test]
fn status_summarizes_model_and_machine() {
    let dir = fixture("qwen3_moe");
    let out = moestream(&["status", "--model", dir.to_str().unwrap(), "--json"]);
    assert!(out.ok, "{}", out.stderr);
    let v: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let m = &v["model"];
    assert_eq!(m["family"], "qwen3_moe");
    assert_eq!(m["complete"], true);
    for key in [
        "disk_bytes",
        "resident_bytes",
        "expert_ram_bytes",
        "expert_disk_bytes",
    ] {
        assert!(m[key].as_u64().unwrap() > 0, "{key}: {v}");
    }
    assert!(v["machine"]["cores"].as_u64().unwrap() >= 1);
    assert!(v["machine"]["disk"]["device"].is_string());
    let text = moestream(&["status", "--model", dir.to_str().unwrap()]);
    assert!(text.ok, "{}", text.stderr);
    for needle in ["model ", "resident", "tuned", "machine", "cores", "disk "] {
        assert!(text.stdout.contains(needle), "{needle}: {}", text.stdout);
    }
    assert!(text.stdout.lines().count() <= 24, "one screen");
}
