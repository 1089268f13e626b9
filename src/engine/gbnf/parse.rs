//! GBNF text → rules, as llama.cpp's grammars/README.md documents it:
//! `name ::= alternatives`, `|`, sequences, `( )`, `* + ? {m} {m,} {m,n}`,
//! string literals, character classes `[...]` and `[^...]`, `.`, and `#`
//! comments. Whitespace and newlines separate items anywhere; a rule runs
//! until the next `name ::=` (name and `::=` on one line) or the end of
//! the text.
//!
//! Invariants of the result: every referenced rule is defined, `root`
//! exists and matches some finite string, every alternative reachable
//! from `root` can finish (see [`productive`]), literals are non-empty,
//! no class matches nothing, and repetitions have `min <= max`, `max > 0`.

pub(super) use super::ast::{Expr, Grammar, Rule};
use super::charset::CharSet;
use super::productive;
use super::GbnfError;
use std::collections::HashMap;

/// Deepest nesting of `( )` accepted (bounds recursion on the result).
const GROUP_DEPTH_MAX: usize = 64;
/// Most repetition operators stacked on one item (`x*?` is two).
const POSTFIX_MAX: usize = 8;
/// Largest repetition count (llguidance's Lark counts are `i32`).
const REPEAT_MAX: u32 = i32::MAX as u32 - 1;

/// Parses GBNF text.
pub(super) fn parse(src: &str) -> Result<Grammar, GbnfError> {
    let mut p = Parser {
        src,
        pos: 0,
        depth: 0,
        ids: HashMap::new(),
        names: Vec::new(),
        first_use: Vec::new(),
        bodies: Vec::new(),
    };
    p.skip_space();
    while p.pos < src.len() {
        p.rule()?;
    }
    p.finish()
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-'
}

