//! `moestream calibrate`: per-column importance of every linear layer's
//! input over a text, for `convert --importance`.

use super::*;
use moestream::formats::config::ModelConfig;
use moestream::formats::tokenizer::tokenize_bytes;

#[derive(Args)]
pub(super) struct CalibrateArgs {
    #[command(flatten)]
    pub(super) model: ModelArgs,
    /// The calibration text (plain text, tokenized whole).
    #[arg(long, value_name = "FILE")]
    text: PathBuf,
    /// Where to write the importance file (safetensors; read by `convert
    /// --importance`).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Positions per window: each window is one teacher-forced forward from
    /// an empty cache (capped at the model's context).
    #[arg(long, default_value_t = 512)]
    window: usize,
    /// Calibrate on at most this many tokens of the text (the first ones).
    #[arg(long, value_name = "N")]
    max_tokens: Option<usize>,
}

pub(super) fn cmd_calibrate(a: CalibrateArgs) -> Result<()> {
    moestream::fs::check_not_input(&[&a.out], &[&a.text, &a.model.model]).context("--out")?;
    let cfg = ModelConfig::load(&a.model.model)?;
    let window = a.window.min(cfg.rope.max_position_embeddings);
    // The text tokenized whole, and one window's logits (lm_head's input is
    // calibrated from every row).
    let text_len = std::fs::metadata(&a.text).map_or(0, |m| m.len());
    let logits = (window as u64).saturating_mul(cfg.vocab_size as u64 * 4);
    let inputs = tokenize_bytes(text_len)
        .saturating_add(text_len)
        .saturating_add(logits)
        .saturating_add(recorded_bytes(&cfg));
    let model = super::load_with_inputs(&a.model, inputs)?;
    let text = moestream::fs::read_to_string(&a.text, moestream::fs::read::PROMPTS)
        .with_context(|| format!("--text {}", a.text.display()))?;
    let mut ids = Tokenizer::load(&a.model.model)?.encode(&text)?;
    if let Some(n) = a.max_tokens {
        ids.truncate(n);
    }
    let started = std::time::Instant::now();
    let imp = moestream::engine::calibrate::calibrate(&model, &ids, window, &a.out)?;
    imp.write(&a.out)?;
    eprintln!(
        "calibrated {} inputs over {} tokens in {:.1} s; wrote {}",
        imp.inputs.len(),
        ids.len(),
        started.elapsed().as_secs_f64(),
        a.out.display()
    );
    Ok(())
}

/// At most what the taps record and the file holds: per layer, a gate/up
/// and a down input for every routed expert and for the shared and dense
/// MLPs, and attention's three inputs, at 16 bytes a column (the f64 sums
/// while recording, then the f32 means and their serialized copy).
fn recorded_bytes(cfg: &ModelConfig) -> u64 {
    let (h, heads) = (cfg.hidden_size as u64, cfg.num_heads as u64);
    let inter = cfg.intermediate_size.max(cfg.moe_intermediate_size) as u64;
    let head = match &cfg.mla {
        Some(m) => m.v_head_dim.max(m.q_lora_rank.unwrap_or(0)),
        None => cfg.head_dim,
    } as u64;
    let mlps = cfg.num_experts as u64 + 2;
    let per_layer = mlps
        .saturating_mul(h + inter)
        .saturating_add(h + 2 * heads.saturating_mul(head).max(h));
    per_layer
        .saturating_mul(cfg.num_layers as u64 + 1)
        .saturating_mul(16)
}
