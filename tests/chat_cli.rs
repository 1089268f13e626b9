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
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_moestream"));
    cmd.args([
        "chat",
        "--temperature",
        "0",
        "--max-tokens",
        max_tokens,
        "--model",
    ])
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
