//! Chat templates: a model's Jinja template turning a conversation into the
//! prompt text it was trained on, rendered exactly as transformers'
//! `apply_chat_template(..., tokenize=False)` renders it.
//!
//! Where the template comes from (transformers' rules): `chat_template.jinja`
//! in the model directory if present (newer transformers save it there, and
//! it wins over the config), else `chat_template` in tokenizer_config.json,
//! a string or a list of `{name, template}` of which "default" is used.
//! `bos_token`/`eos_token` come from tokenizer_config.json, as strings or
//! AddedToken objects (`{"content": ...}`).
//!
//! The environment mirrors transformers' (`_compile_jinja_template` in
//! transformers/utils/chat_template_utils.py): `trim_blocks`,
//! `lstrip_blocks`, loop controls, the `raise_exception`, `strftime_now`
//! and `tojson` helpers, and Python's string/dict methods (`.strip()`,
//! `.split()`, `.items()`, ...) through minijinja-contrib's pycompat, with
//! Python's whitespace for the no-argument `strip`/`lstrip`/`rstrip`/
//! `split` and the `trim` filter. Printed values follow Python's `str`:
//! `True`, `False`, `None`, float reprs. The render context is transformers':
//! `messages`, `add_generation_prompt`, `tools` and `documents` (both None),
//! and the special tokens the model has (an absent one stays undefined).
//!
//! Invariants: a template is compiled once, when loaded, so a syntax error
//! surfaces there; every render runs on a fuel budget
//! ([`RENDER_FUEL_MAX`]), so a hostile template cannot spin forever; an
//! empty conversation is refused, as transformers refuses it; every render
//! also runs under a memory bound ([`bound`]: the rendered text, printed
//! values, filter arguments and results, width arguments), so a hostile
//! template (`indent(10**15)`, `tojson(indent=10**15)`, a huge format width,
//! a large string printed many times, a loop over the messages inside a
//! loop over them) is an error naming the template's source, not an abort.

pub mod bound;
pub mod operators;
mod python;
pub mod reasoning;
pub mod tool_calls;

use crate::error::{Error, Result};
use minijinja::value::{Kwargs, ValueKind};
use minijinja::{AutoEscape, Environment, ErrorKind, Output, State, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The template file newer transformers save beside tokenizer_config.json.
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// Instructions one render may execute (minijinja fuel). Real templates
/// spend a few hundred per message; this allows conversations of tens of
/// thousands of messages and stops a runaway loop within about a second.
pub const RENDER_FUEL_MAX: u64 = 50_000_000;

/// The name the template has inside its environment (errors give lines).
const TEMPLATE_NAME: &str = "chat_template";

/// One chat message (OpenAI shape: role, content string).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Message {
    /// "system", "user", "assistant", "tool", ... as the template expects.
    pub role: String,
    /// The message text.
    pub content: String,
}

impl Message {
    /// A message of `role` saying `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// What a render takes besides the messages: transformers'
/// `apply_chat_template` arguments.
#[derive(Clone, Copy, Debug, Default)]
pub struct RenderOptions<'a> {
    /// Open the assistant's turn at the end.
    pub add_generation_prompt: bool,
    /// The tools offered (a list of `{"type": "function", "function":
    /// {...}}`), or None.
    pub tools: Option<&'a serde_json::Value>,
    /// Extra template variables (`chat_template_kwargs`): they may replace
    /// the special tokens (as in transformers), never `messages`, `tools`,
    /// `documents` or `add_generation_prompt`.
    pub kwargs: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

/// The special tokens a template may print; `None` where the model has none.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpecialTokens {
    /// The beginning-of-sequence text (`bos_token`).
    pub bos_token: Option<String>,
    /// The end-of-sequence text (`eos_token`).
    pub eos_token: Option<String>,
}

