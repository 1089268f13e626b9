//! `moestream serve`: an OpenAI-compatible HTTP server over one
//! [`SessionPool`](crate::engine::SessionPool).
//!
//! ```text
//! clients ──HTTP──▶ guard ─▶ axum handlers (tokio) ──Command──▶ engine thread
//!                  key, Host   read the body            owns Model + pool
//!                              parse, template, tokenize   steps all slots
//!                              (blocking pool, bounded)
//!                    ◀──Event (per request channel)──
//! ```
//!
//! A request's head is checked ([`guard`]) before any body byte is read;
//! connections, header and body read times and body sizes are bounded
//! ([`listen`]); the CPU work of preparing a request runs on tokio's
//! blocking pool, at most [`preparing_max`] at once, never on the two
//! async threads that answer `/health` and feed every stream.
//!
//! The engine thread loads the model (the server answers 503 meanwhile),
//! then steps every active slot together, so each MoE layer reads the
//! union of all requests' experts once per step. A request whose client
//! goes away is cancelled within one step (its channel closes). On SIGINT
//! or SIGTERM the server stops admitting, lets running requests finish
//! within the grace time, cancels the rest, saves the KV, and returns; a
//! step still running past the grace (a prefill of minutes) is stopped by
//! the model's interrupt within a layer's sub-chunk.

pub mod anthropic;
pub mod api;
pub mod guard;
pub mod kv_dir;
pub mod listen;
mod llama;
pub mod metrics;
mod respond;
mod split;
pub mod stop;
pub mod tools;
pub mod worker;

use crate::engine::gen_config::{GenerationDefaults, Overrides};
use crate::formats::chat::ChatTemplate;
use crate::formats::tokenizer::Tokenizer;
use crate::model::Model;
use api::ApiError;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics::Snapshot;
use moestream_scheduler::SchedulerConfig;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use worker::Command;

pub use listen::Limits;

/// The stack of the engine thread and the runtime's threads: grammar
/// compilation recurses per schema property (see
/// [`api::SCHEMA_PROPERTIES_MAX`]); address space only, until used.
pub const THREAD_STACK_BYTES: usize = 16 << 20;

/// Request bodies held in memory at once (read, parsed, prepared): eight
/// of the largest; a request finding no room within the body read
/// timeout is answered 429.
pub const BODY_BYTES_IN_FLIGHT_MAX: usize = 8 * guard::COMPLETION_BODY_BYTES_MAX;

/// Requests prepared (parsed, templated, tokenized, grammar compiled) at
/// once on the blocking pool: one per core, at most 8; more wait their
/// turn.
pub fn preparing_max() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().clamp(1, 8))
}

/// What `serve` is set up with (besides the model it loads).
pub struct ServerConfig {
    /// The model's name in `/v1/models` and responses.
    pub model_name: String,
    /// Requests to `/v1/*` and llama-server's endpoints must send
    /// `Authorization: Bearer KEY` (or `x-api-key: KEY`).
    pub api_key: Option<String>,
    /// The host the server listens on: without an API key, the one name
    /// besides loopback accepted in `Host` and `Origin`.
    pub host: String,
    /// Connections, read timeouts.
    pub limits: Limits,
    pub scheduler: SchedulerConfig,
    /// Where kept prefixes are saved and restored (`--kv-dir`).
    pub kv_dir: Option<PathBuf>,
    /// The model's directory (its key names KV files).
    pub model_dir: PathBuf,
    /// How often an SSE stream sends a keep-alive comment.
    pub keep_alive: Duration,
    /// How long running requests may take to finish at shutdown.
    pub shutdown_grace: Duration,
    /// New tokens of a request that names no limit, at most (such a
    /// request gets the rest of the context; `usize::MAX`: all of it).
    pub max_tokens_default: usize,
    /// Sampling settings given on the command line (a request's own win).
    pub overrides: Overrides,
    /// Drafting for every request (a request wanting logprobs does not).
    pub speculation: crate::engine::Speculation,
    /// Whether a thinking model's reasoning is split out of `content`.
    pub reasoning_format: ReasoningFormat,
    /// `--cors-origin`: `*` or one origin whose pages may call the server
    /// (local pages may without it).
    pub cors_origin: Option<String>,
}

