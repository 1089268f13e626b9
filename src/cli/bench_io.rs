//! `moestream bench io`: the raw disk sweep. Owns the command's arguments,
//! finding the files (every `*.safetensors` of a model directory, or the
//! files named), the table printed as cells finish, a best-per-mode
//! summary, and writing the CSV and SVG. The measurement itself is
//! `moestream_io::sweep` (no model knowledge there).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use clap::Args;
use moestream_io::{sweep, sweep_svg, write_csv, Reactor, ReadMode, SweepConfig, SweepRow};

#[derive(Args)]
pub(super) struct IoBenchArgs {
    /// Model directory: reads land in every *.safetensors file in it,
    /// weighted by size.
    #[arg(
        long,
        value_name = "DIR",
        required_unless_present = "file",
        conflicts_with = "file"
    )]
    model: Option<PathBuf>,
    /// A file to read instead of a model (repeatable).
    #[arg(long, value_name = "F")]
    file: Vec<PathBuf>,
    /// Read modes, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "direct,buffered,drop,mmap,pread"
    )]
    modes: Vec<ReadMode>,
    /// Block sizes in MiB, comma-separated (fractions allowed: 0.25 = 256 KiB).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    sizes_mib: Vec<f64>,
    /// Queue depths, comma-separated: reads in flight through one io_uring
    /// (direct, buffered), or reader threads (drop, mmap, pread, and any
    /// mode without io_uring).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    depths: Vec<usize>,
    /// Seconds per cell (at least `depth` reads are made).
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// At most this many reads per cell.
    #[arg(long, value_name = "N")]
    reads_max: Option<u64>,
    /// Seed of the random offsets (each cell derives its own).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the table as CSV (the file is replaced).
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// Write a plot of GB/s against block size, one panel per depth.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
}

pub(super) fn cmd_bench_io(a: IoBenchArgs) -> Result<()> {
    let files = match &a.model {
        Some(dir) => model_files(dir)?,
        None => a.file.clone(),
    };
    let outputs: Vec<&Path> = a.csv.iter().chain(&a.svg).map(PathBuf::as_path).collect();
    let inputs: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    moestream::fs::check_not_input(&outputs, &inputs).context("--csv/--svg")?;
    let cfg = config(&a)?;
    let total: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()))
        .collect::<std::io::Result<Vec<_>>>()
        .map(|lens| lens.iter().sum())
        .unwrap_or(0);
    let cells = cfg.modes.len() * cfg.read_sizes.len() * cfg.depths.len();
    eprintln!(
        "bench io: {} file(s), {:.2} GB; {cells} cells of {:.2} s each, page cache dropped before every cell",
        files.len(),
        total as f64 / 1e9,
        cfg.cell_time.as_secs_f64()
    );
    if let Err(e) = Reactor::probe() {
        eprintln!("note: {e}; direct and buffered cells use depth threads (engine \"threads\")");
    }
    let mut first = true;
    let rows = sweep(&files, &cfg, |row| {
        if std::mem::take(&mut first) {
            println!("{}", header());
        }
        println!("{}", table_row(row));
    })
    .with_context(|| format!("disk sweep over {}", describe(&a, &files)))?;
    print!("{}", summary(&rows));
    if let Some(path) = &a.csv {
        let mut out = moestream::fs::Output::create(path)?;
        write_csv(&rows, &mut out).with_context(|| format!("writing {}", path.display()))?;
        out.finish()?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &a.svg {
        let title = format!(
            "moestream bench io: {} (cold cells, {:.2} s each)",
            describe(&a, &files),
            cfg.cell_time.as_secs_f64()
        );
        moestream::fs::write(path, sweep_svg(&rows, &title).as_bytes())?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// Every `*.safetensors` file of `dir`, sorted.
fn model_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for ent in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = ent
            .with_context(|| format!("reading {}", dir.display()))?
            .path();
        if path.extension().is_some_and(|e| e == "safetensors") && path.is_file() {
            files.push(path);
        }
    }
    ensure!(
        !files.is_empty(),
        "no *.safetensors files in {}",
        dir.display()
    );
    files.sort();
    Ok(files)
}

