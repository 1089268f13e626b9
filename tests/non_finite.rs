//! NaN and Inf never become tokens (the hardening issue's defect 4): a
//! non-finite resident weight is refused at load and at convert, naming the
//! tensor; a non-finite expert weight, streamed after load, stops the
//! forward at the first layer whose output it poisons, naming that layer.
//! Scales (issue 31): a NaN row scale of a container's packed tensor, or
//! block scale (`d`, `dmin`) of GGUF blocks, is refused where its bytes
//! enter (at load; a streamed expert as it lands), naming the tensor and
//! the row or block: the integer kernels would otherwise lose it (a NaN it
//! gives an activation quantizes to 0 for the next product). The runtime
//! quantizer (`--quantize-at-load`) refuses a NaN weight as the normal
//! path does rather than quantizing it to 0.

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

/// The fixture converted to the container (per-row int4 experts, `row4`:
/// every packed matrix has an f32 scale per row; int8 attention).
fn converted() -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("c");
    let converted = moestream(&[
        "convert",
        "--input",
        fixture("qwen3_moe").to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
        "--quiet",
        "--recipe",
        "row4",
    ]);
    assert!(converted.ok, "{}", converted.stderr);
    (tmp, out)
}

/// Sets row `row`'s f32 scale of packed tensor `name` in container `dir`.
fn poison_row_scale(dir: &Path, name: &str, row: usize, value: f32) {
    let scales = moestream::formats::weights::index::scales_name(name);
    let shard = shard_of(dir, &scales);
    let (header, mut data) = read_shard(&shard);
    assert_eq!(header[&scales]["dtype"], "F32");
    let start = header[&scales]["data_offsets"][0].as_u64().unwrap() as usize + 4 * row;
    data[start..start + 4].copy_from_slice(&value.to_le_bytes());
    write_shard(&shard, &header, &data);
}

#[test]
fn a_non_finite_streamed_container_expert_scale_is_refused_as_it_lands() {
    let (_tmp, out) = converted();
    // Every expert of layer 0, so whichever is routed first lands poisoned:
    // a gate row (whose NaN the down product's activation quantization
    // would turn into 0) and a down row.
    let names = |proj: &str| {
        (0..experts_in_fixture())
            .map(|e| format!("model.layers.0.mlp.experts.{e}.{proj}.weight"))
            .collect::<Vec<_>>()
    };
    for (proj, row) in [("gate_proj", 3), ("down_proj", 0)] {
        for name in names(proj) {
            poison_row_scale(&out, &name, row, f32::NAN);
        }
        let ran = run_json(&out, &[]);
        let at = format!("row {row}");
        let needles = ["model.layers.0.mlp.experts.", proj, &at, "not finite"];
        assert_clean_failure(&ran, &needles);
        // Healed (any finite scale) for the next part.
        for name in names(proj) {
            poison_row_scale(&out, &name, row, 0.01);
        }
    }
}

/// The byte offsets of the f16 scales in one block of GGUF type `ty`
/// (`d`, then `dmin` for the K types that have it), and the block size.
fn scale_offsets(ty: u32) -> (usize, &'static [usize]) {
    match ty {
        2 => (18, &[0]),      // Q4_0
        8 => (34, &[0]),      // Q8_0
        12 => (144, &[0, 2]), // Q4_K
        13 => (176, &[0, 2]), // Q5_K
        14 => (210, &[208]),  // Q6_K
        _ => panic!("ggml type {ty} is not a block type"),
    }
}

