//! The hardening issue's smaller defects (9), each named after its fault:
//! a FIFO shard, eval past the context, invalid synthetic geometries, a
//! profile value not understood, a spurious warning before a load error,
//! and a missing tokenizer under `--prompt-ids --json`.

mod common;

use common::{assert_clean_failure, copy_fixture, fixture, moestream, moestream_env, run_json};
use std::path::Path;

#[test]
fn a_fifo_as_a_shard_is_refused_not_waited_on() {
    let dir = copy_fixture("qwen3_moe");
    let shard = dir.path().join("model-00002-of-00002.safetensors");
    std::fs::remove_file(&shard).unwrap();
    let c = std::ffi::CString::new(shard.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let out = run_json(dir.path(), &[]);
    assert_clean_failure(
        &out,
        &["model-00002-of-00002.safetensors", "not a regular file"],
    );
}

#[test]
fn eval_refuses_more_ids_than_the_context() {
    let ids: Vec<String> = (0..300).map(|i| (i % 50).to_string()).collect();
    let out = moestream(&[
        "eval",
        "--model",
        fixture("qwen3_moe").to_str().unwrap(),
        "--prompt-ids",
        &ids.join(","),
        "--json",
    ]);
    assert_clean_failure(&out, &["300", "max_position_embeddings"]);
}

#[test]
fn synth_refuses_geometries_no_model_can_have() {
    let tmp = tempfile::tempdir().unwrap();
    for (extra, needle) in [
        (&["--experts", "0"][..], "experts"),
        (&["--experts", "4", "--top-k", "5"][..], "top_k"),
        (&["--layers", "0"][..], "layers"),
    ] {
        let out_dir = tmp.path().join(format!("m{}", extra.join("")));
        let mut args = vec!["synth", "--out", out_dir.to_str().unwrap()];
        args.extend(extra);
        let out = moestream(&args);
        assert_clean_failure(&out, &[needle]);
        assert!(!out_dir.join("config.json").exists());
    }
}

#[test]
fn a_profile_value_not_understood_is_reported_as_replaced() {
    let cache = tempfile::tempdir().unwrap();
    let model = copy_fixture("qwen3_moe");
    let profile = moestream::fs::tuned::TunedProfile {
        version: 1,
        device: moestream::fs::state::device_of(model.path()).unwrap(),
        model: model.path().display().to_string(),
        read_mode: "bogus".into(),
        pipeline: true,
        prefetch: "sideways-9".into(),
        ram_gb: None,
        disk: Vec::new(),
        probes: Vec::new(),
    };
    moestream::fs::tuned::save_in(cache.path(), model.path(), &profile).unwrap();
    let m = model.path().to_str().unwrap();
    let args = [
        "run",
        "--model",
        m,
        "--prompt-ids",
        "1,2",
        "--max-tokens",
        "1",
    ];
    let out = moestream_env(
        &args,
        &[
            ("MOESTREAM_CACHE", cache.path().to_str().unwrap()),
            ("MOESTREAM_NO_HISTORY", "1"),
        ],
    );
    assert!(out.ok, "{}", out.stderr);
    let note = out
        .stderr
        .lines()
        .find(|l| l.starts_with("tuned profile"))
        .unwrap();
    assert!(note.contains("--io buffered"), "{note}");
    assert!(note.contains("--prefetch off"), "{note}");
    assert!(
        note.contains("read_mode `bogus`") && note.contains("prefetch `sideways-9`"),
        "{note}"
    );
}

#[test]
fn a_load_error_is_not_preceded_by_a_profile_warning() {
    let out = run_json(Path::new("/nonexistent/model"), &[]);
    assert_clean_failure(&out, &["/nonexistent/model"]);
    assert!(!out.stderr.contains("warning"), "{}", out.stderr);
}

#[test]
fn a_missing_tokenizer_under_prompt_ids_json_warns() {
    let dir = copy_fixture("qwen3_moe");
    std::fs::remove_file(dir.path().join("tokenizer.json")).unwrap();
    let out = run_json(dir.path(), &[]);
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stderr.contains("warning") && out.stderr.contains("tokenizer.json"),
        "{}",
        out.stderr
    );
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(v["text"], "");
    assert_eq!(v["token_ids"].as_array().unwrap().len(), 2);
}
