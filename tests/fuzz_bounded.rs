//! The fuzz targets of fuzz/ (cargo-fuzz, nightly), bounded so CI runs
//! them: each entry point gets mutants of real inputs (every fixture's
//! shard headers, config.json and generation_config.json, the chat
//! templates of tests/fixtures/chat_templates and the hostile shapes of
//! issue 31 under tiny fuel and memory bounds, two GGUF headers with bytes
//! flipped or a metadata value swapped for an extreme one, a routing trace
//! recorded by a run) from a seeded
//! generator for a fixed number of rounds: bit flips, interesting bytes,
//! truncations, spliced spans, and JSON-aware swaps of values for extreme
//! ones. Any panic fails the test with the input that caused it; so does
//! any single call slower than `HANG` (a hang, bounded; generous, because
//! CI runs this beside the other test binaries on two loaded cores and a
//! debug-build tokenizer parse alone can take a second there).

mod common;

use moestream::engine::sampler::Rng;
use moestream::formats::config::ModelConfig;
use moestream::model::rope::Rope;
use serde_json::Value;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A call slower than this is a hang, not a slow parse.
const HANG: Duration = Duration::from_secs(30);

/// Mutants per seed input and target.
const ROUNDS: usize = 3000;

/// The fixture models (directories with a config.json).
fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut v: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("config.json").is_file())
        .collect();
    v.sort();
    v
}

fn below(rng: &mut Rng, n: usize) -> usize {
    (rng.next_u64() % n.max(1) as u64) as usize
}

/// One byte-level mutation of `input`.
fn mutate_bytes(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + below(rng, 4) {
        let at = below(rng, v.len());
        match below(rng, 6) {
            0 if !v.is_empty() => v[at] ^= 1 << below(rng, 8),
            1 if !v.is_empty() => v[at] = [0, 0xff, b'"', b'{', b'-', b'9'][below(rng, 6)],
            2 => v.truncate(at),
            3 => {
                let end = (at + below(rng, 64)).min(v.len());
                let span = v[at..end].to_vec();
                let to = below(rng, v.len());
                v.splice(to..to, span);
            }
            4 if !v.is_empty() => {
                v.remove(at);
            }
            _ => v.insert(at.min(v.len()), b'0' + below(rng, 10) as u8),
        }
    }
    v
}

/// Values that break naive arithmetic.
fn extreme(rng: &mut Rng) -> Value {
    let picks = [
        serde_json::json!(0),
        serde_json::json!(-1),
        serde_json::json!(1e308),
        serde_json::json!(-1e308),
        serde_json::json!(5e-324),
        serde_json::json!(u64::MAX),
        serde_json::json!(1u64 << 40),
        serde_json::json!(2048),
        serde_json::json!(null),
        serde_json::json!("x"),
        serde_json::json!([]),
        serde_json::json!({}),
        serde_json::json!(true),
    ];
    picks[below(rng, picks.len())].clone()
}

/// One JSON-aware mutation: some value anywhere replaced by an extreme
/// one, or some key removed.
fn mutate_json(rng: &mut Rng, v: &Value) -> Value {
    let mut v = v.clone();
    mutate_in(rng, &mut v, 4);
    v
}

fn mutate_in(rng: &mut Rng, v: &mut Value, depth: usize) {
    if depth == 0 || below(rng, 3) == 0 {
        *v = extreme(rng);
        return;
    }
    match v {
        Value::Object(m) if !m.is_empty() => {
            let k = m.keys().nth(below(rng, m.len())).unwrap().clone();
            if below(rng, 4) == 0 {
                m.remove(&k);
            } else {
                mutate_in(rng, m.get_mut(&k).unwrap(), depth - 1);
            }
        }
        Value::Array(a) if !a.is_empty() => {
            let i = below(rng, a.len());
            mutate_in(rng, &mut a[i], depth - 1);
        }
        _ => *v = extreme(rng),
    }
}

/// Runs `f` on `input`, failing on a panic or on a call over `HANG`.
fn check(target: &str, input: &[u8], f: impl FnOnce()) {
    let start = Instant::now();
    let r = catch_unwind(AssertUnwindSafe(f));
    let shown = String::from_utf8_lossy(&input[..input.len().min(600)]).into_owned();
    assert!(r.is_ok(), "{target} panicked on: {shown}");
    assert!(
        start.elapsed() < HANG,
        "{target} took {:?} on: {shown}",
        start.elapsed()
    );
}

fn header_of(shard: &Path) -> Vec<u8> {
    let bytes = std::fs::read(shard).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    bytes[8..8 + n].to_vec()
}

fn parse_header(data: &[u8]) {
    for extra in [0u64, 1, 4096, u32::MAX as u64] {
        let file_len = 8 + data.len() as u64 + extra;
        let _ = moestream::formats::weights::index::parse_header(Path::new("fuzz"), data, file_len);
    }
}

