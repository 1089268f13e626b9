//! `moestream tune`: measure this disk with expert-sized reads in every
//! read mode, decode a few tokens cold in each candidate configuration
//! (read mode × pipelining × lookahead prefetch), and save the fastest as
//! the model's tuned profile (see `moestream::fs::tuned`), which `--io auto`
//! (the default) then uses.

use super::progress::{self, Unit};
use super::{drop_page_cache, load, lookahead_name, read_mode_of, IoChoice, ModelArgs, Toggle};
use anyhow::{Context, Result};
use clap::Args;
use moestream::engine::generate::{generate, GenOptions};
use moestream::formats::tokenizer::Tokenizer;
use moestream::fs::tuned::{self, DiskPoint, Probe, TunedProfile, PROFILE_VERSION};
use moestream_io::{sweep, ReadMode, SweepConfig};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Args)]
pub(super) struct TuneArgs {
    #[command(flatten)]
    pub(super) model: ModelArgs,
    /// Tokens each decode probe generates (greedy, EOS ignored).
    #[arg(long, default_value_t = 8)]
    tokens: usize,
    /// Read modes that get decode probes (default 2, with --full all 5):
    /// direct (the default's) and the best others by the disk sweep. The
    /// sweep alone cannot rank them: it cannot see that page-cache modes
    /// leave fewer cache slots under a budget (on a Qwen3-30B shape under
    /// 3 GB it ranked buffered and pread above direct, which decoded 1.7x
    /// faster).
    #[arg(long)]
    modes_probed: Option<usize>,
    /// Probe every schedule (pipelining on and off, prefetch depths 0, 1,
    /// 2 and 4) in every probed mode, as tune did before it refined the
    /// default (6-8 minutes on a 7 GB model against about one).
    #[arg(long)]
    full: bool,
    /// Rounds of probes (alternating); the median decides.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Reads in flight of the disk sweep.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    depths: Vec<usize>,
    /// Seconds per disk-sweep cell.
    #[arg(long, default_value_t = 0.5)]
    cell_seconds: f64,
    /// Print the table only; do not save the profile.
    #[arg(long)]
    dry_run: bool,
}

const PROMPT: &str = "The engine reads the expert from the disk while the cores compute";

/// The (pipeline, lookahead depth) pairs of `--full`; depth 0 is no
/// prefetch. Deeper lookahead gives reads more lead time (on a
/// Qwen3-30B-shaped model under 3 GB, medians of 3: 0.083 s/token at depth
/// 1, 0.073 at 2, 0.064 at 4, 0.078 at 6; results/roofline.md).
const SCHEDULES: [(bool, usize); 6] = [
    (false, 0),
    (true, 0),
    (false, 1),
    (true, 1),
    (true, 2),
    (true, 4),
];

/// Lookahead depths probed around the default (direct, pipelined,
/// prefetch depth 1 under a budget): pipelining never lost in a full grid
/// (results/tune-q30b24.log, tune-glm5x6.log), so the default grid keeps
/// it on and refines the prefetch depth.
const DIRECT_DEPTHS: [usize; 4] = [0, 1, 2, 4];
/// Depths probed in the other modes: with and without the default
/// prefetch.
const OTHER_DEPTHS: [usize; 2] = [0, 1];

/// One decode probe: read mode, pipelining, lookahead depth (0 = none).
type ProbeSpec = (ReadMode, bool, usize);

/// The (mode, pipeline, lookahead depth) probes, in order. `ranked` is
/// every mode, best disk-sweep speed first; `modes` read modes get probes:
/// direct and the best `modes - 1` others (with `full`: the best `modes`,
/// whatever they are, each with every schedule).
fn probe_plan(ranked: &[ReadMode], modes: usize, full: bool) -> Vec<ProbeSpec> {
    let modes = modes.max(1);
    if full {
        return ranked
            .iter()
            .take(modes)
            .flat_map(|&m| SCHEDULES.iter().map(move |&(p, d)| (m, p, d)))
            .collect();
    }
    let mut plan: Vec<_> = DIRECT_DEPTHS
        .iter()
        .map(|&d| (ReadMode::Direct, true, d))
        .collect();
    for &m in ranked
        .iter()
        .filter(|&&m| m != ReadMode::Direct)
        .take(modes - 1)
    {
        plan.extend(OTHER_DEPTHS.iter().map(|&d| (m, true, d)));
    }
    plan
}

