//! llama-server's own endpoints, with its field names: `POST /tokenize`
//! (`content`, `add_special`, `with_pieces`), `POST /detokenize`
//! (`tokens`), `GET /props` (the default generation settings, the slots,
//! the chat template), `GET /slots` (each slot, idle or running) and
//! `POST /slots/{id}?action=save|restore|erase` (`{"filename"}`: the
//! slot's KV saved to or restored from that file of `--kv-dir`, in the
//! [KV file format](crate::engine::kv_file); an erase drops it).
//!
//! They sit behind the same [guard](super::guard) as `/v1/*` (the API key,
//! the body limits); tokenizing runs on the blocking pool under the same
//! bound as preparing a completion. A field llama-server has and this
//! server cannot honour (`parse_special: false`) is refused by name, an
//! unknown one too.

use super::api::ApiError;
use super::respond;
use super::worker::{Command, SlotAction, SlotDone, SlotRequest};
use super::Shared;
use crate::error::Error;
use axum::body::Body;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// `POST /tokenize`'s body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenizeRequest {
    content: String,
    /// Add the tokenizer's own special tokens (BOS); llama-server's
    /// default is false.
    #[serde(default)]
    add_special: bool,
    /// Special-token text maps to its id (the only way this tokenizer
    /// encodes; false is refused).
    #[serde(default = "yes")]
    parse_special: bool,
    /// Answer `{id, piece}` pairs instead of bare ids.
    #[serde(default)]
    with_pieces: bool,
}

fn yes() -> bool {
    true
}

/// `POST /detokenize`'s body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DetokenizeRequest {
    tokens: Vec<u32>,
}

fn parse<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad(format!("invalid request body: {e}")))
}

/// `POST /tokenize`: `{"tokens": [ids]}`, or with `with_pieces`
/// `{"tokens": [{"id", "piece"}]}` (each token's own text).
pub(super) async fn tokenize(s: Arc<Shared>, body: Body) -> Result<Response, ApiError> {
    let (bytes, room) = respond::read_body(&s, body).await?;
    let shared = s.clone();
    let tokens = respond::blocking(&s, "tokenizing", move || {
        let _room = room;
        let req: TokenizeRequest = parse(&bytes)?;
        if !req.parse_special {
            return Err(ApiError::bad_param(
                "parse_special",
                "parse_special: false is not supported (special-token text always maps to its id)",
            ));
        }
        respond::check_text_bytes(&shared, "content", &req.content)?;
        let ids = match req.add_special {
            true => shared.tok.encode(&req.content),
            false => shared.tok.encode_raw(&req.content),
        }
        .map_err(|e| ApiError::internal(e.to_string()))?;
        if !req.with_pieces {
            return Ok(json!(ids));
        }
        let pieces = ids
            .iter()
            .map(|&id| {
                let piece = shared.tok.decode_special(&[id]).unwrap_or_default();
                json!({"id": id, "piece": piece})
            })
            .collect::<Vec<_>>();
        Ok(Value::Array(pieces))
    })
    .await?;
    Ok(Json(json!({ "tokens": tokens })).into_response())
}

/// `POST /detokenize`: `{"content": text}` of the ids, special tokens
/// included (as llama-server writes them).
pub(super) async fn detokenize(s: Arc<Shared>, body: Body) -> Result<Response, ApiError> {
    let (bytes, room) = respond::read_body(&s, body).await?;
    let shared = s.clone();
    let content = respond::blocking(&s, "detokenizing", move || {
        let _room = room;
        let req: DetokenizeRequest = parse(&bytes)?;
        let vocab = shared.tok.vocab_size();
        if let Some(bad) = req.tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ApiError::bad_param(
                "tokens",
                format!("token {bad} is not below the vocabulary's {vocab}"),
            ));
        }
        shared
            .tok
            .decode_special(&req.tokens)
            .map_err(|e| ApiError::internal(e.to_string()))
    })
    .await?;
    Ok(Json(json!({ "content": content })).into_response())
}

/// The sampling settings a request that sets none gets (the command
/// line's over generation_config.json's over OpenAI's defaults), as
/// llama-server names them.
fn default_params(s: &Shared) -> Value {
    let base = crate::engine::sampler::SamplingParams {
        temperature: 1.0,
        ..Default::default()
    };
    let p = s.defaults.sampling(&base, &s.config.overrides);
    let n_predict = match s.config.max_tokens_default {
        usize::MAX => -1,
        n => n as i64,
    };
    json!({
        "temperature": p.temperature,
        "top_k": p.top_k,
        "top_p": p.top_p,
        "min_p": p.min_p,
        "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty,
        "repeat_penalty": p.repetition_penalty,
        // Without one set, each request draws its own (llama-server's
        // LLAMA_DEFAULT_SEED).
        "seed": s.config.overrides.seed.map_or(json!(u32::MAX), |v| json!(v)),
        "n_predict": n_predict,
    })
}

/// The KV positions one slot holds (0 while the model loads).
fn n_ctx(s: &Shared) -> usize {
    s.kv_positions.get().copied().unwrap_or(0)
}

