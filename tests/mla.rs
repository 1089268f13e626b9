//! DeepSeek-V3 / GLM specifics beyond the golden tests: the two MLA paths
//! agree, the compressed cache holds only latent + rotary key, the DSA
//! indexer is exactly dense attention when it keeps everything, the MTP
//! head matches the PyTorch reference (one step and 3-step drafts), router
//! selections feed the usage counters, and bad MLA/DSA/router configs are
//! named.

mod common;

use common::{assert_clean_failure, eval_json, fixture, moestream, oracle_at, u32s};

fn oracle(family: &str) -> Value {
    oracle_at(&fixture(family))
}
use moestream::engine::generate::{evaluate, generate, GenOptions};
use moestream::engine::sampler::SamplingParams;
use moestream::model::mla::{DsaMode, MlaMode};
use moestream::model::{LoadOptions, Model};
use serde_json::Value;
use std::path::Path;

fn load(dir: &Path, mla: MlaMode, dsa: DsaMode) -> Model {
    // No usage history: the counters are this test's alone (a history
    // saved by an earlier run on the fixture would add to them).
    let opts = LoadOptions {
        mla,
        dsa,
        pin_history: false,
        ..LoadOptions::default()
    };
    Model::load(dir, &opts).unwrap()
}

fn greedy(model: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let opts = GenOptions {
        max_tokens: n,
        sampling: SamplingParams::default(),
        ignore_eos: true,
        eos_ids: vec![],
        speculation: Default::default(),
        constraint: None,
        logit_bias: Vec::new(),
    };
    generate(model, prompt, &opts, |_| Ok(()))
        .unwrap()
        .token_ids
}

fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

#[test]
fn absorbed_and_explicit_mla_give_identical_tokens() {
    for family in ["deepseek_v3", "glm_moe_dsa"] {
        let o = oracle(family);
        let prompt = u32s(&o["prompt_ids"]);
        let absorb = load(&fixture(family), MlaMode::Absorb, DsaMode::Auto);
        let explicit = load(&fixture(family), MlaMode::Explicit, DsaMode::Auto);
        let (ta, te) = (greedy(&absorb, &prompt, 20), greedy(&explicit, &prompt, 20));
        assert_eq!(ta, te, "{family}: absorb vs explicit tokens");
        assert_eq!(ta, u32s(&o["greedy_ids"]), "{family}");
        let eval_ids = u32s(&o["eval_ids"]);
        let (ea, ee) = (
            evaluate(&absorb, &eval_ids).unwrap(),
            evaluate(&explicit, &eval_ids).unwrap(),
        );
        assert_eq!(ea.argmax, ee.argmax, "{family}");
        let d = max_rel_diff(&ea.last_logits, &ee.last_logits);
        assert!(
            d < 1e-5,
            "{family}: absorb vs explicit logits differ by {d:e}"
        );
    }
}

#[test]
fn compressed_cache_holds_latent_and_rotary_key_only() {
    for family in ["deepseek_v3", "glm_moe_dsa"] {
        let model = load(&fixture(family), MlaMode::Auto, DsaMode::Auto);
        let m = model.cfg.mla.as_ref().unwrap();
        let kv = model.new_kv(8);
        let want = model.cfg.num_layers * (m.kv_lora_rank + m.qk_rope_head_dim) * 4;
        assert_eq!(kv.attention_bytes_per_token(), want, "{family}");
        let full_kv =
            model.cfg.num_layers * model.cfg.num_heads * (m.qk_head_dim() + m.v_head_dim) * 4;
        assert!(want < full_kv);
    }
}

#[test]
fn dsa_keeping_everything_is_bit_identical_to_dense_attention() {
    let dir = fixture("glm_moe_dsa");
    let topk = load(&dir, MlaMode::Auto, DsaMode::Auto)
        .cfg
        .indexer
        .as_ref()
        .unwrap()
        .topk;
    let ids: Vec<u32> = u32s(&oracle("glm_moe_dsa")["eval_ids"])[..topk].to_vec();
    for mode in [MlaMode::Absorb, MlaMode::Explicit] {
        let on = evaluate(&load(&dir, mode, DsaMode::On), &ids).unwrap();
        let off = evaluate(&load(&dir, mode, DsaMode::Off), &ids).unwrap();
        assert_eq!(on.argmax, off.argmax);
        let same = on
            .last_logits
            .iter()
            .zip(&off.last_logits)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "{mode:?}: logits must be bit-identical when the context fits index_topk"
        );
    }
}

#[test]
fn dsa_selection_changes_long_contexts() {
    let dir = fixture("glm_moe_dsa");
    let o = oracle("glm_moe_dsa");
    let ids = u32s(&o["eval_ids"]);
    let on = evaluate(&load(&dir, MlaMode::Auto, DsaMode::On), &ids).unwrap();
    let auto = evaluate(&load(&dir, MlaMode::Auto, DsaMode::Auto), &ids).unwrap();
    let off = evaluate(&load(&dir, MlaMode::Auto, DsaMode::Off), &ids).unwrap();
    assert_eq!(on.argmax, u32s(&o["argmax"]));
    assert_eq!(
        on.last_logits, auto.last_logits,
        "auto only skips scoring where everything is kept"
    );
    assert!(
        max_rel_diff(&off.last_logits, &on.last_logits) > 1e-3,
        "the indexer must matter past index_topk"
    );
}