pub(super) fn cmd_tune(mut a: TuneArgs) -> Result<()> {
    anyhow::ensure!(
        a.tokens >= 2,
        "--tokens must be at least 2 (one decode step)"
    );
    super::limits::count("--rounds", a.rounds, 1..=super::limits::REPEATS_MAX)?;
    let cell =
        super::limits::seconds("--cell-seconds", a.cell_seconds, super::limits::SECONDS_MAX)?;
    anyhow::ensure!(cell > 0.0, "--cell-seconds must be positive");
    a.model.no_history = true;
    let dir = a.model.model.clone();
    // One expert's read span sets the sweep's read size.
    let expert_disk = {
        let mut m = a.model.clone();
        m.io = IoChoice::Mode(ReadMode::Pread);
        m.ram_gb = Some(super::RamArg::Unbounded);
        m.expert_cache = 0;
        let model = load(&m)?;
        let (_, disk) = model
            .store
            .expert_bytes()
            .context("the model has no routed experts to tune for")?;
        disk as usize
    };
    let shards = shards(&dir)?;
    println!(
        "disk sweep: random {:.2} MB reads (one expert) over {} shard(s), page cache dropped per cell",
        expert_disk as f64 / 1e6,
        shards.len()
    );
    println!("mode      engine    depth   GB/s   p50 ms   p99 ms");
    let cfg = SweepConfig {
        modes: ReadMode::ALL.to_vec(),
        read_sizes: vec![expert_disk],
        depths: a.depths.clone(),
        cell_time: Duration::from_secs_f64(a.cell_seconds),
        reads_max: None,
        seed: 7,
    };
    let cells = (cfg.modes.len() * cfg.depths.len()) as u64;
    let cells = progress::bar(cells, "tune: disk sweep", Unit::Count("cells"));
    let rows = sweep(&shards, &cfg, |r| {
        cells.suspend(|| {
            println!(
                "{:<9} {:<9} {:>5} {:>6.2} {:>8.2} {:>8.2}",
                r.mode_label(),
                format!("{:?}", r.engine).to_lowercase(),
                r.depth,
                r.gb_per_s,
                r.latency_us_p50 / 1e3,
                r.latency_us_p99 / 1e3
            )
        });
        cells.inc(1);
    })
    .context("disk sweep")?;
    cells.finish_and_clear();
    let disk: Vec<DiskPoint> = rows
        .iter()
        .map(|r| DiskPoint {
            read_mode: r.effective_mode.name().into(),
            depth: r.depth,
            read_bytes: r.read_bytes,
            gb_per_s: r.gb_per_s,
            p50_us: r.latency_us_p50,
            p99_us: r.latency_us_p99,
        })
        .collect();
    let mut ranked: Vec<(ReadMode, f64)> = ReadMode::ALL
        .iter()
        .map(|&m| {
            let best = disk
                .iter()
                .filter(|p| p.read_mode == m.name())
                .map(|p| p.gb_per_s)
                .fold(0.0, f64::max);
            (m, best)
        })
        .collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    let ranked: Vec<ReadMode> = ranked.iter().map(|r| r.0).collect();
    let modes = a
        .modes_probed
        .unwrap_or(if a.full { ReadMode::ALL.len() } else { 2 });
    let plan = probe_plan(&ranked, modes, a.full);

    println!(
        "decode probes: {} tokens, cold, {}",
        a.tokens,
        a.model
            .budget_gb()
            .map_or("no --ram-gb".into(), |g| format!("--ram-gb {g}"))
    );
    println!("mode      pipeline prefetch  decode tok/s  MB/token  overlap");
    let mut runs: Vec<Vec<Probe>> = Vec::new();
    let total = (a.rounds * plan.len()) as u64;
    let bar = progress::bar(total, "tune: decode probes", Unit::Count("probes"));
    for round in 0..a.rounds {
        for (i, &(mode, pipeline, prefetch)) in plan.iter().enumerate() {
            let p = match probe(&a, mode, pipeline, prefetch) {
                // (prefetch is the lookahead depth, 0 = off)
                Ok(p) => p,
                // A configuration that cannot fit the budget (prefetch
                // reserves RAM) is not a candidate.
                Err(e)
                    if matches!(
                        e.downcast_ref::<moestream::Error>(),
                        Some(moestream::Error::Budget(_))
                    ) =>
                {
                    let name = if prefetch > 0 {
                        format!("attn-{prefetch}")
                    } else {
                        "off".into()
                    };
                    println!(
                        "{:<9} {:<8} {:<9} does not fit: {e}",
                        mode.name(),
                        if pipeline { "on" } else { "off" },
                        name
                    );
                    Probe {
                        read_mode: mode.name().into(),
                        pipeline,
                        prefetch: name,
                        decode_tok_s: 0.0,
                        mb_read_per_token: 0.0,
                        overlap: 0.0,
                    }
                }
                Err(e) => return Err(e),
            };
            bar.suspend(|| {
                println!(
                    "{:<9} {:<8} {:<9} {:>12.3} {:>9.1} {:>7.0}%{}",
                    p.read_mode,
                    if pipeline { "on" } else { "off" },
                    p.prefetch,
                    p.decode_tok_s,
                    p.mb_read_per_token,
                    p.overlap * 100.0,
                    if a.rounds > 1 {
                        format!("  (round {})", round + 1)
                    } else {
                        String::new()
                    }
                )
            });
            bar.inc(1);
            if round == 0 {
                runs.push(Vec::new());
            }
            runs[i].push(p);
        }
    }
    bar.finish_and_clear();
    let probes: Vec<Probe> = runs.into_iter().map(median_probe).collect();
    let best = probes
        .iter()
        .max_by(|a, b| a.decode_tok_s.total_cmp(&b.decode_tok_s))
        .expect("at least one probe")
        .clone();
    let profile = TunedProfile {
        version: PROFILE_VERSION,
        device: moestream::fs::state::device_of(&dir)?,
        model: dir.display().to_string(),
        read_mode: best.read_mode.clone(),
        pipeline: best.pipeline,
        prefetch: best.prefetch.clone(),
        ram_gb: a.model.budget_gb(),
        disk,
        probes,
    };
    println!(
        "best: --io {} --pipeline {} --prefetch {} ({:.3} tok/s{})",
        best.read_mode,
        if best.pipeline { "on" } else { "off" },
        match best.prefetch.strip_prefix("attn-") {
            Some(d) => format!("on --prefetch-depth {d}"),
            None => "off".into(),
        },
        best.decode_tok_s,
        if a.rounds > 1 { ", median" } else { "" }
    );
    if a.dry_run {
        println!("(dry run: profile not saved)");
    } else {
        let path = tuned::save(&dir, &profile)?;
        println!(
            "saved {} (used by --io auto on device {})",
            path.display(),
            profile.device
        );
    }
    Ok(())
}

