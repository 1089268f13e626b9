//! Command-line interface (clap). `run --json` and `eval --json` print
//! exactly one JSON object on stdout; that shape is a contract.

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use moestream::convert::{self, ConvertOptions};
use moestream::generate::{evaluate, generate, GenOptions, Generation};
use moestream::model::mla::{DsaMode, MlaMode};
use moestream::model::{LoadOptions, Model};
use moestream::quality;
use moestream::quant::policy::{Class, Policy, Width};
use moestream::sampler::SamplingParams;
use moestream::store::policy::EvictPolicy;
use moestream::store::{Lookahead, Schedule, Variant};
use moestream::synth::{self, SynthSpec};
use moestream::tokenizer::{eos_ids, TextStream, Tokenizer};
use moestream_io::ReadMode;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

mod bench_io;
mod tune;

#[derive(Parser)]
#[command(
    name = "moestream",
    version,
    about = "Run MoE LLMs larger than RAM by streaming experts from disk"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate text from a prompt.
    Run(RunArgs),
    /// Teacher-force token ids and print per-position argmax, NLL and the last logits.
    Eval(EvalArgs),
    /// Generate from the embedded synthetic model (created on first use).
    Demo(DemoArgs),
    /// Write a synthetic random-weight MoE checkpoint.
    Synth(SynthArgs),
    /// Convert a Hugging Face checkpoint (FP8/BF16/F16/F32) into the
    /// quantized moestream container.
    Convert(ConvertArgs),
    /// Measurements of this machine.
    #[command(subcommand)]
    Bench(BenchCmd),
    /// Measure this disk and a few decodes per configuration, and save the
    /// fastest read mode, pipelining and prefetch as the model's profile
    /// (used by --io auto).
    Tune(tune::TuneArgs),
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Memory read bandwidth (the ceiling of every decode kernel).
    Mem(MemArgs),
    /// Decode speed of one configuration: one result line, optionally
    /// appended to a CSV file. The usage history is neither used nor saved.
    Decode(DecodeArgs),
    /// Raw disk sweep: cold random reads of the model files for every read
    /// mode x block size x queue depth (GB/s, latency, device bytes).
    Io(bench_io::IoBenchArgs),
}

#[derive(Args)]
struct DecodeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Tokens to decode (greedy, EOS ignored).
    #[arg(long, default_value_t = 32)]
    tokens: usize,
    /// Prompt text.
    #[arg(
        long,
        default_value = "The engine reads the expert from the disk while the cores compute"
    )]
    prompt: String,
    /// Drop the model files from the page cache first (fadvise DONTNEED).
    #[arg(long)]
    cold: bool,
    /// Generate once before measuring, in the same process, so the
    /// measured run finds what the first one cached (with every expert
    /// cached: the compute-only time of this decode).
    #[arg(long)]
    warmup: bool,
    /// Append the result as a CSV row (header written for a new file).
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
}

