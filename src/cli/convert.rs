//! `moestream convert`: a checkpoint into the quantized container.

use super::*;
use moestream::convert::ConvertOptions;

#[derive(Args)]
pub(super) struct ConvertArgs {
    /// Hugging Face checkpoint directory, or a GGUF file (the first of a
    /// split set): a GGUF converts as stored, its blocks kept bit for bit
    /// (no bit flag applies to it).
    #[arg(long)]
    input: PathBuf,
    /// Output directory (created).
    #[arg(long)]
    output: PathBuf,
    /// Bits of routed experts (2, 4, 8, 16 = BF16, 32 = f32) [default: 4].
    #[arg(long, conflicts_with = "quant")]
    expert_bits: Option<u32>,
    /// Routed experts as llama.cpp blocks: q8_0, q4_0, q4_k, q5_k or q6_k
    /// (K types fall back to q4_0 / q8_0 on rows that are not whole
    /// 256-value blocks; docs/FORMAT.md).
    #[arg(long)]
    quant: Option<String>,
    /// Bits of attention, dense MLP and shared experts [default: 8].
    #[arg(long)]
    dense_bits: Option<u32>,
    /// Bits of the token embeddings and lm_head [default: 8].
    #[arg(long)]
    io_bits: Option<u32>,
    /// Bits of the multi-token-prediction layers [default: 8].
    #[arg(long)]
    mtp_bits: Option<u32>,
    /// Per-class override CLASS=WIDTH (classes expert, shared, attention,
    /// dense, embed, lm_head, mtp, other; widths 2, 4, 8, 16, 32 or a
    /// block type such as q6_k); repeatable; applied last.
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
    let policy = policy(&a)?;
    if moestream::formats::gguf::is_gguf(&a.input) {
        eprintln!("moestream convert: a GGUF, every tensor kept as stored");
    } else {
        eprintln!("moestream convert: policy {}", policy.summary());
    }
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

/// The bit policy the flags ask for; a GGUF input takes none of them.
fn policy(a: &ConvertArgs) -> Result<Policy> {
    let mut policy = Policy::default();
    let classes: [(&[Class], Option<u32>, &str); 4] = [
        (&[Class::Expert], a.expert_bits, "--expert-bits"),
        (
            &[Class::Attention, Class::Dense, Class::Shared],
            a.dense_bits,
            "--dense-bits",
        ),
        (&[Class::Embed, Class::LmHead], a.io_bits, "--io-bits"),
        (&[Class::Mtp], a.mtp_bits, "--mtp-bits"),
    ];
    let gguf = moestream::formats::gguf::is_gguf(&a.input);
    let given = classes.iter().find(|c| c.1.is_some()).map(|c| c.2);
    let given = given
        .or(a.quant.as_ref().map(|_| "--quant"))
        .or((!a.overrides.is_empty()).then_some("--bits"));
    if let (true, Some(flag)) = (gguf, given) {
        bail!(
            "{flag}: {} is a GGUF, converted as stored (its blocks kept bit for bit); no width flag applies",
            a.input.display()
        );
    }
    for (cs, bits, flag) in classes {
        let Some(bits) = bits else { continue };
        let w = width(bits, flag)?;
        for c in cs {
            policy.set(*c, w).map_err(anyhow::Error::msg)?;
        }
    }
    if let Some(q) = &a.quant {
        let ty = moestream::kernels::ggml::BlockType::parse(q)
            .with_context(|| format!("--quant {q}: one of q8_0, q4_0, q4_k, q5_k, q6_k"))?;
        policy
            .set(Class::Expert, Width::Blocks(ty))
            .map_err(anyhow::Error::msg)?;
    }
    for o in &a.overrides {
        policy.apply_override(o).map_err(anyhow::Error::msg)?;
    }
    Ok(policy)
}

pub(super) fn width(bits: u32, flag: &str) -> Result<Width> {
    Width::from_bits(bits)
        .with_context(|| format!("{flag} {bits}: bits must be 2, 4, 8, 16 (BF16) or 32 (f32)"))
}
