//! `moestream run`: one prompt, streamed or as JSON; `--prompts FILE`,
//! one request after another or `--batch N` at once through a session pool.

use super::*;

#[derive(Args)]
pub(super) struct RunArgs {
    /// Prompt text (tokenized with tokenizer.json); `-` reads it from
    /// standard input.
    #[arg(
        short = 'p',
        long,
        help_heading = H_GEN,
        conflicts_with_all = ["prompt_ids", "prompts", "file"],
        required_unless_present_any = ["prompt_ids", "prompts", "file"]
    )]
    prompt: Option<String>,
    /// The prompt is this file's text (`-`: standard input); one trailing
    /// newline is dropped, as llama.cpp does.
    #[arg(short = 'f', long, value_name = "FILE", help_heading = H_GEN,
          conflicts_with_all = ["prompt_ids", "prompts"])]
    file: Option<PathBuf>,
    /// Prompt as comma-separated token ids.
    #[arg(long, value_delimiter = ',', conflicts_with = "prompts", help_heading = H_GEN)]
    prompt_ids: Option<Vec<u32>>,
    /// A file of prompts, one per non-empty line, served one after another
    /// by the same loaded model; between requests the pinned hot set is
    /// re-picked from the experts' heats (with --json: one object per line).
    #[arg(long, value_name = "FILE", help_heading = H_GEN)]
    prompts: Option<PathBuf>,
    /// With --prompts: serve up to N requests at once, stepped together in
    /// one batch (each MoE layer reads the union of their experts once);
    /// each request's result is printed when it finishes. 1 serves them one
    /// after another.
    #[arg(long, default_value_t = 1, requires = "prompts", help_heading = H_GEN,
          value_parser = clap::value_parser!(u16).range(1..=256))]
    batch: u16,
    /// The prompt is one user message: the model's chat template (or
    /// --chat-template) renders it with the assistant's turn opened, as
    /// the server's /v1/chat/completions does.
    #[arg(long, help_heading = H_GEN, conflicts_with_all = ["prompt_ids", "prompts"])]
    chat: bool,
    /// With --chat: a system message before the prompt.
    #[arg(long, requires = "chat", help_heading = H_GEN)]
    system: Option<String>,
    /// With --chat: a Jinja chat template to use instead of the model's.
    #[arg(long, value_name = "FILE", requires = "chat", help_heading = H_GEN)]
    chat_template: Option<PathBuf>,
    #[command(flatten)]
    gen: GenArgs,
    #[command(flatten)]
    pub(super) model: ModelArgs,
}

pub(super) fn cmd_run(mut a: RunArgs) -> Result<()> {
    let dir = a.model.model.clone();
    let tok = Tokenizer::load(&dir);
    if let Some(path) = a.prompts.clone() {
        let text = moestream::fs::read_to_string(&path, moestream::fs::read::PROMPTS)
            .with_context(|| format!("reading prompts from {}", path.display()))?;
        let inputs = super::eval::lines_input_bytes(&text);
        let model = super::load_with_inputs(&a.model, inputs)?;
        let tok = tok.map_err(|e| anyhow::anyhow!("{e}"))?;
        return serve_prompts(&model, &tok, &path, &text, &a);
    }
    let prompt = match (prompt_text(&a)?, &a.prompt_ids) {
        (Some(text), _) => {
            check_tokenizable(&a.model, &text)?;
            let tok = tok.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
            match a.chat {
                true => chat_prompt(&a, tok, &dir, &text)?,
                false => tok.encode(&text)?,
            }
        }
        (None, Some(ids)) => ids.clone(),
        (None, None) => bail!("give --prompt, --file or --prompt-ids"),
    };
    // One request: the plan reserves KV for exactly what it can use, and
    // the rest of the budget goes to expert slots.
    if a.model.context.is_none() {
        let wanted = prompt.len().saturating_add(a.gen.max_tokens);
        a.model.context = Some(wanted.clamp(1, super::limits::CONTEXT_MAX));
    }
    let model = load(&a.model)?;
    let mut opts = gen_options(&a.gen, &dir)?;
    opts.constraint = constrained(&a.gen, &dir, &model, &opts.eos_ids)?;
    if a.gen.json {
        let g = generate(&model, &prompt, &opts, |_| Ok(())).map_err(with_flags)?;
        save_history(&model, &a.model);
        let text = match &tok {
            Ok(t) => t.decode(&g.token_ids)?,
            Err(e) => {
                eprintln!("warning: {e}; `text` is empty (token_ids are exact)");
                String::new()
            }
        };
        print_json(&g, &text, &model, None)?;
        return Ok(());
    }
    let tok = tok.map_err(|e| anyhow::anyhow!("{e}"))?;
    let g = stream_text(&model, &tok, &prompt, &opts)?;
    save_history(&model, &a.model);
    eprintln!("{}", g.stats.line());
    Ok(())
}

