//! The lexeme plan → llguidance Lark text.
//!
//! Names: a GBNF rule named like a Lark rule (lowercase letters, digits
//! and dashes, starting with a letter; not `start`) keeps its name; any
//! other becomes `x_` plus the name with each capital `C` written `_c`
//! (`dataType` → `x_data_type`). Plain names have no `_`, so the two
//! kinds never collide. A regular rule used inside lexemes is also the
//! terminal of its name in capitals (`ws` → `WS`); other multi-part
//! lexemes are terminals `T_1`, `T_2`, … (no rule's terminal starts with
//! `T_`). Strings are JSON-escaped Lark strings; classes are regexes with
//! every character outside letters and digits escaped as `\x{…}`.

use super::ast::{Expr, Grammar};
use super::charset::CharSet;
use super::flow::Node;
use super::lexemes::LexemePlan;
use std::collections::HashMap;
use std::fmt::Write;

/// The Lark text of `g` under `plan`.
pub(super) fn lark<'g>(g: &'g Grammar, plan: &'g LexemePlan) -> String {
    let mut e = Emitter {
        names: g.rules.iter().map(|r| rule_name(&r.name)).collect(),
        rule_of_body: HashMap::new(),
        generated: HashMap::new(),
        terminals: Vec::new(),
        wanted: vec![false; g.rules.len()],
        pending: Vec::new(),
    };
    for (r, rule) in g.rules.iter().enumerate() {
        e.rule_of_body.entry(&rule.body).or_insert(r);
    }
    let mut out = format!("start: {}\n", e.names[g.root]);
    for (r, body) in plan.bodies.iter().enumerate() {
        if let Some(body) = body {
            let text = e.node(body, plan);
            let _ = writeln!(out, "{}: {text}", e.names[r]);
        }
    }
    while let Some(r) = e.pending.pop() {
        let text = e.term(&g.rules[r].body);
        let _ = writeln!(out, "{}: {text}", e.names[r].to_ascii_uppercase());
    }
    for (name, text) in &e.terminals {
        let _ = writeln!(out, "{name}: {text}");
    }
    out
}

/// The Lark rule name of GBNF rule `name`.
fn rule_name(name: &str) -> String {
    let plain = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && name != "start";
    if plain {
        return name.to_string();
    }
    let mut out = String::from("x_");
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

struct Emitter<'g> {
    /// Lark rule name of each GBNF rule.
    names: Vec<String>,
    /// The rule whose body each expression is (a lexeme equal to a
    /// regular rule's body is that rule's terminal).
    rule_of_body: HashMap<&'g Expr, usize>,
    /// The generated terminal of each other multi-part lexeme.
    generated: HashMap<&'g Expr, String>,
    /// Generated terminals, in order: name and text.
    terminals: Vec<(String, String)>,
    /// Rules whose terminal is emitted (or queued in `pending`).
    wanted: Vec<bool>,
    pending: Vec<usize>,
}

impl<'g> Emitter<'g> {
    /// A rule-level node.
    fn node(&mut self, n: &Node, plan: &'g LexemePlan) -> String {
        match n {
            Node::Empty => "\"\"".to_string(),
            Node::Lex(id) => self.lexeme(&plan.lexemes[*id]),
            Node::Ref(r) => self.names[*r].clone(),
            Node::Seq(items) => {
                let parts: Vec<String> = items
                    .iter()
                    .map(|i| match i {
                        Node::Alt(_) => format!("({})", self.node(i, plan)),
                        _ => self.node(i, plan),
                    })
                    .collect();
                parts.join(" ")
            }
            Node::Alt(alts) => {
                let parts: Vec<String> = alts.iter().map(|a| self.node(a, plan)).collect();
                parts.join(" | ")
            }
            Node::Repeat { item, min, max } => {
                let inner = self.node(item, plan);
                // An optional lexeme renders as `X?`: a second operator
                // needs parentheses.
                let compound = matches!(**item, Node::Seq(_) | Node::Alt(_) | Node::Repeat { .. });
                if compound || inner.ends_with('?') {
                    format!("({inner}){}", op(*min, *max))
                } else {
                    format!("{inner}{}", op(*min, *max))
                }
            }
        }
    }

