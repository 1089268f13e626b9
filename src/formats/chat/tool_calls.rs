//! Tool calls in a model family's own text: which format a chat template
//! speaks, parsing generated text into `(content, calls)`, the grammar
//! (llguidance's Lark with `%json`) that forces a well-formed call whose
//! arguments match the tool's JSON schema, and where streamed text must be
//! held back because a call may be starting.
//!
//! Formats, as the families write them (and as vLLM's and llama.cpp's
//! parsers read them):
//! - Hermes / Qwen3: `<tool_call>\n{"name": N, "arguments": {..}}\n</tool_call>`
//!   per call, separated by newlines.
//! - DeepSeek-V3.1 (and V3/R1, read only):
//!   `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>N<｜tool▁sep｜>{..}<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>`;
//!   V3/R1 write `function<｜tool▁sep｜>N\n```json\n{..}\n```` inside a call.
//! - GLM-4.5/4.6: `<tool_call>N\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n…</tool_call>`,
//!   a string value raw, any other as JSON.
//! - Mistral v3 (Mixtral-8x22B): `[TOOL_CALLS] [{"name": N, "arguments": {..}}, …]`;
//!   v11 (`[TOOL_CALLS]N[ARGS]{..}`) is read too.
//!
//! Invariants: a parse never loses text — when the calls do not parse, the
//! whole text stays content and no call is reported (vLLM's rule); the
//! arguments of a parsed call are compact JSON text of an object.

use serde_json::{json, Map, Value};

/// The separators JSON output is held to under a grammar: one space after
/// `,` and `:` as Python's `json.dumps` writes (the models' training
/// text), never free whitespace (which a random or weak model fills until
/// the token budget runs out).
pub const ITEM_SEPARATOR: &str = ", ";
/// See [`ITEM_SEPARATOR`].
pub const KEY_SEPARATOR: &str = ": ";

/// `schema` with llguidance's `x-guidance` options set to fixed
/// separators and no free whitespace, unless the schema sets its own.
pub fn bounded_whitespace(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Value::Object(m) = &mut schema {
        m.entry("x-guidance").or_insert_with(|| {
            json!({"whitespace_flexible": false, "item_separator": ITEM_SEPARATOR,
                   "key_separator": KEY_SEPARATOR})
        });
    }
    schema
}

/// A tool the client offers: its function's name and parameter schema.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    /// A JSON schema of the arguments object (`{"type": "object"}` when
    /// the client gave none).
    pub parameters: Value,
}

/// One call parsed out of generated text.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments, compact JSON text of an object.
    pub arguments: String,
}

/// Generated text split into what the user reads and the calls.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Parsed {
    pub content: String,
    pub calls: Vec<ToolCall>,
}

/// A family's tool-call format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    DeepSeek,
    Glm,
    Mistral,
}

const DS_CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const DS_CALLS_END: &str = "<｜tool▁calls▁end｜>";
const DS_CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const DS_CALL_END: &str = "<｜tool▁call▁end｜>";
const DS_SEP: &str = "<｜tool▁sep｜>";
const TOOL_CALL: &str = "<tool_call>";
const TOOL_CALL_END: &str = "</tool_call>";
const MISTRAL_CALLS: &str = "[TOOL_CALLS]";

impl ToolFormat {
    /// The format a chat template writes tool calls in, from its text
    /// (the markers it prints); None for a template without tool calls.
    pub fn detect(template: &str) -> Option<ToolFormat> {
        if template.contains("<arg_key>") {
            Some(ToolFormat::Glm)
        } else if template.contains("tool▁call▁begin") {
            Some(ToolFormat::DeepSeek)
        } else if template.contains(MISTRAL_CALLS) {
            Some(ToolFormat::Mistral)
        } else if template.contains(TOOL_CALL) {
            Some(ToolFormat::Hermes)
        } else {
            None
        }
    }