/// A compiled chat template with the special tokens it renders.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    tokens: SpecialTokens,
    origin: String,
    /// A tighter memory bound than [`bound::render_bytes_max`], if set.
    bytes_max: Option<usize>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("origin", &self.origin)
            .field("tokens", &self.tokens)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// The model's template from dir/tokenizer_config.json: `chat_template`
    /// as a plain string, or the list-of-named-templates form
    /// (`[{"name": "default", "template": ...}, ...]`, "default" is used);
    /// `dir/chat_template.jinja` takes precedence, as in transformers.
    /// `bos_token`/`eos_token` are read as a string or as an AddedToken
    /// object `{"content": ...}`. Ok(None) when the model has no template.
    pub fn from_model_dir(dir: &Path) -> Result<Option<ChatTemplate>> {
        let config = TokenizerConfig::read(dir)?;
        let tokens = match &config {
            Some(c) => c.special_tokens()?,
            None => SpecialTokens::default(),
        };
        let file = dir.join(CHAT_TEMPLATE_FILE);
        if dir.is_dir() && file.is_file() {
            let source = crate::fs::read_to_string(&file, crate::fs::read::JSON_SIDE_FILE)?;
            return ChatTemplate::new(source, tokens, file.display().to_string()).map(Some);
        }
        match config.map(|c| c.template()).transpose()?.flatten() {
            Some((source, origin)) => ChatTemplate::new(source, tokens, origin).map(Some),
            None => Ok(None),
        }
    }

    /// `--chat-template FILE`: the file's text is the template; bos/eos
    /// still come from dir's tokenizer_config.json when present.
    pub fn from_file(path: &Path, dir: &Path) -> Result<ChatTemplate> {
        let source = crate::fs::read_to_string(path, crate::fs::read::JSON_SIDE_FILE)?;
        let tokens = match TokenizerConfig::read(dir)? {
            Some(c) => c.special_tokens()?,
            None => SpecialTokens::default(),
        };
        ChatTemplate::new(source, tokens, path.display().to_string())
    }

    /// Compiles `source` (errors name `origin`, where it came from).
    pub fn new(source: String, tokens: SpecialTokens, origin: String) -> Result<ChatTemplate> {
        let mut env = environment();
        if let Err(e) = env.add_template_owned(TEMPLATE_NAME, operators::bound_operators(&source)) {
            return Err(template_error(&origin, &e));
        }
        Ok(ChatTemplate {
            env,
            source,
            tokens,
            origin,
            bytes_max: None,
        })
    }

    /// The same template under tighter bounds: `fuel` instructions and
    /// `bytes_max` bytes per render (the fuzz target's tiny ones).
    pub fn with_limits(mut self, fuel: u64, bytes_max: usize) -> ChatTemplate {
        self.env.set_fuel(Some(fuel));
        self.bytes_max = Some(bytes_max);
        self
    }

    /// Renders `messages` (add_generation_prompt as transformers' flag).
    /// Errors (template syntax, raise_exception from the template, unknown
    /// filter) name the template's source and the reason.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let messages: Vec<serde_json::Value> = messages
            .iter()
            .map(|m| serde_json::json!({"role": m.role, "content": m.content}))
            .collect();
        let opts = RenderOptions {
            add_generation_prompt,
            ..RenderOptions::default()
        };
        self.render_json(&messages, &opts)
    }

    /// Renders messages as the client sent them (any fields: `tool_calls`,
    /// `tool_call_id`, `name`, a null `content`, ...) with transformers'
    /// other arguments: `tools`, and the extra keyword arguments it passes
    /// into the template (`chat_template_kwargs`: `enable_thinking`, ...).
    pub fn render_json(
        &self,
        messages: &[serde_json::Value],
        opts: &RenderOptions<'_>,
    ) -> Result<String> {
        if messages.is_empty() {
            return Err(Error::ChatTemplate {
                origin: self.origin.clone(),
                reason: "cannot render an empty conversation (transformers refuses one too)".into(),
            });
        }
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| template_error(&self.origin, &e))?;
        let input: usize = messages
            .iter()
            .chain(opts.tools)
            .map(|m| m.to_string().len())
            .sum();
        let bytes_max = bound::render_bytes_max(input).min(self.bytes_max.unwrap_or(usize::MAX));
        let _budget = bound::Budget::enter(bytes_max);
        let _grown = operators::Grown::enter();
        let mut out = bound::CappedText::new(bytes_max);
        template
            .render_captured_to(self.context(messages, opts), &mut out)
            .map_err(|e| template_error(&self.origin, &e))?;
        String::from_utf8(out.text).map_err(|_| Error::ChatTemplate {
            origin: self.origin.clone(),
            reason: "the rendered text is not UTF-8".into(),
        })
    }

    /// The variables the template reads from its context (`messages`,
    /// `enable_thinking`, ...): what a request can switch.
    pub fn variables(&self) -> std::collections::HashSet<String> {
        self.env
            .get_template(TEMPLATE_NAME)
            .map(|t| t.undeclared_variables(false))
            .unwrap_or_default()
            .into_iter()
            .filter(|v| v != operators::GROW_FUNCTION)
            .collect()
    }

    /// The template's text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Where the template came from (a file, or a tokenizer_config field).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The special tokens the template renders.
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.tokens
    }

    /// transformers' render context: the special tokens the model has
    /// (an absent one stays undefined), the keyword arguments over them,
    /// then the conversation, the flag, `tools` (None without any) and
    /// `documents` (None), which no keyword argument replaces.
    fn context(&self, messages: &[serde_json::Value], opts: &RenderOptions<'_>) -> Value {
        let mut ctx = BTreeMap::new();
        if let Some(bos) = &self.tokens.bos_token {
            ctx.insert("bos_token", Value::from(bos.as_str()));
        }
        if let Some(eos) = &self.tokens.eos_token {
            ctx.insert("eos_token", Value::from(eos.as_str()));
        }
        // The bounded operators' function cannot be shadowed by a kwarg.
        let kwargs = opts.kwargs.into_iter().flatten();
        for (k, v) in kwargs.filter(|(k, _)| k.as_str() != operators::GROW_FUNCTION) {
            ctx.insert(k.as_str(), Value::from_serialize(v));
        }
        ctx.insert("messages", Value::from_serialize(messages));
        ctx.insert(
            "add_generation_prompt",
            Value::from(opts.add_generation_prompt),
        );
        let tools = opts.tools.map_or(Value::from(()), Value::from_serialize);
        ctx.insert("tools", tools);
        ctx.insert("documents", Value::from(()));
        Value::from(ctx)
    }
}

