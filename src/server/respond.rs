//! A completion request from body to response: read the body (bounded in
//! bytes and time), parse and check it, build the prompt (the chat
//! template for chat) on the blocking pool, submit it to the engine
//! thread, and answer with the whole text or as server-sent events.

use super::api::{self, ApiError, Request};
use super::guard::COMPLETION_BODY_BYTES_MAX;
use super::metrics::{Histogram, TOKEN_BOUNDS_S};
use super::split::Splitter;
use super::stop::{scan, Scan};
use super::tools::{self, ToolPlan};
use super::worker::{Command, Event, Progress, Submit};
use super::Shared;
use crate::engine::generate::GenOptions;
use crate::engine::sampler::{fresh_seed, SamplingParams};
use crate::engine::{PoolError, TokenLogprobs};
use crate::formats::tokenizer::TextStream;
use axum::body::{Body, Bytes};
use axum::response::sse::{self, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, OwnedSemaphorePermit};

/// A checked request, ready for the engine.
pub(super) struct Prepared {
    chat: bool,
    pub prompt: Vec<u32>,
    opts: GenOptions,
    logprobs: Option<usize>,
    stops: Vec<String>,
    pub stream: bool,
    include_usage: bool,
    /// Streamed: prefill progress as data chunks, not comments.
    return_progress: bool,
    id: String,
    created: u64,
    /// Tools offered (tool_choice not `none`): the answer is parsed for calls.
    pub tools: Option<ToolPlan>,
    /// The special tokens of the tool format's markers (sorted): written
    /// out in the answer's text so the parser sees them.
    markers: Vec<u32>,
    /// Split a thinking model's reasoning out: Some(whether the output
    /// starts inside it).
    pub reasoning: Option<bool>,
    /// When the request arrived (its log line's times count from here).
    started: Instant,
    /// Choices asked (`n`): each its own sequence, choice `i` sampled
    /// with seed `seed + i`.
    pub n: usize,
}

/// Marks a response whose request [`log_request`] already logged (a
/// completion logs itself once its last token is out).
#[derive(Clone, Copy, Debug)]
pub(super) struct Logged;

/// A completion's log line: what it asked, what it got, how long the
/// first token and the whole took.
fn log_request(p: &Prepared, completion: usize, first: Option<Instant>, reason: &str) {
    let ms = |t: Instant| t.duration_since(p.started).as_secs_f64() * 1e3;
    let path = if p.chat {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    };
    let (ttft_ms, total_ms) = (first.map_or(f64::NAN, ms), ms(Instant::now()));
    tracing::info!(
        target: "moestream::request",
        method = "POST",
        path,
        status = 200,
        id = %p.id,
        stream = p.stream,
        prompt_tokens = p.prompt.len(),
        completion_tokens = completion,
        ttft_ms,
        total_ms,
        finish_reason = reason,
        "request"
    );
}

/// Answers a chat (`chat`) or text completion request (its head has
/// passed the [guard](super::guard)).
pub(super) async fn complete(s: Arc<Shared>, body: Body, chat: bool) -> Result<Response, ApiError> {
    let started = Instant::now();
    s.ready()?;
    let (body, room) = read_body(&s, body).await?;
    let mut p = prepare_blocking(s.clone(), body, room, chat).await?;
    p.started = started;
    let events = submit(&s, &p).await?;
    if p.stream {
        Ok(stream(s, p, events))
    } else {
        whole(s, p, events).await
    }
}

/// The request body, at most [`COMPLETION_BODY_BYTES_MAX`] bytes, within
/// the body read timeout, once the bodies in flight leave room for it
/// (its declared length, else the cap; the room is held until the body
/// is dropped with the returned permit).
pub(super) async fn read_body(
    s: &Shared,
    body: Body,
) -> Result<(Bytes, OwnedSemaphorePermit), ApiError> {
    use axum::body::HttpBody;
    let timeout = s.config.limits.body_timeout;
    let declared = body.size_hint().exact().unwrap_or(u64::MAX);
    let kib = declared
        .min(COMPLETION_BODY_BYTES_MAX as u64)
        .div_ceil(1024)
        .max(1) as u32;
    let room = s.body_kib.clone().acquire_many_owned(kib);
    let room = match tokio::time::timeout(timeout, room).await {
        Ok(Ok(room)) => room,
        _ => {
            return Err(ApiError::busy(
                "too many request bodies are being read; retry",
            ))
        }
    };
    let read = axum::body::to_bytes(body, COMPLETION_BODY_BYTES_MAX);
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(bytes)) => Ok((bytes, room)),
        Ok(Err(e)) if is_length_limit(&e) => Err(ApiError::too_large(
            COMPLETION_BODY_BYTES_MAX as u64 + 1,
            COMPLETION_BODY_BYTES_MAX,
        )),
        Ok(Err(e)) => Err(ApiError::bad(format!("reading the request body: {e}"))),
        Err(_) => Err(ApiError::body_timeout(timeout.as_secs())),
    }
}

fn is_length_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = err.source();
    }
    false
}

