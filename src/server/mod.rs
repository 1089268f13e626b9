//! `moestream serve`: an OpenAI-compatible HTTP server over one
//! [`SessionPool`](crate::engine::SessionPool).
//!
//! ```text
//! clients ──HTTP──▶ axum handlers (tokio) ──Command──▶ engine thread
//!                    parse, template, tokenize          owns Model + pool
//!                    ◀──Event (per request channel)──   steps all slots
//! ```
//!
//! The engine thread loads the model (the server answers 503 meanwhile),
//! then steps every active slot together, so each MoE layer reads the
//! union of all requests' experts once per step. A request whose client
//! goes away is cancelled within one step (its channel closes). On SIGINT
//! or SIGTERM the server stops admitting, lets running requests finish
//! within the grace time, cancels the rest, saves the KV, and returns.

pub mod api;
pub mod kv_dir;
pub mod metrics;
mod respond;
pub mod stop;
pub mod worker;

use crate::chat::ChatTemplate;
use crate::gen_config::{GenerationDefaults, Overrides};
use crate::model::Model;
use crate::tokenizer::Tokenizer;
use api::ApiError;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics::Snapshot;
use moestream_scheduler::SchedulerConfig;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use worker::Command;

/// What `serve` is set up with (besides the model it loads).
pub struct ServerConfig {
    /// The model's name in `/v1/models` and responses.
    pub model_name: String,
    /// Requests to `/v1/*` must send `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    pub scheduler: SchedulerConfig,
    /// Where kept prefixes are saved and restored (`--kv-dir`).
    pub kv_dir: Option<PathBuf>,
    /// The model's directory (its key names KV files).
    pub model_dir: PathBuf,
    /// How often an SSE stream sends a keep-alive comment.
    pub keep_alive: Duration,
    /// How long running requests may take to finish at shutdown.
    pub shutdown_grace: Duration,
    /// New tokens of a request that names no limit.
    pub max_tokens_default: usize,
    /// Sampling settings given on the command line (a request's own win).
    pub overrides: Overrides,
    /// Drafting for every request (a request wanting logprobs does not).
    pub speculation: crate::engine::Speculation,
}

/// Loads the model on the engine thread.
pub type Loader = Box<dyn FnOnce() -> Result<Model, String> + Send>;

const LOADING: u8 = 0;
const READY: u8 = 1;
const STOPPING: u8 = 2;

/// What the handlers share.
struct Shared {
    config: ServerConfig,
    tok: Tokenizer,
    template: Option<ChatTemplate>,
    defaults: GenerationDefaults,
    commands: std::sync::mpsc::Sender<Command>,
    phase: AtomicU8,
    metrics: Arc<Mutex<Snapshot>>,
    next_id: AtomicU64,
    /// The tokenizer prepared for constrained output, once the model is
    /// loaded (or why it cannot be).
    grammars: std::sync::OnceLock<Result<crate::engine::Grammars, String>>,
}

impl Shared {
    fn ready(&self) -> Result<(), ApiError> {
        match self.phase.load(Ordering::Acquire) {
            READY => Ok(()),
            LOADING => Err(ApiError::unavailable("the model is loading")),
            _ => Err(ApiError::unavailable("the server is shutting down")),
        }
    }

    fn authorize(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let Some(key) = &self.config.api_key else {
            return Ok(());
        };
        let sent = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if sent == Some(key.as_str()) {
            Ok(())
        } else {
            Err(ApiError::unauthorized())
        }
    }

    fn check_model(&self, asked: Option<&str>) -> Result<(), ApiError> {
        match asked {
            Some(m) if m != self.config.model_name => {
                Err(ApiError::unknown_model(m, &self.config.model_name))
            }
            _ => Ok(()),
        }
    }
}