/// `GET /props`.
pub(super) async fn props(s: Arc<Shared>) -> Result<Response, ApiError> {
    let tokens = s.template.as_ref().map(|t| t.special_tokens());
    let eos = s
        .defaults
        .eos_ids
        .first()
        .map(|&id| s.tok.decode_special(&[id]).unwrap_or_default());
    let body = json!({
        "default_generation_settings": {
            "n_ctx": n_ctx(&s),
            "params": default_params(&s),
        },
        "total_slots": s.config.scheduler.kv_slots,
        "model_alias": s.config.model_name,
        "model_path": s.config.model_dir.display().to_string(),
        "chat_template": s.template.as_ref().map_or("", |t| t.source()),
        "bos_token": tokens.and_then(|t| t.bos_token.clone()),
        "eos_token": tokens.and_then(|t| t.eos_token.clone()).or(eos),
        "modalities": {"vision": false, "audio": false},
        "build_info": format!("moestream {}", env!("CARGO_PKG_VERSION")),
    });
    Ok(Json(body).into_response())
}

/// `GET /slots`: every slot, with what its request has done so far.
pub(super) async fn slots(s: Arc<Shared>) -> Result<Response, ApiError> {
    s.ready()?;
    let running = s.metrics.lock().expect("metrics lock").running.clone();
    let n_ctx = n_ctx(&s);
    let params = default_params(&s);
    let list: Vec<Value> = (0..s.config.scheduler.kv_slots)
        .map(|slot| {
            let r = running.iter().find(|r| r.slot == slot);
            json!({
                "id": slot,
                "id_task": r.map_or(-1, |r| r.id as i64),
                "n_ctx": n_ctx,
                "speculative": s.config.speculation != crate::engine::Speculation::Off,
                "is_processing": r.is_some(),
                "params": params,
                "n_prompt_tokens": r.map_or(0, |r| r.prompt_tokens),
                "next_token": [{
                    "has_next_token": r.is_some_and(|r| r.remaining > 0),
                    "n_remain": r.map_or(-1, |r| r.remaining as i64),
                    "n_decoded": r.map_or(0, |r| r.decoded),
                }],
            })
        })
        .collect();
    Ok(Json(Value::Array(list)).into_response())
}

/// `POST /slots/{id}?action=save|restore`'s body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SlotFile {
    filename: String,
}

/// The `action` of a query string (`action=save`), if any.
fn query_action(query: Option<&str>) -> Option<&str> {
    query?.split('&').find_map(|kv| kv.strip_prefix("action="))
}

/// The slot action a request asks for, every bad part refused by name.
fn slot_action(query: Option<&str>, body: &[u8]) -> Result<SlotAction, ApiError> {
    let file = || -> Result<String, ApiError> {
        let f: SlotFile = parse(body)?;
        super::kv_dir::check_slot_name(&f.filename)
            .map_err(|e| ApiError::bad_param("filename", e))?;
        Ok(f.filename)
    };
    match query_action(query) {
        Some("save") => Ok(SlotAction::Save(file()?)),
        Some("restore") => Ok(SlotAction::Restore(file()?)),
        Some("erase") => Ok(SlotAction::Erase),
        other => Err(ApiError::bad_param(
            "action",
            format!("action {other:?}: expected ?action=save, restore or erase"),
        )),
    }
}

/// `POST /slots/{id}?action=...`: llama-server's answer shapes (`id_slot`,
/// `filename`, `n_saved` / `n_restored` / `n_erased`, `n_written` /
/// `n_read`, `timings`).
pub(super) async fn slot_post(
    s: Arc<Shared>,
    id: String,
    query: Option<String>,
    body: Body,
) -> Result<Response, ApiError> {
    s.ready()?;
    let slots = s.config.scheduler.kv_slots;
    let slot = id
        .parse::<usize>()
        .ok()
        .filter(|&n| n < slots)
        .ok_or_else(|| {
            ApiError::bad_param(
                "id_slot",
                format!("slot {id:?}: this server has slots 0 to {}", slots - 1),
            )
        })?;
    let (bytes, _room) = respond::read_body(&s, body).await?;
    let action = slot_action(query.as_deref(), &bytes)?;
    let (reply, answer) = tokio::sync::oneshot::channel();
    let request = SlotRequest {
        slot,
        action: action.clone(),
        reply,
    };
    s.commands
        .send(Command::Slot(request))
        .map_err(|_| ApiError::unavailable("the server is shutting down"))?;
    let done = match answer.await {
        Ok(Ok(done)) => done,
        Ok(Err(e @ (Error::Request(_) | Error::KvFile { .. }))) => {
            return Err(ApiError::bad(e.to_string()))
        }
        Ok(Err(e)) if matches!(action, SlotAction::Restore(_)) => {
            return Err(ApiError::bad(e.to_string()))
        }
        Ok(Err(e)) => return Err(ApiError::internal(e.to_string())),
        Err(_) => return Err(ApiError::unavailable("the server is shutting down")),
    };
    Ok(Json(slot_answer(slot, &action, done)).into_response())
}

/// The answer to a slot action that ran.
fn slot_answer(slot: usize, action: &SlotAction, done: SlotDone) -> Value {
    match action {
        SlotAction::Save(name) => json!({
            "id_slot": slot, "filename": name, "n_saved": done.positions,
            "n_written": done.bytes, "timings": {"save_ms": done.ms},
        }),
        SlotAction::Restore(name) => json!({
            "id_slot": slot, "filename": name, "n_restored": done.positions,
            "n_read": done.bytes, "timings": {"restore_ms": done.ms},
        }),
        SlotAction::Erase => json!({"id_slot": slot, "n_erased": done.positions}),
    }
}
