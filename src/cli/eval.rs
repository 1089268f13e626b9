//! `moestream eval`: teacher-forced scores of a sequence, or the
//! perplexity of a text; `moestream score`: multiple-choice accuracy.

use super::*;
use moestream::formats::tokenizer::tokenize_bytes;

#[derive(Args)]
pub(super) struct EvalArgs {
    #[command(flatten)]
    pub(super) model: ModelArgs,
    /// Token ids to teacher-force, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        required_unless_present = "text",
        conflicts_with = "text"
    )]
    prompt_ids: Vec<u32>,
    /// A text file: print its perplexity (sliding windows; with --json the
    /// key `perplexity`, and `nll_mean`, `tokens`, `scored`, `window`,
    /// `stride`, `windows`).
    #[arg(long, value_name = "FILE")]
    text: Option<PathBuf>,
    /// Positions per window of --text (capped at the model's context).
    #[arg(long, default_value_t = 512)]
    window: usize,
    /// Positions between window starts of --text (default: half a window).
    #[arg(long)]
    stride: Option<usize>,
    /// Print JSON (the only output format).
    #[arg(long)]
    json: bool,
    /// Also teacher-force the MTP head: `mtp_argmax` (row j predicts id j+2)
    /// and `mtp_last_logits`.
    #[arg(long)]
    mtp: bool,
    /// Save every position's logits (a reference for --ref-logits).
    #[arg(long, value_name = "FILE")]
    save_logits: Option<PathBuf>,
    /// Compare with logits saved by --save-logits: adds `ref` (top-1
    /// agreement, mean and max KL divergence) to the output.
    #[arg(long, value_name = "FILE")]
    ref_logits: Option<PathBuf>,
    /// Positions per forward of --prompt-ids (1: one token at a time, as
    /// decoding reads experts; default: the prefill chunk). Waits for the
    /// expert cache's buffers to be faulted in first, and adds `store`
    /// (expert hits, misses, bytes read, cache-aware routing's moves) to
    /// the output.
    #[arg(long, value_name = "N")]
    chunk: Option<usize>,
}

pub(super) fn cmd_eval(a: EvalArgs) -> Result<()> {
    if let Some(out) = &a.save_logits {
        let inputs: Vec<&Path> = a
            .ref_logits
            .iter()
            .chain(&a.text)
            .map(PathBuf::as_path)
            .collect();
        moestream::fs::check_not_input(&[out], &inputs).context("--save-logits")?;
    }
    // --text is tokenized whole and --ref-logits read whole while the
    // model runs: both are planned (the `inputs` item).
    let text = a.text.as_deref().map(file_len).unwrap_or(0);
    let logits = a.ref_logits.as_deref().map(file_len).unwrap_or(0);
    let inputs = tokenize_bytes(text)
        .saturating_add(text)
        .saturating_add(logits);
    let model = super::load_with_inputs(&a.model, inputs)?;
    if let Some(path) = &a.text {
        return eval_text(&model, path, &a);
    }
    if a.chunk.is_some() {
        // Measured hits and misses: every cache buffer faulted in first, so
        // the caches' growth does not depend on the warming thread's pace.
        moestream_io::shared_pool().wait_warmed(std::time::Duration::from_secs(600));
    }
    let before = model.store.counters();
    let e = match a.chunk {
        Some(chunk) => {
            moestream::engine::generate::evaluate_in_chunks(&model, &a.prompt_ids, chunk)?
        }
        None => evaluate(&model, &a.prompt_ids)?,
    };
    let mut v = serde_json::to_value(&e)?;
    if a.chunk.is_some() {
        let c = model.store.counters();
        v["store"] = serde_json::json!({
            "expert_hits": c.hits + c.pinned_hits - before.hits - before.pinned_hits,
            "expert_misses": c.misses - before.misses,
            "bytes_read": c.bytes_read - before.bytes_read,
            "leaned_moved": c.leaned_moved - before.leaned_moved,
            "leaned_chosen": c.leaned_chosen - before.leaned_chosen,
        });
    }
    if let Some(path) = &a.save_logits {
        quality::save_logits(path, &a.prompt_ids, &e.logits, model.cfg.vocab_size)?;
    }
    if let Some(path) = &a.ref_logits {
        let reference = quality::load_logits(path)?;
        let agreement = quality::compare(&reference, &a.prompt_ids, &e.logits)
            .with_context(|| format!("comparing with {}", path.display()))?;
        v["ref"] = serde_json::to_value(agreement)?;
    }
    if a.mtp {
        let (mtp_argmax, mtp_last_logits) = model.mtp_one_step(&a.prompt_ids)?;
        v["mtp_argmax"] = serde_json::json!(mtp_argmax);
        v["mtp_last_logits"] = serde_json::json!(mtp_last_logits);
    }
    println!("{}", serde_json::to_string(&v)?);
    Ok(())
}

