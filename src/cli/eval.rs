//! `moestream eval`: teacher-forced scores of a sequence.

use super::*;

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
}

pub(super) fn cmd_eval(a: EvalArgs) -> Result<()> {
    let model = load(&a.model)?;
    if let Some(path) = &a.text {
        return eval_text(&model, path, &a);
    }
    let e = evaluate(&model, &a.prompt_ids)?;
    let mut v = serde_json::to_value(&e)?;
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
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let tok = Tokenizer::load(&a.model.model)?;
    let ids = tok.encode(&text)?;
    let window = a.window.min(model.cfg.rope.max_position_embeddings);
    let stride = a.stride.unwrap_or((window / 2).max(1));
    let p = moestream::generate::perplexity(model, &ids, window, stride)?;
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
