//! minijinja's growing operators held to the render's memory bound.
//!
//! `~` and `+` concatenate and `*` repeats, and minijinja gives them no
//! hook: `{% set ns.s = ns.s ~ ns.s %}` in a loop doubles a string per
//! iteration without printing it, within the fuel bound (which counts
//! instructions, not bytes). So before a template is compiled,
//! [`bound_operators`] parses it and rewrites every such operator whose
//! operands are not both constants into a call of [`GROW_FUNCTION`]
//! (`a ~ b` → `__moestream_grow("~", a, b)`), on the same line, so errors
//! keep their line numbers. The function ([`grow`]) weighs the result
//! before it is built: one result may not exceed the render's bound, and
//! all results of one render together may not exceed
//! [`GROWN_PER_BOUND`] times it; then it evaluates the operator with
//! minijinja itself, so the value is exactly the one the operator gives.

use super::bound;
use minijinja::machinery::ast::{BinOpKind, CallArg, Expr, Stmt};
use minijinja::machinery::{parse, WhitespaceConfig};
use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Expression};
use std::cell::Cell;
use std::sync::OnceLock;

/// The function the rewritten operators call.
pub const GROW_FUNCTION: &str = "__moestream_grow";

/// The bytes all operator results of one render may add up to, as a
/// multiple of the render's bound: a real template concatenates each
/// message's text into a handful of strings.
pub const GROWN_PER_BOUND: usize = 4;

thread_local! {
    /// Bytes the operators of the render on this thread have built.
    static GROWN: Cell<usize> = const { Cell::new(0) };
}

/// Starts the operator count of a render on this thread (with
/// [`bound::Budget::enter`]); dropping it restores the one before.
pub struct Grown {
    before: usize,
}

impl Grown {
    pub fn enter() -> Grown {
        Grown {
            before: GROWN.with(|g| g.replace(0)),
        }
    }
}

impl Drop for Grown {
    fn drop(&mut self) {
        GROWN.with(|g| g.set(self.before));
    }
}

/// `source` with every growing operator routed through [`GROW_FUNCTION`].
/// A template that does not parse is returned as it is: compiling it
/// reports the syntax error.
pub fn bound_operators(source: &str) -> String {
    let whitespace = WhitespaceConfig {
        keep_trailing_newline: false,
        lstrip_blocks: true,
        trim_blocks: true,
    };
    let Ok(ast) = parse(source, "template", SyntaxConfig, whitespace) else {
        return source.to_string();
    };
    let mut edits = Vec::new();
    stmt_edits(source, &ast, &mut edits);
    edits.sort_by_key(|e| e.0);
    let mut out = String::with_capacity(source.len() + edits.len() * 32);
    let mut at = 0;
    for (start, end, text) in edits {
        out.push_str(&source[at..start]);
        out.push_str(&text);
        at = end;
    }
    out.push_str(&source[at..]);
    out
}

/// An edit: the byte range of an expression and its rewritten text.
type Edit = (usize, usize, String);

fn stmt_edits(source: &str, stmt: &Stmt<'_>, edits: &mut Vec<Edit>) {
    let expr = |e: &Expr<'_>, edits: &mut Vec<Edit>| {
        if let Some(text) = rewrite(source, e) {
            let (start, end) = extent(source, e);
            edits.push((start, end, text));
        }
    };
    let body = |b: &[Stmt<'_>], edits: &mut Vec<Edit>| {
        b.iter().for_each(|s| stmt_edits(source, s, edits));
    };
    match stmt {
        Stmt::Template(t) => body(&t.children, edits),
        Stmt::EmitExpr(e) => expr(&e.expr, edits),
        Stmt::EmitRaw(_) | Stmt::Continue(_) | Stmt::Break(_) => {}
        Stmt::ForLoop(f) => {
            expr(&f.iter, edits);
            f.filter_expr.iter().for_each(|e| expr(e, edits));
            body(&f.body, edits);
            body(&f.else_body, edits);
        }
        Stmt::IfCond(i) => {
            expr(&i.expr, edits);
            body(&i.true_body, edits);
            body(&i.false_body, edits);
        }
        Stmt::WithBlock(w) => {
            w.assignments.iter().for_each(|(_, e)| expr(e, edits));
            body(&w.body, edits);
        }
        Stmt::Set(s) => expr(&s.expr, edits),
        Stmt::SetBlock(s) => {
            s.filter.iter().for_each(|e| expr(e, edits));
            body(&s.body, edits);
        }
        Stmt::AutoEscape(a) => {
            expr(&a.enabled, edits);
            body(&a.body, edits);
        }
        Stmt::FilterBlock(f) => {
            expr(&f.filter, edits);
            body(&f.body, edits);
        }
        Stmt::Block(b) => body(&b.body, edits),
        Stmt::Import(i) => expr(&i.expr, edits),
        Stmt::FromImport(i) => expr(&i.expr, edits),
        Stmt::Extends(e) => expr(&e.name, edits),
        Stmt::Include(i) => expr(&i.name, edits),
        Stmt::Macro(m) => {
            m.defaults.iter().for_each(|e| expr(e, edits));
            body(&m.body, edits);
        }
        Stmt::CallBlock(c) => {
            expr(&c.call.expr, edits);
            c.call.args.iter().for_each(|a| expr(arg_expr(a), edits));
            c.macro_decl.defaults.iter().for_each(|e| expr(e, edits));
            body(&c.macro_decl.body, edits);
        }
        Stmt::Do(d) => {
            expr(&d.call.expr, edits);
            d.call.args.iter().for_each(|a| expr(arg_expr(a), edits));
        }
    }
}

