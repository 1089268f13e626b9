//! Command-line interface (clap). `run --json` and `eval --json` print
//! exactly one JSON object on stdout; that shape is a contract.

use anyhow::{bail, Context, Result};
use clap::{Args, FromArgMatches, Parser, Subcommand};
use moestream::engine::gen_config::{GenerationDefaults, Overrides};
use moestream::engine::generate::{evaluate, generate, GenOptions, Generation};
use moestream::engine::runtime::{self, lookahead_name, Choice, Requested};
use moestream::engine::sampler::SamplingParams;
use moestream::formats::quant::policy::{Class, Policy, Width};
use moestream::formats::tokenizer::{eos_ids, TextStream, Tokenizer};
use moestream::lab::quality;
use moestream::model::mla::{DsaMode, MlaMode};
use moestream::model::{LoadOptions, Model};
use moestream::store::policy::EvictPolicy;
use moestream::store::{Lookahead, Variant};
use moestream_io::ReadMode;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

mod bench;
mod bench_io;
mod bench_kernels;
mod bench_serve;
mod bench_verify;
mod calibrate;
mod chat;
mod config;
mod convert;
mod demo;
mod doctor;
mod eval;
mod export_gguf;
mod limits;
mod logs;
mod plan;
mod progress;
mod replay;
mod run;
mod serve;
mod sweep;
mod synth;
mod train_predictor;
mod tune;

use bench::{cmd_bench_decode, cmd_bench_mem, DecodeArgs, MemArgs};
use convert::{cmd_convert, width, ConvertArgs};
use demo::{cmd_demo, DemoArgs};
use eval::{cmd_eval, cmd_score, EvalArgs, ScoreArgs};
use run::{cmd_run, RunArgs};
use synth::{cmd_synth, SynthArgs};

#[derive(Parser)]
#[command(
    name = "moestream",
    version,
    about = "Run MoE LLMs larger than RAM by streaming experts from disk"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    #[command(flatten)]
    logs: logs::LogArgs,
    /// Settings file (TOML): keys named like the long flags (`ram-gb =
    /// 8`), for every command or under a command's section (`[run]`,
    /// `[bench.decode]`); flags and MOESTREAM_<FLAG> variables win over it.
    #[arg(long = config::CONFIG_FLAG, global = true, value_name = "FILE", env = "MOESTREAM_CONFIG")]
    config: Option<PathBuf>,
}

/// Where a setting comes from, first source first (`run`, `chat`, `serve`
/// and `bench` show it under --help).
const PRECEDENCE: &str = "\
Where a setting comes from (the first source that has it wins):
  1. the flag                            --ram-gb 8
  2. the environment: MOESTREAM_<FLAG>   MOESTREAM_RAM_GB=8
  3. the --config FILE (TOML)            ram-gb = 8 at the top level, or under [run]
  4. the tuned profile (moestream tune)  --io, --pipeline, --prefetch left at auto
  5. the default shown above
";

#[derive(Subcommand)]
enum Cmd {
    /// Generate text from a prompt.
    #[command(after_help = PRECEDENCE)]
    Run(RunArgs),
    /// Teacher-force token ids and print per-position argmax, NLL and the last logits.
    Eval(EvalArgs),
    /// Multiple-choice accuracy (acc, acc_norm) over a JSONL file of tasks.
    Score(ScoreArgs),
    /// Record each linear layer's per-column input importance over a text
    /// (llama.cpp's imatrix idea) into a file for `convert --importance`.
    Calibrate(calibrate::CalibrateArgs),
    /// An OpenAI-compatible HTTP server (chat and text completions,
    /// streaming, continuous batching, KV kept between turns).
    #[command(after_help = PRECEDENCE)]
    Serve(serve::ServeArgs),
    /// Chat in the terminal with the model's chat template; the
    /// conversation's KV stays between turns.
    #[command(after_help = PRECEDENCE)]
    Chat(chat::ChatArgs),
    /// Generate from the embedded trained model (written on first use; --synthetic for the random-weight one).
    Demo(DemoArgs),
    /// Write a synthetic random-weight MoE checkpoint.
    Synth(SynthArgs),
    /// Convert a Hugging Face checkpoint (FP8/BF16/F16/F32) into the
    /// quantized moestream container.
    Convert(ConvertArgs),
    /// Replay a routing trace (`--trace`) against eviction policies at
    /// several cache sizes: misses and bytes per token, each against
    /// Belady's optimum; CSV and SVG plot.
    Replay(replay::ReplayArgs),
    /// Train the learned lookahead predictor on a routing trace: recall@k
    /// on held-out segments beside the router lookahead's.
    TrainPredictor(train_predictor::TrainPredictorArgs),
    /// Write a Qwen3-MoE model (hub checkpoint or container) as a GGUF
    /// file llama.cpp runs: the same weights for both engines.
    ExportGguf(export_gguf::ExportArgs),
    /// Measurements of this machine.
    #[command(subcommand, after_help = PRECEDENCE)]
    Bench(BenchCmd),
    /// Measure this disk and a few decodes per configuration, and save the
    /// fastest read mode, pipelining and prefetch as the model's profile
    /// (used by --io auto).
    Tune(tune::TuneArgs),
    /// The RAM plan under --ram-gb from headers only (works on a partial
    /// download): resident weights by class, slack, slots per layer, the
    /// smallest budget that runs, predicted MB read per token and tok/s.
    Plan(plan::PlanArgs),
    /// Readiness checks of this machine and a model (io_uring, O_DIRECT,
    /// read-ahead, memory limit, huge pages, CPU, disk probe, the model's
    /// files), each with a fix; exit status 1 on a failure.
    Doctor(doctor::DoctorArgs),
    /// A one-screen summary of a model and this machine.
    Status(doctor::StatusArgs),
    /// Print a shell completion script (e.g. `moestream completions bash >
    /// /etc/bash_completion.d/moestream`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff: `moestream man > moestream.1`).
    Man,
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Memory read bandwidth (the ceiling of every decode kernel).
    Mem(MemArgs),
    /// The batched integer kernels (prefill, 32+ rows) against the
    /// machine's integer peak (VNNI, else AVX2), measured alternately in
    /// one process: GMAC/s and % of peak per format, shape and batch.
    Kernels(bench_kernels::KernelsArgs),
    /// Decode speed of one configuration: one result line, optionally
    /// appended to a CSV file. The usage history is neither used nor saved.
    Decode(DecodeArgs),
    /// Raw disk sweep: cold random reads of the model files for every read
    /// mode x block size x queue depth (GB/s, latency, device bytes).
    Io(bench_io::IoBenchArgs),
    /// The server under 1, 2, 4, 8... concurrent streamed clients:
    /// aggregate and per-client tok/s, time to first token, MB/token.
    Serve(bench_serve::BenchServeArgs),
    /// The cost of one speculative verify step of k drafted positions
    /// against one decode step (seconds, expert MB read).
    Verify(bench_verify::VerifyArgs),
    /// Cold decode at each RAM budget (--ram-gb 2,3,4,6), each run inside
    /// a memory cgroup of its budget when one can be made: a CSV, and a
    /// plot (SVG and PNG) of tok/s and MB/token against the budget.
    Sweep(sweep::SweepArgs),
}

