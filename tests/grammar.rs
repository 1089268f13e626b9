//! Constrained output: at temperature 1 on a random-weight fixture, every
//! seed's output parses and matches the schema (or the regex), and a
//! constraint that does not compile is refused by name.

mod common;

use common::{fixture, moestream};
use serde_json::Value;

fn run(extra: &[&str], seed: u64) -> Value {
    let model = fixture("qwen3_moe");
    let seed = seed.to_string();
    let mut args = vec![
        "run",
        "--model",
        model.to_str().unwrap(),
        "--expert-cache",
        "2",
        "--prompt",
        "hello",
        "--max-tokens",
        "60",
        "--temperature",
        "1",
        "--seed",
        &seed,
        "--json",
    ];
    args.extend(extra);
    let out = moestream(&args);
    assert!(out.ok, "{}", out.stderr);
    serde_json::from_str(out.stdout.trim().lines().last().unwrap()).unwrap()
}

#[test]
fn every_seed_gives_json_matching_the_schema() {
    let dir = tempfile::tempdir().unwrap();
    let schema = dir.path().join("schema.json");
    std::fs::write(
        &schema,
        r#"{"x-guidance": {"whitespace_flexible": false}, "type": "object",
            "properties": {"ok": {"type": "boolean"},
                           "n": {"type": "integer", "minimum": 0, "maximum": 99},
                           "tag": {"enum": ["red", "green", "blue"]}},
            "required": ["ok", "n", "tag"], "additionalProperties": false}"#,
    )
    .unwrap();
    let mut tags = std::collections::HashSet::new();
    for seed in 0..24 {
        let v = run(&["--json-schema", schema.to_str().unwrap()], seed);
        let text = v["text"].as_str().unwrap();
        let parsed: Value = serde_json::from_str(text)
            .unwrap_or_else(|e| panic!("seed {seed}: {text:?} does not parse: {e}"));
        let obj = parsed.as_object().unwrap();
        assert_eq!(obj.len(), 3, "seed {seed}: {text}");
        assert!(obj["ok"].is_boolean(), "seed {seed}: {text}");
        let n = obj["n"].as_u64().unwrap();
        assert!(n <= 99, "seed {seed}: {text}");
        tags.insert(obj["tag"].as_str().unwrap().to_string());
    }
    assert!(tags
        .iter()
        .all(|t| ["red", "green", "blue"].contains(&t.as_str())));
}

#[test]
fn every_seed_matches_the_regex_and_speculation_still_works() {
    for seed in 0..12 {
        let v = run(
            &["--regex", "(yes|no), [0-9]{1,3}!", "--speculate", "ngram"],
            seed,
        );
        let text = v["text"].as_str().unwrap();
        let (word, rest) = text.split_once(", ").unwrap_or_else(|| panic!("{text:?}"));
        assert!(word == "yes" || word == "no", "{text:?}");
        let digits = rest.strip_suffix('!').unwrap_or_else(|| panic!("{text:?}"));
        assert!((1..=3).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit()));
    }
}

#[test]
fn a_bad_constraint_is_refused_by_name() {
    let model = fixture("qwen3_moe");
    let out = moestream(&[
        "run",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        "hi",
        "--regex",
        "(unclosed",
    ]);
    assert!(!out.ok);
    assert!(out.stderr.contains("constraint"), "{}", out.stderr);
}

/// Sums of small numbers, one per line, as llama.cpp reads GBNF: the
/// parentheses make `sum` and `term` recursive (grammar rules, not one
/// lexeme), and `line` spans two lines.
const SUMS_GBNF: &str = r#"# one or two lines of sums
root ::= line{1,2}
line ::= "- " sum
         "\n"
sum  ::= term (" + " term){0,2}
term ::= [0-9] [0-9]? | "(" sum ")"
"#;

/// Whether `text` is one or two lines of [`SUMS_GBNF`] (a hand-written
/// parser: the grammar is deterministic).
fn is_sums(text: &str) -> bool {
    fn term(s: &[u8], i: usize) -> Option<usize> {
        match s.get(i)? {
            b'(' => {
                let j = sum(s, i + 1)?;
                (s.get(j) == Some(&b')')).then_some(j + 1)
            }
            c if c.is_ascii_digit() => {
                let two = s.get(i + 1).is_some_and(u8::is_ascii_digit);
                Some(i + 1 + usize::from(two))
            }
            _ => None,
        }
    }
    fn sum(s: &[u8], i: usize) -> Option<usize> {
        let mut j = term(s, i)?;
        for _ in 0..2 {
            if !s[j..].starts_with(b" + ") {
                break;
            }
            j = term(s, j + 3)?;
        }
        Some(j)
    }
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    (1..=2).contains(&lines.len())
        && lines.iter().all(|l| {
            let s = l.as_bytes();
            s.starts_with(b"- ") && sum(s, 2).is_some_and(|j| &s[j..] == b"\n")
        })
}

#[test]
fn every_seed_matches_the_gbnf_grammar() {
    let dir = tempfile::tempdir().unwrap();
    let grammar = dir.path().join("sums.gbnf");
    std::fs::write(&grammar, SUMS_GBNF).unwrap();
    let mut nested = false;
    for seed in 0..12 {
        let v = run(&["--grammar", grammar.to_str().unwrap()], seed);
        let text = v["text"].as_str().unwrap();
        assert!(is_sums(text), "seed {seed}: {text:?}");
        nested |= text.contains('(');
    }
    assert!(is_sums("- (1 + 23) + 4\n- 5\n") && !is_sums("- 123\n"));
    assert!(nested, "no seed used the recursive rule");
}

#[test]
fn a_bad_gbnf_grammar_is_refused_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let grammar = dir.path().join("bad.gbnf");
    std::fs::write(&grammar, "root ::= item+\nitem ::= [a-z\n").unwrap();
    let model = fixture("qwen3_moe");
    let out = moestream(&[
        "run",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        "hi",
        "--grammar",
        grammar.to_str().unwrap(),
    ]);
    assert!(!out.ok);
    assert!(
        out.stderr
            .contains("constraint: GBNF grammar: line 2, column 10: unterminated character class"),
        "{}",
        out.stderr
    );
}
