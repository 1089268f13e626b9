//! Bad input: each broken checkpoint or request gives a clear error naming
//! the file, tensor or field — never a panic, never output on stdout.

mod common;

use common::{
    assert_clean_failure, ids, moestream, read_shard, shard_of, tiny_model, write_shard, Out,
};
use std::path::Path;

fn run(dir: &Path, prompt: &[u32]) -> Out {
    moestream(&[
        "run",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        &ids(prompt),
        "--max-tokens",
        "3",
        "--ignore-eos",
        "--json",
    ])
}

#[test]
fn the_tiny_model_runs() {
    let dir = tiny_model();
    let out = run(dir.path(), &[1, 2, 3]);
    assert!(out.ok, "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["token_ids"].as_array().unwrap().len(), 3);
}

#[test]
fn missing_tensor_is_named() {
    let dir = tiny_model();
    let name = "model.layers.1.self_attn.k_proj.weight";
    let shard = shard_of(dir.path(), name);
    let (mut header, data) = read_shard(&shard);
    let entry = header.as_object_mut().unwrap().remove(name).unwrap();
    // Keep the data section valid: re-home the entry under another name.
    header["unused.padding"] = entry;
    write_shard(&shard, &header, &data);
    assert_clean_failure(&run(dir.path(), &[1, 2]), &["missing tensor", name]);
}

#[test]
fn missing_expert_tensor_is_named() {
    let dir = tiny_model();
    let name = "model.layers.1.mlp.experts.3.down_proj.weight";
    let shard = shard_of(dir.path(), name);
    let (mut header, data) = read_shard(&shard);
    let entry = header.as_object_mut().unwrap().remove(name).unwrap();
    header["unused.padding"] = entry;
    write_shard(&shard, &header, &data);
    assert_clean_failure(&run(dir.path(), &[1, 2]), &["missing tensor", name]);
}

#[test]
fn truncated_shard_is_named() {
    let dir = tiny_model();
    let shard = shard_of(dir.path(), "lm_head.weight");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() - 100]).unwrap();
    let file = shard.file_name().unwrap().to_str().unwrap();
    assert_clean_failure(&run(dir.path(), &[1, 2]), &[file, "truncated"]);
}

#[test]
fn missing_shard_is_named() {
    let dir = tiny_model();
    let shard = shard_of(dir.path(), "lm_head.weight");
    std::fs::remove_file(&shard).unwrap();
    let file = shard.file_name().unwrap().to_str().unwrap();
    assert_clean_failure(&run(dir.path(), &[1, 2]), &[file, "missing"]);
}

#[test]
fn header_offsets_past_the_file_are_named() {
    let dir = tiny_model();
    let name = "model.norm.weight";
    let shard = shard_of(dir.path(), name);
    let (mut header, data) = read_shard(&shard);
    // Make the header claim a data section 64 bytes longer than the file:
    // shift every tensor's offsets that start at or after the last end.
    let end = header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(_, v)| v["data_offsets"][1].as_u64().unwrap())
        .max()
        .unwrap();
    let last = header
        .as_object()
        .unwrap()
        .iter()
        .find(|(_, v)| v["data_offsets"][1].as_u64() == Some(end))
        .map(|(k, _)| k.clone())
        .unwrap();
    let begin = header[&last]["data_offsets"][0].as_u64().unwrap();
    // Grow the last tensor by one row's worth by claiming a longer shape.
    let shape = header[&last]["shape"].as_array().unwrap().clone();
    let mut grown = shape.clone();
    grown[0] = serde_json::json!(shape[0].as_u64().unwrap() * 2);
    let elem = (end - begin) / shape.iter().map(|d| d.as_u64().unwrap()).product::<u64>();
    let new_end = begin + elem * grown.iter().map(|d| d.as_u64().unwrap()).product::<u64>();
    header[&last]["shape"] = serde_json::Value::Array(grown);
    header[&last]["data_offsets"] = serde_json::json!([begin, new_end]);
    write_shard(&shard, &header, &data);
    let file = shard.file_name().unwrap().to_str().unwrap();
    assert_clean_failure(&run(dir.path(), &[1, 2]), &[file, &last, "header lies"]);
}

#[test]
fn unknown_model_type_is_named() {
    let dir = tiny_model();
    let path = dir.path().join("config.json");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("\"qwen3_moe\"", "\"gpt_moe_9000\"")).unwrap();
    assert_clean_failure(
        &run(dir.path(), &[1, 2]),
        &["gpt_moe_9000", "model_type", "config.json"],
    );
}

#[test]
fn missing_config_field_is_named() {
    let dir = tiny_model();
    let path = dir.path().join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v.as_object_mut().unwrap().remove("num_experts_per_tok");
    std::fs::write(&path, v.to_string()).unwrap();
    assert_clean_failure(
        &run(dir.path(), &[1, 2]),
        &["num_experts_per_tok", "config.json"],
    );
}

#[test]
fn wrong_dtype_is_named() {
    let dir = tiny_model();
    let name = "model.layers.0.self_attn.q_proj.weight";
    let shard = shard_of(dir.path(), name);
    let (mut header, data) = read_shard(&shard);
    header[name]["dtype"] = serde_json::json!("I16");
    write_shard(&shard, &header, &data);
    assert_clean_failure(&run(dir.path(), &[1, 2]), &[name, "dtype", "I16"]);
}

#[test]
fn wrong_shape_is_named() {
    let dir = tiny_model();
    let name = "model.layers.1.mlp.gate.weight";
    let shard = shard_of(dir.path(), name);
    let (mut header, data) = read_shard(&shard);
    let shape = header[name]["shape"].as_array().unwrap().clone();
    header[name]["shape"] = serde_json::json!([shape[1], shape[0]]);
    write_shard(&shard, &header, &data);
    assert_clean_failure(&run(dir.path(), &[1, 2]), &[name, "shape"]);
}

#[test]
fn token_out_of_vocabulary_is_named() {
    let dir = tiny_model();
    let out = run(dir.path(), &[1, 999_999, 2]);
    assert_clean_failure(&out, &["999999", "out of vocabulary", "position 1"]);
}

#[test]
fn eval_rejects_out_of_vocabulary_too() {
    let dir = tiny_model();
    let out = moestream(&[
        "eval",
        "--model",
        dir.path().to_str().unwrap(),
        "--prompt-ids",
        "5,70000",
        "--json",
    ]);
    assert_clean_failure(&out, &["70000", "out of vocabulary"]);
}

#[test]
fn missing_model_dir_is_named() {
    let out = run(Path::new("/nonexistent/moestream-model"), &[1]);
    assert_clean_failure(&out, &["/nonexistent/moestream-model"]);
}

#[test]
fn an_empty_tokenizer_vocabulary_is_refused_naming_the_file() {
    let text = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
        "normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":null,
        "model":{"type":"WordLevel","vocab":{},"unk_token":"[UNK]"}}"#;
    let path = std::path::Path::new("/models/empty/tokenizer.json");
    let err = moestream::formats::tokenizer::Tokenizer::from_json(path, text)
        .err()
        .expect("an empty vocabulary was accepted");
    let text = err.to_string();
    assert!(
        text.contains("/models/empty/tokenizer.json") && text.contains("vocabulary is empty"),
        "{text}"
    );
}