/// A copy of GGUF fixture `file` with scale `which` (an index into
/// [`scale_offsets`]) of block `block` of tensor `tensor` set to f16 NaN
/// (of every expert's slice, for a stacked expert tensor); the copy's path.
fn poisoned_gguf(
    file: &str,
    tensor: &str,
    (block, which): (usize, usize),
) -> (tempfile::TempDir, std::path::PathBuf) {
    let src = fixture("gguf").join(file);
    let g = moestream::formats::gguf::file::GgufFile::open(&src).unwrap();
    let t = g.tensors.iter().find(|t| t.name == tensor).unwrap();
    let experts = match tensor.contains("_exps") {
        true => g.get("qwen3moe.expert_count").unwrap().as_u64().unwrap() as usize,
        false => 1,
    };
    let (block_bytes, offsets) = scale_offsets(t.ty);
    let mut bytes = std::fs::read(&src).unwrap();
    let slice = t.bytes as usize / experts;
    for e in 0..experts {
        let at = t.offset as usize + e * slice + block * block_bytes + offsets[which];
        bytes[at..at + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
    }
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(file);
    std::fs::write(&path, bytes).unwrap();
    (tmp, path)
}

const GGUF_TYPES: [&str; 4] = [
    "qwen3moe-Q4_0.gguf",
    "qwen3moe-Q4_K_M.gguf",
    "qwen3moe-Q5_K_M.gguf",
    "qwen3moe-Q8_0.gguf",
];

#[test]
fn a_non_finite_resident_gguf_block_scale_is_refused_naming_the_block() {
    for file in GGUF_TYPES {
        let last = if file.contains("_K") { 1 } else { 0 };
        let (_tmp, path) = poisoned_gguf(file, "blk.0.attn_q.weight", (0, last));
        let ran = run_json(&path, &[]);
        let name = "model.layers.0.self_attn.q_proj.weight";
        assert_clean_failure(&ran, &[name, "row 0", "block 0", "not finite"]);
    }
    // The Q6_K output matrix.
    let (_tmp, path) = poisoned_gguf("qwen3moe-Q4_0.gguf", "output.weight", (0, 0));
    let ran = run_json(&path, &[]);
    assert_clean_failure(&ran, &["lm_head.weight", "Q6_K block 0", "not finite"]);
}

#[test]
fn a_non_finite_streamed_gguf_expert_scale_is_refused_as_it_lands() {
    for file in GGUF_TYPES {
        // dmin where the type has one, `d` otherwise.
        let last = if file.contains("_K") { 1 } else { 0 };
        for proj in ["gate", "down"] {
            let tensor = format!("blk.0.ffn_{proj}_exps.weight");
            let (_tmp, path) = poisoned_gguf(file, &tensor, (0, last));
            let ran = run_json(&path, &[]);
            let part = format!("{proj}_proj.weight");
            let needles = [
                "model.layers.0.mlp.experts.",
                &part,
                "block 0",
                "not finite",
            ];
            assert_clean_failure(&ran, &needles);
        }
    }
}

#[test]
fn quantize_at_load_refuses_a_non_finite_weight_by_name() {
    // A resident matrix the runtime quantizer narrows to int8.
    let name = "model.layers.0.self_attn.q_proj.weight".to_string();
    let dir = poisoned(std::slice::from_ref(&name), f32::NAN);
    let ran = run_json(dir.path(), &["--quantize-at-load", "4"]);
    assert_clean_failure(&ran, &[&name, "not finite"]);
    // Every expert of layer 0 (streamed, narrowed to int4 as it lands).
    let dir = poisoned(&expert_weights(0, experts_in_fixture()), f32::NAN);
    let ran = run_json(dir.path(), &["--quantize-at-load", "4"]);
    assert_clean_failure(
        &ran,
        &["model.layers.0.mlp.experts.", "down_proj", "not finite"],
    );
}

#[test]
fn a_non_finite_container_scale_is_refused_at_load_by_name() {
    let (_tmp, out) = converted();
    // A resident int8 matrix's row scales.
    let name = "model.layers.0.self_attn.q_proj.weight";
    poison_row_scale(&out, name, 0, f32::NAN);
    let ran = run_json(&out, &[]);
    assert_clean_failure(&ran, &[name, "row 0", "not finite"]);
}