/// Runs `job` on the blocking pool, at most
/// [`preparing_max`](super::preparing_max) jobs at once (templates,
/// tokenizers and grammar compilers are CPU work the async threads must
/// not wait on); `what` names a failure to run it.
pub(super) async fn blocking<T: Send + 'static>(
    s: &Shared,
    what: &str,
    job: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let permit = s
        .preparing
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| ApiError::unavailable("the server is shutting down"))?;
    let job = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        job()
    });
    job.await
        .map_err(|e| ApiError::internal(format!("{what}: {e}")))?
}

/// Parses, checks and prepares a request on the blocking pool.
pub(super) async fn prepare_blocking(
    s: Arc<Shared>,
    body: Bytes,
    room: OwnedSemaphorePermit,
    chat: bool,
) -> Result<Prepared, ApiError> {
    let shared = s.clone();
    blocking(&shared, "preparing the request", move || {
        let _room = room;
        let req = Request::parse(&body)?;
        s.check_model(req.model.as_deref())?;
        req.refuse_unsupported()?;
        prepare(&s, &req, chat)
    })
    .await
}

fn prepare(s: &Shared, req: &Request, chat: bool) -> Result<Prepared, ApiError> {
    let tools = match chat {
        true => tools::plan(
            req.tools.as_ref(),
            req.tool_choice.as_ref(),
            req.parallel_tool_calls,
            s.template.as_ref().map(|t| t.source()),
            &|marker| s.grammars.get()?.as_ref().ok()?.special_token(marker),
        )?,
        false if req.tools.is_some() || req.tool_choice.is_some() => {
            return Err(ApiError::bad_param(
                "tools",
                "tools are for /v1/chat/completions",
            ))
        }
        false => None,
    };
    let (prompt, reasoning) = if chat {
        let (ids, text) = chat_prompt(s, req, tools.as_ref())?;
        (ids, reasoning_split(s, &text))
    } else {
        (text_prompt(s, req)?, None)
    };
    let overrides = req.overrides().or(s.config.overrides);
    // OpenAI's default temperature is 1 where the model's
    // generation_config.json says nothing.
    // Without a seed (the request's or the command line's), each request
    // draws a fresh one, answered in `system_fingerprint` and a header.
    let base = SamplingParams {
        temperature: 1.0,
        seed: fresh_seed(),
        ..SamplingParams::default()
    };
    let sampling = s.defaults.sampling(&base, &overrides);
    sampling.validate().map_err(ApiError::bad)?;
    let max_tokens = match req.max_tokens() {
        Some(0) => {
            return Err(ApiError::bad_param(
                "max_tokens",
                "max_tokens must be at least 1",
            ))
        }
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        // The rest of what the KV plan holds (at least one token: a
        // prompt that fills it is refused with the numbers).
        None => {
            let room = per_choice_positions(s, req.n.unwrap_or(1))
                .map_or(usize::MAX, |kv| kv.saturating_sub(prompt.len()).max(1));
            s.config.max_tokens_default.min(room)
        }
    };
    let choices = choices(s, req.n.unwrap_or(1), prompt.len(), max_tokens)?;
    let n = s.next_id.fetch_add(1, Ordering::Relaxed);
    Ok(Prepared {
        chat,
        prompt,
        opts: GenOptions {
            max_tokens,
            sampling,
            ignore_eos: req.ignore_eos,
            eos_ids: s.defaults.eos_ids.clone(),
            speculation: s.config.speculation,
            constraint: constrained(s, req, tools.as_ref())?,
            logit_bias: req.logit_bias(s.vocab.get().copied().unwrap_or(0))?,
        },
        logprobs: req.logprobs(chat)?,
        stops: req.stops()?,
        stream: req.stream,
        include_usage: req.include_usage(),
        return_progress: req.return_progress,
        // Random, and the counter: unique across restarts and within one.
        id: format!(
            "{}-{:016x}{n:x}",
            if chat { "chatcmpl" } else { "cmpl" },
            fresh_seed()
        ),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        markers: tools.as_ref().map_or(Vec::new(), |t| {
            s.tok.special_ids_of(t.format.marker_texts())
        }),
        tools,
        reasoning,
        started: Instant::now(),
        n: choices,
    })
}

/// The KV positions each of `n` choices may hold: what the plan reserved
/// for one request, shared among them (None while the model loads).
fn per_choice_positions(s: &Shared, n: u64) -> Option<usize> {
    let kv = *s.kv_positions.get()?;
    let budget = s.kv_budget.get().copied().flatten().unwrap_or(usize::MAX);
    let n = usize::try_from(n.max(1)).unwrap_or(usize::MAX);
    Some(kv.min(budget / n))
}

/// The choices a request asked for (`n`), refused with a 400 naming the
/// numbers where they cannot run at once: one slot each (`--slots`),
/// their KV together within what the plan reserved (`--context`).
fn choices(s: &Shared, n: u64, prompt: usize, max_tokens: usize) -> Result<usize, ApiError> {
    let slots = s.config.scheduler.kv_slots;
    if n > slots as u64 {
        return Err(ApiError::bad_param(
            "n",
            format!("n = {n} choices run at once, one slot each; this server has {slots} slots (--slots)"),
        ));
    }
    let n = n as usize;
    let (Some(&context), Some(Some(budget))) = (s.context.get(), s.kv_budget.get().copied()) else {
        return Ok(n);
    };
    let each = prompt + max_tokens.min(context.saturating_sub(prompt));
    let need = each.saturating_mul(n);
    if n > 1 && need > budget {
        return Err(ApiError::bad_param(
            "n",
            format!("n = {n} choices of {each} KV positions each (prompt and max_tokens) need {need}; the plan reserved {budget} (raise --context, or ask fewer choices or tokens)"),
        ));
    }
    Ok(n)
}

