//! `moestream replay`: a routing trace (`--trace FILE` of run, serve,
//! bench, chat...) replayed offline against eviction policies at several
//! cache sizes, each against Belady's optimum at the same size
//! ([`moestream::lab::replay`]); and `--trace` itself, started at load.

use super::*;
use moestream::lab::replay::{self, Pin, Prefetch, Setup, Slots};
use moestream::store::policy;
use std::time::Instant;

#[derive(Args)]
pub(super) struct ReplayArgs {
    /// The trace (Parquet, as `--trace` writes it; every run in it is
    /// replayed, each from empty caches).
    #[arg(long, value_name = "FILE")]
    trace: PathBuf,
    /// Cache slots per layer, comma-separated; `trace` replays each fetch
    /// with the slots the run had then.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8,16,32")]
    slots: Vec<String>,
    /// Eviction policies, comma-separated: lru, lfru, lfu, least-stale,
    /// arc, auto, belady (the offline optimum, always simulated for the
    /// ratio).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "lru,lfu,lfru,least-stale,arc,auto,belady"
    )]
    policy: Vec<String>,
    /// Which misses stall and what is read: none (every miss read on
    /// demand), lookahead (the run's recorded attn guess read ahead;
    /// lookahead:output for the output guess; lookahead:attn:2 or
    /// lookahead:output:2 also the guess from two layers before, as
    /// `--prefetch-depth 2` reads), oracle (exactly the misses read ahead).
    /// Hits and misses do not change.
    #[arg(long, default_value = "none")]
    prefetch: String,
    /// Pinning, which needs a usage history: none (each run replayed whole
    /// from empty caches), or each run's first half as the history and its
    /// second half replayed with, per layer, N (a count), P% (a share of
    /// the slots) or `history` (as many as the store pins from a history
    /// that long) of the history's hottest experts pinned; 0 pins nothing
    /// over the same second half. A share is rounded down; at most half
    /// the slots are pinned. (A value starting with `-` is taken, and
    /// refused naming this flag.)
    #[arg(long, default_value = "none", allow_hyphen_values = true)]
    pin: String,
    /// Only the run with this id (the trace's `run` column).
    #[arg(long)]
    run: Option<String>,
    /// Write one row per policy and slot count to FILE.
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// Plot hit rate against slots, one line per policy, to FILE (SVG; PNG
    /// when FILE ends in .png).
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
    /// Print one JSON object (the outcomes and what the runs recorded)
    /// instead of the table.
    #[arg(long)]
    json: bool,
}

/// `--trace FILE`: starts the store's recorder (the file is written when
/// the model is dropped, at the end of the command).
pub(super) fn start_trace(model: &mut Model, path: &Path) -> Result<()> {
    let run = model
        .store
        .start_trace(path)
        .with_context(|| format!("--trace {}", path.display()))?;
    eprintln!("trace: recording run {run} into {}", path.display());
    Ok(())
}

fn parse_slots(v: &[String]) -> Result<Vec<Slots>> {
    v.iter()
        .map(|s| match s.trim() {
            "trace" => Ok(Slots::Traced),
            n => n
                .parse()
                .map(Slots::Fixed)
                .map_err(|_| anyhow::anyhow!("--slots: `{n}` is not a slot count or `trace`")),
        })
        .collect()
}