    /// The text that opens the calls.
    pub fn start_marker(self) -> &'static str {
        match self {
            ToolFormat::Hermes | ToolFormat::Glm => TOOL_CALL,
            ToolFormat::DeepSeek => DS_CALLS_BEGIN,
            ToolFormat::Mistral => MISTRAL_CALLS,
        }
    }

    /// Every marker the parser reads in this format: a tokenizer that
    /// marks one special must still write it out when the answer is
    /// decoded (DeepSeek's call tokens are special in its tokenizer).
    pub fn marker_texts(self) -> &'static [&'static str] {
        match self {
            ToolFormat::Hermes => &[TOOL_CALL, TOOL_CALL_END],
            ToolFormat::Glm => &[
                TOOL_CALL,
                TOOL_CALL_END,
                "<arg_key>",
                "</arg_key>",
                "<arg_value>",
                "</arg_value>",
            ],
            ToolFormat::DeepSeek => &[
                DS_CALLS_BEGIN,
                DS_CALLS_END,
                DS_CALL_BEGIN,
                DS_CALL_END,
                DS_SEP,
            ],
            ToolFormat::Mistral => &[MISTRAL_CALLS],
        }
    }

    /// Splits generated `text` into content and calls (`tools` tells GLM
    /// which arguments are strings). Calls that do not parse leave the
    /// whole text as content.
    pub fn parse(self, text: &str, tools: &[Tool]) -> Parsed {
        let Some(at) = text.find(self.start_marker()) else {
            return Parsed {
                content: text.to_string(),
                calls: Vec::new(),
            };
        };
        let rest = &text[at..];
        let calls = match self {
            ToolFormat::Hermes => hermes_calls(rest),
            ToolFormat::DeepSeek => deepseek_calls(rest),
            ToolFormat::Glm => glm_calls(rest, tools),
            ToolFormat::Mistral => mistral_calls(rest),
        };
        match calls {
            Some(calls) if !calls.is_empty() => Parsed {
                content: text[..at].trim_end().to_string(),
                calls,
            },
            _ => Parsed {
                content: text.to_string(),
                calls: Vec::new(),
            },
        }
    }

    /// The llguidance Lark grammar of one call (or, with `parallel`, one
    /// or more) to any of `tools`, each call's arguments matching its
    /// tool's schema. `tools` must not be empty.
    pub fn grammar(self, tools: &[Tool], parallel: bool) -> String {
        self.calls_grammar(tools, parallel, false, &|_| None)
    }

    /// The grammar of what follows the calls' opening marker
    /// ([`ToolFormat::start_marker`]) in [`ToolFormat::grammar`]: for
    /// `tool_choice: "auto"`, once the model has opened a call, the rest
    /// of it (and of any parallel calls) is held to the tools' schemas.
    pub fn grammar_after_marker(self, tools: &[Tool], parallel: bool) -> String {
        self.calls_grammar(tools, parallel, true, &|_| None)
    }

    /// [`ToolFormat::grammar`] (or, `after_marker`,
    /// [`ToolFormat::grammar_after_marker`]) for a tokenizer in which
    /// `special` gives the id of each marker that is a special token: the
    /// grammar takes that token for it (the model's own way to write it;
    /// the marker's text spelled in other tokens is not accepted).
    pub fn calls_grammar(
        self,
        tools: &[Tool],
        parallel: bool,
        after_marker: bool,
        special: SpecialOf,
    ) -> String {
        let lit = |text: &str| spell(text, special);
        assert!(!tools.is_empty(), "a tool-call grammar needs a tool");
        let mut g = String::new();
        let choices: Vec<String> = (0..tools.len()).map(|i| format!("c{i}")).collect();
        let (open, close, sep) = match self {
            ToolFormat::Hermes => ("<tool_call>\n", "\n</tool_call>", "\n"),
            ToolFormat::Glm => (TOOL_CALL, TOOL_CALL_END, "\n"),
            ToolFormat::DeepSeek => (DS_CALL_BEGIN, DS_CALL_END, ""),
            ToolFormat::Mistral => ("", "", ITEM_SEPARATOR),
        };
        let more = if parallel {
            format!(" ({} call)*", lit(sep))
        } else {
            String::new()
        };
        let start = match (self, after_marker) {
            (ToolFormat::DeepSeek, false) => {
                format!("{} call{more} {}", lit(DS_CALLS_BEGIN), lit(DS_CALLS_END))
            }
            (ToolFormat::DeepSeek, true) => format!("call{more} {}", lit(DS_CALLS_END)),
            (ToolFormat::Mistral, false) => format!("{} call{more} \"]\"", lit("[TOOL_CALLS] [")),
            (ToolFormat::Mistral, true) => format!("{} call{more} \"]\"", lit(" [")),
            // Hermes and GLM: the marker opens the first call.
            (_, false) => format!("call{more}"),
            (_, true) => {
                let rest = open.strip_prefix(self.start_marker()).unwrap_or(open);
                format!("{} body{more}", lit(rest))
            }
        };
        g.push_str(&format!("start: {start}\n"));
        g.push_str(&format!("call: {} body\n", lit(open)));
        g.push_str(&format!("body: ({}) {}\n", choices.join(" | "), lit(close)));
        for (i, tool) in tools.iter().enumerate() {
            g.push_str(&format!("c{i}: {}\n", self.call_rule(i, tool, special)));
        }
        // Rules for GLM's arguments come after the choices.
        if self == ToolFormat::Glm {
            for (i, tool) in tools.iter().enumerate() {
                g.push_str(&glm_argument_rules(i, tool, special));
            }
        }
        g
    }

    /// The body of call rule `c{i}` for `tool`.
    fn call_rule(self, i: usize, tool: &Tool, special: SpecialOf) -> String {
        let lit = |text: &str| spell(text, special);
        let params = object_schema(&tool.parameters);
        match self {
            ToolFormat::Hermes | ToolFormat::Mistral => {
                let schema = json!({"type": "object",
                    "properties": {"name": {"const": tool.name}, "arguments": params},
                    "required": ["name", "arguments"], "additionalProperties": false});
                format!("%json {}", bounded_whitespace(&schema))
            }
            ToolFormat::DeepSeek => format!(
                "{} %json {}",
                lit(&format!("{}{DS_SEP}", tool.name)),
                bounded_whitespace(&params)
            ),
            ToolFormat::Glm => format!("{} a{i}", lit(&format!("{}\n", tool.name))),
        }
    }
}

