//! `moestream serve`: the OpenAI-compatible server (src/server).

use super::*;
use moestream::formats::chat::ChatTemplate;
use moestream::server::{serve, Limits, ReasoningFormat, ServerConfig};
use moestream_scheduler::SchedulerConfig;
use std::time::Duration;

#[derive(Args)]
pub(super) struct ServeArgs {
    #[command(flatten)]
    pub(super) model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the address is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Requests served at once, stepped together (each MoE layer reads the
    /// union of their experts once per step); each holds a KV slot.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256))]
    slots: u16,
    /// Requests waiting for a slot; more are answered 429.
    #[arg(long, default_value_t = 16)]
    queue: usize,
    /// Seconds a request may wait for a slot before it is answered 429.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    queue_timeout: u64,
    /// Requests to /v1/* must send `Authorization: Bearer KEY`.
    #[arg(long, env = "MOESTREAM_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Save the kept KV (finished conversations) here when idle and at
    /// shutdown, and continue from it at start.
    #[arg(long, value_name = "DIR")]
    kv_dir: Option<PathBuf>,
    /// A Jinja chat template to use instead of the model's.
    #[arg(long, value_name = "FILE")]
    chat_template: Option<PathBuf>,
    /// The model's name in the API (default: the model directory's name,
    /// or `org/name` for a hub snapshot).
    #[arg(long)]
    served_model_name: Option<String>,
    /// New tokens of a request that sets no max_tokens (default: the
    /// rest of the context the KV plan holds).
    #[arg(short = 'n', long, visible_alias = "n-predict", value_parser = clap::value_parser!(u64).range(1..))]
    max_tokens: Option<u64>,
    /// Seconds between keep-alive comments of a silent stream (at most an
    /// hour).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    keep_alive: u64,
    /// Seconds running requests get to finish at shutdown (at most a day).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=86_400))]
    shutdown_grace: u64,
    /// Connections served at once; more wait in the listen backlog.
    #[arg(long, default_value_t = moestream::server::listen::CONNECTIONS_MAX_DEFAULT as u64,
          value_parser = clap::value_parser!(u64).range(1..=65_536))]
    max_connections: u64,
    /// Connections one remote address may hold at once (loopback clients
    /// are not counted); past it a connection is answered 429.
    #[arg(long, default_value_t = moestream::server::listen::CONNECTIONS_PER_CLIENT_MAX_DEFAULT as u64,
          value_parser = clap::value_parser!(u64).range(1..=65_536))]
    max_connections_per_client: u64,
    /// Seconds a client gets to send a request's headers (also the idle
    /// time of a keep-alive connection), and then its body.
    #[arg(long, default_value_t = moestream::server::listen::READ_TIMEOUT_S_DEFAULT,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    read_timeout: u64,
    /// A thinking model's reasoning: `deepseek` answers it apart in
    /// `reasoning_content`; `none` leaves it inside `content`.
    #[arg(long, default_value = "deepseek", value_parser = ["none", "deepseek"])]
    reasoning_format: String,
    /// Pages of this origin (`*`: any) may call the server from a browser;
    /// pages on localhost may without it.
    #[arg(long, value_name = "ORIGIN")]
    cors_origin: Option<String>,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    spec: SpecArgs,
}

pub(super) fn cmd_serve(a: ServeArgs) -> Result<()> {
    if a.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        anyhow::bail!("--api-key (or MOESTREAM_API_KEY) is empty: no client could send it; give a key, or leave the flag out to serve without one");
    }
    let dir = a.model.model.clone();
    let tok = Tokenizer::load(&dir)?;
    let template = chat_template(a.chat_template.as_deref(), &dir)?;
    if template.is_none() {
        eprintln!("warning: the model has no chat template; /v1/chat/completions answers 400 (give --chat-template FILE)");
    }
    let addr = (a.host.as_str(), a.port);
    let listener = std::net::TcpListener::bind(addr)
        .with_context(|| format!("binding {}:{}", a.host, a.port))?;
    eprintln!("listening on http://{}", listener.local_addr()?);
    let config = ServerConfig {
        model_name: a
            .served_model_name
            .clone()
            .unwrap_or_else(|| served_name(&dir)),
        api_key: a.api_key.clone(),
        host: a.host.clone(),
        limits: Limits {
            connections_max: a.max_connections as usize,
            connections_per_client_max: a.max_connections_per_client as usize,
            header_timeout: Duration::from_secs(a.read_timeout),
            body_timeout: Duration::from_secs(a.read_timeout),
        },
        scheduler: SchedulerConfig {
            kv_slots: a.slots.into(),
            queue_max: a.queue,
            queue_wait_ms_max: a.queue_timeout * 1000,
            batch_max: a.slots.into(),
        },
        kv_dir: a.kv_dir.clone(),
        model_dir: dir,
        keep_alive: Duration::from_secs(a.keep_alive),
        shutdown_grace: Duration::from_secs(a.shutdown_grace),
        max_tokens_default: a
            .max_tokens
            .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX)),
        overrides: a.sampling.overrides(),
        speculation: a.spec.speculation(),
        reasoning_format: match a.reasoning_format.as_str() {
            "none" => ReasoningFormat::None,
            _ => ReasoningFormat::Deepseek,
        },
        cors_origin: a.cors_origin.clone(),
    };
    let model_args = a.model.clone();
    let loader = Box::new(move || load(&model_args).map_err(|e| format!("{e:#}")));
    serve(config, listener, tok, template, loader).map_err(anyhow::Error::msg)
}

/// `--chat-template FILE`, else the model's template (if it has one).
pub(super) fn chat_template(file: Option<&Path>, dir: &Path) -> Result<Option<ChatTemplate>> {
    Ok(match file {
        Some(f) => Some(ChatTemplate::from_file(f, dir)?),
        None => ChatTemplate::from_model_dir(dir)?,
    })
}

/// [`chat_template`], refused with the fix when the model has none.
pub(super) fn chat_template_required(file: Option<&Path>, dir: &Path) -> Result<ChatTemplate> {
    chat_template(file, dir)?.with_context(|| {
        format!(
            "{}: the model has no chat template (tokenizer_config.json chat_template); give --chat-template FILE",
            dir.display()
        )
    })
}

/// A model's API name: `org/name` for a hub snapshot
/// (`.../models--org--name/snapshots/REV`), else the directory's name.
fn served_name(dir: &Path) -> String {
    let hub = dir
        .ancestors()
        .filter_map(|p| p.file_name()?.to_str())
        .find_map(|n| n.strip_prefix("models--"));
    match hub {
        Some(id) => id.replacen("--", "/", 1),
        None => dir
            .file_name()
            .map_or("model".into(), |n| n.to_string_lossy().into_owned()),
    }
}
