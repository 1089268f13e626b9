//! Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`)
//! over the same engine: a request is translated into the chat request it
//! means (system, content blocks, tools, tool_choice, stop sequences,
//! sampling, thinking), served by the chat path, and answered in
//! Anthropic's shape: a `message` with text / thinking / tool_use blocks
//! and a `stop_reason`, or the event sequence `message_start`, `ping`,
//! `content_block_start` / `_delta` / `_stop` per block, `message_delta`
//! (stop reason and usage), `message_stop`. Errors are
//! `{"type": "error", "error": {"type", "message"}}`.

use super::api::ApiError;
use super::respond;
use super::split::{Pieces, Splitter};
use super::worker::Event;
use super::Shared;
use crate::formats::chat::tool_calls::ToolCall;
use axum::body::{Body, Bytes};
use axum::response::sse;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Fields of a Messages request this server reads; any other is refused
/// by name (none is dropped unread).
const FIELDS: [&str; 14] = [
    "model",
    "messages",
    "system",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop_sequences",
    "stream",
    "tools",
    "tool_choice",
    "metadata",
    "thinking",
    "service_tier",
];

/// An error in Anthropic's shape.
pub struct AnthropicError(pub ApiError);

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        self.0.into_anthropic_response()
    }
}

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> AnthropicError {
        AnthropicError(e)
    }
}

fn bad(param: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::bad_param(param, message)
}

/// The chat completion request a Messages request means (for
/// `count_tokens`, `max_tokens` may be absent).
pub fn to_chat(req: &Value, counting: bool) -> Result<Value, ApiError> {
    let Some(obj) = req.as_object() else {
        return Err(ApiError::bad("the request body must be a JSON object"));
    };
    if let Some(k) = obj.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(ApiError::bad(format!("unknown field `{k}`")));
    }
    let mut chat = Map::new();
    let mut messages = system_messages(&req["system"])?;
    let Some(list) = req["messages"].as_array() else {
        return Err(bad("messages", "`messages` must be a list"));
    };
    for m in list {
        messages.extend(chat_messages(m)?);
    }
    chat.insert("messages".into(), Value::Array(messages));
    match &req["max_tokens"] {
        Value::Number(n) if n.as_u64().is_some_and(|n| n >= 1) => {
            chat.insert("max_tokens".into(), json!(n));
        }
        Value::Null if counting => {}
        v => {
            return Err(bad(
                "max_tokens",
                format!("max_tokens {v}: a count of at least 1 is required"),
            ))
        }
    }
    for k in ["model", "temperature", "top_p", "top_k", "stream"] {
        if !req[k].is_null() {
            chat.insert(k.into(), req[k].clone());
        }
    }
    if !req["stop_sequences"].is_null() {
        chat.insert("stop".into(), req["stop_sequences"].clone());
    }
    if !req["tools"].is_null() {
        chat.insert("tools".into(), chat_tools(&req["tools"])?);
    }
    if !req["tool_choice"].is_null() {
        let (choice, parallel) = chat_tool_choice(&req["tool_choice"])?;
        chat.insert("tool_choice".into(), choice);
        if let Some(p) = parallel {
            chat.insert("parallel_tool_calls".into(), json!(p));
        }
    }
    match req["thinking"]["type"].as_str() {
        None if req["thinking"].is_null() => {}
        Some("enabled") => {
            chat.insert("reasoning_effort".into(), json!("high"));
        }
        Some("disabled") => {
            chat.insert("reasoning_effort".into(), json!("none"));
        }
        _ => {
            return Err(bad(
                "thinking",
                format!(
                    "thinking {}: expected type enabled or disabled",
                    req["thinking"]
                ),
            ))
        }
    }
    Ok(Value::Object(chat))
}

/// `system`: a string or a list of text blocks.
fn system_messages(system: &Value) -> Result<Vec<Value>, ApiError> {
    let text = match system {
        Value::Null => return Ok(Vec::new()),
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks_text(blocks, "system")?,
        v => {
            return Err(bad(
                "system",
                format!("system {v}: expected a string or text blocks"),
            ))
        }
    };
    Ok(vec![json!({"role": "system", "content": text})])
}

/// The text of text blocks (any other block is refused by `param`).
fn blocks_text(blocks: &[Value], param: &'static str) -> Result<String, ApiError> {
    let mut text = String::new();
    for b in blocks {
        match (b["type"].as_str(), b["text"].as_str()) {
            (Some("text"), Some(t)) => text.push_str(t),
            _ => return Err(bad(param, format!("block {b}: only text blocks here"))),
        }
    }
    Ok(text)
}

