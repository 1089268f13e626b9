//! Tool calling on `/v1/chat/completions`: the `tools`, `tool_choice` and
//! `parallel_tool_calls` fields checked and turned into a plan (what the
//! template is shown, which format the answer is parsed in, the grammar
//! that forces a call), the conversation's messages turned into the
//! template's (tool calls and tool results kept), and the answer's
//! `tool_calls` in OpenAI's shape, whole and streamed.
//!
//! `tool_choice`: `none` shows the template no tools and parses nothing;
//! `auto` (the default with tools) shows them and parses calls out of the
//! text; `required` and `{"type": "function", "function": {"name"}}`
//! also constrain the output to calls (to any tool, or to the named one)
//! whose arguments match the tool's schema.

use super::api::ApiError;
use crate::formats::chat::tool_calls::{hold_from, Parsed, SpecialOf, Tool, ToolCall, ToolFormat};
use serde_json::{json, Map, Value};

/// What the request's tool fields ask for.
#[derive(Clone, Debug)]
pub struct ToolPlan {
    pub format: ToolFormat,
    pub tools: Vec<Tool>,
    /// The `tools` field as sent, for the template.
    pub shown: Value,
    /// The Lark grammar of the calls the output must be (required or a
    /// named function), or None (auto).
    pub grammar: Option<String>,
    /// With `auto`: the Lark grammar of what follows the calls' opening
    /// marker, which holds once the model has written it.
    pub after_marker: Option<String>,
}

/// The most tools one request may offer.
pub const TOOLS_MAX: usize = 128;

/// The plan for a request's `tools`, `tool_choice`, `parallel_tool_calls`
/// (and the legacy `functions`, refused) on a model whose template is
/// `template` (its text) whose tokenizer has `special` tokens for some
/// markers (the grammars take those); None when there is nothing to do
/// (no tools, or `tool_choice: "none"`). Every malformed field is a 400
/// naming it.
pub fn plan(
    tools: Option<&Value>,
    choice: Option<&Value>,
    parallel: Option<bool>,
    template: Option<&str>,
    special: SpecialOf,
) -> Result<Option<ToolPlan>, ApiError> {
    let list = match tools {
        None | Some(Value::Null) => {
            return match choice {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if s == "none" || s == "auto" => Ok(None),
                Some(_) => Err(ApiError::bad_param(
                    "tool_choice",
                    "tool_choice asks for a tool call but the request has no `tools`",
                )),
            }
        }
        Some(v) => parse_tools(v)?,
    };
    let forced = match choice {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => match s.as_str() {
            "none" => return Ok(None),
            "auto" => None,
            "required" => Some(list.clone()),
            other => {
                return Err(ApiError::bad_param(
                    "tool_choice",
                    format!("tool_choice {other:?}: expected none, auto, required or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"),
                ))
            }
        },
        Some(v) => Some(vec![named(v, &list)?]),
    };
    let Some(format) = template.and_then(ToolFormat::detect) else {
        return Err(ApiError::bad_param(
            "tools",
            "this model's chat template writes no tool calls (none of <tool_call>, DeepSeek's tool-call tokens, GLM's <arg_key>, [TOOL_CALLS]); start the server with a --chat-template that does",
        ));
    };
    let parallel = parallel.unwrap_or(true);
    Ok(Some(ToolPlan {
        format,
        after_marker: (forced.is_none())
            .then(|| format.calls_grammar(&list, parallel, true, special)),
        grammar: forced.map(|t| format.calls_grammar(&t, parallel, false, special)),
        tools: list,
        shown: tools.cloned().unwrap_or(Value::Null),
    }))
}

/// `tools`: a non-empty list of `{"type": "function", "function": {"name",
/// "description"?, "parameters"?}}`.
fn parse_tools(v: &Value) -> Result<Vec<Tool>, ApiError> {
    let bad = |m: String| ApiError::bad_param("tools", m);
    let Some(list) = v.as_array() else {
        return Err(bad(format!("tools {v}: expected a list")));
    };
    if list.is_empty() || list.len() > TOOLS_MAX {
        return Err(bad(format!(
            "{} tools; send 1 to {TOOLS_MAX} (or no `tools`)",
            list.len()
        )));
    }
    let mut out: Vec<Tool> = Vec::with_capacity(list.len());
    for t in list {
        if t["type"] != "function" {
            return Err(bad(format!(
                "tool {t}: only type \"function\" is supported"
            )));
        }
        let f = &t["function"];
        let Some(name) = f["name"].as_str().filter(|n| valid_name(n)) else {
            return Err(bad(format!(
                "tool {t}: function.name must be 1 to 64 of a-z, A-Z, 0-9, _ and -"
            )));
        };
        if out.iter().any(|o| o.name == name) {
            return Err(bad(format!("two tools are named {name:?}")));
        }
        let parameters = match &f["parameters"] {
            Value::Null => json!({"type": "object", "properties": {}}),
            p @ Value::Object(_) => p.clone(),
            p => {
                return Err(bad(format!(
                    "tool {name}: parameters {p} is not a schema object"
                )))
            }
        };
        out.push(Tool {
            name: name.to_string(),
            parameters,
        });
    }
    Ok(out)
}

