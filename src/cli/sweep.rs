//! `moestream bench sweep`: cold decode at each RAM budget (and read
//! mode), each run a fresh `moestream run --json` inside a memory cgroup
//! capped at its budget when one can be made, the model's files dropped
//! from the page cache first; then a CSV and a plot of tok/s and MB/token
//! against the budget (`moestream::lab::budget_sweep`).

use super::progress::{bar, Unit};
use anyhow::{Context, Result};
use clap::Args;
use moestream::lab::budget_sweep::{self, Outcome, SweepRow};
use moestream::machine::cgroup::MemoryGroup;
use moestream_io::ReadMode;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub(super) struct SweepArgs {
    /// Model directory, or a Hugging Face id (`org/name`) in the hub cache.
    #[arg(long)]
    pub(super) model: PathBuf,
    /// With a hub id: the branch, tag or commit of the snapshot.
    #[arg(long, default_value = "main")]
    pub(super) revision: String,
    /// RAM budgets in GB (10^9 bytes), comma-separated; each run's memory
    /// cgroup is capped at its budget.
    #[arg(long, value_delimiter = ',', required = true, value_name = "GB,...")]
    ram_gb: Vec<f64>,
    /// Read modes, comma-separated (auto, direct, buffered, drop, mmap,
    /// pread): one line each in the plot.
    #[arg(long = "io", value_delimiter = ',', default_value = "auto")]
    io: Vec<String>,
    /// Tokens each run generates (greedy, EOS ignored).
    #[arg(long, default_value_t = 16)]
    tokens: usize,
    /// Prompt token ids, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "101,102,103,104,105,106,107,108"
    )]
    prompt_ids: Vec<u32>,
    /// Context positions each run's plan reserves KV cache for.
    #[arg(long, default_value_t = 4096)]
    context: usize,
    /// Rounds over every (mode, budget); the plot takes medians.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Output prefix: writes PREFIX.csv, PREFIX.svg and PREFIX.png.
    #[arg(long, default_value = "budget-sweep", value_name = "PREFIX")]
    out: PathBuf,
    /// Run without memory cgroups (rows say `cgroup` = none).
    #[arg(long)]
    no_cgroup: bool,
}

/// Whether runs go into cgroups, and why not when they do not.
enum Capping {
    On,
    Off(String),
}

pub(super) fn cmd_bench_sweep(a: SweepArgs) -> Result<()> {
    check(&a)?;
    let outputs = ["csv", "svg", "png"].map(|ext| output(&a, ext));
    let outputs: Vec<&Path> = outputs.iter().map(PathBuf::as_path).collect();
    moestream::fs::check_not_input(&outputs, &[&a.model]).context("--out")?;
    let exe = std::env::current_exe().context("finding the moestream binary")?;
    let files = moestream::inspect::disk::shard_files(&a.model)?;
    let mut capping = if a.no_cgroup {
        Capping::Off("--no-cgroup".into())
    } else {
        Capping::On
    };
    let total = (a.rounds * a.io.len() * a.ram_gb.len()) as u64;
    let progress = bar(total, "bench sweep", Unit::Count("runs"));
    let mut rows = Vec::new();
    for round in 1..=a.rounds {
        for mode in &a.io {
            for &gb in &a.ram_gb {
                moestream_io::drop_page_cache(&files)?;
                let row = run_one(&a, &exe, (round, mode, gb), &mut capping)?;
                progress.suspend(|| print_row(&row));
                rows.push(row);
                progress.inc(1);
            }
        }
    }
    progress.finish_and_clear();
    write_outputs(&a, &rows)
}

fn check(a: &SweepArgs) -> Result<()> {
    anyhow::ensure!(a.rounds >= 1, "--rounds must be at least 1");
    anyhow::ensure!(
        a.tokens >= 2,
        "--tokens must be at least 2 (one decode step)"
    );
    anyhow::ensure!(!a.prompt_ids.is_empty(), "--prompt-ids is empty");
    for &gb in &a.ram_gb {
        anyhow::ensure!(
            gb > 0.0 && gb.is_finite(),
            "--ram-gb {gb}: must be positive"
        );
    }
    for m in &a.io {
        anyhow::ensure!(
            m == "auto" || m.parse::<ReadMode>().is_ok(),
            "--io {m}: expected auto, direct, buffered, drop, mmap or pread"
        );
    }
    Ok(())
}

/// The `run` arguments of one point.
fn run_args(a: &SweepArgs, mode: &str, gb: f64) -> Vec<String> {
    let ids: Vec<String> = a.prompt_ids.iter().map(u32::to_string).collect();
    [
        "run",
        "--model",
        &a.model.display().to_string(),
        "--prompt-ids",
        &ids.join(","),
        "--max-tokens",
        &a.tokens.to_string(),
        "--ignore-eos",
        "--temperature",
        "0",
        "--no-history",
        "--ram-gb",
        &gb.to_string(),
        "--io",
        mode,
        "--context",
        &a.context.to_string(),
        "--json",
    ]
    .map(String::from)
    .to_vec()
}

