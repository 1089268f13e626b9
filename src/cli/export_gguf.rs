//! `moestream export-gguf`: a Qwen3-MoE model written as a GGUF file
//! ([`moestream::convert::gguf_export`]).

use super::*;
use moestream::kernels::ggml::BlockType;

#[derive(Args)]
pub(super) struct ExportArgs {
    /// Model directory (hub checkpoint or moestream container).
    #[arg(long)]
    model: PathBuf,
    /// The GGUF file to write (replaced only once complete).
    #[arg(long)]
    out: PathBuf,
    /// Block type of every matrix: q4_0, q5_0, q5_1, iq4_nl, q2_k, q3_k,
    /// q4_k, q5_k, q6_k, iq4_xs, q8_0 or f32 (IQ4_NL and IQ4_XS from a plain
    /// scale, not llama.cpp's search).
    /// Norms and routers stay F32.
    #[arg(long, default_value = "q4_k")]
    r#type: String,
}

pub(super) fn cmd_export(a: ExportArgs) -> Result<()> {
    moestream::fs::check_not_input(&[&a.out], &[&a.model]).context("--out")?;
    let ty = match a.r#type.to_ascii_uppercase().as_str() {
        "F32" => None,
        name => Some(
            BlockType::ALL
                .into_iter()
                .find(|t| t.name() == name)
                .with_context(|| {
                    format!(
                        "--type {}: use q4_0, q5_0, q5_1, iq4_nl, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs, q8_0 or f32",
                        a.r#type
                    )
                })?,
        ),
    };
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "export [{bar:40}] {bytes}/{total_bytes} eta {eta}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    let progress = |done: u64, total: u64| {
        bar.set_length(total);
        bar.set_position(done);
    };
    let n = moestream::convert::gguf_export::export(&a.model, &a.out, ty, &progress)?;
    bar.finish_and_clear();
    let bytes = std::fs::metadata(&a.out).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "wrote {} ({n} tensors, {:.2} GB)",
        a.out.display(),
        bytes as f64 / 1e9
    );
    Ok(())
}
