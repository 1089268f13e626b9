//! GBNF (llama.cpp's grammar format) → llguidance's Lark dialect, so
//! `--grammar` takes either. The llguidance crate has no GBNF front end.
//!
//! Pipeline: `parse` reads the rules (and `productive` drops the
//! alternatives that can never finish); `lexemes` decides which pieces
//! become lexemes (llguidance lexes greedily, GBNF has no lexer: the plan
//! splits exactly the pieces whose greedy lexing could change the
//! language, using `flow`'s first/follow sets and `nfa`'s automata);
//! `emit` writes Lark with `start: root`.
//!
//! The translation is exact: the Lark grammar accepts the strings the GBNF
//! grammar accepts, no more, no fewer. Supported: rules (`name ::= ...`,
//! names of letters, digits and dashes), `root` as the start, `|`,
//! sequences, `( )`, `* + ?`, `{m}`, `{m,}`, `{m,n}`, strings with escapes
//! (`\n \t \r \" \\ \[ \] \xHH \uHHHH \UHHHHHHHH`), classes `[...]` and
//! `[^...]` with ranges and escapes, `.`, `#` comments, and rules spanning
//! lines (a rule runs until the next `name ::=`). Not supported: token
//! matches (`<think>`, `<[id]>`, `!<...>`), refused by name.

mod ast;
mod charset;
mod emit;
mod flow;
mod lexemes;
mod nfa;
mod parse;
mod productive;

use crate::error::Error;

/// Why GBNF text was refused: where, and what was expected there.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {message}")]
pub struct GbnfError {
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
    /// What was expected or is wrong.
    pub message: String,
}

impl From<GbnfError> for Error {
    fn from(e: GbnfError) -> Error {
        Error::Request(format!("constraint: GBNF grammar: {e}"))
    }
}

/// The llguidance Lark grammar accepting exactly the language of `gbnf`.
pub fn to_lark(gbnf: &str) -> Result<String, GbnfError> {
    let grammar = parse::parse(gbnf)?;
    let plan = lexemes::plan(&grammar);
    Ok(emit::lark(&grammar, &plan))
}

/// Whether grammar text is GBNF rather than Lark: its first line that is
/// neither blank nor a comment defines a rule with `::=` (a Lark file
/// starts with a `name:` rule or a `%` directive).
pub fn is_gbnf(text: &str) -> bool {
    let first = text
        .lines()
        .map(str::trim_start)
        .find(|l| !(l.is_empty() || l.starts_with('#') || l.starts_with("//")));
    let Some(line) = first else {
        return false;
    };
    let name_len = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .unwrap_or(line.len());
    name_len > 0 && line[name_len..].trim_start().starts_with("::=")
}

#[cfg(test)]
mod tests;
