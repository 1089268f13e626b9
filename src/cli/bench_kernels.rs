//! `moestream bench kernels`: the batched integer kernels against the
//! machine's integer peak, measured alternately in this process
//! (`moestream::lab::bench::kernels`).

use super::limits::{count, REPEATS_MAX};
use anyhow::{bail, Result};
use clap::Args;
use moestream::kernels::int8::PeakOp;
use moestream::lab::bench::kernels::{self, KernelBenchConfig, KernelFormat};

#[derive(Args)]
pub(super) struct KernelsArgs {
    /// Weight formats: int4, int8, GGUF types (q4_0, q8_0, q4_k, q5_k, q6_k, q3_k, q2_k,
    /// q5_0, q5_1, iq4_nl, iq4_xs) and grouped formats (q4g64, q4g32a, q3g64, ...).
    #[arg(long, value_delimiter = ',', default_value = "int4,int8")]
    formats: Vec<String>,
    /// Matrix shapes, ROWSxCOLS (Qwen3-30B-A3B expert gate/up and down,
    /// and a GLM-5-sized one).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "768x2048,2048x768,2048x6144"
    )]
    shapes: Vec<String>,
    /// Activation rows a call.
    #[arg(long, value_delimiter = ',', default_value = "32,64,128,256")]
    batch: Vec<usize>,
    /// Alternating repetitions (peak, then kernel) a row.
    #[arg(long, default_value_t = 7)]
    reps: usize,
    /// MiB of distinct matrices each row cycles through.
    #[arg(long, default_value_t = 64)]
    working_set_mib: usize,
    /// Also run int8/int4 on the 4×4 register tiles (the kernel before the
    /// panels) and Q4_0 and the K types on the per-row dots (before the
    /// repacked tiles and panels), alternating with the default one.
    #[arg(long)]
    compare_tiles: bool,
    /// Run kernels and peak on one thread, timed by its CPU time (robust
    /// to other work on a shared machine), instead of on every kernel
    /// thread by the wall clock.
    #[arg(long)]
    one_thread: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// Largest matrix side and batch the command accepts.
const SIDE_MAX: usize = 1 << 16;
/// Largest working set, MiB.
const WORKING_SET_MIB_MAX: usize = 4096;

pub(super) fn cmd_bench_kernels(a: KernelsArgs) -> Result<()> {
    count("--reps", a.reps, 1..=REPEATS_MAX)?;
    count(
        "--working-set-mib",
        a.working_set_mib,
        1..=WORKING_SET_MIB_MAX,
    )?;
    for &n in &a.batch {
        count("--batch", n, 1..=SIDE_MAX)?;
    }
    let formats = a
        .formats
        .iter()
        .map(|f| {
            KernelFormat::parse(f).ok_or_else(|| anyhow::anyhow!("--formats: unknown format {f:?}"))
        })
        .collect::<Result<Vec<_>>>()?;
    let shapes = a
        .shapes
        .iter()
        .map(|s| parse_shape(s.as_str()))
        .collect::<Result<Vec<_>>>()?;
    let Some(op) = PeakOp::detect() else {
        bail!("bench kernels: this CPU has neither AVX-512 VNNI nor AVX2");
    };
    let cfg = KernelBenchConfig {
        formats,
        shapes,
        batches: a.batch.clone(),
        reps: a.reps,
        working_set_bytes: a.working_set_mib << 20,
        compare_tiles: a.compare_tiles,
        one_thread: a.one_thread,
    };
    let peak = kernels::peak(op, a.reps);
    // The AMX tiles' own peak, beside the VNNI one the rows are stated against.
    let tiles_peak = moestream::kernels::cpu::amx().then(|| kernels::peak(PeakOp::Amx, a.reps));
    let rows = kernels::run(&cfg, op);
    let threads = if a.one_thread {
        "1 thread, CPU time"
    } else {
        "all threads, wall clock"
    };
    let peak_after = kernels::peak(op, a.reps);
    let m = Measured {
        op,
        reps: a.reps,
        timing: threads,
        peak,
        peak_after,
        tiles_peak,
        rows,
    };
    if a.json {
        print_json(&m);
    } else {
        print_table(&m);
    }
    Ok(())
}

