//! The accept loop: HTTP/1 connections under a limit, each with a header
//! read timeout, and a shutdown that ends every connection in bounded time.
//!
//! Invariants:
//! - at most [`Limits::connections_max`] connections are served at once;
//!   the next ones wait in the kernel's listen backlog (nothing of theirs
//!   is read or allocated);
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
            header_timeout: Duration::from_secs(READ_TIMEOUT_S_DEFAULT),
            body_timeout: Duration::from_secs(READ_TIMEOUT_S_DEFAULT),
        }
    }
}

/// Default of `--max-connections`: with 2 MB bodies, at most 256 MB of
/// request bodies in flight (and far fewer past authentication).
pub const CONNECTIONS_MAX_DEFAULT: usize = 128;
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
    let (closing, closing_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            _ = &mut stop => break,
            a = accept(&listener, &permits) => a,
        };
        let (stream, permit) = accepted;
        let conn = connection(stream, app.clone(), limits.clone(), closing_rx.clone());
        conns.spawn(async move {
            conn.await;
            drop(permit);
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
