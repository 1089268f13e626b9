//! `moestream serve` driven over HTTP: the server runs as a child process
//! on 127.0.0.1 port 0 with a fixture model; these tests talk to it with
//! a Rust HTTP client as any OpenAI client would.

mod common;

use common::{fixture, tiny_model};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// A running server, killed when dropped.
struct Server {
    child: Child,
    base: String,
    stderr: Arc<Mutex<String>>,
    _template: tempfile::TempDir,
}

impl Server {
    /// Starts `serve` on `model` with a ChatML template and `extra` flags;
    /// returns once /health answers 200.
    fn start(model: &Path, extra: &[&str]) -> Server {
        let template = tempfile::tempdir().unwrap();
        let path = template.path().join("chat.jinja");
        std::fs::write(&path, CHATML).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_moestream"))
            .args([
                "serve",
                "--port",
                "0",
                "--expert-cache",
                "2",
                "--chat-template",
            ])
            .arg(&path)
            .arg("--model")
            .arg(model)
            .args(extra)
            .env("MOESTREAM_NO_HISTORY", "1")
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn moestream serve");
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let lines = BufReader::new(child.stderr.take().unwrap());
        let log = stderr.clone();
        std::thread::spawn(move || {
            for line in lines.lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix("listening on ") {
                    let _ = tx.send(addr.to_string());
                }
                log.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        let base = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the server printed its address");
        let server = Server {
            child,
            base,
            stderr,
            _template: template,
        };
        server.wait_ready();
        server
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if self.get("/health").0 == 200 {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("not ready: {}", self.stderr.lock().unwrap());
    }

    fn get(&self, path: &str) -> (u16, String) {
        match ureq::get(&format!("{}{path}", self.base)).call() {
            Ok(r) => (r.status(), r.into_string().unwrap()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
            Err(e) => (0, e.to_string()),
        }
    }

    /// POSTs `body` with optional headers; the status, the JSON body and
    /// the Retry-After header.
    fn post_with(&self, path: &str, body: &Value, headers: &[(&str, &str)]) -> Reply {
        let mut req = ureq::post(&format!("{}{path}", self.base));
        for (k, v) in headers {
            req = req.set(k, v);
        }
        let (status, resp) = match req.send_json(body) {
            Ok(r) => (r.status(), r),
            Err(ureq::Error::Status(code, r)) => (code, r),
            Err(e) => panic!("{path}: {e}"),
        };
        let retry_after = resp.header("retry-after").map(str::to_string);
        let text = resp.into_string().unwrap();
        let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Reply {
            status,
            json,
            retry_after,
        }
    }

    fn post(&self, path: &str, body: &Value) -> Reply {
        self.post_with(path, body, &[])
    }

    /// A streamed request's `data:` payloads, up to and without `[DONE]`.
    fn stream(&self, path: &str, body: &Value) -> Vec<Value> {
        let resp = ureq::post(&format!("{}{path}", self.base))
            .send_json(body)
            .unwrap();
        assert_eq!(resp.header("content-type"), Some("text/event-stream"));
        let mut out = Vec::new();
        for line in BufReader::new(resp.into_reader()).lines() {
            let line = line.unwrap();
            let Some(data) = line.strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                return out;
            }
            out.push(serde_json::from_str(data).unwrap());
        }
        panic!("the stream ended without [DONE]");
    }

    fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.get("/metrics");
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("moestream_{name} ")))
            .unwrap_or_else(|| panic!("no metric {name}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    }

    /// Waits (up to 30 s) until metric `name` satisfies `ok`.
    fn wait_metric(&self, name: &str, ok: impl Fn(f64) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ok(self.metric(name)) {
            assert!(Instant::now() < deadline, "{name} = {}", self.metric(name));
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Sends SIGTERM; the exit status.
    fn stop(mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Reply {
    status: u16,
    json: Value,
    retry_after: Option<String>,
}

fn chat(content: &str, max_tokens: usize) -> Value {
    json!({"messages": [{"role": "user", "content": content}],
           "max_tokens": max_tokens, "temperature": 0})
}

fn text_of(r: &Reply) -> String {
    assert_eq!(r.status, 200, "{}", r.json);
    let c = &r.json["choices"][0];
    c["message"]["content"]
        .as_str()
        .or(c["text"].as_str())
        .unwrap()
        .to_string()
}

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

#[test]
fn a_client_that_disconnects_frees_its_slot() {
    let model = tiny_model();
    let s = Server::start(model.path(), &["--slots", "1"]);
    let body = json!({"prompt": "go on", "max_tokens": 4000, "temperature": 0,
                      "ignore_eos": true, "stream": true});
    let resp = ureq::post(&format!("{}/v1/completions", s.base))
        .send_json(body)
        .unwrap();
    let mut reader = resp.into_reader();
    let mut first = [0u8; 64];
    reader.read_exact(&mut first).unwrap();
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
    let python = std::env::var("MOESTREAM_PYTHON").unwrap_or_else(|_| "python3".into());
    let s = Server::start(&fixture("qwen3_moe"), &[]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/openai_client_check.py");
    let out = Command::new(python)
        .arg(script)
        .arg(format!("{}/v1", s.base))
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
}

#[test]
fn a_waiting_stream_gets_keep_alive_comments() {
    use moestream::synth::{self, SynthSpec};
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
