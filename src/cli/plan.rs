//! `moestream plan`: the RAM plan of a model under a budget, from headers
//! only (works on a partial download), with the smallest budget that runs
//! and a prediction of MB read per token and tok/s (`moestream::inspect::plan`).

use super::{with_flags, ModelArgs};
use anyhow::Result;
use clap::Args;
use moestream::inspect::plan::{self, gb_at_least, Plan, Prediction, Rates};
use moestream::model::LoadOptions;
use moestream::store::budget::human;

#[derive(Args)]
pub(super) struct PlanArgs {
    /// The model and the options `run` would load it with (`--ram-gb`,
    /// `--context`, `--io`, `--prefetch`, `--quantize-at-load` change the
    /// plan; the rest are accepted and ignored).
    #[command(flatten)]
    pub(super) model: ModelArgs,
    /// Seconds of the cold disk probe behind the prediction when the model
    /// has no tuned profile (0: no probe; the prediction is then left out).
    #[arg(long, default_value_t = 1.0, value_name = "SECONDS")]
    probe_seconds: f64,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Instead of the plan: for every `convert --recipe` of this
    /// checkpoint, the routed experts' bytes read per token (nothing
    /// cached), the resident weights and the smallest budget.
    #[arg(long)]
    recipes: bool,
}

/// One recipe's sizes, as `plan --recipes` prints them.
#[derive(serde::Serialize)]
struct RecipeRow {
    recipe: &'static str,
    about: &'static str,
    expert_bytes: u64,
    expert_bytes_per_token: u64,
    resident_bytes: u64,
    smallest_ram_gb: f64,
}

/// `plan --recipes`: each recipe planned as `--quantize-at-load` would
/// store it, which is what `convert --recipe` writes.
fn print_recipes(a: &PlanArgs, req: &moestream::engine::runtime::Requested) -> Result<()> {
    let dir = &a.model.model;
    let mut rows = Vec::new();
    for r in moestream::formats::quant::recipe::RECIPES {
        let mut req = req.clone();
        req.model.quantize_at_load = Some(r.policy());
        let opts = super::planning_options(Some(dir), &req);
        let p = plan::plan(dir, &opts).map_err(|e| refusal(e, dir, &opts))?;
        let e = &p.experts;
        rows.push(RecipeRow {
            recipe: r.name,
            about: r.about,
            expert_bytes: e.ram_bytes,
            expert_bytes_per_token: e.ram_bytes * (e.top_k * e.moe_layers) as u64,
            resident_bytes: p.resident_total_bytes,
            smallest_ram_gb: gb_at_least(p.smallest_budget_bytes),
        });
    }
    if a.json {
        println!("{}", serde_json::to_string(&rows)?);
        return Ok(());
    }
    println!("recipe    expert     per token  resident   smallest --ram-gb");
    for r in &rows {
        println!(
            "{:<9} {:<10} {:<10} {:<10} {:.2}  ({})",
            r.recipe,
            human(r.expert_bytes),
            human(r.expert_bytes_per_token),
            human(r.resident_bytes),
            r.smallest_ram_gb,
            r.about
        );
    }
    Ok(())
}

/// The plan and its prediction, as `--json` prints them.
#[derive(serde::Serialize)]
struct Output<'a> {
    #[serde(flatten)]
    plan: &'a Plan,
    smallest_ram_gb: f64,
    all_experts_ram_gb: f64,
    prediction: Option<Prediction>,
    /// Without --ram-gb: the machine's budget and whether --expert-cache
    /// fits in it (else a run is planned under it).
    machine: Option<super::Fit>,
    /// Why there is no prediction, when there is none.
    prediction_note: Option<String>,
}

pub(super) fn cmd_plan(a: PlanArgs) -> Result<()> {
    super::limits::seconds(
        "--probe-seconds",
        a.probe_seconds,
        super::limits::SECONDS_MAX,
    )?;
    let req = super::request(&a.model)?;
    let dir = &a.model.model;
    if a.recipes {
        let (index, _) = moestream::formats::weights::WeightIndex::open_headers(dir)?;
        anyhow::ensure!(
            !index.is_container(),
            "{} is a moestream container, quantized already: --recipes plans `convert` of a checkpoint",
            dir.display()
        );
        return print_recipes(&a, &req);
    }
    let opts = super::planning_options(Some(dir), &req);
    let plan = match plan::plan(dir, &opts) {
        Ok(p) => p,
        Err(e) => return Err(refusal(e, dir, &opts)),
    };
    let slots = plan
        .budget
        .as_ref()
        .map_or(a.model.expert_cache.min(plan.experts.per_layer), |b| {
            b.slots_per_layer
        });
    let (prediction, prediction_note) = match rates(&a, &plan) {
        Ok(r) => (Some(plan::predict(&plan, slots, &r)), None),
        Err(why) => (None, Some(why)),
    };
    let machine = match a.model.ram_gb {
        None => moestream::machine::memory::machine_budget()
            .and_then(|b| super::machine_fit(&a.model, &req, b)),
        Some(_) => None,
    };
    let out = Output {
        machine,
        plan: &plan,
        smallest_ram_gb: gb_at_least(plan.smallest_budget_bytes),
        all_experts_ram_gb: gb_at_least(plan.all_experts_budget_bytes),
        prediction,
        prediction_note,
    };
    if a.json {
        println!("{}", serde_json::to_string(&out)?);
    } else {
        print_text(&out, &a);
    }
    Ok(())
}

