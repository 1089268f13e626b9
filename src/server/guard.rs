//! Who may use the server, decided from a request's head before any byte
//! of its body is read: the API key (compared in constant time), and,
//! when no key is set, the `Host` and `Origin` a browser sends (so that a
//! web page, or a DNS-rebinding one, cannot drive a local server), and
//! the declared body size of each endpoint; and CORS: a browser's
//! preflight is answered, and an admitted origin (`--cors-origin`, or a
//! local page's) is told it may read the answer.

use super::api::ApiError;
use super::Shared;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// The largest completion request body (axum's former default).
pub const COMPLETION_BODY_BYTES_MAX: usize = 2 * 1024 * 1024;
/// The largest body another endpoint accepts (they read none).
pub const OTHER_BODY_BYTES_MAX: usize = 16 * 1024;

/// The middleware in front of every route.
pub(super) async fn guard(State(s): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let origin = allowed_origin(&s, req.headers());
    let preflight = req.method() == Method::OPTIONS
        && req
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let mut response = if preflight {
        match &origin {
            Some(_) => preflight_answer(req.headers()),
            None => refusal(
                req.uri().path(),
                ApiError::forbidden(
                    "CORS preflight from an origin this server does not admit (see --cors-origin)",
                ),
            ),
        }
    } else {
        match admit(&s, req.method(), req.uri().path(), req.headers()) {
            Ok(()) => next.run(req).await,
            Err(e) => refusal(req.uri().path(), e),
        }
    };
    if let Some(o) = origin {
        let h = response.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, o);
        h.insert(header::VARY, HeaderValue::from_static("Origin"));
        h.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("x-moestream-seed, retry-after"),
        );
    }
    response
}

/// A refusal in the shape of the API `path` belongs to: Anthropic's
/// `{"type": "error", "error": {...}}` for `/v1/messages*`, OpenAI's
/// otherwise.
pub(super) fn refusal(path: &str, e: ApiError) -> Response {
    if is_anthropic(path) {
        e.into_anthropic_response()
    } else {
        e.into_response()
    }
}

/// Whether `path` is one of Anthropic's Messages API.
pub fn is_anthropic(path: &str) -> bool {
    path == "/v1/messages" || path.starts_with("/v1/messages/")
}

/// Whether `path` needs the API key (when one is set): the OpenAI and
/// Anthropic APIs and llama-server's endpoints; `/health` and `/metrics`
/// do not.
pub fn needs_key(path: &str) -> bool {
    path.starts_with("/v1/")
        || path.starts_with("/slots/")
        || matches!(path, "/tokenize" | "/detokenize" | "/props" | "/slots")
}

/// The `Access-Control-Allow-Origin` for a request's `Origin`: `*` or the
/// origin itself under `--cors-origin * | ORIGIN`; without the flag, a
/// local page's origin (one [`check_browser`] admits); None otherwise.
fn allowed_origin(s: &Shared, headers: &HeaderMap) -> Option<HeaderValue> {
    let sent = headers.get(header::ORIGIN)?;
    let origin = sent.to_str().ok()?;
    match s.config.cors_origin.as_deref() {
        Some("*") => Some(HeaderValue::from_static("*")),
        Some(allowed) if allowed.trim_end_matches('/') == origin => Some(sent.clone()),
        _ => {
            let authority = origin.split_once("://").map_or("", |(_, rest)| rest);
            is_local(host_name(authority), &s.config.host).then(|| sent.clone())
        }
    }
}

/// The answer to an admitted preflight: the methods and the headers the
/// API reads, cached for a day.
fn preflight_answer(headers: &HeaderMap) -> Response {
    let asked = headers
        .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .cloned()
        .unwrap_or(HeaderValue::from_static(
            "authorization, content-type, x-api-key, anthropic-version",
        ));
    let mut r = axum::http::StatusCode::NO_CONTENT.into_response();
    let h = r.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked);
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("86400"),
    );
    r
}

/// Whether a request may go on, from its head alone.
fn admit(s: &Shared, method: &Method, path: &str, headers: &HeaderMap) -> Result<(), ApiError> {
    match &s.config.api_key {
        None => check_browser(headers, &s.config.host, s.config.cors_origin.as_deref())?,
        Some(key) if needs_key(path) => authorize(headers, key)?,
        Some(_) => {}
    }
    let cap = body_bytes_max(method, path);
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(n) if n > cap as u64 => Err(ApiError::too_large(n, cap)),
        _ => Ok(()),
    }
}