/// `--reasoning-format`, as llama-server names it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// The reasoning stays inside `content`, tags and all.
    None,
    /// The `<think>` part goes into `reasoning_content` (whole and
    /// streamed as `delta.reasoning_content`).
    #[default]
    Deepseek,
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
    /// The answered requests' times (the async side records them).
    timings: Mutex<metrics::Timings>,
    next_id: AtomicU64,
    /// The tokenizer prepared for constrained output, once the model is
    /// loaded (or why it cannot be).
    grammars: OnceLock<Result<crate::engine::Grammars, String>>,
    /// The model's context in tokens, once it is loaded.
    context: OnceLock<usize>,
    /// Positions (prompt and answer) the KV plan holds for one request,
    /// and the logits' count, once the model is loaded.
    kv_positions: OnceLock<usize>,
    /// The KV positions the plan reserved for every slot together (None:
    /// no RAM plan, no limit), once the model is loaded.
    kv_budget: OnceLock<Option<usize>>,
    vocab: OnceLock<usize>,
    /// The longest token's text, in bytes (bounds the text a context holds).
    token_bytes_max: usize,
    /// Room on the blocking pool for preparing requests.
    preparing: Arc<tokio::sync::Semaphore>,
    /// Room for request bodies in memory, in KiB.
    body_kib: Arc<tokio::sync::Semaphore>,
    /// Stops the model's forward (a long prefill) once the shutdown's
    /// grace is over; set when the model is loaded.
    interrupt: OnceLock<crate::model::progress::Interrupt>,
    /// When the shutdown began (the signal, or a failed load).
    stopping_since: OnceLock<Instant>,
}

impl Shared {
    fn ready(&self) -> Result<(), ApiError> {
        match self.phase.load(Ordering::Acquire) {
            READY => Ok(()),
            LOADING => Err(ApiError::unavailable("the model is loading")),
            _ => Err(ApiError::unavailable("the server is shutting down")),
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
        template,
        defaults,
        commands: tx,
        phase: AtomicU8::new(LOADING),
        metrics: metrics.clone(),
        timings: Mutex::new(metrics::Timings::default()),
        next_id: AtomicU64::new(0),
        grammars: OnceLock::new(),
        context: OnceLock::new(),
        kv_positions: OnceLock::new(),
        kv_budget: OnceLock::new(),
        vocab: OnceLock::new(),
        token_bytes_max: tok.token_bytes_max(),
        preparing: Arc::new(tokio::sync::Semaphore::new(preparing_max())),
        body_kib: Arc::new(tokio::sync::Semaphore::new(BODY_BYTES_IN_FLIGHT_MAX / 1024)),
        interrupt: OnceLock::new(),
        stopping_since: OnceLock::new(),
        tok,
        config,
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_stack_size(THREAD_STACK_BYTES)
        .enable_all()
        .build()
        .map_err(|e| format!("starting the async runtime: {e}"))?;
    let (failed_tx, failed_rx) = tokio::sync::oneshot::channel::<String>();
    let engine = spawn_engine(shared.clone(), rx, kv_dir, loader, failed_tx);
    let served = runtime.block_on(run_http(shared.clone(), listener, failed_rx, stop));
    // Preparing a request is short and bounded; none outlives this.
    runtime.shutdown_timeout(Duration::from_secs(1));
    shared.phase.store(STOPPING, Ordering::Release);
    let grace = shared.config.shutdown_grace;
    let _ = shared.commands.send(Command::Shutdown { grace });
    // A model still loading is left to the process's exit: the load
    // cannot be interrupted, and nothing of it needs saving.
    if shared.context.get().is_some() || engine.is_finished() {
        let since = *shared.stopping_since.get_or_init(Instant::now);
        let deadline = (since.checked_add(grace)).unwrap_or_else(|| worker::deadline_after(grace));
        join_engine(&shared, engine, deadline);
    } else {
        eprintln!("stopped while the model was loading");
    }
    served
}

/// Waits for the engine thread; past `deadline` raises the model's
/// interrupt, so a step still running (a prefill of minutes) stops within
/// a layer's sub-chunk and its requests fail instead of holding the
/// process past the grace time.
fn join_engine(shared: &Shared, engine: std::thread::JoinHandle<()>, deadline: Instant) {
    let mut raised = false;
    while !engine.is_finished() {
        if !raised && Instant::now() >= deadline {
            if let Some(interrupt) = shared.interrupt.get() {
                eprintln!("the grace time is over: interrupting the running step");
                interrupt.raise();
                raised = true;
            }
        }
        std::thread::sleep(POLL);
    }
    let _ = engine.join();
}

/// How often [`join_engine`] looks at the engine thread.
const POLL: Duration = Duration::from_millis(20);

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
        .stack_size(THREAD_STACK_BYTES)
        .spawn(move || {
            let model = match loader() {
                Ok(m) => m,
                Err(e) => {
                    let _ = failed.send(e);
                    return;
                }
            };
            let _ = shared.interrupt.set(model.interrupt.clone());
            let _ = shared.grammars.set(prepare_grammars(&shared, &model));
            let context = model.cfg.rope.max_position_embeddings;
            let _ = shared.context.set(context);
            let _ = shared
                .kv_positions
                .set(model.context_budget.unwrap_or(context).min(context));
            let _ = shared.kv_budget.set(model.context_budget);
            let _ = shared.vocab.set(model.cfg.vocab_size);
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
    let bytes = match crate::formats::model_files::read(dir, "tokenizer.json") {
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
            let _ = shared.stopping_since.set(Instant::now());
            shared.phase.store(STOPPING, Ordering::Release);
            let grace = shared.config.shutdown_grace;
            let _ = shared.commands.send(Command::Shutdown { grace });
        }
    };
    let (limits, grace) = (shared.config.limits.clone(), shared.config.shutdown_grace);
    listen::serve(listener, app, limits, stop, grace).await;
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
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/props", get(props))
        .route("/slots", get(slots))
        .route("/slots/{id}", post(slot_post))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            guard::guard,
        ))
        .layer(axum::middleware::from_fn(log_request))
        .with_state(shared)
}