/// Help headings: what a user types first comes first, the research
/// knobs last.
const H_MODEL: &str = "Model";
const H_GEN: &str = "Generation";
const H_MEM: &str = "Memory and I/O";
const H_RESEARCH: &str = "Research";

#[derive(Args, Clone)]
#[command(next_help_heading = H_MODEL)]
struct ModelArgs {
    /// Model directory (config.json, *.safetensors, tokenizer.json), or a
    /// Hugging Face id (`org/name`) found offline in the hub cache
    /// ($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub); also
    /// accepted as the first positional argument.
    #[arg(
        short = 'm',
        long = "model",
        value_name = "DIR",
        conflicts_with = "model_pos"
    )]
    model_flag: Option<PathBuf>,
    /// The model (as --model).
    #[arg(value_name = "MODEL")]
    model_pos: Option<PathBuf>,
    /// The model directory, resolved from --model or the positional
    /// argument by [`resolve_model`] before any command reads it.
    #[arg(skip)]
    model: PathBuf,
    /// With a hub id: the branch, tag or commit of the snapshot.
    #[arg(long, default_value = "main")]
    revision: String,
    /// Worker threads for the kernels (default: all cores).
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// Routed experts kept in RAM per layer.
    #[arg(long, default_value_t = 16, help_heading = H_MEM)]
    expert_cache: usize,
    /// How expert bytes are read: auto (what `moestream tune` measured
    /// fastest for this disk and model; without a profile, direct under
    /// --ram-gb and buffered otherwise),
    /// direct (O_DIRECT), buffered (page cache), drop (page cache, then
    /// dropped), mmap, pread (the same reads as buffered; kept as a name).
    #[arg(long = "io", visible_alias = "read-mode", default_value = "auto", value_parser = parse_io,
          help_heading = H_MEM)]
    io: IoChoice,
    /// MLA attention: absorb (decode-style), explicit (K/V reconstruction),
    /// auto (the cheaper for the tokens in flight).
    #[arg(long, value_enum, default_value_t = MlaArg::Auto, help_heading = H_RESEARCH)]
    mla: MlaArg,
    /// DSA indexer (GLM-5): on, off (dense attention), auto (select only
    /// when a query sees more than index_topk positions; same output as on).
    #[arg(long, value_enum, default_value_t = DsaArg::Auto, help_heading = H_RESEARCH)]
    dsa: DsaArg,
    /// How a layer's expert misses are submitted: reactor (all in flight at
    /// once through io_uring, falling back to sync where unavailable) or
    /// sync (one after another on a reader thread).
    #[arg(long, value_enum, default_value_t = Submit::Reactor, help_heading = H_MEM)]
    submit: Submit,
    /// Pipelined MoE layers: compute cached experts while misses are read,
    /// then each miss as it lands (on), or wait for every read first (off);
    /// auto takes the tuned profile's choice (on without one).
    #[arg(long, value_enum, default_value_t = Toggle::Auto, help_heading = H_RESEARCH)]
    pipeline: Toggle,
    /// Router-lookahead prefetch: read the experts the next layers' routers
    /// pick from this layer's state, at lower priority than demand reads
    /// (on), or not (off); auto takes the tuned profile's choice (without
    /// one: off; results/prefetch-budget.md);
    /// learned:FILE reads the next MoE layer's experts a predictor trained
    /// by `train-predictor` guesses (from this layer's choice, the next
    /// layer's choice for the previous token and the lookahead's guess).
    #[arg(long, value_parser = parse_prefetch, default_value = "auto", help_heading = H_RESEARCH)]
    prefetch: PrefetchArg,
    /// The state the lookahead applies the next router to: attn (this
    /// layer's post-attention residual: more lead time) or output (this
    /// layer's output: better guesses).
    #[arg(long, value_enum, default_value_t = PrefetchFrom::Attn, help_heading = H_RESEARCH)]
    prefetch_from: PrefetchFrom,
    /// MoE layers ahead the lookahead prefetches.
    #[arg(long, default_value_t = 1, help_heading = H_RESEARCH)]
    prefetch_depth: usize,
    /// Prefetch reads alive at once (default (depth + 1) x top-k).
    #[arg(long, help_heading = H_RESEARCH)]
    prefetch_experts: Option<usize>,
    /// Score the lookahead's guess of the next layer's experts from both
    /// states (attn and output) even without prefetch: recall per layer in
    /// the stats, at the cost of two extra router products per layer.
    #[arg(long, help_heading = H_RESEARCH)]
    recall: bool,
    /// Opt-in cache-aware routing (lossy: changes tokens): every expert a
    /// layer's cache holds has its routing score multiplied by 1 + λ when
    /// the router picks its top-k (the weights stay the experts' own). Off
    /// by default: routing is exactly the model's.
    #[arg(long, value_name = "λ", help_heading = H_RESEARCH)]
    cache_aware_routing: Option<f32>,
    /// Quantize a float or FP8 checkpoint while loading: routed experts at
    /// BITS (2, 4, 8, 16, 32) or a grouped format (q4g64, q4g64a, q3g64,
    /// q2g64, …), the rest by the converter's default policy (identical
    /// bytes to `convert --expert-bits BITS`).
    #[arg(long, value_name = "BITS")]
    quantize_at_load: Option<String>,
    /// Packed weights multiply in f32 (dequantized rows) instead of
    /// integer dot products against an int8-quantized activation.
    #[arg(long, help_heading = H_RESEARCH)]
    no_int_dot: bool,
    /// RAM budget in GB (10^9 bytes): expert cache slots per layer are
    /// planned so resident weights + caches + itemized slack fit (overrides
    /// --expert-cache); the plan is printed at start. Without the flag: the
    /// machine's budget (the memory cgroup limit or MemAvailable, the
    /// smaller, less 10%) bounds the run: --expert-cache is kept when it
    /// fits, else the run is planned under that budget. `none`: no bound.
    #[arg(long, value_name = "GB|none", value_parser = parse_ram, help_heading = H_MEM)]
    ram_gb: Option<RamArg>,
    /// Which cached expert a full cache evicts: auto (per layer, whichever
    /// of least-stale and lfru would have missed least on its recent
    /// lookups), least-stale (the expert chosen the most tokens ago), lru,
    /// lfru (frequency first, recency breaks ties), lfu or arc (see
    /// `moestream replay` to compare them on a recorded trace).
    #[arg(long, value_enum, default_value_t = PolicyArg::Auto, help_heading = H_MEM)]
    policy: PolicyArg,
    /// Context positions the --ram-gb plan reserves KV cache for (default:
    /// for `run` with one prompt, the prompt plus --max-tokens; otherwise
    /// 4096).
    #[arg(long, short = 'c', visible_alias = "ctx-size", help_heading = H_MEM)]
    context: Option<usize>,
    /// Do not pin experts from the usage history (kept per model under the
    /// cache directory, see README), and do not update it.
    #[arg(long, help_heading = H_MEM, env = "MOESTREAM_NO_HISTORY", action = clap::ArgAction::SetTrue,
          value_parser = clap::builder::BoolishValueParser::new())]
    no_history: bool,
    /// Record a routing trace into FILE (Parquet, docs/TRACE.md): per
    /// token and MoE layer the chosen experts and weights, the router's
    /// margin, both lookahead guesses, the cache tier, bytes and read
    /// latency. Appended when the command ends, so runs concatenate (a
    /// `run` column tells them apart). Tokens do not change.
    #[arg(long, value_name = "FILE", help_heading = H_RESEARCH)]
    trace: Option<PathBuf>,
    /// Positions each layer of a long prefill runs over before the next
    /// layer starts (default: the RAM plan's `prefill pass`, the most it
    /// allows; a smaller pass re-reads the experts once per pass: 256 is
    /// the chunked prefill that came before layer-major passes).
    #[arg(long, value_name = "POSITIONS", help_heading = H_RESEARCH)]
    prefill_pass: Option<usize>,
    /// Which experts a layer-major prefill pass reads while a layer's
    /// attention runs, before its routing: the first ones in file order
    /// (`files`, the default), those the layer's router picks for a
    /// sample of the rows entering the layer (`guess`), or none (`off`:
    /// the reads start after the routing). Tokens do not change.
    #[arg(long, value_enum, value_name = "WHICH", help_heading = H_RESEARCH)]
    prefill_early: Option<EarlyArg>,
}

