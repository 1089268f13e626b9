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
    /// The widths of every tensor class, by name (`moestream plan --recipes
    /// --model DIR` shows each one's bytes per token): default (routed
    /// gate/up q4g64, routed down q5_k, or q8_0 on partial blocks; the rest
    /// int8), row4 (routed experts per-row int4, the rest int8), bf16,
    /// int8, down8 (routed gate/up int4, down int8),
    /// g32 (routed experts q4g32), k4m (Q4_K_M-like blocks), k3m
    /// (Q3_K_M-like), k2 (Q2_K-like), tiny (routed gate/up int2). The flags
    /// below change it.
    #[arg(long, default_value = "default", value_name = "NAME")]
    recipe: String,
    /// Format of routed experts, over the recipe: bits per row (2, 4, 8,
    /// 16 = BF16, 32 = f32); a grouped format: q4g32, q4g64, q4g128 (int4,
    /// f16 scale per group), q4g32a, q4g64a, q4g128a (int4 with an f16
    /// min), q3g32, q3g64, q3g128, q2g32, q2g64, q2g128 (int3, int2 with
    /// scale and min); or llama.cpp blocks: q8_0, q4_0, q2_k, q3_k, q4_k,
    /// q5_k, q6_k (K types fall back to q4_0 / q8_0 on rows that are not
    /// whole 256-value blocks). See docs/FORMAT.md.
    #[arg(long, visible_alias = "quant", value_name = "FORMAT")]
    expert_bits: Option<String>,
    /// Format of attention, dense MLP and shared experts (as --expert-bits).
    #[arg(long, value_name = "FORMAT")]
    dense_bits: Option<String>,
    /// Format of the token embeddings and lm_head (as --expert-bits).
    #[arg(long, value_name = "FORMAT")]
    io_bits: Option<String>,
    /// Format of the multi-token-prediction layers (as --expert-bits).
    #[arg(long, value_name = "FORMAT")]
    mtp_bits: Option<String>,
    /// Per-class override CLASS=FORMAT (expert, expert_gate_up,
    /// expert_down, shared, attention, dense, embed, lm_head, mtp, other;
    /// formats as --expert-bits); repeatable;
    /// applied last.
    #[arg(long = "bits")]
    overrides: Vec<String>,
    /// Weigh each integer matrix's rounding error by its input's importance
    /// from `moestream calibrate --out FILE` (inputs it lacks, and routed
    /// experts it saw fewer than --importance-min-rows times, are
    /// quantized unweighted).
    #[arg(long, value_name = "FILE")]
    importance: Option<PathBuf>,
    /// The fewest calibration rows an input must have seen to be weighted.
    #[arg(long, default_value_t = 32, requires = "importance")]
    importance_min_rows: u64,
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
    let importance = match &a.importance {
        Some(path) => Some(moestream::convert::Weighting {
            file: moestream::formats::quant::importance::Importance::read(path)?,
            min_rows: a.importance_min_rows,
        }),
        None => None,
    };
    let opts = ConvertOptions {
        importance,
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
    if let Some((weighted, total)) = report.weighted {
        eprintln!("importance: {weighted} of {total} integer matrices weighted");
    }
    eprintln!("wrote {} (verified)", a.output.display());
    Ok(())
}

/// The bit policy the flags ask for (the recipe, then the flags); a GGUF
/// input takes none of them.
fn policy(a: &ConvertArgs) -> Result<Policy> {
    let classes: [(&[Class], &Option<String>, &str); 4] = [
        (&Class::ROUTED, &a.expert_bits, "--expert-bits"),
        (
            &[Class::Attention, Class::Dense, Class::Shared],
            &a.dense_bits,
            "--dense-bits",
        ),
        (&[Class::Embed, Class::LmHead], &a.io_bits, "--io-bits"),
        (&[Class::Mtp], &a.mtp_bits, "--mtp-bits"),
    ];
    let given = classes.iter().find(|c| c.1.is_some()).map(|c| c.2);
    let given = given
        .or((!a.overrides.is_empty()).then_some("--bits"))
        .or((a.recipe != "default").then_some("--recipe"))
        .or(a.importance.as_ref().map(|_| "--importance"));
    if let (true, Some(flag)) = (moestream::formats::gguf::is_gguf(&a.input), given) {
        bail!(
            "{flag}: {} is a GGUF, converted as stored (its blocks kept bit for bit); no width flag applies",
            a.input.display()
        );
    }
    let mut policy = moestream::formats::quant::recipe::Recipe::find(&a.recipe)
        .map_err(|e| anyhow::anyhow!("--recipe {e}"))?
        .policy();
    for (cs, spelling, flag) in classes {
        let Some(spelling) = spelling else { continue };
        let w = width(spelling, flag)?;
        for c in cs {
            policy.set(*c, w).map_err(anyhow::Error::msg)?;
        }
    }
    for o in &a.overrides {
        policy.apply_override(o).map_err(anyhow::Error::msg)?;
    }
    Ok(policy)
}

pub(super) fn width(spelling: &str, flag: &str) -> Result<Width> {
    Width::parse(spelling)
        .with_context(|| format!("{flag} {spelling}: expected {}", Width::SPELLINGS))
}