#[derive(Args)]
struct MemArgs {
    /// Buffer size in MiB (much larger than the last-level cache).
    #[arg(long, default_value_t = 1024)]
    mib: usize,
    /// Reader threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    #[arg(long, default_value_t = 7)]
    reps: usize,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct ConvertArgs {
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

#[derive(Args, Clone)]
struct ModelArgs {
    /// Model directory (config.json, *.safetensors, tokenizer.json).
    #[arg(long)]
    model: PathBuf,
    /// Routed experts kept in RAM per layer.
    #[arg(long, default_value_t = 16)]
    expert_cache: usize,
    /// How expert bytes are read: auto (what `moestream tune` measured
    /// fastest for this disk and model; without a profile, direct under
    /// --ram-gb and buffered otherwise),
    /// direct (O_DIRECT), buffered (page cache), drop (page cache, then
    /// dropped), mmap, pread (the same reads as buffered; kept as a name).
    #[arg(long = "io", visible_alias = "read-mode", default_value = "auto", value_parser = parse_io)]
    io: IoChoice,
    /// Worker threads for the kernels (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// MLA attention: absorb (decode-style), explicit (K/V reconstruction),
    /// auto (the cheaper for the tokens in flight).
    #[arg(long, value_enum, default_value_t = MlaArg::Auto)]
    mla: MlaArg,
    /// DSA indexer (GLM-5): on, off (dense attention), auto (select only
    /// when a query sees more than index_topk positions; same output as on).
    #[arg(long, value_enum, default_value_t = DsaArg::Auto)]
    dsa: DsaArg,
    /// How a layer's expert misses are submitted: reactor (all in flight at
    /// once through io_uring, falling back to sync where unavailable) or
    /// sync (one after another on a reader thread).
    #[arg(long, value_enum, default_value_t = Submit::Reactor)]
    submit: Submit,
    /// Pipelined MoE layers: compute cached experts while misses are read,
    /// then each miss as it lands (on), or wait for every read first (off);
    /// auto takes the tuned profile's choice (on without one).
    #[arg(long, value_enum, default_value_t = Toggle::Auto)]
    pipeline: Toggle,
    /// Router-lookahead prefetch: read the experts the next layers' routers
    /// pick from this layer's state, at lower priority than demand reads
    /// (on), or not (off); auto takes the tuned profile's choice.
    #[arg(long, value_enum, default_value_t = Toggle::Auto)]
    prefetch: Toggle,
    /// The state the lookahead applies the next router to: attn (this
    /// layer's post-attention residual: more lead time) or output (this
    /// layer's output: better guesses).
    #[arg(long, value_enum, default_value_t = PrefetchFrom::Attn)]
    prefetch_from: PrefetchFrom,
    /// MoE layers ahead the lookahead prefetches.
    #[arg(long, default_value_t = 1)]
    prefetch_depth: usize,
    /// Prefetch reads alive at once (default depth x top-k).
    #[arg(long)]
    prefetch_experts: Option<usize>,
    /// Score the lookahead's guess of the next layer's experts from both
    /// states (attn and output) even without prefetch: recall per layer in
    /// the stats, at the cost of two extra router products per layer.
    #[arg(long)]
    recall: bool,
    /// Quantize a float or FP8 checkpoint while loading: routed experts at
    /// BITS, the rest by the converter's default policy (identical bytes to
    /// `convert --expert-bits BITS`).
    #[arg(long, value_name = "BITS")]
    quantize_at_load: Option<u32>,
    /// Packed weights multiply in f32 (dequantized rows) instead of
    /// integer dot products against an int8-quantized activation.
    #[arg(long)]
    no_int_dot: bool,
    /// RAM budget in GB (10^9 bytes): expert cache slots per layer are
    /// planned so resident weights + caches + itemized slack fit (overrides
    /// --expert-cache); the plan is printed at start.
    #[arg(long, value_name = "GB")]
    ram_gb: Option<f64>,
    /// Which cached expert a full cache evicts: lfru (frequency first,
    /// recency breaks ties) or lru.
    #[arg(long, value_enum, default_value_t = PolicyArg::Lfru)]
    policy: PolicyArg,
    /// Context positions the --ram-gb plan reserves KV cache for.
    #[arg(long, default_value_t = 4096)]
    context: usize,
    /// Do not pin experts from the usage history (kept per model under the
    /// cache directory, see README), and do not update it.
    #[arg(long, env = "MOESTREAM_NO_HISTORY", action = clap::ArgAction::SetTrue,
          value_parser = clap::builder::BoolishValueParser::new())]
    no_history: bool,
}

/// `--mla`: the library's [`MlaMode`] as a flag value (clap stays in cli/).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum MlaArg {
    Absorb,
    Explicit,
    Auto,
}

impl From<MlaArg> for MlaMode {
    fn from(a: MlaArg) -> MlaMode {
        match a {
            MlaArg::Absorb => MlaMode::Absorb,
            MlaArg::Explicit => MlaMode::Explicit,
            MlaArg::Auto => MlaMode::Auto,
        }
    }
}

/// `--dsa`: the library's [`DsaMode`] as a flag value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum DsaArg {
    /// Always score and select (as transformers does).
    On,
    /// Dense attention; indexer keys are still cached.
    Off,
    /// Select only when a query sees more than index_topk positions (the
    /// same output as `on`, without scoring when everything is kept).
    Auto,
}

impl From<DsaArg> for DsaMode {
    fn from(a: DsaArg) -> DsaMode {
        match a {
            DsaArg::On => DsaMode::On,
            DsaArg::Off => DsaMode::Off,
            DsaArg::Auto => DsaMode::Auto,
        }
    }
}

/// `--policy`: the library's [`EvictPolicy`] as a flag value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum PolicyArg {
    /// Least recently used.
    Lru,
    /// Frequency first (decaying heat), recency breaks ties.
    Lfru,
}