/// The error of loading (same words, same flag names: `plan` and `run`
/// share it); for a budget that does not fit, a hint with the smallest one
/// that does, first ([`plan::smallest_budget`], as `doctor` names it).
pub(super) fn refusal(
    e: moestream::Error,
    dir: &std::path::Path,
    opts: &LoadOptions,
) -> anyhow::Error {
    if matches!(e, moestream::Error::Budget(_)) {
        let unbudgeted = LoadOptions {
            ram_budget: None,
            ..opts.clone()
        };
        if let Ok(p) = plan::plan(dir, &unbudgeted) {
            eprintln!(
                "plan: the smallest budget that runs is --ram-gb {:.2}",
                gb_at_least(p.smallest_budget_bytes)
            );
        }
    }
    with_flags(e)
}

/// Disk and compute rates: the tuned profile's, else a probe's.
fn rates(a: &PlanArgs, plan: &Plan) -> std::result::Result<Rates, String> {
    let dir = &a.model.model;
    if let Ok(Some((path, profile))) = moestream::fs::tuned::load(dir) {
        if let Some(r) = plan::rates_from_profile(&profile, &path) {
            return Ok(r);
        }
    }
    if a.probe_seconds == 0.0 {
        return Err("no tuned profile, and --probe-seconds 0".into());
    }
    let files = moestream::inspect::disk::shard_files(dir).map_err(|e| e.to_string())?;
    let read_bytes = (plan.experts.disk_bytes as usize).max(4096);
    let mode = plan
        .read_mode
        .parse()
        .unwrap_or(moestream_io::ReadMode::Buffered);
    let depth = plan.experts.top_k.clamp(1, 4);
    let p = moestream::inspect::disk::probe(&files, read_bytes, mode, depth, a.probe_seconds)
        .map_err(|e| format!("disk probe: {e}"))?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mem = moestream::lab::bench::mem::read_bandwidth(256 << 20, threads, 3);
    Ok(Rates {
        disk_gb_per_s: p.gb_per_s,
        compute_s_per_token: None,
        mem_gb_per_s: Some(mem.median_gbs),
        source: format!(
            "a {:.1} s disk probe ({} reads of {}, {} at once: {:.2} GB/s) and memory at {:.1} GB/s; `moestream tune` measures better",
            p.seconds,
            p.read_mode,
            human(p.read_bytes as u64),
            p.depth,
            p.gb_per_s,
            mem.median_gbs
        ),
    })
}

fn print_text(o: &Output, a: &PlanArgs) {
    let p = o.plan;
    let d = &p.download;
    println!("model: {} ({})", p.model, p.family);
    println!(
        "on disk: {} of {} shards complete, {} of {}",
        d.complete_shards,
        d.shards,
        human(d.bytes_on_disk),
        human(d.bytes_total)
    );
    if !d.partial.is_empty() {
        println!(
            "  partial download: {} (the plan needs only headers; run needs every byte)",
            d.partial.join(", ")
        );
    }
    let classes: Vec<String> = p
        .resident_bytes
        .iter()
        .map(|(c, b)| format!("{c} {}", human(*b)))
        .collect();
    println!(
        "resident weights: {} ({})",
        human(p.resident_total_bytes),
        classes.join(", ")
    );
    let e = &p.experts;
    println!(
        "routed experts: {} per layer x {} MoE layers, top-{}; each {} in RAM, {} read from disk{}; {} on disk in all",
        e.per_layer,
        e.moe_layers,
        e.top_k,
        human(e.ram_bytes),
        human(e.disk_bytes),
        if e.zero_copy { " (decoded in place)" } else { "" },
        human(e.disk_total_bytes)
    );
    println!("KV cache: {} positions, {}", p.context, human(p.kv_bytes));
    if let Some(b) = &p.budget {
        print_placement(b, p, a);
    }
    println!(
        "smallest budget that runs: --ram-gb {:.2}; every expert in RAM from --ram-gb {:.2} (read mode {}, --context {})",
        o.smallest_ram_gb, o.all_experts_ram_gb, p.read_mode, p.context
    );
    if let Some(fit) = &o.machine {
        println!("without --ram-gb, {}", fit.line());
    }
    match (&o.prediction, &o.prediction_note) {
        (Some(x), _) => println!(
            "prediction: {:.1} MB read per token (hit rate {:.2} with uniform routing), disk {:.2} GB/s, compute {:.1} ms/token -> ~{:.2} tok/s, bound by {}\n  from {}",
            x.mb_read_per_token,
            x.hit_rate,
            x.disk_gb_per_s,
            x.compute_s_per_token * 1e3,
            x.tok_per_s,
            x.bottleneck,
            x.source
        ),
        (None, Some(why)) => println!("prediction: none ({why})"),
        (None, None) => {}
    }
}

fn print_placement(b: &moestream::inspect::plan::Placement, p: &Plan, a: &PlanArgs) {
    println!(
        "ram plan for --ram-gb {}:",
        a.model.budget_gb().map_or(String::new(), |g| g.to_string())
    );
    println!("  budget            {}", human(b.budget_bytes));
    println!("  resident weights  {}", human(p.resident_total_bytes));
    for (name, bytes) in &b.slack {
        println!("  slack: {name:<18} {}", human(*bytes));
    }
    println!(
        "  prefill pass      {} positions a pass ({} B held each, sub-chunks of {} rows x {} B)",
        b.prefill_pass_positions,
        b.prefill_pass_bytes_per_position,
        b.prefill_pass_sub_rows,
        b.prefill_pass_sub_bytes_per_row
    );
    println!(
        "  warm experts      {} = {} slots per layer x {} layers (of {} experts each)",
        human(b.warm_expert_bytes),
        b.slots_per_layer,
        p.experts.moe_layers,
        p.experts.per_layer
    );
    println!("  cold on disk      {}", human(b.cold_expert_bytes));
    println!("  VRAM tier         none (no GPU tier in this build)");
    println!("  projected peak    {}", human(b.projected_peak_bytes));
}
