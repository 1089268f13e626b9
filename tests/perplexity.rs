//! `eval --text FILE`: perplexity over a text with sliding windows. One
//! window gives exp(mean NLL) of `eval --prompt-ids` on the same tokens;
//! smaller windows score every token after the first exactly once.

mod common;

use common::{assert_clean_failure, fixture, moestream};
use moestream::formats::tokenizer::Tokenizer;

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

/// The log-likelihood of `cont` after `ctx`, by hand from `eval`'s
/// per-position NLL of the concatenated ids.
fn loglik_by_hand(m: &str, ctx: &[u32], cont: &[u32]) -> f64 {
    let ids: Vec<String> = ctx.iter().chain(cont).map(u32::to_string).collect();
    let v = eval(&[
        "eval",
        "--model",
        m,
        "--prompt-ids",
        &ids.join(","),
        "--json",
    ]);
    let nll: Vec<f64> = v["nll"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    -nll[ctx.len() - 1..].iter().sum::<f64>()
}

#[test]
fn score_matches_hand_computed_logliks_and_their_acc() {
    let dir = fixture("qwen3_moe");
    let m = dir.to_str().unwrap();
    let tok = Tokenizer::load(&dir).unwrap();
    let tasks = [
        (
            "The engine reads the",
            vec![" experts", " weather", " a"],
            1usize,
        ),
        (
            "Disk reads overlap with",
            vec![" compute", " nothing at all"],
            0usize,
        ),
    ];
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("tasks.jsonl");
    let lines: Vec<String> = tasks
        .iter()
        .map(|(c, ch, l)| serde_json::json!({"context": c, "choices": ch, "label": l}).to_string())
        .collect();
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let out = eval(&[
        "score",
        "--model",
        m,
        "--tasks",
        file.to_str().unwrap(),
        "--json",
    ]);
    let (mut acc, mut acc_norm) = (0.0, 0.0);
    for (k, (ctx, choices, label)) in tasks.iter().enumerate() {
        let c = tok.encode(ctx).unwrap();
        let want: Vec<f64> = choices
            .iter()
            .map(|ch| {
                let whole = tok.encode(&format!("{ctx}{ch}")).unwrap();
                loglik_by_hand(m, &c, &whole[c.len()..])
            })
            .collect();
        let got: Vec<f64> = out["per_task"][k]["loglik"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() <= 1e-9 * w.abs().max(1.0),
                "task {k}: {g} vs {w}"
            );
        }
        let argmax = |f: &dyn Fn(usize) -> f64| {
            (0..want.len()).fold(0, |b, i| if f(i) > f(b) { i } else { b })
        };
        acc += f64::from(u8::from(argmax(&|i| want[i]) == *label));
        acc_norm += f64::from(u8::from(
            argmax(&|i| want[i] / choices[i].len() as f64) == *label,
        ));
    }
    assert_eq!(out["tasks"], 2);
    assert_eq!(out["acc"].as_f64().unwrap(), acc / 2.0);
    assert_eq!(out["acc_norm"].as_f64().unwrap(), acc_norm / 2.0);
}