/// The id of a marker's special token in a tokenizer (None: the marker
/// is text there).
pub type SpecialOf<'a> = &'a dyn Fn(&str) -> Option<u32>;

/// Every marker of every format, longest first (a marker inside a longer
/// one is found as the longer one).
const MARKERS: [&str; 12] = [
    DS_CALLS_BEGIN,
    DS_CALL_BEGIN,
    DS_CALLS_END,
    DS_CALL_END,
    DS_SEP,
    "</arg_value>",
    "<arg_value>",
    "</tool_call>",
    MISTRAL_CALLS,
    "</arg_key>",
    "<tool_call>",
    "<arg_key>",
];

/// A Lark sequence spelling `text`: literals, and each marker that
/// `special` names a token of as that token (`<[id]>`).
fn spell(text: &str, special: SpecialOf) -> String {
    let mut parts = Vec::new();
    let mut rest = text;
    while let Some((at, marker, id)) = (MARKERS.iter())
        .filter_map(|m| Some((rest.find(m)?, *m, special(m)?)))
        .min_by_key(|&(at, m, _)| (at, std::cmp::Reverse(m.len())))
    {
        parts.push(lit(&rest[..at]));
        parts.push(format!("<[{id}]>"));
        rest = &rest[at + marker.len()..];
    }
    parts.push(lit(rest));
    parts.retain(|p| !p.is_empty());
    parts.join(" ")
}

/// A Lark string literal of `s` (nothing for an empty one: Lark has no
/// empty literal in a sequence).
fn lit(s: &str) -> String {
    if s.is_empty() {
        return String::new();
    }
    serde_json::to_string(s).expect("a string serializes")
}

