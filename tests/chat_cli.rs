//! `moestream chat` in a terminal-less run: turns from stdin, the KV kept
//! between turns, /stats, /reset, multi-line input, and Ctrl-C stopping an
//! answer without ending the program.

mod common;

use common::fixture;
use moestream::lab::synth::{self, SynthSpec};
use std::io::{Read, Write};
use std::process::{Command, Stdio};

const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

fn chat(model: &std::path::Path, template: &std::path::Path, max_tokens: &str) -> Command {
    chat_with(
        model,
        template,
        &["--temperature", "0", "--max-tokens", max_tokens],
    )
}

/// `chat` on `model` with `template`, `flags`, and piped standard streams.
fn chat_with(model: &std::path::Path, template: &std::path::Path, flags: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_moestream"));
    cmd.arg("chat")
        .args(flags)
        .arg("--model")
        .arg(model)
        .arg("--chat-template")
        .arg(template)
        .env("MOESTREAM_NO_HISTORY", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// (prompt tokens, reused) of every /stats line.
fn stats(stderr: &str) -> Vec<(usize, usize)> {
    stderr
        .lines()
        .filter_map(|l| {
            let rest = l.split("| prompt ").nth(1)?;
            let mut words = rest.split_whitespace();
            let prompt = words.next()?.parse().ok()?;
            let reused = rest
                .split("tokens, ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse()
                .ok()?;
            Some((prompt, reused))
        })
        .collect()
}

#[test]
fn turns_keep_the_kv_and_commands_work() {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("chat.jinja");
    std::fs::write(&template, CHATML).unwrap();
    let mut child = chat(&fixture("qwen3_moe"), &template, "6").spawn().unwrap();
    let input = "hello there\n/stats\nline one \\\nline two\n/stats\n/reset\n\"\"\"\nblock\nof lines\n\"\"\"\n/stats\n/exit\nnever read\n";
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let s = stats(&stderr);
    assert_eq!(s.len(), 3, "{stderr}");
    assert_eq!(s[0].1, 0, "the first turn computes its whole prompt");
    assert!(
        s[1].0 > s[0].0 && s[1].1 >= s[0].0,
        "the second turn continues the first: {s:?}"
    );
    assert!(
        s[2].0 < s[1].0,
        "after /reset the conversation starts over: {s:?}"
    );
    assert!(stderr.contains("[conversation cleared]"));
    assert!(stderr.contains("conversation: 2 messages"));
}

#[test]
fn ctrl_c_stops_the_answer_not_the_program() {
    let dir = tempfile::tempdir().unwrap();
    let spec = SynthSpec {
        hidden: 256,
        layers: 4,
        experts: 8,
        top_k: 2,
        moe_inter: 128,
        dense_inter: 128,
        heads: 4,
        kv_heads: 2,
        head_dim: 64,
        vocab: 300,
        seed: 1,
    };
    synth::write(dir.path(), &spec).unwrap();
    let template = dir.path().join("chat.jinja");
    std::fs::write(&template, CHATML).unwrap();
    let mut child = chat(dir.path(), &template, "4000").spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    // Once the answer is streaming, interrupt it.
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 16];
    stdout.read_exact(&mut first).unwrap();
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    stdin.write_all(b"/stats\n").unwrap();
    drop(stdin);
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(rest.contains("[stopped]"), "{rest}");
    assert!(stderr.contains(", stopped |"), "{stderr}");
    let tokens: usize = stderr
        .split("last answer: ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(tokens < 4000, "{tokens}");
}

/// The "conversation: N messages" of every /stats line.
fn conversation_lengths(stderr: &str) -> Vec<usize> {
    stderr
        .lines()
        .filter_map(|l| {
            l.split("conversation: ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

#[test]
fn chat_survives_overflow_bad_bytes_and_unknown_commands() {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("chat.jinja");
    std::fs::write(&template, CHATML).unwrap();
    // The fixture's context is 256 tokens: turns of ~50 prompt tokens and
    // up to 20 answer tokens outgrow it by the fourth.
    let mut child = chat(&fixture("qwen3_moe"), &template, "20")
        .spawn()
        .unwrap();
    let long = "tell me about experts, routing, caches and the disk ".to_string();
    let mut input = Vec::new();
    for _ in 0..4 {
        input.extend_from_slice(format!("{long}\n/stats\n").as_bytes());
    }
    input.extend_from_slice(b"/help\n/frobnicate now\nbad \xff bytes\n/stats\n");
    input.extend_from_slice(format!("{}\n", "experts ".repeat(400)).as_bytes());
    input.extend_from_slice(b"/stats\nquit\nnever read\n");
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("dropped the oldest"), "{stderr}");
    assert!(stderr.contains("not valid UTF-8"), "{stderr}");
    assert!(stderr.contains("unknown command /frobnicate"), "{stderr}");
    assert!(
        stderr.contains("/reset"),
        "/help lists the commands: {stderr}"
    );
    assert!(stderr.contains("not sent"), "{stderr}");
    let lens = conversation_lengths(&stderr);
    assert_eq!(lens.len(), 6, "{stderr}");
    // Every turn was answered; once full, the oldest turn makes room for
    // the next, and neither the commands, the bad line nor the message
    // too long for the context joined the conversation.
    assert_eq!(&lens[..2], [2, 4], "{stderr}");
    assert!(lens[3] <= lens[2], "{lens:?}");
    assert_eq!(lens[4], lens[3], "{lens:?}");
    assert_eq!(
        lens[5], lens[3],
        "the refused message leaves the conversation: {lens:?}"
    );
    assert!(!stderr.contains("never read"), "{stderr}");
}

/// The seed a sampling run printed on stderr (`seed: N (...)`).
fn printed_seed(stderr: &str) -> Option<String> {
    let line = stderr.lines().find_map(|l| l.strip_prefix("seed: "))?;
    Some(line.split_whitespace().next()?.to_string())
}

#[test]
fn chat_with_a_seed_samples_the_same_answer_and_without_one_prints_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("chat.jinja");
    std::fs::write(&template, CHATML).unwrap();
    // (answer, stderr) with `seed` (None: no --seed).
    let answer = |seed: Option<&str>| {
        let mut flags = vec!["--temperature", "1", "--max-tokens", "12"];
        flags.extend(seed.map(|s| ["--seed", s]).into_iter().flatten());
        let mut child = chat_with(&fixture("qwen3_moe"), &template, &flags)
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(b"hello\n").unwrap();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        (String::from_utf8(out.stdout).unwrap(), stderr)
    };
    let (a, stderr) = answer(Some("7"));
    assert!(!a.trim().is_empty());
    assert_eq!(printed_seed(&stderr), None, "a given seed is not echoed");
    assert_eq!(a, answer(Some("7")).0);
    let others = [answer(Some("8")).0, answer(Some("9")).0];
    assert!(others.iter().any(|o| *o != a), "three seeds, one text: {a}");
    // Without --seed: a fresh seed each time, printed, and it repeats.
    let (first, stderr) = answer(None);
    let seed = printed_seed(&stderr).unwrap_or_else(|| panic!("no seed printed: {stderr}"));
    let (_, stderr2) = answer(None);
    assert_ne!(
        printed_seed(&stderr2),
        Some(seed.clone()),
        "two fresh seeds"
    );
    let again = answer(Some(&seed)).0;
    assert_eq!(again, first, "--seed {seed} repeats the unseeded chat");
}
