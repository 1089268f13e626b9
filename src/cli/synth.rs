//! `moestream demo` and `moestream synth`: the embedded default model and
//! synthetic checkpoints.

use super::run::stream_text;
use super::*;
use moestream::synth::SynthSpec;

#[derive(Args)]
pub(super) struct DemoArgs {
    /// Prompt text.
    #[arg(long, default_value = "The engine reads the expert from the disk")]
    prompt: String,
    #[arg(long, default_value_t = 48)]
    max_tokens: usize,
    /// Routed experts kept in RAM per layer (the model has 32 per layer).
    #[arg(long, default_value_t = 8)]
    expert_cache: usize,
    /// Where the synthetic model lives (default: the moestream cache dir).
    #[arg(long)]
    dir: Option<PathBuf>,
}

#[derive(Args)]
pub(super) struct SynthArgs {
    /// Output directory.
    #[arg(long)]
    out: PathBuf,
    /// Write a quantized container in the shapes of a real model
    /// (qwen3-30b-a3b); --layers/--experts shrink it. Without it: the small
    /// BF16 checkpoint `demo` uses.
    #[arg(long)]
    geometry: Option<String>,
    /// Expert popularity of a geometry: zipf (skewed like a real model) or
    /// uniform.
    #[arg(long, value_enum, default_value_t = RoutingArg::Zipf)]
    routing: RoutingArg,
    /// Zipf exponent of --routing zipf.
    #[arg(long, default_value_t = 1.0)]
    zipf_s: f64,
    /// Vocabulary rows of a geometry (default: the real model's).
    #[arg(long)]
    vocab: Option<usize>,
    #[arg(long, default_value_t = 512)]
    hidden: usize,
    /// Decoder layers (default: 8, or the geometry's).
    #[arg(long)]
    layers: Option<usize>,
    /// Routed experts per layer (default: 32, or the geometry's).
    #[arg(long)]
    experts: Option<usize>,
    #[arg(long, default_value_t = 4)]
    top_k: usize,
    #[arg(long, default_value_t = 256)]
    moe_inter: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum RoutingArg {
    Zipf,
    Uniform,
}

pub(super) fn cmd_demo(a: DemoArgs) -> Result<()> {
    let dir = a
        .dir
        .clone()
        .unwrap_or_else(|| moestream::synth::cache_dir().join("synthetic-qwen3moe-v2"));
    let spec = SynthSpec::default();
    if !dir.join("config.json").exists() {
        eprintln!(
            "moestream demo: creating the synthetic model in {} (first use)...",
            dir.display()
        );
    }
    moestream::synth::ensure(&dir, &spec).with_context(|| format!("creating {}", dir.display()))?;
    eprintln!(
        "moestream demo: a synthetic {}-layer, {}-expert MoE (top-{}) with RANDOM weights — the text below is meaningless; \
         the point is the expert streaming: {} of {} experts per layer fit in the cache, the rest are read from disk.",
        spec.layers, spec.experts, spec.top_k, a.expert_cache, spec.experts
    );
    let model = Model::load(
        &dir,
        &LoadOptions {
            expert_cache: a.expert_cache,
            ..LoadOptions::default()
        },
    )?;
    let tok = Tokenizer::load(&dir)?;
    let prompt = tok.encode(&a.prompt)?;
    let opts = GenOptions {
        max_tokens: a.max_tokens,
        sampling: SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            top_k: 0,
            seed: 7,
            ..SamplingParams::default()
        },
        ignore_eos: true,
        eos_ids: eos_ids(&dir)?,
        speculation: Default::default(),
        constraint: None,
    };
    print!("{}", a.prompt);
    let g = stream_text(&model, &tok, &prompt, &opts)?;
    eprintln!("{}", g.stats.line());
    Ok(())
}

pub(super) fn cmd_synth(a: SynthArgs) -> Result<()> {
    if let Some(name) = &a.geometry {
        let spec = moestream::synth::geometry::GeometrySpec {
            name: name.clone(),
            layers: a.layers,
            experts: a.experts,
            vocab: a.vocab,
            routing: match a.routing {
                RoutingArg::Zipf => moestream::synth::geometry::Routing::Zipf(a.zipf_s),
                RoutingArg::Uniform => moestream::synth::geometry::Routing::Uniform,
            },
            seed: a.seed,
        };
        moestream::synth::geometry::write(&a.out, &spec, true)?;
        eprintln!("wrote a synthetic {name} container to {}", a.out.display());
        return Ok(());
    }
    let spec = SynthSpec {
        hidden: a.hidden,
        layers: a.layers.unwrap_or(8),
        experts: a.experts.unwrap_or(32),
        top_k: a.top_k,
        moe_inter: a.moe_inter,
        seed: a.seed,
        ..SynthSpec::default()
    };
    if a.out.join("config.json").exists() {
        bail!("{} already holds a model", a.out.display());
    }
    moestream::synth::ensure(&a.out, &spec)?;
    eprintln!("wrote a synthetic model to {}", a.out.display());
    Ok(())
}