    /// One lexeme in a rule: a string, a regex, or a terminal's name.
    fn lexeme(&mut self, e: &'g Expr) -> String {
        match e {
            Expr::Empty | Expr::Literal(_) | Expr::Class { .. } | Expr::Ref(_) => self.term(e),
            // An optional lexeme is a lexeme that may be absent.
            Expr::Repeat {
                item,
                min: 0,
                max: Some(1),
            } if matches!(**item, Expr::Literal(_) | Expr::Class { .. } | Expr::Ref(_)) => {
                format!("{}?", self.term(item))
            }
            _ => self.terminal(e),
        }
    }

    /// The name of a terminal for `e` (defined on first use).
    fn terminal(&mut self, e: &'g Expr) -> String {
        if let Some(&r) = self.rule_of_body.get(e) {
            return self.term(&Expr::Ref(r));
        }
        if let Some(name) = self.generated.get(e) {
            return name.clone();
        }
        let name = format!("T_{}", self.terminals.len() + 1);
        let text = self.term(e);
        self.generated.insert(e, name.clone());
        self.terminals.push((name.clone(), text));
        name
    }

    fn want(&mut self, r: usize) {
        if !std::mem::replace(&mut self.wanted[r], true) {
            self.pending.push(r);
        }
    }

    /// `e` in a terminal definition.
    fn term(&mut self, e: &Expr) -> String {
        match e {
            Expr::Empty => "\"\"".to_string(),
            Expr::Literal(s) => quote(s),
            Expr::Class { negated, set } => class_regex(*negated, set),
            Expr::Ref(r) => {
                self.want(*r);
                self.names[*r].to_ascii_uppercase()
            }
            Expr::Seq(items) => {
                let parts: Vec<String> = items
                    .iter()
                    .map(|i| match i {
                        Expr::Alt(_) => format!("({})", self.term(i)),
                        _ => self.term(i),
                    })
                    .collect();
                parts.join(" ")
            }
            Expr::Alt(alts) => {
                let parts: Vec<String> = alts.iter().map(|a| self.term(a)).collect();
                parts.join(" | ")
            }
            Expr::Repeat { item, min, max } => {
                let inner = self.term(item);
                match **item {
                    Expr::Seq(_) | Expr::Alt(_) | Expr::Repeat { .. } => {
                        format!("({inner}){}", op(*min, *max))
                    }
                    _ => format!("{inner}{}", op(*min, *max)),
                }
            }
        }
    }
}

/// The Lark operator of a repetition.
fn op(min: u32, max: Option<u32>) -> String {
    match (min, max) {
        (0, None) => "*".to_string(),
        (1, None) => "+".to_string(),
        (0, Some(1)) => "?".to_string(),
        (m, None) => format!("{{{m},}}"),
        (m, Some(n)) if m == n => format!("{{{m}}}"),
        (m, Some(n)) => format!("{{{m},{n}}}"),
    }
}

/// A Lark string literal (JSON escapes) of `s`.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A Lark regex matching one code point of the class.
fn class_regex(negated: bool, set: &CharSet) -> String {
    if negated && set.is_empty() {
        return "/(?s:.)/".to_string();
    }
    let mut out = String::from(if negated { "/[^" } else { "/[" });
    for &(lo, hi) in set.ranges() {
        push_class_char(&mut out, lo);
        if hi > lo {
            if hi > lo + 1 {
                out.push('-');
            }
            push_class_char(&mut out, hi);
        }
    }
    out.push_str("]/");
    out
}

/// One code point inside a regex class: letters and digits as they are,
/// `\n \t \r` by name, anything else as `\x{…}`.
fn push_class_char(out: &mut String, c: u32) {
    match char::from_u32(c) {
        Some(ch) if ch.is_ascii_alphanumeric() || (!ch.is_ascii() && ch.is_alphanumeric()) => {
            out.push(ch)
        }
        Some('\n') => out.push_str("\\n"),
        Some('\t') => out.push_str("\\t"),
        Some('\r') => out.push_str("\\r"),
        _ => {
            let _ = write!(out, "\\x{{{c:x}}}");
        }
    }
}
