//! GGUF files run as they are (tests/fixtures/gguf, made by
//! scripts/make_gguf_oracle.py with llama.cpp's own converter and
//! quantizer):
//! - an f32 GGUF of each family's fixture gives transformers' tokens and
//!   logits (the oracle.json of tests/fixtures/<family>);
//! - a quantized GGUF (Q8_0, Q4_0, Q4_K_M, Q5_K_M: Q4_K, Q5_K and Q6_K
//!   tensors among them) gives llama.cpp's greedy tokens, with logits close
//!   to llama.cpp's (the bound is argued at `QUANT_LOGITS_REL`);
//! - F16 and BF16 files give transformers' tokens, with logits close to
//!   llama.cpp's (bounds argued at `F16_LOGITS_REL`);
//! - the tokenizer built from the metadata tokenizes as llama.cpp does.

mod common;

use common::{f64s, fixture, ids, moestream, oracle_at, u32s};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Largest |ours − llama.cpp| over the last position's logits, relative to
/// the largest |logit|. Both engines quantize each activation row the same
/// way (Q8_0 blocks for Q4_0/Q8_0 weights, Q8_K for the K types) and sum
/// the same integer block dots exactly; what differs is only the order of
/// f32 sums (across blocks, in attention, norms, softmax and llama.cpp's own
/// exp), a few ulps per operation: measured 0.5e-7 to 1.7e-7 on these four
/// files. One activation rounded to the other int8 neighbour would move a
/// logit by about one weight step times one activation step, ~1e-3 of the
/// logit scale here; 1e-5 sits two orders of magnitude from both, so it
/// passes on summation order and fails on any real difference in the math.
const QUANT_LOGITS_REL: f64 = 1e-5;

fn gguf(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gguf")
        .join(name)
}

/// max |a − b| / max |b|.
fn rel_diff(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "logit counts differ");
    let max_abs = want.iter().fold(0f64, |m, x| m.max(x.abs()));
    let diff = got
        .iter()
        .zip(want)
        .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
    diff / max_abs
}

/// `run --json` greedy from `prompt` for `n` tokens.
fn greedy(model: &Path, prompt: &[u32], n: usize, extra: &[&str]) -> Vec<u32> {
    let (prompt, n) = (ids(prompt), n.to_string());
    let mut args = vec![
        "run",
        "--model",
        model.to_str().unwrap(),
        "--prompt-ids",
        &prompt,
    ];
    args.extend(["--max-tokens", &n, "--ignore-eos", "--json"]);
    args.extend(extra);
    let out = moestream(&args);
    assert!(out.ok, "{}: {}", model.display(), out.stderr);
    let v: Value = serde_json::from_str(&out.stdout).expect("one JSON object");
    u32s(&v["token_ids"])
}

fn check_f32_family(family: &str) {
    let o = oracle_at(&fixture(family));
    let model = gguf(&format!("{family}-f32.gguf"));
    let want = u32s(&o["greedy_ids"]);
    let got = greedy(&model, &u32s(&o["prompt_ids"]), want.len(), &[]);
    assert_eq!(
        got, want,
        "{family}: greedy tokens differ from transformers"
    );
    let evals = ids(&u32s(&o["eval_ids"]));
    let args = [
        "eval",
        "--model",
        model.to_str().unwrap(),
        "--prompt-ids",
        &evals,
        "--json",
    ];
    let out = moestream(&args);
    assert!(out.ok, "{family}: {}", out.stderr);
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(u32s(&v["argmax"]), u32s(&o["argmax"]), "{family}: argmax");
    let rel = rel_diff(&f64s(&v["last_logits"]), &f64s(&o["last_logits"]));
    assert!(rel <= 1e-4, "{family}: last logits rel diff {rel:.2e}");
}

macro_rules! f32_families {
    ($($name:ident => $family:literal),* $(,)?) => {$(
        #[test]
        fn $name() {
            check_f32_family($family);
        }
    )*};
}

f32_families! {
    f32_qwen2_moe_matches_transformers => "qwen2_moe",
    f32_olmoe_matches_transformers => "olmoe",
    f32_mixtral_matches_transformers => "mixtral",
    f32_deepseek_v3_matches_transformers => "deepseek_v3",
    f32_glm4_moe_matches_transformers => "glm4_moe",
}

