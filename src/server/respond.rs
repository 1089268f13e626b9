//! A completion request from body to response: read the body (bounded in
//! bytes and time), parse and check it, build the prompt (the chat
//! template for chat) on the blocking pool, submit it to the engine
//! thread, and answer with the whole text or as server-sent events.

use super::api::{self, ApiError, Request};
use super::guard::COMPLETION_BODY_BYTES_MAX;
use super::stop::{scan, Scan};
use super::worker::{Command, Event, Submit};
use super::Shared;
use crate::engine::generate::GenOptions;
use crate::engine::sampler::SamplingParams;
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
use tokio::sync::{mpsc, OwnedSemaphorePermit};

/// A checked request, ready for the engine.
struct Prepared {
    chat: bool,
    prompt: Vec<u32>,
    opts: GenOptions,
    logprobs: Option<usize>,
    stops: Vec<String>,
    stream: bool,
    include_usage: bool,
    id: String,
    created: u64,
}

/// Answers a chat (`chat`) or text completion request (its head has
/// passed the [guard](super::guard)).
pub(super) async fn complete(s: Arc<Shared>, body: Body, chat: bool) -> Result<Response, ApiError> {
    s.ready()?;
    let (body, room) = read_body(&s, body).await?;
    let p = prepare_blocking(s.clone(), body, room, chat).await?;
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
async fn read_body(s: &Shared, body: Body) -> Result<(Bytes, OwnedSemaphorePermit), ApiError> {
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

/// Parses, checks and prepares a request on the blocking pool (at most
/// [`preparing_max`](super::preparing_max) at once): templates, tokenizers
/// and grammar compilers are CPU work the async threads must not wait on.
async fn prepare_blocking(
    s: Arc<Shared>,
    body: Bytes,
    room: OwnedSemaphorePermit,
    chat: bool,
) -> Result<Prepared, ApiError> {
    let permit = s
        .preparing
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| ApiError::unavailable("the server is shutting down"))?;
    let job = tokio::task::spawn_blocking(move || {
        let _permits = (permit, room);
        let req = Request::parse(&body)?;
        s.check_model(req.model.as_deref())?;
        req.refuse_unsupported()?;
        prepare(&s, &req, chat)
    });
    job.await
        .map_err(|e| ApiError::internal(format!("preparing the request: {e}")))?
}

fn prepare(s: &Shared, req: &Request, chat: bool) -> Result<Prepared, ApiError> {
    let prompt = if chat {
        chat_prompt(s, req)?
    } else {
        text_prompt(s, req)?
    };
    let overrides = req.overrides().or(s.config.overrides);
    // OpenAI's default temperature is 1 where the model's
    // generation_config.json says nothing.
    let base = SamplingParams {
        temperature: 1.0,
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
        None => s.config.max_tokens_default,
    };
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
            constraint: constrained(s, req)?,
        },
        logprobs: req.logprobs(chat)?,
        stops: req.stops()?,
        stream: req.stream,
        include_usage: req.include_usage(),
        id: format!("{}-{n}", if chat { "chatcmpl" } else { "cmpl" }),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    })
}

/// The request's `response_format` constraint with the model's prepared
/// tokenizer; one that does not compile is a 400 naming the reason.
fn constrained(s: &Shared, req: &Request) -> Result<Option<crate::engine::Constrained>, ApiError> {
    let Some(constraint) = req.constraint()? else {
        return Ok(None);
    };
    let grammars = match s.grammars.get() {
        Some(Ok(g)) => g.clone(),
        Some(Err(e)) => {
            let msg = format!("constrained output is unavailable for this model: {e}");
            return Err(ApiError::bad(msg));
        }
        None => return Err(ApiError::unavailable("the model is loading")),
    };
    let mut state = grammars
        .start(&constraint)
        .map_err(|e| ApiError::bad_param("response_format", e.to_string()))?;
    if !state.can_start() {
        return Err(ApiError::bad_param(
            "response_format",
            "the schema matches no output at all (a $ref that only refers to itself, or a contradiction); nothing can be generated",
        ));
    }
    Ok(Some(crate::engine::Constrained {
        grammars,
        constraint,
    }))
}