/// When the server stops (besides a failed load).
pub type StopSignal = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Serves on `listener` until SIGINT or SIGTERM (or until the model fails
/// to load: then the load error). The model is loaded by `loader` on the
/// engine thread while the server already answers (503).
pub fn serve(
    config: ServerConfig,
    listener: std::net::TcpListener,
    tok: Tokenizer,
    template: Option<ChatTemplate>,
    loader: Loader,
) -> Result<(), String> {
    serve_until(
        config,
        listener,
        tok,
        template,
        loader,
        Box::pin(shutdown_signal()),
    )
}

/// [`serve`] until `stop` completes instead of a signal (a benchmark or
/// an embedding program ends it).
pub fn serve_until(
    config: ServerConfig,
    listener: std::net::TcpListener,
    tok: Tokenizer,
    template: Option<ChatTemplate>,
    loader: Loader,
    stop: StopSignal,
) -> Result<(), String> {
    let defaults = GenerationDefaults::load(&config.model_dir).map_err(|e| e.to_string())?;
    let kv_dir = match &config.kv_dir {
        Some(d) => Some(kv_dir::KvDir::new(d, &config.model_dir).map_err(|e| e.to_string())?),
        None => None,
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let metrics = Arc::new(Mutex::new(Snapshot::default()));
    let shared = Arc::new(Shared {
        tok,
        template,
        defaults,
        commands: tx,
        phase: AtomicU8::new(LOADING),
        metrics: metrics.clone(),
        next_id: AtomicU64::new(0),
        grammars: std::sync::OnceLock::new(),
        config,
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("starting the async runtime: {e}"))?;
    let (failed_tx, failed_rx) = tokio::sync::oneshot::channel::<String>();
    let engine = spawn_engine(shared.clone(), rx, kv_dir, loader, failed_tx);
    let served = runtime.block_on(run_http(shared.clone(), listener, failed_rx, stop));
    shared.phase.store(STOPPING, Ordering::Release);
    let grace = shared.config.shutdown_grace;
    let _ = shared.commands.send(Command::Shutdown { grace });
    let _ = engine.join();
    served
}

/// The engine thread: loads the model, then runs the worker loop.
fn spawn_engine(
    shared: Arc<Shared>,
    rx: std::sync::mpsc::Receiver<Command>,
    kv_dir: Option<kv_dir::KvDir>,
    loader: Loader,
    failed: tokio::sync::oneshot::Sender<String>,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("moestream-engine".into())
        .spawn(move || {
            let model = match loader() {
                Ok(m) => m,
                Err(e) => {
                    let _ = failed.send(e);
                    return;
                }
            };
            let _ = shared.grammars.set(prepare_grammars(&shared, &model));
            if shared
                .phase
                .compare_exchange(LOADING, READY, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                eprintln!("model loaded; serving");
            }
            let config = worker::WorkerConfig {
                scheduler: shared.config.scheduler,
                kv_dir,
            };
            worker::run(&model, config, rx, shared.metrics.clone());
        })
        .expect("spawning the engine thread")
}

/// The model's tokenizer prepared for `response_format` constraints.
fn prepare_grammars(shared: &Shared, model: &Model) -> Result<crate::engine::Grammars, String> {
    let dir = &shared.config.model_dir;
    let bytes = match crate::model_files::read(dir, "tokenizer.json") {
        Ok(Some(doc)) => doc.text.into_bytes(),
        Ok(None) => return Err(format!("{}: no tokenizer.json", dir.display())),
        Err(e) => return Err(e.to_string()),
    };
    let eos = &shared.defaults.eos_ids;
    crate::engine::Grammars::new(&bytes, model.cfg.vocab_size, eos).map_err(|e| e.to_string())
}

/// Serves HTTP until a signal (or a load failure, returned as the error).
async fn run_http(
    shared: Arc<Shared>,
    listener: std::net::TcpListener,
    failed: tokio::sync::oneshot::Receiver<String>,
    signal: StopSignal,
) -> Result<(), String> {
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("listener: {e}"))?;
    let listener =
        tokio::net::TcpListener::from_std(listener).map_err(|e| format!("listener: {e}"))?;
    let app = router(shared.clone());
    let load_error = Arc::new(Mutex::new(None));
    let stop = {
        let (shared, load_error) = (shared.clone(), load_error.clone());
        async move {
            tokio::select! {
                _ = signal => {}
                Ok(e) = failed => { *load_error.lock().expect("lock") = Some(e); }
            }
            eprintln!("shutting down: no new requests; finishing the running ones");
            shared.phase.store(STOPPING, Ordering::Release);
            let grace = shared.config.shutdown_grace;
            let _ = shared.commands.send(Command::Shutdown { grace });
        }
    };
    axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
        .map_err(|e| format!("serving: {e}"))?;
    let err = load_error.lock().expect("lock").take();
    err.map_or(Ok(()), |e| Err(format!("loading the model: {e}")))
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .with_state(shared)
}

async fn health(State(s): State<Arc<Shared>>) -> Response {
    match s.ready() {
        Ok(()) => Json(serde_json::json!({"status": "ok"})).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn metrics_text(State(s): State<Arc<Shared>>) -> Response {
    let text = s.metrics.lock().expect("metrics lock").render();
    ([("content-type", "text/plain; version=0.0.4")], text).into_response()
}

async fn models(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Result<Response, ApiError> {
    s.authorize(&headers)?;
    let body = serde_json::json!({"object": "list", "data": [{
        "id": s.config.model_name,
        "object": "model",
        "created": 0,
        "owned_by": "moestream",
    }]});
    Ok(Json(body).into_response())
}

async fn chat_completions(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    respond::complete(s, &headers, &body, true).await
}

async fn completions(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    respond::complete(s, &headers, &body, false).await
}
