//! Constrained output with llguidance: a grammar (Lark), a JSON schema,
//! any JSON object, or a regex masks the logits before each choice, so
//! every sampled token keeps the output inside the language; EOS is
//! allowed only where the output is complete. JSON output has fixed
//! separators (`, ` and `: `) and no free whitespace.

use crate::error::{Error, Result};
use crate::formats::chat::tool_calls::bounded_whitespace;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use std::sync::Arc;

/// What the output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum Constraint {
    /// A grammar in llguidance's Lark dialect.
    Lark(String),
    /// A JSON schema.
    JsonSchema(serde_json::Value),
    /// Any JSON object.
    JsonObject,
    /// A regular expression (the whole output).
    Regex(String),
}

impl Constraint {
    /// The llguidance grammar. JSON is held to fixed separators without
    /// free whitespace unless the schema's own `x-guidance` says otherwise
    /// ([`bounded_whitespace`]): free whitespace lets a model spend its
    /// whole budget on blanks inside an object.
    fn grammar(&self) -> TopLevelGrammar {
        match self {
            Constraint::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            Constraint::JsonSchema(s) => TopLevelGrammar::from_json_schema(bounded_whitespace(s)),
            Constraint::JsonObject => TopLevelGrammar::from_json_schema(bounded_whitespace(
                &serde_json::json!({"type": "object"}),
            )),
            Constraint::Regex(r) => TopLevelGrammar::from_regex(r),
        }
    }
}

/// A model's tokenizer prepared for constraints (the token trie is built
/// once and shared by every request).
#[derive(Clone)]
pub struct Grammars {
    factory: Arc<ParserFactory>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Grammars")
    }
}

fn grammar_error(what: impl std::fmt::Display) -> Error {
    Error::Request(format!("constraint: {what}"))
}

impl Grammars {
    /// Prepares the tokenizer of `tokenizer_json` (its text) for a model
    /// of `vocab` logits whose end-of-sequence ids are `eos`.
    pub fn new(tokenizer_json: &[u8], vocab: usize, eos: &[u32]) -> Result<Grammars> {
        let mut tok = toktrie_hf_tokenizers::ByteTokenizer::from_json_bytes(tokenizer_json)
            .map_err(grammar_error)?;
        if !eos.is_empty() {
            tok.set_eos_tokens(eos);
        }
        let env = tok.into_tok_env(Some(vocab)).map_err(grammar_error)?;
        let mut factory = ParserFactory::new_simple(&env).map_err(grammar_error)?;
        factory.quiet();
        Ok(Grammars {
            factory: Arc::new(factory),
        })
    }

    /// A fresh state of `constraint` for one sequence; a constraint that
    /// does not compile is a request error naming the reason.
    pub fn start(&self, constraint: &Constraint) -> Result<GrammarState> {
        let parser = self.factory.create_parser(constraint.grammar());
        let matcher = Matcher::new(parser);
        if let Some(e) = matcher.get_error() {
            return Err(grammar_error(e));
        }
        Ok(GrammarState { matcher })
    }
}

impl Grammars {
    /// The bytes of token `id` (empty for an id past the vocabulary; a
    /// special token's carry a marker byte no text has).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        let trie = self.factory.tok_env().tok_trie();
        if (id as usize) < trie.vocab_size() {
            trie.token(id)
        } else {
            &[]
        }
    }

    /// The id of the special token whose text is `text` (llguidance
    /// takes every added `<...>` token as one), if the tokenizer has it:
    /// a grammar literal never matches it, a `<[id]>` does.
    pub fn special_token(&self, text: &str) -> Option<u32> {
        self.factory.tok_env().tok_trie().get_special_token(text)
    }

    /// [`Grammars::start`], with `bytes` of output already taken in (the
    /// rest of the token that opened the constrained part); an error when
    /// they do not start the constraint's language.
    pub fn start_with(&self, constraint: &Constraint, bytes: &[u8]) -> Result<GrammarState> {
        let mut state = self.start(constraint)?;
        if !bytes.is_empty() {
            let tokens = self.factory.tok_env().tokenize_bytes(bytes);
            state
                .matcher
                .consume_tokens(&tokens)
                .map_err(grammar_error)?;
        }
        Ok(state)
    }
}

/// A constraint's parser state for one sequence.
#[derive(Clone)]
pub struct GrammarState {
    matcher: Matcher,
}

impl GrammarState {
    /// Sets every logit the constraint forbids next to -inf. Errors when
    /// nothing is allowed (the constraint cannot continue).
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        let allowed = self.matcher.compute_mask().map_err(grammar_error)?;
        let mut any = false;
        for (id, l) in logits.iter_mut().enumerate() {
            if allowed.is_allowed(id as u32) {
                any |= l.is_finite();
            } else {
                *l = f32::NEG_INFINITY;
            }
        }
        if !any {
            return Err(grammar_error("no token can continue the output"));
        }
        Ok(())
    }

    /// Whether any output can start: a JSON schema that matches nothing
    /// (a `$ref` only to itself) compiles, then allows no first token.
    pub fn can_start(&mut self) -> bool {
        self.matcher.compute_mask().is_ok_and(|m| !m.is_zero())
    }

    /// Takes in the chosen token.
    pub fn consume(&mut self, token: u32) -> Result<()> {
        self.matcher.consume_token(token).map_err(grammar_error)
    }

    /// Whether the output is complete and nothing more may follow.
    pub fn is_stopped(&self) -> bool {
        self.matcher.is_stopped()
    }
}