/// tokenizer_config.json of a model directory, parsed.
struct TokenizerConfig {
    path: PathBuf,
    json: serde_json::Value,
}

impl TokenizerConfig {
    /// dir/tokenizer_config.json, or None if the model has none.
    fn read(dir: &Path) -> Result<Option<TokenizerConfig>> {
        let Some(doc) = crate::formats::model_files::read(dir, "tokenizer_config.json")? else {
            return Ok(None);
        };
        let (path, text) = (doc.path, doc.text);
        let json = serde_json::from_str(&text)
            .map_err(|e| Error::config(&path, "(file)", format!("not valid JSON: {e}")))?;
        Ok(Some(TokenizerConfig { path, json }))
    }

    fn special_tokens(&self) -> Result<SpecialTokens> {
        Ok(SpecialTokens {
            bos_token: self.token("bos_token")?,
            eos_token: self.token("eos_token")?,
        })
    }

    /// A special token written as a string or as an AddedToken object.
    fn token(&self, field: &str) -> Result<Option<String>> {
        use serde_json::Value as J;
        match self.json.get(field) {
            None | Some(J::Null) => Ok(None),
            Some(J::String(s)) => Ok(Some(s.clone())),
            Some(J::Object(o)) => match o.get("content") {
                Some(J::String(s)) => Ok(Some(s.clone())),
                _ => Err(Error::config(
                    &self.path,
                    field,
                    "an AddedToken object without a string `content`",
                )),
            },
            Some(other) => Err(Error::config(
                &self.path,
                field,
                format!("{other} is neither a string nor an AddedToken object"),
            )),
        }
    }

    /// The `chat_template` field: (source, origin), or None if absent.
    fn template(&self) -> Result<Option<(String, String)>> {
        use serde_json::Value as J;
        let origin = if crate::formats::gguf::is_gguf(&self.path) {
            format!(
                "{} (GGUF metadata tokenizer.chat_template)",
                self.path.display()
            )
        } else {
            format!("{} (field `chat_template`)", self.path.display())
        };
        match self.json.get("chat_template") {
            None | Some(J::Null) => Ok(None),
            Some(J::String(s)) => Ok(Some((s.clone(), origin))),
            Some(J::Array(list)) => self.default_of(list).map(Some),
            Some(other) => Err(Error::config(
                &self.path,
                "chat_template",
                format!(
                    "{} is neither a string nor a list of named templates",
                    kind_of(other)
                ),
            )),
        }
    }

    /// The template named "default" of the list form (the last one, as
    /// transformers builds a dict from the list).
    fn default_of(&self, list: &[serde_json::Value]) -> Result<(String, String)> {
        let mut names = Vec::new();
        let mut default = None;
        for (i, entry) in list.iter().enumerate() {
            let name = entry.get("name").and_then(|v| v.as_str());
            let template = entry.get("template").and_then(|v| v.as_str());
            let (Some(name), Some(template)) = (name, template) else {
                return Err(Error::config(
                    &self.path,
                    "chat_template",
                    format!("entry {i} is not an object with string `name` and `template`"),
                ));
            };
            if name == "default" {
                default = Some(template.to_string());
            }
            names.push(name.to_string());
        }
        let origin = format!(
            "{} (field `chat_template`, the template named \"default\")",
            self.path.display()
        );
        default.map(|t| (t, origin)).ok_or_else(|| {
            Error::config(
                &self.path,
                "chat_template",
                format!("a list of named templates with none named \"default\" (names: {names:?})"),
            )
        })
    }
}