/// `--prefill-early`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum EarlyArg {
    Files,
    Guess,
    Off,
}

impl ModelArgs {
    /// The budget `--ram-gb` names, in GB (`None` without the flag and for
    /// `--ram-gb none`).
    fn budget_gb(&self) -> Option<f64> {
        match self.ram_gb {
            Some(RamArg::Gb(gb)) => Some(gb),
            Some(RamArg::Unbounded) | None => None,
        }
    }
}

/// `--ram-gb`: a budget in GB, or `none` (no bound at all).
#[derive(Clone, Copy, Debug, PartialEq)]
enum RamArg {
    Gb(f64),
    Unbounded,
}

fn parse_ram(s: &str) -> std::result::Result<RamArg, String> {
    if s == "none" {
        return Ok(RamArg::Unbounded);
    }
    s.parse()
        .map(RamArg::Gb)
        .map_err(|_| format!("`{s}`: expected a number of GB, or none"))
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
    /// Lifetime selections first, recency breaks ties.
    Lfu,
    /// The expert chosen the most tokens ago (after SpecMD's Least-Stale).
    LeastStale,
    /// Adaptive replacement cache (recency and frequency lists).
    Arc,
    /// Per layer, whichever of least-stale and lfru would have missed
    /// least on its recent lookups (measured by ghost caches).
    Auto,
}