/// The seed a response reports it sampled with (choice `i` of `n` used
/// this seed + `i`).
fn fingerprint(p: &Prepared) -> String {
    format!("moestream-seed-{}", p.opts.sampling.seed)
}

/// The header that carries the seed too (streamed or not).
pub(super) const SEED_HEADER: &str = "x-moestream-seed";

/// Whether (and from where) this answer's reasoning is split out: for a
/// thinking template under `--reasoning-format deepseek`.
fn reasoning_split(s: &Shared, prompt: &str) -> Option<bool> {
    use crate::formats::chat::reasoning;
    let thinking = s
        .template
        .as_ref()
        .is_some_and(|t| reasoning::is_thinking_template(t.source()));
    (thinking && s.config.reasoning_format == super::ReasoningFormat::Deepseek)
        .then(|| reasoning::starts_in_reasoning(prompt))
}

/// The request's output constraint (`response_format`, or the tool calls
/// `tool_choice` forces) with the model's prepared tokenizer; one that
/// does not compile is a 400 naming the reason.
fn constrained(
    s: &Shared,
    req: &Request,
    tools: Option<&ToolPlan>,
) -> Result<Option<crate::engine::Constrained>, ApiError> {
    let forced = tools.and_then(|t| t.grammar.clone());
    // With `auto`, a call the model opens is held to the tools' schemas
    // from its opening marker on (a response_format, if any, wins).
    let lazy = tools.and_then(|t| {
        let marker = t.format.start_marker().as_bytes().to_vec();
        Some((t.after_marker.clone()?, marker))
    });
    let (constraint, param, after) = match (req.constraint()?, forced, lazy) {
        (Some(_), Some(_), _) => {
            return Err(ApiError::bad_param(
                "tool_choice",
                "tool_choice forces a tool call; response_format cannot constrain the same answer",
            ))
        }
        (Some(c), None, _) => (c, "response_format", Vec::new()),
        (None, Some(g), _) => (crate::engine::Constraint::Lark(g), "tools", Vec::new()),
        (None, None, Some((g, marker))) => (crate::engine::Constraint::Lark(g), "tools", marker),
        (None, None, None) => return Ok(None),
    };
    let grammars = match s.grammars.get() {
        Some(Ok(g)) => g.clone(),
        // Without a prepared tokenizer an `auto` call stays unconstrained.
        Some(Err(_)) if !after.is_empty() => return Ok(None),
        Some(Err(e)) => {
            let msg = format!("constrained output is unavailable for this model: {e}");
            return Err(ApiError::bad(msg));
        }
        None => return Err(ApiError::unavailable("the model is loading")),
    };
    let mut state = grammars
        .start(&constraint)
        .map_err(|e| ApiError::bad_param(param, e.to_string()))?;
    if after.is_empty() && !state.can_start() {
        return Err(ApiError::bad_param(
            param,
            "the schema matches no output at all (a $ref that only refers to itself, or a contradiction); nothing can be generated",
        ));
    }
    Ok(Some(crate::engine::Constrained {
        grammars,
        constraint,
        after,
    }))
}

/// The chat prompt's token ids and its text.
fn chat_prompt(
    s: &Shared,
    req: &Request,
    tools: Option<&ToolPlan>,
) -> Result<(Vec<u32>, String), ApiError> {
    let Some(wire) = &req.messages else {
        return Err(ApiError::bad_param("messages", "`messages` is required"));
    };
    if wire.is_empty() {
        return Err(ApiError::bad_param("messages", "`messages` is empty"));
    }
    let Some(template) = &s.template else {
        return Err(ApiError::bad(
            "this model has no chat template (tokenizer_config.json chat_template); start the server with --chat-template FILE, or use /v1/completions",
        ));
    };
    let messages = wire
        .iter()
        .map(tools::template_message)
        .collect::<Result<Vec<_>, _>>()?;
    let kwargs = req.template_kwargs(template)?;
    let opts = crate::formats::chat::RenderOptions {
        add_generation_prompt: true,
        tools: tools.map(|t| &t.shown),
        kwargs: Some(&kwargs),
    };
    let text = template
        .render_json(&messages, &opts)
        .map_err(|e| ApiError::bad_param("messages", e.to_string()))?;
    check_text_bytes(s, "messages", &text)?;
    let ids = s
        .tok
        .encode_raw(&text)
        .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok((ids, text))
}

