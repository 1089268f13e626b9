//! NaN and Inf never become tokens (the hardening issue's defect 4): a
//! non-finite resident weight is refused at load and at convert, naming the
//! tensor; a non-finite expert weight, streamed after load, stops the
//! forward at the first layer whose output it poisons, naming that layer.

mod common;

use common::{
    assert_clean_failure, fixture, moestream, read_shard, run_json, shard_of, write_shard,
};
use std::path::Path;

/// A copy of the qwen3_moe fixture with element 0 of each of `tensors`
/// (F32 in this fixture) set to `value`.
fn poisoned(tensors: &[String], value: f32) -> tempfile::TempDir {
    let tmp = common::copy_fixture("qwen3_moe");
    for name in tensors {
        let shard = shard_of(tmp.path(), name);
        let (header, mut data) = read_shard(&shard);
        assert_eq!(header[name]["dtype"], "F32", "{name}");
        let start = header[name]["data_offsets"][0].as_u64().unwrap() as usize;
        data[start..start + 4].copy_from_slice(&value.to_le_bytes());
        write_shard(&shard, &header, &data);
    }
    tmp
}

fn expert_weights(layer: usize, experts: usize) -> Vec<String> {
    (0..experts)
        .map(|e| format!("model.layers.{layer}.mlp.experts.{e}.down_proj.weight"))
        .collect()
}

fn experts_in_fixture() -> usize {
    let cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("qwen3_moe").join("config.json")).unwrap(),
    )
    .unwrap();
    cfg["num_local_experts"].as_u64().unwrap() as usize
}

#[test]
fn a_non_finite_resident_weight_is_refused_at_load_by_name() {
    for value in [f32::NAN, f32::INFINITY] {
        let name = "model.norm.weight".to_string();
        let dir = poisoned(std::slice::from_ref(&name), value);
        let out = run_json(dir.path(), &[]);
        assert_clean_failure(&out, &[&name, "not finite"]);
        let name = "model.embed_tokens.weight".to_string();
        let dir = poisoned(std::slice::from_ref(&name), value);
        assert_clean_failure(&run_json(dir.path(), &[]), &[&name, "not finite"]);
    }
}

#[test]
fn a_non_finite_streamed_expert_stops_at_its_layer() {
    let dir = poisoned(&expert_weights(0, experts_in_fixture()), f32::NAN);
    let out = run_json(dir.path(), &[]);
    assert_clean_failure(&out, &["non-finite", "after layer 0"]);
    let eval = moestream(&[
        "eval",
        "--model",
        dir.path().to_str().unwrap(),
        "--prompt-ids",
        "1,2,3",
        "--json",
    ]);
    assert_clean_failure(&eval, &["non-finite", "after layer 0"]);
}

#[test]
fn convert_refuses_a_non_finite_weight_by_name() {
    let name = expert_weights(2, 1).remove(0);
    let dir = poisoned(std::slice::from_ref(&name), f32::NEG_INFINITY);
    let out_dir = tempfile::tempdir().unwrap();
    let out = moestream(&[
        "convert",
        "--input",
        dir.path().to_str().unwrap(),
        "--output",
        out_dir.path().join("c").to_str().unwrap(),
        "--quiet",
    ]);
    assert_clean_failure(&out, &[&name, "not finite"]);
    assert!(!Path::new(&out_dir.path().join("c").join("config.json")).exists());
}

#[test]
fn a_non_finite_container_scale_is_refused_at_load_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("c");
    let converted = moestream(&[
        "convert",
        "--input",
        fixture("qwen3_moe").to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(converted.ok, "{}", converted.stderr);
    // A resident int8 matrix's row scales.
    let name = "model.layers.0.self_attn.q_proj.weight";
    let scales = moestream::weights::index::scales_name(name);
    let shard = shard_of(&out, &scales);
    let (header, mut data) = read_shard(&shard);
    assert_eq!(header[&scales]["dtype"], "F32");
    let start = header[&scales]["data_offsets"][0].as_u64().unwrap() as usize;
    data[start..start + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    write_shard(&shard, &header, &data);
    let ran = run_json(&out, &[]);
    assert_clean_failure(&ran, &[name, "not finite"]);
}
