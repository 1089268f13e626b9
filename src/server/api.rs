//! The OpenAI API's request fields and error shape: parsing, checking,
//! and turning a request into what the engine needs.

use crate::engine::gen_config::Overrides;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};

/// An error answered in the OpenAI shape
/// `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header (429, 503).
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 400: the request is malformed or asks for what cannot be done.
    pub fn bad(message: impl Into<String>) -> ApiError {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the field at fault.
    pub fn bad_param(param: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param),
            ..Self::bad(message)
        }
    }

    /// 401: no key or the wrong one.
    pub fn unauthorized() -> ApiError {
        ApiError {
            code: Some("invalid_api_key"),
            ..Self::new(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "missing or incorrect API key (send `Authorization: Bearer KEY` or `x-api-key: KEY`)",
            )
        }
    }

    /// 403: a request a browser page may not make (no API key is set).
    pub fn forbidden(message: impl Into<String>) -> ApiError {
        Self::new(StatusCode::FORBIDDEN, "invalid_request_error", message)
    }

    /// 413: a body over the endpoint's limit.
    pub fn too_large(bytes: u64, max: usize) -> ApiError {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body has {bytes} bytes; this endpoint accepts at most {max}"),
        )
    }

    /// 408: the body did not arrive in time.
    pub fn body_timeout(seconds: u64) -> ApiError {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            format!("the request body did not arrive within {seconds} s (--read-timeout)"),
        )
    }

    /// 404: a model this server does not serve.
    pub fn unknown_model(asked: &str, served: &str) -> ApiError {
        ApiError {
            param: Some("model"),
            code: Some("model_not_found"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("the model `{asked}` does not exist; this server serves `{served}`"),
            )
        }
    }

    /// 404: no such endpoint.
    pub fn not_found(message: impl Into<String>) -> ApiError {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
    }

    /// 405: the endpoint does not take this method.
    pub fn method_not_allowed(message: impl Into<String>) -> ApiError {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            message,
        )
    }

    /// 429 with Retry-After: every slot is busy and the queue is full.
    pub fn busy(message: impl Into<String>) -> ApiError {
        ApiError {
            retry_after: Some(1),
            code: Some("rate_limit_exceeded"),
            ..Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message)
        }
    }

    /// 503: loading, or shutting down.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            retry_after: Some(5),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
        }
    }

    /// 500: the engine failed the request.
    pub fn internal(message: impl Into<String>) -> ApiError {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The error's JSON body.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl ApiError {
    /// This error in Anthropic's shape `{"type": "error", "error": {"type",
    /// "message"}}` (the field at fault leads the message), with its
    /// status and Retry-After.
    pub fn into_anthropic_response(self) -> Response {
        let kind = match self.status {
            StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
            s if s.is_client_error() => "invalid_request_error",
            _ => "api_error",
        };
        let message = match self.param {
            Some(p) => format!("{p}: {}", self.message),
            None => self.message.clone(),
        };
        let body = anthropic_error_body(kind, &message);
        let mut r = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert("retry-after", HeaderValue::from(s));
        }
        r
    }
}

/// Anthropic's `{"type": "error", "error": {"type": kind, "message"}}`.
pub fn anthropic_error_body(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert("retry-after", HeaderValue::from(s));
        }
        r
    }
}

/// A `stop` field: one string or a list.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// A completions `prompt`: text, a list of one text, or token ids.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum PromptField {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
}

