//! `convert` never destroys weights and `--resume` trusts nothing it has not
//! checked (the hardening issue's defects 1 and 2), and side files that are
//! not regular files are refused (defect 9). Each test is named after the
//! fault it guards against.

mod common;

use common::{assert_clean_failure, fixture, moestream};
use moestream::convert::MANIFEST;
use std::path::{Path, PathBuf};

/// Every file of `dir` (recursively flat: fixtures have no subfolders),
/// sorted by name, with its bytes.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            (name, std::fs::read(&p).unwrap())
        })
        .collect();
    v.sort();
    v
}

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for (name, bytes) in snapshot(src) {
        std::fs::write(dst.join(name), bytes).unwrap();
    }
}

fn convert(input: &Path, output: &Path, extra: &[&str]) -> common::Out {
    let mut args = vec!["convert", "--input", input.to_str().unwrap()];
    args.extend(["--output", output.to_str().unwrap(), "--quiet"]);
    args.extend(extra);
    moestream(&args)
}

fn run_ok(dir: &Path) -> common::Out {
    common::run_json(dir, &[])
}

fn manifest(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join(MANIFEST)).unwrap()).unwrap()
}

fn set_manifest(dir: &Path, m: &serde_json::Value) {
    std::fs::write(dir.join(MANIFEST), m.to_string()).unwrap();
}

fn shards(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    v.sort();
    v
}

#[test]
fn convert_into_its_own_input_is_refused_and_touches_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("m");
    copy_dir(&fixture("qwen3_moe"), &model);
    let before = snapshot(&model);
    let out = convert(&model, &model, &[]);
    assert_clean_failure(&out, &["is the input directory"]);
    // Even --force never writes into the input.
    let out = convert(&model, &model.join("."), &["--force"]);
    assert_clean_failure(&out, &["is the input directory"]);
    assert_eq!(snapshot(&model), before);
}

#[test]
fn convert_over_a_model_is_refused_and_force_swaps_in_a_complete_container() {
    let tmp = tempfile::tempdir().unwrap();
    let other = tmp.path().join("other");
    copy_dir(&fixture("olmoe"), &other);
    let before = snapshot(&other);
    let out = convert(&fixture("qwen3_moe"), &other, &[]);
    assert_clean_failure(&out, &["already holds", "force"]);
    assert_eq!(snapshot(&other), before, "the refused output was changed");

    let forced = convert(&fixture("qwen3_moe"), &other, &["--force"]);
    assert!(forced.ok, "{}", forced.stderr);
    assert!(manifest(&other)["census"].is_object());
    let ran = run_ok(&other);
    assert!(ran.ok, "{}", ran.stderr);
    // No staging or replaced directory is left beside it.
    let leftovers: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn an_unfinished_conversion_is_refused_by_run() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("c");
    assert!(convert(&fixture("qwen3_moe"), &out, &[]).ok);
    assert!(run_ok(&out).ok);
    let mut m = manifest(&out);
    m["census"] = serde_json::Value::Null;
    set_manifest(&out, &m);
    let ran = run_ok(&out);
    assert_clean_failure(&ran, &["unfinished conversion", MANIFEST]);
}

/// A conversion of deepseek_v3 into `tmp`/c, interrupted: unfinished, its
/// last file gone.
fn interrupted_conversion() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("c");
    assert!(convert(&fixture("deepseek_v3"), &out, &[]).ok);
    let mut m = manifest(&out);
    m["census"] = serde_json::Value::Null;
    set_manifest(&out, &m);
    std::fs::remove_file(shards(&out).last().unwrap()).unwrap();
    (tmp, out)
}