fn chat_prompt(s: &Shared, req: &Request) -> Result<Vec<u32>, ApiError> {
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
        .map(api::to_message)
        .collect::<Result<Vec<_>, _>>()?;
    let text = template
        .render(&messages, true)
        .map_err(|e| ApiError::bad_param("messages", e.to_string()))?;
    check_text_bytes(s, "messages", &text)?;
    s.tok
        .encode_raw(&text)
        .map_err(|e| ApiError::internal(e.to_string()))
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
fn check_text_bytes(s: &Shared, param: &'static str, text: &str) -> Result<(), ApiError> {
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

/// Hands the request to the engine thread; its events come on the
/// returned channel. A refusal is answered: 429 for a full queue, 400 for
/// what the model cannot serve (naming the numbers), 503 at shutdown.
async fn submit(s: &Shared, p: &Prepared) -> Result<mpsc::UnboundedReceiver<Event>, ApiError> {
    let (events, rx) = mpsc::unbounded_channel();
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
        Ok(Ok(())) => Ok(rx),
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
}

impl<'t> Answer<'t> {
    fn new(tok: &'t crate::formats::tokenizer::Tokenizer, stops: Vec<String>) -> Answer<'t> {
        Answer {
            text: TextStream::new(tok),
            full: String::new(),
            sent: 0,
            stops,
            stopped: false,
            tokens: 0,
            last: None,
        }
    }

    /// Takes a token; returns the text that can be sent now.
    fn push(&mut self, id: u32) -> Result<String, ApiError> {
        self.tokens += 1;
        self.last = Some(id);
        let piece = self
            .text
            .push(id)
            .map_err(|e| ApiError::internal(e.to_string()))?;
        self.full.push_str(&piece);
        let until = match scan(&self.full, &self.stops) {
            Scan::SendUpTo(n) => n,
            Scan::StopAt(n) => {
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
        if self.stopped || eos {
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

/// A non-streamed answer: waits for every token.
async fn whole(
    s: Arc<Shared>,
    p: Prepared,
    mut events: mpsc::UnboundedReceiver<Event>,
) -> Result<Response, ApiError> {
    let mut answer = Answer::new(&s.tok, p.stops.clone());
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
            Event::Logprobs(lp) => entries.push(logprob_entry(&s, answer.last.unwrap_or(0), &lp)),
            Event::Done { reused: r } => {
                reused = r;
                answer.flush();
                break;
            }
            Event::Failed(e) => return Err(ApiError::internal(e)),
            Event::Expired => {
                return Err(ApiError::busy("the request waited too long in the queue"))
            }
        }
    }
    let reason = answer.finish_reason(&p.opts.eos_ids, p.opts.ignore_eos);
    let choice = if p.chat {
        json!({"index": 0, "message": {"role": "assistant", "content": answer.full},
               "logprobs": logprobs_field(&p, &entries), "finish_reason": reason})
    } else {
        json!({"index": 0, "text": answer.full,
               "logprobs": logprobs_field(&p, &entries), "finish_reason": reason})
    };
    let object = if p.chat {
        "chat.completion"
    } else {
        "text_completion"
    };
    Ok(Json(json!({
        "id": p.id, "object": object, "created": p.created, "model": s.config.model_name,
        "choices": [choice], "usage": usage(&p, answer.tokens, reused),
    }))
    .into_response())
}

/// A streamed answer: one SSE chunk per piece of text, keep-alive
/// comments while nothing comes (a long prefill), a final chunk with the
/// finish reason, a usage chunk if asked, then `[DONE]`.
fn stream(s: Arc<Shared>, p: Prepared, events: mpsc::UnboundedReceiver<Event>) -> Response {
    let (tx, rx) = mpsc::channel::<Result<sse::Event, Infallible>>(64);
    // An hour at most: the flag's range, for callers that build the config.
    let keep_alive = s
        .config
        .keep_alive
        .min(std::time::Duration::from_secs(3600));
    tokio::spawn(stream_task(s, p, events, tx));
    let body = tokio_stream::wrappers::ReceiverStream::new(rx);
    Sse::new(body)
        .keep_alive(KeepAlive::new().interval(keep_alive).text("keep-alive"))
        .into_response()
}

type SseTx = mpsc::Sender<Result<sse::Event, Infallible>>;

/// Sends the chunks of a streamed answer; ends (dropping the engine's
/// channel, which cancels the request) when the client goes away.
async fn stream_task(
    s: Arc<Shared>,
    p: Prepared,
    mut events: mpsc::UnboundedReceiver<Event>,
    tx: SseTx,
) {
    let chunks = Chunks { s: &s, p: &p };
    if p.chat
        && !send(
            &tx,
            chunks.delta(json!({"role": "assistant", "content": ""}), None),
        )
        .await
    {
        return;
    }
    let mut answer = Answer::new(&s.tok, p.stops.clone());
    let (mut reused, mut done) = (0, false);
    while let Some(ev) = events.recv().await {
        let piece = match ev {
            Event::Token(t) => match answer.push(t) {
                Ok(text) => text,
                Err(e) => return send_error(&tx, e).await,
            },
            Event::Logprobs(lp) => {
                let entry = logprob_entry(&s, answer.last.unwrap_or(0), &lp);
                if !send(&tx, chunks.text("", Some(entry))).await {
                    return;
                }
                continue;
            }
            Event::Done { reused: r } => {
                reused = r;
                done = true;
                answer.flush()
            }
            Event::Failed(e) => return send_error(&tx, ApiError::internal(e)).await,
            Event::Expired => {
                return send_error(
                    &tx,
                    ApiError::busy("the request waited too long in the queue"),
                )
                .await
            }
        };
        if !piece.is_empty() && !send(&tx, chunks.text(&piece, None)).await {
            return;
        }
        if answer.stopped || done {
            break;
        }
    }
    let reason = answer.finish_reason(&p.opts.eos_ids, p.opts.ignore_eos);
    if !send(&tx, chunks.finish(reason)).await {
        return;
    }
    if p.include_usage {
        let u = usage(&p, answer.tokens, reused);
        if !send(&tx, chunks.usage(u)).await {
            return;
        }
    }
    let _ = tx.send(Ok(sse::Event::default().data("[DONE]"))).await;
}

/// Builds a streamed request's chunks.
struct Chunks<'a> {
    s: &'a Shared,
    p: &'a Prepared,
}

impl Chunks<'_> {
    fn chunk(&self, choices: Value, usage: Option<Value>) -> Value {
        let object = if self.p.chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        let mut c = json!({"id": self.p.id, "object": object, "created": self.p.created,
                           "model": self.s.config.model_name, "choices": choices});
        if let Some(u) = usage {
            c["usage"] = u;
        }
        c
    }

    fn delta(&self, delta: Value, logprobs: Option<Value>) -> Value {
        let lp = logprobs.map_or(Value::Null, |e| json!({"content": [e]}));
        self.chunk(
            json!([{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": null}]),
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
            json!([{"index": 0, "text": text, "logprobs": lp, "finish_reason": null}]),
            None,
        )
    }

    fn finish(&self, reason: &str) -> Value {
        let choice = if self.p.chat {
            json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": reason})
        } else {
            json!({"index": 0, "text": "", "logprobs": null, "finish_reason": reason})
        };
        self.chunk(json!([choice]), None)
    }

    fn usage(&self, usage: Value) -> Value {
        self.chunk(json!([]), Some(usage))
    }
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