fn arg_expr<'e, 'a>(arg: &'e CallArg<'a>) -> &'e Expr<'a> {
    match arg {
        CallArg::Pos(e) | CallArg::Kwarg(_, e) | CallArg::PosSplat(e) | CallArg::KwargSplat(e) => e,
    }
}

/// The operator a growing binary expression applies, if it is one.
fn growing(op: &BinOpKind) -> Option<&'static str> {
    match op {
        BinOpKind::Concat => Some("~"),
        BinOpKind::Add => Some("+"),
        BinOpKind::Mul => Some("*"),
        _ => None,
    }
}

/// The direct sub-expressions of `expr`.
fn children<'e, 'a>(expr: &'e Expr<'a>) -> Vec<&'e Expr<'a>> {
    match expr {
        Expr::Var(_) | Expr::Const(_) => Vec::new(),
        Expr::Slice(s) => std::iter::once(&s.expr)
            .chain(s.start.iter())
            .chain(s.stop.iter())
            .chain(s.step.iter())
            .collect(),
        Expr::UnaryOp(u) => vec![&u.expr],
        Expr::BinOp(b) => vec![&b.left, &b.right],
        Expr::Compare(c) => std::iter::once(&c.expr)
            .chain(c.ops.iter().map(|o| &o.expr))
            .collect(),
        Expr::IfExpr(i) => std::iter::once(&i.test_expr)
            .chain(std::iter::once(&i.true_expr))
            .chain(i.false_expr.iter())
            .collect(),
        Expr::Filter(f) => f.expr.iter().chain(f.args.iter().map(arg_expr)).collect(),
        Expr::Test(t) => std::iter::once(&t.expr)
            .chain(t.args.iter().map(arg_expr))
            .collect(),
        Expr::GetAttr(g) => vec![&g.expr],
        Expr::GetItem(g) => vec![&g.expr, &g.subscript_expr],
        Expr::Call(c) => std::iter::once(&c.expr)
            .chain(c.args.iter().map(arg_expr))
            .collect(),
        Expr::List(l) => l.items.iter().collect(),
        Expr::Map(m) => m.keys.iter().chain(m.values.iter()).collect(),
    }
}

/// The byte range of `expr`'s text: its span joined with its children's
/// (a filter's span starts at its `|`, after the value it filters), grown
/// over the parentheses a span leaves out so that the text is balanced.
fn extent(source: &str, expr: &Expr<'_>) -> (usize, usize) {
    let span = expr.span();
    let own = (span.start_offset as usize, span.end_offset as usize);
    let (start, end) = children(expr)
        .into_iter()
        .map(|c| extent(source, c))
        .fold(own, |(a, b), (c, d)| (a.min(c), b.max(d)));
    balance(source, start, end)
}

/// `[start, end)` grown to take in the openers of its unmatched closing
/// brackets (before it) and the closers of its unmatched openers (after
/// it), string literals skipped.
fn balance(source: &str, mut start: usize, mut end: usize) -> (usize, usize) {
    let bytes = source.as_bytes();
    let (mut depth, mut lowest) = (0i64, 0i64);
    let mut quote = None;
    let mut i = start;
    while i < end {
        let c = bytes[i];
        match quote {
            Some(_) if c == b'\\' => i += 1,
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == b'\'' || c == b'"' => quote = Some(c),
            None if b"([{".contains(&c) => depth += 1,
            None if b")]}".contains(&c) => {
                depth -= 1;
                lowest = lowest.min(depth);
            }
            None => {}
        }
        i += 1;
    }
    for _ in 0..-lowest {
        while start > 0 && bytes[start - 1].is_ascii_whitespace() {
            start -= 1;
        }
        if start > 0 && b"([{".contains(&bytes[start - 1]) {
            start -= 1;
        }
    }
    for _ in 0..(depth - lowest).max(0) {
        while end < bytes.len() && bytes[end].is_ascii_whitespace() {
            end += 1;
        }
        if end < bytes.len() && b")]}".contains(&bytes[end]) {
            end += 1;
        }
    }
    (start, end)
}