#[test]
fn resume_from_a_different_input_is_refused() {
    let (tmp, out) = interrupted_conversion();
    let before = snapshot(&out);
    let other = convert(&fixture("glm4_moe"), &out, &["--resume"]);
    assert_clean_failure(&other, &["not from this input", "config.json differs"]);
    assert_eq!(snapshot(&out), before);
    // A shard whose header changed is another input too.
    let edited = tmp.path().join("edited");
    copy_dir(&fixture("deepseek_v3"), &edited);
    let shard = shards(&edited)[0].clone();
    let (mut header, data) = common::read_shard(&shard);
    header["__metadata__"] = serde_json::json!({"edited": "yes"});
    common::write_shard(&shard, &header, &data);
    let out2 = convert(&edited, &out, &["--resume"]);
    assert_clean_failure(&out2, &["not from this input", "shard"]);
}

#[test]
fn resume_redoes_a_finished_file_damaged_afterwards() {
    let tmp = tempfile::tempdir().unwrap();
    let (whole, cut) = (tmp.path().join("whole"), tmp.path().join("cut"));
    assert!(convert(&fixture("deepseek_v3"), &whole, &[]).ok);
    assert!(convert(&fixture("deepseek_v3"), &cut, &[]).ok);
    let victim = shards(&cut)[0].clone();
    let mut bytes = std::fs::read(&victim).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x5a;
    std::fs::write(&victim, bytes).unwrap();
    let resumed = convert(&fixture("deepseek_v3"), &cut, &["--resume"]);
    assert!(resumed.ok, "{}", resumed.stderr);
    let same = |d: &Path| -> Vec<(String, Vec<u8>)> {
        snapshot(d)
            .into_iter()
            .filter(|(n, _)| n.ends_with(".safetensors"))
            .collect()
    };
    assert_eq!(same(&cut), same(&whole));
}

#[test]
fn a_config_that_is_not_a_regular_file_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("m");
    copy_dir(&fixture("qwen3_moe"), &model);
    std::fs::remove_file(model.join("config.json")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", model.join("config.json")).unwrap();
    let out = run_ok(&model);
    assert_clean_failure(&out, &["config.json", "not a regular file"]);
}

#[test]
fn resume_from_a_checkpoint_with_other_data_but_the_same_headers_is_refused() {
    let (tmp, out) = interrupted_conversion();
    // Another checkpoint: same config, same headers and sizes, one weight
    // differing in its lowest bit.
    let other = tmp.path().join("other");
    copy_dir(&fixture("deepseek_v3"), &other);
    let shard = shards(&other)[0].clone();
    let mut bytes = std::fs::read(&shard).unwrap();
    let data_start = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    bytes[data_start] ^= 1;
    std::fs::write(&shard, bytes).unwrap();
    let before = snapshot(&out);
    let resumed = convert(&other, &out, &["--resume"]);
    assert_clean_failure(&resumed, &["not from this input", "its data"]);
    assert_eq!(snapshot(&out), before);
}

#[test]
fn a_conversion_that_fills_the_disk_leaves_no_partial_file() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("c");
    // A 64-block file size limit: the first write past it fails with
    // EFBIG, as one past a full disk fails with ENOSPC.
    let input = fixture("deepseek_v3");
    let args = ["convert", "--quiet", "--input", input.to_str().unwrap()];
    let status = common::moestream_bounded(
        &[&args[..], &["--output", out.to_str().unwrap()]].concat(),
        Some(64),
    );
    assert!(!status.ok);
    assert!(status.stderr.contains("too large"), "{}", status.stderr);
    let partial: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp"))
        .collect();
    assert!(partial.is_empty(), "partial files left: {partial:?}");
}

#[test]
fn an_unknown_container_version_is_refused_naming_the_field() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("c");
    assert!(convert(&fixture("qwen3_moe"), &out, &[]).ok);
    for shard in shards(&out) {
        let (mut header, data) = common::read_shard(&shard);
        header["__metadata__"]["moestream.container"] = serde_json::json!("99");
        common::write_shard(&shard, &header, &data);
    }
    let run = run_ok(&out);
    common::assert_clean_failure(
        &run,
        &[
            "moestream.container",
            "version 99 is not supported",
            "version 1",
        ],
    );
}