/// The parameters schema as an object schema (`{"type": "object"}` for
/// none or an empty one).
fn object_schema(params: &Value) -> Value {
    match params {
        Value::Object(m) if !m.is_empty() => params.clone(),
        _ => json!({"type": "object"}),
    }
}

/// GLM's `a{i}` rule: each declared property as an `<arg_key>`/`<arg_value>`
/// pair in declared order, the required ones always, the others optional; a
/// string value raw (no `<`; its minLength and maxLength kept), one of an
/// `enum` literally, any other value as JSON of its schema. A
/// tool without declared properties takes no arguments.
fn glm_argument_rules(i: usize, tool: &Tool, special: SpecialOf) -> String {
    let params = object_schema(&tool.parameters);
    let required: Vec<&str> = params["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let mut parts = Vec::new();
    let mut rules = String::new();
    let empty = Map::new();
    let props = params["properties"].as_object().unwrap_or(&empty);
    for (k, (key, schema)) in props.iter().enumerate() {
        let value = if schema["type"] == "string" && schema.get("enum").is_none() {
            let min = schema["minLength"].as_u64().unwrap_or(0);
            match schema["maxLength"].as_u64() {
                Some(max) => format!("/[^<]{{{min},{max}}}/"),
                None => format!("/[^<]{{{min},}}/"),
            }
        } else if schema["type"] == "string" {
            let options: Vec<String> = schema["enum"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(lit)
                .collect();
            format!("({})", options.join(" | "))
        } else {
            format!("%json {}", bounded_whitespace(schema))
        };
        let pair = format!("a{i}_{k}");
        rules.push_str(&format!(
            "{pair}: {} {value} {}\n",
            spell(&format!("<arg_key>{key}</arg_key>\n<arg_value>"), special),
            spell("</arg_value>\n", special)
        ));
        parts.push(if required.contains(&key.as_str()) {
            pair
        } else {
            format!("{pair}?")
        });
    }
    if parts.is_empty() {
        // No declared arguments: the call has none.
        return format!("a{i}: \"\"\n");
    }
    format!("a{i}: {}\n{rules}", parts.join(" "))
}

/// `{"name", "arguments"}` (arguments an object, or a string holding one)
/// as a call.
fn call_of_json(v: &Value) -> Option<ToolCall> {
    let name = v["name"].as_str()?.to_string();
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => {
            let parsed: Value = serde_json::from_str(s).ok()?;
            parsed.is_object().then(|| parsed.to_string())?
        }
        Some(a @ Value::Object(_)) => a.to_string(),
        Some(_) => return None,
    };
    Some(ToolCall { name, arguments })
}

/// The pieces of `text` between each `open` and the next `close` (a last
/// piece left open runs to the end); None when text outside the pieces is
/// more than whitespace.
fn pieces<'t>(text: &'t str, open: &str, close: &str) -> Option<Vec<&'t str>> {
    let mut out = Vec::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            return Some(out);
        }
        rest = rest.strip_prefix(open)?;
        match rest.find(close) {
            Some(end) => {
                out.push(&rest[..end]);
                rest = &rest[end + close.len()..];
            }
            None => {
                out.push(rest);
                return Some(out);
            }
        }
    }
}

fn hermes_calls(text: &str) -> Option<Vec<ToolCall>> {
    pieces(text, TOOL_CALL, TOOL_CALL_END)?
        .into_iter()
        .map(|p| call_of_json(&serde_json::from_str(p.trim()).ok()?))
        .collect()
}

fn deepseek_calls(text: &str) -> Option<Vec<ToolCall>> {
    let inner = text.strip_prefix(DS_CALLS_BEGIN)?;
    let inner = inner.split(DS_CALLS_END).next().unwrap_or(inner);
    pieces(inner, DS_CALL_BEGIN, DS_CALL_END)?
        .into_iter()
        .map(deepseek_call)
        .collect()
}

