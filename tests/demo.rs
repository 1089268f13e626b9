//! The README's main job: `moestream demo` writes the embedded trained
//! model on first use (or creates the synthetic one with `--synthetic`),
//! streams experts from disk and ends with the stats line.

mod common;

use std::process::Command;

/// `moestream ARGS` with its cache directory at `cache`.
fn demo(cache: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_moestream"))
        .args(args)
        .env("MOESTREAM_CACHE", cache)
        .output()
        .unwrap()
}

#[test]
fn demo_prints_language_from_the_trained_model_with_experts_streamed() {
    let cache = tempfile::tempdir().unwrap();
    let run = || demo(cache.path(), &["demo", "--max-tokens", "40"]);
    let first = run();
    let err = String::from_utf8_lossy(&first.stderr);
    assert!(first.status.success(), "{err}");
    assert!(
        err.contains("first use") && err.contains("TRAINED"),
        "{err}"
    );
    assert!(err.contains("[stats] 40 tokens"), "{err}");
    // 8 of 32 experts cached: some are read from disk.
    assert!(err.contains("expert hit rate"), "{err}");
    assert!(!err.contains("expert hit rate 100"), "{err}");
    let text = String::from_utf8_lossy(&first.stdout).to_lowercase();
    // Language: the commonest English words, as a random-weight model
    // (its text is token salad) never strings them together.
    let words: Vec<&str> = text.split(|c: char| !c.is_alphabetic()).collect();
    let common = [
        "the", "of", "to", "and", "a", "is", "in", "for", "be", "it", "that",
    ];
    let hits = words.iter().filter(|w| common.contains(w)).count();
    assert!(hits >= 5, "{hits} common words in: {text}");
    assert!(cache
        .path()
        .join("trained-qwen3moe-v1/config.json")
        .exists());
    let second = run();
    assert!(second.status.success());
    assert_eq!(
        first.stdout, second.stdout,
        "seeded demo output is reproducible"
    );
}

#[test]
fn demo_creates_the_model_then_reuses_it() {
    let cache = tempfile::tempdir().unwrap();
    let run = || demo(cache.path(), &["demo", "--synthetic", "--max-tokens", "4"]);
    let first = run();
    let err = String::from_utf8_lossy(&first.stderr);
    assert!(first.status.success(), "{err}");
    assert!(err.contains("first use"), "{err}");
    assert!(err.contains("RANDOM weights"), "{err}");
    assert!(err.contains("[stats] 4 tokens"), "{err}");
    assert!(err.contains("expert hit rate"), "{err}");
    assert!(cache
        .path()
        .join("synthetic-qwen3moe-v2/config.json")
        .exists());
    let second = run();
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(second.status.success(), "{err}");
    assert!(!err.contains("first use"), "the model is reused: {err}");
    assert_eq!(
        first.stdout, second.stdout,
        "seeded demo output is reproducible"
    );
}

#[test]
fn three_demos_started_at_once_on_first_use_all_succeed() {
    let cache = tempfile::tempdir().unwrap();
    let children: Vec<_> = (0..3)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_moestream"))
                .args(["demo", "--max-tokens", "2"])
                .env("MOESTREAM_CACHE", cache.path())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
    }
    let left: Vec<String> = std::fs::read_dir(cache.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
