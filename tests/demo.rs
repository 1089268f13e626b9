//! The README's main job: `moestream demo` creates the synthetic default
//! model on first use, streams experts from disk and ends with the stats line.

mod common;

use std::process::Command;

#[test]
fn demo_creates_the_model_then_reuses_it() {
    let cache = tempfile::tempdir().unwrap();
    let run = || {
        Command::new(env!("CARGO_BIN_EXE_moestream"))
            .args(["demo", "--max-tokens", "4"])
            .env("MOESTREAM_CACHE", cache.path())
            .output()
            .unwrap()
    };
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