/// Refuses a prompt whose tokenizing (before the model loads) would not
/// fit the budget (`--ram-gb`, or the machine's without one).
fn check_tokenizable(m: &ModelArgs, text: &str) -> Result<()> {
    let budget = match (m.budget_gb(), m.ram_gb) {
        (Some(gb), _) => Some((gb * 1e9) as u64),
        (None, None) => moestream::machine::memory::machine_budget().map(|b| b.bytes),
        (None, Some(_)) => None,
    };
    let need = moestream::formats::tokenizer::tokenize_bytes(text.len() as u64);
    match budget {
        Some(budget) if need > budget => bail!(
            "the prompt has {} bytes of text; tokenizing it takes about {:.2} GB ({} bytes a byte), over the budget of {:.2} GB",
            text.len(),
            moestream::machine::gb(need),
            moestream::formats::tokenizer::TOKENIZE_BYTES_PER_BYTE,
            moestream::machine::gb(budget)
        ),
        _ => Ok(()),
    }
}

/// The prompt's text: `--prompt TEXT`, or `--file FILE` (one trailing
/// newline dropped), either read from standard input when `-`.
fn prompt_text(a: &RunArgs) -> Result<Option<String>> {
    let cap = moestream::fs::read::PROMPTS;
    let text = match (&a.prompt, &a.file) {
        (Some(t), _) if t != "-" => return Ok(Some(t.clone())),
        (Some(_), _) => read_stdin(cap).context("--prompt - (standard input)")?,
        (None, Some(f)) if f.as_os_str() == "-" => {
            read_stdin(cap).context("--file - (standard input)")?
        }
        (None, Some(f)) => moestream::fs::read_to_string(f, cap)
            .with_context(|| format!("--file {}", f.display()))?,
        (None, None) => return Ok(None),
    };
    let text = text.strip_suffix('\n').unwrap_or(&text);
    Ok(Some(text.strip_suffix('\r').unwrap_or(text).to_string()))
}

/// Standard input as text, at most `cap` bytes.
fn read_stdin(cap: moestream::fs::read::Cap) -> Result<String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::io::stdin()
        .lock()
        .take(cap.bytes + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap.bytes {
        bail!("more than {} bytes, the limit of a {}", cap.bytes, cap.what);
    }
    String::from_utf8(bytes).context("not UTF-8 text")
}

/// `run --chat`: `text` as one user message (after `--system`'s), rendered
/// by the chat template with the assistant's turn opened and tokenized as
/// the server tokenizes a chat request (the template writes the special
/// tokens itself).
fn chat_prompt(a: &RunArgs, tok: &Tokenizer, dir: &Path, text: &str) -> Result<Vec<u32>> {
    use moestream::formats::chat::Message;
    let template = super::serve::chat_template_required(a.chat_template.as_deref(), dir)?;
    let mut messages = Vec::new();
    if let Some(s) = &a.system {
        messages.push(Message::new("system", s.clone()));
    }
    messages.push(Message::new("user", text));
    Ok(tok.encode_raw(&template.render(&messages, true)?)?)
}