/// A JSON value's type, for error messages.
fn kind_of(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
    }
}

/// The crate error for a minijinja error: the kind, the detail, the line,
/// and the causes (an error raised inside a macro or filter call).
fn template_error(origin: &str, e: &minijinja::Error) -> Error {
    let mut reason = match e.detail() {
        Some(detail) => format!("{}: {detail}", e.kind()),
        None => e.kind().to_string(),
    };
    if let Some(line) = e.line() {
        reason.push_str(&format!(" (line {line})"));
    }
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        reason.push_str(&format!("; caused by: {c}"));
        cause = c.source();
    }
    Error::ChatTemplate {
        origin: origin.to_string(),
        reason,
    }
}

/// The environment transformers compiles templates in, with its helpers.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_debug(false);
    env.set_fuel(Some(RENDER_FUEL_MAX));
    env.set_unknown_method_callback(python_method);
    env.set_formatter(python_format);
    bound::guard_filters(&mut env);
    env.add_function("raise_exception", raise_exception);
    env.add_function(operators::GROW_FUNCTION, operators::grow);
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    env.add_filter("trim", trim);
    env
}

/// `raise_exception(message)`: the template refuses the conversation.
fn raise_exception(message: Value) -> std::result::Result<Value, minijinja::Error> {
    let text = match message.as_str() {
        Some(s) => s.to_string(),
        None => message.to_string(),
    };
    Err(minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("the template raised an exception: {text}"),
    ))
}

/// `strftime_now(format)`: the local time now, formatted as C's strftime.
fn strftime_now(format: &str) -> std::result::Result<Value, minijinja::Error> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item<'_>> = StrftimeItems::new(format).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: {format:?} is not a valid strftime format"),
        ));
    }
    let now = chrono::Local::now();
    Ok(Value::from(
        now.format_with_items(items.into_iter()).to_string(),
    ))
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, options as keyword arguments.
fn tojson(value: &Value, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    bound::check_weight("filter `tojson`", value)?;
    let options = python::Options {
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        indent: indent_of(kwargs.get::<Option<Value>>("indent")?)?,
        separators: separators_of(kwargs.get::<Option<Value>>("separators")?)?,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    Ok(Value::from_safe_string(python::dumps(value, &options)?))
}

/// json.dumps' `indent`: a count of spaces (negative: none) or a string.
fn indent_of(indent: Option<Value>) -> std::result::Result<Option<String>, minijinja::Error> {
    let Some(indent) = indent.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    if let Some(s) = indent.as_str() {
        bound::check_width("tojson: indent", Some(s.len() as i64))?;
        return Ok(Some(s.to_string()));
    }
    match indent.as_i64() {
        Some(n) => {
            bound::check_width("tojson: indent", Some(n))?;
            Ok(Some(" ".repeat(n.max(0) as usize)))
        }
        None => Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: indent {indent} is neither an integer nor a string"),
        )),
    }
}