/// One cold decode in one configuration.
fn probe(a: &TuneArgs, mode: ReadMode, pipeline: bool, depth: usize) -> Result<Probe> {
    let mut m = a.model.clone();
    m.io = IoChoice::Mode(mode);
    m.pipeline = if pipeline { Toggle::On } else { Toggle::Off };
    m.prefetch = super::PrefetchArg::Lookahead(if depth > 0 { Toggle::On } else { Toggle::Off });
    m.prefetch_from = super::PrefetchFrom::Attn;
    m.prefetch_depth = depth.max(1);
    drop_page_cache(&m.model)?;
    let model = load(&m)?;
    let prompt = match Tokenizer::load(&m.model) {
        Ok(t) => t.encode(PROMPT)?,
        Err(_) => (1..=8u32)
            .map(|i| i % model.cfg.vocab_size as u32)
            .collect(),
    };
    let opts = GenOptions {
        max_tokens: a.tokens,
        ignore_eos: true,
        ..GenOptions::default()
    };
    let g = generate(&model, &prompt, &opts, |_| Ok(()))?;
    let s = &g.stats;
    let decode_s = (s.seconds - s.prefill_seconds).max(1e-9);
    Ok(Probe {
        read_mode: read_mode_of(&model).name().into(),
        pipeline,
        prefetch: lookahead_name(model.store.schedule.lookahead),
        decode_tok_s: s.tokens.saturating_sub(1) as f64 / decode_s,
        mb_read_per_token: s.bytes_read_per_token / 1e6,
        overlap: s.overlap,
    })
}

/// The probe with the median decode speed of one configuration's rounds.
fn median_probe(mut rounds: Vec<Probe>) -> Probe {
    rounds.sort_by(|a, b| a.decode_tok_s.total_cmp(&b.decode_tok_s));
    rounds.swap_remove(rounds.len() / 2)
}

/// The `*.safetensors` files of `dir` (the sweep reads across them).
fn shards(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for ent in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let p = ent?.path();
        if p.extension().is_some_and(|e| e == "safetensors") {
            out.push(p);
        }
    }
    out.sort();
    anyhow::ensure!(!out.is_empty(), "no *.safetensors in {}", dir.display());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ReadMode::*;

    #[test]
    fn the_default_grid_refines_direct_and_tries_the_best_others() {
        let ranked = [Buffered, Pread, Direct, Drop, Mmap];
        let table: [(usize, bool, Vec<ProbeSpec>); 4] = [
            (
                1,
                false,
                vec![
                    (Direct, true, 0),
                    (Direct, true, 1),
                    (Direct, true, 2),
                    (Direct, true, 4),
                ],
            ),
            (
                2,
                false,
                vec![
                    (Direct, true, 0),
                    (Direct, true, 1),
                    (Direct, true, 2),
                    (Direct, true, 4),
                    (Buffered, true, 0),
                    (Buffered, true, 1),
                ],
            ),
            // Zero modes is one: the default's.
            (0, false, probe_plan(&ranked, 1, false)),
            (
                1,
                true,
                SCHEDULES.iter().map(|&(p, d)| (Buffered, p, d)).collect(),
            ),
        ];
        for (modes, full, want) in table {
            assert_eq!(
                probe_plan(&ranked, modes, full),
                want,
                "modes {modes} full {full}"
            );
        }
        assert_eq!(probe_plan(&ranked, 5, false).len(), 4 + 4 * 2);
        assert_eq!(probe_plan(&ranked, 9, true).len(), 5 * SCHEDULES.len());
    }
}