fn parse_config(v: &Value) {
    if let Ok(cfg) = ModelConfig::from_json(Path::new("config.json"), v) {
        let _ = Rope::new(&cfg.rope);
    }
}

#[test]
fn safetensors_headers_never_panic() {
    let mut rng = Rng::new(0x5afe);
    for dir in fixtures() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_none_or(|x| x != "safetensors") {
                continue;
            }
            let header = header_of(&p);
            let json: Value = serde_json::from_slice(&header).unwrap();
            for _ in 0..ROUNDS / 4 {
                let m = mutate_bytes(&mut rng, &header);
                check("safetensors_header", &m, || parse_header(&m));
                let m = serde_json::to_vec(&mutate_json(&mut rng, &json)).unwrap();
                check("safetensors_header", &m, || parse_header(&m));
            }
        }
    }
}

#[test]
fn config_json_never_panics() {
    let mut rng = Rng::new(0xc0f1);
    for dir in fixtures() {
        let text = std::fs::read(dir.join("config.json")).unwrap();
        let json: Value = serde_json::from_slice(&text).unwrap();
        for _ in 0..ROUNDS {
            let m = mutate_bytes(&mut rng, &text);
            check("config_json", &m, || {
                if let Ok(v) = serde_json::from_slice::<Value>(&m) {
                    parse_config(&v);
                }
            });
            let v = mutate_json(&mut rng, &json);
            let shown = serde_json::to_vec(&v).unwrap();
            check("config_json", &shown, || parse_config(&v));
        }
    }
}

#[test]
fn generation_config_never_panics() {
    let mut rng = Rng::new(0x9e4c);
    for dir in fixtures() {
        let path = dir.join("generation_config.json");
        let Ok(text) = std::fs::read(&path) else {
            continue;
        };
        let json: Value = serde_json::from_slice(&text).unwrap();
        for _ in 0..ROUNDS {
            let m = serde_json::to_vec(&mutate_json(&mut rng, &json)).unwrap();
            check("generation_config", &m, || {
                let text = String::from_utf8_lossy(&m);
                let _ = moestream::formats::tokenizer::eos_ids_of(&path, &text);
            });
        }
    }
}

#[test]
fn tokenizer_json_never_panics() {
    let mut rng = Rng::new(0x70c3);
    let path = fixtures()[0].join("tokenizer.json");
    let text = std::fs::read(&path).unwrap();
    let json: Value = serde_json::from_slice(&text).unwrap();
    for _ in 0..ROUNDS / 10 {
        let m = mutate_bytes(&mut rng, &text);
        check("tokenizer_json", &m, || {
            let _ = moestream::formats::tokenizer::Tokenizer::from_json(
                &path,
                &String::from_utf8_lossy(&m),
            );
        });
        let m = serde_json::to_vec(&mutate_json(&mut rng, &json)).unwrap();
        check("tokenizer_json", &m, || {
            let t = moestream::formats::tokenizer::Tokenizer::from_json(
                &path,
                &String::from_utf8_lossy(&m),
            );
            if let Ok(t) = t {
                let _ = t.encode("the engine reads experts");
                let _ = t.decode(&[0, 1, 2, 3, 4, 5]);
            }
        });
    }
}

fn chat_seeds() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates");
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "jinja"))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    v.sort();
    // The hostile shapes of issue 31: each must stay an error, not an abort.
    v.extend(
        [
            "{{ messages | tojson(indent=10**15) }}",
            "{{ messages[0].content | indent(10**15) }}",
            "{{ '%1000000000s' | format('x') }}",
            "{% set s = 'x' * 10**6 %}{% for i in range(1000) %}{{ s }}{% endfor %}",
            "{% for a in messages %}{% for b in messages %}{{ b.content * 1000 }}{% endfor %}{% endfor %}",
        ]
        .map(String::from),
    );
    v
}

fn render_template(source: &[u8]) {
    use moestream::formats::chat::{ChatTemplate, Message, SpecialTokens};
    let source = String::from_utf8_lossy(source).into_owned();
    let tokens = SpecialTokens {
        bos_token: Some("<s>".into()),
        eos_token: Some("</s>".into()),
    };
    let Ok(t) = ChatTemplate::new(source, tokens, "fuzz.jinja".into()) else {
        return;
    };
    let t = t.with_limits(100_000, 1 << 20);
    let messages = [
        Message::new("system", "be brief"),
        Message::new("user", "hi\nthere"),
        Message::new("assistant", "hello"),
    ];
    let _ = t.render(&messages, true);
}

#[test]
fn chat_template_never_panics() {
    let mut rng = Rng::new(0xc4a7);
    for seed in chat_seeds() {
        check("chat_template", seed.as_bytes(), || {
            render_template(seed.as_bytes())
        });
        for _ in 0..ROUNDS / 10 {
            let m = mutate_bytes(&mut rng, seed.as_bytes());
            check("chat_template", &m, || render_template(&m));
        }
    }
}