fn text_prompt(s: &Shared, req: &Request) -> Result<Vec<u32>, ApiError> {
    use api::PromptField;
    match &req.prompt {
        None => Err(ApiError::bad_param("prompt", "`prompt` is required")),
        Some(PromptField::Ids(ids)) => Ok(ids.clone()),
        Some(PromptField::Text(t)) => encode_prompt(s, t),
        Some(PromptField::Texts(v)) if v.len() == 1 => encode_prompt(s, &v[0]),
        Some(PromptField::Texts(v)) => Err(ApiError::bad_param(
            "prompt",
            format!("{} prompts in one request; send one", v.len()),
        )),
    }
}

fn encode_prompt(s: &Shared, text: &str) -> Result<Vec<u32>, ApiError> {
    check_text_bytes(s, "prompt", text)?;
    s.tok
        .encode(text)
        .map_err(|e| ApiError::internal(e.to_string()))
}

/// The factor over the longest token's bytes that [`check_text_bytes`]
/// allows each token of text: normalizers that compose characters (NFC: `e` + U+0301
/// to `é`, 3 bytes to 2; Hangul jamo to a syllable, 9 to 3) shrink text
/// by at most 3x.
const NORMALIZER_SLACK: usize = 4;

/// Refuses, before tokenizing, a text too long for the model's context:
/// no token covers more than `NORMALIZER_SLACK` x the longest token's
/// bytes of text, so a longer text has more tokens than the context holds.
/// Tokenizing takes ~250 bytes of memory per byte of text: this bounds it
/// by the context, not by the body size.
pub(super) fn check_text_bytes(
    s: &Shared,
    param: &'static str,
    text: &str,
) -> Result<(), ApiError> {
    let Some(&context) = s.context.get() else {
        return Ok(());
    };
    let max = context
        .saturating_mul(s.token_bytes_max)
        .saturating_mul(NORMALIZER_SLACK);
    if text.len() <= max {
        return Ok(());
    }
    Err(ApiError::bad_param(
        param,
        format!(
            "the prompt has {} bytes of text: more tokens than the model's context of {context} holds (at most {max} bytes: {NORMALIZER_SLACK} x the longest token's {} bytes per token)",
            text.len(),
            s.token_bytes_max
        ),
    ))
}

/// Hands the request's `n` choices to the engine thread (the prompt
/// prefilled once for all; choice `i` samples with seed + `i`); each
/// choice's events come on its channel. A refusal is answered: 429 for a
/// full queue, 400 for what the model cannot serve (naming the numbers),
/// 503 at shutdown.
pub(super) async fn submit(
    s: &Shared,
    p: &Prepared,
) -> Result<Vec<mpsc::UnboundedReceiver<Event>>, ApiError> {
    let (events, receivers): (Vec<_>, Vec<_>) =
        (0..p.n.max(1)).map(|_| mpsc::unbounded_channel()).unzip();
    let (admitted, answer) = tokio::sync::oneshot::channel();
    let cmd = Command::Submit(Box::new(Submit {
        prompt: p.prompt.clone(),
        opts: p.opts.clone(),
        logprobs: p.logprobs,
        events,
        admitted,
    }));
    s.commands
        .send(cmd)
        .map_err(|_| ApiError::unavailable("the server is shutting down"))?;
    match answer.await {
        Ok(Ok(())) => Ok(receivers),
        Ok(Err(PoolError::Busy(e))) => Err(ApiError::busy(e.to_string())),
        Ok(Err(PoolError::Request(e))) => {
            let msg = e.to_string();
            if msg.contains("shutting down") {
                Err(ApiError::unavailable(msg))
            } else {
                Err(ApiError::bad(msg))
            }
        }
        Err(_) => Err(ApiError::unavailable("the server is shutting down")),
    }
}

/// The text of an answer as tokens arrive: stop sequences end it, text
/// that may start one is held back.
struct Answer<'t> {
    text: TextStream<'t>,
    full: String,
    sent: usize,
    stops: Vec<String>,
    stopped: bool,
    tokens: usize,
    last: Option<u32>,
    /// The output constraint completed (the engine said so at the end).
    complete: bool,
    /// The stop sequence that ended the answer.
    stop_sequence: Option<String>,
    /// When the first and the last token came, and the times between.
    first: Option<Instant>,
    last_at: Option<Instant>,
    gaps: Histogram,
}

