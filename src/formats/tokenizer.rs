//! Text ↔ token ids through the `tokenizers` crate (`tokenizer.json`), and
//! the end-of-sequence ids from `generation_config.json` (falling back to
//! config.json).

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// Heap one `encode` takes per byte of text at its peak (pre-tokens,
/// offsets, alignments and ids of the `tokenizers` crate; ~250 measured on
/// byte-level BPE): the text a command tokenizes is planned at this rate.
pub const TOKENIZE_BYTES_PER_BYTE: u64 = 256;

/// The heap tokenizing `text_bytes` of text takes at its peak.
pub fn tokenize_bytes(text_bytes: u64) -> u64 {
    text_bytes.saturating_mul(TOKENIZE_BYTES_PER_BYTE)
}

/// A loaded tokenizer.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json`.
    pub fn load(dir: &Path) -> Result<Tokenizer> {
        match crate::formats::model_files::read(dir, "tokenizer.json")? {
            Some(doc) => Tokenizer::from_json(&doc.path, &doc.text),
            None => Err(Error::Tokenizer {
                path: crate::formats::model_files::expected_path(dir, "tokenizer.json"),
                reason: "file not found".into(),
            }),
        }
    }

    /// Parses a tokenizer.json's text (`path` names errors). The
    /// `tokenizers` crate's parser is not ours: a panic inside it is caught
    /// and reported as a bad file, never a crash. The entry point of the
    /// `tokenizer_json` fuzz target.
    pub fn from_json(path: &Path, text: &str) -> Result<Tokenizer> {
        let bad = |reason: String| Error::Tokenizer {
            path: path.to_path_buf(),
            reason,
        };
        // Malformed JSON is refused here, with its line and column: the
        // tokenizers crate panics on some of it (a broken decoder object).
        serde_json::from_str::<serde_json::Value>(text)
            .map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let parsed = std::panic::catch_unwind(|| text.parse::<tokenizers::Tokenizer>())
            .map_err(|_| bad("the tokenizers crate panicked parsing it".into()))?;
        let inner = parsed.map_err(|e| bad(format!("{e}")))?;
        if inner.get_vocab_size(true) == 0 {
            return Err(bad(
                "the vocabulary is empty (model.vocab and added_tokens hold no token)".into(),
            ));
        }
        Ok(Tokenizer {
            inner,
            path: path.to_path_buf(),
        })
    }

    /// Encodes `text` (with the tokenizer's own special-token rules).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, true).map_err(|e| self.err(e))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Encodes `text` without adding special tokens (transformers'
    /// `add_special_tokens=False`): for a rendered chat template, which
    /// already holds its BOS text, as `apply_chat_template(tokenize=True)`
    /// encodes it. Special-token text inside `text` still maps to its id.
    pub fn encode_raw(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, false).map_err(|e| self.err(e))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The longest token's text in the vocabulary (added tokens included),
    /// in UTF-8 bytes: no token covers more bytes of the text it was
    /// encoded from, for byte-level BPE (each input byte is one char of
    /// the token's text) and SentencePiece vocabularies (`▁` stands for a
    /// one-byte space) alike, unless a normalizer shrinks the text.
    pub fn token_bytes_max(&self) -> usize {
        let vocab = self.inner.get_vocab(true);
        vocab.keys().map(String::len).max().unwrap_or(1).max(1)
    }

    /// Decodes `ids`, skipping special tokens.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, true).map_err(|e| self.err(e))
    }

    /// The ids of the special tokens whose text is one of `texts` (a tool
    /// format's markers, when a tokenizer marks them special), sorted.
    pub fn special_ids_of(&self, texts: &[&str]) -> Vec<u32> {
        let added = self.inner.get_added_vocabulary().get_added_tokens_decoder();
        let mut ids: Vec<u32> = (added.iter())
            .filter(|(_, t)| t.special && texts.contains(&t.content.as_str()))
            .map(|(&id, _)| id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Decodes `ids`, skipping special tokens except those of `keep`
    /// (sorted), whose text is written out: a tool call's markers stay
    /// visible to the parser while EOS and the template's tokens go.
    pub fn decode_keeping(&self, ids: &[u32], keep: &[u32]) -> Result<String> {
        if keep.is_empty() {
            return self.decode(ids);
        }
        let added = self.inner.get_added_vocabulary();
        let shown: Vec<u32> = (ids.iter().copied())
            .filter(|id| keep.binary_search(id).is_ok() || !is_special(added, *id))
            .collect();
        self.inner.decode(&shown, false).map_err(|e| self.err(e))
    }

    /// Decodes `ids`, special tokens written out (llama-server's
    /// `/detokenize` and token pieces).
    pub fn decode_special(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(|e| self.err(e))
    }

    /// The ids the vocabulary has (added tokens included): every id is
    /// below it.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    fn err(&self, e: impl std::fmt::Display) -> Error {
        Error::Tokenizer {
            path: self.path.clone(),
            reason: e.to_string(),
        }
    }
}