/// `stream_options`.
#[derive(Deserialize, Debug, Clone, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// The fields of `/v1/chat/completions` and `/v1/completions` requests
/// (OpenAI's names; `top_k`, `min_p`, `repetition_penalty` and
/// `ignore_eos` as vLLM and llama-server accept them).
#[derive(Deserialize, Debug, Default)]
pub struct Request {
    pub model: Option<String>,
    /// Chat messages as sent (checked by [`super::tools::template_message`]).
    pub messages: Option<Vec<Value>>,
    pub prompt: Option<PromptField>,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    /// `temperature`, `top_p`, `top_k`, `min_p`, `presence_penalty`,
    /// `frequency_penalty`, `repetition_penalty`, `seed`: the sampling
    /// fields as the engine declares them.
    #[serde(flatten)]
    pub sampling: Overrides,
    pub stop: Option<Stop>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    /// Streamed: a `prompt_progress` chunk (llama-server's) each time the
    /// prefill moves; without it, an SSE comment says the same.
    #[serde(default)]
    pub return_progress: bool,
    /// Chat: `true`/`false`; completions: the number of alternatives.
    pub logprobs: Option<Value>,
    pub top_logprobs: Option<usize>,
    pub n: Option<u64>,
    /// Completions: answered by refusal unless off (see
    /// [`Request::refuse_unsupported`]).
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    pub best_of: Option<u64>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub functions: Option<Value>,
    pub function_call: Option<Value>,
    pub response_format: Option<Value>,
    #[serde(default)]
    pub ignore_eos: bool,
    /// Token id (as a string) → bias in [-100, 100] added to its logit.
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    /// Extra variables for the chat template (`enable_thinking`, ...).
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// `none`, `minimal`, `low`, `medium`, `high`.
    pub reasoning_effort: Option<String>,
}

/// Template variables a request may not set through
/// `chat_template_kwargs`: the render's own.
const RESERVED_TEMPLATE_VARIABLES: [&str; 4] =
    ["messages", "tools", "documents", "add_generation_prompt"];

/// The most entries a `logit_bias` may have.
pub const LOGIT_BIAS_MAX: usize = 1024;

/// The reasoning efforts OpenAI names.
const REASONING_EFFORTS: [&str; 5] = ["none", "minimal", "low", "medium", "high"];

/// The most `properties` a `response_format` schema may declare, all
/// objects together: the grammar compiler recurses once per property (a
/// schema of 7,000 overflowed a 2 MiB thread stack and aborted the
/// server; the threads that compile have 16 MiB).
pub const SCHEMA_PROPERTIES_MAX: usize = 4096;

/// The `properties` entries of every object in `schema` (serde_json's
/// recursion limit of 128 bounds the depth of this walk).
fn properties_in(schema: &Value) -> usize {
    match schema {
        Value::Object(m) => {
            let own = m
                .get("properties")
                .and_then(Value::as_object)
                .map_or(0, |p| p.len());
            own + m.values().map(properties_in).sum::<usize>()
        }
        Value::Array(a) => a.iter().map(properties_in).sum(),
        _ => 0,
    }
}

/// The most alternatives `top_logprobs` may ask for (OpenAI's limit).
pub const TOP_LOGPROBS_MAX: usize = 20;