/// `run --prompts FILE`: each line a request, the pinned set re-picked
/// between requests; the usage history is saved once at the end. A request
/// that fails is reported with its line number (on stderr, and with
/// `--json` as an object with `request`, `line` and `error`), and the rest
/// are still served; the run then fails, naming every failed line.
pub(super) fn serve_prompts(
    model: &Model,
    tok: &Tokenizer,
    path: &Path,
    text: &str,
    a: &RunArgs,
) -> Result<()> {
    let lines: Vec<(usize, &str)> = (1..)
        .zip(text.lines())
        .filter(|(_, l)| !l.trim().is_empty())
        .collect();
    anyhow::ensure!(!lines.is_empty(), "{}: no prompts in it", path.display());
    let mut opts = gen_options(&a.gen, &a.model.model)?;
    opts.constraint = constrained(&a.gen, &a.model.model, model, &opts.eos_ids)?;
    if a.batch > 1 {
        return serve_batched(model, tok, path, &lines, &opts, a);
    }
    let mut failed = Vec::new();
    for (i, &(line_no, line)) in lines.iter().enumerate() {
        if let Err(e) = serve_one(model, tok, line, &opts, a.gen.json, i) {
            eprintln!("error: {}, line {line_no}: {e:#}", path.display());
            if a.gen.json {
                let row =
                    serde_json::json!({"request": i, "line": line_no, "error": format!("{e:#}")});
                println!("{row}");
            }
            failed.push(line_no);
        }
    }
    save_history(model, &a.model);
    fail_on_lines(path, lines.len(), &failed)
}

/// The error of a `--prompts` run some of whose lines failed.
pub(super) fn fail_on_lines(path: &Path, total: usize, failed: &[usize]) -> Result<()> {
    if failed.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = failed.iter().map(|n| n.to_string()).collect();
    bail!(
        "{} of {total} requests in {} failed (lines {})",
        failed.len(),
        path.display(),
        list.join(", ")
    )
}

