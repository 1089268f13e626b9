//! The tokenizer a GGUF file keeps in its metadata (`tokenizer.ggml.*`), as
//! a tokenizers-crate `tokenizer.json` document, so a `.gguf` model runs
//! without a tokenizer.json beside it.
//!
//! The target is what llama.cpp tokenizes with (its `src/llama-vocab.cpp`):
//!
//! - `gpt2`, byte-level BPE: the file's merges in rank order. The
//!   pre-tokenizer is llama.cpp's regex list for `tokenizer.ggml.pre`, one
//!   `Split` per regex applied in turn, keeping both the matches and the
//!   text between them (as llama.cpp's `unicode_regex_split` keeps them),
//!   then the GPT-2 byte map. Pre-tokenizers that llama.cpp runs with
//!   `ignore_merges` (a word that is a whole token is that token) set it on
//!   the BPE model too.
//! - `llama`, SentencePiece BPE: llama.cpp repeatedly joins the adjacent
//!   pair whose joined text is the highest-scoring token. A BPE whose merges
//!   are every split of every token into two tokens, ranked by the joined
//!   token's score, does the same (transformers' GGUF converter derives its
//!   merges this way); characters outside the vocabulary fall back to the
//!   `<0xNN>` byte tokens. Like llama.cpp, a space is put before every text
//!   fragment (the first, and each one after a special token) when
//!   `add_space_prefix` holds, and spaces become `▁`.
//!
//! Control and unknown tokens become special added tokens and user-defined
//! ones plain added tokens, so the text of any of them maps to its id
//! whole, before the model sees the rest.
//!
//! Invariants: every id is the token's index in `tokenizer.ggml.tokens`;
//! every merge names tokens of the vocabulary (others are dropped, with a
//! warning); bad metadata is an `Err` naming its key, never a panic.
//!
//! Not reproduced: llama.cpp's `clean_spaces` detokenizer pass (a
//! transformers-side text cleanup, not part of the tokenizer), per-model
//! token attributes it hard-codes by model name (lstrip/rstrip), its
//! promotion of special-looking token texts to control tokens, and
//! `add_sep`.

use serde_json::{json, Map, Value};
use std::collections::{HashMap, HashSet};

/// The tokenizer keys of a GGUF file's metadata.
#[derive(Clone, Copy, Debug)]
pub struct GgufVocab<'a> {
    /// `tokenizer.ggml.model`: "gpt2" (byte-level BPE) or "llama"
    /// (SentencePiece).
    pub model: &'a str,
    /// `tokenizer.ggml.pre`: "qwen2", "deepseek-v3", "gpt-2", "olmo",
    /// "llama-bpe", "glm4", "default", ...
    pub pre: Option<&'a str>,
    /// `tokenizer.ggml.tokens`, indexed by id.
    pub tokens: &'a [String],
    /// `tokenizer.ggml.token_type`: 1 normal, 2 unknown, 3 control,
    /// 4 user-defined, 5 unused, 6 byte.
    pub token_types: Option<&'a [i32]>,
    /// `tokenizer.ggml.scores`.
    pub scores: Option<&'a [f32]>,
    /// `tokenizer.ggml.merges`: "a b" pairs, highest priority first.
    pub merges: Option<&'a [String]>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`.
    pub add_space_prefix: Option<bool>,
}

/// A tokenizer.json document (serde_json::Value) equivalent to what
/// llama.cpp tokenizes with. The error names the offending key.
pub fn tokenizer_json(v: &GgufVocab) -> Result<Value, String> {
    check_lengths(v)?;
    let texts = token_texts(v.tokens);
    let ids = token_ids(&texts)?;
    match v.model {
        "gpt2" => gpt2_json(v, &texts, &ids),
        "llama" => llama_json(v, &texts, &ids),
        other => Err(format!(
            "tokenizer.ggml.model `{other}` is not supported; known: gpt2, llama"
        )),
    }
}

/// What `tokenizer.ggml.token_type` says of one token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl Kind {
    /// llama.cpp's `LLAMA_TOKEN_TYPE_*` numbering; anything else (0,
    /// "undefined") is treated as normal text.
    fn of(token_type: i32) -> Kind {
        match token_type {
            2 => Kind::Unknown,
            3 => Kind::Control,
            4 => Kind::UserDefined,
            5 => Kind::Unused,
            6 => Kind::Byte,
            _ => Kind::Normal,
        }
    }

    /// Whether a SentencePiece merge may produce this token.
    fn mergeable(self) -> bool {
        matches!(self, Kind::Normal | Kind::UserDefined | Kind::Unused)
    }
}

/// The longest token text a vocabulary may hold: real tokens are tens of
/// bytes (SentencePiece caps its pieces at 16 characters by default), a
/// longer one is a broken or hostile file.
pub const TOKEN_BYTES_MAX: usize = 4096;