/// One DeepSeek call: V3.1's `N<｜tool▁sep｜>{..}` or V3's
/// `function<｜tool▁sep｜>N\n```json\n{..}\n````.
fn deepseek_call(piece: &str) -> Option<ToolCall> {
    let (left, right) = piece.split_once(DS_SEP)?;
    let (name, args) = match right.split_once("\n```json\n") {
        Some((name, fenced)) if left == "function" => (
            name,
            fenced.trim_end().strip_suffix("```").unwrap_or(fenced),
        ),
        _ => (left, right),
    };
    let parsed: Value = serde_json::from_str(args.trim()).ok()?;
    parsed.is_object().then(|| ToolCall {
        name: name.trim().to_string(),
        arguments: parsed.to_string(),
    })
}

fn glm_calls(text: &str, tools: &[Tool]) -> Option<Vec<ToolCall>> {
    pieces(text, TOOL_CALL, TOOL_CALL_END)?
        .into_iter()
        .map(|p| glm_call(p, tools))
        .collect()
}

/// One GLM call: the name up to the first newline or `<arg_key>`, then
/// the pairs; a value is a string where the tool's schema says so, else
/// JSON if it parses, else a string.
fn glm_call(piece: &str, tools: &[Tool]) -> Option<ToolCall> {
    let name_end = piece.find(['\n', '<']).unwrap_or(piece.len());
    let name = piece[..name_end].trim().to_string();
    if name.is_empty() {
        return None;
    }
    let schema = tools
        .iter()
        .find(|t| t.name == name)
        .map(|t| &t.parameters["properties"]);
    let mut args = Map::new();
    let mut rest = &piece[name_end..];
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let after_key = rest.strip_prefix("<arg_key>")?;
        let (key, after) = after_key.split_once("</arg_key>")?;
        let after = after.trim_start().strip_prefix("<arg_value>")?;
        let (value, after) = after.split_once("</arg_value>")?;
        let is_string = schema.is_some_and(|s| s[key]["type"] == "string");
        let value = match serde_json::from_str::<Value>(value) {
            Ok(v) if !is_string => v,
            _ => Value::String(value.to_string()),
        };
        args.insert(key.trim().to_string(), value);
        rest = after;
    }
    Some(ToolCall {
        name,
        arguments: Value::Object(args).to_string(),
    })
}

fn mistral_calls(text: &str) -> Option<Vec<ToolCall>> {
    let rest = text.strip_prefix(MISTRAL_CALLS)?.trim_start();
    if rest.starts_with('[') {
        let list: Vec<Value> = serde_json::from_str(rest.trim_end()).ok()?;
        return list.iter().map(call_of_json).collect();
    }
    // v11: `N[ARGS]{..}` per call, each after a `[TOOL_CALLS]`.
    rest.split(MISTRAL_CALLS)
        .map(|c| {
            let (name, args) = c.split_once("[ARGS]")?;
            let parsed: Value = serde_json::from_str(args.trim()).ok()?;
            parsed.is_object().then(|| ToolCall {
                name: name.trim().to_string(),
                arguments: parsed.to_string(),
            })
        })
        .collect()
}

