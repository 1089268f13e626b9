//! `moestream calibrate` and `convert --importance`: the taps record every
//! input a quantized matrix reads, under the key the converter looks it up
//! by, without changing a token; the importance file weighs the converter's
//! rounding and is refused where it does not fit the model.

mod common;

use common::{assert_clean_failure, fixture, moestream, FAMILIES};
use moestream::engine::calibrate::calibrate;
use moestream::formats::quant::importance::{key_of_tensor, Importance};
use moestream::formats::quant::policy::{layer_index, Class};
use moestream::formats::weights::WeightIndex;
use moestream::model::profile::Profile;
use moestream::model::{LoadOptions, Model};
use moestream_io::ReadMode;
use std::collections::BTreeSet;
use std::path::Path;

fn load(dir: &Path) -> Model {
    let opts = LoadOptions {
        pin_history: false,
        ..LoadOptions::default()
    };
    Model::load(dir, &opts).expect("load fixture")
}

/// `n` spread-out token ids.
fn ids(n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7919 + 13) % vocab) as u32).collect()
}

/// Every quantized-class matrix of the decoder (not the MTP head) whose
/// input calibration records, by key, with its column count.
fn calibrated_tensors(dir: &Path, layers: usize) -> Vec<(String, String, usize)> {
    let index = WeightIndex::open(dir, ReadMode::Buffered).unwrap();
    let mut out = Vec::new();
    for (name, e) in index.iter() {
        let mtp = layer_index(name).is_some_and(|l| l >= layers);
        if e.shape.len() != 2 || mtp || name.ends_with("_scale_inv") {
            continue;
        }
        if let Some(key) = key_of_tensor(name) {
            out.push((name.clone(), key, e.shape[1]));
        }
    }
    out
}

#[test]
fn every_family_records_each_input_under_the_key_its_tensors_look_up() {
    for family in FAMILIES {
        let dir = fixture(family);
        let model = load(&dir);
        let toks = ids(96, model.cfg.vocab_size);
        let imp = calibrate(&model, &toks, 40, Path::new("mem")).unwrap();
        assert_eq!(imp.tokens, 96, "{family}");
        let tensors = calibrated_tensors(&dir, model.cfg.num_layers);
        let claimed: BTreeSet<&String> = tensors.iter().map(|t| &t.1).collect();
        for key in imp.inputs.keys() {
            assert!(
                claimed.contains(key),
                "{family}: `{key}` is read by no tensor"
            );
        }
        for (name, key, cols) in &tensors {
            let expert = name.contains(".experts.");
            match imp.inputs.get(key) {
                Some(c) => {
                    assert_eq!(c.mean_squares.len(), *cols, "{family} {name}");
                    assert!(c.rows > 0 && c.mean_squares.iter().any(|v| *v > 0.0));
                    if !expert {
                        assert_eq!(c.rows, 96, "{family} {name}: every token passes");
                    }
                }
                // A routed expert no token picked records nothing.
                None => assert!(expert, "{family}: {name} ({key}) not recorded"),
            }
        }
    }
}

#[test]
fn the_taps_change_no_logit() {
    let model = load(&fixture("deepseek_v3"));
    let toks = ids(50, model.cfg.vocab_size);
    let logits = |m: &Model| {
        let mut kv = m.new_kv(toks.len());
        m.prefill(&toks, &mut kv, true, &mut Profile::default())
            .unwrap()
    };
    let before = logits(&model);
    moestream::layers::tap::install();
    let during = logits(&model);
    let recorded = moestream::layers::tap::finish();
    assert!(!recorded.sites.is_empty());
    assert_eq!(before, during);
}

/// The first tensor of the checkpoint in `dir` whose class is `class`.
fn a_tensor_of(dir: &Path, class: Class, layers: usize) -> String {
    let index = WeightIndex::open(dir, ReadMode::Buffered).unwrap();
    let name = index
        .iter()
        .map(|(n, e)| (n, e.shape.clone()))
        .find(|(n, s)| Class::of(n, s, layers) == class)
        .map(|(n, _)| n.clone());
    name.expect("a tensor of the class")
}

#[test]
fn convert_with_importance_weighs_the_rounding_and_refuses_another_model_s_file() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fixture("trained/qwen3_moe");
    let text = tmp.path().join("calib.txt");
    let prose = "The interpreter reads a line, evaluates it and prints the result. \
                 A function is defined with def and called by name. ";
    std::fs::write(&text, prose.repeat(12)).unwrap();
    let imp = tmp.path().join("qwen3.imp");
    let out = moestream(&[
        "calibrate",
        "--model",
        model.to_str().unwrap(),
        "--text",
        text.to_str().unwrap(),
        "--out",
        imp.to_str().unwrap(),
        "--window",
        "128",
    ]);
    assert!(out.ok, "{}", out.stderr);
    let read = Importance::read(&imp).unwrap();
    assert!(read.tokens > 100 && read.inputs.contains_key("head"));
    // Converted with and without: weighted matrices store other bytes, the
    // weighted container runs, and the count is said.
    let convert = |name: &str, extra: &[&str]| {
        let dst = tmp.path().join(name);
        let mut args = vec![
            "convert",
            "--input",
            model.to_str().unwrap(),
            "--output",
            dst.to_str().unwrap(),
            "--quiet",
        ];
        args.extend(extra);
        (moestream(&args), dst)
    };
    let (plain, plain_dir) = convert("plain", &[]);
    assert!(plain.ok, "{}", plain.stderr);
    let (weighted, weighted_dir) = convert("weighted", &["--importance", imp.to_str().unwrap()]);
    assert!(weighted.ok, "{}", weighted.stderr);
    assert!(
        weighted.stderr.contains("integer matrices weighted"),
        "{}",
        weighted.stderr
    );
    let q = a_tensor_of(&model, Class::Attention, 4);
    let bytes = |dir: &Path| {
        let index = WeightIndex::open(dir, ReadMode::Buffered).unwrap();
        let e = index.entry(&q).unwrap().clone();
        index.shards[e.shard]
            .reader
            .read(e.offset, e.len)
            .unwrap()
            .bytes()
            .to_vec()
    };
    assert_ne!(bytes(&plain_dir), bytes(&weighted_dir), "{q} weighted");
    let run = moestream(&[
        "run",
        "--model",
        weighted_dir.to_str().unwrap(),
        "--prompt",
        "def main",
        "--max-tokens",
        "4",
    ]);
    assert!(run.ok, "{}", run.stderr);
    // A file of another model (other widths) is refused naming a tensor,
    // before anything is written.
    let other = tmp.path().join("deepseek.imp");
    let out = moestream(&[
        "calibrate",
        "--model",
        fixture("deepseek_v3").to_str().unwrap(),
        "--text",
        text.to_str().unwrap(),
        "--out",
        other.to_str().unwrap(),
        "--max-tokens",
        "40",
    ]);
    assert!(out.ok, "{}", out.stderr);
    let (refused, dst) = convert("refused", &["--importance", other.to_str().unwrap()]);
    assert_clean_failure(
        &refused,
        &[
            "importance file refused",
            ".weight: its input has",
            "columns",
        ],
    );
    assert!(!dst.join("model.safetensors.index.json").exists());
}