/// One Messages message as chat messages: a user turn's tool results
/// become `tool` messages (before its text), an assistant turn's tool_use
/// blocks its `tool_calls`, its thinking its `reasoning_content`.
fn chat_messages(m: &Value) -> Result<Vec<Value>, ApiError> {
    let role = match m["role"].as_str() {
        Some(r @ ("user" | "assistant")) => r,
        _ => {
            return Err(bad(
                "messages",
                format!("message {m}: role must be user or assistant"),
            ))
        }
    };
    let blocks = match &m["content"] {
        Value::String(s) => return Ok(vec![json!({"role": role, "content": s})]),
        Value::Array(b) => b,
        v => {
            return Err(bad(
                "messages",
                format!("content {v}: expected a string or blocks"),
            ))
        }
    };
    let mut out = Vec::new();
    let (mut text, mut calls, mut thinking) = (String::new(), Vec::new(), String::new());
    for b in blocks {
        match (b["type"].as_str(), role) {
            (Some("text"), _) => text.push_str(b["text"].as_str().unwrap_or_default()),
            (Some("thinking"), "assistant") => {
                thinking.push_str(b["thinking"].as_str().unwrap_or_default())
            }
            (Some("redacted_thinking"), "assistant") => {}
            (Some("tool_use"), "assistant") => calls.push(json!({
                "id": b["id"], "type": "function",
                "function": {"name": b["name"], "arguments": b["input"].to_string()},
            })),
            (Some("tool_result"), "user") => {
                let content = match &b["content"] {
                    Value::String(s) => s.clone(),
                    Value::Array(parts) => blocks_text(parts, "messages")?,
                    Value::Null => String::new(),
                    v => return Err(bad("messages", format!("tool_result content {v}"))),
                };
                out.push(json!({"role": "tool", "tool_call_id": b["tool_use_id"], "content": content}));
            }
            _ => {
                return Err(bad(
                    "messages",
                    format!("a {role} message's block {b} is not supported (text, thinking, tool_use, tool_result)"),
                ))
            }
        }
    }
    if role == "assistant" {
        let mut msg = json!({"role": "assistant", "content": text});
        if !calls.is_empty() {
            msg["tool_calls"] = Value::Array(calls);
        }
        if !thinking.is_empty() {
            msg["reasoning_content"] = json!(thinking);
        }
        out.push(msg);
    } else if !text.is_empty() || out.is_empty() {
        out.push(json!({"role": "user", "content": text}));
    }
    Ok(out)
}

/// `tools`: `{name, description?, input_schema}` each.
fn chat_tools(tools: &Value) -> Result<Value, ApiError> {
    let Some(list) = tools.as_array() else {
        return Err(bad("tools", "`tools` must be a list"));
    };
    let out: Result<Vec<Value>, ApiError> = list
        .iter()
        .map(|t| {
            if t.get("type").is_some_and(|k| k != "custom") {
                return Err(bad("tools", format!("tool {t}: only custom tools (name, input_schema) are supported")));
            }
            Ok(json!({"type": "function", "function": {
                "name": t["name"], "description": t["description"], "parameters": t["input_schema"]}}))
        })
        .collect();
    out.map(Value::Array)
}

/// `tool_choice` as chat's, and whether calls may come in parallel.
fn chat_tool_choice(choice: &Value) -> Result<(Value, Option<bool>), ApiError> {
    let parallel = choice["disable_parallel_tool_use"].as_bool().map(|d| !d);
    let mapped = match (choice["type"].as_str(), choice["name"].as_str()) {
        (Some("auto"), _) => json!("auto"),
        (Some("any"), _) => json!("required"),
        (Some("none"), _) => json!("none"),
        (Some("tool"), Some(n)) => json!({"type": "function", "function": {"name": n}}),
        _ => {
            return Err(bad(
                "tool_choice",
                format!("tool_choice {choice}: expected type auto, any, none, or tool with a name"),
            ))
        }
    };
    Ok((mapped, parallel))
}

/// Anthropic's stop reason for chat's finish reason (and the stop
/// sequence that ended the answer, if one did).
pub fn stop_reason(finish: &str, stop_sequence: Option<&str>) -> &'static str {
    match (finish, stop_sequence) {
        ("tool_calls", _) => "tool_use",
        ("length", _) => "max_tokens",
        (_, Some(_)) => "stop_sequence",
        _ => "end_turn",
    }
}

/// A `msg_` id.
pub fn message_id() -> String {
    format!(
        "msg_{:016x}{:08x}",
        getrandom::u64().unwrap_or(0),
        getrandom::u32().unwrap_or(0)
    )
}

/// The content blocks of an answer: thinking, text, tool_use.
pub fn blocks(reasoning: &str, text: &str, calls: &[ToolCall]) -> Vec<Value> {
    let mut out = Vec::new();
    if !reasoning.is_empty() {
        out.push(json!({"type": "thinking", "thinking": reasoning, "signature": ""}));
    }
    if !text.is_empty() || calls.is_empty() {
        out.push(json!({"type": "text", "text": text}));
    }
    for c in calls {
        let input: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
        out.push(
            json!({"type": "tool_use", "id": format!("toolu_{}", &super::tools::call_id()[5..]),
                        "name": c.name, "input": input}),
        );
    }
    out
}