impl Request {
    /// Parses a request body; malformed JSON or a field of the wrong type
    /// is a 400 naming it.
    pub fn parse(body: &[u8]) -> Result<Request, ApiError> {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad(format!("invalid request body: {e}")))
    }

    /// Refuses what is not built yet, with a 400 naming the field (`n`
    /// beyond the slots is refused once the prompt is known).
    pub fn refuse_unsupported(&self) -> Result<(), ApiError> {
        if self.n == Some(0) {
            return Err(ApiError::bad_param("n", "n must be at least 1"));
        }
        if self.echo == Some(true) {
            return Err(ApiError::bad_param(
                "echo",
                "echo is not supported (the answer never repeats the prompt)",
            ));
        }
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::bad_param(
                "suffix",
                "suffix (fill in the middle) is not supported",
            ));
        }
        if self.best_of.is_some_and(|b| b != 1) {
            return Err(ApiError::bad_param(
                "best_of",
                "best_of other than 1 is not supported (one sequence per request)",
            ));
        }
        if self.functions.is_some() || self.function_call.is_some() {
            return Err(ApiError::bad_param(
                "functions",
                "the deprecated `functions`/`function_call` are not supported; send `tools` and `tool_choice`",
            ));
        }
        Ok(())
    }

    /// The output constraint of `response_format`: none for `text`, any
    /// JSON object for `json_object`, `json_schema.schema` for
    /// `json_schema`; anything else is a 400 naming the field.
    pub fn constraint(&self) -> Result<Option<crate::engine::Constraint>, ApiError> {
        use crate::engine::Constraint;
        let Some(f) = &self.response_format else {
            return Ok(None);
        };
        let bad = |m: String| ApiError::bad_param("response_format", m);
        match f["type"].as_str() {
            Some("text") => Ok(None),
            Some("json_object") => Ok(Some(Constraint::JsonObject)),
            Some("json_schema") => match f["json_schema"].get("schema") {
                Some(schema) if properties_in(schema) > SCHEMA_PROPERTIES_MAX => Err(bad(format!(
                    "the schema declares {} properties; at most {SCHEMA_PROPERTIES_MAX}",
                    properties_in(schema)
                ))),
                Some(schema) if schema.is_object() => {
                    Ok(Some(Constraint::JsonSchema(schema.clone())))
                }
                _ => Err(bad(
                    "json_schema needs json_schema.schema (an object)".into()
                )),
            },
            _ => Err(bad(format!(
                "type {}: expected text, json_object or json_schema",
                f["type"]
            ))),
        }
    }

    /// The sampling fields set in the request.
    pub fn overrides(&self) -> Overrides {
        self.sampling
    }

    /// The token limit asked for (`max_completion_tokens` wins).
    pub fn max_tokens(&self) -> Option<u64> {
        self.max_completion_tokens.or(self.max_tokens)
    }

    /// The non-empty stop sequences (at most 16 may be given).
    pub fn stops(&self) -> Result<Vec<String>, ApiError> {
        let stops = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stops.len() > 16 {
            return Err(ApiError::bad_param(
                "stop",
                format!("{} stop sequences; at most 16", stops.len()),
            ));
        }
        Ok(stops.into_iter().filter(|s| !s.is_empty()).collect())
    }

    /// Log-probabilities wanted, as the number of alternatives: chat's
    /// `logprobs: true` with `top_logprobs`, or completions' `logprobs: N`.
    pub fn logprobs(&self, chat: bool) -> Result<Option<usize>, ApiError> {
        let top = match (&self.logprobs, chat) {
            (None, _) | (Some(Value::Null), _) | (Some(Value::Bool(false)), true) => {
                return Ok(None)
            }
            (Some(Value::Bool(true)), true) => self.top_logprobs.unwrap_or(0),
            (Some(Value::Number(n)), false) => n.as_u64().ok_or_else(|| {
                ApiError::bad_param("logprobs", format!("logprobs {n} is not a count"))
            })? as usize,
            (Some(v), _) => {
                let want = if chat { "true or false" } else { "an integer" };
                return Err(ApiError::bad_param(
                    "logprobs",
                    format!("logprobs {v}: expected {want}"),
                ));
            }
        };
        if top > TOP_LOGPROBS_MAX {
            return Err(ApiError::bad_param(
                "top_logprobs",
                format!("{top} alternatives; at most {TOP_LOGPROBS_MAX}"),
            ));
        }
        Ok(Some(top))
    }

    /// The template's keyword arguments: `reasoning_effort` mapped onto
    /// the template's own control (a `reasoning_effort` variable takes it
    /// as sent; `enable_thinking` or DeepSeek's `thinking` are switched
    /// off by `none`/`minimal`, on otherwise), then `chat_template_kwargs`
    /// over it. An effort the template has no control for, or a reserved
    /// variable, is a 400 naming the field.
    pub fn template_kwargs(
        &self,
        template: &crate::formats::chat::ChatTemplate,
    ) -> Result<serde_json::Map<String, Value>, ApiError> {
        let mut kwargs = serde_json::Map::new();
        if let Some(effort) = &self.reasoning_effort {
            if !REASONING_EFFORTS.contains(&effort.as_str()) {
                return Err(ApiError::bad_param(
                    "reasoning_effort",
                    format!("reasoning_effort {effort:?}: expected one of {REASONING_EFFORTS:?}"),
                ));
            }
            let vars = template.variables();
            let on = !matches!(effort.as_str(), "none" | "minimal");
            if vars.contains("reasoning_effort") {
                kwargs.insert("reasoning_effort".into(), json!(effort));
            } else if vars.contains("enable_thinking") {
                kwargs.insert("enable_thinking".into(), json!(on));
            } else if vars.contains("thinking") {
                kwargs.insert("thinking".into(), json!(on));
            } else {
                return Err(ApiError::bad_param(
                    "reasoning_effort",
                    "this model's chat template has no reasoning control (reasoning_effort, enable_thinking or thinking)",
                ));
            }
        }
        for (k, v) in self.chat_template_kwargs.iter().flatten() {
            if RESERVED_TEMPLATE_VARIABLES.contains(&k.as_str()) {
                return Err(ApiError::bad_param(
                    "chat_template_kwargs",
                    format!("chat_template_kwargs may not set `{k}` (the request's own field)"),
                ));
            }
            kwargs.insert(k.clone(), v.clone());
        }
        Ok(kwargs)
    }

    /// `logit_bias` as (token id, bias) pairs: ids below `vocab`, biases
    /// within [-100, 100]; anything else is a 400 naming the field.
    pub fn logit_bias(&self, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
        let Some(map) = &self.logit_bias else {
            return Ok(Vec::new());
        };
        let bad = |m: String| ApiError::bad_param("logit_bias", m);
        if map.len() > LOGIT_BIAS_MAX {
            return Err(bad(format!(
                "{} entries; at most {LOGIT_BIAS_MAX}",
                map.len()
            )));
        }
        map.iter()
            .map(|(k, v)| {
                let id = k
                    .parse::<u32>()
                    .ok()
                    .filter(|&id| (id as usize) < vocab)
                    .ok_or_else(|| bad(format!("{k:?} is not a token id below {vocab}")))?;
                let bias = v
                    .as_f64()
                    .filter(|b| (-100.0..=100.0).contains(b))
                    .ok_or_else(|| {
                        bad(format!(
                            "token {k}: bias {v} is not a number in [-100, 100]"
                        ))
                    })?;
                Ok((id, bias as f32))
            })
            .collect()
    }

    /// Whether a usage chunk ends the stream.
    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_fields_are_refused_by_name() {
        let cases = [
            (r#"{"n": 2}"#, None),
            (r#"{"n": 1}"#, None),
            (r#"{"n": 0}"#, Some("n")),
            (r#"{"echo": true}"#, Some("echo")),
            (r#"{"echo": false}"#, None),
            (r#"{"suffix": "x"}"#, Some("suffix")),
            (r#"{"best_of": 2}"#, Some("best_of")),
            (r#"{"best_of": 1}"#, None),
            (r#"{"tools": []}"#, None),
            (r#"{"functions": []}"#, Some("functions")),
            (r#"{"response_format": {"type": "json_object"}}"#, None),
            (r#"{"response_format": {"type": "text"}}"#, None),
        ];
        for (body, param) in cases {
            let r = Request::parse(body.as_bytes()).unwrap();
            assert_eq!(
                r.refuse_unsupported().err().and_then(|e| e.param),
                param,
                "{body}"
            );
        }
    }

    #[test]
    fn logprobs_fields() {
        let lp = |body: &str, chat| Request::parse(body.as_bytes()).unwrap().logprobs(chat);
        assert_eq!(lp(r#"{}"#, true).unwrap(), None);
        assert_eq!(
            lp(r#"{"logprobs": true, "top_logprobs": 3}"#, true).unwrap(),
            Some(3)
        );
        assert_eq!(lp(r#"{"logprobs": false}"#, true).unwrap(), None);
        assert_eq!(lp(r#"{"logprobs": 2}"#, false).unwrap(), Some(2));
        assert!(lp(r#"{"logprobs": 2}"#, true).is_err());
        assert!(lp(r#"{"logprobs": true, "top_logprobs": 21}"#, true).is_err());
    }

    #[test]
    fn bad_types_and_stops() {
        assert!(Request::parse(br#"{"max_tokens": "x"}"#).is_err());
        assert!(Request::parse(b"not json").is_err());
        let r = Request::parse(br#"{"stop": ["a", "", "b"]}"#).unwrap();
        assert_eq!(r.stops().unwrap(), ["a", "b"]);
        let r = Request::parse(br#"{"stop": "x"}"#).unwrap();
        assert_eq!(r.stops().unwrap(), ["x"]);
    }
}
