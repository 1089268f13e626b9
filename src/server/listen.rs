//! The accept loop: HTTP/1 connections under a limit, each with a header
//! read timeout, and a shutdown that ends every connection in bounded time.
//!
//! Invariants:
//! - at most [`Limits::connections_max`] connections are served at once;
//!   the next ones wait in the kernel's listen backlog (nothing of theirs
//!   is read or allocated);
//! - one client address (loopback excepted: local clients share it) holds
//!   at most [`Limits::connections_per_client_max`] of them; past that a
//!   connection is answered 429 and closed before any of it is read;
//! - a client has [`Limits::header_timeout`] to send a request's headers,
//!   and an idle keep-alive connection lives that long (hyper's header
//!   read timer runs from the moment it waits for a request);
//! - at most [`READ_BUF_BYTES_MAX`] of a connection's bytes are buffered
//!   before a handler asks for them (the headers must fit in it);
//! - once stopped, idle connections close at once, running ones get the
//!   grace time (plus [`SHUTDOWN_MARGIN`]), and whatever is left is
//!   dropped: no client can hold the process open.

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

/// What one client may hold of the server.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Connections served at once.
    pub connections_max: usize,
    /// Connections one non-loopback client address may hold at once.
    pub connections_per_client_max: usize,
    /// Time to send a request's headers; also how long an idle
    /// keep-alive connection stays open.
    pub header_timeout: Duration,
    /// Time to send a request's body once its headers are in.
    pub body_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            connections_max: CONNECTIONS_MAX_DEFAULT,
            connections_per_client_max: CONNECTIONS_PER_CLIENT_MAX_DEFAULT,
            header_timeout: Duration::from_secs(READ_TIMEOUT_S_DEFAULT),
            body_timeout: Duration::from_secs(READ_TIMEOUT_S_DEFAULT),
        }
    }
}

/// Default of `--max-connections`: with 2 MB bodies, at most 256 MB of
/// request bodies in flight (and far fewer past authentication).
pub const CONNECTIONS_MAX_DEFAULT: usize = 128;
/// Default of `--max-connections-per-client`: an eighth of the default
/// limit, so one remote address cannot hold every connection.
pub const CONNECTIONS_PER_CLIENT_MAX_DEFAULT: usize = 16;
/// Default of `--read-timeout`, seconds.
pub const READ_TIMEOUT_S_DEFAULT: u64 = 30;
/// A connection's read buffer (hyper's default is ~400 KB).
pub const READ_BUF_BYTES_MAX: usize = 64 * 1024;
/// Time past the grace given to connections still open at shutdown.
pub const SHUTDOWN_MARGIN: Duration = Duration::from_secs(1);

/// Serves `app` on `listener` until `stop` completes, then closes every
/// connection within `grace` (+ [`SHUTDOWN_MARGIN`]).
pub(super) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    stop: impl Future<Output = ()>,
    grace: Duration,
) {
    let permits = Arc::new(Semaphore::new(limits.connections_max.max(1)));
    let clients = Clients::new(limits.connections_per_client_max);
    let (closing, closing_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            _ = &mut stop => break,
            a = accept(&listener, &permits) => a,
        };
        let (stream, permit) = accepted;
        let Some(client) = clients.admit(stream.peer_addr().ok()) else {
            conns.spawn(refuse_busy_client(stream, permit));
            continue;
        };
        let conn = connection(stream, app.clone(), limits.clone(), closing_rx.clone());
        conns.spawn(async move {
            conn.await;
            drop((permit, client));
        });
        while conns.try_join_next().is_some() {}
    }
    drop(listener);
    let _ = closing.send(true);
    let drained = async { while conns.join_next().await.is_some() {} };
    let wait = grace.saturating_add(SHUTDOWN_MARGIN);
    if tokio::time::timeout(wait, drained).await.is_err() {
        eprintln!(
            "closing {} connection(s) still open after the grace time",
            conns.len()
        );
    }
    conns.abort_all();
}

/// The next connection, once there is room for one. Accept errors (out of
/// file descriptors) are retried after a pause, not fatal.
async fn accept(
    listener: &TcpListener,
    permits: &Arc<Semaphore>,
) -> (TcpStream, OwnedSemaphorePermit) {
    let permit = permits
        .clone()
        .acquire_owned()
        .await
        .expect("the connection semaphore is never closed");
    loop {
        match listener.accept().await {
            Ok((stream, _)) => return (stream, permit),
            Err(e) => {
                tracing::warn!("accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The connections each remote client address holds.
#[derive(Clone)]
struct Clients {
    held: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
    per_client_max: usize,
}

/// One admitted connection of a client; dropping it gives its place back.
struct ClientPlace {
    clients: Clients,
    ip: std::net::IpAddr,
}

impl Clients {
    fn new(per_client_max: usize) -> Clients {
        Clients {
            held: Arc::default(),
            per_client_max: per_client_max.max(1),
        }
    }

    /// A place for a connection from `peer`, or `None` when that client
    /// holds its limit (loopback and unknown peers are always admitted,
    /// uncounted).
    fn admit(&self, peer: Option<std::net::SocketAddr>) -> Option<Option<ClientPlace>> {
        let ip = match peer {
            Some(a) if !a.ip().is_loopback() => a.ip(),
            _ => return Some(None),
        };
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let n = held.entry(ip).or_insert(0);
        if *n >= self.per_client_max {
            return None;
        }
        *n += 1;
        Some(Some(ClientPlace {
            clients: self.clone(),
            ip,
        }))
    }
}

impl Drop for ClientPlace {
    fn drop(&mut self) {
        let mut held = self.clients.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.ip);
            }
        }
    }
}

/// Answers a client past its connection limit with a 429, reading
/// nothing, and closes the connection.
async fn refuse_busy_client(stream: TcpStream, permit: OwnedSemaphorePermit) {
    let body = r#"{"error":{"message":"too many connections from this address","type":"rate_limit_error","code":"too_many_connections"}}"#;
    let reply = format!(
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    // A fresh socket's send buffer holds the short reply whole.
    let write = async {
        stream.writable().await?;
        stream.try_write(reply.as_bytes())
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), write).await;
    drop((stream, permit));
}

/// Serves one connection until it ends, or closes it once `closing` is
/// set (at once when idle, after the request under way otherwise).
async fn connection(
    stream: TcpStream,
    app: Router,
    limits: Limits,
    mut closing: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(READ_BUF_BYTES_MAX);
    let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = closing.wait_for(|c| *c) => {}
    }
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_remote_client_holds_at_most_its_limit_and_loopback_is_free() {
        let clients = Clients::new(2);
        let remote = Some("10.1.2.3:5000".parse().unwrap());
        let other = Some("10.1.2.4:5000".parse().unwrap());
        let a = clients.admit(remote).unwrap();
        let _b = clients.admit(remote).unwrap();
        assert!(clients.admit(remote).is_none(), "a third is refused");
        assert!(
            clients.admit(other).unwrap().is_some(),
            "another client is not"
        );
        let local = Some("127.0.0.1:5000".parse().unwrap());
        for _ in 0..10 {
            assert!(
                clients.admit(local).unwrap().is_none(),
                "loopback is not counted"
            );
        }
        drop(a);
        assert!(
            clients.admit(remote).is_some(),
            "a closed one gives its place back"
        );
    }
}
