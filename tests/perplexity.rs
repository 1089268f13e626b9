//! `eval --text FILE`: perplexity over a text with sliding windows. One
//! window gives exp(mean NLL) of `eval --prompt-ids` on the same tokens;
//! smaller windows score every token after the first exactly once.

mod common;

use common::{assert_clean_failure, fixture, moestream};
use moestream::tokenizer::Tokenizer;

const TEXT: &str =
    "The engine reads the routed experts from disk while the attention of the next layer runs.";

fn eval(args: &[&str]) -> serde_json::Value {
    let out = moestream(args);
    assert!(out.ok, "{}", out.stderr);
    serde_json::from_str(out.stdout.trim()).unwrap()
}

#[test]
fn perplexity_is_the_mean_nll_of_teacher_forcing_and_windows_score_each_token_once() {
    let dir = fixture("qwen3_moe");
    let m = dir.to_str().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("text.txt");
    std::fs::write(&file, TEXT).unwrap();
    let f = file.to_str().unwrap();
    let ids = Tokenizer::load(&dir).unwrap().encode(TEXT).unwrap();
    assert!(ids.len() > 12, "a text of several windows");
    let csv: Vec<String> = ids.iter().map(u32::to_string).collect();
    let forced = eval(&[
        "eval",
        "--model",
        m,
        "--prompt-ids",
        &csv.join(","),
        "--json",
    ]);
    let nll: Vec<f64> = forced["nll"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    let by_hand = (nll.iter().sum::<f64>() / nll.len() as f64).exp();

    let one = eval(&["eval", "--model", m, "--text", f, "--json"]);
    assert_eq!(one["windows"], 1);
    assert_eq!(one["scored"], ids.len() - 1);
    let ppl = one["perplexity"].as_f64().unwrap();
    assert!(
        (ppl - by_hand).abs() <= 1e-9 * by_hand,
        "{ppl} vs {by_hand}"
    );

    let sliding = eval(&[
        "eval", "--model", m, "--text", f, "--window", "8", "--stride", "3", "--json",
    ]);
    assert_eq!(sliding["scored"], ids.len() - 1);
    assert!(sliding["windows"].as_u64().unwrap() > 1);
    assert!(sliding["perplexity"].as_f64().unwrap().is_finite());

    let bad = moestream(&[
        "eval", "--model", m, "--text", f, "--window", "8", "--stride", "8",
    ]);
    assert_clean_failure(&bad, &["stride"]);
}
