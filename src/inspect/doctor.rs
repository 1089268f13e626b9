//! `moestream doctor`: read-only readiness checks of this machine and a
//! model, each `ok`, `warn` or `fail` with what was seen and, for every
//! problem, the fix. A `fail` stops a run or risks it (a truncated shard, a
//! budget over the cgroup limit); a `warn` costs speed (no io_uring, no
//! O_DIRECT, scalar kernels, a slow disk).
//!
//! Machine: io_uring and the memlock limit, transparent huge pages, the CPU
//! features the kernels dispatch on, the memory cgroup limit against the
//! planned budget. Model (with a model directory): config.json, every
//! shard header and its size, the experts' shapes, the budget, the
//! tokenizer, the chat template, O_DIRECT on its file system, its device's
//! read-ahead, free space, and a short cold disk probe (skippable: a probe
//! of 0 seconds is none).

use crate::formats::chat::{ChatTemplate, Message};
use crate::formats::config::ModelConfig;
use crate::formats::weights::index::ShardExtent;
use crate::formats::weights::WeightIndex;
use crate::inspect::plan::{gb_at_least, smallest_budget};
use crate::kernels::cpu::{isa, Isa};
use crate::model::{check_budget, Footprint, LoadOptions};
use crate::store::budget::human;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

/// One check: what it looked at, what it saw, and the fix for a problem.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: &'static str, detail: impl Into<String>) -> Check {
        Check {
            name,
            status: Status::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    fn problem(
        name: &'static str,
        status: Status,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Check {
        Check {
            name,
            status,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

/// What to check.
#[derive(Clone, Debug)]
pub struct Options {
    /// The model directory, if any.
    pub model: Option<PathBuf>,
    /// The options a run would load with (the budget, context, read mode).
    pub load: LoadOptions,
    /// Seconds of the cold disk probe; 0 skips it.
    pub probe_seconds: f64,
}

/// Every check, machine first.
pub fn run(opts: &Options) -> Vec<Check> {
    let mut out = vec![io_uring(), huge_pages(), cpu()];
    let budget = match &opts.model {
        Some(dir) => {
            let (checks, budget) = model(dir, &opts.load);
            out.extend(checks);
            out.extend(disk(dir, &opts.load, opts.probe_seconds));
            budget
        }
        None => opts.load.ram_budget,
    };
    out.push(memory(budget, opts.load.ram_budget.is_some()));
    out
}

fn io_uring() -> Check {
    let memlock_text = memlock_limit().unwrap_or_else(|| "unknown".into());
    let disabled = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .ok()
        .map(|s| s.trim().to_string());
    match moestream_io::Reactor::probe() {
        Ok(()) => Check::ok(
            "io_uring",
            format!("available (memlock limit {memlock_text})"),
        ),
        Err(e) => Check::problem(
            "io_uring",
            Status::Warn,
            format!(
                "unavailable: {e} (memlock limit {memlock_text}, kernel.io_uring_disabled {}); expert misses are read one by one on a thread",
                disabled.as_deref().unwrap_or("unknown")
            ),
            "allow io_uring: `sysctl kernel.io_uring_disabled=0`, a container seccomp profile that permits io_uring_setup, and on kernels before 5.12 a memlock limit of at least 8 MiB (`ulimit -l`, LimitMEMLOCK= in systemd)",
        ),
    }
}

/// The soft memlock limit from /proc/self/limits (`unlimited`, or bytes).
fn memlock_limit() -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max locked memory"))?;
    let soft = line
        .trim_start_matches("Max locked memory")
        .split_whitespace()
        .next()?;
    Some(match soft.parse::<u64>() {
        Ok(b) => human(b),
        Err(_) => soft.to_string(),
    })
}

fn huge_pages() -> Check {
    let path = "/sys/kernel/mm/transparent_hugepage/enabled";
    let Ok(text) = std::fs::read_to_string(path) else {
        return Check::ok("transparent huge pages", "not reported by this kernel");
    };
    let mode = text
        .split_whitespace()
        .find(|w| w.starts_with('['))
        .map_or("unknown", |w| w.trim_matches(|c| c == '[' || c == ']'));
    if mode == "never" {
        return Check::problem(
            "transparent huge pages",
            Status::Warn,
            "never: read buffers fault in 4 KiB at a time",
            format!("`echo madvise | sudo tee {path}` (moestream advises its read buffers)"),
        );
    }
    Check::ok("transparent huge pages", mode.to_string())
}

fn cpu() -> Check {
    let level = isa();
    let detail = format!(
        "kernels dispatch to {level:?}{}",
        std::env::var("MOESTREAM_ISA")
            .map(|v| format!(" (capped by MOESTREAM_ISA={v})"))
            .unwrap_or_default()
    );
    if level == Isa::Scalar {
        return Check::problem(
            "cpu features",
            Status::Warn,
            format!("{detail}: no AVX2+FMA, the scalar kernels are several times slower"),
            "run on an x86-64 CPU with AVX2 and FMA (AVX-512 VNNI is fastest), and unset MOESTREAM_ISA",
        );
    }
    Check::ok("cpu features", detail)
}

/// The memory cgroup limit against `budget` (the run's, or the smallest
/// that runs), and the budget against the memory available.
fn memory(budget: Option<u64>, asked: bool) -> Check {
    let limit = crate::machine::cgroup::memory_limit();
    let available = crate::machine::memory::meminfo_bytes("MemAvailable");
    let what = if asked {
        "the RAM budget"
    } else {
        "the smallest budget that runs"
    };
    let limit_text = limit.map_or("no limit".to_string(), human);
    let Some(budget) = budget else {
        return Check::ok("memory", format!("cgroup limit: {limit_text}"));
    };
    let detail = format!(
        "{what} {} against cgroup limit {limit_text}, {} available",
        human(budget),
        available.map_or("unknown".to_string(), human)
    );
    if limit.is_some_and(|l| l < budget) {
        return Check::problem(
            "memory",
            Status::Fail,
            format!("{detail}: the kernel would kill the run (OOM) before the plan fills"),
            format!(
                "raise the limit (docker --memory, systemd MemoryMax=) or run with --ram-gb {:.2} or less",
                limit.unwrap_or(0) as f64 / 1e9
            ),
        );
    }
    if available.is_some_and(|a| a < budget) {
        return Check::problem(
            "memory",
            Status::Warn,
            format!("{detail}: other processes hold what the plan needs"),
            "free memory, or lower --ram-gb",
        );
    }
    Check::ok("memory", detail)
}

/// The model's checks, and the budget to compare with the memory limit.
fn model(dir: &Path, load: &LoadOptions) -> (Vec<Check>, Option<u64>) {
    let mut out = Vec::new();
    let cfg = match ModelConfig::load(dir) {
        Ok(c) => {
            out.push(Check::ok(
                "config",
                format!(
                    "{} ({} layers, {} experts, top-{})",
                    c.family.model_type(),
                    c.num_layers,
                    c.num_experts,
                    c.top_k
                ),
            ));
            c
        }
        Err(e) => {
            let fix = config_fix(dir, &e);
            out.push(Check::problem("config", Status::Fail, e.to_string(), fix));
            return (out, load.ram_budget);
        }
    };
    let (index, extents) = match WeightIndex::open_headers(dir) {
        Ok(x) => x,
        Err(e) => {
            out.push(Check::problem(
                "shards",
                Status::Fail,
                e.to_string(),
                "re-download the shard named",
            ));
            return (out, load.ram_budget);
        }
    };
    out.push(shards(&extents));
    let budget = match Footprint::measure(&cfg, &index) {
        Ok(fp) => {
            out.push(budget_check(&fp, load));
            load.ram_budget
                .or_else(|| Some(smallest_budget(&fp, load, |_| true)))
        }
        Err(e) => {
            out.push(Check::problem(
                "experts",
                Status::Fail,
                e.to_string(),
                "the checkpoint does not match config.json: re-download it",
            ));
            load.ram_budget
        }
    };
    out.push(tokenizer(dir));
    out.push(chat_template(dir));
    (out, budget)
}

fn shards(extents: &[ShardExtent]) -> Check {
    let short: Vec<String> = extents
        .iter()
        .filter(|e| !e.complete())
        .map(|e| {
            format!(
                "{} ({} of {} bytes)",
                e.path.display(),
                e.file_bytes,
                e.header_bytes
            )
        })
        .collect();
    let long: Vec<String> = extents
        .iter()
        .filter(|e| e.file_bytes > e.header_bytes)
        .map(|e| {
            format!(
                "{} ({} bytes past its last tensor)",
                e.path.display(),
                e.file_bytes - e.header_bytes
            )
        })
        .collect();
    if !short.is_empty() {
        return Check::problem(
            "shards",
            Status::Fail,
            format!(
                "{} of {} truncated: {}",
                short.len(),
                extents.len(),
                short.join(", ")
            ),
            "finish the download (`moestream plan` works on headers meanwhile)",
        );
    }
    if !long.is_empty() {
        return Check::problem(
            "shards",
            Status::Warn,
            format!(
                "every header parses; longer than their headers say: {}",
                long.join(", ")
            ),
            "re-download those shards if they were not written this way on purpose",
        );
    }
    let total: u64 = extents.iter().map(|e| e.file_bytes).sum();
    Check::ok(
        "shards",
        format!(
            "{} shard(s), every header parses and every size matches ({})",
            extents.len(),
            human(total)
        ),
    )
}

/// The fix for a model whose configuration cannot be read: an
/// architecture moestream does not run is named with those it does; a
/// GGUF file's metadata is its configuration.
fn config_fix(dir: &Path, e: &crate::error::Error) -> String {
    let supported = crate::formats::config::Family::supported();
    match e {
        crate::error::Error::UnknownArchitecture { model_type, .. } => format!(
            "moestream runs {supported}; `{model_type}` is not one of them (no download fixes it)"
        ),
        _ if crate::formats::gguf::is_gguf(dir) => format!(
            "the GGUF metadata (general.architecture and its keys) is the configuration: re-download or re-convert the file (architectures: {supported})"
        ),
        _ => "fix or re-download config.json".into(),
    }
}

fn budget_check(fp: &Footprint, load: &LoadOptions) -> Check {
    let smallest = gb_at_least(smallest_budget(fp, load, |_| true));
    let Some(budget) = load.ram_budget else {
        return Check::ok(
            "ram budget",
            format!("the smallest budget that runs is --ram-gb {smallest:.2}"),
        );
    };
    match check_budget(fp, budget, load) {
        Ok(p) => Check::ok(
            "ram budget",
            format!(
                "{} slots per layer of {}; projected peak {} (the smallest budget that runs is --ram-gb {smallest:.2})",
                p.slots_per_layer,
                p.experts_per_layer,
                human(p.projected_peak)
            ),
        ),
        Err(e) => Check::problem(
            "ram budget",
            Status::Fail,
            e.to_string(),
            format!("--ram-gb {smallest:.2} or more"),
        ),
    }
}

fn tokenizer(dir: &Path) -> Check {
    match crate::formats::tokenizer::Tokenizer::load(dir) {
        Ok(t) => match t.encode("hello") {
            Ok(ids) => Check::ok(
                "tokenizer",
                format!("loads (\"hello\" is {} token(s))", ids.len()),
            ),
            Err(e) => Check::problem(
                "tokenizer",
                Status::Fail,
                e.to_string(),
                "re-download tokenizer.json",
            ),
        },
        Err(e) => Check::problem(
            "tokenizer",
            Status::Fail,
            e.to_string(),
            "download tokenizer.json beside config.json (text prompts, chat and serve need it)",
        ),
    }
}

fn chat_template(dir: &Path) -> Check {
    let messages = [
        Message::new("system", "You are brief."),
        Message::new("user", "Hello"),
    ];
    match ChatTemplate::from_model_dir(dir) {
        Ok(Some(t)) => match t.render(&messages, true) {
            Ok(text) => Check::ok("chat template", format!("renders ({} bytes, from {})", text.len(), t.origin())),
            Err(e) => Check::problem("chat template", Status::Fail, e.to_string(), "fix the template, or pass --chat-template FILE"),
        },
        Ok(None) => Check::problem(
            "chat template",
            Status::Warn,
            "none in tokenizer_config.json or chat_template.jinja",
            "chat and /v1/chat/completions need one: pass --chat-template FILE (run and completions do not)",
        ),
        Err(e) => Check::problem("chat template", Status::Fail, e.to_string(), "fix tokenizer_config.json, or pass --chat-template FILE"),
    }
}

/// O_DIRECT, read-ahead, free space and the disk probe for `dir`.
fn disk(dir: &Path, load: &LoadOptions, probe_seconds: f64) -> Vec<Check> {
    let files = crate::inspect::disk::shard_files(dir).unwrap_or_default();
    let mut out = Vec::new();
    out.push(match files.first().map(|f| crate::inspect::disk::direct_io(f)) {
        Some(Ok(true)) => Check::ok("O_DIRECT", "supported on the model's file system"),
        Some(Ok(false)) => Check::problem(
            "O_DIRECT",
            Status::Warn,
            "refused by the model's file system: --io direct falls back to buffered reads",
            "keep models on ext4 or xfs (tmpfs, overlayfs and some network file systems refuse O_DIRECT), or tune for --io buffered",
        ),
        Some(Err(e)) => Check::problem("O_DIRECT", Status::Fail, e.to_string(), "check the shard's permissions"),
        None => Check::ok("O_DIRECT", "no shard to open"),
    });
    out.push(read_ahead(dir));
    if let Some(free) = crate::inspect::disk::free_bytes(dir) {
        out.push(if free < 1 << 30 {
            Check::problem(
                "disk space",
                Status::Warn,
                format!("{} free beside the model", human(free)),
                "free space: usage history, tuned profiles and KV files are written nearby",
            )
        } else {
            Check::ok("disk space", format!("{} free", human(free)))
        });
    }
    out.push(probe(dir, &files, load, probe_seconds));
    out
}

/// The device's read-ahead. Expert reads are advised random (fadvise and
/// madvise RANDOM), so a large window does not inflate them; none at all
/// leaves the sequential read of the resident weights at load without it.
fn read_ahead(dir: &Path) -> Check {
    let device = crate::fs::state::device_of(dir).unwrap_or_else(|_| "?".into());
    match crate::inspect::disk::read_ahead_kb(dir) {
        None => Check::ok(
            "read-ahead",
            format!("{device}: not reported (not a block device)"),
        ),
        Some(0) => Check::problem(
            "read-ahead",
            Status::Warn,
            format!("{device}: read_ahead_kb 0: loading the resident weights reads without read-ahead"),
            format!("`echo 128 | sudo tee /sys/block/{device}/queue/read_ahead_kb`"),
        ),
        Some(kb) => Check::ok(
            "read-ahead",
            format!("{device}: read_ahead_kb {kb} (expert reads are advised random, so it does not inflate them)"),
        ),
    }
}

fn probe(dir: &Path, files: &[PathBuf], load: &LoadOptions, seconds: f64) -> Check {
    if seconds <= 0.0 {
        return Check::ok("disk probe", "skipped");
    }
    let read_bytes = ModelConfig::load(dir)
        .ok()
        .and_then(|cfg| {
            let (index, _) = WeightIndex::open_headers(dir).ok()?;
            Footprint::measure(&cfg, &index).ok()
        })
        .map_or(4 << 20, |fp| (fp.expert_disk as usize).max(4096));
    let mode = load.read_mode;
    match crate::inspect::disk::probe(files, read_bytes, mode, 4, seconds) {
        Ok(p) if p.gb_per_s < 0.2 => Check::problem(
            "disk probe",
            Status::Warn,
            format!("{:.3} GB/s ({} reads of {}, p99 {:.1} ms): every expert miss waits on this", p.gb_per_s, p.read_mode, human(read_bytes as u64), p.latency_ms_p99),
            "keep the model on a local NVMe SSD; `moestream bench io` shows what each read mode gets",
        ),
        Ok(p) => Check::ok(
            "disk probe",
            format!("{:.2} GB/s, {} reads of {}, 4 at once, p50 {:.1} ms, p99 {:.1} ms ({:.1} s)", p.gb_per_s, p.read_mode, human(read_bytes as u64), p.latency_ms_p50, p.latency_ms_p99, p.seconds),
        ),
        Err(e) => Check::problem("disk probe", Status::Warn, e.to_string(), "finish the download, then probe again"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_checks_run_anywhere_and_explain_problems() {
        for c in [io_uring(), huge_pages(), cpu(), memory(Some(1 << 20), true)] {
            assert!(!c.detail.is_empty(), "{c:?}");
            assert_eq!(c.status != Status::Ok, c.fix.is_some(), "{c:?}");
        }
        assert!(crate::machine::memory::meminfo_bytes("MemTotal").is_some_and(|b| b > 0));
    }
}