#[test]
fn mtp_one_step_matches_the_reference_through_eval() {
    for family in [
        "deepseek_v3",
        "glm4_moe",
        "glm_moe_dsa",
        "trained/deepseek_v3",
    ] {
        let o = oracle(family);
        let v = eval_json(&fixture(family), &["--mtp"]);
        assert_eq!(
            u32s(&v["mtp_argmax"]),
            u32s(&o["mtp"]["one_step"]),
            "{family}"
        );
        let got: Vec<f32> = v["mtp_last_logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let want: Vec<f32> = o["mtp"]["one_step_last_logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let d = max_rel_diff(&got, &want);
        assert!(d <= 1e-4, "{family}: MTP logits rel diff {d:e}");
    }
}

#[test]
fn mtp_drafts_match_the_reference() {
    for family in [
        "deepseek_v3",
        "glm4_moe",
        "glm_moe_dsa",
        "trained/deepseek_v3",
    ] {
        let o = oracle(family);
        let prompt = u32s(&o["prompt_ids"]);
        let next = u32s(&o["greedy_ids"])[0];
        let want = u32s(&o["mtp"]["draft3"]);
        for mode in [MlaMode::Absorb, MlaMode::Explicit] {
            let model = load(&fixture(family), mode, DsaMode::Auto);
            assert_eq!(
                model.draft(&prompt, next, 1).unwrap(),
                want[..1],
                "{family} one-step draft"
            );
            assert_eq!(
                model.draft(&prompt, next, 3).unwrap(),
                want,
                "{family} 3-step draft"
            );
        }
    }
}

#[test]
fn mtp_is_a_clear_error_without_the_layer() {
    let model = load(&fixture("qwen3_moe"), MlaMode::Auto, DsaMode::Auto);
    let e = model.draft(&[1, 2, 3], 4, 2).unwrap_err().to_string();
    assert!(e.contains("no MTP layer"), "{e}");
}

#[test]
fn router_selections_feed_the_usage_counters() {
    let model = load(&fixture("deepseek_v3"), MlaMode::Auto, DsaMode::Auto);
    let prompt = u32s(&oracle("deepseek_v3")["prompt_ids"]);
    let n = 5;
    greedy(&model, &prompt, n);
    // Forwarded tokens: the prompt once, then n - 1 decode steps.
    let tokens = (prompt.len() + n - 1) as u64;
    for l in 0..model.cfg.num_layers {
        let total: u64 = (0..model.store.experts_in(l))
            .map(|e| model.store.usage(l, e).count)
            .sum();
        let want = if model.cfg.sparse_layers[l] {
            tokens * model.cfg.top_k as u64
        } else {
            0
        };
        assert_eq!(total, want, "layer {l}");
    }
    let hottest = (0..model.cfg.num_experts)
        .map(|e| model.store.usage(1, e))
        .max_by_key(|u| u.count)
        .unwrap();
    assert!(hottest.heat > 0 && hottest.last_use > 0);
}

fn assert_run_fails_naming(dir: &Path, needles: &[&str]) {
    let out = moestream(&[
        "run",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        "1,2,3",
        "--json",
    ]);
    assert_clean_failure(&out, needles);
}

/// A writable copy of a fixture.
fn copy_fixture(family: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixture(family)).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
    }
    dir
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let path = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    f(v.as_object_mut().unwrap());
    std::fs::write(&path, v.to_string()).unwrap();
}

#[test]
fn missing_mla_field_is_named() {
    let dir = copy_fixture("deepseek_v3");
    edit_config(dir.path(), |c| {
        c.remove("kv_lora_rank");
    });
    assert_run_fails_naming(dir.path(), &["kv_lora_rank", "config.json"]);
}

#[test]
fn index_topk_zero_is_named() {
    let dir = copy_fixture("glm_moe_dsa");
    edit_config(dir.path(), |c| {
        c.insert("index_topk".into(), 0.into());
    });
    assert_run_fails_naming(dir.path(), &["index_topk", "> 0"]);
}

#[test]
fn n_group_not_dividing_experts_is_named() {
    let dir = copy_fixture("deepseek_v3");
    edit_config(dir.path(), |c| {
        c.insert("n_group".into(), 3.into());
        c.insert("topk_group".into(), 1.into());
    });
    assert_run_fails_naming(dir.path(), &["n_group", "does not divide"]);
}

#[test]
fn inconsistent_mla_shapes_are_named() {
    let dir = copy_fixture("deepseek_v3");
    edit_config(dir.path(), |c| {
        c.insert("v_head_dim".into(), 13.into());
    });
    assert_run_fails_naming(dir.path(), &["kv_b_proj.weight", "shape"]);
}

#[test]
fn shared_first_indexer_layer_is_named() {
    let dir = copy_fixture("glm_moe_dsa");
    edit_config(dir.path(), |c| {
        c.insert(
            "indexer_types".into(),
            serde_json::json!(["shared", "full", "full"]),
        );
    });
    assert_run_fails_naming(dir.path(), &["indexer_types"]);
}