impl<'t> Answer<'t> {
    /// The answer of `p`, its special tokens skipped but its tool
    /// format's markers.
    fn new(tok: &'t crate::formats::tokenizer::Tokenizer, p: &Prepared) -> Answer<'t> {
        Answer {
            text: TextStream::keeping(tok, p.markers.clone()),
            full: String::new(),
            sent: 0,
            stops: p.stops.clone(),
            stopped: false,
            tokens: 0,
            last: None,
            complete: false,
            stop_sequence: None,
            first: None,
            last_at: None,
            gaps: Histogram::new(&TOKEN_BOUNDS_S),
        }
    }

    /// Records the answer's times into the server's histograms.
    fn record_times(&self, s: &Shared, p: &Prepared) {
        let mut t = s.timings.lock().expect("timings lock");
        if let Some(first) = self.first {
            t.ttft
                .observe(first.duration_since(p.started).as_secs_f64());
        }
        t.token.merge(&self.gaps);
        t.duration.observe(p.started.elapsed().as_secs_f64());
    }

    /// Takes a token; returns the text that can be sent now.
    fn push(&mut self, id: u32) -> Result<String, ApiError> {
        self.tokens += 1;
        self.last = Some(id);
        let now = Instant::now();
        if let Some(at) = self.last_at {
            self.gaps.observe(now.duration_since(at).as_secs_f64());
        }
        self.first = self.first.or(Some(now));
        self.last_at = Some(now);
        let piece = self
            .text
            .push(id)
            .map_err(|e| ApiError::internal(e.to_string()))?;
        self.full.push_str(&piece);
        let until = match scan(&self.full, &self.stops) {
            Scan::SendUpTo(n) => n,
            Scan::StopAt(n) => {
                let rest = &self.full[n..];
                self.stop_sequence = self
                    .stops
                    .iter()
                    .find(|s| rest.starts_with(s.as_str()))
                    .cloned();
                self.full.truncate(n);
                self.stopped = true;
                n
            }
        };
        let out = self.full[self.sent..until].to_string();
        self.sent = until;
        Ok(out)
    }

    /// The held-back text, once generation ended without a stop sequence.
    fn flush(&mut self) -> String {
        let out = self.full[self.sent..].to_string();
        self.sent = self.full.len();
        out
    }

    fn finish_reason(&self, eos_ids: &[u32], ignore_eos: bool) -> &'static str {
        let eos = self
            .last
            .is_some_and(|t| !ignore_eos && eos_ids.contains(&t));
        if self.stopped || eos || self.complete {
            "stop"
        } else {
            "length"
        }
    }
}

fn usage(p: &Prepared, completion: usize, reused: usize) -> Value {
    json!({
        "prompt_tokens": p.prompt.len(),
        "completion_tokens": completion,
        "total_tokens": p.prompt.len() + completion,
        "prompt_tokens_details": {"cached_tokens": reused},
    })
}

/// One token's logprobs entry: chat's `{token, logprob, bytes,
/// top_logprobs}`, or completions' parts (token, logprob, top map).
fn logprob_entry(s: &Shared, id: u32, lp: &TokenLogprobs) -> Value {
    let piece = |t: u32| s.tok.decode(&[t]).unwrap_or_default();
    let top: Vec<Value> = lp
        .top
        .iter()
        .map(|&(t, l)| {
            let text = piece(t);
            json!({"token": text, "logprob": l, "bytes": text.as_bytes()})
        })
        .collect();
    let text = piece(id);
    json!({"token": text, "logprob": lp.logprob, "bytes": text.as_bytes(), "top_logprobs": top})
}

/// Completions' logprobs object from chat-style entries.
fn completion_logprobs(entries: &[Value]) -> Value {
    let tokens: Vec<&Value> = entries.iter().map(|e| &e["token"]).collect();
    let lps: Vec<&Value> = entries.iter().map(|e| &e["logprob"]).collect();
    let top: Vec<Value> = entries
        .iter()
        .map(|e| {
            let m: serde_json::Map<String, Value> = e["top_logprobs"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| {
                    (
                        t["token"].as_str().unwrap_or("").to_string(),
                        t["logprob"].clone(),
                    )
                })
                .collect();
            Value::Object(m)
        })
        .collect();
    let mut offset = 0;
    let offsets: Vec<usize> = entries
        .iter()
        .map(|e| {
            let at = offset;
            offset += e["token"].as_str().map_or(0, str::len);
            at
        })
        .collect();
    json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": top, "text_offset": offsets})
}

fn logprobs_field(p: &Prepared, entries: &[Value]) -> Value {
    match (p.logprobs, p.chat) {
        (None, _) => Value::Null,
        (Some(_), true) => json!({"content": entries}),
        (Some(_), false) => completion_logprobs(entries),
    }
}

/// A finished answer: its text and what ended it.
pub(super) struct Collected {
    pub full: String,
    pub tokens: usize,
    pub reused: usize,
    pub reason: &'static str,
    /// The stop sequence that ended it, if one did.
    pub stop_sequence: Option<String>,
    first: Option<Instant>,
    entries: Vec<Value>,
}

/// Waits for every token of an answer.
pub(super) async fn collect(
    s: &Shared,
    p: &Prepared,
    mut events: mpsc::UnboundedReceiver<Event>,
) -> Result<Collected, ApiError> {
    let mut answer = Answer::new(&s.tok, p);
    let mut entries = Vec::new();
    let mut reused = 0;
    while let Some(ev) = events.recv().await {
        match ev {
            Event::Token(t) => {
                answer.push(t)?;
                if answer.stopped {
                    break;
                }
            }
            Event::Logprobs(lp) => entries.push(logprob_entry(s, answer.last.unwrap_or(0), &lp)),
            Event::Progress(_) => {}
            Event::Done {
                reused: r,
                constraint_complete,
            } => {
                reused = r;
                answer.complete = constraint_complete;
                answer.flush();
                break;
            }
            Event::Failed(e) => return Err(ApiError::internal(e)),
            Event::Expired => {
                return Err(ApiError::busy("the request waited too long in the queue"))
            }
        }
    }
    answer.record_times(s, p);
    Ok(Collected {
        first: answer.first,
        reason: answer.finish_reason(&p.opts.eos_ids, p.opts.ignore_eos),
        stop_sequence: answer.stop_sequence.take(),
        full: answer.full,
        tokens: answer.tokens,
        reused,
        entries,
    })
}