struct Parser<'a> {
    src: &'a str,
    /// Byte offset of the next character (always on a char boundary).
    pos: usize,
    /// Open `( )` groups.
    depth: usize,
    ids: HashMap<&'a str, usize>,
    names: Vec<&'a str>,
    /// Offset of each rule's first mention.
    first_use: Vec<usize>,
    /// Each rule's body and the offset of its definition.
    bodies: Vec<Option<(Expr, usize)>>,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn peek2(&self) -> Option<char> {
        self.src[self.pos..].chars().nth(1)
    }

    fn bump(&mut self) {
        if let Some(c) = self.peek() {
            self.pos += c.len_utf8();
        }
    }

    fn eat(&mut self, s: &str) -> bool {
        let found = self.src[self.pos..].starts_with(s);
        if found {
            self.pos += s.len();
        }
        found
    }

    /// Skips spaces, tabs, newlines and `#` comments.
    fn skip_space(&mut self) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' | '\r' | '\n' => self.bump(),
                '#' => match self.src[self.pos..].find('\n') {
                    Some(n) => self.pos += n + 1,
                    None => self.pos = self.src.len(),
                },
                _ => break,
            }
        }
    }

    fn error_at(&self, at: usize, message: impl Into<String>) -> GbnfError {
        let before = &self.src[..at];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
        GbnfError {
            line,
            column,
            message: message.into(),
        }
    }

    /// "expected X, found Y" at the current position.
    fn expected(&self, what: &str) -> GbnfError {
        let found = match self.peek() {
            Some(c) => format!("`{}`", c.escape_debug()),
            None => "the end of the grammar".to_string(),
        };
        self.error_at(self.pos, format!("expected {what}, found {found}"))
    }

    fn name(&mut self) -> Option<&'a str> {
        let rest = &self.src[self.pos..];
        let len = rest.find(|c| !is_name_char(c)).unwrap_or(rest.len());
        self.pos += len;
        (len > 0).then(|| &rest[..len])
    }

    /// Skips spaces and tabs (between a rule's name and its `::=`, which
    /// share a line).
    fn skip_blanks(&mut self) {
        let rest = &self.src[self.pos..];
        self.pos += rest.len() - rest.trim_start_matches([' ', '\t']).len();
    }

    /// Whether a `name ::=` starts here (the next rule).
    fn at_rule_start(&mut self) -> bool {
        let start = self.pos;
        let found = self.name().is_some() && {
            self.skip_blanks();
            self.src[self.pos..].starts_with("::=")
        };
        self.pos = start;
        found
    }

    fn rule(&mut self) -> Result<(), GbnfError> {
        let start = self.pos;
        let name = self
            .name()
            .ok_or_else(|| self.expected("a rule definition `name ::= ...`"))?;
        self.skip_blanks();
        if !self.eat("::=") {
            return Err(self.expected(&format!("`::=` after rule name `{name}`")));
        }
        let id = self.mention(name, start);
        self.skip_space();
        let body = self.alternatives()?;
        if self.peek() == Some(')') {
            return Err(self.error_at(self.pos, "unmatched `)`"));
        }
        self.define(id, start, body)
    }

    fn alternatives(&mut self) -> Result<Expr, GbnfError> {
        let mut alts = vec![self.sequence()?];
        while self.eat("|") {
            self.skip_space();
            alts.push(self.sequence()?);
        }
        Ok(Expr::alt(alts))
    }

    /// Items up to `|`, `)`, the next rule or the end.
    fn sequence(&mut self) -> Result<Expr, GbnfError> {
        let mut items: Vec<(Expr, usize)> = Vec::new();
        while let Some(c) = self.peek() {
            match c {
                '|' | ')' => break,
                '*' | '+' | '?' | '{' => {
                    let Some((item, ops)) = items.pop() else {
                        let msg = format!("expected an item before `{c}`");
                        return Err(self.error_at(self.pos, msg));
                    };
                    items.push((self.postfix(item, ops)?, ops + 1));
                }
                c if is_name_char(c) && self.at_rule_start() => break,
                _ => items.push((self.item()?, 0)),
            }
            self.skip_space();
        }
        Ok(Expr::seq(items.into_iter().map(|(e, _)| e).collect()))
    }

    fn item(&mut self) -> Result<Expr, GbnfError> {
        let start = self.pos;
        match self.peek() {
            Some('"') => self.literal(),
            Some('[') => self.class(),
            Some('(') => self.group(),
            Some('.') => {
                self.bump();
                Ok(Expr::Class {
                    negated: true,
                    set: CharSet::default(),
                })
            }
            Some(c) if is_name_char(c) => {
                let name = self.name().unwrap_or_default();
                Ok(Expr::Ref(self.mention(name, start)))
            }
            Some('<' | '!') => Err(self.error_at(
                start,
                "token matches (`<...>`, `!<...>`) are not supported; write the text as a string",
            )),
            _ => Err(self.expected("a string, a character class, a rule name, `(`, `.` or `|`")),
        }
    }

    fn group(&mut self) -> Result<Expr, GbnfError> {
        let open = self.pos;
        if self.depth >= GROUP_DEPTH_MAX {
            let msg = format!("groups nested deeper than {GROUP_DEPTH_MAX}");
            return Err(self.error_at(open, msg));
        }
        self.bump();
        self.skip_space();
        self.depth += 1;
        let inner = self.alternatives();
        self.depth -= 1;
        let inner = inner?;
        if !self.eat(")") {
            let at = self.error_at(open, "");
            let what = format!(
                "`)` to close the `(` of line {}, column {}",
                at.line, at.column
            );
            return Err(self.expected(&what));
        }
        Ok(inner)
    }

    /// Applies the operator at the current position to `item`, which
    /// already carries `ops` operators.
    fn postfix(&mut self, item: Expr, ops: usize) -> Result<Expr, GbnfError> {
        let at = self.pos;
        if ops >= POSTFIX_MAX {
            let msg = format!("more than {POSTFIX_MAX} repetition operators on one item");
            return Err(self.error_at(at, msg));
        }
        let (min, max) = match self.peek() {
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('?') => (0, Some(1)),
            _ => return self.counted(item),
        };
        self.bump();
        Ok(Expr::repeat(item, min, max))
    }

    /// `{m}`, `{m,}` or `{m,n}` after `item`.
    fn counted(&mut self, item: Expr) -> Result<Expr, GbnfError> {
        let open = self.pos;
        self.bump();
        self.skip_space();
        let min = self.count()?;
        self.skip_space();
        let max = if self.eat(",") {
            self.skip_space();
            let max = match self.peek() {
                Some(c) if c.is_ascii_digit() => Some(self.count()?),
                _ => None,
            };
            self.skip_space();
            max
        } else {
            Some(min)
        };
        if !self.eat("}") {
            return Err(self.expected("`}` to close the repetition count"));
        }
        if max.is_some_and(|max| max < min) {
            let msg = format!(
                "repetition `{{{min},{}}}`: the maximum is below the minimum",
                max.unwrap_or(0)
            );
            return Err(self.error_at(open, msg));
        }
        Ok(Expr::repeat(item, min, max))
    }

    fn count(&mut self) -> Result<u32, GbnfError> {
        let start = self.pos;
        let rest = &self.src[start..];
        let len = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if len == 0 {
            return Err(self.expected("a repetition count (a number)"));
        }
        self.pos += len;
        match rest[..len].parse::<u32>() {
            Ok(n) if n <= REPEAT_MAX => Ok(n),
            _ => Err(self.error_at(start, format!("repetition count above {REPEAT_MAX}"))),
        }
    }

    fn literal(&mut self) -> Result<Expr, GbnfError> {
        let open = self.pos;
        self.bump();
        let mut text = String::new();
        loop {
            match self.peek() {
                None => {
                    return Err(self.error_at(open, "unterminated string: expected a closing `\"`"))
                }
                Some('"') => break,
                Some(_) => text.push(self.char_()?),
            }
        }
        self.bump();
        Ok(if text.is_empty() {
            Expr::Empty
        } else {
            Expr::Literal(text)
        })
    }

    fn class(&mut self) -> Result<Expr, GbnfError> {
        let open = self.pos;
        self.bump();
        let negated = self.eat("^");
        let mut ranges = Vec::new();
        loop {
            match self.peek() {
                None => {
                    let msg = "unterminated character class: expected a closing `]`";
                    return Err(self.error_at(open, msg));
                }
                Some(']') => break,
                Some(_) => ranges.push(self.class_range()?),
            }
        }
        self.bump();
        let set = CharSet::from_ranges(ranges);
        if Expr::class_chars(negated, &set).is_empty() {
            return Err(self.error_at(open, "this character class matches no character"));
        }
        Ok(Expr::Class { negated, set })
    }

    /// One character of a class, or a range `a-z` (a `-` before `]` is a
    /// plain character).
    fn class_range(&mut self) -> Result<(u32, u32), GbnfError> {
        let start = self.pos;
        let lo = self.char_()?;
        let is_range = self.peek() == Some('-') && !matches!(self.peek2(), None | Some(']'));
        if !is_range {
            return Ok((lo as u32, lo as u32));
        }
        self.bump();
        let hi = self.char_()?;
        if hi < lo {
            let msg = format!(
                "range `{}-{}` ends before it starts",
                lo.escape_debug(),
                hi.escape_debug()
            );
            return Err(self.error_at(start, msg));
        }
        Ok((lo as u32, hi as u32))
    }

    /// One character of a string or class, escapes decoded.
    fn char_(&mut self) -> Result<char, GbnfError> {
        let start = self.pos;
        let Some(c) = self.peek() else {
            return Err(self.expected("a character"));
        };
        self.bump();
        if c != '\\' {
            return Ok(c);
        }
        let Some(e) = self.peek() else {
            return Err(self.error_at(start, "unfinished escape at the end of the grammar"));
        };
        self.bump();
        let digits = match e {
            'n' => return Ok('\n'),
            't' => return Ok('\t'),
            'r' => return Ok('\r'),
            '\\' | '"' | '[' | ']' => return Ok(e),
            'x' => 2,
            'u' => 4,
            'U' => 8,
            _ => {
                let msg = format!(
                    "unknown escape `\\{}`; expected one of \\n \\t \\r \\\\ \\\" \\[ \\] \\xHH \\uHHHH \\UHHHHHHHH",
                    e.escape_debug()
                );
                return Err(self.error_at(start, msg));
            }
        };
        self.hex_char(start, e, digits)
    }

    fn hex_char(&mut self, start: usize, e: char, digits: usize) -> Result<char, GbnfError> {
        let rest = &self.src[self.pos..];
        let hex: String = rest.chars().take(digits).collect();
        if hex.len() < digits || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            let msg = format!("`\\{e}` needs {digits} hex digits");
            return Err(self.error_at(start, msg));
        }
        self.pos += digits;
        u32::from_str_radix(&hex, 16)
            .ok()
            .and_then(char::from_u32)
            .ok_or_else(|| {
                let msg = format!("`\\{e}{hex}` is not a Unicode scalar value");
                self.error_at(start, msg)
            })
    }

    fn mention(&mut self, name: &'a str, at: usize) -> usize {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.names.len();
        self.ids.insert(name, id);
        self.names.push(name);
        self.first_use.push(at);
        self.bodies.push(None);
        id
    }

    fn define(&mut self, id: usize, at: usize, body: Expr) -> Result<(), GbnfError> {
        if let Some((_, first)) = &self.bodies[id] {
            let line = self.error_at(*first, "").line;
            let msg = format!(
                "rule `{}` is already defined on line {line}",
                self.names[id]
            );
            return Err(self.error_at(at, msg));
        }
        self.bodies[id] = Some((body, at));
        Ok(())
    }

    /// Checks every mentioned rule is defined, `root` exists and can
    /// finish; drops the alternatives that never finish.
    fn finish(self) -> Result<Grammar, GbnfError> {
        let mut rules = Vec::with_capacity(self.names.len());
        for (id, body) in self.bodies.iter().enumerate() {
            let Some((body, _)) = body else {
                let msg = format!("undefined rule `{}`", self.names[id]);
                return Err(self.error_at(self.first_use[id], msg));
            };
            rules.push(Rule {
                name: self.names[id].to_string(),
                body: body.clone(),
            });
        }
        let Some(&root) = self.ids.get("root") else {
            let msg = "expected a `root` rule (the grammar starts at `root`)";
            return Err(self.error_at(self.src.len(), msg));
        };
        if !productive::prune(&mut rules)[root] {
            let at = self.bodies[root].as_ref().map_or(0, |(_, at)| *at);
            let msg = "rule `root` never finishes: every way through it needs a rule that recurses without end";
            return Err(self.error_at(at, msg));
        }
        Ok(Grammar { rules, root })
    }
}
