//! `moestream doctor` and `moestream status` (`moestream::inspect::doctor`,
//! `moestream::inspect::status`): readiness checks with a fix for each problem, and
//! a one-screen summary of the model and the machine.

use anyhow::Result;
use clap::Args;
use moestream::engine::runtime::Requested;
use moestream::inspect::doctor::{self, Status};
use moestream::model::LoadOptions;
use moestream::store::budget::human;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub(super) struct DoctorArgs {
    /// Model directory (or hub id `org/name`) to check as well as the
    /// machine.
    #[arg(long)]
    model: Option<PathBuf>,
    /// With a hub id: the branch, tag or commit of the snapshot.
    #[arg(long, default_value = "main")]
    revision: String,
    /// The RAM budget to check (GB, 10^9 bytes) against the model and the
    /// memory cgroup limit; without it, the smallest budget that runs.
    #[arg(long, value_name = "GB")]
    ram_gb: Option<f64>,
    /// Context positions the budget reserves KV cache for.
    #[arg(long, default_value_t = super::CONTEXT_DEFAULT)]
    context: usize,
    /// Seconds of the cold disk probe over the model's shards (0 skips it).
    #[arg(long, default_value_t = 3.0, value_name = "SECONDS")]
    probe_seconds: f64,
    /// Exit 1 on warnings too, not only on failures.
    #[arg(long)]
    strict: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub(super) struct StatusArgs {
    /// Model directory (or hub id `org/name`) to summarize.
    #[arg(long)]
    model: Option<PathBuf>,
    /// With a hub id: the branch, tag or commit of the snapshot.
    #[arg(long, default_value = "main")]
    revision: String,
    /// Probe the disk for this many seconds when no tuned profile gives
    /// its bandwidth (0: do not).
    #[arg(long, default_value_t = 0.0, value_name = "SECONDS")]
    probe_seconds: f64,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

fn seconds(s: f64) -> Result<f64> {
    super::limits::seconds("--probe-seconds", s, super::limits::SECONDS_MAX)
}

/// A hub id resolved to its snapshot; a path as given.
fn model_dir(model: &Option<PathBuf>, revision: &str) -> Result<Option<PathBuf>> {
    Ok(match model {
        Some(m) => Some(moestream::formats::hub::resolve(m, Some(revision))?),
        None => None,
    })
}

/// The options a run would load with: the budget and context asked for,
/// the read mode, pipelining and prefetch as `--io auto` resolves them.
fn load_options(a: &DoctorArgs, dir: Option<&std::path::Path>) -> Result<LoadOptions> {
    let ram_budget = match a.ram_gb {
        Some(gb) if !(gb > 0.0 && gb.is_finite()) => {
            anyhow::bail!("--ram-gb {gb}: must be positive")
        }
        Some(gb) => Some((gb * 1e9) as u64),
        None => None,
    };
    let mut req = Requested::default();
    req.store.ram_budget = ram_budget;
    req.model.context = a.context;
    Ok(super::planning_options(dir, &req))
}

pub(super) fn cmd_doctor(a: DoctorArgs) -> Result<ExitCode> {
    let probe_seconds = seconds(a.probe_seconds)?;
    let dir = model_dir(&a.model, &a.revision)?;
    let opts = doctor::Options {
        load: load_options(&a, dir.as_deref())?,
        model: dir,
        probe_seconds,
    };
    let checks = doctor::run(&opts);
    let worst = checks.iter().map(|c| c.status).max().unwrap_or(Status::Ok);
    let failed = worst == Status::Fail || (a.strict && worst == Status::Warn);
    if a.json {
        println!(
            "{}",
            serde_json::json!({"ok": !failed, "worst": worst, "checks": checks})
        );
    } else {
        for c in &checks {
            let tag = match c.status {
                Status::Ok => "ok  ",
                Status::Warn => "warn",
                Status::Fail => "FAIL",
            };
            println!("{tag}  {:<22} {}", c.name, c.detail);
            if let Some(fix) = &c.fix {
                println!("      {:<22} fix: {fix}", "");
            }
        }
        let count = |s: Status| checks.iter().filter(|c| c.status == s).count();
        println!(
            "{} ok, {} warnings, {} failures",
            count(Status::Ok),
            count(Status::Warn),
            count(Status::Fail)
        );
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// `status`; `settings` are the ones from outside the command line
/// (`MOESTREAM_<FLAG>` variables, the `--config` file's keys).
pub(super) fn cmd_status(a: StatusArgs, settings: Vec<String>) -> Result<()> {
    let probe_seconds = seconds(a.probe_seconds)?;
    let dir = model_dir(&a.model, &a.revision)?;
    let s = moestream::inspect::status::gather(dir.as_deref(), probe_seconds)?;
    if a.json {
        let mut v = serde_json::to_value(&s)?;
        v["settings"] = serde_json::json!(settings);
        println!("{v}");
        return Ok(());
    }
    match settings.is_empty() {
        true => println!("settings none from MOESTREAM_<FLAG> variables or a --config file"),
        false => println!("settings {}", settings.join("; ")),
    }
    let opt = |b: Option<u64>| b.map_or("unknown".to_string(), human);
    if let Some(m) = &s.model {
        println!("model    {} ({})", m.dir, m.family);
        println!(
            "         {} layers, {} experts per MoE layer, top-{}; {} on disk{}",
            m.layers,
            m.experts,
            m.top_k,
            human(m.disk_bytes),
            if m.complete {
                ""
            } else {
                " (partial download)"
            }
        );
        println!(
            "         resident {}; each expert {} in RAM, {} on disk; experts {} in all",
            human(m.resident_bytes),
            human(m.expert_ram_bytes),
            human(m.expert_disk_bytes),
            human(m.experts_disk_bytes)
        );
        match &m.tuned {
            Some(t) => println!(
                "tuned    --io {} --pipeline {} --prefetch {}{} ({})",
                t.read_mode,
                if t.pipeline { "on" } else { "off" },
                t.prefetch,
                t.decode_tok_s
                    .map_or(String::new(), |x| format!(", best decode {x:.2} tok/s")),
                t.path
            ),
            None => println!("tuned    no profile for this disk (`moestream tune --model DIR`)"),
        }
    }
    let mc = &s.machine;
    println!(
        "machine  {} cores, RAM {} ({} available), cgroup limit {}, kernels {}",
        mc.cores,
        opt(mc.ram_bytes),
        opt(mc.available_bytes),
        mc.cgroup_limit_bytes.map_or("none".to_string(), human),
        mc.kernels
    );
    if let Some(d) = &mc.disk {
        println!(
            "disk     {}{}, read_ahead_kb {}, {} free, {}",
            d.device,
            match d.rotational {
                Some(true) => " (rotational)",
                Some(false) => " (solid state)",
                None => "",
            },
            d.read_ahead_kb
                .map_or("unknown".to_string(), |k| k.to_string()),
            opt(d.free_bytes),
            match (&d.gb_per_s, &d.measured_by) {
                (Some(g), Some(by)) => format!("{g:.2} GB/s ({by})"),
                _ => "bandwidth not measured (`moestream tune`, or --probe-seconds 3)".into(),
            }
        );
    }
    Ok(())
}