/// One cold run at `gb`, in a fresh cgroup while they can be made.
fn run_one(
    a: &SweepArgs,
    exe: &Path,
    (round, mode, gb): (usize, &str, f64),
    capping: &mut Capping,
) -> Result<SweepRow> {
    let args = run_args(a, mode, gb);
    let group = match capping {
        Capping::On => {
            let name = format!("moestream-sweep-{}-{round}-{mode}-{gb}", std::process::id());
            match MemoryGroup::create(&name, (gb * 1e9) as u64) {
                Ok(g) => Some(g),
                Err(e) => {
                    let why = format!("no memory cgroup ({e}): running without one");
                    eprintln!("bench sweep: {why}; rows are flagged cgroup=none");
                    *capping = Capping::Off(why);
                    None
                }
            }
        }
        Capping::Off(_) => None,
    };
    let mut cmd = match &group {
        Some(g) => g.command(exe, &args),
        None => {
            let mut c = std::process::Command::new(exe);
            c.args(&args);
            c
        }
    };
    let out = cmd
        .output()
        .with_context(|| format!("running {}", exe.display()))?;
    let mut row = SweepRow::new(
        round,
        mode,
        gb,
        if group.is_some() { "capped" } else { "none" },
    );
    if let Capping::Off(why) = capping {
        row.note = why.clone();
    }
    if let Some(g) = &group {
        row.cgroup_peak_mib = g
            .peak_bytes()
            .map(|b| (b as f64 / (1u64 << 20) as f64).round());
        row.oom_kills = g.oom_kills();
    }
    Ok(finish(row, &out))
}

/// The row of a finished child: its JSON, or why it has none.
fn finish(mut row: SweepRow, out: &std::process::Output) -> SweepRow {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last_error = stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| stderr.lines().last().unwrap_or(""))
        .to_string();
    if out.status.success() {
        let stdout = String::from_utf8_lossy(&out.stdout);
        match serde_json::from_str::<serde_json::Value>(stdout.trim()) {
            Ok(v) => return row.from_run(&v),
            Err(e) => row.note = format!("run --json printed no JSON object: {e}"),
        }
    } else if last_error.contains("--ram-gb") && last_error.contains("too small") {
        row.outcome = Outcome::Refused;
        row.note = last_error;
    } else if row.oom_kills.is_some_and(|k| k > 0) || killed_by_sigkill(out) {
        row.outcome = Outcome::Oom;
        row.note = "killed (out of memory under the cgroup cap)".into();
    } else {
        row.note = last_error;
    }
    row
}

fn killed_by_sigkill(out: &std::process::Output) -> bool {
    use std::os::unix::process::ExitStatusExt;
    out.status.signal() == Some(9) || out.status.code() == Some(137)
}

fn print_row(r: &SweepRow) {
    let f = |x: Option<f64>| x.map_or("-".to_string(), |v| v.to_string());
    println!(
        "round {} io {} ram_gb {}: {:?}, cgroup {}, slots {}, decode {} tok/s, {} MB/token, hit {}{}",
        r.round,
        r.read_mode,
        r.ram_gb,
        r.outcome,
        r.cgroup,
        r.slots.map_or("-".to_string(), |s| s.to_string()),
        f(r.decode_tok_s),
        f(r.mb_per_token),
        f(r.hit_rate),
        if r.outcome == Outcome::Ok || r.note.is_empty() {
            String::new()
        } else {
            format!(" ({})", r.note)
        }
    );
}

/// PREFIX.EXT.
fn output(a: &SweepArgs, ext: &str) -> PathBuf {
    let mut p = a.out.clone().into_os_string();
    p.push(format!(".{ext}"));
    PathBuf::from(p)
}

/// PREFIX.csv, PREFIX.svg and PREFIX.png.
fn write_outputs(a: &SweepArgs, rows: &[SweepRow]) -> Result<()> {
    let with = |ext: &str| output(a, ext);
    if let Some(parent) = a.out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    let csv = with("csv");
    budget_sweep::write_csv(rows, &csv).with_context(|| format!("writing {}", csv.display()))?;
    println!("wrote {}", csv.display());
    let name = a
        .model
        .file_name()
        .map_or("model".into(), |n| n.to_string_lossy().into_owned());
    let title = format!(
        "{name}: cold decode against the RAM budget ({} tokens)",
        a.tokens
    );
    let (svg, png) = (with("svg"), with("png"));
    match budget_sweep::write_plots(rows, &title, &svg, &png) {
        Ok(()) => println!("wrote {} and {}", svg.display(), png.display()),
        Err(e) => eprintln!("warning: no plot: {e}"),
    }
    Ok(())
}
