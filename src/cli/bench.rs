//! `moestream bench decode` and `moestream bench mem`.

use super::*;

#[derive(Args)]
pub(super) struct DecodeArgs {
    #[command(flatten)]
    pub(super) model: ModelArgs,
    /// Tokens to decode (greedy, EOS ignored).
    #[arg(short = 'n', long, visible_aliases = ["max-tokens", "n-predict"], default_value_t = 32)]
    tokens: usize,
    /// Prompt text.
    #[arg(
        short = 'p',
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
pub(super) struct MemArgs {
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

pub(super) fn cmd_bench_mem(a: MemArgs) -> Result<()> {
    let threads = match a.threads {
        Some(t) => check_threads(t)?,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    super::limits::count("--reps", a.reps, 1..=super::limits::REPEATS_MAX)?;
    let ram_mib = moestream::model::profile::mem_total_bytes().unwrap_or(u64::MAX) >> 20;
    if a.mib == 0 || a.mib as u64 > ram_mib / 2 {
        anyhow::bail!(
            "--mib {} is outside 1..={} (half of this machine's RAM)",
            a.mib,
            ram_mib / 2
        );
    }
    let r = moestream::lab::bench::mem::read_bandwidth(a.mib << 20, threads, a.reps);
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

/// The read services' thread names (io/src/service.rs, read_service.rs).
const IO_THREADS: [&str; 2] = ["moestream-io", "moestream-read"];

/// CPU seconds so far of the read services' threads.
fn io_cpu_seconds() -> f64 {
    IO_THREADS
        .iter()
        .map(|t| moestream::model::profile::thread_cpu_seconds(t))
        .sum()
}

pub(super) fn cmd_bench_decode(mut a: DecodeArgs) -> Result<()> {
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
        ignore_eos: true,
        ..GenOptions::default()
    };
    if a.warmup {
        // Warm means every buffer the cache will hold is in place: a gated
        // cache grows only as fast as they are faulted in.
        moestream_io::shared_pool().wait_warmed(std::time::Duration::from_secs(600));
        generate(&model, &prompt, &opts, |_| Ok(())).map_err(with_flags)?;
    }
    let io_cpu_before = io_cpu_seconds();
    let g = generate(&model, &prompt, &opts, |_| Ok(())).map_err(with_flags)?;
    let io_cpu_s = io_cpu_seconds() - io_cpu_before;
    let s = &g.stats;
    let n = s.tokens.max(1) as f64;
    let decode_s = s.seconds - s.prefill_seconds;
    let steps = s.decode_steps.max(1) as f64;
    let round = |x: f64, places: i32| {
        let f = 10f64.powi(places);
        (x * f).round() / f
    };
    let row = DecodeRow {
        model: a.model.model.display().to_string(),
        read_mode: read_mode_of(&model).to_string(),
        submit: format!("{:?}", a.model.submit).to_lowercase(),
        pipeline: model.store.schedule.pipeline,
        prefetch: lookahead_name(model.store.schedule.lookahead),
        ram_gb: a.model.budget_gb(),
        slots: model
            .plan
            .as_ref()
            .map_or(a.model.expert_cache, |p| p.slots_per_layer),
        cold: a.cold,
        tokens: s.tokens,
        load_s: round(load_s, 2),
        prefill_s: round(s.prefill_seconds, 3),
        decode_tok_s: round(s.tokens.saturating_sub(1) as f64 / decode_s.max(1e-9), 3),
        tok_s: round(s.tok_per_s, 3),
        hit_rate: round(s.expert_hit_rate, 3),
        read_mb_per_tok: round(s.expert_bytes_read as f64 / n / 1e6, 2),
        device_mb_per_tok: round(s.device_bytes_read as f64 / n / 1e6, 2),
        lat_mean_ms: round(s.read_latency_mean_us / 1e3, 2),
        lat_p99_ms: round(s.read_latency_p99_us as f64 / 1e3, 2),
        peak_rss_mib: round(s.peak_rss_bytes as f64 / (1 << 20) as f64, 1),
        warmup: a.warmup,
        decode_s_per_tok: round(s.decode_s / steps, 4),
        decode_mb_per_tok: round(s.decode_bytes_read as f64 / steps / 1e6, 2),
        decode_wait_s_per_tok: round(s.decode_disk_wait_s / steps, 4),
        decode_disk_gb_s: round(
            s.decode_bytes_read as f64 / s.decode_disk_busy_s.max(1e-9) / 1e9,
            3,
        ),
        overlap: round(s.overlap, 3),
        io_cpu_share: round(io_cpu_s / s.seconds.max(1e-9), 4),
        prefetch_used: s.prefetch_used,
        prefetch_issued: s.prefetch_issued,
        prefetch_wasted_mb: round(s.prefetch_wasted_bytes as f64 / 1e6, 1),
        recall_attn: s.recall_attn.map(|r| round(r, 3)),
        recall_output: s.recall_output.map(|r| round(r, 3)),
    };
    let (header, values) = csv_record(&row)?;
    let pairs: Vec<String> = header
        .iter()
        .zip(values.iter())
        .map(|(k, v)| format!("{k}={}", if v.is_empty() { "-" } else { v }))
        .collect();
    println!("{}", pairs.join(" "));
    if let Some(path) = &a.csv {
        moestream::fs::write::append(path, moestream::fs::read::RESULTS_CSV, |fresh| {
            let mut w = csv::WriterBuilder::new()
                .has_headers(false)
                .from_writer(Vec::new());
            if fresh {
                w.write_record(&header).map_err(|e| e.to_string())?;
            }
            w.write_record(&values).map_err(|e| e.to_string())?;
            w.into_inner().map_err(|e| e.to_string())
        })?;
    }
    Ok(())
}

/// One `bench decode` result: the printed `key=value` line and the CSV row
/// (columns in field order).
#[derive(serde::Serialize)]
struct DecodeRow {
    model: String,
    read_mode: String,
    submit: String,
    pipeline: bool,
    prefetch: String,
    ram_gb: Option<f64>,
    slots: usize,
    cold: bool,
    tokens: usize,
    load_s: f64,
    prefill_s: f64,
    decode_tok_s: f64,
    tok_s: f64,
    hit_rate: f64,
    read_mb_per_tok: f64,
    device_mb_per_tok: f64,
    lat_mean_ms: f64,
    lat_p99_ms: f64,
    peak_rss_mib: f64,
    warmup: bool,
    decode_s_per_tok: f64,
    decode_mb_per_tok: f64,
    decode_wait_s_per_tok: f64,
    decode_disk_gb_s: f64,
    overlap: f64,
    /// CPU time of the read service's thread over the run's wall time
    /// (what the reactor takes from the compute workers' cores).
    io_cpu_share: f64,
    prefetch_used: u64,
    prefetch_issued: u64,
    prefetch_wasted_mb: f64,
    recall_attn: Option<f64>,
    recall_output: Option<f64>,
}

/// `row`'s CSV header and values, as csv serializes them.
fn csv_record(row: &impl serde::Serialize) -> Result<(csv::StringRecord, csv::StringRecord)> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.serialize(row)?;
    let bytes = w.into_inner().map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut r = csv::Reader::from_reader(bytes.as_slice());
    let header = r.headers()?.clone();
    let values = r
        .records()
        .next()
        .ok_or_else(|| anyhow::anyhow!("a serialized row reads back"))??;
    Ok((header, values))
}
