//! Per-model state outside the model directory, merged by concurrent runs
//! (the hardening issue's defect 3), and `run --prompts` serving every good
//! line when one is bad (defect 8). Each test is named after the fault.

mod common;

use common::{listing, moestream_env, tiny_model};
use moestream::store::usage::history_path;

#[test]
fn concurrent_runs_merge_their_history_outside_the_model_directory() {
    let dir = tiny_model();
    let m = dir.path().to_str().unwrap();
    let before = listing(dir.path());
    let args = [
        "run",
        "--model",
        m,
        "--prompt-ids",
        "5,9,2",
        "--max-tokens",
        "4",
        "--ignore-eos",
        "--json",
    ];
    let runs = 6;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..runs)
            .map(|_| s.spawn(|| moestream_env(&args, &[])))
            .collect();
        for h in handles {
            let out = h.join().unwrap();
            assert!(out.ok, "{}", out.stderr);
        }
    });
    assert_eq!(
        listing(dir.path()),
        before,
        "nothing written into the model"
    );
    let path = history_path(dir.path()).unwrap();
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    // Each run forwards 3 prompt tokens and 3 decode tokens (the 4th is
    // sampled from the last forward): the clocks add up.
    assert_eq!(saved["clock"], runs * 6, "{saved}");
    let leftovers: Vec<String> = listing(path.parent().unwrap())
        .into_iter()
        .filter(|n| n.contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn a_bad_prompts_line_is_named_and_the_rest_are_served() {
    let dir = tiny_model();
    let m = dir.path().to_str().unwrap();
    let prompts = dir.path().join("prompts.txt");
    let too_long = "word ".repeat(5000);
    std::fs::write(
        &prompts,
        format!("the engine reads\n\n{too_long}\nexperts from disk\n"),
    )
    .unwrap();
    let out = moestream_env(
        &[
            "run",
            "--model",
            m,
            "--prompts",
            prompts.to_str().unwrap(),
            "--max-tokens",
            "3",
            "--ignore-eos",
            "--json",
        ],
        &[],
    );
    assert!(!out.ok, "a failed request fails the run");
    assert!(out.stderr.contains("line 3"), "{}", out.stderr);
    assert!(out.stderr.contains("1 of 3 requests"), "{}", out.stderr);
    let rows: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0]["token_ids"].as_array().unwrap().len(), 3);
    assert_eq!(rows[1]["line"], 3);
    assert!(rows[1]["error"].as_str().unwrap().contains("context"));
    assert_eq!(rows[2]["request"], 2);
    assert_eq!(rows[2]["token_ids"].as_array().unwrap().len(), 3);
    assert!(history_path(dir.path()).unwrap().exists(), "history saved");
}

#[test]
fn batched_prompts_give_every_request_its_sequential_tokens() {
    let dir = tiny_model();
    let m = dir.path().to_str().unwrap();
    let prompts = dir.path().join("prompts.txt");
    std::fs::write(
        &prompts,
        "the engine reads\n\nexperts from disk\nwhile it computes\nand again\n",
    )
    .unwrap();
    let p = prompts.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--model",
            m,
            "--prompts",
            p,
            "--max-tokens",
            "6",
            "--ignore-eos",
            "--json",
        ];
        args.extend(extra);
        let out = moestream_env(&args, &[("MOESTREAM_NO_HISTORY", "1")]);
        assert!(out.ok, "{}", out.stderr);
        let mut rows: Vec<serde_json::Value> = out
            .stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        rows.sort_by_key(|r| r["request"].as_u64().unwrap());
        (rows, out.stderr)
    };
    let (one_by_one, _) = run(&[]);
    let (batched, stderr) = run(&["--batch", "3"]);
    assert!(stderr.contains("batches of up to 3"), "{stderr}");
    assert_eq!(batched.len(), 4);
    for (a, b) in one_by_one.iter().zip(&batched) {
        assert_eq!(a["request"], b["request"]);
        assert_eq!(a["token_ids"], b["token_ids"], "request {}", a["request"]);
    }
    assert_eq!(batched[1]["line"], 3);
}
