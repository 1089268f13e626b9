//! A `moestream serve` child process on 127.0.0.1 port 0 with a fixture
//! model, and the HTTP calls the server tests make to it (as any OpenAI
//! client would).

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// A running server, killed when dropped.
pub struct Server {
    pub child: Child,
    pub base: String,
    pub stderr: Arc<Mutex<String>>,
    _template: tempfile::TempDir,
}

impl Server {
    /// Starts `serve` on `model` with a ChatML template and `extra` flags;
    /// returns once /health answers 200.
    pub fn start(model: &Path, extra: &[&str]) -> Server {
        Server::start_with_template(model, CHATML, extra)
    }

    /// [`Server::start`] with the chat template `template` (its text).
    pub fn start_with_template(model: &Path, template: &str, extra: &[&str]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chat.jinja");
        std::fs::write(&path, template).unwrap();
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
            _template: dir,
        };
        server.wait_ready();
        server
    }

    pub fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if self.get("/health").0 == 200 {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("not ready: {}", self.stderr.lock().unwrap());
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        match ureq::get(&format!("{}{path}", self.base)).call() {
            Ok(r) => (r.status(), r.into_string().unwrap()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
            Err(e) => (0, e.to_string()),
        }
    }

    /// POSTs `body` with optional headers; the status, the JSON body and
    /// the Retry-After header.
    pub fn post_with(&self, path: &str, body: &Value, headers: &[(&str, &str)]) -> Reply {
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

    pub fn post(&self, path: &str, body: &Value) -> Reply {
        self.post_with(path, body, &[])
    }

    /// A streamed request's `data:` payloads, up to and without `[DONE]`.
    pub fn stream(&self, path: &str, body: &Value) -> Vec<Value> {
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

    pub fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.get("/metrics");
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("moestream_{name} ")))
            .unwrap_or_else(|| panic!("no metric {name}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    }

    /// Waits (up to 30 s) until metric `name` satisfies `ok`.
    pub fn wait_metric(&self, name: &str, ok: impl Fn(f64) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ok(self.metric(name)) {
            assert!(Instant::now() < deadline, "{name} = {}", self.metric(name));
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Sends SIGTERM; the exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().unwrap()
    }

    /// Sends SIGTERM; the exit status if it exits within `limit`.
    pub fn stop_within(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// A raw connection (for slow, stalled and half-open clients).
    pub fn raw(&self) -> TcpStream {
        let c = TcpStream::connect(self.base.trim_start_matches("http://")).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c
    }

    /// Sends `request` (a whole HTTP/1.1 request) on a fresh connection;
    /// the status and everything after the head, once the server closes.
    pub fn raw_request(&self, request: &str) -> (u16, String) {
        let mut c = self.raw();
        c.write_all(request.as_bytes()).unwrap();
        let mut reply = String::new();
        c.read_to_string(&mut reply).unwrap();
        status_and_body(&reply)
    }

    /// A line of the server's /proc status, in kB (`VmRSS`, `VmHWM`).
    pub fn memory_kb(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status
            .lines()
            .find(|l| l.starts_with(&format!("{field}:")))
            .unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }
}

/// The status code and body of a raw HTTP reply.
pub fn status_and_body(reply: &str) -> (u16, String) {
    let status = reply
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = reply.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_string())
}

/// Reads a reply's head (up to the blank line).
pub fn read_head(c: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match c.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            Ok(_) => break,
            Err(e) => panic!("reading the reply's head: {e} (got {head:?})"),
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Reply {
    pub status: u16,
    pub json: Value,
    pub retry_after: Option<String>,
}

pub fn chat(content: &str, max_tokens: usize) -> Value {
    json!({"messages": [{"role": "user", "content": content}],
           "max_tokens": max_tokens, "temperature": 0})
}

pub fn text_of(r: &Reply) -> String {
    assert_eq!(r.status, 200, "{}", r.json);
    let c = &r.json["choices"][0];
    c["message"]["content"]
        .as_str()
        .or(c["text"].as_str())
        .unwrap()
        .to_string()
}

/// Runs a client check script (scripts/, with MOESTREAM_PYTHON or python3)
/// against `s` with `args`; fails on its first failed check.
pub fn run_client_script(script: &str, args: &[String]) {
    let python = std::env::var("MOESTREAM_PYTHON").unwrap_or_else(|_| "python3".into());
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts")
        .join(script);
    let out = std::process::Command::new(python)
        .arg(path)
        .args(args)
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
