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
    /// Bits of routed experts (2, 4, 8, 16 = BF16, 32 = f32).
    #[arg(long, default_value_t = 4)]
    expert_bits: u32,
    /// Bits of attention, dense MLP and shared experts.
    #[arg(long, default_value_t = 8)]
    dense_bits: u32,
    /// Bits of the token embeddings and lm_head.
    #[arg(long, default_value_t = 8)]
    io_bits: u32,
    /// Bits of the multi-token-prediction layers.
    #[arg(long, default_value_t = 8)]
    mtp_bits: u32,
    /// Per-class override CLASS=BITS (expert, shared, attention, dense,
    /// embed, lm_head, mtp, other); repeatable; applied last.
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
    let classes: [(&[Class], u32, &str); 4] = [
        (&[Class::Expert], a.expert_bits, "--expert-bits"),
        (
            &[Class::Attention, Class::Dense, Class::Shared],
            a.dense_bits,
            "--dense-bits",
        ),
        (&[Class::Embed, Class::LmHead], a.io_bits, "--io-bits"),
        (&[Class::Mtp], a.mtp_bits, "--mtp-bits"),
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

pub(super) fn width(bits: u32, flag: &str) -> Result<Width> {
    Width::from_bits(bits)
        .with_context(|| format!("{flag} {bits}: bits must be 2, 4, 8, 16 (BF16) or 32 (f32)"))
}