/// The body bytes an endpoint accepts.
pub fn body_bytes_max(method: &Method, path: &str) -> usize {
    let completion = matches!(
        path,
        "/v1/chat/completions"
            | "/v1/completions"
            | "/v1/messages"
            | "/v1/messages/count_tokens"
            | "/tokenize"
            | "/detokenize"
    );
    if method == Method::POST && completion {
        COMPLETION_BODY_BYTES_MAX
    } else {
        OTHER_BODY_BYTES_MAX
    }
}

/// `Authorization: Bearer KEY` (OpenAI's clients) or `x-api-key: KEY`
/// (Anthropic's) with the server's key.
fn authorize(headers: &HeaderMap, key: &str) -> Result<(), ApiError> {
    let sent = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .or_else(|| headers.get("x-api-key").map(|v| v.as_bytes()));
    match sent {
        Some(sent) if same_key(sent, key.as_bytes()) => Ok(()),
        _ => Err(ApiError::unauthorized()),
    }
}

/// Compares a sent key with the server's in time that depends on the
/// server key's length only (never on where they first differ).
pub fn same_key(sent: &[u8], key: &[u8]) -> bool {
    let mut diff = u8::from(sent.len() != key.len());
    for (i, k) in key.iter().enumerate() {
        let s = if sent.is_empty() {
            0
        } else {
            sent[i % sent.len()]
        };
        diff |= s ^ k;
    }
    std::hint::black_box(diff) == 0
}

/// Without an API key: `Host` must name loopback or the bound host, and an
/// `Origin`, when sent, too, unless `--cors-origin` admits it (any other
/// cross-origin browser request is refused).
fn check_browser(headers: &HeaderMap, bound: &str, cors: Option<&str>) -> Result<(), ApiError> {
    if let Some(h) = headers.get(header::HOST) {
        let host = h.to_str().unwrap_or("");
        if !is_local(host_name(host), bound) {
            return Err(ApiError::forbidden(format!(
                "Host `{host}` is not this server's: without --api-key only localhost, 127.0.0.1, [::1] and --host {bound} are accepted"
            )));
        }
    }
    if let Some(o) = headers.get(header::ORIGIN) {
        let origin = o.to_str().unwrap_or("");
        if cors.is_some_and(|c| c == "*" || c.trim_end_matches('/') == origin) {
            return Ok(());
        }
        let authority = origin.split_once("://").map_or("", |(_, rest)| rest);
        if !is_local(host_name(authority), bound) {
            return Err(ApiError::forbidden(format!(
                "cross-origin request from `{origin}` refused: without --api-key only pages on localhost or --host {bound} may call this server"
            )));
        }
    }
    Ok(())
}

/// The host of `authority` (`name:port`, `[v6]:port` or a bare name).
pub fn host_name(authority: &str) -> &str {
    let authority = authority.split('/').next().unwrap_or("");
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("");
    }
    match authority.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => authority,
    }
}

/// Whether `name` is a loopback name or the host the server is bound to.
pub fn is_local(name: &str, bound: &str) -> bool {
    let bound = bound.trim_start_matches('[').trim_end_matches(']');
    !name.is_empty()
        && (["localhost", "127.0.0.1", "::1"]
            .iter()
            .any(|l| name.eq_ignore_ascii_case(l))
            || name.eq_ignore_ascii_case(bound))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_key_compare_needs_every_byte_and_the_length() {
        assert!(same_key(b"sekret", b"sekret"));
        for sent in [
            &b""[..],
            b"sekre",
            b"sekretx",
            b"Sekret",
            b"sekreT",
            b"sekretsekret",
        ] {
            assert!(!same_key(sent, b"sekret"), "{sent:?}");
        }
    }

    #[test]
    fn host_names_of_authorities() {
        let cases = [
            ("localhost:8080", "localhost"),
            ("127.0.0.1", "127.0.0.1"),
            ("[::1]:80", "::1"),
            ("[::1]", "::1"),
            ("evil.example:80", "evil.example"),
            ("localhost:8080/path", "localhost"),
            ("localhost.evil.example", "localhost.evil.example"),
            ("", ""),
        ];
        for (authority, name) in cases {
            assert_eq!(host_name(authority), name, "{authority}");
        }
        assert!(is_local("LOCALHOST", "127.0.0.1"));
        assert!(is_local("box.lan", "box.lan"));
        assert!(!is_local("", ""));
        assert!(!is_local("evil.example", "127.0.0.1"));
    }
}
