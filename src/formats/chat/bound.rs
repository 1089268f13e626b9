//! The memory bound of one chat-template render, beside minijinja's fuel
//! bound (which counts instructions, not bytes): one instruction such as
//! `x | indent(10**15)` or `tojson(indent=10**15)` asks for gigabytes.
//!
//! The bound, [`render_bytes_max`]: [`RENDER_BYTES_BASE`] plus
//! [`RENDER_BYTES_PER_INPUT_BYTE`] times the conversation's bytes. A real
//! template prints each message once or twice with a few hundred bytes of
//! markup around it, and a whole context window of text is well under a
//! MiB, so the base covers every real template's markup and the multiple
//! covers a template that prints the conversation a few times; a double
//! loop over the messages (quadratic) or a huge repetition does not fit.
//!
//! What is held to it during a render (a thread-local budget, set by
//! [`Budget::enter`] for the render on this thread):
//! - the rendered text (a writer that fails past the bound);
//! - every value printed, inside `{% set %}` captures and macro bodies too
//!   (the formatter counts them, and weighs a list or dict before writing
//!   its repr);
//! - the arguments and result of every filter or Python method that can
//!   build a large value ([`weigh`] walks a value with a budget, so a lazy
//!   `[x] * 10**12` is refused after `bytes_max` elements, not materialized),
//!   width arguments (`indent`, `tojson(indent=)`, `format` widths, `slice`
//!   and `batch` counts) at most [`WIDTH_MAX`], and the growth of `replace`
//!   and `join` computed before they run.
//!
//! minijinja's own operators (`~`, `+`, `*`) have no hook; the template is
//! rewritten before it is compiled so that they call a bounded function
//! (super::operators). Raw template text emitted inside a `{% set %}`
//! capture is bounded by the template's size per capture.

use minijinja::value::{Rest, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};
use std::cell::Cell;

/// Rendered bytes every conversation may take, whatever its size.
pub const RENDER_BYTES_BASE: usize = 16 << 20;
/// Rendered bytes allowed per byte of the conversation (roles, contents).
pub const RENDER_BYTES_PER_INPUT_BYTE: usize = 16;
/// Largest width or count argument (`indent`, `tojson(indent=)`, format
/// widths, `slice`, `batch`); real templates use 2 or 4.
pub const WIDTH_MAX: usize = 4096;

/// The bound for a conversation of `input_bytes`.
pub fn render_bytes_max(input_bytes: usize) -> usize {
    RENDER_BYTES_BASE.saturating_add(input_bytes.saturating_mul(RENDER_BYTES_PER_INPUT_BYTE))
}

thread_local! {
    /// (bytes_max, bytes printed so far) of the render on this thread.
    static BUDGET: Cell<(usize, usize)> = const { Cell::new((RENDER_BYTES_BASE, 0)) };
}

/// The budget of the render running on this thread; dropping it restores
/// the one before.
pub struct Budget {
    before: (usize, usize),
}

impl Budget {
    /// Starts a render bounded by `bytes_max` on this thread.
    pub fn enter(bytes_max: usize) -> Budget {
        Budget {
            before: BUDGET.with(|b| b.replace((bytes_max, 0))),
        }
    }
}

impl Drop for Budget {
    fn drop(&mut self) {
        BUDGET.with(|b| b.set(self.before));
    }
}

/// The bound of the render on this thread.
pub fn bytes_max() -> usize {
    BUDGET.with(|b| b.get().0)
}

pub fn too_big(what: &str, detail: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!(
            "{what}: {detail}, over the render's memory bound of {} bytes",
            bytes_max()
        ),
    )
}

/// Counts `bytes` more printed text (captures included) against the bound.
pub fn count_printed(bytes: usize) -> Result<(), Error> {
    let (max, used) = BUDGET.with(|b| b.get());
    let used = used.saturating_add(bytes);
    if used > max {
        return Err(too_big("printed text", format!("{used} bytes")));
    }
    BUDGET.with(|b| b.set((max, used)));
    Ok(())
}

/// A value's size in bytes, roughly (string bytes, 8 per other element),
/// walking at most `limit` of it: `Err` once it is over `limit`.
pub fn weigh(value: &Value, limit: usize) -> Result<usize, usize> {
    let mut total = 0usize;
    weigh_into(value, limit, &mut total, 0)?;
    Ok(total)
}