/// `run --prompts FILE --batch N`: every request submitted to a session
/// pool of N slots (the rest queue), stepped in batches of up to N; each
/// request's result is printed as it finishes (`--json`: `request`, `line`,
/// `prompt_ids`, `token_ids`, `text`), then one stats line for the whole
/// run. A request the model refuses is reported like the sequential path.
pub(super) fn serve_batched(
    model: &Model,
    tok: &Tokenizer,
    path: &Path,
    lines: &[(usize, &str)],
    opts: &GenOptions,
    a: &RunArgs,
) -> Result<()> {
    use moestream::engine::{PoolEvent, SessionPool};
    let encoded: Vec<Result<Vec<u32>>> = lines
        .iter()
        .map(|(_, line)| tok.encode(line).map_err(anyhow::Error::from))
        .collect();
    // Under a RAM plan, as many at once as the reserved KV positions hold.
    let longest = encoded.iter().flatten().map(Vec::len).max().unwrap_or(1);
    let n = SessionPool::slots_within_budget(model, longest + opts.max_tokens, a.batch.into());
    let config = moestream_scheduler::SchedulerConfig {
        kv_slots: n,
        queue_max: lines.len(),
        queue_wait_ms_max: u64::MAX,
        batch_max: n,
    };
    let mut pool = SessionPool::new(model, config);
    let mut failed = Vec::new();
    for (i, (&(line_no, _), prompt)) in lines.iter().zip(encoded).enumerate() {
        let submitted =
            prompt.and_then(|p| pool.submit(i as u64, &p, opts).map_err(anyhow::Error::from));
        if let Err(e) = submitted {
            report_failure(path, i, line_no, &e, a.gen.json);
            failed.push(line_no);
        }
    }
    let start = std::time::Instant::now();
    let mut prof = moestream::model::profile::Profile::default();
    let mut tokens = 0usize;
    while !pool.is_idle() {
        for ev in pool.step(&mut prof) {
            match ev {
                PoolEvent::Token(..) => tokens += 1,
                PoolEvent::Finished(id) => {
                    let s = pool.take_finished(id).expect("a finished session");
                    let text = tok.decode(&s.tokens)?;
                    let (i, line_no) = (id as usize, lines[id as usize].0);
                    if a.gen.json {
                        let row = serde_json::json!({"request": i, "line": line_no,
                            "prompt_ids": s.prompt, "token_ids": s.tokens, "text": text});
                        println!("{row}");
                    } else {
                        println!("[request {}, line {line_no}] {text}", i + 1);
                    }
                }
                PoolEvent::Failed(id, e) => {
                    let (i, line_no) = (id as usize, lines[id as usize].0);
                    report_failure(path, i, line_no, &anyhow::anyhow!(e), a.gen.json);
                    failed.push(line_no);
                }
                PoolEvent::Logprobs(..) => {}
                PoolEvent::Expired(_) => unreachable!("the queue never expires here"),
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "[stats] {} requests, {tokens} tokens in {secs:.2} s ({:.2} tok/s) in batches of up to {n}",
        lines.len() - failed.len(),
        tokens as f64 / secs.max(1e-9)
    );
    save_history(model, &a.model);
    fail_on_lines(path, lines.len(), &failed)
}

/// Reports a failed `--prompts` request on stderr (and with `--json` as an
/// object with `request`, `line` and `error`).
pub(super) fn report_failure(path: &Path, i: usize, line_no: usize, e: &anyhow::Error, json: bool) {
    eprintln!("error: {}, line {line_no}: {e:#}", path.display());
    if json {
        let row = serde_json::json!({"request": i, "line": line_no, "error": format!("{e:#}")});
        println!("{row}");
    }
}

/// One request of `--prompts`: generate, re-pin, report.
pub(super) fn serve_one(
    model: &Model,
    tok: &Tokenizer,
    line: &str,
    opts: &GenOptions,
    json: bool,
    i: usize,
) -> Result<()> {
    let prompt = tok.encode(line)?;
    let g = if json {
        generate(model, &prompt, opts, |_| Ok(())).map_err(with_flags)?
    } else {
        stream_text(model, tok, &prompt, opts)?
    };
    // Between requests: move pins to experts that ran hotter.
    let repins = model.store.repin()?;
    if json {
        let text = tok.decode(&g.token_ids)?;
        print_json(&g, &text, model, Some((i, repins)))?;
    } else {
        eprintln!("{}", g.stats.line());
        eprintln!(
            "[request {}] {repins} pinned experts swapped for hotter ones",
            i + 1
        );
    }
    Ok(())
}

pub(super) fn stream_text(
    model: &Model,
    tok: &Tokenizer,
    prompt: &[u32],
    opts: &GenOptions,
) -> Result<Generation> {
    let mut stream = TextStream::new(tok);
    let mut stdout = std::io::stdout();
    let g = generate(model, prompt, opts, |id| {
        let piece = stream.push(id)?;
        let _ = stdout.write_all(piece.as_bytes());
        let _ = stdout.flush();
        Ok(())
    })
    .map_err(with_flags)?;
    println!();
    Ok(g)
}

/// One run's JSON object; `request` is `(index, pins swapped after it)`
/// for `--prompts`.
pub(super) fn print_json(
    g: &Generation,
    text: &str,
    model: &Model,
    request: Option<(usize, usize)>,
) -> Result<()> {
    let mut v = serde_json::json!({
        "prompt_ids": g.prompt_ids,
        "token_ids": g.token_ids,
        "text": text,
        "stats": g.stats,
        "config": config_json(model),
    });
    if let Some((i, repins)) = request {
        v["request"] = serde_json::json!(i);
        v["repins"] = serde_json::json!(repins);
    }
    println!("{}", serde_json::to_string(&v)?);
    Ok(())
}

/// How the model reads and schedules experts, for `--json`.
pub(super) fn config_json(model: &Model) -> serde_json::Value {
    let s = model.store.schedule;
    serde_json::json!({
        "io": read_mode_of(model).name(),
        "submit": if model.store.uses_reactor() { "reactor" } else { "sync" },
        "policy": model.store.policy().name(),
        "pipeline": s.pipeline,
        "prefetch": lookahead_name(s.lookahead),
        "slots_per_layer": model.plan.as_ref().map(|p| p.slots_per_layer),
    })
}