/// OpenAI's rule for function names.
fn valid_name(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `{"type": "function", "function": {"name": N}}`: the tool named N.
fn named(v: &Value, tools: &[Tool]) -> Result<Tool, ApiError> {
    let name = v["function"]["name"].as_str();
    match (v["type"].as_str(), name) {
        (Some("function"), Some(n)) => tools.iter().find(|t| t.name == n).cloned().ok_or_else(|| {
            ApiError::bad_param("tool_choice", format!("tool_choice names {n:?}, which is not among `tools`"))
        }),
        _ => Err(ApiError::bad_param(
            "tool_choice",
            format!("tool_choice {v}: expected {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"),
        )),
    }
}

/// A message as sent, as the template's message: the text parts of a list
/// content joined, the calls' `arguments` (OpenAI's JSON text) parsed into
/// objects as vLLM and llama.cpp give templates (GLM's walks
/// `arguments.items()`), every other field passed as sent.
pub fn template_message(m: &Value) -> Result<Value, ApiError> {
    let bad = |msg: String| ApiError::bad_param("messages", msg);
    let Some(obj) = m.as_object() else {
        return Err(bad(format!("message {m}: expected an object")));
    };
    if !obj.get("role").is_some_and(Value::is_string) {
        return Err(bad(format!("message {m}: `role` must be a string")));
    }
    let mut out: Map<String, Value> = obj.clone();
    match obj.get("content") {
        None | Some(Value::Null) | Some(Value::String(_)) => {}
        Some(Value::Array(parts)) => {
            out.insert("content".into(), Value::String(text_of_parts(parts)?));
        }
        Some(c) => {
            return Err(bad(format!(
                "content {c}: expected a string or a list of parts"
            )))
        }
    }
    if let Some(calls) = obj.get("tool_calls") {
        out.insert("tool_calls".into(), template_calls(calls)?);
    }
    Ok(Value::Object(out))
}

/// The text of a list content (only text parts are supported).
pub fn text_of_parts(parts: &[Value]) -> Result<String, ApiError> {
    let mut text = String::new();
    for p in parts {
        match (p["type"].as_str(), p["text"].as_str()) {
            (Some("text"), Some(t)) => text.push_str(t),
            _ => {
                return Err(ApiError::bad_param(
                    "messages",
                    format!("content part {p}: only text parts are supported"),
                ))
            }
        }
    }
    Ok(text)
}

fn template_calls(calls: &Value) -> Result<Value, ApiError> {
    let bad = |msg: String| ApiError::bad_param("messages", msg);
    let Some(list) = calls.as_array() else {
        return Err(bad(format!("tool_calls {calls}: expected a list")));
    };
    let mut out = Vec::with_capacity(list.len());
    for c in list {
        let mut c = c.clone();
        if !c["function"]["name"].is_string() {
            return Err(bad(format!(
                "tool call {c}: function.name must be a string"
            )));
        }
        if let Some(Value::String(text)) = c["function"].get("arguments") {
            let parsed: Value = serde_json::from_str(text)
                .map_err(|e| bad(format!("tool call arguments {text:?} are not JSON: {e}")))?;
            c["function"]["arguments"] = parsed;
        }
        out.push(c);
    }
    Ok(Value::Array(out))
}

/// A fresh call id (`call_` and 24 hex digits).
pub fn call_id() -> String {
    let a = getrandom::u64().unwrap_or(0);
    let b = getrandom::u32().unwrap_or(0);
    format!("call_{a:016x}{b:08x}")
}

/// The calls in OpenAI's `tool_calls` shape (with `index` when streamed).
pub fn openai_calls(calls: &[ToolCall], streamed: bool) -> Value {
    let list: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut v = json!({"id": call_id(), "type": "function",
                               "function": {"name": c.name, "arguments": c.arguments}});
            if streamed {
                v["index"] = json!(i);
            }
            v
        })
        .collect();
    Value::Array(list)
}

/// A streamed answer's text with tools: content streams until a call may
/// be starting; from there on the text is held and parsed at the end.
#[derive(Debug)]
pub struct ToolStream {
    marker: &'static str,
    /// Offset in the answer where held text starts (a call, or what may
    /// become one), once found.
    held_from: Option<usize>,
    sent: usize,
}

