//! `moestream serve` driven over HTTP: the server runs as a child process
//! on 127.0.0.1 port 0 with a fixture model; these tests talk to it with
//! a Rust HTTP client as any OpenAI client would.

mod common;

use common::server::{chat, read_head, run_client_script, text_of, Reply, Server};
use common::{fixture, tiny_model};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn chat_streamed_and_not_give_the_same_text_and_usage() {
    let s = Server::start(&fixture("qwen3_moe"), &[]);
    let body = chat("tell me about experts", 12);
    let whole = s.post("/v1/chat/completions", &body);
    let text = text_of(&whole);
    assert_eq!(whole.json["object"], "chat.completion");
    assert_eq!(whole.json["usage"]["completion_tokens"], 12);
    let prompt_tokens = whole.json["usage"]["prompt_tokens"].as_u64().unwrap();
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let chunks = s.stream("/v1/chat/completions", &streamed);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let deltas: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(deltas, text);
    let n = chunks.len();
    assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[n - 1]["choices"], json!([]));
    assert_eq!(chunks[n - 1]["usage"]["completion_tokens"], 12);
    assert_eq!(chunks[n - 1]["usage"]["prompt_tokens"], prompt_tokens);
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
}

#[test]
fn completions_stop_sequences_and_logprobs() {
    let s = Server::start(&fixture("qwen3_moe"), &[]);
    let body = json!({"prompt": "the expert cache", "max_tokens": 16, "temperature": 0});
    let r = s.post("/v1/completions", &body);
    let text = text_of(&r);
    assert_eq!(r.json["object"], "text_completion");
    assert_eq!(r.json["choices"][0]["finish_reason"], "length");
    // The same request streamed gives the same text.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let chunks = s.stream("/v1/completions", &streamed);
    let joined: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(joined, text);
    // A stop sequence from the middle of the text ends it just before.
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let (at, _) = chars[chars.len() / 2];
    let stop: String = text[at..].chars().take(2).collect();
    let first = text.find(&stop).unwrap();
    for stream in [false, true] {
        let mut b = body.clone();
        b["stop"] = json!([stop.clone(), "never appears \u{1F600}"]);
        let got = if stream {
            b["stream"] = json!(true);
            let chunks = s.stream("/v1/completions", &b);
            let reason = &chunks[chunks.len() - 1]["choices"][0]["finish_reason"];
            assert_eq!(reason, "stop");
            chunks
                .iter()
                .filter_map(|c| c["choices"][0]["text"].as_str())
                .collect()
        } else {
            let r = s.post("/v1/completions", &b);
            assert_eq!(r.json["choices"][0]["finish_reason"], "stop");
            text_of(&r)
        };
        assert_eq!(got, text[..first], "stream {stream}");
    }
    // Logprobs: one per token, the chosen one is the greedy top one.
    let mut b = body.clone();
    b["logprobs"] = json!(3);
    b["max_tokens"] = json!(4);
    let r = s.post("/v1/completions", &b);
    let lp = &r.json["choices"][0]["logprobs"];
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 4);
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let best = top
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        let chosen = lp["token_logprobs"][i].as_f64().unwrap();
        assert!((best - chosen).abs() < 1e-6, "position {i}");
        assert!(chosen <= 0.0);
    }
}

#[test]
fn errors_have_the_openai_shape_and_status() {
    let s = Server::start(
        &fixture("qwen3_moe"),
        &["--api-key", "sekret", "--slots", "1", "--queue", "0"],
    );
    let key = [("Authorization", "Bearer sekret")];
    let body = chat("hi", 4);
    let shape = |r: &Reply, status: u16| {
        assert_eq!(r.status, status, "{}", r.json);
        let e = &r.json["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{e}");
        assert!(e["type"].is_string() && e.get("param").is_some() && e.get("code").is_some());
    };
    shape(&s.post("/v1/chat/completions", &body), 401);
    let wrong = [("Authorization", "Bearer nope")];
    shape(&s.post_with("/v1/chat/completions", &body, &wrong), 401);
    assert_eq!(s.post_with("/v1/chat/completions", &body, &key).status, 200);
    assert_eq!(s.get("/health").0, 200, "health needs no key");
    let mut other = body.clone();
    other["model"] = json!("no-such-model");
    shape(&s.post_with("/v1/chat/completions", &other, &key), 404);
    for bad in [
        json!({"messages": "x"}),
        json!({"messages": []}),
        json!({"prompt": "x", "n": 2}),
        json!({"prompt": "x", "tools": [{"type": "function"}]}),
        json!({"prompt": "x", "response_format": {"type": "json_schema"}}),
        json!({"prompt": "x", "response_format": {"type": "yaml"}}),
        json!({"prompt": "x", "temperature": -1}),
        json!({"prompt": "x", "max_tokens": 0}),
    ] {
        let path = if bad.get("prompt").is_some() {
            "/v1/completions"
        } else {
            "/v1/chat/completions"
        };
        shape(&s.post_with(path, &bad, &key), 400);
    }
    // A prompt longer than the context (256) names the numbers.
    let long: Vec<u32> = (0..300).map(|i| i % 300).collect();
    let r = s.post_with("/v1/completions", &json!({"prompt": long}), &key);
    shape(&r, 400);
    let msg = r.json["error"]["message"].as_str().unwrap();
    assert!(msg.contains("300") && msg.contains("256"), "{msg}");
}

#[test]
fn a_full_queue_is_answered_429_with_retry_after() {
    let model = tiny_model();
    let s = Server::start(model.path(), &["--slots", "1", "--queue", "0"]);
    // One long request holds the only slot (it is running once its first
    // bytes arrive); the next one finds no slot and no queue.
    let long = json!({"prompt": "go on", "max_tokens": 4000, "temperature": 0,
                      "ignore_eos": true, "stream": true});
    let resp = ureq::post(&format!("{}/v1/completions", s.base))
        .send_json(long)
        .unwrap();
    let mut reader = resp.into_reader();
    reader.read_exact(&mut [0u8; 16]).unwrap();
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": "me too", "max_tokens": 2}),
    );
    assert_eq!(r.status, 429, "{}", r.json);
    assert_eq!(r.retry_after.as_deref(), Some("1"));
    assert_eq!(r.json["error"]["type"], "rate_limit_error");
    assert!(r.json["error"]["message"]
        .as_str()
        .unwrap()
        .contains("queue"));
    drop(reader);
}

