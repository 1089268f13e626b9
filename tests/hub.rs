//! `--model org/name` resolves a snapshot in a Hugging Face hub-layout
//! cache, offline, and runs it like its directory; a model that is not
//! there is a clean error listing what is.

mod common;

use common::{assert_clean_failure, fixture, moestream_env};

/// A hub cache holding the qwen3_moe fixture as `acme/tiny` (blobs, a
/// snapshot of symlinks into them, `refs/main`).
fn hub() -> tempfile::TempDir {
    let cache = tempfile::tempdir().unwrap();
    let m = cache.path().join("models--acme--tiny");
    let snap = m.join("snapshots/0123abc");
    std::fs::create_dir_all(m.join("blobs")).unwrap();
    std::fs::create_dir_all(m.join("refs")).unwrap();
    std::fs::create_dir_all(&snap).unwrap();
    for (i, e) in std::fs::read_dir(fixture("qwen3_moe")).unwrap().enumerate() {
        let p = e.unwrap().path();
        let blob = format!("blob{i}");
        std::fs::copy(&p, m.join("blobs").join(&blob)).unwrap();
        std::os::unix::fs::symlink(
            format!("../../blobs/{blob}"),
            snap.join(p.file_name().unwrap()),
        )
        .unwrap();
    }
    std::fs::write(m.join("refs/main"), "0123abc").unwrap();
    cache
}

fn run(model: &str, cache: &std::path::Path) -> common::Out {
    let args = [
        "run",
        "--model",
        model,
        "--prompt-ids",
        "1,2,3",
        "--max-tokens",
        "4",
        "--json",
    ];
    moestream_env(
        &args,
        &[
            ("HF_HUB_CACHE", cache.to_str().unwrap()),
            ("MOESTREAM_NO_HISTORY", "1"),
        ],
    )
}

#[test]
fn a_hub_id_runs_its_snapshot() {
    let cache = hub();
    let by_id = run("acme/tiny", cache.path());
    assert!(by_id.ok, "{}", by_id.stderr);
    let by_dir = run(fixture("qwen3_moe").to_str().unwrap(), cache.path());
    let tokens = |o: &common::Out| {
        serde_json::from_str::<serde_json::Value>(o.stdout.trim()).unwrap()["token_ids"].clone()
    };
    assert_eq!(tokens(&by_id), tokens(&by_dir));
}

#[test]
fn a_missing_hub_model_lists_what_the_cache_holds() {
    let cache = hub();
    let out = run("acme/huge", cache.path());
    assert_clean_failure(&out, &["acme/huge", "acme/tiny"]);
    let args = [
        "run",
        "--model",
        "acme/tiny",
        "--revision",
        "v9",
        "--prompt-ids",
        "1",
    ];
    let out = moestream_env(&args, &[("HF_HUB_CACHE", cache.path().to_str().unwrap())]);
    assert_clean_failure(&out, &["v9", "main", "0123abc"]);
}