/// `eval --text FILE`: the file's perplexity.
fn eval_text(model: &Model, path: &Path, a: &EvalArgs) -> Result<()> {
    let text = moestream::fs::read_to_string(path, moestream::fs::read::PROMPTS)
        .with_context(|| format!("--text {}", path.display()))?;
    let tok = Tokenizer::load(&a.model.model)?;
    let ids = tok.encode(&text)?;
    let window = a.window.min(model.cfg.rope.max_position_embeddings);
    let stride = a.stride.unwrap_or((window / 2).max(1));
    let p = moestream::engine::generate::perplexity(model, &ids, window, stride)?;
    if a.json {
        println!("{}", serde_json::to_string(&p)?);
    } else {
        println!(
            "perplexity {:.4} over {} tokens ({} scored; window {}, stride {}, {} windows)",
            p.perplexity, p.tokens, p.scored, p.window, p.stride, p.windows
        );
    }
    Ok(())
}

#[derive(Args)]
pub(super) struct ScoreArgs {
    #[command(flatten)]
    pub(super) model: ModelArgs,
    /// Tasks, one JSON object a line:
    /// {"context": "...", "choices": [" a", " b"], "label": 0}.
    #[arg(long, value_name = "FILE")]
    tasks: PathBuf,
    /// Print one JSON object (`acc`, `acc_norm`, `tasks`, and per task the
    /// choices' log-likelihoods and predictions).
    #[arg(long)]
    json: bool,
}

/// One multiple-choice task.
#[derive(serde::Deserialize)]
struct Task {
    context: String,
    choices: Vec<String>,
    label: usize,
}

/// How one task was answered.
#[derive(serde::Serialize)]
struct Scored {
    loglik: Vec<f64>,
    pred: usize,
    pred_norm: usize,
    label: usize,
}

/// `moestream score`: each choice scored by the log-likelihood of its
/// tokens after the context; `acc` takes the highest, `acc_norm` the
/// highest per character of the choice (as lm-evaluation-harness defines
/// them). Tokens of a choice are those of context + choice past the
/// context's own tokens.
pub(super) fn cmd_score(a: ScoreArgs) -> Result<()> {
    let text = moestream::fs::read_to_string(&a.tasks, moestream::fs::read::PROMPTS)
        .with_context(|| format!("reading {}", a.tasks.display()))?;
    let model = super::load_with_inputs(&a.model, lines_input_bytes(&text))?;
    let tok = Tokenizer::load(&a.model.model)?;
    let mut scored = Vec::new();
    for (n, line) in (1..).zip(text.lines()) {
        if line.trim().is_empty() {
            continue;
        }
        let where_ = || format!("{}, line {n}", a.tasks.display());
        let task: Task = serde_json::from_str(line).with_context(where_)?;
        if task.label >= task.choices.len() {
            bail!(
                "{}: label {} with {} choices",
                where_(),
                task.label,
                task.choices.len()
            );
        }
        scored.push(score_task(&model, &tok, &task).with_context(where_)?);
    }
    anyhow::ensure!(!scored.is_empty(), "{}: no tasks in it", a.tasks.display());
    let rate = |f: fn(&Scored) -> bool| {
        scored.iter().filter(|s| f(s)).count() as f64 / scored.len() as f64
    };
    let acc = rate(|s| s.pred == s.label);
    let acc_norm = rate(|s| s.pred_norm == s.label);
    if a.json {
        let v = serde_json::json!({"acc": acc, "acc_norm": acc_norm, "tasks": scored.len(), "per_task": scored});
        println!("{v}");
    } else {
        println!(
            "acc {acc:.4}  acc_norm {acc_norm:.4}  over {} tasks",
            scored.len()
        );
    }
    Ok(())
}

fn score_task(model: &Model, tok: &Tokenizer, task: &Task) -> Result<Scored> {
    let context = tok.encode(&task.context)?;
    let mut loglik = Vec::with_capacity(task.choices.len());
    for choice in &task.choices {
        let whole = tok.encode(&format!("{}{choice}", task.context))?;
        let cont = whole.get(context.len()..).unwrap_or(&[]);
        loglik.push(moestream::engine::generate::continuation_loglik(
            model, &context, cont,
        )?);
    }
    let best = |key: &dyn Fn(usize) -> f64| {
        (0..loglik.len())
            .max_by(|&i, &j| key(i).total_cmp(&key(j)).then(j.cmp(&i)))
            .expect("at least one choice")
    };
    let pred = best(&|i| loglik[i]);
    let pred_norm = best(&|i| loglik[i] / task.choices[i].len().max(1) as f64);
    Ok(Scored {
        loglik,
        pred,
        pred_norm,
        label: task.label,
    })
}

/// A file's length (0 when it cannot be read: reading it later names the
/// error).
fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// What a file of lines, each tokenized on its own, holds while it is
/// served: the text and the longest line's tokenizing.
pub(super) fn lines_input_bytes(text: &str) -> u64 {
    let longest = text.lines().map(str::len).max().unwrap_or(0);
    (text.len() as u64).saturating_add(tokenize_bytes(longest as u64))
}
