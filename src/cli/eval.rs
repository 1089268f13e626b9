//! `moestream eval`: teacher-forced scores of a sequence.

use super::*;

#[derive(Args)]
pub(super) struct EvalArgs {
    #[command(flatten)]
    pub(super) model: ModelArgs,
    /// Token ids to teacher-force, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    prompt_ids: Vec<u32>,
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
    let _ = a.json;
    let model = load(&a.model)?;
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