impl ToolStream {
    pub fn new(format: ToolFormat) -> ToolStream {
        ToolStream {
            marker: format.start_marker(),
            held_from: None,
            sent: 0,
        }
    }

    /// The content of `text` (the answer so far) that can be sent now.
    pub fn content<'t>(&mut self, text: &'t str) -> &'t str {
        if self.held_from.is_none() {
            let hold = hold_from(&text[self.sent..], self.marker).map(|h| self.sent + h);
            let until = hold.unwrap_or(text.len());
            let out = &text[self.sent..until];
            self.sent = until;
            // Only the whole marker fixes the hold; a prefix may still
            // turn out to be text.
            if text[until..].starts_with(self.marker) {
                self.held_from = Some(until);
            }
            return out;
        }
        ""
    }

    /// At the end: the text still to send as content, and the calls.
    pub fn finish(&mut self, parsed: &Parsed, text: &str) -> String {
        if parsed.calls.is_empty() {
            let out = text[self.sent..].to_string();
            self.sent = text.len();
            return out;
        }
        // The content before the calls, less what was sent already.
        parsed.content.get(self.sent..).unwrap_or("").to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN: &str = "{{ '<tool_call>' }}";

    fn tools() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
    }

    #[test]
    fn tool_fields_are_checked_by_name() {
        let t = tools();
        let p = |tools: Option<&Value>, choice: Value| {
            plan(tools, Some(&choice), None, Some(QWEN), &|_| None).map_err(|e| e.param)
        };
        assert!(p(Some(&t), json!("none")).unwrap().is_none());
        assert!(p(Some(&t), json!("auto"))
            .unwrap()
            .unwrap()
            .grammar
            .is_none());
        assert!(p(Some(&t), json!("required"))
            .unwrap()
            .unwrap()
            .grammar
            .is_some());
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        assert!(p(Some(&t), named).unwrap().unwrap().grammar.is_some());
        let other = json!({"type": "function", "function": {"name": "nope"}});
        assert_eq!(p(Some(&t), other).unwrap_err(), Some("tool_choice"));
        assert_eq!(
            p(Some(&t), json!("sometimes")).unwrap_err(),
            Some("tool_choice")
        );
        assert_eq!(p(None, json!("required")).unwrap_err(), Some("tool_choice"));
        assert_eq!(
            p(Some(&json!([])), json!("auto")).unwrap_err(),
            Some("tools")
        );
        assert_eq!(
            p(
                Some(&json!([{"type": "function", "function": {"name": "a b"}}])),
                json!("auto")
            )
            .unwrap_err(),
            Some("tools")
        );
        assert_eq!(
            p(Some(&json!({"a": 1})), json!("auto")).unwrap_err(),
            Some("tools")
        );
        let no_calls = plan(Some(&t), None, None, Some("{{ messages }}"), &|_| None);
        assert_eq!(no_calls.unwrap_err().param, Some("tools"));
    }

    #[test]
    fn messages_keep_their_calls_with_arguments_as_objects() {
        let m = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function",
            "function": {"name": "f", "arguments": "{\"a\": 1}"}}]});
        let t = template_message(&m).unwrap();
        assert_eq!(t["tool_calls"][0]["function"]["arguments"], json!({"a": 1}));
        assert!(t["content"].is_null());
        let bad = json!({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]});
        assert_eq!(template_message(&bad).unwrap_err().param, Some("messages"));
        assert!(template_message(&json!({"role": 1})).is_err());
        let parts = json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]});
        assert_eq!(template_message(&parts).unwrap()["content"], "ab");
    }

    #[test]
    fn streamed_content_stops_where_a_call_opens() {
        let f = ToolFormat::Hermes;
        let mut s = ToolStream::new(f);
        let mut sent = String::new();
        let full = "Sure <b>. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\"}}\n</tool_call>";
        for end in 1..=full.len() {
            if full.is_char_boundary(end) {
                sent.push_str(s.content(&full[..end]));
            }
        }
        assert_eq!(sent, "Sure <b>. ");
        let parsed = f.parse(full, &[]);
        assert_eq!(parsed.calls.len(), 1);
        sent.push_str(&s.finish(&parsed, full));
        assert_eq!(sent.trim_end(), parsed.content);
        // A marker that never completes is text after all.
        let mut s = ToolStream::new(f);
        let text = "a <tool";
        let mut sent = s.content(text).to_string();
        sent.push_str(&s.finish(&f.parse(text, &[]), text));
        assert_eq!(sent, text);
    }
}
