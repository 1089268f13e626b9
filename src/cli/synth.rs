//! `moestream synth`: synthetic checkpoints.

use super::*;
use moestream::lab::synth::presets::{self, Preset};
use moestream::lab::synth::realistic::{Clamp, Knobs};
use moestream::lab::synth::SynthSpec;

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
    /// How a geometry routes: realistic (the default for qwen3-30b-a3b,
    /// glm5 and glm5-mini: popularity skew, next-token reuse and lookahead
    /// predictability as --top10-share, --reuse and --lookahead-recall
    /// ask), zipf (popularity only, exponent --zipf-s; the default for
    /// deepseek-v3, whose group-limited routing realistic routing does not
    /// model), uniform, or a preset calibrated to published models:
    /// weak-locality (Mixtral-8x7B / Qwen1.5-MoE: top-2 of 8, reuse ~1.5x
    /// uniform) or strong-locality (OLMoE / Qwen3-30B-A3B: top-8 of 64,
    /// reuse ~3x uniform), which set the knobs and the expert count and
    /// top-k unless given (results/routing.md).
    #[arg(long, value_enum)]
    routing: Option<RoutingArg>,
    /// Zipf exponent of --routing zipf.
    #[arg(long, default_value_t = 1.0)]
    zipf_s: f64,
    /// --routing realistic: share of selections the top 10% of each layer's
    /// experts take (real models: 0.2-0.3; default 0.22). Each of these
    /// three knobs, left to its default, moves to the nearest value a small
    /// geometry reaches (said on stderr); a value given out of reach is an
    /// error.
    #[arg(long)]
    top10_share: Option<f64>,
    /// --routing realistic: share of a token's experts the next token
    /// chooses again in the same layer (chance is about top-k/experts; the
    /// default 0.30 puts LRU's hit rate with twice top-k slots at 40-60%).
    #[arg(long)]
    reuse: Option<f64>,
    /// --routing realistic: share of a layer's experts the router
    /// lookahead (the layer's router on the previous layer's state) guesses
    /// (real models: ~0.7; default 0.70).
    #[arg(long)]
    lookahead_recall: Option<f64>,
    /// Vocabulary rows of a geometry (default: the real model's).
    #[arg(long)]
    vocab: Option<usize>,
    /// Hidden size (default: 512, or the geometry's).
    #[arg(long)]
    hidden: Option<usize>,
    /// Decoder layers (default: 8, or the geometry's).
    #[arg(long)]
    layers: Option<usize>,
    /// Routed experts per layer (default: 32, or the geometry's).
    #[arg(long)]
    experts: Option<usize>,
    /// Experts per token (default: 4, or the geometry's).
    #[arg(long)]
    top_k: Option<usize>,
    /// Routed experts' intermediate size (default: 256, or the geometry's).
    #[arg(long)]
    moe_inter: Option<usize>,
    /// Leading dense layers of an MLA geometry (default: the real model's
    /// 3; fewer keep a shrunk model's dense share of compute near the real
    /// one's).
    #[arg(long)]
    dense_layers: Option<usize>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum RoutingArg {
    Realistic,
    Zipf,
    Uniform,
    WeakLocality,
    StrongLocality,
}

impl RoutingArg {
    /// The calibrated preset this names, if any.
    fn preset(self) -> Option<Preset> {
        match self {
            RoutingArg::WeakLocality => Some(presets::WEAK_LOCALITY),
            RoutingArg::StrongLocality => Some(presets::STRONG_LOCALITY),
            _ => None,
        }
    }
}

pub(super) fn cmd_synth(a: SynthArgs) -> Result<()> {
    if let Some(name) = &a.geometry {
        return synth_geometry(name, &a);
    }
    let spec = SynthSpec {
        hidden: a.hidden.unwrap_or(512),
        layers: a.layers.unwrap_or(8),
        experts: a.experts.unwrap_or(32),
        top_k: a.top_k.unwrap_or(4),
        moe_inter: a.moe_inter.unwrap_or(256),
        seed: a.seed,
        ..SynthSpec::default()
    };
    if a.out.join("config.json").exists() {
        bail!("{} already holds a model", a.out.display());
    }
    moestream::lab::synth::ensure(&a.out, &spec)?;
    eprintln!("wrote a synthetic model to {}", a.out.display());
    Ok(())
}

/// `synth --geometry NAME`: a quantized container in a real model's shapes.
fn synth_geometry(name: &str, a: &SynthArgs) -> Result<()> {
    use moestream::lab::synth::geometry::{self, GeometrySpec, Routing};
    let preset = a.routing.and_then(RoutingArg::preset);
    let d = preset.map_or(Knobs::DEFAULT, |p| p.knobs);
    let realistic = Routing::Realistic(Knobs {
        top10_share: a.top10_share.unwrap_or(d.top10_share),
        reuse: a.reuse.unwrap_or(d.reuse),
        recall: a.lookahead_recall.unwrap_or(d.recall),
    });
    let clamp = Clamp {
        top10_share: a.top10_share.is_none(),
        reuse: a.reuse.is_none(),
        recall: a.lookahead_recall.is_none(),
    };
    let routing = match a.routing {
        Some(RoutingArg::Realistic | RoutingArg::WeakLocality | RoutingArg::StrongLocality) => {
            realistic
        }
        // DeepSeek-V3 routes within expert groups, which realistic routing
        // does not model: it keeps zipf.
        None if name != "deepseek-v3" => realistic,
        Some(RoutingArg::Zipf) | None => Routing::Zipf(a.zipf_s),
        Some(RoutingArg::Uniform) => Routing::Uniform,
    };
    let spec = GeometrySpec {
        name: name.to_owned(),
        layers: a.layers,
        experts: a.experts.or(preset.map(|p| p.experts)),
        vocab: a.vocab,
        hidden: a.hidden,
        moe_inter: a.moe_inter,
        top_k: a.top_k.or(preset.map(|p| p.top_k)),
        dense_layers: a.dense_layers,
        routing,
        seed: a.seed,
    };
    let flag = |n: &str| match n {
        n if n.contains("top10 share") => "--top10-share",
        n if n.contains("recall") => "--lookahead-recall",
        _ => "--reuse",
    };
    geometry::write_clamped(&a.out, &spec, true, clamp, &mut |n| {
        eprintln!("note: {} ({}: give a value in reach to choose)", n, flag(n))
    })?;
    eprintln!(
        "wrote a synthetic {name} container to {} ({} routing)",
        a.out.display(),
        routing.name()
    );
    Ok(())
}