/// json.dumps' `separators`: (item separator, key separator).
fn separators_of(
    separators: Option<Value>,
) -> std::result::Result<Option<(String, String)>, minijinja::Error> {
    let Some(seps) = separators.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    let bad = || {
        minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: separators {seps} is not a pair of strings"),
        )
    };
    let parts: Vec<Value> = seps.try_iter().map_err(|_| bad())?.collect();
    match parts.as_slice() {
        [item, key] => match (item.as_str(), key.as_str()) {
            (Some(item), Some(key)) => Ok(Some((item.to_string(), key.to_string()))),
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

/// Python's `str.isspace`: Rust's whitespace plus U+001C..U+001F.
fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's methods on values: the no-argument strip family and `split()`
/// with Python's whitespace, everything else from minijinja-contrib.
fn python_method(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> std::result::Result<Value, minijinja::Error> {
    if let (Some(s), []) = (value.as_str(), args) {
        match method {
            "strip" => return Ok(Value::from(s.trim_matches(is_python_space))),
            "lstrip" => return Ok(Value::from(s.trim_start_matches(is_python_space))),
            "rstrip" => return Ok(Value::from(s.trim_end_matches(is_python_space))),
            "split" => {
                let words = s.split(is_python_space).filter(|w| !w.is_empty());
                return Ok(words.map(Value::from).collect());
            }
            _ => {}
        }
    }
    bound::check_method(value, method, args)?;
    let out = minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)?;
    bound::check_weight(&format!("method `{method}`"), &out)?;
    Ok(out)
}

/// Jinja's `trim(value, chars=None)`: Python's `str.strip(chars)`.
fn trim(value: &str, chars: Option<&str>) -> String {
    match chars {
        Some(chars) => value.trim_matches(|c| chars.contains(c)).to_string(),
        None => value.trim_matches(is_python_space).to_string(),
    }
}

/// Prints values as Python's `str` does: `True`, `False`, `None`, and the
/// `repr` of floats, lists and dicts; strings and integers as they are.
fn python_format(
    out: &mut Output,
    state: &State,
    value: &Value,
) -> std::result::Result<(), minijinja::Error> {
    let text = match value.kind() {
        ValueKind::Bool if value.is_true() => "True".to_string(),
        ValueKind::Bool => "False".to_string(),
        ValueKind::None => "None".to_string(),
        ValueKind::Number if !value.is_integer() => python::repr(value),
        ValueKind::Seq | ValueKind::Map => {
            bound::check_weight("a printed value", value)?;
            python::repr(value)
        }
        kind => {
            // A lazy iterable (`[x] * 10**12`) or an object prints whole.
            let bytes = match kind {
                ValueKind::Iterable | ValueKind::Plain => {
                    bound::check_weight("a printed value", value)?
                }
                _ => value.as_str().map_or(24, str::len),
            };
            bound::count_printed(bytes)?;
            return minijinja::escape_formatter(out, state, value);
        }
    };
    bound::count_printed(text.len())?;
    out.write_str(&text)
        .map_err(|e| minijinja::Error::new(ErrorKind::WriteFailure, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(source: &str) -> ChatTemplate {
        let tokens = SpecialTokens {
            bos_token: Some("<s>".into()),
            eos_token: None,
        };
        ChatTemplate::new(source.into(), tokens, "test".into()).unwrap()
    }

    fn render(source: &str) -> String {
        template(source)
            .render(&[Message::new("user", " hi\u{1f} ")], true)
            .unwrap()
    }

    #[test]
    fn context_is_transformers() {
        assert_eq!(
            render("{{ bos_token }}|{{ eos_token }}|{{ tools }}"),
            "<s>||None"
        );
        assert_eq!(
            render("{{ eos_token is defined }} {{ documents is none }}"),
            "False True"
        );
        assert_eq!(
            render("{{ add_generation_prompt }} {{ 2.5 }} {{ 1e20 }}"),
            "True 2.5 1e+20"
        );
    }

    #[test]
    fn python_string_methods() {
        assert_eq!(render("[{{ messages[0].content.strip() }}]"), "[hi]");
        assert_eq!(render("[{{ messages[0].content | trim }}]"), "[hi]");
        assert_eq!(
            render("{{ 'a b  c'.split() | tojson }}"),
            r#"["a", "b", "c"]"#
        );
        assert_eq!(render("{{ 'x</think>y'.split('</think>', 1)[1] }}"), "y");
        assert_eq!(
            render("{{ {'k': 1}.items() | list | tojson }}"),
            r#"[["k", 1]]"#
        );
    }

    #[test]
    fn raise_exception_is_an_error_naming_origin_and_message() {
        let t = template("{{ raise_exception('roles must alternate') }}");
        let err = t.render(&[Message::new("user", "x")], false).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("test") && text.contains("roles must alternate"),
            "{text}"
        );
    }

    #[test]
    fn unknown_filter_names_origin() {
        let err = ChatTemplate::new(
            "{{ 1 | nope }}".into(),
            SpecialTokens::default(),
            "o".into(),
        )
        .and_then(|t| t.render(&[Message::new("user", "x")], false))
        .unwrap_err();
        assert!(err.to_string().contains("nope"), "{err}");
    }

    #[test]
    fn strftime_now_formats_today() {
        let year = render("{{ strftime_now('%Y') }}");
        assert_eq!(year, chrono::Local::now().format("%Y").to_string());
        assert!(template("{{ strftime_now('%Q%') }}")
            .render(&[Message::new("user", "x")], false)
            .is_err());
    }

    #[test]
    fn runaway_template_runs_out_of_fuel() {
        let t = template(
            "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}",
        );
        let err = t.render(&[Message::new("user", "x")], false).unwrap_err();
        assert!(err.to_string().contains("fuel"), "{err}");
    }

    #[test]
    fn empty_conversation_is_refused() {
        assert!(template("x").render(&[], true).is_err());
    }
}