fn config(a: &IoBenchArgs) -> Result<SweepConfig> {
    ensure!(!a.modes.is_empty(), "--modes lists no mode");
    ensure!(!a.depths.is_empty(), "--depths lists no depth");
    if let Some(d) = a
        .depths
        .iter()
        .find(|&&d| d == 0 || d > moestream_io::SWEEP_DEPTH_MAX)
    {
        bail!(
            "--depths: {d} is outside 1..={}",
            moestream_io::SWEEP_DEPTH_MAX
        );
    }
    ensure!(!a.sizes_mib.is_empty(), "--sizes-mib lists no size");
    let mut read_sizes = Vec::with_capacity(a.sizes_mib.len());
    for &mib in &a.sizes_mib {
        let bytes = mib * (1u64 << 20) as f64;
        ensure!(
            bytes.is_finite() && bytes >= 1.0 && bytes <= (1u64 << 40) as f64,
            "--sizes-mib: {mib} is not a block size (1 byte to 1 TiB)"
        );
        read_sizes.push(bytes.round() as usize);
    }
    let cell_time = Duration::try_from_secs_f64(a.seconds)
        .ok()
        .filter(|_| a.seconds.is_finite())
        .with_context(|| format!("--seconds: {} is not a duration", a.seconds))?;
    Ok(SweepConfig {
        modes: a.modes.clone(),
        read_sizes,
        depths: a.depths.clone(),
        cell_time,
        reads_max: a.reads_max,
        seed: a.seed,
    })
}

/// The model directory, or the file names, for messages and the plot title.
fn describe(a: &IoBenchArgs, files: &[PathBuf]) -> String {
    match &a.model {
        Some(dir) => format!("{} ({} files)", dir.display(), files.len()),
        None => files
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    }
}

fn header() -> String {
    format!(
        "{:<16} {:<8} {:>9} {:>5} {:>7} {:>8} {:>10} {:>10} {:>10} {:>10}",
        "mode",
        "engine",
        "block MiB",
        "depth",
        "reads",
        "GB/s",
        "p50 µs",
        "p99 µs",
        "device MB",
        "engine MB"
    )
}

fn table_row(r: &SweepRow) -> String {
    let device = r
        .device_bytes
        .map_or("-".to_owned(), |b| format!("{:.1}", b as f64 / 1e6));
    format!(
        "{:<16} {:<8} {:>9} {:>5} {:>7} {:>8.3} {:>10.0} {:>10.0} {:>10} {:>10.1}",
        r.mode_label(),
        r.engine.name(),
        mib(r.read_bytes),
        r.depth,
        r.reads,
        r.gb_per_s,
        r.latency_us_p50,
        r.latency_us_p99,
        device,
        r.engine_bytes as f64 / 1e6
    )
}

/// Best GB/s per mode, with its block size and depth.
fn summary(rows: &[SweepRow]) -> String {
    let mut out = String::from("best per mode:\n");
    let mut seen: Vec<String> = Vec::new();
    for r in rows {
        let label = r.mode_label();
        if seen.contains(&label) {
            continue;
        }
        let best = rows
            .iter()
            .filter(|x| x.mode_label() == label)
            .max_by(|x, y| x.gb_per_s.total_cmp(&y.gb_per_s))
            .expect("the row itself");
        let _ = writeln!(
            out,
            "  {label:<16} {:.3} GB/s at {} MiB, depth {} ({})",
            best.gb_per_s,
            mib(best.read_bytes),
            best.depth,
            best.engine
        );
        seen.push(label);
    }
    out
}

/// Bytes as MiB, without trailing zeros: `16`, `0.25`.
fn mib(bytes: usize) -> String {
    let s = format!("{:.4}", bytes as f64 / (1u64 << 20) as f64);
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}
