//! `moestream bench decode` and `moestream bench mem`.

use super::*;

#[derive(Args)]
pub(super) struct DecodeArgs {
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