fn weigh_into(value: &Value, limit: usize, total: &mut usize, depth: u32) -> Result<(), usize> {
    let add = |total: &mut usize, n: usize| {
        *total = total.saturating_add(n);
        if *total > limit {
            Err(*total)
        } else {
            Ok(())
        }
    };
    match value.kind() {
        ValueKind::String => add(total, 8 + value.as_str().map_or(0, str::len)),
        ValueKind::Seq | ValueKind::Iterable | ValueKind::Map if depth < 64 => {
            add(total, 8)?;
            let Ok(items) = value.try_iter() else {
                return Ok(());
            };
            let is_map = value.kind() == ValueKind::Map;
            for item in items {
                weigh_into(&item, limit, total, depth + 1)?;
                if is_map {
                    let v = value.get_item(&item).unwrap_or_default();
                    weigh_into(&v, limit, total, depth + 1)?;
                }
            }
            Ok(())
        }
        _ => add(total, 8),
    }
}

/// A value's weight ([`weigh`]); one heavier than the bound is refused
/// (`what` names it).
pub fn check_weight(what: &str, value: &Value) -> Result<usize, Error> {
    weigh(value, bytes_max()).map_err(|w| too_big(what, format!("a value of over {w} bytes")))
}

/// Refuses a width or count over [`WIDTH_MAX`].
pub fn check_width(what: &str, width: Option<i64>) -> Result<(), Error> {
    match width {
        Some(w) if w > WIDTH_MAX as i64 => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("{what}: width {w} is over the limit of {WIDTH_MAX}"),
        )),
        _ => Ok(()),
    }
}

/// Refuses a format string (`%10s` or `{:>10}` styles) with a width or
/// precision over [`WIDTH_MAX`].
pub fn check_format_widths(what: &str, format: &str) -> Result<(), Error> {
    let mut rest = format;
    while let Some(at) = rest.find(['%', '{']) {
        let after = &rest[at + 1..];
        let spec_len = if rest.as_bytes()[at] == b'%' {
            after.find(|c: char| !"-+ #0123456789.*".contains(c))
        } else {
            after.find('}')
        }
        .unwrap_or(after.len());
        for run in after[..spec_len].split(|c: char| !c.is_ascii_digit()) {
            if !run.is_empty() {
                check_width(what, Some(run.parse::<i64>().unwrap_or(i64::MAX)))?;
            }
        }
        rest = &after[spec_len..];
    }
    Ok(())
}

/// An integer argument, if `v` is one.
fn int_arg(v: Option<&Value>) -> Option<i64> {
    v.filter(|v| v.kind() == ValueKind::Number && v.is_integer())
        .map(|v| v.as_i64().unwrap_or(i64::MAX))
}

/// A keyword argument of a filter call's arguments.
fn kwarg(args: &[Value], name: &str) -> Option<Value> {
    let last = args.last().filter(|v| v.is_kwargs())?;
    last.get_attr(name).ok().filter(|v| !v.is_undefined())
}

/// Bytes `replace(from, to)` adds to `s` (`count` replacements at most).
pub fn replace_growth(s: &str, from: &str, to: &str, count: Option<usize>) -> usize {
    if to.len() <= from.len() {
        return 0;
    }
    let hits = if from.is_empty() {
        s.chars().count() + 1
    } else {
        s.matches(from).count()
    };
    hits.min(count.unwrap_or(usize::MAX))
        .saturating_mul(to.len() - from.len())
}

/// Bytes of `joiner.join(items)`, roughly (items printed as 8 bytes unless
/// strings), over the bound is an error.
pub fn check_join(what: &str, items: &Value, joiner: &str) -> Result<(), Error> {
    let mut total = 0usize;
    let Ok(iter) = items.try_iter() else {
        return Ok(());
    };
    for item in iter {
        let n = item.as_str().map_or(8, str::len) + joiner.len();
        total = total.saturating_add(n);
        if total > bytes_max() {
            return Err(too_big(
                what,
                format!("a joined text of over {total} bytes"),
            ));
        }
    }
    Ok(())
}