impl From<PolicyArg> for EvictPolicy {
    fn from(a: PolicyArg) -> EvictPolicy {
        match a {
            PolicyArg::Lru => EvictPolicy::Lru,
            PolicyArg::Lfru => EvictPolicy::Lfru,
            PolicyArg::Lfu => EvictPolicy::Lfu,
            PolicyArg::LeastStale => EvictPolicy::LeastStale,
            PolicyArg::Arc => EvictPolicy::Arc,
            PolicyArg::Auto => EvictPolicy::Auto,
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

/// `--prefetch`: router lookahead on, off or the profile's, or a learned
/// predictor.
#[derive(Clone, Debug, PartialEq)]
enum PrefetchArg {
    Lookahead(Toggle),
    Learned(PathBuf),
}

fn parse_prefetch(s: &str) -> std::result::Result<PrefetchArg, String> {
    match s {
        "auto" => Ok(PrefetchArg::Lookahead(Toggle::Auto)),
        "on" => Ok(PrefetchArg::Lookahead(Toggle::On)),
        "off" => Ok(PrefetchArg::Lookahead(Toggle::Off)),
        _ => match s.strip_prefix("learned:") {
            Some(path) if !path.is_empty() => Ok(PrefetchArg::Learned(path.into())),
            _ => Err(format!("`{s}`: expected auto, on, off or learned:FILE")),
        },
    }
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

/// What the flags of `m` ask for (the environment and the `--config`
/// file already merged into them, cli/config.rs), `auto` left to the
/// profile, planned under `ram_budget`.
fn requested(
    m: &ModelArgs,
    ram_budget: Option<u64>,
    quantize_at_load: Option<Policy>,
    predictor: Option<std::sync::Arc<moestream::store::predictor::Predictor>>,
) -> Requested {
    let toggle = |t: Toggle| match t {
        Toggle::On => Choice::Set(true),
        Toggle::Off => Choice::Set(false),
        Toggle::Auto => Choice::Auto,
    };
    let asked = Lookahead {
        from: match m.prefetch_from {
            PrefetchFrom::Attn => Variant::Attn,
            PrefetchFrom::Output => Variant::Output,
        },
        depth: m.prefetch_depth.max(1),
    };
    let prefetch = match toggle(match &m.prefetch {
        PrefetchArg::Lookahead(t) => *t,
        // The predictor replaces the router lookahead's reads.
        PrefetchArg::Learned(_) => Toggle::Off,
    }) {
        Choice::Set(true) => Choice::Set(Some(asked)),
        Choice::Set(false) => Choice::Set(None),
        Choice::Auto => Choice::Auto,
    };
    Requested {
        model: runtime::ModelSettings {
            mla: m.mla.into(),
            dsa: m.dsa.into(),
            quantize_at_load,
            context: m.context.unwrap_or(CONTEXT_DEFAULT),
        },
        store: runtime::StoreRequest {
            expert_cache: m.expert_cache,
            ram_budget,
            policy: m.policy.into(),
            pin_history: !m.no_history,
            pipeline: toggle(m.pipeline),
            prefetch,
            prefetch_experts: m.prefetch_experts,
            recall: m.recall,
            cache_lean: m.cache_aware_routing,
            predictor,
            input_bytes: 0,
        },
        io: runtime::IoRequest {
            read_mode: match m.io {
                IoChoice::Auto => Choice::Auto,
                IoChoice::Mode(mode) => Choice::Set(mode),
            },
            reactor: m.submit == Submit::Reactor,
        },
        generation: GenOptions::default(),
    }
}

/// `req` resolved once (`moestream::engine::runtime`): what was asked,
/// then the tuned profile, then the defaults; and a note saying which
/// profile was used.
fn configure(dir: Option<&Path>, req: &Requested) -> (runtime::RuntimeConfig, Option<String>) {
    let mut note = None;
    let mut profile = None;
    if let Some(dir) = dir.filter(|_| req.wants_profile()) {
        match moestream::fs::tuned::load(dir) {
            Ok(found) => profile = found,
            Err(e) => note = Some(format!("warning: {e}; using the defaults")),
        }
    }
    let r = runtime::resolve(req, profile.as_ref().map(|(_, p)| p));
    if let Some((path, _)) = &profile {
        let replaced = if r.not_understood.is_empty() {
            String::new()
        } else {
            format!(
                "; not understood, defaults used: {}",
                r.not_understood.join(", ")
            )
        };
        note = Some(format!(
            "tuned profile: --io {} --pipeline {} --prefetch {} ({}{replaced})",
            r.io.read_mode,
            if r.store.schedule.pipeline {
                "on"
            } else {
                "off"
            },
            lookahead_name(r.store.schedule.lookahead),
            path.display()
        ));
    }
    (r, note)
}

#[derive(Args)]
#[command(next_help_heading = H_GEN)]
struct GenArgs {
    /// Maximum new tokens.
    #[arg(short = 'n', long, visible_alias = "n-predict", default_value_t = 64)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    spec: SpecArgs,
    /// Constrain the output to a grammar: GBNF (llama.cpp's format; a
    /// file whose first rule is `name ::= ...`) or llguidance's Lark
    /// dialect (every token keeps the output inside the language; EOS
    /// only where it is complete).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["json_schema", "regex"])]
    grammar: Option<PathBuf>,
    /// Constrain the output to JSON matching this JSON schema.
    #[arg(long, value_name = "FILE", conflicts_with = "regex")]
    json_schema: Option<PathBuf>,
    /// Constrain the whole output to this regular expression.
    #[arg(long, value_name = "RE")]
    regex: Option<String>,
    /// Continue past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
}

/// Speculative decoding flags (run, serve, chat).
#[derive(Args, Clone)]
#[command(next_help_heading = H_GEN)]
struct SpecArgs {
    /// Draft tokens and verify them in one forward, which reads each
    /// expert once for all of them: mtp (the model's MTP head, recursively:
    /// deepseek_v3, glm4_moe, glm_moe_dsa), ngram (prompt lookup: what
    /// followed the latest earlier occurrence of the last tokens), auto
    /// (mtp where the model has the head and ngram, behind a gate that
    /// measures each one's acceptance and verify step's cost, drafts with
    /// the one that pays best and stops drafting while neither pays,
    /// probing now and then to switch or resume) or off.
    /// Lossless: the output is the same as without.
    #[arg(long, value_enum, default_value_t = SpecArg::Off)]
    speculate: SpecArg,
    /// Tokens drafted per step at most.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=16))]
    draft: u16,
}

#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq)]
enum SpecArg {
    Off,
    Ngram,
    Mtp,
    Auto,
}

impl SpecArgs {
    fn speculation(&self) -> moestream::engine::Speculation {
        use moestream::engine::Speculation;
        match self.speculate {
            SpecArg::Off => Speculation::Off,
            SpecArg::Ngram => Speculation::Ngram {
                draft: self.draft.into(),
            },
            SpecArg::Mtp => Speculation::Mtp {
                draft: self.draft.into(),
            },
            SpecArg::Auto => Speculation::Auto {
                draft: self.draft.into(),
            },
        }
    }
}

/// Sampling flags (run, serve, chat); a flag not given leaves the setting
/// to generation_config.json.
#[derive(Args, Clone)]
#[command(next_help_heading = H_GEN)]
struct SamplingArgs {
    /// Softmax temperature; 0 = greedy. Without the flag: the model's
    /// generation_config.json (greedy where it says `do_sample: false`, its
    /// `temperature` otherwise, 1 for `do_sample: true` alone), else
    /// greedy. The flag wins over the file.
    #[arg(long, visible_alias = "temp")]
    temperature: Option<f32>,
    /// Nucleus sampling: keep the most likely tokens until their mass
    /// reaches P, in (0, 1]. Without the flag: generation_config.json's
    /// `top_p`, else 1 (off).
    #[arg(long, value_name = "P")]
    top_p: Option<f32>,
    /// Keep the K most likely tokens; 0 = off. Without the flag:
    /// generation_config.json's `top_k`, else 0.
    #[arg(long, value_name = "K")]
    top_k: Option<usize>,
    /// min-p sampling: keep the tokens at least P times as likely as the
    /// most likely one, in [0, 1] (applied after top-k and top-p, as
    /// transformers does); 0 = off. Without the flag:
    /// generation_config.json's `min_p`, else 0.
    #[arg(long, value_name = "P")]
    min_p: Option<f32>,
    /// Subtracted from the logit of every token generated so far (OpenAI),
    /// in [-2, 2]; 0 = off (generation_config.json has no such key).
    #[arg(long)]
    presence_penalty: Option<f32>,
    /// Subtracted from a token's logit per time it was generated so far
    /// (OpenAI), in [-2, 2]; 0 = off (generation_config.json has no such
    /// key).
    #[arg(long)]
    frequency_penalty: Option<f32>,
    /// Divides positive and multiplies negative logits of the tokens of the
    /// prompt and generated so far (transformers), > 0; 1 = off. Without
    /// the flag: generation_config.json's `repetition_penalty`, else 1.
    #[arg(long)]
    repetition_penalty: Option<f32>,
    /// Seed of the sampler's generator. Without it `run` and `chat` draw
    /// a fresh one, printed on stderr when sampling so the run can be
    /// repeated with `--seed N`; `serve` draws one per request.
    #[arg(short = 's', long)]
    seed: Option<u64>,
}

impl SamplingArgs {
    /// The sampling settings of a `run` or `chat`: the flags, else
    /// `defaults` (generation_config.json), else greedy; without `--seed`
    /// a fresh seed, printed on stderr when it matters (temperature > 0).
    fn sampling(&self, defaults: &GenerationDefaults) -> SamplingParams {
        let base = SamplingParams {
            seed: moestream::engine::sampler::fresh_seed(),
            ..SamplingParams::default()
        };
        let p = defaults.sampling(&base, &self.overrides());
        if self.seed.is_none() && p.temperature > 0.0 {
            eprintln!("seed: {} (--seed {} repeats this run)", p.seed, p.seed);
        }
        p
    }

    /// The settings given on the command line.
    fn overrides(&self) -> Overrides {
        Overrides {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repetition_penalty: self.repetition_penalty,
            seed: self.seed,
        }
    }
}

/// KV positions a plan reserves when neither `--context` nor a single
/// request says how many are needed.
const CONTEXT_DEFAULT: usize = 4096;

/// Entry point: runs the command, prints errors as one line, exit code 1.
pub fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let (cmd, merged) = match config::merge(command(), &argv) {
        Ok(found) => found,
        Err(e) => {
            report(&e);
            return ExitCode::FAILURE;
        }
    };
    let matches = match cmd.try_get_matches_from(argv.clone()) {
        Ok(m) => m,
        Err(e) => match merged.explain(&e) {
            Some(why) => {
                report(&why);
                return ExitCode::from(2);
            }
            None => e.exit(),
        },
    };
    let mut cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    logs::install(&cli.logs);
    if let Err(e) = resolve_model(&mut cli.cmd) {
        report(&e);
        return ExitCode::FAILURE;
    }
    let res = match cli.cmd {
        Cmd::Run(a) => cmd_run(a),
        Cmd::Eval(a) => cmd_eval(a),
        Cmd::Score(a) => cmd_score(a),
        Cmd::Calibrate(a) => calibrate::cmd_calibrate(a),
        Cmd::Serve(a) => serve::cmd_serve(a),
        Cmd::Chat(a) => chat::cmd_chat(a),
        Cmd::Demo(a) => cmd_demo(a),
        Cmd::Synth(a) => cmd_synth(a),
        Cmd::Convert(a) => cmd_convert(a),
        Cmd::Replay(a) => replay::cmd_replay(a),
        Cmd::TrainPredictor(a) => train_predictor::cmd_train_predictor(a),
        Cmd::ExportGguf(a) => export_gguf::cmd_export(a),
        Cmd::Bench(BenchCmd::Mem(a)) => cmd_bench_mem(a),
        Cmd::Bench(BenchCmd::Kernels(a)) => bench_kernels::cmd_bench_kernels(a),
        Cmd::Bench(BenchCmd::Decode(a)) => cmd_bench_decode(a),
        Cmd::Tune(a) => tune::cmd_tune(a),
        Cmd::Plan(a) => plan::cmd_plan(a),
        Cmd::Bench(BenchCmd::Sweep(a)) => sweep::cmd_bench_sweep(a),
        Cmd::Doctor(a) => return exit(doctor::cmd_doctor(a)),
        Cmd::Status(a) => config::summary(&command(), &argv).and_then(|s| doctor::cmd_status(a, s)),
        Cmd::Bench(BenchCmd::Io(a)) => bench_io::cmd_bench_io(a),
        Cmd::Bench(BenchCmd::Serve(a)) => bench_serve::cmd_bench_serve(a),
        Cmd::Bench(BenchCmd::Verify(a)) => bench_verify::cmd_bench_verify(a),
        Cmd::Completions { shell } => {
            clap_complete::generate(shell, &mut command(), "moestream", &mut std::io::stdout());
            Ok(())
        }
        Cmd::Man => clap_mangen::Man::new(command())
            .render(&mut std::io::stdout())
            .context("writing the man page"),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            report(&e);
            ExitCode::FAILURE
        }
    }
}

/// The command line as clap builds it, with the build's facts in
/// `--version`.
fn command() -> clap::Command {
    use clap::CommandFactory;
    let long: &'static str = Box::leak(version_long().into_boxed_str());
    Cli::command().long_version(long)
}

/// `--version`: the version, the commit and profile of the build
/// (build.rs), and the SIMD level the kernels dispatch to on this CPU.
fn version_long() -> String {
    format!(
        "{}\ncommit   {}\nprofile  {}\nkernels  {} (detected at start; MOESTREAM_ISA=scalar|avx2|avx512 caps it)",
        env!("CARGO_PKG_VERSION"),
        env!("MOESTREAM_COMMIT"),
        env!("MOESTREAM_PROFILE"),
        format!("{:?}", moestream::kernels::cpu::isa()).to_lowercase(),
    )
}

/// A command that chooses its own exit status; errors print as `main`'s.
fn exit(res: Result<ExitCode>) -> ExitCode {
    res.unwrap_or_else(|e| {
        report(&e);
        ExitCode::FAILURE
    })
}

/// Prints `e` as one line, `error: ` and its causes joined by `: `. The
/// engine's request errors lose the server's `bad request: ` prefix: on
/// the command line the request is the command itself.
fn report(e: &anyhow::Error) {
    eprintln!("error: {}", error_line(e));
}

fn error_line(e: &anyhow::Error) -> String {
    let causes: Vec<String> = e
        .chain()
        .map(|c| match c.downcast_ref::<moestream::Error>() {
            Some(moestream::Error::Request(msg)) => msg.clone(),
            _ => c.to_string(),
        })
        .collect();
    causes.join(": ")
}

/// Resolves a command's `--model` (a directory, or a hub id) once, before
/// anything reads it.
fn resolve_model(cmd: &mut Cmd) -> Result<()> {
    let m = match cmd {
        Cmd::Run(a) => &mut a.model,
        Cmd::Eval(a) => &mut a.model,
        Cmd::Score(a) => &mut a.model,
        Cmd::Calibrate(a) => &mut a.model,
        Cmd::Serve(a) => &mut a.model,
        Cmd::Chat(a) => &mut a.model,
        Cmd::Bench(BenchCmd::Decode(a)) => &mut a.model,
        Cmd::Bench(BenchCmd::Serve(a)) => &mut a.model,
        Cmd::Bench(BenchCmd::Verify(a)) => &mut a.model,
        Cmd::Tune(a) => &mut a.model,
        Cmd::Plan(a) => &mut a.model,
        Cmd::Bench(BenchCmd::Sweep(a)) => {
            a.model = moestream::formats::hub::resolve(&a.model, Some(&a.revision))?;
            return check_model_path(&a.model);
        }
        _ => return Ok(()),
    };
    // Both given on the command line is refused by clap; a positional
    // model wins over a --model from the environment or the file.
    let given = m.model_pos.take().or(m.model_flag.take());
    let given = given.context("give the model: --model DIR (or -m DIR, or DIR first)")?;
    m.model = moestream::formats::hub::resolve(&given, Some(&m.revision))?;
    check_model_path(&m.model)
}

/// A model path that is not there is said to be missing, not reported as
/// the first file some command fails to read from it.
fn check_model_path(p: &Path) -> Result<()> {
    match std::fs::metadata(p) {
        Err(e) => bail!("--model {}: {e}", p.display()),
        Ok(md) if md.is_file() && !moestream::formats::gguf::is_gguf(p) => bail!(
            "--model {}: a file, but neither a model directory nor a .gguf file",
            p.display()
        ),
        Ok(_) => Ok(()),
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
    load_with_inputs(m, 0)
}

/// [`load`] for a command whose own inputs hold `input_bytes` while the
/// model runs (the `inputs` item of the RAM plan).
fn load_with_inputs(m: &ModelArgs, input_bytes: u64) -> Result<Model> {
    if let Some(t) = m.threads {
        check_threads(t)?;
        rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build_global()
            .ok();
    }
    moestream::kernels::quant::set_int_dot(!m.no_int_dot);
    if let Some(path) = &m.trace {
        moestream::fs::check_not_input(&[path], &[&m.model]).context("--trace")?;
    }
    let (opts, note) = load_options(m, input_bytes)?;
    let mut model = Model::load(&m.model, &opts).map_err(|e| plan::refusal(e, &m.model, &opts))?;
    limits::note_clamps(m, &model);
    tracing::info!(
        model = %m.model.display(),
        family = model.cfg.family.model_type(),
        slots_per_layer = model.plan.as_ref().map(|p| p.slots_per_layer),
        "model loaded"
    );
    if let Some(path) = &m.trace {
        replay::start_trace(&mut model, path)?;
    }
    if let Some(positions) = m.prefill_pass {
        model
            .set_prefill_pass(positions)
            .map_err(|e| anyhow::anyhow!("--prefill-pass: {e}"))?;
    }
    if let Some(early) = m.prefill_early {
        model.store.schedule.early = match early {
            EarlyArg::Files => Some(moestream::store::EarlyReads::Files),
            EarlyArg::Guess => Some(moestream::store::EarlyReads::Guess),
            EarlyArg::Off => None,
        };
    }
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

/// What `m` asks loading for (flags, environment and file, then the
/// tuned profile, then the defaults), and a note saying which profile was
/// used; `plan` plans with the same options `run` loads with.
fn load_options(m: &ModelArgs, input_bytes: u64) -> Result<(LoadOptions, Option<String>)> {
    let mut req = request(m)?;
    req.store.input_bytes = input_bytes;
    let (config, note) = configure(Some(&m.model), &req);
    let mut opts = config.load_options(progress::hook());
    if m.ram_gb.is_none() {
        match moestream::machine::memory::machine_budget() {
            None => {
                eprintln!("memory: no cgroup limit or MemAvailable known; the run is not bounded")
            }
            Some(machine) => {
                if let Some(fit) = machine_fit(m, &req, machine) {
                    eprintln!("{}", fit.line());
                    if !fit.fits() {
                        opts = fit.budgeted;
                    }
                }
            }
        }
    }
    Ok((opts, note))
}

/// The options a budget is planned with, asked for or not: `req` as a
/// budgeted run resolves it (without a profile: direct reads and the
/// lookahead's prefetch reads), its budget then `req`'s own. `plan` and
/// `doctor` both plan through this, so they name the same smallest budget
/// (the one `run` needs).
fn planning_options(dir: Option<&Path>, req: &Requested) -> LoadOptions {
    let mut budgeted = req.clone();
    budgeted.store.ram_budget.get_or_insert(1_000_000_000);
    let mut opts = configure(dir, &budgeted).0.load_options(progress::hook());
    opts.ram_budget = req.store.ram_budget;
    opts
}

/// What `m` asks for, checked, before any profile; `--ram-gb` as given.
fn request(m: &ModelArgs) -> Result<Requested> {
    limits::model_args(m)?;
    let quantize_at_load = match &m.quantize_at_load {
        None => None,
        Some(bits) => {
            let mut p = Policy::default();
            p.set_all(&Class::ROUTED, width(bits, "--quantize-at-load")?)
                .map_err(anyhow::Error::msg)?;
            Some(p)
        }
    };
    let predictor = match &m.prefetch {
        PrefetchArg::Learned(path) => Some(std::sync::Arc::new(
            moestream::store::predictor::Predictor::load(path)?,
        )),
        PrefetchArg::Lookahead(_) => None,
    };
    let ram_budget = m.budget_gb().map(|gb| (gb * 1e9) as u64);
    Ok(requested(m, ram_budget, quantize_at_load, predictor))
}

/// The machine's budget, and what the `--expert-cache` slots need when
/// planned as a budgeted run plans
/// ([`moestream::inspect::plan::budget_for_slots`]).
#[derive(serde::Serialize)]
struct Fit {
    machine: moestream::machine::memory::MachineBudget,
    slots: usize,
    need_bytes: u64,
    /// The options of a run planned under the machine's budget.
    #[serde(skip)]
    budgeted: LoadOptions,
}

impl Fit {
    pub(super) fn fits(&self) -> bool {
        self.need_bytes <= self.machine.bytes
    }

    /// The line said at start (and by `plan`).
    pub(super) fn line(&self) -> String {
        let need = moestream::machine::gb(self.need_bytes);
        match self.fits() {
            true => format!(
                "memory: budget {}; --expert-cache {} needs {need:.2} GB and fits (--ram-gb none: no bound)",
                self.machine, self.slots
            ),
            false => format!(
                "memory: budget {}; --expert-cache {} would need {need:.2} GB, so the run is planned under the budget (--ram-gb GB to choose one, none for no bound)",
                self.machine, self.slots
            ),
        }
    }
}

/// Without `--ram-gb`, how `req` (asked for by `m`) fits `machine`;
/// `None` when the model cannot be measured (loading then fails with its
/// own error).
fn machine_fit(
    m: &ModelArgs,
    req: &Requested,
    machine: moestream::machine::memory::MachineBudget,
) -> Option<Fit> {
    let mut under = req.clone();
    under.store.ram_budget = Some(machine.bytes);
    let budgeted = configure(Some(&m.model), &under)
        .0
        .load_options(progress::hook());
    let need_bytes =
        moestream::inspect::plan::budget_for_slots(&m.model, &budgeted, m.expert_cache).ok()?;
    Some(Fit {
        machine,
        slots: m.expert_cache,
        need_bytes,
        budgeted,
    })
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
    let saved = moestream::store::usage::history_path(&m.model)
        .and_then(|path| model.store.save_history(&path));
    if let Err(e) = saved {
        eprintln!("warning: usage history not saved: {e}");
    }
}

/// What to generate: each sampling flag given, else the model's
/// generation_config.json, else greedy with every filter and penalty off
/// ([`GenerationDefaults::sampling`]); the end-of-sequence ids from the
/// same file (or config.json).
fn gen_options(g: &GenArgs, dir: &Path) -> Result<GenOptions> {
    let defaults = GenerationDefaults::load(dir)?;
    Ok(GenOptions {
        max_tokens: g.max_tokens,
        sampling: g.sampling.sampling(&defaults),
        ignore_eos: g.ignore_eos,
        eos_ids: defaults.eos_ids,
        speculation: g.spec.speculation(),
        ..GenOptions::default()
    })
}

/// The output constraint of `--grammar`, `--json-schema` or `--regex`,
/// prepared for `model`'s tokenizer (in `dir`).
fn constrained(
    g: &GenArgs,
    dir: &Path,
    model: &Model,
    eos: &[u32],
) -> Result<Option<moestream::engine::Constrained>> {
    use moestream::engine::{Constrained, Constraint, Grammars};
    use moestream::fs::read::{GRAMMAR, JSON_SCHEMA};
    let read = |p: &Path, cap, flag: &str| {
        moestream::fs::read_to_string(p, cap).with_context(|| format!("{flag} {}", p.display()))
    };
    let constraint = match (&g.grammar, &g.json_schema, &g.regex) {
        (Some(p), _, _) => Constraint::Lark(match read(p, GRAMMAR, "--grammar")? {
            text if moestream::engine::gbnf::is_gbnf(&text) => {
                moestream::engine::gbnf::to_lark(&text)
                    .map_err(moestream::Error::from)
                    .with_context(|| p.display().to_string())?
            }
            text => text,
        }),
        (_, Some(p), _) => Constraint::JsonSchema(
            serde_json::from_str(&read(p, JSON_SCHEMA, "--json-schema")?)
                .with_context(|| format!("{}: not JSON", p.display()))?,
        ),
        (_, _, Some(r)) => Constraint::Regex(r.clone()),
        _ => return Ok(None),
    };
    let bytes = moestream::formats::model_files::read(dir, "tokenizer.json")?
        .with_context(|| format!("{}: no tokenizer.json", dir.display()))?
        .text
        .into_bytes();
    let grammars = Grammars::new(&bytes, model.cfg.vocab_size, eos)?;
    grammars.start(&constraint)?;
    Ok(Some(Constrained {
        grammars,
        constraint,
        after: Vec::new(),
    }))
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

/// The read mode the model's shards actually use (after any fallback).
fn read_mode_of(model: &Model) -> ReadMode {
    model
        .store
        .index()
        .shards
        .first()
        .map_or(ReadMode::Buffered, |s| s.reader.effective_mode())
}
