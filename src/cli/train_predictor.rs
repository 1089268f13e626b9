//! `moestream train-predictor`: the learned lookahead predictor trained on
//! a routing trace, with its recall@k on held-out segments beside the
//! router lookahead's ([`moestream::lab::replay::train`]).

use super::*;
use moestream::lab::replay::train::{self, Recall, TrainOptions};

#[derive(Args)]
pub(super) struct TrainPredictorArgs {
    /// The trace (Parquet, as `--trace` writes it), of one model.
    #[arg(long, value_name = "FILE")]
    trace: PathBuf,
    /// Where to write the predictor (JSON).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Passes over the training tokens.
    #[arg(long, default_value_t = 4)]
    epochs: usize,
    /// Gradient step size.
    #[arg(long, default_value_t = 0.05)]
    learning_rate: f32,
    /// Share of each run's decode tokens held out to measure recall (the
    /// last ones), in (0, 1).
    #[arg(long, default_value_t = 0.25)]
    holdout: f64,
    /// Print the recall table as JSON.
    #[arg(long)]
    json: bool,
}

pub(super) fn cmd_train_predictor(a: TrainPredictorArgs) -> Result<()> {
    let holdout_ok = a.holdout > 0.0 && a.holdout < 1.0;
    let rate_ok = a.learning_rate.is_finite() && a.learning_rate > 0.0;
    if !holdout_ok || !rate_ok {
        bail!("--holdout must be in (0, 1) and --learning-rate positive");
    }
    moestream::fs::check_not_input(&[&a.out], &[&a.trace]).context("--out")?;
    super::limits::count("--epochs", a.epochs, 1..=super::limits::REPEATS_MAX)?;
    let runs = moestream::formats::trace::read::read(&a.trace, None)?;
    let o = TrainOptions {
        epochs: a.epochs,
        learning_rate: a.learning_rate,
        holdout: a.holdout,
    };
    let (predictor, per_layer, total) =
        train::train(&runs, &o).map_err(|why| anyhow::anyhow!("{}: {why}", a.trace.display()))?;
    if predictor.layers.is_empty() {
        bail!(
            "{}: no decode tokens pair two MoE layers (trace a run that decodes on a model with two or more MoE layers)",
            a.trace.display()
        );
    }
    predictor.save(&a.out)?;
    if a.json {
        println!(
            "{}",
            serde_json::json!({ "layers": per_layer, "total": total })
        );
    } else {
        print_table(&per_layer, &total);
        println!("predictor written to {}", a.out.display());
    }
    Ok(())
}

fn print_table(per_layer: &[Recall], total: &Recall) {
    let pct = |x: Option<f64>| x.map_or("-".into(), |x| format!("{:.1}%", 100.0 * x));
    println!("held-out recall@k (of the experts each layer chose, the share each guesser named)");
    println!("layer  train  held-out  learned  learned-no-lookahead  lookahead-attn  lookahead-output  previous-token");
    for r in per_layer.iter().chain(std::iter::once(total)) {
        let layer = r.layer.map_or("all".into(), |l| l.to_string());
        println!(
            "{layer:>5}  {:>5}  {:>8}  {:>7}  {:>20}  {:>14}  {:>16}  {:>14}",
            r.train_tokens,
            r.heldout_tokens,
            pct(r.learned),
            pct(r.learned_without_lookahead),
            pct(r.lookahead_attn),
            pct(r.lookahead_output),
            pct(r.previous_token)
        );
    }
}
