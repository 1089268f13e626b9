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
