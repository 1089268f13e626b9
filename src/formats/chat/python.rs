//! Python's ways of writing values, which chat templates (written for
//! Jinja2 under transformers) rely on: `json.dumps` as transformers'
//! `tojson` filter calls it, and `repr`, which Jinja2 uses to print floats,
//! lists and dicts.
//!
//! `dumps` matches `json.dumps(x, ensure_ascii=False, indent=None,
//! separators=None, sort_keys=False)` (the defaults of transformers' filter,
//! transformers/utils/chat_template_utils.py) and its options byte for
//! byte; Jinja's own `tojson` (and minijinja's) escape `<`, `>`, `&` and `'`
//! for HTML, which a prompt must not get. What Python does and this does
//! too: `", "` and `": "` between items and keys without an indent, `","`
//! and `": "` with one; a newline and the indent per level, and `[]`/`{}`
//! for empty containers; `"`, `\`, and control characters escaped (`\n`,
//! `\t`, ... or `\u00XX`, lowercase hex); with `ensure_ascii` everything
//! outside space..`~` as `\uXXXX` (UTF-16 surrogate pairs above U+FFFF);
//! floats as Python's `repr` (`1e+20`, `1e-05`, `2.0`); `sort_keys` by key;
//! integer map keys as strings. Undefined values, bytes and non-data
//! objects are refused, as Python raises `TypeError` for them. One
//! difference: a NaN or infinite float is written `null` (Python writes the
//! non-JSON `NaN`/`Infinity`).
//!
//! `repr` writes lists as `[1, 'a', None, True]` and dicts as `{'k': 1}`.
//! Strings take Python's quotes and escapes for ASCII and Latin-1 control
//! characters; other Unicode non-printables (format characters, unassigned
//! code points), which Python escapes, are written as they are. minijinja
//! has no tuples, so a Jinja2 tuple prints as a list here.

use minijinja::value::ValueKind;
use minijinja::{Error, ErrorKind, Value};
use serde::Serialize;
use std::io;

/// The options of `json.dumps` that transformers' `tojson` passes on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Options {
    /// Escape every character outside printable ASCII.
    pub ensure_ascii: bool,
    /// The indent of one level; `None` writes everything on one line.
    pub indent: Option<String>,
    /// (item separator, key separator); `None` takes Python's defaults.
    pub separators: Option<(String, String)>,
    /// Write map entries sorted by key.
    pub sort_keys: bool,
}

/// `json.dumps(value, **options)`.
pub fn dumps(value: &Value, options: &Options) -> Result<String, Error> {
    let data = plain(value, options.sort_keys)?;
    let mut out = super::bound::CappedText::new(super::bound::bytes_max());
    let mut ser = serde_json::Serializer::with_formatter(&mut out, PyFormatter::new(options));
    data.serialize(&mut ser)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    String::from_utf8(out.text)
        .map_err(|_| Error::new(ErrorKind::InvalidOperation, "tojson: wrote invalid UTF-8"))
}

/// Python's `repr(x)` of a float: the shortest digits that round-trip,
/// positional for exponents -4..16, else `d.ddde±XX` (two exponent digits
/// at least); an integral value keeps `.0`.
pub fn float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} always writes an exponent");
    let exp: i32 = exp.parse().expect("{:e} writes a decimal exponent");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let body = if (-4..16).contains(&exp) {
        positional(&digits, exp)
    } else {
        scientific(&digits, exp)
    };
    format!("{sign}{body}")
}

/// `d1d2...dn × 10^(exp - n + 1)` written without an exponent.
fn positional(digits: &str, exp: i32) -> String {
    if exp < 0 {
        let zeros = "0".repeat((-exp - 1) as usize);
        return format!("0.{zeros}{digits}");
    }
    let int_len = exp as usize + 1;
    if digits.len() <= int_len {
        let zeros = "0".repeat(int_len - digits.len());
        format!("{digits}{zeros}.0")
    } else {
        format!("{}.{}", &digits[..int_len], &digits[int_len..])
    }
}