/// The token count is nonzero and fits an id; no token is over
/// [`TOKEN_BYTES_MAX`]; the per-token arrays have
/// one entry per token.
fn check_lengths(v: &GgufVocab) -> Result<(), String> {
    let n = v.tokens.len();
    if n == 0 {
        return Err("tokenizer.ggml.tokens is empty".into());
    }
    if u32::try_from(n).is_err() {
        return Err(format!(
            "tokenizer.ggml.tokens has {n} tokens, more than a u32 id can name"
        ));
    }
    if let Some((id, t)) = v
        .tokens
        .iter()
        .enumerate()
        .find(|(_, t)| t.len() > TOKEN_BYTES_MAX)
    {
        return Err(format!(
            "tokenizer.ggml.tokens: token {id} is {} bytes long, over the {TOKEN_BYTES_MAX}-byte limit (no real vocabulary has such a token)",
            t.len()
        ));
    }
    let per_token = [
        ("tokenizer.ggml.token_type", v.token_types.map(<[i32]>::len)),
        ("tokenizer.ggml.scores", v.scores.map(<[f32]>::len)),
    ];
    for (key, len) in per_token {
        match len {
            Some(len) if len != n => {
                return Err(format!(
                    "{key} has {len} entries for the {n} tokens of tokenizer.ggml.tokens"
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

/// The token texts, an empty one renamed `[EMPTY_<id>]` as llama.cpp
/// renames it (a vocabulary key must be unique and nonempty).
fn token_texts(tokens: &[String]) -> Vec<String> {
    let named = |(id, t): (usize, &String)| {
        if t.is_empty() {
            format!("[EMPTY_{id}]")
        } else {
            t.clone()
        }
    };
    tokens.iter().enumerate().map(named).collect()
}

/// Text → id; a text listed twice is an error, as in llama.cpp.
fn token_ids(texts: &[String]) -> Result<HashMap<&str, u32>, String> {
    let mut ids = HashMap::with_capacity(texts.len());
    for (id, text) in (0u32..).zip(texts) {
        if let Some(first) = ids.insert(text.as_str(), id) {
            return Err(format!(
                "tokenizer.ggml.tokens lists `{text}` twice, at ids {first} and {id}"
            ));
        }
    }
    Ok(ids)
}

/// The ids and flags a model type assumes when the file does not say.
struct Defaults {
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    add_bos: bool,
}

/// The special ids in force, each checked against the vocabulary.
struct Specials {
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    add_eos: bool,
}

/// The file's special ids and flags over `d`, as llama.cpp resolves them: a
/// default id outside the vocabulary is dropped; a given one is an error.
fn specials(v: &GgufVocab, d: &Defaults) -> Result<Specials, String> {
    let n = v.tokens.len();
    let s = Specials {
        bos: special_id("tokenizer.ggml.bos_token_id", v.bos, d.bos, n)?,
        eos: special_id("tokenizer.ggml.eos_token_id", v.eos, d.eos, n)?,
        unk: special_id("tokenizer.ggml.unknown_token_id", v.unk, d.unk, n)?,
        pad: special_id("tokenizer.ggml.padding_token_id", v.pad, None, n)?,
        add_bos: v.add_bos.unwrap_or(d.add_bos),
        add_eos: v.add_eos.unwrap_or(false),
    };
    let missing = |what: &str| {
        format!(
            "tokenizer.ggml.add_{what}_token is true (given, or this tokenizer's default), \
             but tokenizer.ggml.{what}_token_id is not set"
        )
    };
    if s.add_bos && s.bos.is_none() {
        return Err(missing("bos"));
    }
    if s.add_eos && s.eos.is_none() {
        return Err(missing("eos"));
    }
    Ok(s)
}

fn special_id(
    key: &str,
    given: Option<u32>,
    default: Option<u32>,
    n: usize,
) -> Result<Option<u32>, String> {
    let in_range = |id: u32| (id as usize) < n;
    match given {
        Some(id) if in_range(id) => Ok(Some(id)),
        Some(id) => Err(format!(
            "{key} {id} is outside the {n} tokens of the vocabulary"
        )),
        None => Ok(default.filter(|&id| in_range(id))),
    }
}

/// Each token's kind: `tokenizer.ggml.token_type` when present, else the
/// special ids of `s` are control (the unknown one unknown), and for
/// SentencePiece `<0xNN>` texts are bytes.
fn kinds(v: &GgufVocab, texts: &[String], s: &Specials) -> Vec<Kind> {
    if let Some(types) = v.token_types {
        return types.iter().map(|&t| Kind::of(t)).collect();
    }
    let control = [s.bos, s.eos, s.pad];
    let kind = |(id, text): (u32, &String)| {
        if s.unk == Some(id) {
            Kind::Unknown
        } else if control.contains(&Some(id)) {
            Kind::Control
        } else if v.model == "llama" && is_byte_token(text) {
            Kind::Byte
        } else {
            Kind::Normal
        }
    };
    (0u32..).zip(texts).map(kind).collect()
}

/// `<0xNN>`, SentencePiece's spelling of a raw byte.
fn is_byte_token(text: &str) -> bool {
    let hex = text.strip_prefix("<0x").and_then(|t| t.strip_suffix('>'));
    hex.is_some_and(|h| h.len() == 2 && u8::from_str_radix(h, 16).is_ok())
}

/// The byte-level BPE of a `gpt2` vocabulary.
fn gpt2_json(v: &GgufVocab, texts: &[String], ids: &HashMap<&str, u32>) -> Result<Value, String> {
    let pre = pre_tokenizer_of(v.pre)?;
    let merges = v
        .merges
        .ok_or("tokenizer.ggml.merges missing for a gpt2 tokenizer")?;
    // llama.cpp's BPE defaults: BOS = EOS = 11, cleared for glm4.
    let defaults = Defaults {
        bos: (!pre.no_default_bos).then_some(11),
        eos: Some(11),
        unk: None,
        add_bos: pre.add_bos,
    };
    let specials = specials(v, &defaults)?;
    // Only the ids the file names mark tokens special: the default 11 is
    // an ordinary token of most vocabularies.
    let named = Specials {
        bos: v.bos,
        eos: v.eos,
        ..specials
    };
    let kinds = kinds(v, texts, &named);
    let model = json!({
        "type": "BPE",
        "dropout": null,
        "unk_token": null,
        "continuing_subword_prefix": null,
        "end_of_word_suffix": null,
        "fuse_unk": false,
        "byte_fallback": false,
        "ignore_merges": pre.ignore_merges,
        "vocab": vocab_object(texts),
        "merges": gpt2_merges(merges, ids),
    });
    let stages = Stages {
        normalizer: Value::Null,
        pre_tokenizer: byte_level_pre_tokenizer(pre),
        decoder: json!({
            "type": "ByteLevel",
            "add_prefix_space": true,
            "trim_offsets": true,
            "use_regex": true,
        }),
        model,
    };
    Ok(document(stages, texts, &kinds, &specials))
}

/// The file's merges in rank order as `[a, b]` pairs, split at the first
/// space after the first character as llama.cpp splits them. A pair whose
/// halves or join are not tokens cannot be a BPE merge and is dropped
/// (llama.cpp keeps it, and it can never fire to a token there either); a
/// repeat keeps its first rank.
fn gpt2_merges(merges: &[String], ids: &HashMap<&str, u32>) -> Vec<Value> {
    let mut seen = HashSet::with_capacity(merges.len());
    let mut pairs = Vec::with_capacity(merges.len());
    let mut dropped = 0usize;
    for merge in merges {
        let pair = split_merge(merge).filter(|(a, b)| {
            ids.contains_key(a)
                && ids.contains_key(b)
                && ids.contains_key(format!("{a}{b}").as_str())
        });
        match pair {
            Some(pair) if seen.insert(pair) => pairs.push(json!([pair.0, pair.1])),
            Some(_) => {}
            None => dropped += 1,
        }
    }
    if dropped > 0 {
        tracing::warn!(
            dropped,
            "tokenizer.ggml.merges: pairs that do not join two tokens into a token were dropped"
        );
    }
    pairs
}

fn split_merge(merge: &str) -> Option<(&str, &str)> {
    let first = merge.chars().next()?.len_utf8();
    let at = first + merge[first..].find(' ')?;
    Some((&merge[..at], &merge[at + 1..]))
}

/// The SentencePiece vocabulary of a `llama` model, as a BPE with byte
/// fallback.
fn llama_json(v: &GgufVocab, texts: &[String], ids: &HashMap<&str, u32>) -> Result<Value, String> {
    let scores = v
        .scores
        .ok_or("tokenizer.ggml.scores missing for a llama tokenizer")?;
    let defaults = Defaults {
        bos: Some(1),
        eos: Some(2),
        unk: Some(0),
        add_bos: true,
    };
    let specials = specials(v, &defaults)?;
    let kinds = kinds(v, texts, &specials);
    let model = json!({
        "type": "BPE",
        "dropout": null,
        "unk_token": specials.unk.map(|id| texts[id as usize].as_str()),
        "continuing_subword_prefix": null,
        "end_of_word_suffix": null,
        "fuse_unk": true,
        "byte_fallback": true,
        "ignore_merges": false,
        "vocab": vocab_object(texts),
        "merges": spm_merges(texts, scores, &kinds, ids)?,
    });
    let space_prefix = v.add_space_prefix.unwrap_or(true);
    let stages = Stages {
        normalizer: spm_normalizer(space_prefix),
        pre_tokenizer: Value::Null,
        decoder: spm_decoder(space_prefix),
        model,
    };
    Ok(document(stages, texts, &kinds, &specials))
}

/// Every split of every mergeable token into two tokens, ranked by the
/// token's score (highest first), ties by token id then split point. A BPE
/// over these picks, at each step, the adjacent pair that joins into the
/// highest-scoring token: llama.cpp's SentencePiece loop.
///
/// Linear in the vocabulary's bytes plus the merges written: each token's
/// prefixes and suffixes are looked up by rolling hash ([`SplitHashes`]),
/// and only a split whose halves both hash to tokens is checked for real.
/// The merges' text is bounded ([`MERGE_BYTES_PER_TOKEN_BYTE`]): a
/// vocabulary of every prefix of a long run would otherwise ask for its
/// cube.
fn spm_merges(
    texts: &[String],
    scores: &[f32],
    kinds: &[Kind],
    ids: &HashMap<&str, u32>,
) -> Result<Vec<Value>, String> {
    let hashes = SplitHashes::new(texts);
    let token_bytes: usize = texts.iter().map(String::len).sum();
    let bytes_max = MERGE_BYTES_BASE.saturating_add(token_bytes * MERGE_BYTES_PER_TOKEN_BYTE);
    let mut splits: Vec<(f32, usize, usize)> = Vec::new(); // (score, id, split byte)
    let mut bytes = 0usize;
    let mut prefix = Vec::new();
    for (id, text) in texts.iter().enumerate() {
        if !kinds[id].mergeable() {
            continue;
        }
        hashes.prefixes(text, &mut prefix);
        for (at, _) in text.char_indices().skip(1) {
            if !hashes.known(prefix[at]) || !hashes.known(hashes.suffix(&prefix, at)) {
                continue;
            }
            if ids.contains_key(&text[..at]) && ids.contains_key(&text[at..]) {
                splits.push((scores[id], id, at));
                bytes += text.len();
            }
        }
        if bytes > bytes_max {
            return Err(format!(
                "tokenizer.ggml.tokens: the SentencePiece merges of the vocabulary pass {bytes_max} bytes at token {id} (every split of a token into two tokens is a merge)"
            ));
        }
    }
    splits.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let pair = |&(_, id, at): &(f32, usize, usize)| {
        let text = &texts[id];
        json!([&text[..at], &text[at..]])
    };
    Ok(splits.iter().map(pair).collect())
}

/// Merge text allowed whatever the vocabulary (real ones stay far below).
const MERGE_BYTES_BASE: usize = 64 << 20;
/// Merge text allowed per byte of token text: a real SentencePiece token
/// (16 characters at most by default) splits into tokens a few ways.
const MERGE_BYTES_PER_TOKEN_BYTE: usize = 64;

/// Polynomial hashes modulo the Mersenne prime 2^61 − 1 with a random base
/// (so no vocabulary can be built to collide): every token's hash in a
/// set, and every prefix and suffix of a token from one pass over it.
struct SplitHashes {
    base: u64,
    /// base^i for i up to the longest token.
    powers: Vec<u64>,
    tokens: HashSet<u64>,
}

const HASH_PRIME: u64 = (1 << 61) - 1;

fn mul_mod(a: u64, b: u64) -> u64 {
    let r = a as u128 * b as u128;
    let folded = (r & HASH_PRIME as u128) as u64 + (r >> 61) as u64;
    folded % HASH_PRIME
}

impl SplitHashes {
    fn new(texts: &[String]) -> SplitHashes {
        use std::hash::BuildHasher;
        let seed = std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64);
        let base = seed % (HASH_PRIME - 256) + 256;
        let longest = texts.iter().map(String::len).max().unwrap_or(0);
        let mut powers = Vec::with_capacity(longest + 1);
        powers.push(1u64);
        for i in 0..longest {
            powers.push(mul_mod(powers[i], base));
        }
        let mut h = SplitHashes {
            base,
            powers,
            tokens: HashSet::with_capacity(texts.len()),
        };
        let mut prefix = Vec::new();
        for t in texts {
            h.prefixes(t, &mut prefix);
            h.tokens.insert(prefix[t.len()]);
        }
        h
    }

    /// `prefix[i]` = the hash of `text[..i]`, for i in 0..=len.
    fn prefixes(&self, text: &str, prefix: &mut Vec<u64>) {
        prefix.clear();
        prefix.push(0);
        for &b in text.as_bytes() {
            let last = *prefix.last().expect("starts with one");
            prefix.push((mul_mod(last, self.base) + u64::from(b) + 1) % HASH_PRIME);
        }
    }

    /// The hash of `text[at..]` from its prefix hashes.
    fn suffix(&self, prefix: &[u64], at: usize) -> u64 {
        let n = prefix.len() - 1;
        let head = mul_mod(prefix[at], self.powers[n - at]);
        (prefix[n] + HASH_PRIME - head) % HASH_PRIME
    }

    fn known(&self, hash: u64) -> bool {
        self.tokens.contains(&hash)
    }
}

/// llama.cpp's SentencePiece input: `▁` before each fragment (when
/// `space_prefix`), every space a `▁`. A normalizer runs per fragment
/// between added tokens, as llama.cpp's prefix does.
fn spm_normalizer(space_prefix: bool) -> Value {
    let mut steps = Vec::new();
    if space_prefix {
        steps.push(json!({"type": "Prepend", "prepend": "▁"}));
    }
    steps.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"}));
    json!({"type": "Sequence", "normalizers": steps})
}

/// `▁` back to spaces, `<0xNN>` runs back to UTF-8, and the prefix space
/// dropped again.
fn spm_decoder(space_prefix: bool) -> Value {
    let mut steps = vec![
        json!({"type": "Replace", "pattern": {"String": "▁"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if space_prefix {
        steps.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    json!({"type": "Sequence", "decoders": steps})
}

/// The token → id object of a model.
fn vocab_object(texts: &[String]) -> Value {
    let entries = (0u32..).zip(texts).map(|(id, t)| (t.clone(), json!(id)));
    Value::Object(entries.collect::<Map<_, _>>())
}

/// The stages a model type chooses.
struct Stages {
    normalizer: Value,
    pre_tokenizer: Value,
    decoder: Value,
    model: Value,
}

/// The whole tokenizer.json.
fn document(stages: Stages, texts: &[String], kinds: &[Kind], specials: &Specials) -> Value {
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added_tokens(texts, kinds),
        "normalizer": stages.normalizer,
        "pre_tokenizer": stages.pre_tokenizer,
        "post_processor": post_processor(texts, specials),
        "decoder": stages.decoder,
        "model": stages.model,
    })
}

/// Control and unknown tokens (special) and user-defined ones (not), each
/// matched whole in the raw text, as llama.cpp's special-token partition
/// matches them.
fn added_tokens(texts: &[String], kinds: &[Kind]) -> Vec<Value> {
    let added = |(id, (text, kind)): (u32, (&String, &Kind))| {
        let special = match kind {
            Kind::Control | Kind::Unknown => true,
            Kind::UserDefined => false,
            _ => return None,
        };
        Some(json!({
            "id": id,
            "content": text,
            "single_word": false,
            "lstrip": false,
            "rstrip": false,
            "normalized": false,
            "special": special,
        }))
    };
    (0u32..)
        .zip(texts.iter().zip(kinds))
        .filter_map(added)
        .collect()
}

/// BOS before and EOS after each sequence, for those the flags ask for;
/// null when neither.
fn post_processor(texts: &[String], s: &Specials) -> Value {
    let bos = s.bos.filter(|_| s.add_bos);
    let eos = s.eos.filter(|_| s.add_eos);
    if bos.is_none() && eos.is_none() {
        return Value::Null;
    }
    let text = |id: u32| texts[id as usize].as_str();
    let template = |seq: &str, type_id: u32| -> Vec<Value> {
        let special = |id: u32| json!({"SpecialToken": {"id": text(id), "type_id": type_id}});
        let body = json!({"Sequence": {"id": seq, "type_id": type_id}});
        bos.map(special)
            .into_iter()
            .chain([body])
            .chain(eos.map(special))
            .collect()
    };
    let mut special_tokens = Map::new();
    for id in bos.into_iter().chain(eos) {
        special_tokens.insert(
            text(id).to_string(),
            json!({"id": text(id), "ids": [id], "tokens": [text(id)]}),
        );
    }
    let mut pair = template("A", 0);
    pair.extend(template("B", 1));
    json!({
        "type": "TemplateProcessing",
        "single": template("A", 0),
        "pair": pair,
        "special_tokens": special_tokens,
    })
}

/// llama.cpp's pre-tokenizer regexes, then the GPT-2 byte map.
fn byte_level_pre_tokenizer(pre: &PreTokenizer) -> Value {
    let split = |regex: &&str| {
        json!({
            "type": "Split",
            "pattern": {"Regex": regex},
            "behavior": "Isolated",
            "invert": false,
        })
    };
    let mut steps: Vec<Value> = pre.regexes.iter().map(split).collect();
    steps.push(json!({
        "type": "ByteLevel",
        "add_prefix_space": false,
        "trim_offsets": true,
        "use_regex": false,
    }));
    json!({"type": "Sequence", "pretokenizers": steps})
}

/// One of llama.cpp's BPE pre-tokenizer types: the `tokenizer.ggml.pre`
/// names that select it, its regexes (applied in turn) and its flags.
struct PreTokenizer {
    names: &'static [&'static str],
    regexes: &'static [&'static str],
    /// A word that is a whole token is that token, merges or not.
    ignore_merges: bool,
    /// `add_bos_token` when the file does not say.
    add_bos: bool,
    /// No default BOS id (glm4).
    no_default_bos: bool,
}

/// The pre-tokenizer `pre` names; none is llama.cpp's "default".
fn pre_tokenizer_of(pre: Option<&str>) -> Result<&'static PreTokenizer, String> {
    let name = pre.unwrap_or("default");
    if let Some(found) = PRE_TOKENIZERS.iter().find(|p| p.names.contains(&name)) {
        return Ok(found);
    }
    let known: Vec<&str> = PRE_TOKENIZERS
        .iter()
        .flat_map(|p| p.names)
        .copied()
        .collect();
    Err(format!(
        "tokenizer.ggml.pre `{name}` is not supported; known: {}",
        known.join(", ")
    ))
}

/// GPT-2's pre-tokenizer regex (llama.cpp's form, without the final `\s+`:
/// text no alternative matches stays a piece of its own, the same split).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Llama 3 (and GLM-4): contractions, letters with one leading non-letter,
/// digits in threes, punctuation runs with their line ends.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2: as Llama 3 with single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen3.5: as Qwen2 with combining marks kept on their letters.
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// CJK ideographs (U+4E00..U+9FA5), hiragana and katakana.
const CJK_KANA: &str = r"[\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+";

/// DeepSeek-V3's main regex.
const DEEPSEEK3: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;

/// GPT-4o (tiktoken o200k): case-aware words with trailing contractions.
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Mistral's Tekken: GPT-4o's word shapes without contractions, single
/// digits.
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Ling (bailingmoe).
const BAILINGMOE: &str = r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";

/// Seed-Coder.
const SEED_CODER: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";

const fn pre(names: &'static [&'static str], regexes: &'static [&'static str]) -> PreTokenizer {
    PreTokenizer {
        names,
        regexes,
        ignore_merges: false,
        add_bos: false,
        no_default_bos: false,
    }
}

/// llama.cpp's BPE pre-tokenizer types, by `tokenizer.ggml.pre`.
static PRE_TOKENIZERS: &[PreTokenizer] = &[
    pre(
        &["default"],
        &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
    ),
    pre(
        &[
            "gpt-2",
            "phi-2",
            "gigachat",
            "a.x-4.0",
            "mellum",
            "exaone4",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "granite-docling",
        ],
        &[GPT2],
    ),
    PreTokenizer {
        ignore_merges: true,
        add_bos: true,
        ..pre(
            &[
                "llama3",
                "llama-v3",
                "llama-bpe",
                "falcon3",
                "falcon-h1",
                "pixtral",
                "midm-2.0",
                "lfm2",
            ],
            &[LLAMA3],
        )
    },
    pre(&["dbrx", "smaug-bpe"], &[LLAMA3]),
    PreTokenizer {
        no_default_bos: true,
        ..pre(&["glm4", "chatglm-bpe"], &[LLAMA3])
    },
    pre(
        &[
            "qwen2",
            "deepseek-r1-qwen",
            "kormo",
            "megrez",
            "stablelm2",
            "hunyuan",
            "solar-open",
            "grok-2",
        ],
        &[QWEN2],
    ),
    pre(&["qwen35"], &[QWEN35]),
    pre(
        &["deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"],
        &[r"\p{N}{1,3}", CJK_KANA, DEEPSEEK3],
    ),
    pre(
        &["deepseek-coder"],
        &[
            r"[\r\n]",
            r"\s?\p{L}+",
            r"\s?\p{P}+",
            r"[\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+",
            r"\p{N}",
        ],
    ),
    pre(
        &["falcon"],
        &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
    ),
    pre(
        &[
            "starcoder",
            "refact",
            "command-r",
            "smollm",
            "codeshell",
            "exaone",
            "minerva-7b",
            "mellum2",
        ],
        &[r"\p{N}", GPT2],
    ),
    pre(
        &["poro-chat", "bloom", "gpt3-finnish"],
        &[r" ?[^(\s|.,!?…。，、।۔،)]+"],
    ),
    pre(&["gpt-4o", "llama4", "kanana2"], &[GPT4O]),
    PreTokenizer {
        ignore_merges: true,
        add_bos: true,
        ..pre(&["tekken"], &[TEKKEN])
    },
    pre(&["bailingmoe", "bailingmoe2", "llada-moe"], &[BAILINGMOE]),
    pre(&["seed-coder"], &[SEED_CODER]),
];

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer, Tokenizer};

    fn build(v: &GgufVocab) -> Tokenizer {
        let doc = tokenizer_json(v).unwrap_or_else(|e| panic!("tokenizer_json: {e}"));
        Tokenizer::from_str(&doc.to_string()).unwrap_or_else(|e| panic!("tokenizers: {e}"))
    }

    fn ids(tok: &Tokenizer, text: &str, add_special: bool) -> Vec<u32> {
        tok.encode(text, add_special).unwrap().get_ids().to_vec()
    }

    /// The byte-level BPE our scripts trained, as GGUF arrays.
    struct Fixture {
        original: Tokenizer,
        tokens: Vec<String>,
        types: Vec<i32>,
        merges: Vec<String>,
    }

    fn fixture() -> Fixture {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/qwen3_moe/tokenizer.json"
        );
        let text = std::fs::read_to_string(path).unwrap();
        let doc: Value = serde_json::from_str(&text).unwrap();
        let mut by_id = std::collections::BTreeMap::new();
        for (token, id) in doc["model"]["vocab"].as_object().unwrap() {
            by_id.insert(id.as_u64().unwrap(), (token.clone(), 1));
        }
        for added in doc["added_tokens"].as_array().unwrap() {
            let kind = if added["special"].as_bool().unwrap() {
                3
            } else {
                4
            };
            let content = added["content"].as_str().unwrap().to_string();
            by_id.insert(added["id"].as_u64().unwrap(), (content, kind));
        }
        assert!(
            by_id.keys().copied().eq(0..by_id.len() as u64),
            "ids not contiguous"
        );
        let merge = |m: &Value| match m {
            Value::Array(pair) => format!(
                "{} {}",
                pair[0].as_str().unwrap(),
                pair[1].as_str().unwrap()
            ),
            other => other.as_str().unwrap().to_string(),
        };
        Fixture {
            original: Tokenizer::from_str(&text).unwrap(),
            tokens: by_id.values().map(|(t, _)| t.clone()).collect(),
            types: by_id.values().map(|&(_, k)| k).collect(),
            merges: doc["model"]["merges"]
                .as_array()
                .unwrap()
                .iter()
                .map(merge)
                .collect(),
        }
    }

    fn gpt2<'a>(f: &'a Fixture, pre: &'a str) -> GgufVocab<'a> {
        GgufVocab {
            model: "gpt2",
            pre: Some(pre),
            tokens: &f.tokens,
            token_types: Some(&f.types),
            scores: None,
            merges: Some(&f.merges),
            bos: None,
            eos: None,
            unk: None,
            pad: None,
            add_bos: None,
            add_eos: None,
            add_space_prefix: None,
        }
    }

    const TEXTS: &[&str] = &[
        "Hello, world!",
        "  leading and trailing spaces  ",
        "line one\nline two\n\n\ttabbed\r\n",
        "numbers 12345 and 3.14159, year 2025",
        "unicode: héllo wörld — 你好，世界 🎉 Ελληνικά",
        "it's they're we've I'm you'll he'd IT'S",
        "fn main() { println!(\"{}\", x + 1); }",
        "",
    ];

    #[test]
    fn gpt2_round_trip_matches_the_original_tokenizer() {
        let f = fixture();
        let tok = build(&gpt2(&f, "gpt-2"));
        let mut texts = TEXTS.to_vec();
        texts.extend([
            "<|endoftext|>",
            "a<|endoftext|>b",
            "end.<|endoftext|>\nnext",
        ]);
        for text in texts {
            for add_special in [false, true] {
                let want = ids(&f.original, text, add_special);
                assert_eq!(ids(&tok, text, add_special), want, "{text:?}");
            }
            let got = ids(&tok, text, false);
            let decoded = tok.decode(&got, false).unwrap();
            assert_eq!(decoded, f.original.decode(&got, false).unwrap(), "{text:?}");
            assert_eq!(decoded, text, "decode round trip");
        }
        let eot = f.tokens.iter().position(|t| t == "<|endoftext|>").unwrap() as u32;
        assert_eq!(ids(&tok, "<|endoftext|>", false), [eot]);
        assert_eq!(tok.decode(&[eot], true).unwrap(), "");
    }

    #[test]
    fn gpt2_adds_bos_and_eos_when_asked() {
        let f = fixture();
        let eot = f.tokens.len() as u32 - 1;
        let v = GgufVocab {
            bos: Some(eot),
            eos: Some(eot),
            add_bos: Some(true),
            ..gpt2(&f, "qwen2")
        };
        let tok = build(&v);
        let raw = ids(&tok, "hi there", false);
        assert_eq!(ids(&tok, "hi there", true), [&[eot][..], &raw].concat());
        let tok = build(&GgufVocab {
            add_eos: Some(true),
            ..v
        });
        assert_eq!(
            ids(&tok, "hi there", true),
            [&[eot][..], &raw, &[eot]].concat()
        );
        // llama-bpe adds BOS unless the file says otherwise.
        let tok = build(
            &GgufVocab {
                add_bos: None,
                ..gpt2(&f, "llama-bpe")
            }
            .with_bos(eot),
        );
        assert_eq!(ids(&tok, "x", true)[0], eot);
    }

    impl<'a> GgufVocab<'a> {
        fn with_bos(self, bos: u32) -> GgufVocab<'a> {
            GgufVocab {
                bos: Some(bos),
                ..self
            }
        }
    }

    fn splits(tok: &Tokenizer, text: &str) -> Vec<String> {
        let mut pre = PreTokenizedString::from(text);
        tok.get_pre_tokenizer()
            .unwrap()
            .pre_tokenize(&mut pre)
            .unwrap();
        let splits = pre.get_splits(OffsetReferential::Original, OffsetType::Byte);
        splits.into_iter().map(|(s, _, _)| s.to_string()).collect()
    }

    #[test]
    fn pre_tokenizers_split_as_llama_cpp() {
        let f = fixture();
        let text = "Hello world 123!\n\n  x";
        let cases: &[(&str, &str, &[&str])] = &[
            (
                "gpt-2",
                text,
                &["Hello", "Ġworld", "Ġ123", "!", "ĊĊĠ", "Ġx"],
            ),
            ("olmo", text, &["Hello", "Ġworld", "Ġ123", "!", "ĊĊĠ", "Ġx"]),
            (
                "qwen2",
                text,
                &["Hello", "Ġworld", "Ġ", "1", "2", "3", "!ĊĊ", "Ġ", "Ġx"],
            ),
            (
                "llama-bpe",
                text,
                &["Hello", "Ġworld", "Ġ", "123", "!ĊĊ", "Ġ", "Ġx"],
            ),
            ("glm4", "I'm 12345", &["I", "'m", "Ġ", "123", "45"]),
            ("deepseek-v3", "ab 12345", &["ab", "Ġ", "123", "45"]),
            (
                "default",
                "Hello, world 12345",
                &["Hello", ",", "Ġworld", "Ġ", "123", "45"],
            ),
        ];
        for &(pre, text, want) in cases {
            let tok = build(&gpt2(&f, pre));
            assert_eq!(splits(&tok, text), want, "{pre}");
        }
    }

    #[test]
    fn every_pre_tokenizer_compiles_and_round_trips() {
        let f = fixture();
        for pre in PRE_TOKENIZERS {
            let tok = build(&gpt2(&f, pre.names[0]));
            for text in TEXTS {
                let got = ids(&tok, text, false);
                assert_eq!(tok.decode(&got, false).unwrap(), *text, "{}", pre.names[0]);
            }
        }
    }

    #[test]
    fn gpt2_drops_merges_outside_the_vocabulary() {
        let f = fixture();
        let mut merges = vec!["".to_string(), "nospace".into(), "é zz".into(), " x".into()];
        merges.extend(f.merges.iter().cloned());
        let v = GgufVocab {
            merges: Some(&merges),
            ..gpt2(&f, "gpt-2")
        };
        let tok = build(&v);
        assert_eq!(
            ids(&tok, TEXTS[0], false),
            ids(&f.original, TEXTS[0], false)
        );
    }

    /// A tiny SentencePiece vocabulary: <unk>, <s>, </s>, the 256 byte
    /// tokens, then pieces with their scores.
    struct Spm {
        tokens: Vec<String>,
        types: Vec<i32>,
        scores: Vec<f32>,
    }

    impl Spm {
        fn new(pieces: &[(&str, f32)]) -> Spm {
            let mut spm = Spm {
                tokens: vec!["<unk>".into(), "<s>".into(), "</s>".into()],
                types: vec![2, 3, 3],
                scores: vec![0.0; 3],
            };
            for b in 0..=255u8 {
                spm.push(&format!("<0x{b:02X}>"), 6, 0.0);
            }
            for &(piece, score) in pieces {
                spm.push(piece, 1, score);
            }
            spm
        }

        fn push(&mut self, token: &str, kind: i32, score: f32) {
            self.tokens.push(token.into());
            self.types.push(kind);
            self.scores.push(score);
        }

        fn id(&self, token: &str) -> u32 {
            self.tokens.iter().position(|t| t == token).unwrap() as u32
        }

        fn ids(&self, tokens: &[&str]) -> Vec<u32> {
            tokens.iter().map(|t| self.id(t)).collect()
        }

        fn vocab(&self) -> GgufVocab<'_> {
            GgufVocab {
                model: "llama",
                pre: None,
                tokens: &self.tokens,
                token_types: Some(&self.types),
                scores: Some(&self.scores),
                merges: None,
                bos: Some(1),
                eos: Some(2),
                unk: Some(0),
                pad: None,
                add_bos: None,
                add_eos: None,
                add_space_prefix: None,
            }
        }
    }

    fn hello_world() -> Spm {
        let chars = ["▁", "h", "e", "l", "o", "w", "r", "d"].map(|c| (c, -100.0));
        let pieces = [
            ("▁hello", -1.0),
            ("▁world", -2.0),
            ("ll", -3.0),
            ("▁he", -4.0),
            ("llo", -5.0),
            ("▁h", -6.0),
            ("▁w", -7.0),
            ("or", -8.0),
            ("▁wor", -9.0),
            ("ld", -10.0),
        ];
        Spm::new(&[&chars[..], &pieces[..]].concat())
    }

    #[test]
    fn spm_encodes_and_decodes_known_strings() {
        let spm = hello_world();
        let tok = build(&spm.vocab());
        let cases: &[(&str, &[&str])] = &[
            ("hello world", &["▁hello", "▁world"]),
            ("hello  world", &["▁hello", "▁", "▁world"]),
            ("hello\n", &["▁hello", "<0x0A>"]),
            ("é", &["▁", "<0xC3>", "<0xA9>"]),
            ("<s>hello", &["<s>", "▁hello"]),
            ("hello</s>world", &["▁hello", "</s>", "▁world"]),
        ];
        for &(text, want) in cases {
            assert_eq!(ids(&tok, text, false), spm.ids(want), "{text:?}");
        }
        assert_eq!(
            ids(&tok, "hello world", true),
            spm.ids(&["<s>", "▁hello", "▁world"])
        );
        for text in ["hello world", "hello  world", "hello\n", "é", "wold held"] {
            let got = ids(&tok, text, true);
            assert_eq!(tok.decode(&got, true).unwrap(), text, "{text:?}");
        }
    }

    #[test]
    fn spm_without_space_prefix() {
        let spm = hello_world();
        let v = GgufVocab {
            add_space_prefix: Some(false),
            add_bos: Some(false),
            ..spm.vocab()
        };
        let tok = build(&v);
        let got = ids(&tok, "hello world", true);
        assert_eq!(got, spm.ids(&["h", "e", "llo", "▁world"]));
        assert_eq!(tok.decode(&got, true).unwrap(), "hello world");
    }

    #[test]
    fn spm_merges_follow_the_scores() {
        let chars = ["a", "b", "c"].map(|c| (c, -100.0));
        for (ab, bc, want) in [(-1.0, -2.0, ["ab", "c"]), (-2.0, -1.0, ["a", "bc"])] {
            let spm = Spm::new(&[&chars[..], &[("ab", ab), ("bc", bc)]].concat());
            let v = GgufVocab {
                add_space_prefix: Some(false),
                ..spm.vocab()
            };
            assert_eq!(ids(&build(&v), "abc", false), spm.ids(&want));
        }
    }

    #[test]
    fn spm_without_token_types_infers_specials_and_bytes() {
        let spm = hello_world();
        let v = GgufVocab {
            token_types: None,
            ..spm.vocab()
        };
        let tok = build(&v);
        assert_eq!(
            ids(&tok, "<s>é", false),
            spm.ids(&["<s>", "▁", "<0xC3>", "<0xA9>"])
        );
    }

    /// 2000 tokens of 4 KiB: the split search hashed every prefix of every
    /// token (quadratic: 80 s for one 1 MB token); now linear.
    #[test]
    fn spm_merges_of_long_tokens_are_not_quadratic() {
        let long: Vec<String> = (0..2000)
            .map(|i| format!("{i:05}{}", "a".repeat(4090)))
            .collect();
        let pieces: Vec<(&str, f32)> = long.iter().map(|t| (t.as_str(), -1.0)).collect();
        let spm = Spm::new(&pieces);
        let started = std::time::Instant::now();
        tokenizer_json(&spm.vocab()).unwrap();
        assert!(
            started.elapsed().as_secs() < 10,
            "took {:?}",
            started.elapsed()
        );
    }

    /// Every prefix of a long run is a token: its merges would be the cube
    /// of the run; refused past the bound instead.
    #[test]
    fn spm_merges_past_their_bound_are_refused() {
        let runs: Vec<String> = (1..=4096).map(|n| "b".repeat(n)).collect();
        let pieces: Vec<(&str, f32)> = runs.iter().map(|t| (t.as_str(), -1.0)).collect();
        let e = err(&Spm::new(&pieces).vocab());
        assert!(e.contains("SentencePiece merges"), "{e}");
    }

    /// A megabyte of text tokenizes in bounded time (BPE merges through a
    /// priority queue, not a rescan per merge).
    #[test]
    fn a_long_input_is_not_quadratic_to_tokenize() {
        let tok = build(&hello_world().vocab());
        let text = "hello world wold ".repeat(1 << 16);
        let started = std::time::Instant::now();
        let n = ids(&tok, &text, false).len();
        assert!(n > 1 << 16);
        assert!(
            started.elapsed().as_secs() < 20,
            "took {:?}",
            started.elapsed()
        );
    }

    fn err(v: &GgufVocab) -> String {
        tokenizer_json(v).expect_err("bad metadata accepted")
    }

    #[test]
    fn errors_name_the_key() {
        let f = fixture();
        let spm = hello_world();
        let short_types = vec![1; f.tokens.len() - 1];
        let short_scores = vec![0.0; spm.tokens.len() + 1];
        let dup = vec!["a".to_string(), "b".into(), "a".into()];
        let cases: Vec<(GgufVocab, &str)> = vec![
            (
                GgufVocab {
                    model: "bert",
                    ..gpt2(&f, "gpt-2")
                },
                "tokenizer.ggml.model `bert`",
            ),
            (
                gpt2(&f, "foo"),
                "tokenizer.ggml.pre `foo` is not supported; known: default, gpt-2",
            ),
            (
                GgufVocab {
                    merges: None,
                    ..gpt2(&f, "qwen2")
                },
                "tokenizer.ggml.merges missing",
            ),
            (
                GgufVocab {
                    token_types: Some(&short_types),
                    ..gpt2(&f, "qwen2")
                },
                "tokenizer.ggml.token_type has",
            ),
            (
                GgufVocab {
                    scores: Some(&short_scores),
                    ..spm.vocab()
                },
                "tokenizer.ggml.scores has",
            ),
            (
                GgufVocab {
                    scores: None,
                    ..spm.vocab()
                },
                "tokenizer.ggml.scores missing",
            ),
            (
                GgufVocab {
                    bos: Some(1 << 20),
                    ..spm.vocab()
                },
                "tokenizer.ggml.bos_token_id",
            ),
            (
                GgufVocab {
                    add_bos: Some(true),
                    ..gpt2(&f, "glm4")
                },
                "tokenizer.ggml.add_bos_token is true",
            ),
            (
                GgufVocab {
                    tokens: &dup,
                    token_types: None,
                    ..gpt2(&f, "gpt-2")
                },
                "tokenizer.ggml.tokens lists `a` twice",
            ),
            (
                GgufVocab {
                    tokens: &[],
                    token_types: None,
                    ..gpt2(&f, "gpt-2")
                },
                "tokenizer.ggml.tokens is empty",
            ),
        ];
        for (v, want) in cases {
            let e = err(&v);
            assert!(e.contains(want), "{e:?} lacks {want:?}");
        }
    }
}