/// The source text of `expr`.
fn text<'s>(source: &'s str, expr: &Expr<'_>) -> &'s str {
    let (start, end) = extent(source, expr);
    &source[start..end]
}

/// `expr`'s text with its growing operators rewritten, or `None` when it
/// has none (or only between constants).
fn rewrite(source: &str, expr: &Expr<'_>) -> Option<String> {
    if let Expr::BinOp(b) = expr {
        let both_const = matches!((&b.left, &b.right), (Expr::Const(_), Expr::Const(_)));
        if let (Some(op), false) = (growing(&b.op), both_const) {
            let left = rewrite(source, &b.left).unwrap_or_else(|| text(source, &b.left).into());
            let right = rewrite(source, &b.right).unwrap_or_else(|| text(source, &b.right).into());
            return Some(format!("{GROW_FUNCTION}({op:?}, {left}, {right})"));
        }
    }
    let (start, end) = extent(source, expr);
    let mut kids = children(expr);
    kids.sort_by_key(|c| extent(source, c).0);
    let mut out = String::new();
    let mut at = start;
    let mut changed = false;
    for child in kids {
        let (s0, s1) = extent(source, child);
        let Some(new) = rewrite(source, child) else {
            continue;
        };
        // A child outside its parent's text (or overlapping a sibling)
        // cannot be spliced; the expression then fails when evaluated
        // rather than run unbounded.
        if s0 < at || s1 > end {
            let line = expr.span().start_line;
            return Some(format!("{GROW_FUNCTION}(\"?{line}\", 0, 0)"));
        }
        out.push_str(&source[at..s0]);
        out.push_str(&new);
        at = s1;
        changed = true;
    }
    if !changed {
        return None;
    }
    out.push_str(&source[at..end]);
    Some(out)
}

/// The three operators, compiled once in an environment of their own.
fn operators() -> &'static [Expression<'static, 'static>; 3] {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    static OPS: OnceLock<[Expression<'static, 'static>; 3]> = OnceLock::new();
    OPS.get_or_init(|| {
        let env = ENV.get_or_init(Environment::new);
        ["a ~ b", "a + b", "a * b"].map(|e| env.compile_expression(e).expect("operator parses"))
    })
}

/// The bytes `a op b` will take, before it is built (an error past the
/// render's bound).
fn result_weight(op: &str, a: &Value, b: &Value) -> Result<usize, Error> {
    let what = format!("operator `{op}`");
    let wa = bound::check_weight(&what, a)?;
    let wb = bound::check_weight(&what, b)?;
    let weight = if op == "*" {
        let count = |v: &Value| {
            (v.kind() == ValueKind::Number && v.is_integer())
                .then(|| v.as_i64().unwrap_or(i64::MAX).max(0) as usize)
        };
        match (count(a), count(b)) {
            (Some(n), None) => wb.saturating_mul(n),
            (None, Some(n)) => wa.saturating_mul(n),
            _ => 8,
        }
    } else {
        wa.saturating_add(wb)
    };
    if weight > bound::bytes_max() {
        return Err(bound::too_big(&what, format!("a result of {weight} bytes")));
    }
    Ok(weight)
}

/// [`GROW_FUNCTION`]: `a op b`, refused when its result would pass the
/// render's bound or the operators' sum would pass [`GROWN_PER_BOUND`]
/// times it.
pub fn grow(op: &str, a: Value, b: Value) -> Result<Value, Error> {
    let index = match op {
        "~" => 0,
        "+" => 1,
        "*" => 2,
        _ => {
            let reason = match op.strip_prefix('?') {
                Some(line) => {
                    format!("the expression on line {line} could not be put under the memory bound")
                }
                None => format!("{GROW_FUNCTION}: unknown operator {op:?}"),
            };
            return Err(Error::new(ErrorKind::InvalidOperation, reason));
        }
    };
    let weight = result_weight(op, &a, &b)?;
    let total = GROWN.with(|g| g.get()).saturating_add(weight);
    let total_max = bound::bytes_max().saturating_mul(GROWN_PER_BOUND);
    if total > total_max {
        return Err(bound::too_big(
            &format!("operator `{op}`"),
            format!("{total} bytes built by operators in all, over {total_max}"),
        ));
    }
    GROWN.with(|g| g.set(total));
    operators()[index].eval(minijinja::context! { a => a, b => b })
}

#[cfg(test)]
mod tests;