/// The checks one filter's arguments get before it runs, beyond weighing.
fn precheck(name: &str, args: &[Value]) -> Result<(), Error> {
    let what = format!("filter `{name}`");
    match name {
        "indent" => {
            let width = int_arg(args.get(1)).or(int_arg(kwarg(args, "width").as_ref()));
            check_width(&what, width)?;
            let lines = args
                .first()
                .and_then(Value::as_str)
                .map_or(1, |s| s.matches('\n').count() + 1);
            let growth = lines.saturating_mul(width.unwrap_or(4).max(0) as usize);
            if growth > bytes_max() {
                return Err(too_big(&what, format!("{growth} bytes of indent")));
            }
        }
        "format" => {
            if let Some(f) = args.first().and_then(Value::as_str) {
                check_format_widths(&what, f)?;
            }
        }
        "slice" | "batch" => check_width(&what, int_arg(args.get(1)))?,
        "replace" => {
            let text = |i: usize| args.get(i).and_then(Value::as_str).unwrap_or("");
            let growth = replace_growth(text(0), text(1), text(2), None);
            if growth > bytes_max() {
                return Err(too_big(&what, format!("{growth} more bytes")));
            }
        }
        "join" => {
            let joiner = args.get(1).and_then(Value::as_str).unwrap_or("");
            if let Some(items) = args.first() {
                check_join(&what, items, joiner)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// minijinja's filters that can build a value larger than their input,
/// each re-registered behind [`precheck`], a weight check of every argument
/// and of the result.
fn builtin_filters() -> Vec<(&'static str, Value)> {
    use minijinja::filters as f;
    vec![
        ("indent", Value::from_function(f::indent)),
        ("format", Value::from_function(f::format)),
        ("replace", Value::from_function(f::replace)),
        ("join", Value::from_function(f::join)),
        ("slice", Value::from_function(f::slice)),
        ("batch", Value::from_function(f::batch)),
        ("list", Value::from_function(f::list)),
        ("sort", Value::from_function(f::sort)),
        ("dictsort", Value::from_function(f::dictsort)),
        ("unique", Value::from_function(f::unique)),
        ("reverse", Value::from_function(f::reverse)),
        ("string", Value::from_function(f::string)),
        ("pprint", Value::from_function(f::pprint)),
        ("escape", Value::from_function(f::escape)),
        ("e", Value::from_function(f::escape)),
        ("lines", Value::from_function(f::lines)),
        ("split", Value::from_function(f::split)),
        ("items", Value::from_function(f::items)),
        ("map", Value::from_function(f::map)),
        ("select", Value::from_function(f::select)),
        ("reject", Value::from_function(f::reject)),
        ("groupby", Value::from_function(f::groupby)),
        ("chain", Value::from_function(f::chain)),
        ("zip", Value::from_function(f::zip)),
    ]
}

/// Replaces minijinja's growing filters in `env` by bounded ones.
pub fn guard_filters(env: &mut Environment<'static>) {
    for (name, original) in builtin_filters() {
        env.add_filter(name, move |state: &State, args: Rest<Value>| {
            let what = format!("filter `{name}`");
            for arg in args.iter() {
                check_weight(&what, arg)?;
            }
            precheck(name, &args)?;
            let out = original.call(state, &args)?;
            check_weight(&what, &out)?;
            Ok(out)
        });
    }
}

/// The checks a Python string method (minijinja-contrib's pycompat) gets
/// before it runs, beyond weighing its arguments.
pub fn check_method(value: &Value, method: &str, args: &[Value]) -> Result<(), Error> {
    let what = format!("method `{method}`");
    for arg in args {
        check_weight(&what, arg)?;
    }
    let s = value.as_str().unwrap_or("");
    let text = |i: usize| args.get(i).and_then(Value::as_str).unwrap_or("");
    match method {
        "format" => check_format_widths(&what, s),
        "join" => match args.first() {
            Some(items) => check_join(&what, items, s),
            None => Ok(()),
        },
        "replace" => {
            let count = int_arg(args.get(2)).and_then(|c| usize::try_from(c).ok());
            let growth = replace_growth(s, text(0), text(1), count);
            if growth > bytes_max() {
                return Err(too_big(&what, format!("{growth} more bytes")));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// An output sink that refuses to grow past `bytes_max`.
pub struct CappedText {
    pub text: Vec<u8>,
    bytes_max: usize,
}

impl CappedText {
    pub fn new(bytes_max: usize) -> CappedText {
        CappedText {
            text: Vec::new(),
            bytes_max,
        }
    }
}

impl std::io::Write for CappedText {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.text.len().saturating_add(buf.len()) > self.bytes_max {
            return Err(std::io::Error::other(format!(
                "the rendered text would exceed the render's memory bound of {} bytes",
                self.bytes_max
            )));
        }
        self.text.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