/// Where streamed text must be held back: the offset of `marker` in
/// `text`, or of a tail of `text` that may be its start; None when all of
/// `text` can be sent as content.
pub fn hold_from(text: &str, marker: &str) -> Option<usize> {
    if let Some(at) = text.find(marker) {
        return Some(at);
    }
    (1..marker.len().min(text.len() + 1))
        .rev()
        .map(|n| text.len() - n)
        .find(|&start| text.is_char_boundary(start) && marker.starts_with(&text[start..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Vec<Tool> {
        vec![Tool {
            name: "get_weather".into(),
            parameters: json!({"type": "object", "properties": {
                "city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"]}),
        }]
    }

    fn call(name: &str, args: Value) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments: args.to_string(),
        }
    }

    #[test]
    fn markers_that_are_special_tokens_are_spelled_as_those_tokens() {
        let special = |m: &str| (m == DS_SEP || m == TOOL_CALL).then_some(7);
        assert_eq!(spell("<tool_call>\n", &special), "<[7]> \"\\n\"");
        assert_eq!(spell(&format!("f{DS_SEP}"), &special), "\"f\" <[7]>");
        assert_eq!(spell("</tool_call>", &special), "\"</tool_call>\"");
        assert_eq!(spell("", &special), "");
        let g = ToolFormat::DeepSeek.calls_grammar(&weather(), false, true, &special);
        assert!(g.contains("\"get_weather\" <[7]>"), "{g}");
    }

    #[test]
    fn each_family_parses_its_own_text() {
        let tools = weather();
        let want = vec![
            call("get_weather", json!({"city": "Paris", "days": 2})),
            call("get_weather", json!({"city": "Oslo"})),
        ];
        let cases = [
            (ToolFormat::Hermes, "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"),
            (ToolFormat::DeepSeek, "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\", \"days\": 2}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Oslo\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
            (ToolFormat::DeepSeek, "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\", \"days\": 2}\n```<｜tool▁call▁end｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Oslo\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
            (ToolFormat::Glm, "Sure.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>"),
            (ToolFormat::Mistral, "Sure.[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]"),
            (ToolFormat::Mistral, "Sure.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"days\": 2}[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}"),
        ];
        for (format, text) in cases {
            let got = format.parse(text, &tools);
            assert_eq!(got.calls, want, "{format:?}: {text}");
            assert_eq!(got.content, "Sure.", "{format:?}");
        }
    }

    #[test]
    fn text_whose_calls_do_not_parse_stays_content() {
        let tools = weather();
        for (format, text) in [
            (
                ToolFormat::Hermes,
                "a <tool_call>\n{\"name\": \"get_weather\", \"argu",
            ),
            (ToolFormat::Hermes, "<tool_call>{\"name\": 3}</tool_call>"),
            (
                ToolFormat::Hermes,
                "<tool_call>{\"name\": \"f\"}</tool_call> trailing",
            ),
            (
                ToolFormat::DeepSeek,
                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>[1]<｜tool▁call▁end｜>",
            ),
            (ToolFormat::Glm, "<tool_call>\n<arg_key>x</arg_key>"),
            (ToolFormat::Mistral, "[TOOL_CALLS] [{\"arguments\": {}}]"),
            (ToolFormat::Hermes, "no call at all"),
        ] {
            let got = format.parse(text, &tools);
            assert_eq!(got.calls, vec![], "{text}");
            assert_eq!(got.content, text);
        }
    }

    #[test]
    fn templates_are_told_apart_by_their_markers() {
        let d = ToolFormat::detect;
        assert_eq!(d("{{ '<tool_call>' }}"), Some(ToolFormat::Hermes));
        assert_eq!(d("<tool_call>{{ n }}<arg_key>"), Some(ToolFormat::Glm));
        assert_eq!(d("<｜tool▁call▁begin｜>"), Some(ToolFormat::DeepSeek));
        assert_eq!(d("[TOOL_CALLS]"), Some(ToolFormat::Mistral));
        assert_eq!(d("{{ messages }}"), None);
    }

    #[test]
    fn streamed_text_is_held_where_a_marker_may_start() {
        assert_eq!(hold_from("hello", "<tool_call>"), None);
        assert_eq!(hold_from("hello <tool", "<tool_call>"), Some(6));
        assert_eq!(hold_from("a<tool_call>{", "<tool_call>"), Some(1));
        assert_eq!(hold_from("é", "<｜tool▁calls▁begin｜>"), None);
        assert_eq!(hold_from("x<｜to", "<｜tool▁calls▁begin｜>"), Some(1));
    }

    #[test]
    fn json_under_a_grammar_has_fixed_separators_unless_the_schema_says() {
        let s = bounded_whitespace(&json!({"type": "object"}));
        assert_eq!(s["x-guidance"]["whitespace_flexible"], false);
        let own = json!({"x-guidance": {"whitespace_flexible": true}});
        assert_eq!(bounded_whitespace(&own), own);
    }
}