/// `d.ddde±XX`, as Python's repr writes large and small floats.
fn scientific(digits: &str, exp: i32) -> String {
    let (first, rest) = digits.split_at(1);
    let point = if rest.is_empty() {
        String::new()
    } else {
        format!(".{rest}")
    };
    let exp_sign = if exp < 0 { '-' } else { '+' };
    format!("{first}{point}e{exp_sign}{:02}", exp.abs())
}

/// Python's `repr` of a template value.
pub fn repr(value: &Value) -> String {
    match value.kind() {
        ValueKind::Undefined => "Undefined".into(),
        ValueKind::None => "None".into(),
        ValueKind::Bool if value.is_true() => "True".into(),
        ValueKind::Bool => "False".into(),
        ValueKind::Number if !value.is_integer() => match f64::try_from(value.clone()) {
            Ok(x) => float_repr(x),
            Err(_) => value.to_string(),
        },
        ValueKind::String => str_repr(value.as_str().unwrap_or_default()),
        ValueKind::Seq => seq_repr(value).unwrap_or_else(|| value.to_string()),
        ValueKind::Map => map_repr(value).unwrap_or_else(|| value.to_string()),
        _ => value.to_string(),
    }
}

fn seq_repr(value: &Value) -> Option<String> {
    let items: Vec<String> = value.try_iter().ok()?.map(|v| repr(&v)).collect();
    Some(format!("[{}]", items.join(", ")))
}

fn map_repr(value: &Value) -> Option<String> {
    let mut items = Vec::new();
    for key in value.try_iter().ok()? {
        let item = value.get_item(&key).ok()?;
        items.push(format!("{}: {}", repr(&key), repr(&item)));
    }
    Some(format!("{{{}}}", items.join(", ")))
}

/// Python's `repr` of a str: single quotes unless the text holds `'` and
/// no `"`; backslash, the quote, `\n`, `\r`, `\t` escaped, other C0/C1
/// controls and U+00A0/U+00AD as `\xNN`.
fn str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if c < ' ' || ('\u{7f}'..='\u{a0}').contains(&c) || c == '\u{ad}' => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// A copy of `value` made of JSON data only (maps sorted by key when asked);
/// refuses what Python's json module cannot serialize.
fn plain(value: &Value, sort_keys: bool) -> Result<Value, Error> {
    match value.kind() {
        ValueKind::None | ValueKind::Bool | ValueKind::Number | ValueKind::String => {
            Ok(value.clone())
        }
        ValueKind::Seq => {
            let items: Result<Vec<Value>, Error> =
                value.try_iter()?.map(|v| plain(&v, sort_keys)).collect();
            Ok(Value::from(items?))
        }
        ValueKind::Map => plain_map(value, sort_keys),
        kind => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: a value of kind {kind} is not JSON serializable"),
        )),
    }
}

fn plain_map(value: &Value, sort_keys: bool) -> Result<Value, Error> {
    let mut entries = Vec::new();
    for key in value.try_iter()? {
        let item = plain(&value.get_item(&key)?, sort_keys)?;
        entries.push((key, item));
    }
    if sort_keys {
        entries.sort_by(|a, b| a.0.cmp(&b.0));
    }
    Ok(Value::from_iter(entries))
}

/// serde_json output shaped as Python's json module shapes it.
struct PyFormatter {
    ensure_ascii: bool,
    indent: Option<Vec<u8>>,
    item_separator: Vec<u8>,
    key_separator: Vec<u8>,
    level: usize,
    has_value: bool,
}

impl PyFormatter {
    fn new(options: &Options) -> PyFormatter {
        let default_item = if options.indent.is_some() { "," } else { ", " };
        let (item, key) = match &options.separators {
            Some((item, key)) => (item.as_str(), key.as_str()),
            None => (default_item, ": "),
        };
        PyFormatter {
            ensure_ascii: options.ensure_ascii,
            indent: options.indent.as_ref().map(|s| s.as_bytes().to_vec()),
            item_separator: item.as_bytes().to_vec(),
            key_separator: key.as_bytes().to_vec(),
            level: 0,
            has_value: false,
        }
    }

    /// A newline and the indent of the current level (nothing on one line).
    fn newline<W: ?Sized + io::Write>(&self, w: &mut W) -> io::Result<()> {
        let Some(indent) = &self.indent else {
            return Ok(());
        };
        w.write_all(b"\n")?;
        for _ in 0..self.level {
            w.write_all(indent)?;
        }
        Ok(())
    }

