//! `moestream convert`: a checkpoint into the quantized container.

use super::*;
use moestream::convert::ConvertOptions;

#[derive(Args)]
pub(super) struct ConvertArgs {
    /// Hugging Face checkpoint directory.
    #[arg(long)]
    input: PathBuf,
    /// Output directory (created).
    #[arg(long)]
    output: PathBuf,
    /// Format of routed experts: bits per row (2, 4, 8, 16 = BF16, 32 =
    /// f32) or a grouped format by name: q4g32, q4g64, q4g128 (int4, f16
    /// scale per group), q4g32a, q4g64a, q4g128a (int4 with an f16 min),
    /// q3g32, q3g64, q3g128, q2g32, q2g64, q2g128 (int3, int2 with scale
    /// and min). See docs/FORMAT.md.
    #[arg(long, visible_alias = "quant", default_value = "4")]
    expert_bits: String,
    /// Format of attention, dense MLP and shared experts (as --expert-bits).
    #[arg(long, default_value = "8")]
    dense_bits: String,
    /// Format of the token embeddings and lm_head (as --expert-bits).
    #[arg(long, default_value = "8")]
    io_bits: String,
    /// Format of the multi-token-prediction layers (as --expert-bits).
    #[arg(long, default_value = "8")]
    mtp_bits: String,
    /// Per-class override CLASS=FORMAT (expert, shared, attention, dense,
    /// embed, lm_head, mtp, other; formats as --expert-bits); repeatable;
    /// applied last.
    #[arg(long = "bits")]
    overrides: Vec<String>,
    /// Continue an interrupted conversion into --output.
    #[arg(long)]
    resume: bool,
    /// Replace an --output that already holds a model or a conversion: the
    /// new container is built beside it and swapped in once complete.
    #[arg(long)]
    force: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

pub(super) fn cmd_convert(a: ConvertArgs) -> Result<()> {
    let mut policy = Policy::default();
    let classes: [(&[Class], &str, &str); 4] = [
        (&[Class::Expert], &a.expert_bits, "--expert-bits"),
        (
            &[Class::Attention, Class::Dense, Class::Shared],
            &a.dense_bits,
            "--dense-bits",
        ),
        (&[Class::Embed, Class::LmHead], &a.io_bits, "--io-bits"),
        (&[Class::Mtp], &a.mtp_bits, "--mtp-bits"),
    ];
    for (cs, bits, flag) in classes {
        let w = width(bits, flag)?;
        for c in cs {
            policy.set(*c, w).map_err(anyhow::Error::msg)?;
        }
    }
    for o in &a.overrides {
        policy.apply_override(o).map_err(anyhow::Error::msg)?;
    }
    eprintln!("moestream convert: policy {}", policy.summary());
    let opts = ConvertOptions {
        input: a.input.clone(),
        output: a.output.clone(),
        policy,
        resume: a.resume,
        force: a.force,
        progress: !a.quiet,
    };
    let report = moestream::convert::convert(&opts).map_err(|e| match e {
        moestream::error::Error::OutputOccupied { conversion, .. } => {
            let flag = if conversion {
                "--resume continues it, "
            } else {
                ""
            };
            anyhow::anyhow!("{e} ({flag}--force replaces it)")
        }
        e => e.into(),
    })?;
    if !report.skipped.is_empty() {
        eprintln!(
            "resumed: {} finished file(s) kept, {} written",
            report.skipped.len(),
            report.written.len()
        );
    }
    println!("{}", report.census.table().trim_end());
    eprintln!("wrote {} (verified)", a.output.display());
    Ok(())
}

pub(super) fn width(spelling: &str, flag: &str) -> Result<Width> {
    Width::parse(spelling)
        .with_context(|| format!("{flag} {spelling}: expected {}", Width::SPELLINGS))
}
