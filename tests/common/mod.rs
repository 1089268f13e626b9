//! Helpers shared by the integration tests: running the `moestream` binary,
//! building small synthetic checkpoints, and rewriting safetensors headers
//! to make deliberately broken ones.

#![allow(dead_code)]

pub mod server;

use moestream::lab::synth::{self, SynthSpec};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Output of one CLI run.
pub struct Out {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the built `moestream` binary with `args`, with the usage history
/// off (tests run concurrently on shared fixtures; a history would make
/// their cache counters depend on which test ran first).
pub fn moestream(args: &[&str]) -> Out {
    moestream_env(args, &[("MOESTREAM_NO_HISTORY", "1")])
}

/// Runs the built `moestream` binary with `args` and environment `env`.
pub fn moestream_env(args: &[&str], env: &[(&str, &str)]) -> Out {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_moestream"));
    cmd.args(args).env_remove("MOESTREAM_NO_HISTORY");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("spawn moestream");
    Out {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Waits for `child` at most `secs` seconds: one still running then is
/// killed and the test fails (a hang becomes a failure naming `what`).
pub fn wait_within(mut child: std::process::Child, secs: u64, what: &str) -> std::process::Output {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while child.try_wait().expect("wait on the child").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("{what}: still running after {secs} s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().expect("the child's output")
}

/// The names in `dir`, sorted.
pub fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    v.sort();
    v
}

/// Every family's committed fixture, safetensors checkpoints (the GGUF
/// and trained fixtures apart).
pub const FAMILIES: [&str; 9] = [
    "qwen3_moe",
    "qwen2_moe",
    "mixtral",
    "mixtral_sliding_window",
    "olmoe",
    "deepseek_v3",
    "deepseek_v3_fp8",
    "glm4_moe",
    "glm_moe_dsa",
];

/// The committed fixture directory of `family`.
pub fn fixture(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(family)
}

/// A tiny synthetic model in a fresh temp dir.
pub fn tiny_model() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = SynthSpec {
        hidden: 32,
        layers: 2,
        experts: 4,
        top_k: 2,
        moe_inter: 16,
        dense_inter: 24,
        heads: 4,
        kv_heads: 2,
        head_dim: 8,
        vocab: 300,
        seed: 3,
    };
    synth::write(dir.path(), &spec).expect("write synthetic model");
    dir
}

/// Comma-joined ids.
pub fn ids(v: &[u32]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Reads a shard's header JSON and its data section.
pub fn read_shard(path: &Path) -> (serde_json::Value, Vec<u8>) {
    let bytes = std::fs::read(path).expect("read shard");
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = serde_json::from_slice(&bytes[8..8 + n]).expect("header json");
    (header, bytes[8 + n..].to_vec())
}

/// Writes a shard from a header JSON and a data section.
pub fn write_shard(path: &Path, header: &serde_json::Value, data: &[u8]) {
    let h = serde_json::to_vec(header).unwrap();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    std::fs::write(path, out).expect("write shard");
}

/// The shard of `dir` holding tensor `name`.
pub fn shard_of(dir: &Path, name: &str) -> PathBuf {
    let mut shards: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    shards.sort();
    shards
        .into_iter()
        .find(|p| read_shard(p).0.get(name).is_some())
        .unwrap_or_else(|| panic!("no shard holds {name}"))
}

/// The oracle.json of a model dir.
pub fn oracle_at(dir: &Path) -> serde_json::Value {
    let path = dir.join("oracle.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// A JSON array of numbers.
pub fn f64s(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// A JSON array of ids.
pub fn u32s(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// A failed run: non-zero exit, nothing on stdout, no panic, and stderr
/// naming each of `needles`.
pub fn assert_clean_failure(out: &Out, needles: &[&str]) {
    assert!(!out.ok, "expected failure, got success: {}", out.stdout);
    assert!(
        out.stdout.is_empty(),
        "no output on failure, got: {}",
        out.stdout
    );
    assert!(!out.stderr.contains("panicked"), "panicked: {}", out.stderr);
    for n in needles {
        assert!(
            out.stderr.contains(n),
            "stderr should name `{n}`: {}",
            out.stderr
        );
    }
}

/// `eval --json` (plus `extra`) over the oracle's `eval_ids` of `dir`; the
/// parsed JSON object.
pub fn eval_json(dir: &Path, extra: &[&str]) -> serde_json::Value {
    let eval_ids = ids(&u32s(&oracle_at(dir)["eval_ids"]));
    let mut args = vec![
        "eval",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        &eval_ids,
        "--json",
    ];
    args.extend(extra);
    let out = moestream(&args);
    assert!(out.ok, "{}: {}", dir.display(), out.stderr);
    serde_json::from_str(&out.stdout).expect("one JSON object")
}

/// `run --model DIR --prompt-ids 1,2,3 --max-tokens 2 --json` plus `extra`.
pub fn run_json(dir: &Path, extra: &[&str]) -> Out {
    let mut args = vec![
        "run",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        "1,2,3",
        "--max-tokens",
        "2",
        "--json",
    ];
    args.extend(extra);
    moestream(&args)
}

/// A copy of `family`'s fixture in a fresh temp dir (to break on purpose).
pub fn copy_fixture(family: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("tempdir");
    for e in std::fs::read_dir(fixture(family)).expect("fixture dir") {
        let p = e.expect("fixture entry").path();
        std::fs::copy(&p, tmp.path().join(p.file_name().unwrap())).expect("copy fixture file");
    }
    tmp
}

/// A copy of `family`'s fixture whose context holds `positions` (the
/// fixtures' own hold at most one prefill chunk).
pub fn long_fixture(family: &str, positions: usize) -> tempfile::TempDir {
    let dir = copy_fixture(family);
    let path = dir.path().join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read config"))
            .expect("parse config");
    cfg["max_position_embeddings"] = positions.into();
    std::fs::write(&path, cfg.to_string()).expect("write config");
    dir
}

/// `n` spread-out token ids below `vocab`.
pub fn spread_ids(n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7919 + 13) % vocab) as u32).collect()
}

/// A greedy decode driven step by step, for tests that count something
/// between the prompt and the decode (allocations, cache hits, fresh read
/// buffers).
pub struct Greedy<'m> {
    model: &'m moestream::model::Model,
    kv: moestream::model::kv::KvCache,
    prof: moestream::model::profile::Profile,
    logits: Vec<f32>,
    pub tokens: Vec<u32>,
}

impl<'m> Greedy<'m> {
    /// Runs `prompt` with room for `steps` more tokens; the first token is
    /// chosen.
    pub fn prefill(model: &'m moestream::model::Model, prompt: &[u32], steps: usize) -> Self {
        let mut g = Greedy {
            model,
            kv: model.new_kv(prompt.len() + steps + 1),
            prof: Default::default(),
            logits: Vec::new(),
            tokens: Vec::new(),
        };
        g.forward(prompt);
        g
    }

    /// `steps` decode steps, each feeding the last token chosen.
    pub fn steps(&mut self, steps: usize) {
        for _ in 0..steps {
            let id = *self.tokens.last().expect("a chosen token");
            self.forward(&[id]);
        }
    }

    fn forward(&mut self, ids: &[u32]) {
        self.model
            .forward_into(ids, &mut self.kv, false, &mut self.prof, &mut self.logits)
            .expect("forward");
        self.tokens
            .push(moestream::engine::sampler::argmax(&self.logits));
    }
}

/// Runs `moestream args` (through `sh -c` when `limit_blocks` is set:
/// SIGXFSZ ignored and `ulimit -f` at that many blocks, so a write past
/// it fails with EFBIG as one past a full disk fails with ENOSPC), killed
/// after 60 s: a run still going then is a failure, not a hang.
pub fn moestream_bounded(args: &[&str], limit_blocks: Option<u64>) -> Out {
    let bin = env!("CARGO_BIN_EXE_moestream");
    let mut cmd = match limit_blocks {
        None => {
            let mut c = Command::new(bin);
            c.args(args);
            c
        }
        Some(n) => {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(format!("trap '' XFSZ; ulimit -f {n}; exec \"$0\" \"$@\""))
                .arg(bin)
                .args(args);
            c
        }
    };
    let child = cmd
        .env("MOESTREAM_NO_HISTORY", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn moestream");
    let out = wait_within(child, 60, &format!("moestream {args:?}"));
    Out {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A cgroup-v1 memory group capped at `limit` bytes, removed on drop;
/// `None` where one cannot be created (no v1 memory controller, no rights).
pub struct MemoryCgroup {
    pub dir: std::path::PathBuf,
}

impl MemoryCgroup {
    pub fn create(limit: u64) -> Option<MemoryCgroup> {
        let root = Path::new("/sys/fs/cgroup/memory");
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = root.join(format!("moestream-test-{}-{n}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        let g = MemoryCgroup { dir };
        std::fs::write(g.dir.join("memory.limit_in_bytes"), limit.to_string()).ok()?;
        Some(g)
    }

    /// Runs `moestream args` inside the group (joined before exec, so
    /// every byte the run touches counts), the usage history off.
    pub fn run(&self, args: &[&str]) -> Out {
        let procs = self.dir.join("cgroup.procs");
        let script = format!("echo $$ > {} && exec \"$0\" \"$@\"", procs.display());
        let o = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg(env!("CARGO_BIN_EXE_moestream"))
            .args(args)
            .env("MOESTREAM_NO_HISTORY", "1")
            .output()
            .unwrap();
        Out {
            ok: o.status.success(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }

    pub fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.join(file)).unwrap_or_default()
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}