/// A non-streamed answer: waits for every token of every choice.
async fn whole(
    s: Arc<Shared>,
    p: Prepared,
    events: Vec<mpsc::UnboundedReceiver<Event>>,
) -> Result<Response, ApiError> {
    let mut choices = Vec::with_capacity(events.len());
    let (mut tokens, mut reused, mut first) = (0, 0, None);
    let mut reasons = Vec::new();
    for (index, events) in events.into_iter().enumerate() {
        let c = collect(&s, &p, events).await?;
        let (choice, reason) = choice_of(&p, index, &c);
        (tokens, reused) = (tokens + c.tokens, reused.max(c.reused));
        first = first.or(c.first);
        choices.push(choice);
        reasons.push(reason);
    }
    let object = if p.chat {
        "chat.completion"
    } else {
        "text_completion"
    };
    let body = json!({
        "id": p.id, "object": object, "created": p.created, "model": s.config.model_name,
        "system_fingerprint": fingerprint(&p),
        "choices": choices, "usage": usage(&p, tokens, reused),
    });
    log_request(
        &p,
        tokens,
        first,
        reasons.first().copied().unwrap_or("stop"),
    );
    Ok(answered(&p, Json(body).into_response()))
}

/// Choice `index` of a whole answer, and its finish reason.
fn choice_of(p: &Prepared, index: usize, c: &Collected) -> (Value, &'static str) {
    let mut reason = c.reason;
    let choice = if p.chat {
        let end = Splitter::whole(p.reasoning, p.tools.as_ref(), &c.full);
        let mut message = json!({"role": "assistant", "content": end.pieces.content});
        if p.reasoning.is_some() {
            message["reasoning_content"] = json!(end.pieces.reasoning);
        }
        if !end.calls.is_empty() {
            reason = "tool_calls";
            let content = Some(end.pieces.content).filter(|c| !c.is_empty());
            message["content"] = json!(content);
            message["tool_calls"] = tools::openai_calls(&end.calls, false);
        }
        json!({"index": index, "message": message,
               "logprobs": logprobs_field(p, &c.entries), "finish_reason": reason})
    } else {
        json!({"index": index, "text": c.full,
               "logprobs": logprobs_field(p, &c.entries), "finish_reason": reason})
    };
    (choice, reason)
}

/// A response with the seed header, marked as logged.
pub(super) fn answered(p: &Prepared, mut r: Response) -> Response {
    r.headers_mut()
        .insert(SEED_HEADER, p.opts.sampling.seed.into());
    r.extensions_mut().insert(Logged);
    r
}

/// A streamed answer: one SSE chunk per piece of text (each choice's
/// chunks carry its index, interleaved as they come), keep-alive
/// comments while nothing comes (a long prefill), a final chunk per
/// choice with its finish reason, then, once every choice ended, a usage
/// chunk if asked and `[DONE]`.
fn stream(s: Arc<Shared>, p: Prepared, events: Vec<mpsc::UnboundedReceiver<Event>>) -> Response {
    let p = Arc::new(p);
    let (tx, rx) = mpsc::channel::<Result<sse::Event, Infallible>>(64);
    let tally = Arc::new(std::sync::Mutex::new(Tally {
        open: events.len(),
        ..Tally::default()
    }));
    let drives: Vec<_> = events
        .into_iter()
        .enumerate()
        .map(|(index, events)| {
            let out = OpenAiOut {
                s: s.clone(),
                p: p.clone(),
                tx: tx.clone(),
                index,
                tally: tally.clone(),
            };
            drive(s.clone(), p.clone(), events, out)
        })
        .collect();
    let task = async move {
        let handles: Vec<_> = drives.into_iter().map(tokio::spawn).collect();
        for h in handles {
            let _ = h.await;
        }
    };
    sse_response(&s, &p, rx, task)
}

/// The choices of a streamed answer still open, and the tokens of those
/// that ended (the usage chunk follows the last).
#[derive(Default)]
struct Tally {
    open: usize,
    tokens: usize,
    reused: usize,
    failed: bool,
}

/// The SSE response reading `rx`, with `task` (which feeds it) spawned.
pub(super) fn sse_response(
    s: &Shared,
    p: &Prepared,
    rx: mpsc::Receiver<Result<sse::Event, Infallible>>,
    task: impl std::future::Future<Output = ()> + Send + 'static,
) -> Response {
    // An hour at most: the flag's range, for callers that build the config.
    let keep_alive = s
        .config
        .keep_alive
        .min(std::time::Duration::from_secs(3600));
    tokio::spawn(task);
    let body = tokio_stream::wrappers::ReceiverStream::new(rx);
    let r = Sse::new(body)
        .keep_alive(KeepAlive::new().interval(keep_alive).text("keep-alive"))
        .into_response();
    answered(p, r)
}

