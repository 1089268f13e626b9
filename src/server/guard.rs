//! Who may use the server, decided from a request's head before any byte
//! of its body is read: the API key (compared in constant time), and,
//! when no key is set, the `Host` and `Origin` a browser sends (so that a
//! web page, or a DNS-rebinding one, cannot drive a local server), and
//! the declared body size of each endpoint.

use super::api::ApiError;
use super::Shared;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// The largest completion request body (axum's former default).
pub const COMPLETION_BODY_BYTES_MAX: usize = 2 * 1024 * 1024;
/// The largest body another endpoint accepts (they read none).
pub const OTHER_BODY_BYTES_MAX: usize = 16 * 1024;

/// The middleware in front of every route.
pub(super) async fn guard(State(s): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    match admit(&s, req.method(), req.uri().path(), req.headers()) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

/// Whether a request may go on, from its head alone.
fn admit(s: &Shared, method: &Method, path: &str, headers: &HeaderMap) -> Result<(), ApiError> {
    match &s.config.api_key {
        None => check_browser(headers, &s.config.host)?,
        Some(key) if path.starts_with("/v1/") => authorize(headers, key)?,
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
    let completion = matches!(path, "/v1/chat/completions" | "/v1/completions");
    if method == Method::POST && completion {
        COMPLETION_BODY_BYTES_MAX
    } else {
        OTHER_BODY_BYTES_MAX
    }
}

/// `Authorization: Bearer KEY` with the server's key.
fn authorize(headers: &HeaderMap, key: &str) -> Result<(), ApiError> {
    let sent = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
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
/// `Origin`, when sent, too (a cross-origin browser request is refused).
fn check_browser(headers: &HeaderMap, bound: &str) -> Result<(), ApiError> {
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