#[test]
fn concurrent_greedy_requests_each_give_their_tokens_alone() {
    let s = Server::start(&fixture("qwen3_moe"), &["--slots", "3"]);
    let bodies: Vec<Value> = ["first prompt", "a second, longer prompt here", "3"]
        .iter()
        .map(|p| json!({"prompt": p, "max_tokens": 10, "temperature": 0, "ignore_eos": true}))
        .collect();
    let alone: Vec<String> = bodies
        .iter()
        .map(|b| text_of(&s.post("/v1/completions", b)))
        .collect();
    let together: Vec<String> = bodies
        .iter()
        .map(|b| {
            let (base, b) = (s.base.clone(), b.clone());
            std::thread::spawn(move || {
                let r = ureq::post(&format!("{base}/v1/completions"))
                    .send_json(b)
                    .unwrap();
                let v: Value = r.into_json().unwrap();
                v["choices"][0]["text"].as_str().unwrap().to_string()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    assert_eq!(together, alone);
}

/// A streamed completion of 4000 tokens, once its first bytes came (its
/// request runs): the reader holds its slot until dropped.
fn long_stream(s: &Server) -> impl Read {
    let body = json!({"prompt": "go on", "max_tokens": 4000, "temperature": 0,
                      "ignore_eos": true, "stream": true});
    let resp = ureq::post(&format!("{}/v1/completions", s.base))
        .send_json(body)
        .unwrap();
    let mut reader = resp.into_reader();
    reader.read_exact(&mut [0u8; 64]).unwrap();
    reader
}

#[test]
fn a_client_that_disconnects_frees_its_slot() {
    let model = tiny_model();
    let s = Server::start(model.path(), &["--slots", "1"]);
    let reader = long_stream(&s);
    // The metrics snapshot follows the step that sent those bytes.
    while s.metric("busy_slots") < 1.0 {
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(reader);
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.metric("busy_slots") > 0.0 {
        assert!(Instant::now() < deadline, "the slot was never freed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(s.metric("generated_tokens_total") < 4000.0);
    assert_eq!(
        s.metric("requests_failed_total"),
        1.0,
        "counted as cancelled"
    );
    assert_eq!(s.metric("requests_finished_total"), 0.0);
    // The freed slot serves the next request.
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": "next", "max_tokens": 3, "temperature": 0}),
    );
    assert_eq!(r.status, 200);
}

/// A two-turn chat: the second turn repeats the first and the answer.
fn turns(reply: &str) -> Value {
    json!({"messages": [
        {"role": "user", "content": "what is an expert?"},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "and a router?"},
    ], "max_tokens": 8, "temperature": 0})
}

#[test]
fn the_second_turn_reuses_the_kv_and_a_restart_keeps_it() {
    let kv = tempfile::tempdir().unwrap();
    let model = fixture("qwen3_moe");
    let kv_flag = ["--kv-dir", kv.path().to_str().unwrap()];
    // The reference: the second turn on a fresh server, no KV kept.
    let first = chat("what is an expert?", 8);
    let (reply, want) = {
        let s = Server::start(&model, &[]);
        let reply = text_of(&s.post("/v1/chat/completions", &first));
        let fresh = Server::start(&model, &[]);
        let r = fresh.post("/v1/chat/completions", &turns(&reply));
        assert_eq!(r.json["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
        (reply, text_of(&r))
    };
    // Within one server: the second turn continues the first's KV.
    let s = Server::start(&model, &kv_flag);
    let r1 = s.post("/v1/chat/completions", &first);
    assert_eq!(text_of(&r1), reply);
    let first_prompt = r1.json["usage"]["prompt_tokens"].as_u64().unwrap();
    let r2 = s.post("/v1/chat/completions", &turns(&reply));
    assert_eq!(text_of(&r2), want);
    let cached = r2.json["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached >= first_prompt,
        "cached {cached} of a first prompt of {first_prompt}"
    );
    // The metrics snapshot is published after the step that answered.
    s.wait_metric("prompt_tokens_reused_total", |v| v >= first_prompt as f64);
    // Where the steps' time went is counted; nothing was restored at start.
    s.wait_metric("attention_seconds_total", |v| v > 0.0);
    s.wait_metric("expert_matmul_seconds_total", |v| v > 0.0);
    s.wait_metric("kv_restored_positions", |v| v == 0.0);
    assert!(s.stop().success(), "SIGTERM exits 0");
    let saved: Vec<_> = std::fs::read_dir(kv.path()).unwrap().flatten().collect();
    assert!(!saved.is_empty(), "the kept KV was saved at shutdown");
    // A restarted server continues from the saved KV: the third turn's
    // prompt starts with the whole second exchange.
    let mut third = turns(&reply);
    third["messages"].as_array_mut().unwrap().extend([
        json!({"role": "assistant", "content": want}),
        json!({"role": "user", "content": "thanks"}),
    ]);
    let reference = {
        let fresh = Server::start(&model, &[]);
        text_of(&fresh.post("/v1/chat/completions", &third))
    };
    let s = Server::start(&model, &kv_flag);
    let r3 = s.post("/v1/chat/completions", &third);
    assert_eq!(text_of(&r3), reference);
    let cached = r3.json["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let second_prompt = r2.json["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        cached >= second_prompt,
        "restored KV: cached {cached} of {second_prompt}"
    );
    // The restore is counted: its positions and how long it took.
    s.wait_metric("kv_restored_positions", |v| v >= second_prompt as f64);
    s.wait_metric("kv_restore_seconds", |v| v > 0.0);
    assert!(s.stop().success());
    // A corrupt KV file is refused, named, and recomputed.
    for f in std::fs::read_dir(kv.path()).unwrap().flatten() {
        let mut bytes = std::fs::read(f.path()).unwrap();
        let n = bytes.len();
        bytes[n - 1] ^= 0x55;
        std::fs::write(f.path(), bytes).unwrap();
    }
    let s = Server::start(&model, &kv_flag);
    let r = s.post("/v1/chat/completions", &third);
    assert_eq!(text_of(&r), reference);
    assert_eq!(r.json["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert!(s.stderr.lock().unwrap().contains("KV file refused"));
}

#[test]
fn bench_serve_reports_every_round_and_refuses_beyond_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("serve.csv");
    let model = fixture("qwen3_moe");
    let out = common::moestream(&[
        "bench",
        "serve",
        "--model",
        model.to_str().unwrap(),
        "--expert-cache",
        "2",
        "--clients",
        "1,5",
        "--tokens",
        "6",
        "--slots",
        "1",
        "--queue",
        "1",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    assert!(out.ok, "{}", out.stderr);
    let mut rows = csv::Reader::from_path(&csv).unwrap();
    let header = rows.headers().unwrap().clone();
    for col in [
        "clients",
        "ok",
        "refused",
        "aggregate_tok_s",
        "ttft_p50_ms",
        "mb_per_token",
    ] {
        assert!(header.iter().any(|h| h == col), "{header:?}");
    }
    let rows: Vec<csv::StringRecord> = rows.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), 2);
    let field = |r: &csv::StringRecord, name: &str| -> f64 {
        let i = header.iter().position(|h| h == name).unwrap();
        r[i].parse().unwrap()
    };
    assert_eq!(field(&rows[0], "ok"), 1.0);
    assert!(field(&rows[0], "aggregate_tok_s") > 0.0);
    // 5 at once on 1 slot and a queue of 1: each is answered 200 or 429.
    assert_eq!(field(&rows[1], "ok") + field(&rows[1], "refused"), 5.0);
    assert!(field(&rows[1], "ok") >= 1.0);
}

/// The official `openai` Python package against the server:
/// `MOESTREAM_PYTHON=/work/venv-tf/bin/python cargo test --test serve -- --ignored openai`
/// (the venv needs `pip install openai`; see scripts/openai_client_check.py).
#[test]
#[ignore = "needs Python with the openai package (MOESTREAM_PYTHON)"]
fn openai_python_client_drives_the_server() {
    let s = Server::start(&fixture("qwen3_moe"), &[]);
    run_client_script("openai_client_check.py", &[format!("{}/v1", s.base)]);
}

#[test]
fn a_waiting_stream_gets_keep_alive_comments() {
    use moestream::lab::synth::{self, SynthSpec};
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
    let s = Server::start(dir.path(), &["--slots", "1", "--keep-alive", "1"]);
    // A long request holds the only slot for seconds...
    let base = s.base.clone();
    let long = std::thread::spawn(move || {
        let b =
            json!({"prompt": "go on", "max_tokens": 4000, "temperature": 0, "ignore_eos": true});
        ureq::post(&format!("{base}/v1/completions"))
            .send_json(b)
            .unwrap()
            .status()
    });
    while s.metric("busy_slots") < 1.0 {
        std::thread::sleep(Duration::from_millis(10));
    }
    // ...while a streamed one waits in the queue: its stream stays alive.
    let b = json!({"prompt": "me next", "max_tokens": 2, "temperature": 0, "stream": true});
    let resp = ureq::post(&format!("{}/v1/completions", s.base))
        .send_json(b)
        .unwrap();
    let mut lines = BufReader::new(resp.into_reader()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(
        first.starts_with(':') && first.contains("keep-alive"),
        "{first:?}"
    );
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    assert!(
        rest.iter().any(|l| l == "data: [DONE]"),
        "the queued request finished: {rest:?}"
    );
    assert_eq!(long.join().unwrap(), 200);
}

#[test]
fn response_format_json_schema_constrains_the_answer() {
    let s = Server::start(&fixture("qwen3_moe"), &[]);
    let schema = json!({"x-guidance": {"whitespace_flexible": false}, "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["ok", "n"], "additionalProperties": false});
    for seed in 0..6 {
        let mut body = chat("answer in JSON", 40);
        body["temperature"] = json!(1);
        body["seed"] = json!(seed);
        body["response_format"] =
            json!({"type": "json_schema", "json_schema": {"name": "t", "schema": schema}});
        let text = text_of(&s.post("/v1/chat/completions", &body));
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(
            v["ok"].is_boolean() && v["n"].as_u64().is_some_and(|n| n <= 9),
            "{text}"
        );
    }
    let mut body = chat("anything", 40);
    body["response_format"] = json!({"type": "json_object"});
    let text = text_of(&s.post("/v1/chat/completions", &body));
    assert!(text.starts_with('{'), "{text:?}");
}

/// A chat on `s` answered within 60 s (a server whose engine thread hangs
/// fails the test instead of hanging it).
fn chat_within(s: &Server, body: &Value) -> Reply {
    let (tx, rx) = std::sync::mpsc::channel();
    let (base, body) = (s.base.clone(), body.clone());
    std::thread::spawn(move || {
        let r = ureq::post(&format!("{base}/v1/chat/completions")).send_json(body);
        let _ = tx.send(
            r.map(|r| r.into_json::<Value>().unwrap())
                .map_err(|e| e.to_string()),
        );
    });
    let json = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the request was answered within 60 s")
        .expect("a 200 reply");
    Reply {
        status: 200,
        json,
        retry_after: None,
    }
}

#[test]
fn the_kv_dir_leaves_files_it_did_not_write_and_a_fifo_does_not_block_it() {
    let kv = tempfile::tempdir().unwrap();
    let mine = [
        ("notes.kv", &b"my own notes"[..]),
        ("0123456789abcdef.kv", b"not a KV file at all"),
    ];
    for (name, bytes) in mine {
        std::fs::write(kv.path().join(name), bytes).unwrap();
    }
    let fifo = kv.path().join("fedcba9876543210.kv");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let s = Server::start(
        &fixture("qwen3_moe"),
        &["--kv-dir", kv.path().to_str().unwrap()],
    );
    let r = chat_within(&s, &chat("what is an expert?", 4));
    text_of(&r);
    assert!(s.stop().success());
    for (name, bytes) in mine {
        assert_eq!(
            std::fs::read(kv.path().join(name)).unwrap(),
            bytes,
            "{name}"
        );
    }
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
}

#[test]
fn a_second_server_on_one_kv_dir_is_refused_naming_the_dir_and_the_first() {
    let kv = tempfile::tempdir().unwrap();
    let k = kv.path().to_str().unwrap();
    let model = fixture("qwen3_moe");
    let first = Server::start(&model, &["--kv-dir", k]);
    let second = Command::new(env!("CARGO_BIN_EXE_moestream"))
        .args(["serve", "--port", "0", "--kv-dir", k, "--model"])
        .arg(&model)
        .env("MOESTREAM_NO_HISTORY", "1")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let out = common::wait_within(second, 60, &format!("a second server on {k}"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let pid = format!("pid {}", first.child.id());
    assert!(err.contains(k) && err.contains(&pid), "{err}");
    assert!(first.stop().success());
}

#[test]
fn kv_saved_before_the_weights_changed_in_place_is_refused() {
    let kv = tempfile::tempdir().unwrap();
    let kv_flag = ["--kv-dir", kv.path().to_str().unwrap()];
    let model = common::copy_fixture("qwen3_moe");
    let first = chat("what is an expert?", 4);
    let s = Server::start(model.path(), &kv_flag);
    let reply = text_of(&s.post("/v1/chat/completions", &first));
    assert!(s.stop().success());
    // New weights, same names and sizes: one weight's lowest bit flipped
    // (the first byte of a shard's data).
    let shard = model.path().join("model-00001-of-00002.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    let data_start = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    bytes[data_start] ^= 1;
    std::fs::write(&shard, bytes).unwrap();
    let s = Server::start(model.path(), &kv_flag);
    let r = s.post("/v1/chat/completions", &turns(&reply));
    assert_eq!(r.json["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let err = s.stderr.lock().unwrap().clone();
    assert!(
        err.contains("KV file refused") && err.contains("saved by model"),
        "{err}"
    );
    assert!(s.stop().success());
}

/// A request head for a body of `length` bytes, without an API key.
fn post_head(path: &str, length: usize) -> String {
    format!("POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n")
}

#[test]
fn a_keyless_body_is_refused_before_it_is_read() {
    let s = Server::start(&fixture("qwen3_moe"), &["--api-key", "sekret"]);
    let mut c = s.raw();
    c.write_all(post_head("/v1/completions", 1_900_000).as_bytes())
        .unwrap();
    c.write_all(b"{\"prompt\": \"").unwrap();
    // Not one more byte of the body: the answer comes from the head alone.
    let head = read_head(&mut c);
    assert!(head.starts_with("HTTP/1.1 401"), "{head}");
}

#[test]
fn keyless_connections_sending_big_bodies_do_not_grow_the_server() {
    let s = Server::start(&fixture("qwen3_moe"), &["--api-key", "sekret"]);
    let before = s.memory_kb("VmRSS");
    let (clients, body_bytes) = (100, 1_900_000);
    let (written, hold) = (Arc::new(std::sync::Barrier::new(clients + 1)), Arc::new(()));
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let (mut c, written, hold) = (s.raw(), written.clone(), hold.clone());
            std::thread::spawn(move || {
                c.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
                let _ = c.write_all(post_head("/v1/completions", body_bytes).as_bytes());
                let _ = c.write_all(&vec![b' '; body_bytes - 1]);
                written.wait();
                drop(hold);
                c
            })
        })
        .collect();
    written.wait();
    std::thread::sleep(Duration::from_millis(200));
    let during = s.memory_kb("VmRSS");
    let grown_mb = during.saturating_sub(before) / 1024;
    drop(threads);
    eprintln!("{clients} keyless clients of {body_bytes} B bodies: RSS {before} kB -> {during} kB");
    assert!(grown_mb < 64, "the server grew by {grown_mb} MB");
    assert_eq!(s.get("/health").0, 200);
}

#[test]
fn a_connection_stalled_mid_header_is_closed_after_the_read_timeout() {
    let s = Server::start(&fixture("qwen3_moe"), &["--read-timeout", "1"]);
    let mut stalled = s.raw();
    stalled
        .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
        .unwrap();
    let mut idle = s.raw();
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    assert!(read_head(&mut idle).starts_with("HTTP/1.1 200"));
    let t = Instant::now();
    for c in [&mut stalled, &mut idle] {
        let mut rest = Vec::new();
        // Closed by the server: end of file (or a reset), not our timeout.
        match c.read_to_end(&mut rest) {
            Ok(_) => {}
            Err(e) => assert!(
                !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
                "still open: {e}"
            ),
        }
    }
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
}

/// This machine's address on its first non-loopback interface, if any
/// (a UDP connect sends nothing).
fn own_remote_ip() -> Option<std::net::IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("10.255.255.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

#[test]
fn one_remote_address_past_its_connection_limit_is_answered_429() {
    let Some(ip) = own_remote_ip() else {
        eprintln!("skipped: no non-loopback address to connect from");
        return;
    };
    let s = Server::start(
        &fixture("qwen3_moe"),
        &[
            "--host",
            "0.0.0.0",
            "--api-key",
            "k",
            "--max-connections-per-client",
            "2",
            "--read-timeout",
            "600",
        ],
    );
    let port = s.base.rsplit(':').next().unwrap().to_string();
    let remote = format!("{ip}:{port}");
    let connect = || {
        let c = std::net::TcpStream::connect(&remote).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c
    };
    let held = [connect(), connect()];
    std::thread::sleep(Duration::from_millis(300));
    let mut third = connect();
    let mut reply = String::new();
    third.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 429"), "{reply}");
    assert!(reply.contains("too_many_connections"), "{reply}");
    // Loopback clients are not counted against it.
    let (status, _) = s.get("/health");
    assert_eq!(status, 200);
    drop(held);
    std::thread::sleep(Duration::from_millis(300));
    let mut again = connect();
    again
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    again.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
}

#[test]
fn connections_past_the_limit_wait_until_one_closes() {
    let s = Server::start(
        &fixture("qwen3_moe"),
        &["--max-connections", "2", "--read-timeout", "600"],
    );
    std::thread::sleep(Duration::from_millis(300));
    let silent = [s.raw(), s.raw()];
    std::thread::sleep(Duration::from_millis(300));
    let mut third = s.raw();
    third
        .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    third
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut byte = [0u8; 1];
    assert!(third.read(&mut byte).is_err(), "served past the limit");
    drop(silent);
    third
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let head = read_head(&mut third);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}

#[test]
fn sigterm_exits_within_the_grace_whatever_clients_hold() {
    let mut s = Server::start(
        &fixture("qwen3_moe"),
        &["--shutdown-grace", "1", "--read-timeout", "600"],
    );
    let mut mid_header = s.raw();
    mid_header
        .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: 12")
        .unwrap();
    let mut mid_body = s.raw();
    mid_body
        .write_all(post_head("/v1/completions", 1000).as_bytes())
        .unwrap();
    mid_body.write_all(b"{\"prompt\": ").unwrap();
    let mut idle = s.raw();
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    read_head(&mut idle);
    let _silent = s.raw();
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let status = s.stop_within(Duration::from_secs(15));
    assert!(
        status.is_some_and(|st| st.success()),
        "SIGTERM did not end the server: {status:?}\n{}",
        s.stderr.lock().unwrap()
    );
    assert!(t.elapsed() < Duration::from_secs(6), "{:?}", t.elapsed());
}

#[test]
fn without_a_key_a_foreign_host_or_origin_is_refused() {
    let s = Server::start(&fixture("qwen3_moe"), &[]);
    let get = |host: &str, origin: Option<&str>| {
        let origin = origin.map_or(String::new(), |o| format!("Origin: {o}\r\n"));
        s.raw_request(&format!(
            "GET /v1/models HTTP/1.1\r\nHost: {host}\r\n{origin}Connection: close\r\n\r\n"
        ))
    };
    let cases: &[(&str, Option<&str>, u16)] = &[
        ("localhost:8080", None, 200),
        ("127.0.0.1", None, 200),
        ("[::1]:9", None, 200),
        ("evil.example", None, 403),
        ("localhost.evil.example:80", None, 403),
        ("127.0.0.1", Some("http://evil.example"), 403),
        ("127.0.0.1", Some("null"), 403),
        ("127.0.0.1", Some("http://localhost:3000"), 200),
        ("localhost", Some("https://[::1]"), 200),
    ];
    for &(host, origin, want) in cases {
        let (status, body) = get(host, origin);
        assert_eq!(status, want, "Host {host} Origin {origin:?}: {body}");
        if want == 403 {
            let v: Value = serde_json::from_str(&body).unwrap();
            assert!(v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("--api-key"));
        }
    }
    // With a key the key decides, whatever the Host.
    let s = Server::start(&fixture("qwen3_moe"), &["--api-key", "k"]);
    let (status, _) = s.raw_request(
        "GET /v1/models HTTP/1.1\r\nHost: box.example\r\nAuthorization: Bearer k\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 200);
}

#[test]
fn serve_flags_that_cannot_work_are_refused_by_name() {
    let model = fixture("qwen3_moe");
    let model = model.to_str().unwrap();
    let max = u64::MAX.to_string();
    let cases: &[(&[&str], &str)] = &[
        (&["--shutdown-grace", &max], "--shutdown-grace"),
        (&["--keep-alive", &max], "--keep-alive"),
        (&["--max-tokens", "0"], "--max-tokens"),
        (&["--api-key", ""], "--api-key"),
        (&["--read-timeout", "0"], "--read-timeout"),
        (&["--max-connections", "0"], "--max-connections"),
    ];
    for (flags, name) in cases {
        let mut args = vec!["serve", "--port", "0", "--model", model];
        args.extend_from_slice(flags);
        let out = common::moestream(&args);
        assert!(!out.ok, "{flags:?} was accepted");
        assert!(out.stderr.contains(name), "{flags:?}: {}", out.stderr);
    }
}

#[test]
fn a_prompt_past_the_context_is_refused_before_tokenizing() {
    let s = Server::start(&fixture("qwen3_moe"), &[]);
    let before = s.memory_kb("VmHWM");
    let prompt = "experts route tokens ".repeat(1_900_000 / 21);
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 1}),
    );
    assert_eq!(r.status, 400, "{}", r.json);
    let msg = r.json["error"]["message"].as_str().unwrap();
    assert!(msg.contains("bytes") && msg.contains("256"), "{msg}");
    let grown_mb = s.memory_kb("VmHWM").saturating_sub(before) / 1024;
    assert!(grown_mb < 100, "peak memory grew by {grown_mb} MB");
}

#[test]
fn sigterm_while_the_model_loads_ends_the_server_promptly() {
    use moestream::server::{serve_until, Limits, ServerConfig};
    let dir = fixture("qwen3_moe");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let config = ServerConfig {
        model_name: "m".into(),
        api_key: None,
        host: "127.0.0.1".into(),
        limits: Limits::default(),
        scheduler: moestream_scheduler::SchedulerConfig {
            kv_slots: 1,
            queue_max: 0,
            queue_wait_ms_max: 1000,
            batch_max: 1,
        },
        kv_dir: None,
        model_dir: dir.clone(),
        keep_alive: Duration::from_secs(10),
        shutdown_grace: Duration::from_secs(1),
        max_tokens_default: 4,
        overrides: Default::default(),
        speculation: Default::default(),
        reasoning_format: Default::default(),
        cors_origin: None,
    };
    let tok = moestream::formats::tokenizer::Tokenizer::load(&dir).unwrap();
    // A load that takes a minute, and a stop as soon as the server answers.
    let loader = Box::new(|| {
        std::thread::sleep(Duration::from_secs(60));
        Err("never loads".to_string())
    });
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let stop = Box::pin(async move {
        let _ = stop_rx.await;
    });
    let server = std::thread::spawn(move || serve_until(config, listener, tok, None, loader, stop));
    let loading = ureq::get(&format!("http://{addr}/health")).call();
    assert!(matches!(loading, Err(ureq::Error::Status(503, _))));
    let t = Instant::now();
    stop_tx.send(()).unwrap();
    while !server.is_finished() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "still waiting for the load"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(server.join().unwrap().is_ok());
}

/// A seeded xorshift generator: a failing mutant is named by its seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n.max(1) as u64) as usize
    }
}

/// Values that break naive request handling.
fn extreme(rng: &mut Rng) -> Value {
    let values = [
        json!(-1),
        json!(0),
        json!(u64::MAX),
        json!(1e308),
        json!(-1e308),
        json!(""),
        json!("\u{0}\u{fffd}"),
        json!([]),
        json!({}),
        json!(null),
        json!(true),
        json!([[[[[[[[[[]]]]]]]]]]),
        json!({"$ref": "#"}),
    ];
    values[rng.below(values.len())].clone()
}

/// Replaces one value anywhere in `v` by an extreme one.
fn mutate_value(rng: &mut Rng, v: &mut Value, depth: usize) {
    let children: Vec<&mut Value> = match v {
        Value::Object(m) => m.values_mut().collect(),
        Value::Array(a) => a.iter_mut().collect(),
        _ => Vec::new(),
    };
    if children.is_empty() || (depth > 0 && rng.below(3) == 0) {
        *v = extreme(rng);
        return;
    }
    let n = children.len();
    let i = rng.below(n);
    if let Some(child) = children.into_iter().nth(i) {
        mutate_value(rng, child, depth + 1);
    }
}

/// One byte-level mutation: a bit flip, a truncation, an inserted token,
/// a deleted or a repeated span.
fn mutate_bytes(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut b = input.to_vec();
    let at = rng.below(b.len());
    let end = (at + 1 + rng.below(16)).min(b.len());
    match rng.below(5) {
        0 => b[at] ^= 1 << rng.below(8),
        1 => b.truncate(at),
        2 => {
            let tokens: [&[u8]; 8] = [
                b"\"", b"{", b"]", b"\\u0000", b"-1", b"1e999", b"null", b"\xff",
            ];
            let t = tokens[rng.below(tokens.len())];
            b.splice(at..at, t.iter().copied());
        }
        3 => {
            b.drain(at..end);
        }
        _ => {
            let span = b[at..end].to_vec();
            b.splice(at..at, span);
        }
    }
    b
}

#[test]
fn mutated_request_bodies_are_answered_4xx_never_5xx() {
    let s = Server::start(&fixture("qwen3_moe"), &["--max-tokens", "2"]);
    let seeds = [
        ("/v1/chat/completions", chat("hi", 2)),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "system", "content": "be brief"},
                                {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                   "max_tokens": 2, "stop": ["\n"], "logprobs": true, "top_logprobs": 2,
                   "stream": true}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "the expert", "max_tokens": 2, "seed": 1, "top_k": 3, "top_p": 0.9}),
        ),
        (
            "/v1/completions",
            json!({"prompt": [1, 2, 3], "max_tokens": 2, "logprobs": 2, "stream": true,
                   "stream_options": {"include_usage": true}}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 2, "response_format": {"type": "json_schema",
                   "json_schema": {"schema": {"type": "object",
                                              "properties": {"a": {"type": "integer"}}}}}}),
        ),
    ];
    for (i, (path, seed)) in seeds.iter().enumerate() {
        for round in 0..40u64 {
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (i as u64 * 1000 + round + 1));
            let body = if round % 2 == 0 {
                mutate_bytes(&mut rng, seed.to_string().as_bytes())
            } else {
                let mut v = seed.clone();
                mutate_value(&mut rng, &mut v, 0);
                v.to_string().into_bytes()
            };
            let shown = String::from_utf8_lossy(&body).into_owned();
            let sent = ureq::post(&format!("{}{path}", s.base))
                .set("Content-Type", "application/json")
                .send_bytes(&body);
            let (status, text) = match sent {
                Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
                Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
                Err(e) => panic!("{path} {shown}: {e}"),
            };
            assert!(
                status == 200 || (400..500).contains(&status),
                "{path} {shown}: {status} {text}"
            );
            assert!(!text.contains("server_error"), "{path} {shown}: {text}");
        }
    }
    assert_eq!(s.get("/health").0, 200);
}

/// A completion constrained to an object of `n` required integers.
fn wide_schema_request(n: usize) -> Value {
    let props: serde_json::Map<String, Value> = (0..n)
        .map(|i| (format!("p{i}"), json!({"type": "integer"})))
        .collect();
    let required: Vec<&String> = props.keys().collect();
    let schema = json!({"type": "object", "properties": props, "required": required});
    json!({"prompt": "x", "max_tokens": 1, "response_format":
        {"type": "json_schema", "json_schema": {"name": "wide", "schema": schema}}})
}

#[test]
fn health_answers_promptly_while_heavy_requests_are_prepared() {
    let s = Server::start(&fixture("qwen3_moe"), &[]);
    // A JSON schema whose grammar takes a while to compile.
    let body = wide_schema_request(4000);
    let t = Instant::now();
    let heavy: Vec<_> = (0..8)
        .map(|_| {
            let (base, body) = (s.base.clone(), body.clone());
            std::thread::spawn(move || {
                ureq::post(&format!("{base}/v1/completions"))
                    .send_json(body)
                    .map(|r| r.status())
                    .unwrap_or_else(|e| panic!("{e}"))
            })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    while heavy.iter().any(|h| !h.is_finished()) {
        let asked = Instant::now();
        assert_eq!(s.get("/health").0, 200);
        slowest = slowest.max(asked.elapsed());
        std::thread::sleep(Duration::from_millis(20));
    }
    let heavy_for = t.elapsed();
    for h in heavy {
        assert_eq!(h.join().unwrap(), 200);
    }
    eprintln!("8 heavy requests for {heavy_for:?}; slowest /health {slowest:?}");
    // Before the fix the compiles ran on the two async threads: /health
    // waited 0.8 s behind four of these (and 1 s behind four 1.9 MB
    // prompts, which are now refused before they are tokenized), most of
    // the time they all took. Relative to that time, so a loaded CI
    // machine slows both sides alike.
    assert!(
        slowest < heavy_for / 4,
        "/health took {slowest:?} while the requests took {heavy_for:?}"
    );
}

#[test]
fn a_recursive_ref_schema_is_a_400_naming_the_schema_not_a_500() {
    let s = Server::start(&fixture("qwen3_moe"), &[]);
    let schemas = [
        json!({"$ref": "#"}),
        json!({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}),
    ];
    for schema in schemas {
        let body = json!({"prompt": "x", "max_tokens": 2, "response_format":
            {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}});
        let r = s.post("/v1/completions", &body);
        assert_eq!(r.status, 400, "{schema}: {}", r.json);
        assert_eq!(r.json["error"]["param"], "response_format");
        let msg = r.json["error"]["message"].as_str().unwrap();
        assert!(msg.contains("schema") && !msg.contains("<state>"), "{msg}");
    }
}

#[test]
fn a_schema_of_thousands_of_properties_is_a_400_not_a_stack_overflow() {
    let s = Server::start(&fixture("qwen3_moe"), &[]);
    let body = wide_schema_request(10_000);
    let r = s.post("/v1/completions", &body);
    assert_eq!(r.status, 400, "{}", r.json);
    assert_eq!(r.json["error"]["param"], "response_format");
    assert!(r.json["error"]["message"]
        .as_str()
        .unwrap()
        .contains("10000"));
    assert_eq!(s.get("/health").0, 200, "the server is still up");
}

/// A GET with headers: the status and the JSON body.
fn get_json(s: &Server, path: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut req = ureq::get(&format!("{}{path}", s.base));
    for (k, v) in headers {
        req = req.set(k, v);
    }
    let (status, resp) = match req.call() {
        Ok(r) => (r.status(), r),
        Err(ureq::Error::Status(code, r)) => (code, r),
        Err(e) => panic!("{path}: {e}"),
    };
    (status, resp.into_json().unwrap())
}

#[test]
fn llama_server_endpoints_tokenize_detokenize_and_props_behind_the_key() {
    let s = Server::start(&fixture("qwen3_moe"), &["--slots", "2", "--api-key", "k"]);
    let key = [("authorization", "Bearer k")];
    let text = "Experts are routed, 世界!";
    let r = s.post_with("/tokenize", &json!({ "content": text }), &key);
    assert_eq!(r.status, 200, "{}", r.json);
    let ids: Vec<u64> = r.json["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert!(ids.len() > 3, "{ids:?}");
    let back = s.post_with("/detokenize", &json!({ "tokens": ids }), &key);
    assert_eq!(back.status, 200, "{}", back.json);
    assert_eq!(back.json["content"], text);
    // Pieces: the same ids, each with its text (every piece here is whole
    // UTF-8 but the CJK ones may split; their join is the text).
    let r = s.post_with(
        "/tokenize",
        &json!({"content": "Experts are routed", "with_pieces": true}),
        &key,
    );
    let pieces = r.json["tokens"].as_array().unwrap();
    let joined: String = pieces
        .iter()
        .map(|p| p["piece"].as_str().unwrap())
        .collect();
    assert_eq!(joined, "Experts are routed");
    assert!(pieces.iter().all(|p| p["id"].is_u64()));

    // The key is needed; bad input is a 400 naming the field.
    assert_eq!(s.post("/tokenize", &json!({"content": "x"})).status, 401);
    assert_eq!(s.get("/props").0, 401);
    assert_eq!(s.get("/slots").0, 401);
    let cases = [
        (
            "/detokenize",
            json!({"tokens": [4_000_000_000u64]}),
            "4000000000",
        ),
        (
            "/tokenize",
            json!({"content": "x", "sparkle": 1}),
            "sparkle",
        ),
        (
            "/tokenize",
            json!({"content": "x", "parse_special": false}),
            "parse_special",
        ),
        ("/tokenize", json!({"text": "x"}), "content"),
    ];
    for (path, body, needle) in cases {
        let r = s.post_with(path, &body, &key);
        assert_eq!(r.status, 400, "{path} {body}: {}", r.json);
        let msg = r.json["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{path} {body}: {msg}");
    }

    let (status, props) = get_json(&s, "/props", &key);
    assert_eq!(status, 200, "{props}");
    assert_eq!(props["total_slots"], 2);
    assert_eq!(props["chat_template"], common::server::CHATML);
    let settings = &props["default_generation_settings"];
    assert!(settings["n_ctx"].as_u64().unwrap() > 0, "{props}");
    assert!(settings["params"]["temperature"].is_number(), "{props}");
    let (status, slots) = get_json(&s, "/slots", &key);
    assert_eq!(status, 200, "{slots}");
    let slots = slots.as_array().unwrap();
    assert_eq!(slots.len(), 2);
    assert!(slots.iter().all(|s| s["is_processing"] == false));
    assert_eq!(slots[1]["id"], 1);

    // Each answered request lands in the latency histograms: one time to
    // first token, one duration, a time between each two tokens.
    let body = json!({"prompt": "count", "max_tokens": 5, "temperature": 0, "ignore_eos": true});
    assert_eq!(s.post_with("/v1/completions", &body, &key).status, 200);
    assert_eq!(s.metric("time_to_first_token_seconds_count"), 1.0);
    assert_eq!(s.metric("request_duration_seconds_count"), 1.0);
    assert_eq!(s.metric("time_per_output_token_seconds_count"), 4.0);
    let (_, text) = s.get("/metrics");
    let inf = text
        .lines()
        .find(|l| l.starts_with("moestream_request_duration_seconds_bucket{le=\"+Inf\"}"))
        .unwrap();
    assert!(inf.ends_with(" 1"), "{inf}");
    assert!(s.metric("request_duration_seconds_sum") > 0.0);
}

#[test]
fn slots_show_the_running_request() {
    let model = tiny_model();
    let s = Server::start(model.path(), &["--slots", "2"]);
    let reader = long_stream(&s);
    let deadline = Instant::now() + Duration::from_secs(30);
    let busy = loop {
        let (status, slots) = get_json(&s, "/slots", &[]);
        assert_eq!(status, 200, "{slots}");
        let busy: Vec<Value> = slots
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["is_processing"] == true)
            .cloned()
            .collect();
        if !busy.is_empty() {
            break busy;
        }
        assert!(Instant::now() < deadline, "no slot ever showed the request");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(busy.len(), 1, "{busy:?}");
    let next = &busy[0]["next_token"][0];
    assert!(busy[0]["n_prompt_tokens"].as_u64().unwrap() > 0, "{busy:?}");
    let (decoded, remain) = (
        next["n_decoded"].as_u64().unwrap(),
        next["n_remain"].as_u64().unwrap(),
    );
    assert!(decoded >= 1 && decoded + remain <= 4000, "{busy:?}");
    drop(reader);
}

#[test]
fn n_choices_each_sample_their_own_seed_whole_and_streamed() {
    let s = Server::start(&fixture("qwen3_moe"), &["--slots", "2"]);
    let body = |n: u64, seed: u64| {
        json!({"messages": [{"role": "user", "content": "tell me about experts"}],
               "max_tokens": 8, "temperature": 1, "seed": seed, "n": n, "ignore_eos": true})
    };
    let one = |seed| text_of(&s.post("/v1/chat/completions", &body(1, seed)));
    let r = s.post("/v1/chat/completions", &body(2, 5));
    assert_eq!(r.status, 200, "{}", r.json);
    let choices = r.json["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    let texts: Vec<&str> = choices
        .iter()
        .map(|c| c["message"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(choices[1]["index"], 1);
    assert_eq!(
        texts,
        [one(5), one(6)],
        "choice i samples with seed + i, as alone"
    );
    assert_eq!(r.json["usage"]["completion_tokens"], 16);

    // Streamed: each choice's deltas, by index, give its text; one usage
    // chunk and one [DONE] end the stream.
    let mut streamed = body(2, 5);
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let chunks = s.stream("/v1/chat/completions", &streamed);
    for (i, want) in texts.iter().enumerate() {
        let of_i = |c: &&Value| c["choices"][0]["index"] == i;
        let text: String = chunks
            .iter()
            .filter(of_i)
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(&text, want, "choice {i}");
        let finishes = chunks
            .iter()
            .filter(of_i)
            .filter(|c| c["choices"][0]["finish_reason"] == "length")
            .count();
        assert_eq!(finishes, 1, "choice {i}");
    }
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], 16);

    // Completions too; more choices than slots is a 400 naming n and the flag.
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": "go", "max_tokens": 3, "n": 2, "seed": 1}),
    );
    assert_eq!(r.json["choices"].as_array().unwrap().len(), 2, "{}", r.json);
    let r = s.post("/v1/chat/completions", &body(3, 1));
    assert_eq!(r.status, 400, "{}", r.json);
    assert_eq!(r.json["error"]["param"], "n");
    let msg = r.json["error"]["message"].as_str().unwrap();
    assert!(msg.contains("--slots") && msg.contains('3'), "{msg}");
}

#[test]
fn guard_refusals_on_the_messages_api_have_anthropics_shape() {
    let s = Server::start(&fixture("qwen3_moe"), &["--api-key", "k"]);
    let body = json!({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]});
    let r = s.post_with("/v1/messages", &body, &[("x-api-key", "wrong")]);
    assert_eq!(r.status, 401);
    assert_eq!(r.json["type"], "error", "{}", r.json);
    assert_eq!(
        r.json["error"]["type"], "authentication_error",
        "{}",
        r.json
    );
    assert!(r.json["error"]["message"]
        .as_str()
        .unwrap()
        .contains("x-api-key"));
    // OpenAI's endpoints keep OpenAI's shape.
    let r = s.post("/v1/chat/completions", &chat("hi", 2));
    assert_eq!(r.status, 401);
    assert_eq!(r.json["error"]["code"], "invalid_api_key", "{}", r.json);
    // A body over the limit, refused from its head.
    let (status, text) = s.raw_request(
        "POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nx-api-key: k\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: 3000000\r\n\r\n",
    );
    assert_eq!(status, 413, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "request_too_large", "{v}");
    // No such method or endpoint under /v1/messages.
    let (status, text) = s.raw_request(
        "GET /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nx-api-key: k\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 405, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert_eq!(v["type"], "error", "{v}");
}

/// A greedy completion of prompt ids `prompt`: (text, cached prompt tokens).
fn greedy_ids(s: &Server, prompt: &[u32], max_tokens: usize) -> (String, u64) {
    let body = json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                      "ignore_eos": true});
    let r = s.post("/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.json);
    let cached = &r.json["usage"]["prompt_tokens_details"]["cached_tokens"];
    (text_of(&r), cached.as_u64().unwrap())
}

#[test]
fn a_slot_saved_by_name_erased_and_restored_continues_its_prefix() {
    let kv = tempfile::tempdir().unwrap();
    let kv_dir = kv.path().to_str().unwrap();
    let s = Server::start(&fixture("qwen3_moe"), &["--slots", "1", "--kv-dir", kv_dir]);
    let prompt: Vec<u32> = (5..45).collect();
    let longer: Vec<u32> = prompt.iter().copied().chain([7, 9, 11]).collect();
    // One token: the slot then holds exactly the prompt's positions.
    assert_eq!(greedy_ids(&s, &prompt, 1).1, 0);
    let file = json!({"filename": "conversation"});
    let saved = s.post("/slots/0?action=save", &file);
    assert_eq!(saved.status, 200, "{}", saved.json);
    assert_eq!(saved.json["filename"], "conversation");
    assert_eq!(saved.json["n_saved"], prompt.len());
    let bytes = saved.json["n_written"].as_u64().unwrap();
    assert_eq!(
        std::fs::metadata(kv.path().join("conversation"))
            .unwrap()
            .len(),
        bytes
    );
    assert!(saved.json["timings"]["save_ms"].as_f64().unwrap() >= 0.0);
    let erased = s.post("/slots/0?action=erase", &json!({}));
    assert_eq!(erased.json["n_erased"], prompt.len(), "{}", erased.json);
    // Erased: the longer prompt is computed whole (the reference answer).
    let (want, cached) = greedy_ids(&s, &longer, 6);
    assert_eq!(cached, 0, "nothing kept after the erase");
    assert_eq!(
        s.post("/slots/0?action=erase", &json!({})).json["n_erased"],
        longer.len() + 5
    );
    let restored = s.post("/slots/0?action=restore", &file);
    assert_eq!(restored.status, 200, "{}", restored.json);
    assert_eq!(restored.json["n_restored"], prompt.len());
    assert_eq!(restored.json["n_read"], bytes);
    // Restored: only the three new tokens are prefilled, the same answer.
    let prefilled = s.metric("prefill_tokens_total");
    let (got, cached) = greedy_ids(&s, &longer, 6);
    assert_eq!(cached as usize, prompt.len());
    assert_eq!(s.metric("prefill_tokens_total") - prefilled, 3.0);
    assert_eq!(
        got, want,
        "the restored KV gives the greedy answer computed whole"
    );
    assert!(common::listing(kv.path()).contains(&"conversation".to_string()));
}

#[test]
fn slot_actions_refuse_bad_names_slots_files_and_servers_without_a_kv_dir() {
    let kv = tempfile::tempdir().unwrap();
    let kv_dir = kv.path().to_str().unwrap();
    let s = Server::start(
        &fixture("qwen3_moe"),
        &["--slots", "1", "--kv-dir", kv_dir, "--api-key", "k"],
    );
    let key = [("Authorization", "Bearer k")];
    let post = |path: &str, body: Value| s.post_with(path, &body, &key);
    assert_eq!(s.post("/slots/0?action=erase", &json!({})).status, 401);
    for bad in [
        "",
        "..",
        "../escape",
        "a/b",
        ".hidden",
        "0123456789abcdef.kv",
    ] {
        let r = post("/slots/0?action=save", json!({"filename": bad}));
        assert_eq!(r.status, 400, "{bad:?}: {}", r.json);
        assert_eq!(r.json["error"]["param"], "filename", "{bad:?}");
    }
    assert!(!kv.path().parent().unwrap().join("escape").exists());
    let r = post("/slots/0?action=copy", json!({"filename": "x"}));
    assert_eq!(
        (r.status, r.json["error"]["param"].clone()),
        (400, json!("action"))
    );
    let r = post("/slots/3?action=erase", json!({}));
    assert_eq!(
        (r.status, r.json["error"]["param"].clone()),
        (400, json!("id_slot"))
    );
    // Nothing ran yet: nothing to save; a missing file names itself.
    let r = post("/slots/0?action=save", json!({"filename": "empty"}));
    assert_eq!(r.status, 400, "{}", r.json);
    assert!(r.json["error"]["message"]
        .as_str()
        .unwrap()
        .contains("holds no KV"));
    let r = post("/slots/0?action=restore", json!({"filename": "missing"}));
    assert_eq!(r.status, 400, "{}", r.json);
    assert!(r.json["error"]["message"]
        .as_str()
        .unwrap()
        .contains("missing"));
    // A file of another model is refused, naming why.
    let body = json!({"prompt": [5, 6, 7, 8], "max_tokens": 1, "temperature": 0});
    assert_eq!(post("/v1/completions", body.clone()).status, 200);
    assert_eq!(
        post("/slots/0?action=save", json!({"filename": "mine"})).status,
        200
    );
    let other_kv = tempfile::tempdir().unwrap();
    std::fs::copy(kv.path().join("mine"), other_kv.path().join("theirs")).unwrap();
    let other_dir = other_kv.path().to_str().unwrap();
    let other = Server::start(&fixture("trained/qwen3_moe"), &["--kv-dir", other_dir]);
    let r = other.post("/slots/0?action=restore", &json!({"filename": "theirs"}));
    assert_eq!(r.status, 400, "{}", r.json);
    let msg = r.json["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("theirs") && msg.contains("saved by model"),
        "{msg}"
    );
    // Without --kv-dir, save and restore say what they need.
    let plain = Server::start(&fixture("qwen3_moe"), &[]);
    let r = plain.post("/slots/0?action=save", &json!({"filename": "x"}));
    assert_eq!(r.status, 400, "{}", r.json);
    assert!(r.json["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--kv-dir"));
}

#[test]
fn n_choices_prefill_the_prompt_once_and_fork_its_kv() {
    let s = Server::start(&fixture("qwen3_moe"), &["--slots", "3"]);
    let prompt: Vec<u32> = (60..100).collect();
    let body = |n: u64, temperature: u64, seed: u64| {
        json!({"prompt": prompt, "max_tokens": 8, "temperature": temperature, "seed": seed,
               "n": n, "ignore_eos": true})
    };
    let texts = |r: &common::server::Reply| -> Vec<String> {
        assert_eq!(r.status, 200, "{}", r.json);
        let choices = r.json["choices"].as_array().unwrap();
        choices
            .iter()
            .map(|c| c["text"].as_str().unwrap().to_string())
            .collect()
    };
    let before = s.metric("prefill_tokens_total");
    let sampled = s.post("/v1/completions", &body(3, 1, 11));
    assert_eq!(
        s.metric("prefill_tokens_total") - before,
        prompt.len() as f64,
        "three choices, one prefill of the prompt"
    );
    assert_eq!(sampled.json["usage"]["prompt_tokens"], prompt.len());
    assert_eq!(
        sampled.json["usage"]["prompt_tokens_details"]["cached_tokens"],
        0
    );
    assert_eq!(sampled.json["usage"]["completion_tokens"], 24);
    let sampled = texts(&sampled);
    assert!(
        sampled[1..].iter().any(|t| *t != sampled[0]),
        "choices on their own seeds differ: {sampled:?}"
    );
    // Each choice is what its seed gives alone.
    for (i, want) in sampled.iter().enumerate() {
        assert_eq!(
            texts(&s.post("/v1/completions", &body(1, 1, 11 + i as u64)))[0],
            *want
        );
    }
    // Greedy: every choice is the single-choice answer.
    let greedy = texts(&s.post("/v1/completions", &body(1, 0, 0))).remove(0);
    assert_eq!(
        texts(&s.post("/v1/completions", &body(3, 0, 0))),
        vec![greedy; 3]
    );
}
