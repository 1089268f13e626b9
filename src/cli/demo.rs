//! `moestream demo`: the README's main job. By default it generates from
//! a small *trained* Qwen3-MoE (tests/fixtures/trained/qwen3_moe, trained
//! by scripts/train_moe.py on Python's documentation), embedded in the
//! binary and written to the cache directory on first use, with a cache
//! smaller than its experts, so experts still stream from disk.
//! `--synthetic` runs the random-weight synthetic model instead.

use super::run::stream_text;
use super::*;
use moestream::lab::synth::SynthSpec;

#[derive(Args)]
pub(super) struct DemoArgs {
    /// Prompt text.
    #[arg(long)]
    prompt: Option<String>,
    #[arg(long, default_value_t = 48)]
    max_tokens: usize,
    /// Routed experts kept in RAM per layer (both models have 32 per layer).
    #[arg(long, default_value_t = 8)]
    expert_cache: usize,
    /// The synthetic random-weight model (meaningless text) instead of the
    /// trained one.
    #[arg(long)]
    synthetic: bool,
    /// Where the model lives (default: the moestream cache dir).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// The trained model's files, as committed.
macro_rules! trained_file {
    ($name:literal) => {
        (
            $name,
            include_bytes!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/trained/qwen3_moe/",
                $name
            ))
            .as_slice(),
        )
    };
}

const TRAINED_FILES: [(&str, &[u8]); 11] = [
    trained_file!("README.md"),
    trained_file!("chat_template.jinja"),
    trained_file!("config.json"),
    trained_file!("generation_config.json"),
    trained_file!("model-00001-of-00004.safetensors"),
    trained_file!("model-00002-of-00004.safetensors"),
    trained_file!("model-00003-of-00004.safetensors"),
    trained_file!("model-00004-of-00004.safetensors"),
    trained_file!("model.safetensors.index.json"),
    trained_file!("tokenizer.json"),
    trained_file!("tokenizer_config.json"),
];

/// The cache directory's name for the embedded trained model (bump the
/// version when its files change).
const TRAINED_DIR: &str = "trained-qwen3moe-v1";

/// Writes the embedded trained model into `dir`.
fn write_trained(dir: &Path) -> moestream::error::Result<()> {
    for (name, bytes) in TRAINED_FILES {
        moestream::fs::write(&dir.join(name), bytes)?;
    }
    Ok(())
}

pub(super) fn cmd_demo(a: DemoArgs) -> Result<()> {
    let cache = moestream::fs::state::cache_dir();
    let (dir, prompt, temperature) = if a.synthetic {
        let dir = a
            .dir
            .clone()
            .unwrap_or_else(|| cache.join("synthetic-qwen3moe-v2"));
        let spec = SynthSpec::default();
        announce_first_use(&dir, "synthetic");
        moestream::lab::synth::ensure(&dir, &spec)
            .with_context(|| format!("creating {}", dir.display()))?;
        eprintln!(
            "moestream demo: a synthetic {}-layer, {}-expert MoE (top-{}) with RANDOM weights — the text below is meaningless; \
             the point is the expert streaming: {} of {} experts per layer fit in the cache, the rest are read from disk.",
            spec.layers, spec.experts, spec.top_k, a.expert_cache, spec.experts
        );
        (dir, "The engine reads the expert from the disk", 0.8)
    } else {
        let dir = a.dir.clone().unwrap_or_else(|| cache.join(TRAINED_DIR));
        announce_first_use(&dir, "trained");
        moestream::lab::synth::ensure_with(&dir, write_trained)
            .with_context(|| format!("writing {}", dir.display()))?;
        eprintln!(
            "moestream demo: a small Qwen3-MoE (4 layers, 32 experts, top-4) TRAINED on Python's documentation \
             (held-out perplexity 68; model card: {}); {} of 32 experts per layer fit in the cache, the rest are read from disk.",
            dir.join("README.md").display(),
            a.expert_cache
        );
        (dir, "The following example shows how to", 0.7)
    };
    let model = Model::load(
        &dir,
        &LoadOptions {
            expert_cache: a.expert_cache,
            ..LoadOptions::default()
        },
    )?;
    let tok = Tokenizer::load(&dir)?;
    let prompt = a.prompt.as_deref().unwrap_or(prompt);
    let ids = tok.encode(prompt)?;
    let opts = GenOptions {
        max_tokens: a.max_tokens,
        sampling: SamplingParams {
            temperature,
            top_p: 0.95,
            top_k: 0,
            seed: 7,
            ..SamplingParams::default()
        },
        ignore_eos: true,
        eos_ids: eos_ids(&dir)?,
        ..GenOptions::default()
    };
    print!("{prompt}");
    let g = stream_text(&model, &tok, &ids, &opts)?;
    eprintln!("{}", g.stats.line());
    Ok(())
}

fn announce_first_use(dir: &Path, what: &str) {
    if !dir.join("config.json").exists() {
        eprintln!(
            "moestream demo: writing the {what} model to {} (first use)...",
            dir.display()
        );
    }
}