/// Metadata values that break naive arithmetic or allocation.
fn extreme_gguf(rng: &mut Rng) -> moestream::formats::gguf::file::Value {
    use moestream::formats::gguf::file::{Array, Value};
    let picks = [
        Value::U64(1 << 40),
        Value::U64(u64::MAX),
        Value::I32(-1),
        Value::U32(0),
        Value::F32(f32::NAN),
        Value::F64(f64::INFINITY),
        Value::F32(0.0),
        Value::Str(String::new()),
        Value::Str("x".repeat(5000)),
        Value::Bool(true),
        Value::Array(Array::Str(Vec::new())),
        Value::Array(Array::U8(vec![0; 64])),
        Value::Array(Array::Str(vec!["▁a".into(); 64])),
    ];
    picks[below(rng, picks.len())].clone()
}

/// The GGUF seeds: (header bytes, file length, metadata, tensor specs).
type GgufSeed = (
    Vec<u8>,
    u64,
    Vec<(String, moestream::formats::gguf::file::Value)>,
    Vec<moestream::convert::gguf_write::TensorSpec>,
);

fn gguf_seed(name: &str) -> GgufSeed {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gguf")
        .join(name);
    let f = moestream::formats::gguf::file::GgufFile::open(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let mut meta: Vec<_> = f.metadata.clone().into_iter().collect();
    meta.sort_by(|a, b| a.0.cmp(&b.0));
    let specs = f
        .tensors
        .iter()
        .map(|t| moestream::convert::gguf_write::TensorSpec {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ty: t.ty,
        })
        .collect();
    let header = bytes[..f.data_offset as usize].to_vec();
    (header, f.file_len, meta, specs)
}

/// The header of a GGUF file written with `meta` and `specs` (data zero).
fn gguf_header_of(
    dir: &Path,
    meta: &[(String, moestream::formats::gguf::file::Value)],
    specs: &[moestream::convert::gguf_write::TensorSpec],
) -> (Vec<u8>, u64) {
    let path = dir.join("m.gguf");
    moestream::convert::gguf_write::write_gguf(&path, meta, specs, |i, w| {
        let zeros = vec![0u8; specs[i].bytes() as usize];
        w.write_all(&zeros)
            .map_err(|e| moestream::error::Error::file("fuzz", e))
    })
    .unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let len = bytes.len() as u64;
    let data_offset = moestream::formats::gguf::file::GgufFile::open(&path)
        .map(|f| f.data_offset as usize)
        .unwrap_or(bytes.len());
    (bytes[..data_offset].to_vec(), len)
}

#[test]
fn gguf_metadata_never_panics() {
    let mut rng = Rng::new(0x66af);
    let dir = tempfile::tempdir().unwrap();
    let derive = |h: &[u8], len: u64| {
        let _ = moestream::formats::gguf::derive_documents(Path::new("fuzz.gguf"), h, len);
    };
    for name in ["mixtral-bf16.gguf", "qwen3moe-Q4_0.gguf"] {
        let (header, len, meta, specs) = gguf_seed(name);
        for _ in 0..ROUNDS / 20 {
            let m = mutate_bytes(&mut rng, &header);
            check("gguf_metadata", &m, || derive(&m, len));
            let mut edited = meta.clone();
            let at = below(&mut rng, edited.len());
            edited[at].1 = extreme_gguf(&mut rng);
            let shown = format!("{} = {:?}", edited[at].0, edited[at].1);
            let (h, l) = gguf_header_of(dir.path(), &edited, &specs);
            check("gguf_metadata", shown.as_bytes(), || derive(&h, l));
        }
    }
}

/// The committed seed trace (a fixed file, so every CI run fuzzes the same
/// mutants; a fresh trace's run id and timings differ run to run). Made by
/// `moestream run --model tests/fixtures/qwen3_moe --prompt-ids 1,2,3
/// --max-tokens 3 --trace tests/fixtures/traces/qwen3_moe-3-tokens.parquet`.
#[test]
fn routing_trace_never_panics() {
    let mut rng = Rng::new(0x7ace);
    let dir = tempfile::tempdir().unwrap();
    let trace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/traces/qwen3_moe-3-tokens.parquet");
    assert!(moestream::formats::trace::read::read(&trace, None).is_ok());
    let seed = std::fs::read(&trace).unwrap();
    let mutant = dir.path().join("m.parquet");
    for _ in 0..ROUNDS {
        let m = mutate_bytes(&mut rng, &seed);
        std::fs::write(&mutant, &m).unwrap();
        check("routing_trace", &m, || {
            let _ = moestream::formats::trace::read::read(&mutant, None);
        });
    }
}