fn llama_cpp_oracle(ty: &str) -> Value {
    let path = gguf(&format!("qwen3moe-{ty}.json"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn check_quantized(ty: &str, extra: &[&str]) {
    let o = llama_cpp_oracle(ty);
    let model = gguf(&format!("qwen3moe-{ty}.gguf"));
    let prompt = u32s(&o["prompt_ids"]);
    let want = u32s(&o["greedy_ids"]);
    let got = greedy(&model, &prompt, want.len(), extra);
    assert_eq!(got, want, "{ty}: greedy tokens differ from llama.cpp");
    let v = eval_at(&model, &prompt);
    let rel = rel_diff(&f64s(&v["last_logits"]), &f64s(&o["last_logits"]));
    assert!(
        rel <= QUANT_LOGITS_REL,
        "{ty}: last logits differ from llama.cpp's by {rel:.2e} (bound {QUANT_LOGITS_REL:.0e})"
    );
}

fn eval_at(model: &Path, prompt: &[u32]) -> Value {
    let p = ids(prompt);
    let out = moestream(&[
        "eval",
        "--model",
        model.to_str().unwrap(),
        "--prompt-ids",
        &p,
        "--json",
    ]);
    assert!(out.ok, "{}: {}", model.display(), out.stderr);
    serde_json::from_str(&out.stdout).unwrap()
}

#[test]
fn q8_0_matches_llama_cpp() {
    check_quantized("Q8_0", &[]);
}

#[test]
fn q4_0_matches_llama_cpp() {
    check_quantized("Q4_0", &[]);
}

#[test]
fn q4_k_m_matches_llama_cpp() {
    check_quantized("Q4_K_M", &[]);
}

#[test]
fn q5_k_m_matches_llama_cpp() {
    check_quantized("Q5_K_M", &[]);
}

/// F16 and BF16 files (llama.cpp's converter, `--outtype f16|bf16`, from
/// the Mixtral fixture): moestream widens each weight to f32 and multiplies
/// f32 activations. llama.cpp rounds each activation to the weight's type
/// before its dot: half an ulp is 2^-11 (4.9e-4) in f16 and 2^-8 (3.9e-3)
/// in bf16, relative, so the last logits can differ from llama.cpp's by
/// about that much (measured 7.7e-4 and 5.3e-3); the bounds sit a few times
/// above, and far below what a mis-read weight (O(1)) would give.
const F16_LOGITS_REL: f64 = 3e-3;
const BF16_LOGITS_REL: f64 = 2e-2;

fn check_float(ty: &str, bound: f64) -> (Vec<u32>, Value) {
    let o: Value = serde_json::from_str(
        &std::fs::read_to_string(gguf(&format!("mixtral-{ty}.json"))).unwrap(),
    )
    .unwrap();
    let model = gguf(&format!("mixtral-{ty}.gguf"));
    let prompt = u32s(&o["prompt_ids"]);
    let v = eval_at(&model, &prompt);
    let rel = rel_diff(&f64s(&v["last_logits"]), &f64s(&o["last_logits"]));
    assert!(
        rel <= bound,
        "{ty}: last logits differ from llama.cpp's by {rel:.2e} (bound {bound:.0e})"
    );
    let n = u32s(&o["greedy_ids"]).len();
    (greedy(&model, &prompt, n, &[]), o)
}

#[test]
fn f16_matches_llama_cpp_and_transformers() {
    let (got, o) = check_float("f16", F16_LOGITS_REL);
    assert_eq!(got, u32s(&o["greedy_ids"]), "f16: llama.cpp's tokens");
    assert_eq!(
        got,
        u32s(&o["transformers_greedy_ids"]),
        "f16: transformers' tokens"
    );
}

#[test]
fn bf16_matches_transformers_tokens_and_llama_cpp_logits() {
    // llama.cpp's bf16 activations flip a near-tie at token 7 of 20 on this
    // random model; f32 activations on the bf16 weights keep all 20 of
    // transformers' (f32) tokens.
    let (got, o) = check_float("bf16", BF16_LOGITS_REL);
    assert_eq!(
        got,
        u32s(&o["transformers_greedy_ids"]),
        "bf16: transformers' tokens"
    );
}

/// Experts streamed one at a time through every read mode: O_DIRECT reads
/// of unaligned expert slices are widened and sliced.
#[test]
fn streamed_experts_match_in_every_read_mode() {
    for mode in ["direct", "buffered", "mmap", "pread"] {
        check_quantized("Q4_K_M", &["--expert-cache", "1", "--read-mode", mode]);
    }
}

#[test]
fn tokenizer_from_metadata_tokenizes_as_llama_cpp() {
    for ty in ["Q8_0", "Q4_K_M"] {
        let o = llama_cpp_oracle(ty);
        let model = gguf(&format!("qwen3moe-{ty}.gguf"));
        let text = o["prompt_text"].as_str().unwrap();
        let out = moestream(&[
            "run",
            "--model",
            model.to_str().unwrap(),
            "--prompt",
            text,
            "--max-tokens",
            "1",
            "--json",
        ]);
        assert!(out.ok, "{}", out.stderr);
        let v: Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(u32s(&v["prompt_ids"]), u32s(&o["llama_cpp_prompt_ids"]));
        assert_eq!(
            u32s(&v["prompt_ids"]),
            u32s(&o["prompt_ids"]),
            "and as transformers"
        );
    }
}

#[test]
fn chat_template_from_metadata_renders_as_transformers() {
    let o = llama_cpp_oracle("Q4_K_M");
    let model = gguf("qwen3moe-Q4_K_M.gguf");
    let template = moestream::formats::chat::ChatTemplate::from_model_dir(&model)
        .unwrap()
        .expect("tokenizer.chat_template is in the file");
    let messages: Vec<moestream::formats::chat::Message> =
        serde_json::from_value(o["chat_messages"].clone()).unwrap();
    let got = template.render(&messages, true).unwrap();
    assert_eq!(got, o["chat_rendered"].as_str().unwrap());
}

/// A split set opens from its first file and gives the unsplit file's
/// (transformers') tokens.
#[test]
fn split_set_opens_from_its_first_file() {
    let o = oracle_at(&fixture("olmoe"));
    let want = u32s(&o["greedy_ids"]);
    let first = gguf("olmoe-split-00001-of-00003.gguf");
    let got = greedy(&first, &u32s(&o["prompt_ids"]), want.len(), &[]);
    assert_eq!(got, want);
    // The disk probes (plan, doctor, sweep) read the set's files.
    let files = moestream::inspect::disk::shard_files(&first).unwrap();
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        (1..=3)
            .map(|i| format!("olmoe-split-0000{i}-of-00003.gguf"))
            .collect::<Vec<_>>()
    );
}

/// A copy of fixture `name` in a temp dir, for breaking on purpose.
fn broken_copy(name: &str) -> (tempfile::TempDir, PathBuf, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    let bytes = std::fs::read(gguf(name)).unwrap();
    (dir, path, bytes)
}

/// Byte offset just past tensor `name`'s name in the header (where its
/// dimension count begins).
fn tensor_info_at(bytes: &[u8], name: &str) -> usize {
    let mut needle = (name.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(name.as_bytes());
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle.as_slice())
        .unwrap_or_else(|| panic!("{name} not in the header"));
    at + needle.len()
}

/// Offsets of (type, data offset) of tensor `name`'s header entry.
fn type_and_offset_at(bytes: &[u8], name: &str) -> (usize, usize) {
    let at = tensor_info_at(bytes, name);
    let dims = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let ty = at + 4 + 8 * dims;
    (ty, ty + 4)
}

fn run_broken(path: &Path) -> common::Out {
    moestream(&[
        "run",
        "--model",
        path.to_str().unwrap(),
        "--prompt-ids",
        "1,2,3",
        "--max-tokens",
        "2",
    ])
}

#[test]
fn bad_files_fail_cleanly_naming_the_file_and_what_is_wrong() {
    let name = "qwen3moe-Q4_0.gguf";
    let patch = |f: &dyn Fn(&mut Vec<u8>)| {
        let (dir, path, mut bytes) = broken_copy(name);
        f(&mut bytes);
        std::fs::write(&path, &bytes).unwrap();
        (dir, path)
    };
    type Patch = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: Vec<(Patch, Vec<&str>)> = vec![
        (
            Box::new(|b| b[..4].copy_from_slice(b"GGUX")),
            vec!["not a GGUF file"],
        ),
        (
            Box::new(|b| b[4..8].copy_from_slice(&[0, 0, 0, 3])),
            vec!["big-endian"],
        ),
        (
            Box::new(|b| b.truncate(b.len() / 2)),
            vec!["past the end of the file", "truncated"],
        ),
        (Box::new(|b| b.truncate(200)), vec!["truncated"]),
        (
            Box::new(|b| {
                let (ty, _) = type_and_offset_at(b, "blk.0.attn_q.weight");
                b[ty..ty + 4].copy_from_slice(&99u32.to_le_bytes());
            }),
            vec!["blk.0.attn_q.weight", "unknown ggml type id 99"],
        ),
        (
            Box::new(|b| {
                // MXFP4: a 32-value type (17 bytes, inside Q4_0's span).
                let (ty, _) = type_and_offset_at(b, "blk.0.attn_q.weight");
                b[ty..ty + 4].copy_from_slice(&39u32.to_le_bytes());
            }),
            vec!["self_attn.q_proj.weight", "MXFP4", "does not compute"],
        ),
        (
            Box::new(|b| {
                let (_, off) = type_and_offset_at(b, "blk.0.attn_q.weight");
                let (_, other) = type_and_offset_at(b, "blk.0.attn_k.weight");
                let lie: [u8; 8] = b[other..other + 8].try_into().unwrap();
                b[off..off + 8].copy_from_slice(&lie);
            }),
            vec!["overlap", "offsets lie"],
        ),
        (
            Box::new(|b| {
                let (_, off) = type_and_offset_at(b, "blk.0.attn_q.weight");
                b[off..off + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
            }),
            vec!["blk.0.attn_q.weight", "past the end of the file"],
        ),
    ];
    for (i, (f, needles)) in cases.iter().enumerate() {
        let (_dir, path) = patch(f.as_ref());
        let out = run_broken(&path);
        let mut all = needles.clone();
        all.push(name);
        assert!(!out.ok, "case {i}: broken file ran");
        assert!(!out.stderr.contains("panicked"), "case {i}: {}", out.stderr);
        for n in all {
            assert!(
                out.stderr.contains(n),
                "case {i}: stderr should name `{n}`: {}",
                out.stderr
            );
        }
    }
}

/// A Q5_0 or IQ4_XS GGUF (the Q8_0 fixture exported, every matrix of that
/// type) cut short inside its last tensor, an expert tensor, is refused by
/// `run` and by `convert`, naming the tensor and its size by the type's
/// block (values / 32 · 22 bytes, values / 256 · 136).
#[test]
fn a_truncated_q5_0_or_iq4_xs_tensor_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let q8 = gguf("qwen3moe-Q8_0.gguf");
    for (ty, id, elems, block_bytes) in [("q5_0", 6, 32, 22), ("iq4_xs", 23, 256, 136)] {
        let g = dir.path().join(format!("{ty}.gguf"));
        let args = ["export-gguf", "--model", q8.to_str().unwrap(), "--type", ty];
        let r = moestream(&[&args[..], &["--out", g.to_str().unwrap()]].concat());
        assert!(r.ok, "export {ty}: {}", r.stderr);
        let f = moestream::formats::gguf::file::GgufFile::open(&g).unwrap();
        let last = f.tensors.iter().max_by_key(|t| t.offset).unwrap();
        assert!(
            last.ty == id && last.name.contains("_exps"),
            "{ty}: {last:?}"
        );
        let bytes = std::fs::read(&g).unwrap();
        let cut = bytes.len() - 100;
        assert!(
            (last.offset as usize) < cut,
            "{ty}: cut inside {}",
            last.name
        );
        let short = dir.path().join(format!("{ty}-short.gguf"));
        std::fs::write(&short, &bytes[..cut]).unwrap();
        let values: u64 = last.dims.iter().product();
        let size = format!("its {} bytes", values / elems * block_bytes);
        let name = format!("`{}`", last.name);
        let needles = [name.as_str(), &size, "past the end of the file"];
        common::assert_clean_failure(&run_broken(&short), &needles);
        let out = dir.path().join(format!("{ty}-c"));
        let conv = ["convert", "--input", short.to_str().unwrap(), "--quiet"];
        let conv = moestream(&[&conv[..], &["--output", out.to_str().unwrap()]].concat());
        common::assert_clean_failure(&conv, &needles);
    }
}

/// `export-gguf` of a Q8_0 file back to Q8_0 re-encodes every block to the
/// same bytes (our Q8_0 encoder is ggml's), so the export runs as the
/// original: llama.cpp's tokens.
#[test]
fn export_round_trips_q8_0_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("rt.gguf");
    let src = gguf("qwen3moe-Q8_0.gguf");
    let args = [
        "export-gguf",
        "--model",
        src.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--type",
        "q8_0",
    ];
    let r = moestream(&args);
    assert!(r.ok, "{}", r.stderr);
    let (a, b) = (
        moestream::formats::gguf::file::GgufFile::open(&src).unwrap(),
        moestream::formats::gguf::file::GgufFile::open(&out).unwrap(),
    );
    let (abytes, bbytes) = (std::fs::read(&src).unwrap(), std::fs::read(&out).unwrap());
    assert_eq!(a.tensors.len(), b.tensors.len());
    for t in &a.tensors {
        let u = b
            .tensors
            .iter()
            .find(|u| u.name == t.name)
            .expect("same tensors");
        assert_eq!((t.ty, &t.dims), (u.ty, &u.dims), "{}", t.name);
        let span = |f: &[u8], x: &moestream::formats::gguf::file::TensorInfo| {
            f[x.offset as usize..(x.offset + x.bytes) as usize].to_vec()
        };
        assert!(
            span(&abytes, t) == span(&bbytes, u),
            "{}: data differs",
            t.name
        );
    }
    let o = llama_cpp_oracle("Q8_0");
    let want = u32s(&o["greedy_ids"]);
    assert_eq!(greedy(&out, &u32s(&o["prompt_ids"]), want.len(), &[]), want);
}

/// Version 2 has version 3's layout (both little-endian, 64-bit counts):
/// the same bytes labelled 2 run the same.
#[test]
fn version_2_files_run() {
    let (_dir, path, mut bytes) = broken_copy("qwen3moe-Q4_0.gguf");
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let o = llama_cpp_oracle("Q4_0");
    let want = u32s(&o["greedy_ids"]);
    assert_eq!(
        greedy(&path, &u32s(&o["prompt_ids"]), want.len(), &[]),
        want
    );
}

/// A copy of fixture `name` rewritten through `moestream::convert::gguf_write`
/// with its metadata edited by `edit` (tensors and their bytes kept).
fn rewritten(
    name: &str,
    edit: impl FnOnce(&mut Vec<(String, moestream::formats::gguf::file::Value)>),
) -> (tempfile::TempDir, PathBuf) {
    use moestream::convert::gguf_write::{write_gguf, TensorSpec};
    let src = gguf(name);
    let f = moestream::formats::gguf::file::GgufFile::open(&src).unwrap();
    let bytes = std::fs::read(&src).unwrap();
    let mut meta: Vec<_> = f.metadata.clone().into_iter().collect();
    meta.sort_by(|a, b| a.0.cmp(&b.0));
    edit(&mut meta);
    let specs: Vec<TensorSpec> = f
        .tensors
        .iter()
        .map(|t| TensorSpec {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ty: t.ty,
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    write_gguf(&path, &meta, &specs, |i, w| {
        let t = &f.tensors[i];
        let data = &bytes[t.offset as usize..(t.offset + t.bytes) as usize];
        w.write_all(data)
            .map_err(|e| moestream::error::Error::file("copy", e))
    })
    .unwrap();
    (dir, path)
}

fn set(
    meta: &mut [(String, moestream::formats::gguf::file::Value)],
    key: &str,
    v: moestream::formats::gguf::file::Value,
) {
    let slot = meta.iter_mut().find(|(k, _)| k == key);
    slot.unwrap_or_else(|| panic!("{key} not in the fixture")).1 = v;
}

#[test]
fn block_count_of_2_pow_40_is_refused_before_anything_is_sized_by_it() {
    use moestream::formats::gguf::file::Value;
    let (_dir, path) = rewritten("qwen3moe-Q4_0.gguf", |m| {
        set(m, "qwen3moe.block_count", Value::U64(1 << 40))
    });
    let started = std::time::Instant::now();
    let out = run_broken(&path);
    assert!(!out.ok, "a 2^40-block file ran");
    common::assert_clean_failure(&out, &["qwen3moe.block_count", "1099511627776"]);
    assert!(
        started.elapsed().as_secs() < 60,
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn non_finite_float_metadata_is_refused_naming_the_key() {
    use moestream::formats::gguf::file::Value;
    for (key, x) in [
        ("qwen3moe.rope.freq_base", f32::NAN),
        ("qwen3moe.attention.layer_norm_rms_epsilon", f32::INFINITY),
    ] {
        let (_dir, path) = rewritten("qwen3moe-Q4_0.gguf", |m| set(m, key, Value::F32(x)));
        let out = run_broken(&path);
        assert!(!out.ok, "{key} = {x} ran (it became the default)");
        common::assert_clean_failure(&out, &[key, "not a finite number"]);
    }
}

#[test]
fn an_absurd_vocabulary_token_is_refused_naming_its_index() {
    use moestream::formats::gguf::file::{Array, Value};
    let (_dir, path) = rewritten("qwen3moe-Q4_0.gguf", |m| {
        let tokens = m.iter_mut().find(|(k, _)| k == "tokenizer.ggml.tokens");
        let Some((_, Value::Array(Array::Str(t)))) = tokens else {
            panic!("no token list")
        };
        t[7] = "▁".repeat(1 << 20);
    });
    let started = std::time::Instant::now();
    let err = moestream::formats::tokenizer::Tokenizer::load(&path)
        .err()
        .expect("loaded");
    let text = err.to_string();
    assert!(
        text.contains("token 7") && text.contains("4096-byte limit"),
        "{text}"
    );
    assert!(
        started.elapsed().as_secs() < 20,
        "took {:?}",
        started.elapsed()
    );
}