/// `POST /v1/messages`.
pub(super) async fn messages(s: Arc<Shared>, body: Body) -> Result<Response, AnthropicError> {
    let (p, events) = start(&s, body, false).await?;
    let id = message_id();
    if p.stream {
        let p = Arc::new(p);
        let (tx, rx) = mpsc::channel(64);
        let out = AnthropicOut {
            tx,
            id,
            model: s.config.model_name.clone(),
            input_tokens: p.prompt.len(),
            open: None,
            next: 0,
        };
        let task = respond::drive(s.clone(), p.clone(), events, out);
        return Ok(respond::sse_response(&s, &p, rx, task));
    }
    let c = respond::collect(&s, &p, events).await?;
    let end = Splitter::whole(p.reasoning, p.tools.as_ref(), &c.full);
    let reason = if end.calls.is_empty() {
        c.reason
    } else {
        "tool_calls"
    };
    let body = json!({
        "id": id, "type": "message", "role": "assistant", "model": s.config.model_name,
        "content": blocks(&end.pieces.reasoning, &end.pieces.content, &end.calls),
        "stop_reason": stop_reason(reason, c.stop_sequence.as_deref()),
        "stop_sequence": c.stop_sequence,
        "usage": {"input_tokens": p.prompt.len(), "output_tokens": c.tokens,
                  "cache_read_input_tokens": c.reused},
    });
    Ok(respond::answered(&p, axum::Json(body).into_response()))
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens as the template
/// renders the request.
pub(super) async fn count_tokens(s: Arc<Shared>, body: Body) -> Result<Response, AnthropicError> {
    s.ready()?;
    let (bytes, room) = respond::read_body(&s, body).await?;
    let chat = translate(&bytes, true)?;
    let p = respond::prepare_blocking(s.clone(), chat, room, true).await?;
    Ok(axum::Json(json!({"input_tokens": p.prompt.len()})).into_response())
}

/// Reads, translates, prepares and submits a Messages request.
async fn start(
    s: &Arc<Shared>,
    body: Body,
    counting: bool,
) -> Result<(respond::Prepared, mpsc::UnboundedReceiver<Event>), AnthropicError> {
    s.ready()?;
    let (bytes, room) = respond::read_body(s, body).await?;
    let chat = translate(&bytes, counting)?;
    let p = respond::prepare_blocking(s.clone(), chat, room, true).await?;
    let mut events = respond::submit(s, &p).await?;
    Ok((p, events.remove(0)))
}

/// A Messages body as the chat request's bytes.
fn translate(bytes: &[u8], counting: bool) -> Result<Bytes, ApiError> {
    let req: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad(format!("invalid request body: {e}")))?;
    let chat = to_chat(&req, counting)?;
    Ok(Bytes::from(chat.to_string()))
}

/// Anthropic's stream events.
struct AnthropicOut {
    tx: respond::SseTx,
    id: String,
    model: String,
    input_tokens: usize,
    /// The open block: its index and kind (`thinking`, `text`).
    open: Option<(usize, &'static str)>,
    next: usize,
}

impl AnthropicOut {
    async fn event(&self, name: &str, data: Value) -> bool {
        let ev = sse::Event::default().event(name).data(data.to_string());
        self.tx.send(Ok(ev)).await.is_ok()
    }

    /// Closes the open block.
    async fn close(&mut self) -> bool {
        match self.open.take() {
            Some((index, _)) => {
                self.event(
                    "content_block_stop",
                    json!({"type": "content_block_stop", "index": index}),
                )
                .await
            }
            None => true,
        }
    }

    /// Sends `text` into a block of `kind`, opening it (and closing
    /// another) first.
    async fn delta(&mut self, kind: &'static str, text: &str) -> bool {
        if text.is_empty() {
            return true;
        }
        if self.open.map(|(_, k)| k) != Some(kind) {
            if !self.close().await {
                return false;
            }
            let index = self.next;
            self.next += 1;
            self.open = Some((index, kind));
            let block = match kind {
                "thinking" => json!({"type": "thinking", "thinking": "", "signature": ""}),
                _ => json!({"type": "text", "text": ""}),
            };
            let start =
                json!({"type": "content_block_start", "index": index, "content_block": block});
            if !self.event("content_block_start", start).await {
                return false;
            }
        }
        let index = self.next - 1;
        let delta = match kind {
            "thinking" => json!({"type": "thinking_delta", "thinking": text}),
            _ => json!({"type": "text_delta", "text": text}),
        };
        self.event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        )
        .await
    }