pub(super) fn cmd_replay(a: ReplayArgs) -> Result<()> {
    let outputs: Vec<&Path> = a.csv.iter().chain(&a.plot).map(PathBuf::as_path).collect();
    moestream::fs::check_not_input(&outputs, &[&a.trace]).context("--csv/--plot")?;
    let slots = parse_slots(&a.slots)?;
    let policies: Vec<&str> = a.policy.iter().map(|p| p.trim()).collect();
    if let Some(bad) = policies.iter().find(|p| policy::build(p, 1).is_none()) {
        bail!(
            "--policy: unknown policy `{bad}` (known: {})",
            policy::NAMES.join(", ")
        );
    }
    let prefetch = Prefetch::parse(&a.prefetch).with_context(|| {
        format!(
            "--prefetch: `{}`: expected {}",
            a.prefetch,
            Prefetch::SPELLINGS
        )
    })?;
    let pin = Pin::parse(&a.pin)
        .with_context(|| format!("--pin: `{}`: expected {}", a.pin, Pin::SPELLINGS))?;
    let t0 = Instant::now();
    let runs = moestream::formats::trace::read::read(&a.trace, a.run.as_deref())?;
    let read_s = t0.elapsed().as_secs_f64();
    if runs.is_empty() {
        bail!(
            "{}: no rows{}",
            a.trace.display(),
            a.run
                .as_ref()
                .map_or(String::new(), |r| format!(" of run {r}"))
        );
    }
    if let Prefetch::Lookahead { from, depth: 2 } = prefetch {
        check_deeper(&runs, from, &prefetch, &a.trace)?;
    }
    let t1 = Instant::now();
    let outcomes = replay::replay_with(&runs, &policies, &slots, Setup { prefetch, pin });
    let sim_s = t1.elapsed().as_secs_f64();
    let accesses: usize = runs.iter().map(|r| r.accesses()).sum();
    // Every policy at every slot count, plus Belady where not asked for.
    let sims = slots.len() * (policies.len() + usize::from(!policies.contains(&"belady")));
    let rate = (accesses * sims) as f64 / sim_s.max(1e-9);
    if let Some(path) = &a.csv {
        replay::report::write_csv(path, &outcomes, &prefetch.name())
            .with_context(|| format!("--csv {}", path.display()))?;
    }
    if let Some(path) = &a.plot {
        let title = format!(
            "hit rate vs slots: {}",
            a.trace.file_name().unwrap_or_default().to_string_lossy()
        );
        replay::plot::hit_rate(path, &outcomes, &title)
            .map_err(|e| anyhow::anyhow!("--plot {}: {e}", path.display()))?;
    }
    let recorded = runs.iter().fold((0, 0, 0), |t, r| {
        let c = r.recorded;
        (t.0 + c.pinned_hits, t.1 + c.hits, t.2 + c.misses)
    });
    if recorded.0 > 0 && pin == Pin::None {
        eprintln!(
            "warning: the traced runs served {} lookups from pinned experts; the replay pins nothing, so its counts differ from the runs'",
            recorded.0
        );
    }
    let knobs = replay::knobs::measure(&runs);
    if a.json {
        print_json(&runs, &outcomes, Setup { prefetch, pin }, recorded, knobs)?;
        return Ok(());
    }
    let tokens: u64 = runs.iter().map(|r| r.tokens).sum();
    let layers = runs[0]
        .layers
        .iter()
        .filter(|l| !l.fetches.is_empty())
        .count();
    println!(
        "{}: {} run(s), {tokens} tokens, {layers} MoE layers, {accesses} expert lookups; prefetch {}",
        a.trace.display(),
        runs.len(),
        prefetch.name()
    );
    if pin != Pin::None {
        println!(
            "pin {}: each run's first half is the usage history; counts are over the second halves",
            pin.name()
        );
    }
    println!(
        "recorded by the run(s): {} hits ({} pinned), {} misses",
        recorded.0 + recorded.1,
        recorded.0,
        recorded.2
    );
    let f = |x: Option<f64>| x.map_or("-".to_owned(), |x| format!("{x:.3}"));
    println!(
        "routing: top-10% experts' share {}, next-token reuse {}, lookahead recall@k attn {} output {}",
        f(knobs.top10_share),
        f(knobs.reuse),
        f(knobs.recall[0]),
        f(knobs.recall[1])
    );
    print!("{}", replay::report::table(&outcomes));
    println!(
        "read the trace in {read_s:.2} s; simulated {accesses} lookups x {sims} configurations in {sim_s:.2} s ({:.1} M lookups/s)",
        rate / 1e6
    );
    Ok(())
}

/// Refuses a lookahead of depth 2 on a trace that holds no guesses of its
/// variant from two layers back (a version-1 trace lacks the column).
fn check_deeper(
    runs: &[moestream::formats::trace::read::Run],
    from: usize,
    prefetch: &Prefetch,
    trace: &Path,
) -> Result<()> {
    let any = runs
        .iter()
        .flat_map(|r| &r.layers)
        .flat_map(|l| &l.fetches)
        .any(|f| f.deeper[from].is_some());
    if !any {
        bail!(
            "--prefetch {}: {} has no `{}` values (the guesses from two layers back; a version-1 trace lacks the column: record it again)",
            prefetch.name(),
            trace.display(),
            moestream::formats::trace::DEEPER_GUESSES[from]
        );
    }
    Ok(())
}

fn print_json(
    runs: &[moestream::formats::trace::read::Run],
    outcomes: &[replay::Outcome],
    setup: Setup,
    (pinned_hits, hits, misses): (u64, u64, u64),
    knobs: replay::knobs::Knobs,
) -> Result<()> {
    let rows: Vec<serde_json::Value> = outcomes
        .iter()
        .map(|o| {
            serde_json::json!({
                "policy": o.policy,
                "slots": o.slots,
                "hits": o.hits,
                "misses": o.misses,
                "demand_misses": o.demand_misses,
                "tokens": o.tokens,
                "misses_per_token": o.misses_per_token(),
                "bytes_per_token": o.bytes_per_token(),
                "prefetch_reads": o.prefetch_reads,
                "prefetch_wasted_bytes": o.prefetch_wasted_bytes,
                "pinned": o.pinned,
                "hit_rate": o.hit_rate(),
                "ratio_to_belady": o.ratio_to_belady,
                "switches": o.switches,
                "ended": o.ended,
            })
        })
        .collect();
    let v = serde_json::json!({
        "runs": runs.iter().map(|r| r.id.clone()).collect::<Vec<_>>(),
        "tokens": runs.iter().map(|r| r.tokens).sum::<u64>(),
        "prefetch": setup.prefetch.name(),
        "pin": setup.pin.name(),
        "recorded": {"hits": hits + pinned_hits, "pinned_hits": pinned_hits, "misses": misses},
        "routing": {
            "top10_share": knobs.top10_share,
            "reuse": knobs.reuse,
            "recall_attn": knobs.recall[0],
            "recall_output": knobs.recall[1],
        },
        "outcomes": rows,
    });
    println!("{}", serde_json::to_string(&v)?);
    Ok(())
}