/// What one `bench kernels` run measured.
struct Measured {
    op: PeakOp,
    reps: usize,
    /// How the rows ran and were timed.
    timing: &'static str,
    peak: kernels::PeakReport,
    peak_after: kernels::PeakReport,
    /// The AMX-INT8 peak, where the int8/int4 rows run on the AMX tiles.
    tiles_peak: Option<kernels::PeakReport>,
    rows: Vec<kernels::KernelRow>,
}

/// One JSON object.
fn print_json(m: &Measured) {
    let rows: Vec<_> = m
        .rows
        .iter()
        .map(|r| {
            serde_json::json!({"format": r.format, "rows": r.rows, "cols": r.cols, "n": r.n,
                "gmacs": r.gmacs, "peak_gmacs": r.peak_gmacs,
                "of_peak_median": r.of_peak_median(), "of_peak": r.of_peak})
        })
        .collect();
    let p = |p: &kernels::PeakReport| {
        serde_json::json!({"one_thread_gmacs": p.one_thread_gmacs,
            "all_threads_gmacs": p.all_threads_gmacs})
    };
    println!(
        "{}",
        serde_json::json!({"peak_op": m.op.name(), "threads": m.peak.threads, "reps": m.reps,
            "rows_timing": m.timing,
            "peak_before": p(&m.peak), "peak_after": p(&m.peak_after),
            "amx_peak": m.tiles_peak.as_ref().map(p),
            "batch_kernel": {
                "int8": batch_default(moestream::kernels::BatchFormat::Int8),
                "int4": batch_default(moestream::kernels::BatchFormat::Int4)}, "rows": rows})
    );
}

/// The peak line and a Markdown table.
fn print_table(m: &Measured) {
    let (peak, peak_after) = (&m.peak, &m.peak_after);
    println!(
        "integer peak ({}): {:.1} GMAC/s on 1 thread, {:.1} GMAC/s on {} threads (after the rows: {:.1}, {:.1})",
        m.op.name(),
        peak.one_thread_gmacs,
        peak.all_threads_gmacs,
        peak.threads,
        peak_after.one_thread_gmacs,
        peak_after.all_threads_gmacs
    );
    if let Some(t) = &m.tiles_peak {
        println!(
            "AMX peak ({}): {:.1} GMAC/s on 1 thread, {:.1} GMAC/s on {} threads (int8/int4 rows run on the AMX tiles; \"of peak\" is of the line above)",
            t.op.name(),
            t.one_thread_gmacs,
            t.all_threads_gmacs,
            t.threads
        );
    }
    println!(
        "batches of {}+ rows by default: int8 {}, int4 {} (measured at first use)",
        moestream::kernels::PANEL_ACTS_MIN,
        batch_default(moestream::kernels::BatchFormat::Int8),
        batch_default(moestream::kernels::BatchFormat::Int4)
    );
    println!("rows: {}, {} reps, medians", m.timing, m.reps);
    println!("| format | shape | n | GMAC/s | Gop/s | peak GMAC/s | of peak (median) | range |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for r in &m.rows {
        let (lo, hi) = r
            .of_peak
            .iter()
            .fold((f64::MAX, 0f64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        println!(
            "| {} | {}x{} | {} | {:.1} | {:.1} | {:.1} | {:.0}% | {:.0}–{:.0}% |",
            r.format,
            r.rows,
            r.cols,
            r.n,
            r.gmacs,
            2.0 * r.gmacs,
            r.peak_gmacs,
            100.0 * r.of_peak_median(),
            100.0 * lo,
            100.0 * hi
        );
    }
}

/// `ROWSxCOLS`, each side in 1..=[`SIDE_MAX`].
fn parse_shape(s: &str) -> Result<(usize, usize)> {
    let side = |v: &str| {
        v.parse::<usize>()
            .ok()
            .filter(|v| (1..=SIDE_MAX).contains(v))
    };
    match s.split_once('x').map(|(r, c)| (side(r), side(c))) {
        Some((Some(r), Some(c))) => Ok((r, c)),
        _ => bail!("--shapes: {s:?} is not ROWSxCOLS with sides in 1..={SIDE_MAX}"),
    }
}

/// What the default runs format `f`'s batches on, in words.
fn batch_default(f: moestream::kernels::BatchFormat) -> String {
    use moestream::kernels::{cpu, measured_panels_from};
    if cpu::amx() {
        return "AMX tiles".into();
    }
    match measured_panels_from(f) {
        Some(from) => format!("register tiles below {from} rows, panels from {from}"),
        None => "register tiles".into(),
    }
}