    async fn pieces_of(&mut self, p: &Pieces) -> bool {
        self.delta("thinking", &p.reasoning).await && self.delta("text", &p.content).await
    }

    /// One tool_use block: start (empty input), the arguments as one
    /// input_json_delta, stop.
    async fn tool_use(&mut self, call: &ToolCall) -> bool {
        let index = self.next;
        self.next += 1;
        let id = format!("toolu_{}", &super::tools::call_id()[5..]);
        let block = json!({"type": "tool_use", "id": id, "name": call.name, "input": {}});
        let delta = json!({"type": "input_json_delta", "partial_json": call.arguments});
        self.event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": block}),
        )
        .await
            && self
                .event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": index, "delta": delta}),
                )
                .await
            && self
                .event(
                    "content_block_stop",
                    json!({"type": "content_block_stop", "index": index}),
                )
                .await
    }
}

impl respond::StreamOut for AnthropicOut {
    async fn start(&mut self) -> bool {
        let message = json!({"id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0}});
        self.event(
            "message_start",
            json!({"type": "message_start", "message": message}),
        )
        .await
            && self.event("ping", json!({"type": "ping"})).await
    }

    async fn logprobs(&mut self, _entry: Value) -> bool {
        true // the Messages API has none
    }

    async fn progress(&mut self, pr: super::worker::Progress) -> bool {
        respond::send_progress_comment(&self.tx, pr).await
    }

    async fn text(&mut self, text: String) -> bool {
        self.delta("text", &text).await
    }

    async fn pieces(&mut self, pieces: Pieces) -> bool {
        self.pieces_of(&pieces).await
    }

    async fn finish(&mut self, f: respond::Finish) {
        if !self.pieces_of(&f.end.pieces).await {
            return;
        }
        // A message always has a block: an empty answer gets an empty text.
        if self.next == 0 && f.end.calls.is_empty() {
            let start = json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}});
            if !self.event("content_block_start", start).await {
                return;
            }
            self.next = 1;
            self.open = Some((0, "text"));
        }
        if !self.close().await {
            return;
        }
        for call in &f.end.calls {
            if !self.tool_use(call).await {
                return;
            }
        }
        let delta = json!({"type": "message_delta",
            "delta": {"stop_reason": stop_reason(f.reason, f.stop_sequence.as_deref()), "stop_sequence": f.stop_sequence},
            "usage": {"output_tokens": f.tokens}});
        if self.event("message_delta", delta).await {
            self.event("message_stop", json!({"type": "message_stop"}))
                .await;
        }
    }

    async fn error(&mut self, e: ApiError) {
        self.event(
            "error",
            super::api::anthropic_error_body("api_error", &e.message),
        )
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_loop_translates_to_chat() {
        let req = json!({"model": "m", "max_tokens": 64, "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "stop_sequences": ["\n\n"], "metadata": {"user_id": "u"}});
        let chat = to_chat(&req, false).unwrap();
        let m = chat["messages"].as_array().unwrap();
        assert_eq!(m.len(), 4);
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(
            m[2]["tool_calls"][0]["function"]["arguments"],
            "{\"city\":\"Paris\"}"
        );
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"})
        );
        assert_eq!(chat["tool_choice"], "required");
        assert_eq!(chat["parallel_tool_calls"], false);
        assert_eq!(chat["stop"], json!(["\n\n"]));
        assert_eq!(
            chat["tools"][0]["function"]["parameters"],
            json!({"type": "object"})
        );
    }

    #[test]
    fn what_cannot_be_served_is_refused_by_name() {
        let base = json!({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}]});
        let with = |k: &str, v: Value| {
            let mut r = base.clone();
            r[k] = v;
            to_chat(&r, false).err().map(|e| (e.param, e.message))
        };
        assert!(with("top_k", json!(3)).is_none());
        assert!(with("nonsense", json!(1)).unwrap().1.contains("nonsense"));
        assert_eq!(
            with("max_tokens", Value::Null).unwrap().0,
            Some("max_tokens")
        );
        let image = json!([{"role": "user", "content": [{"type": "image", "source": {}}]}]);
        assert_eq!(with("messages", image).unwrap().0, Some("messages"));
        assert_eq!(
            with("tool_choice", json!({"type": "tool"})).unwrap().0,
            Some("tool_choice")
        );
        assert!(to_chat(&json!({"messages": []}), true).is_ok());
    }

    #[test]
    fn stop_reasons() {
        assert_eq!(stop_reason("tool_calls", None), "tool_use");
        assert_eq!(stop_reason("length", None), "max_tokens");
        assert_eq!(stop_reason("stop", Some("\n")), "stop_sequence");
        assert_eq!(stop_reason("stop", None), "end_turn");
    }
}