    fn open<W: ?Sized + io::Write>(&mut self, w: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.level += 1;
        self.has_value = false;
        w.write_all(bracket)
    }

    fn close<W: ?Sized + io::Write>(&mut self, w: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.level -= 1;
        if self.has_value {
            self.newline(w)?;
        }
        w.write_all(bracket)
    }

    fn item<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if !first {
            w.write_all(&self.item_separator)?;
        }
        self.newline(w)
    }
}

impl serde_json::ser::Formatter for PyFormatter {
    fn write_f64<W: ?Sized + io::Write>(&mut self, w: &mut W, value: f64) -> io::Result<()> {
        w.write_all(float_repr(value).as_bytes())
    }

    fn write_f32<W: ?Sized + io::Write>(&mut self, w: &mut W, value: f32) -> io::Result<()> {
        self.write_f64(w, f64::from(value))
    }

    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        if !self.ensure_ascii {
            return w.write_all(fragment.as_bytes());
        }
        for c in fragment.chars() {
            if c <= '~' {
                w.write_all(&[c as u8])?;
                continue;
            }
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                write!(w, "\\u{unit:04x}")?;
            }
        }
        Ok(())
    }

    fn begin_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.open(w, b"[")
    }

    fn end_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.close(w, b"]")
    }

    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.item(w, first)
    }

    fn end_array_value<W: ?Sized + io::Write>(&mut self, _w: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.open(w, b"{")
    }

    fn end_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.close(w, b"}")
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.item(w, first)
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(&self.key_separator)
    }

    fn end_object_value<W: ?Sized + io::Write>(&mut self, _w: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_as_python_repr() {
        // Each pair: the float and Python 3's repr of it.
        let cases = [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (2.5, "2.5"),
            (0.1, "0.1"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789.125, "123456789.125"),
            (1e20, "1e+20"),
            (-2.5e-7, "-2.5e-07"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
        ];
        for (x, want) in cases {
            assert_eq!(float_repr(x), want, "repr({x:e})");
        }
    }

    fn dumps_default(v: Value) -> String {
        dumps(&v, &Options::default()).unwrap()
    }

    #[test]
    fn escapes_as_python() {
        let v = Value::from("q\"b\\n\nt\tc\u{1}d\u{7f}<>&'é😀");
        let want = "\"q\\\"b\\\\n\\nt\\tc\\u0001d\u{7f}<>&'é😀\"";
        assert_eq!(dumps_default(v.clone()), want);
        let ascii = Options {
            ensure_ascii: true,
            ..Options::default()
        };
        assert_eq!(
            dumps(&v, &ascii).unwrap(),
            r#""q\"b\\n\nt\tc\u0001d\u007f<>&'\u00e9\ud83d\ude00""#
        );
    }

    #[test]
    fn indent_and_separators_as_python() {
        let v: Value = serde_json::from_str::<Value>(r#"{"a": [1, {}], "b": []}"#).unwrap();
        assert_eq!(dumps_default(v.clone()), r#"{"a": [1, {}], "b": []}"#);
        let indent = Options {
            indent: Some("  ".into()),
            ..Options::default()
        };
        assert_eq!(
            dumps(&v, &indent).unwrap(),
            "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}"
        );
        let compact = Options {
            separators: Some((",".into(), ":".into())),
            ..Options::default()
        };
        assert_eq!(dumps(&v, &compact).unwrap(), r#"{"a":[1,{}],"b":[]}"#);
    }

    #[test]
    fn repr_as_python() {
        let v: Value = serde_json::from_str(
            r#"[1, 2.5, "it's", "a\"b'c", "t\tn\n\u0001", null, true, {"k": []}]"#,
        )
        .unwrap();
        assert_eq!(
            repr(&v),
            r#"[1, 2.5, "it's", 'a"b\'c', 't\tn\n\x01', None, True, {'k': []}]"#
        );
    }

    #[test]
    fn refuses_undefined() {
        assert!(dumps(&Value::UNDEFINED, &Options::default()).is_err());
    }
}