/// Whether `id` is a special added token.
fn is_special(added: &tokenizers::AddedVocabulary, id: u32) -> bool {
    added
        .get_added_tokens_decoder()
        .get(&id)
        .is_some_and(|t| t.special)
}

/// End-of-sequence ids: `generation_config.json` `eos_token_id` (int or list),
/// else config.json's; empty if neither names one.
pub fn eos_ids(dir: &Path) -> Result<Vec<u32>> {
    for file in ["generation_config.json", "config.json"] {
        let Some(doc) = crate::formats::model_files::read(dir, file)? else {
            continue;
        };
        if let Some(ids) = eos_ids_of(&doc.path, &doc.text)? {
            return Ok(ids);
        }
    }
    Ok(Vec::new())
}

/// The `eos_token_id` (an id or a list of ids) of a generation or model
/// config's text; `None` if it names none. Ids must fit in u32. `path`
/// only names errors. The entry point of the `generation_config` fuzz
/// target.
pub fn eos_ids_of(path: &Path, text: &str) -> Result<Option<Vec<u32>>> {
    let v: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| Error::config(path, "(file)", format!("not valid JSON: {e}")))?;
    let id = |x: &serde_json::Value| -> Result<u32> {
        x.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| Error::config(path, "eos_token_id", format!("{x} is not a token id")))
    };
    match v.get("eos_token_id") {
        Some(n @ serde_json::Value::Number(_)) => Ok(Some(vec![id(n)?])),
        Some(serde_json::Value::Array(a)) => Ok(Some(a.iter().map(id).collect::<Result<_>>()?)),
        _ => Ok(None),
    }
}

/// Incremental detokenizer: yields the new text each time a token arrives.
pub struct TextStream<'a> {
    tok: &'a Tokenizer,
    ids: Vec<u32>,
    printed: usize,
    /// Special tokens written out ([`Tokenizer::decode_keeping`]), sorted.
    keep: Vec<u32>,
}

impl<'a> TextStream<'a> {
    /// An empty stream, special tokens skipped.
    pub fn new(tok: &'a Tokenizer) -> TextStream<'a> {
        TextStream::keeping(tok, Vec::new())
    }

    /// An empty stream writing out the special tokens of `keep` (sorted).
    pub fn keeping(tok: &'a Tokenizer, keep: Vec<u32>) -> TextStream<'a> {
        TextStream {
            tok,
            ids: Vec::new(),
            printed: 0,
            keep,
        }
    }

    /// Adds `id`; returns the newly completed text (may be empty mid-UTF-8).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let text = self.tok.decode_keeping(&self.ids, &self.keep)?;
        if text.ends_with('\u{FFFD}')
            || text.len() < self.printed
            || !text.is_char_boundary(self.printed)
        {
            return Ok(String::new());
        }
        let new = text[self.printed..].to_string();
        self.printed = text.len();
        Ok(new)
    }
}