pub(super) type SseTx = mpsc::Sender<Result<sse::Event, Infallible>>;

/// The end of a streamed answer.
pub(super) struct Finish {
    pub end: super::split::Ending,
    pub reason: &'static str,
    pub tokens: usize,
    pub reused: usize,
    pub stop_sequence: Option<String>,
}

/// Where a streamed answer's parts go (OpenAI's chunks, Anthropic's
/// events); each returns false once the client is gone.
pub(super) trait StreamOut: Send {
    /// Before any token.
    fn start(&mut self) -> impl std::future::Future<Output = bool> + Send;
    /// One token's logprobs entry.
    fn logprobs(&mut self, entry: Value) -> impl std::future::Future<Output = bool> + Send;
    /// The prefill moved.
    fn progress(&mut self, pr: Progress) -> impl std::future::Future<Output = bool> + Send;
    /// Text of a completion (not a chat).
    fn text(&mut self, text: String) -> impl std::future::Future<Output = bool> + Send;
    /// A chat's reasoning and content pieces.
    fn pieces(
        &mut self,
        pieces: super::split::Pieces,
    ) -> impl std::future::Future<Output = bool> + Send;
    /// The end: the last pieces, the calls, the reason and the usage.
    fn finish(&mut self, finish: Finish) -> impl std::future::Future<Output = ()> + Send;
    /// The answer failed midway.
    fn error(&mut self, e: ApiError) -> impl std::future::Future<Output = ()> + Send;
}

/// Runs a streamed answer into `out`; ends (dropping the engine's
/// channel, which cancels the request) when the client goes away.
pub(super) async fn drive<O: StreamOut>(
    s: Arc<Shared>,
    p: Arc<Prepared>,
    mut events: mpsc::UnboundedReceiver<Event>,
    mut out: O,
) {
    if !out.start().await {
        return;
    }
    let mut answer = Answer::new(&s.tok, &p);
    let mut split = Splitter::new(p.reasoning, p.tools.as_ref());
    let (mut reused, mut done) = (0, false);
    while let Some(ev) = events.recv().await {
        let piece = match ev {
            Event::Token(t) => match answer.push(t) {
                Ok(text) => text,
                Err(e) => return out.error(e).await,
            },
            Event::Logprobs(lp) => {
                let entry = logprob_entry(&s, answer.last.unwrap_or(0), &lp);
                if !out.logprobs(entry).await {
                    return;
                }
                continue;
            }
            Event::Progress(pr) => {
                if !out.progress(pr).await {
                    return;
                }
                continue;
            }
            Event::Done {
                reused: r,
                constraint_complete,
            } => {
                reused = r;
                done = true;
                answer.complete = constraint_complete;
                answer.flush()
            }
            Event::Failed(e) => return out.error(ApiError::internal(e)).await,
            Event::Expired => {
                let e = ApiError::busy("the request waited too long in the queue");
                return out.error(e).await;
            }
        };
        let gone = if !p.chat {
            !piece.is_empty() && !out.text(piece).await
        } else if done {
            false // the end is split below
        } else {
            !out.pieces(split.push(&answer.full[..answer.sent])).await
        };
        if gone {
            return;
        }
        if answer.stopped || done {
            break;
        }
    }
    let mut end = split.finish(&answer.full);
    if !p.chat {
        // A completion's text went out piece by piece above; nothing is
        // split from it.
        end.pieces.content.clear();
    }
    let reason = match end.calls.is_empty() {
        true => answer.finish_reason(&p.opts.eos_ids, p.opts.ignore_eos),
        false => "tool_calls",
    };
    log_request(&p, answer.tokens, answer.first, reason);
    answer.record_times(&s, &p);
    let finish = Finish {
        end,
        reason,
        tokens: answer.tokens,
        reused,
        stop_sequence: answer.stop_sequence.take(),
    };
    out.finish(finish).await;
}

/// OpenAI's chunks of one choice.
struct OpenAiOut {
    s: Arc<Shared>,
    p: Arc<Prepared>,
    tx: SseTx,
    index: usize,
    tally: Arc<std::sync::Mutex<Tally>>,
}

impl OpenAiOut {
    fn chunks(&self) -> Chunks<'_> {
        Chunks {
            s: &self.s,
            p: &self.p,
            index: self.index,
        }
    }

    /// Counts this choice's end; the totals once it was the last open
    /// one (and no choice failed).
    fn close(&self, tokens: usize, reused: usize, failed: bool) -> Option<(usize, usize)> {
        let mut t = self.tally.lock().expect("tally lock");
        t.open = t.open.saturating_sub(1);
        t.tokens += tokens;
        t.reused = t.reused.max(reused);
        t.failed |= failed;
        (t.open == 0 && !t.failed).then_some((t.tokens, t.reused))
    }
}

impl StreamOut for OpenAiOut {
    async fn start(&mut self) -> bool {
        let role = json!({"role": "assistant", "content": ""});
        !self.p.chat || send(&self.tx, self.chunks().delta(role, None)).await
    }

    async fn logprobs(&mut self, entry: Value) -> bool {
        send(&self.tx, self.chunks().text("", Some(entry))).await
    }