/// One log line per request (a completion that was answered logs its own,
/// with its tokens, once its last token is out).
async fn log_request(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let started = std::time::Instant::now();
    let response = next.run(req).await;
    if response.extensions().get::<respond::Logged>().is_none() {
        tracing::info!(
            target: "moestream::request",
            method = %method,
            path = %path,
            status = response.status().as_u16(),
            total_ms = started.elapsed().as_secs_f64() * 1e3,
            "request"
        );
    }
    response
}

async fn not_found(uri: axum::http::Uri) -> Response {
    let e = ApiError::not_found(format!("no endpoint {}", uri.path()));
    guard::refusal(uri.path(), e)
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let e = ApiError::method_not_allowed(format!("{method} is not allowed on {}", uri.path()));
    guard::refusal(uri.path(), e)
}

async fn health(State(s): State<Arc<Shared>>) -> Response {
    match s.ready() {
        Ok(()) => Json(serde_json::json!({"status": "ok"})).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn metrics_text(State(s): State<Arc<Shared>>) -> Response {
    let mut text = s.metrics.lock().expect("metrics lock").render();
    text.push_str(&s.timings.lock().expect("timings lock").render());
    ([("content-type", "text/plain; version=0.0.4")], text).into_response()
}

async fn models(State(s): State<Arc<Shared>>) -> Result<Response, ApiError> {
    let body = serde_json::json!({"object": "list", "data": [{
        "id": s.config.model_name,
        "object": "model",
        "created": 0,
        "owned_by": "moestream",
    }]});
    Ok(Json(body).into_response())
}

async fn chat_completions(State(s): State<Arc<Shared>>, body: Body) -> Result<Response, ApiError> {
    respond::complete(s, body, true).await
}

async fn completions(State(s): State<Arc<Shared>>, body: Body) -> Result<Response, ApiError> {
    respond::complete(s, body, false).await
}

async fn messages(
    State(s): State<Arc<Shared>>,
    body: Body,
) -> Result<Response, anthropic::AnthropicError> {
    anthropic::messages(s, body).await
}

async fn count_tokens(
    State(s): State<Arc<Shared>>,
    body: Body,
) -> Result<Response, anthropic::AnthropicError> {
    anthropic::count_tokens(s, body).await
}

async fn tokenize(State(s): State<Arc<Shared>>, body: Body) -> Result<Response, ApiError> {
    llama::tokenize(s, body).await
}

async fn detokenize(State(s): State<Arc<Shared>>, body: Body) -> Result<Response, ApiError> {
    llama::detokenize(s, body).await
}

async fn props(State(s): State<Arc<Shared>>) -> Result<Response, ApiError> {
    llama::props(s).await
}

async fn slots(State(s): State<Arc<Shared>>) -> Result<Response, ApiError> {
    llama::slots(s).await
}

async fn slot_post(
    State(s): State<Arc<Shared>>,
    axum::extract::Path(id): axum::extract::Path<String>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
    body: Body,
) -> Result<Response, ApiError> {
    llama::slot_post(s, id, query, body).await
}
