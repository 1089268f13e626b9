//! `moestream status`: a one-screen summary of a model (family, size,
//! resident and expert bytes, its tuned profile) and of this machine
//! (cores, RAM, cgroup limit, CPU kernels, the disk under the model and its
//! measured bandwidth). Headers only, no weight read; the disk's bandwidth
//! comes from the tuned profile, or from a probe when one is asked for.

use crate::error::Result;
use crate::formats::config::ModelConfig;
use crate::formats::weights::WeightIndex;
use crate::model::Footprint;
use serde::Serialize;
use std::path::Path;

/// The summary.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub model: Option<ModelSummary>,
    pub machine: Machine,
}

/// The model.
#[derive(Clone, Debug, Serialize)]
pub struct ModelSummary {
    pub dir: String,
    pub family: &'static str,
    pub layers: usize,
    pub experts: usize,
    pub top_k: usize,
    /// Bytes of its shards on disk.
    pub disk_bytes: u64,
    pub resident_bytes: u64,
    /// One routed expert in RAM and on disk; all of them on disk.
    pub expert_ram_bytes: u64,
    pub expert_disk_bytes: u64,
    pub experts_disk_bytes: u64,
    pub complete: bool,
    pub tuned: Option<Tuned>,
}

/// The model's tuned profile on this disk.
#[derive(Clone, Debug, Serialize)]
pub struct Tuned {
    pub path: String,
    pub read_mode: String,
    pub pipeline: bool,
    pub prefetch: String,
    /// The best rate of its read mode in the disk sweep, GB/s.
    pub disk_gb_per_s: Option<f64>,
    pub decode_tok_s: Option<f64>,
}

/// This machine.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub cores: usize,
    pub ram_bytes: Option<u64>,
    pub available_bytes: Option<u64>,
    pub cgroup_limit_bytes: Option<u64>,
    pub kernels: String,
    pub disk: Option<Disk>,
}

/// The disk under the model.
#[derive(Clone, Debug, Serialize)]
pub struct Disk {
    pub device: String,
    pub rotational: Option<bool>,
    pub read_ahead_kb: Option<u64>,
    pub free_bytes: Option<u64>,
    /// Measured bandwidth, GB/s, and where the figure comes from.
    pub gb_per_s: Option<f64>,
    pub measured_by: Option<String>,
}

/// The summary of `model` (if any) and this machine; with `probe_seconds`
/// > 0 the disk is probed when no tuned profile gives its bandwidth.
pub fn gather(model: Option<&Path>, probe_seconds: f64) -> Result<Summary> {
    let summary = model.map(model_summary).transpose()?;
    let disk = model.map(|dir| disk(dir, summary.as_ref(), probe_seconds));
    Ok(Summary {
        model: summary,
        machine: Machine {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            ram_bytes: crate::model::profile::mem_total_bytes(),
            available_bytes: crate::machine::memory::meminfo_bytes("MemAvailable"),
            cgroup_limit_bytes: crate::machine::cgroup::memory_limit(),
            kernels: format!("{:?}", crate::kernels::cpu::isa()),
            disk,
        },
    })
}

fn model_summary(dir: &Path) -> Result<ModelSummary> {
    let cfg = ModelConfig::load(dir)?;
    let (index, extents) = WeightIndex::open_headers(dir)?;
    let fp = Footprint::measure(&cfg, &index)?;
    let tuned = crate::fs::tuned::load(dir)
        .ok()
        .flatten()
        .map(|(path, p)| Tuned {
            path: path.display().to_string(),
            disk_gb_per_s: p
                .disk
                .iter()
                .filter(|d| d.read_mode == p.read_mode)
                .map(|d| d.gb_per_s)
                .reduce(f64::max),
            decode_tok_s: p.probes.iter().map(|q| q.decode_tok_s).reduce(f64::max),
            read_mode: p.read_mode,
            pipeline: p.pipeline,
            prefetch: p.prefetch,
        });
    Ok(ModelSummary {
        dir: dir.display().to_string(),
        family: cfg.family.model_type(),
        layers: cfg.num_layers,
        experts: cfg.num_experts,
        top_k: cfg.top_k,
        disk_bytes: extents.iter().map(|e| e.file_bytes).sum(),
        resident_bytes: fp.resident_bytes(),
        expert_ram_bytes: fp.expert_ram,
        expert_disk_bytes: fp.expert_disk,
        experts_disk_bytes: fp.experts_disk_total,
        complete: extents.iter().all(|e| e.complete()),
        tuned,
    })
}

fn disk(dir: &Path, model: Option<&ModelSummary>, probe_seconds: f64) -> Disk {
    let tuned = model.and_then(|m| m.tuned.as_ref());
    let mut measured = tuned.and_then(|t| {
        t.disk_gb_per_s
            .map(|g| (g, format!("tuned profile {}", t.path)))
    });
    if measured.is_none() && probe_seconds > 0.0 {
        let read_bytes = model.map_or(4 << 20, |m| (m.expert_disk_bytes as usize).max(4096));
        let files = crate::inspect::disk::shard_files(dir).unwrap_or_default();
        let mode = moestream_io::ReadMode::Direct;
        if let Ok(p) = crate::inspect::disk::probe(&files, read_bytes, mode, 4, probe_seconds) {
            measured = Some((
                p.gb_per_s,
                format!("a {:.1} s probe, {} reads", p.seconds, p.read_mode),
            ));
        }
    }
    Disk {
        device: crate::fs::state::device_of(dir).unwrap_or_else(|_| "unknown".into()),
        rotational: crate::inspect::disk::rotational(dir),
        read_ahead_kb: crate::inspect::disk::read_ahead_kb(dir),
        free_bytes: crate::inspect::disk::free_bytes(dir),
        gb_per_s: measured.as_ref().map(|m| m.0),
        measured_by: measured.map(|m| m.1),
    }
}