    /// A `prompt_progress` chunk with `return_progress`, else a comment.
    async fn progress(&mut self, pr: Progress) -> bool {
        match self.p.return_progress {
            true => send(&self.tx, self.chunks().progress(pr)).await,
            false => send_progress_comment(&self.tx, pr).await,
        }
    }

    async fn text(&mut self, text: String) -> bool {
        send(&self.tx, self.chunks().text(&text, None)).await
    }

    async fn pieces(&mut self, pieces: super::split::Pieces) -> bool {
        self.chunks().send_pieces(&self.tx, &pieces).await
    }

    async fn finish(&mut self, f: Finish) {
        let chunks = self.chunks();
        if !chunks.send_pieces(&self.tx, &f.end.pieces).await {
            return;
        }
        if !f.end.calls.is_empty() {
            let delta = json!({"tool_calls": tools::openai_calls(&f.end.calls, true)});
            if !send(&self.tx, chunks.delta(delta, None)).await {
                return;
            }
        }
        if !send(&self.tx, chunks.finish(f.reason)).await {
            return;
        }
        let Some((tokens, reused)) = self.close(f.tokens, f.reused, false) else {
            return;
        };
        if self.p.include_usage {
            let u = usage(&self.p, tokens, reused);
            if !send(&self.tx, chunks.usage(u)).await {
                return;
            }
        }
        let _ = self.tx.send(Ok(sse::Event::default().data("[DONE]"))).await;
    }

    async fn error(&mut self, e: ApiError) {
        self.close(0, 0, true);
        send_error(&self.tx, e).await
    }
}

/// Builds the chunks of one choice of a streamed request.
struct Chunks<'a> {
    s: &'a Shared,
    p: &'a Prepared,
    index: usize,
}

impl Chunks<'_> {
    fn chunk(&self, choices: Value, usage: Option<Value>) -> Value {
        let object = if self.p.chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        let mut c = json!({"id": self.p.id, "object": object, "created": self.p.created,
                           "model": self.s.config.model_name,
                           "system_fingerprint": fingerprint(self.p), "choices": choices});
        if let Some(u) = usage {
            c["usage"] = u;
        }
        c
    }

    fn delta(&self, delta: Value, logprobs: Option<Value>) -> Value {
        let lp = logprobs.map_or(Value::Null, |e| json!({"content": [e]}));
        self.chunk(
            json!([{"index": self.index, "delta": delta, "logprobs": lp, "finish_reason": null}]),
            None,
        )
    }

    /// A chunk carrying `text` (and one token's logprobs entry).
    fn text(&self, text: &str, entry: Option<Value>) -> Value {
        if self.p.chat {
            return self.delta(json!({"content": text}), entry);
        }
        let lp = entry.map_or(Value::Null, |e| completion_logprobs(&[e]));
        self.chunk(
            json!([{"index": self.index, "text": text, "logprobs": lp, "finish_reason": null}]),
            None,
        )
    }

    /// Sends a chat's reasoning and content pieces (the empty ones not);
    /// false once the client is gone.
    async fn send_pieces(&self, tx: &SseTx, pieces: &super::split::Pieces) -> bool {
        if !pieces.reasoning.is_empty() {
            let delta = json!({"reasoning_content": pieces.reasoning});
            if !send(tx, self.delta(delta, None)).await {
                return false;
            }
        }
        pieces.content.is_empty() || send(tx, self.text(&pieces.content, None)).await
    }

    fn finish(&self, reason: &str) -> Value {
        let choice = if self.p.chat {
            json!({"index": self.index, "delta": {}, "logprobs": null, "finish_reason": reason})
        } else {
            json!({"index": self.index, "text": "", "logprobs": null, "finish_reason": reason})
        };
        self.chunk(json!([choice]), None)
    }

    fn usage(&self, usage: Value) -> Value {
        self.chunk(json!([]), Some(usage))
    }

    /// llama-server's `prompt_progress` chunk (no choices), with the
    /// choice's index and the milliseconds since the request arrived.
    fn progress(&self, pr: Progress) -> Value {
        let mut c = self.chunk(json!([]), None);
        let time_ms = self.p.started.elapsed().as_secs_f64() * 1e3;
        c["prompt_progress"] = json!({"index": self.index, "total": pr.total, "cache": pr.cache,
                                      "processed": pr.processed, "time_ms": time_ms});
        c
    }
}

/// An SSE comment `prefill PROCESSED/TOTAL` (a keep-alive that says how
/// far the prefill is); false once the client is gone.
pub(super) async fn send_progress_comment(tx: &SseTx, pr: Progress) -> bool {
    let comment = format!("prefill {}/{}", pr.processed, pr.total);
    tx.send(Ok(sse::Event::default().comment(comment)))
        .await
        .is_ok()
}

/// Sends one chunk; false once the client is gone.
async fn send(tx: &SseTx, chunk: Value) -> bool {
    tx.send(Ok(sse::Event::default().data(chunk.to_string())))
        .await
        .is_ok()
}

async fn send_error(tx: &SseTx, e: ApiError) {
    let _ = tx
        .send(Ok(sse::Event::default().data(e.body().to_string())))
        .await;
}