impl From<PolicyArg> for EvictPolicy {
    fn from(a: PolicyArg) -> EvictPolicy {
        match a {
            PolicyArg::Lru => EvictPolicy::Lru,
            PolicyArg::Lfru => EvictPolicy::Lfru,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Submit {
    Reactor,
    Sync,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Toggle {
    Auto,
    On,
    Off,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum PrefetchFrom {
    Attn,
    Output,
}

/// `--io`: a read mode, or the tuned profile's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum IoChoice {
    Auto,
    Mode(ReadMode),
}

fn parse_io(s: &str) -> std::result::Result<IoChoice, String> {
    if s == "auto" {
        return Ok(IoChoice::Auto);
    }
    s.parse::<ReadMode>()
        .map(IoChoice::Mode)
        .map_err(|_| format!("`{s}`: expected auto, direct, buffered, drop, mmap or pread"))
}

/// What `auto` settles to without a tuned profile: O_DIRECT under a RAM
/// budget (the page cache gets no room there: direct led every mode in
/// results/io-modes.md and results/roofline.md), the page cache otherwise
/// (a free second-level cache when RAM is plentiful).
fn default_read_mode(m: &ModelArgs) -> ReadMode {
    if m.ram_gb.is_some() {
        ReadMode::Direct
    } else {
        ReadMode::Buffered
    }
}
const DEFAULT_PIPELINE: bool = true;
const DEFAULT_PREFETCH: Option<Lookahead> = None;

/// The read mode, pipelining and prefetch `m` asks for, with `auto`
/// resolved from the tuned profile (or the defaults without one), and a
/// note saying which profile was used.
fn schedule(m: &ModelArgs) -> (ReadMode, Schedule, Option<String>) {
    let any_auto =
        m.io == IoChoice::Auto || m.pipeline == Toggle::Auto || m.prefetch == Toggle::Auto;
    let mut note = None;
    let (mut mode, mut pipeline, mut prefetch) =
        (default_read_mode(m), DEFAULT_PIPELINE, DEFAULT_PREFETCH);
    if any_auto {
        match moestream::tune::load(&m.model) {
            Ok(Some((path, p))) => {
                let mut replaced = Vec::new();
                match p.read_mode.parse() {
                    Ok(m) => mode = m,
                    Err(_) => replaced.push(format!("read_mode `{}`", p.read_mode)),
                }
                pipeline = p.pipeline;
                prefetch = match (p.prefetch.as_str(), parse_lookahead(&p.prefetch)) {
                    ("off", _) => None,
                    (_, Some(l)) => Some(l),
                    (bad, None) => {
                        replaced.push(format!("prefetch `{bad}`"));
                        DEFAULT_PREFETCH
                    }
                };
                let replaced = if replaced.is_empty() {
                    String::new()
                } else {
                    format!("; not understood, defaults used: {}", replaced.join(", "))
                };
                note = Some(format!(
                    "tuned profile: --io {} --pipeline {} --prefetch {} ({}{replaced})",
                    mode,
                    if pipeline { "on" } else { "off" },
                    prefetch.map_or("off".to_string(), |l| format!(
                        "{}-{}",
                        l.from.name(),
                        l.depth
                    )),
                    path.display()
                ));
            }
            Ok(None) => {}
            Err(e) => note = Some(format!("warning: {e}; using the defaults")),
        }
    }
    if let IoChoice::Mode(m) = m.io {
        mode = m;
    }
    match m.pipeline {
        Toggle::On => pipeline = true,
        Toggle::Off => pipeline = false,
        Toggle::Auto => {}
    }
    let asked = Lookahead {
        from: match m.prefetch_from {
            PrefetchFrom::Attn => Variant::Attn,
            PrefetchFrom::Output => Variant::Output,
        },
        depth: m.prefetch_depth.max(1),
    };
    match m.prefetch {
        Toggle::On => prefetch = Some(asked),
        Toggle::Off => prefetch = None,
        Toggle::Auto => {}
    }
    let schedule = Schedule {
        pipeline,
        lookahead: prefetch,
        prefetch_experts_max: 0, // resolved at load from prefetch_experts
        recall: m.recall,
    };
    (mode, schedule, note)
}

/// A profile's `off` / `attn-1` / `output-2`.
fn parse_lookahead(s: &str) -> Option<Lookahead> {
    let (from, depth) = s.split_once('-')?;
    let from = match from {
        "attn" => Variant::Attn,
        "output" => Variant::Output,
        _ => return None,
    };
    Some(Lookahead {
        from,
        depth: depth.parse().ok().filter(|&d| d > 0)?,
    })
}

#[derive(Args)]
struct GenArgs {
    /// Maximum new tokens.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// 0 = off.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Continue past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt text (tokenized with tokenizer.json).
    #[arg(
        long,
        conflicts_with_all = ["prompt_ids", "prompts"],
        required_unless_present_any = ["prompt_ids", "prompts"]
    )]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids.
    #[arg(long, value_delimiter = ',', conflicts_with = "prompts")]
    prompt_ids: Option<Vec<u32>>,
    /// A file of prompts, one per non-empty line, served one after another
    /// by the same loaded model; between requests the pinned hot set is
    /// re-picked from the experts' heats (with --json: one object per line).
    #[arg(long, value_name = "FILE")]
    prompts: Option<PathBuf>,
    /// With --prompts: serve up to N requests at once, stepped together in
    /// one batch (each MoE layer reads the union of their experts once);
    /// each request's result is printed when it finishes. 1 serves them one
    /// after another.
    #[arg(long, default_value_t = 1, requires = "prompts",
          value_parser = clap::value_parser!(u16).range(1..=256))]
    batch: u16,
    #[command(flatten)]
    gen: GenArgs,
}

#[derive(Args)]
struct EvalArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Token ids to teacher-force, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    prompt_ids: Vec<u32>,
    /// Print JSON (the only output format).
    #[arg(long)]
    json: bool,
    /// Also teacher-force the MTP head: `mtp_argmax` (row j predicts id j+2)
    /// and `mtp_last_logits`.
    #[arg(long)]
    mtp: bool,
    /// Save every position's logits (a reference for --ref-logits).
    #[arg(long, value_name = "FILE")]
    save_logits: Option<PathBuf>,
    /// Compare with logits saved by --save-logits: adds `ref` (top-1
    /// agreement, mean and max KL divergence) to the output.
    #[arg(long, value_name = "FILE")]
    ref_logits: Option<PathBuf>,
}

#[derive(Args)]
struct DemoArgs {
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
struct SynthArgs {
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

/// Entry point: runs the command, prints errors as one line, exit code 1.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Run(a) => cmd_run(a),
        Cmd::Eval(a) => cmd_eval(a),
        Cmd::Demo(a) => cmd_demo(a),
        Cmd::Synth(a) => cmd_synth(a),
        Cmd::Convert(a) => cmd_convert(a),
        Cmd::Bench(BenchCmd::Mem(a)) => cmd_bench_mem(a),
        Cmd::Bench(BenchCmd::Decode(a)) => cmd_bench_decode(a),
        Cmd::Tune(a) => tune::cmd_tune(a),
        Cmd::Bench(BenchCmd::Io(a)) => bench_io::cmd_bench_io(a),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The most kernel or reader threads accepted: 8 per core (more only
/// costs start-up time and memory; 20,000 took minutes to start).
fn threads_max() -> usize {
    8 * std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Refuses a thread count of 0 or over [`threads_max`].
fn check_threads(t: usize) -> Result<usize> {
    let max = threads_max();
    if t == 0 || t > max {
        anyhow::bail!("--threads {t} is outside 1..={max} (8 per core)");
    }
    Ok(t)
}

fn load(m: &ModelArgs) -> Result<Model> {
    if let Some(t) = m.threads {
        check_threads(t)?;
        rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build_global()
            .ok();
    }
    moestream::kernels::quant::set_int_dot(!m.no_int_dot);
    let quantize_at_load = match m.quantize_at_load {
        None => None,
        Some(bits) => {
            let mut p = Policy::default();
            p.set(Class::Expert, width(bits, "--quantize-at-load")?)
                .map_err(anyhow::Error::msg)?;
            Some(p)
        }
    };
    let (read_mode, schedule, note) = schedule(m);
    let opts = LoadOptions {
        expert_cache: m.expert_cache,
        read_mode,
        schedule,
        mla: m.mla.into(),
        dsa: m.dsa.into(),
        io_reactor: m.submit == Submit::Reactor,
        quantize_at_load,
        ram_budget: match m.ram_gb {
            Some(gb) if !(gb > 0.0 && gb.is_finite()) => bail!("--ram-gb {gb}: must be positive"),
            Some(gb) => Some((gb * 1e9) as u64),
            None => None,
        },
        policy: m.policy.into(),
        pin_history: !m.no_history,
        context: m.context,
        prefetch_experts: m.prefetch_experts,
    };
    let model = Model::load(&m.model, &opts).map_err(with_flags)?;
    // Only once the model loaded: a profile that could not be read because
    // the model directory is bad would only precede the real error.
    if let Some(note) = note {
        eprintln!("{note}");
    }
    if let Some(plan) = &model.plan {
        eprintln!("{plan}");
    }
    eprintln!(
        "expert reads: {} mode, through {}",
        read_mode_of(&model),
        model.store.read_path()
    );
    if let Some(note) = &model.history {
        eprintln!("{note}");
    }
    Ok(model)
}

/// Names the flag behind a library error that names a setting.
fn with_flags(e: moestream::error::Error) -> anyhow::Error {
    use moestream::error::Error;
    match e {
        Error::Budget(_) => anyhow::anyhow!("--ram-gb: {e}"),
        Error::ContextBudget { .. } => anyhow::anyhow!("{e} (--context)"),
        e => e.into(),
    }
}

/// Merges this run's expert usage into the model's history under the cache
/// directory (a failure only costs a warning).
fn save_history(model: &Model, m: &ModelArgs) {
    if m.no_history {
        return;
    }
    let saved =
        moestream::state::history_path(&m.model).and_then(|path| model.store.save_history(&path));
    if let Err(e) = saved {
        eprintln!("warning: usage history not saved: {e}");
    }
}

fn width(bits: u32, flag: &str) -> Result<Width> {
    Width::from_bits(bits)
        .with_context(|| format!("{flag} {bits}: bits must be 2, 4, 8, 16 (BF16) or 32 (f32)"))
}

fn gen_options(g: &GenArgs, dir: &Path) -> Result<GenOptions> {
    Ok(GenOptions {
        max_tokens: g.max_tokens,
        sampling: SamplingParams {
            temperature: g.temperature,
            top_p: g.top_p,
            top_k: g.top_k,
            seed: g.seed,
        },
        ignore_eos: g.ignore_eos,
        eos_ids: eos_ids(dir)?,
    })
}

fn cmd_run(a: RunArgs) -> Result<()> {
    let model = load(&a.model)?;
    let dir = &a.model.model;
    let tok = Tokenizer::load(dir);
    if let Some(path) = &a.prompts {
        let tok = tok.map_err(|e| anyhow::anyhow!("{e}"))?;
        return serve_prompts(&model, &tok, path, &a);
    }
    let prompt = match (&a.prompt, &a.prompt_ids) {
        (Some(text), _) => tok
            .as_ref()
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .encode(text)?,
        (None, Some(ids)) => ids.clone(),
        (None, None) => bail!("give --prompt or --prompt-ids"),
    };
    let opts = gen_options(&a.gen, dir)?;
    if a.gen.json {
        let g = generate(&model, &prompt, &opts, |_| Ok(())).map_err(with_flags)?;
        save_history(&model, &a.model);
        let text = match &tok {
            Ok(t) => t.decode(&g.token_ids)?,
            Err(e) => {
                eprintln!("warning: {e}; `text` is empty (token_ids are exact)");
                String::new()
            }
        };
        print_json(&g, &text, &model, None)?;
        return Ok(());
    }
    let tok = tok.map_err(|e| anyhow::anyhow!("{e}"))?;
    let g = stream_text(&model, &tok, &prompt, &opts)?;
    save_history(&model, &a.model);
    eprintln!("{}", g.stats.line());
    Ok(())
}

/// `run --prompts FILE`: each line a request, the pinned set re-picked
/// between requests; the usage history is saved once at the end. A request
/// that fails is reported with its line number (on stderr, and with
/// `--json` as an object with `request`, `line` and `error`), and the rest
/// are still served; the run then fails, naming every failed line.
fn serve_prompts(model: &Model, tok: &Tokenizer, path: &Path, a: &RunArgs) -> Result<()> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading prompts from {}", path.display()))?;
    let lines: Vec<(usize, &str)> = (1..)
        .zip(text.lines())
        .filter(|(_, l)| !l.trim().is_empty())
        .collect();
    anyhow::ensure!(!lines.is_empty(), "{}: no prompts in it", path.display());
    let opts = gen_options(&a.gen, &a.model.model)?;
    if a.batch > 1 {
        return serve_batched(model, tok, path, &lines, &opts, a);
    }
    let mut failed = Vec::new();
    for (i, &(line_no, line)) in lines.iter().enumerate() {
        if let Err(e) = serve_one(model, tok, line, &opts, a.gen.json, i) {
            eprintln!("error: {}, line {line_no}: {e:#}", path.display());
            if a.gen.json {
                let row =
                    serde_json::json!({"request": i, "line": line_no, "error": format!("{e:#}")});
                println!("{row}");
            }
            failed.push(line_no);
        }
    }
    save_history(model, &a.model);
    fail_on_lines(path, lines.len(), &failed)
}

/// The error of a `--prompts` run some of whose lines failed.
fn fail_on_lines(path: &Path, total: usize, failed: &[usize]) -> Result<()> {
    if failed.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = failed.iter().map(|n| n.to_string()).collect();
    bail!(
        "{} of {total} requests in {} failed (lines {})",
        failed.len(),
        path.display(),
        list.join(", ")
    )
}

/// `run --prompts FILE --batch N`: every request submitted to a session
/// pool of N slots (the rest queue), stepped in batches of up to N; each
/// request's result is printed as it finishes (`--json`: `request`, `line`,
/// `prompt_ids`, `token_ids`, `text`), then one stats line for the whole
/// run. A request the model refuses is reported like the sequential path.
fn serve_batched(
    model: &Model,
    tok: &Tokenizer,
    path: &Path,
    lines: &[(usize, &str)],
    opts: &GenOptions,
    a: &RunArgs,
) -> Result<()> {
    use moestream::engine::{PoolEvent, SessionPool};
    let encoded: Vec<Result<Vec<u32>>> = lines
        .iter()
        .map(|(_, line)| tok.encode(line).map_err(anyhow::Error::from))
        .collect();
    // Under a RAM plan, as many at once as the reserved KV positions hold.
    let longest = encoded.iter().flatten().map(Vec::len).max().unwrap_or(1);
    let n = SessionPool::slots_within_budget(model, longest + opts.max_tokens, a.batch.into());
    let config = moestream_scheduler::SchedulerConfig {
        kv_slots: n,
        queue_max: lines.len(),
        queue_wait_ms_max: u64::MAX,
        batch_max: n,
    };
    let mut pool = SessionPool::new(model, config);
    let mut failed = Vec::new();
    for (i, (&(line_no, _), prompt)) in lines.iter().zip(encoded).enumerate() {
        let submitted =
            prompt.and_then(|p| pool.submit(i as u64, &p, opts).map_err(anyhow::Error::from));
        if let Err(e) = submitted {
            report_failure(path, i, line_no, &e, a.gen.json);
            failed.push(line_no);
        }
    }
    let start = std::time::Instant::now();
    let mut prof = moestream::profile::Profile::default();
    let mut tokens = 0usize;
    while !pool.is_idle() {
        for ev in pool.step(&mut prof)? {
            match ev {
                PoolEvent::Token(..) => tokens += 1,
                PoolEvent::Finished(id) => {
                    let s = pool.take_finished(id).expect("a finished session");
                    let text = tok.decode(s.tokens())?;
                    let (i, line_no) = (id as usize, lines[id as usize].0);
                    if a.gen.json {
                        let row = serde_json::json!({"request": i, "line": line_no,
                            "prompt_ids": s.prompt(), "token_ids": s.tokens(), "text": text});
                        println!("{row}");
                    } else {
                        println!("[request {}, line {line_no}] {text}", i + 1);
                    }
                }
                PoolEvent::Expired(_) => unreachable!("the queue never expires here"),
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "[stats] {} requests, {tokens} tokens in {secs:.2} s ({:.2} tok/s) in batches of up to {n}",
        lines.len() - failed.len(),
        tokens as f64 / secs.max(1e-9)
    );
    save_history(model, &a.model);
    fail_on_lines(path, lines.len(), &failed)
}

/// Reports a failed `--prompts` request on stderr (and with `--json` as an
/// object with `request`, `line` and `error`).
fn report_failure(path: &Path, i: usize, line_no: usize, e: &anyhow::Error, json: bool) {
    eprintln!("error: {}, line {line_no}: {e:#}", path.display());
    if json {
        let row = serde_json::json!({"request": i, "line": line_no, "error": format!("{e:#}")});
        println!("{row}");
    }
}

/// One request of `--prompts`: generate, re-pin, report.
fn serve_one(
    model: &Model,
    tok: &Tokenizer,
    line: &str,
    opts: &GenOptions,
    json: bool,
    i: usize,
) -> Result<()> {
    let prompt = tok.encode(line)?;
    let g = if json {
        generate(model, &prompt, opts, |_| Ok(())).map_err(with_flags)?
    } else {
        stream_text(model, tok, &prompt, opts)?
    };
    // Between requests: move pins to experts that ran hotter.
    let repins = model.store.repin()?;
    if json {
        let text = tok.decode(&g.token_ids)?;
        print_json(&g, &text, model, Some((i, repins)))?;
    } else {
        eprintln!("{}", g.stats.line());
        eprintln!(
            "[request {}] {repins} pinned experts swapped for hotter ones",
            i + 1
        );
    }
    Ok(())
}

fn stream_text(
    model: &Model,
    tok: &Tokenizer,
    prompt: &[u32],
    opts: &GenOptions,
) -> Result<Generation> {
    let mut stream = TextStream::new(tok);
    let mut stdout = std::io::stdout();
    let g = generate(model, prompt, opts, |id| {
        let piece = stream.push(id)?;
        let _ = stdout.write_all(piece.as_bytes());
        let _ = stdout.flush();
        Ok(())
    })
    .map_err(with_flags)?;
    println!();
    Ok(g)
}

/// One run's JSON object; `request` is `(index, pins swapped after it)`
/// for `--prompts`.
fn print_json(
    g: &Generation,
    text: &str,
    model: &Model,
    request: Option<(usize, usize)>,
) -> Result<()> {
    let mut v = serde_json::json!({
        "prompt_ids": g.prompt_ids,
        "token_ids": g.token_ids,
        "text": text,
        "stats": g.stats,
        "config": config_json(model),
    });
    if let Some((i, repins)) = request {
        v["request"] = serde_json::json!(i);
        v["repins"] = serde_json::json!(repins);
    }
    println!("{}", serde_json::to_string(&v)?);
    Ok(())
}

fn cmd_eval(a: EvalArgs) -> Result<()> {
    let _ = a.json;
    let model = load(&a.model)?;
    let e = evaluate(&model, &a.prompt_ids)?;
    let mut v = serde_json::to_value(&e)?;
    if let Some(path) = &a.save_logits {
        quality::save_logits(path, &a.prompt_ids, &e.logits, model.cfg.vocab_size)?;
    }
    if let Some(path) = &a.ref_logits {
        let reference = quality::load_logits(path)?;
        let agreement = quality::compare(&reference, &a.prompt_ids, &e.logits)
            .with_context(|| format!("comparing with {}", path.display()))?;
        v["ref"] = serde_json::to_value(agreement)?;
    }
    if a.mtp {
        let (mtp_argmax, mtp_last_logits) = model.mtp_one_step(&a.prompt_ids)?;
        v["mtp_argmax"] = serde_json::json!(mtp_argmax);
        v["mtp_last_logits"] = serde_json::json!(mtp_last_logits);
    }
    println!("{}", serde_json::to_string(&v)?);
    Ok(())
}

fn cmd_demo(a: DemoArgs) -> Result<()> {
    let dir = a
        .dir
        .clone()
        .unwrap_or_else(|| synth::cache_dir().join("synthetic-qwen3moe-v2"));
    let spec = SynthSpec::default();
    if !dir.join("config.json").exists() {
        eprintln!(
            "moestream demo: creating the synthetic model in {} (first use)...",
            dir.display()
        );
    }
    synth::ensure(&dir, &spec).with_context(|| format!("creating {}", dir.display()))?;
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
        },
        ignore_eos: true,
        eos_ids: eos_ids(&dir)?,
    };
    print!("{}", a.prompt);
    let g = stream_text(&model, &tok, &prompt, &opts)?;
    eprintln!("{}", g.stats.line());
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum RoutingArg {
    Zipf,
    Uniform,
}

fn cmd_synth(a: SynthArgs) -> Result<()> {
    if let Some(name) = &a.geometry {
        let spec = synth::geometry::GeometrySpec {
            name: name.clone(),
            layers: a.layers,
            experts: a.experts,
            vocab: a.vocab,
            routing: match a.routing {
                RoutingArg::Zipf => synth::geometry::Routing::Zipf(a.zipf_s),
                RoutingArg::Uniform => synth::geometry::Routing::Uniform,
            },
            seed: a.seed,
        };
        synth::geometry::write(&a.out, &spec, true)?;
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
    synth::ensure(&a.out, &spec)?;
    eprintln!("wrote a synthetic model to {}", a.out.display());
    Ok(())
}

fn cmd_convert(a: ConvertArgs) -> Result<()> {
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
    let report = convert::convert(&opts).map_err(|e| match e {
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

fn cmd_bench_mem(a: MemArgs) -> Result<()> {
    let threads = match a.threads {
        Some(t) => check_threads(t)?,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    if a.reps == 0 {
        anyhow::bail!("--reps must be at least 1");
    }
    let ram_mib = moestream::profile::mem_total_bytes().unwrap_or(u64::MAX) >> 20;
    if a.mib == 0 || a.mib as u64 > ram_mib / 2 {
        anyhow::bail!(
            "--mib {} is outside 1..={} (half of this machine's RAM)",
            a.mib,
            ram_mib / 2
        );
    }
    let r = moestream::bench::mem::read_bandwidth(a.mib << 20, threads, a.reps);
    if a.json {
        println!(
            "{}",
            serde_json::json!({"bytes": a.mib << 20, "threads": threads, "reps": a.reps,
                "median_gbs": r.median_gbs, "best_gbs": r.best_gbs})
        );
    } else {
        println!(
            "memory read bandwidth: median {:.1} GB/s, best {:.1} GB/s ({} MiB, {threads} threads, {} reps)",
            r.median_gbs, r.best_gbs, a.mib, a.reps
        );
    }
    Ok(())
}

/// Evicts every file of `dir` from the page cache (synced first: dirty
/// pages cannot be dropped).
fn drop_page_cache(dir: &Path) -> Result<()> {
    let mut files = Vec::new();
    for ent in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let p = ent?.path();
        if p.is_file() {
            files.push(p);
        }
    }
    moestream_io::drop_page_cache(&files)?;
    Ok(())
}

/// How the model reads and schedules experts, for `--json`.
fn config_json(model: &Model) -> serde_json::Value {
    let s = model.store.schedule;
    serde_json::json!({
        "io": read_mode_of(model).name(),
        "submit": if model.store.uses_reactor() { "reactor" } else { "sync" },
        "pipeline": s.pipeline,
        "prefetch": lookahead_name(s.lookahead),
        "slots_per_layer": model.plan.as_ref().map(|p| p.slots_per_layer),
    })
}

/// `off`, or the lookahead as `from-depth`.
fn lookahead_name(l: Option<Lookahead>) -> String {
    match l {
        Some(l) => format!("{}-{}", l.from.name(), l.depth),
        None => "off".into(),
    }
}

/// The read mode the model's shards actually use (after any fallback).
fn read_mode_of(model: &Model) -> ReadMode {
    model
        .store
        .index()
        .shards
        .first()
        .map_or(ReadMode::Buffered, |s| s.reader.effective_mode())
}

fn cmd_bench_decode(mut a: DecodeArgs) -> Result<()> {
    a.model.no_history = true;
    if a.cold {
        drop_page_cache(&a.model.model)?;
    }
    let t0 = std::time::Instant::now();
    let model = load(&a.model)?;
    let load_s = t0.elapsed().as_secs_f64();
    let tok = Tokenizer::load(&a.model.model)?;
    let prompt = tok.encode(&a.prompt)?;
    let opts = GenOptions {
        max_tokens: a.tokens,
        sampling: SamplingParams::default(),
        ignore_eos: true,
        eos_ids: vec![],
    };
    if a.warmup {
        // Warm means every buffer the cache will hold is in place: a gated
        // cache grows only as fast as they are faulted in.
        moestream_io::shared_pool().wait_warmed(std::time::Duration::from_secs(600));
        generate(&model, &prompt, &opts, |_| Ok(())).map_err(with_flags)?;
    }
    let g = generate(&model, &prompt, &opts, |_| Ok(())).map_err(with_flags)?;
    let s = &g.stats;
    let n = s.tokens.max(1) as f64;
    let decode_s = s.seconds - s.prefill_seconds;
    let steps = s.decode_steps.max(1) as f64;
    let row: Vec<(&str, String)> = vec![
        ("model", a.model.model.display().to_string()),
        ("read_mode", read_mode_of(&model).to_string()),
        ("submit", format!("{:?}", a.model.submit).to_lowercase()),
        ("pipeline", model.store.schedule.pipeline.to_string()),
        ("prefetch", lookahead_name(model.store.schedule.lookahead)),
        (
            "ram_gb",
            a.model.ram_gb.map_or("-".into(), |g| g.to_string()),
        ),
        (
            "slots",
            model
                .plan
                .as_ref()
                .map_or(a.model.expert_cache, |p| p.slots_per_layer)
                .to_string(),
        ),
        ("cold", a.cold.to_string()),
        ("tokens", s.tokens.to_string()),
        ("load_s", format!("{load_s:.2}")),
        ("prefill_s", format!("{:.3}", s.prefill_seconds)),
        (
            "decode_tok_s",
            format!(
                "{:.3}",
                (s.tokens.saturating_sub(1)) as f64 / decode_s.max(1e-9)
            ),
        ),
        ("tok_s", format!("{:.3}", s.tok_per_s)),
        ("hit_rate", format!("{:.3}", s.expert_hit_rate)),
        (
            "read_mb_per_tok",
            format!("{:.2}", s.expert_bytes_read as f64 / n / 1e6),
        ),
        (
            "device_mb_per_tok",
            format!("{:.2}", s.device_bytes_read as f64 / n / 1e6),
        ),
        (
            "lat_mean_ms",
            format!("{:.2}", s.read_latency_mean_us / 1e3),
        ),
        (
            "lat_p99_ms",
            format!("{:.2}", s.read_latency_p99_us as f64 / 1e3),
        ),
        (
            "peak_rss_mib",
            format!("{:.1}", s.peak_rss_bytes as f64 / (1 << 20) as f64),
        ),
        ("warmup", a.warmup.to_string()),
        ("decode_s_per_tok", format!("{:.4}", s.decode_s / steps)),
        (
            "decode_mb_per_tok",
            format!("{:.2}", s.decode_bytes_read as f64 / steps / 1e6),
        ),
        (
            "decode_wait_s_per_tok",
            format!("{:.4}", s.decode_disk_wait_s / steps),
        ),
        (
            "decode_disk_gb_s",
            format!(
                "{:.3}",
                s.decode_bytes_read as f64 / s.decode_disk_busy_s.max(1e-9) / 1e9
            ),
        ),
        ("overlap", format!("{:.3}", s.overlap)),
        ("prefetch_used", s.prefetch_used.to_string()),
        ("prefetch_issued", s.prefetch_issued.to_string()),
        (
            "prefetch_wasted_mb",
            format!("{:.1}", s.prefetch_wasted_bytes as f64 / 1e6),
        ),
        (
            "recall_attn",
            s.recall_attn.map_or("-".into(), |r| format!("{r:.3}")),
        ),
        (
            "recall_output",
            s.recall_output.map_or("-".into(), |r| format!("{r:.3}")),
        ),
    ];
    println!(
        "{}",
        row.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    if let Some(path) = &a.csv {
        let mut text = std::fs::read_to_string(path).unwrap_or_default();
        if text.is_empty() {
            text = row.iter().map(|r| r.0).collect::<Vec<_>>().join(",") + "\n";
        }
        text += &(row
            .iter()
            .map(|r| r.1.as_str())
            .collect::<Vec<_>>()
            .join(",")
            + "\n");
        moestream::convert::writer::write_atomic(path, text.as_bytes())?;
    }
    Ok(())
}
