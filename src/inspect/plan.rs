//! `moestream plan`: where a model would go under a RAM budget, from
//! config.json and the shard headers alone, so it answers on a partial
//! download (every shard holding at least its header) before the rest is
//! fetched.
//!
//! The placement is the one loading makes: [`Footprint::measure`] and
//! [`check_budget`] are the functions `Model::load` calls, so a budget this
//! plan refuses is refused by `run` with the same message, and one it
//! accepts gets the same slots per layer. On top of the placement it finds
//! the smallest budget that runs and the one that holds every expert, and
//! predicts the bytes read per token and the decode speed (see
//! [`Prediction`] for the model and its inputs).

use crate::error::Result;
use crate::formats::config::ModelConfig;
use crate::formats::weights::index::ShardExtent;
use crate::formats::weights::WeightIndex;
use crate::model::{check_budget, Footprint, LoadOptions};
use crate::store::budget::BudgetPlan;
use serde::Serialize;
use std::path::Path;

/// What `plan` found.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub model: String,
    pub family: &'static str,
    pub download: Download,
    /// Resident bytes by class (as kept in RAM), and their sum.
    pub resident_bytes: std::collections::BTreeMap<&'static str, u64>,
    pub resident_total_bytes: u64,
    pub experts: Experts,
    /// Context positions the KV pool is planned for, and its bytes.
    pub context: usize,
    pub kv_bytes: u64,
    /// The read mode the plan assumes (direct leaves out the page-cache
    /// reserve).
    pub read_mode: String,
    /// The placement under the budget asked for, if one was.
    pub budget: Option<Placement>,
    /// The smallest budget that runs, and the one holding every expert
    /// (nothing read per token once warm), in bytes.
    pub smallest_budget_bytes: u64,
    pub all_experts_budget_bytes: u64,
}

/// How much of the model is on disk.
#[derive(Clone, Debug, Serialize)]
pub struct Download {
    pub shards: usize,
    pub complete_shards: usize,
    pub bytes_on_disk: u64,
    /// What the headers say the shards hold in all.
    pub bytes_total: u64,
    /// The shards whose data is not (all) there.
    pub partial: Vec<String>,
}

/// Routed experts.
#[derive(Clone, Debug, Serialize)]
pub struct Experts {
    pub moe_layers: usize,
    pub per_layer: usize,
    pub top_k: usize,
    /// One expert in RAM and its read on disk.
    pub ram_bytes: u64,
    pub disk_bytes: u64,
    /// Every routed expert on disk.
    pub disk_total_bytes: u64,
    /// Decoded in place in their read buffer (packed container).
    pub zero_copy: bool,
}

/// The budget split.
#[derive(Clone, Debug, Serialize)]
pub struct Placement {
    pub budget_bytes: u64,
    /// Named slack items.
    pub slack: Vec<(&'static str, u64)>,
    pub slots_per_layer: usize,
    /// Routed experts kept in RAM when every slot is full.
    pub warm_expert_bytes: u64,
    /// Routed experts only ever read from disk (never all cached at once).
    pub cold_expert_bytes: u64,
    pub projected_peak_bytes: u64,
    /// The layer-major prefill pass: positions each layer runs over
    /// before the next, what it holds per position, and its sub-chunk.
    pub prefill_pass_positions: usize,
    pub prefill_pass_bytes_per_position: u64,
    pub prefill_pass_sub_rows: usize,
    pub prefill_pass_sub_bytes_per_row: u64,
    /// No GPU tier in this build: every expert lives in RAM or on disk.
    pub vram_bytes: u64,
}

/// Measures the model in `dir` from its headers and plans `opts.ram_budget`
/// (when set) as loading would. Errors as loading does for the same model
/// and options (config, headers, experts' shapes, the budget), except that
/// shards need hold only their headers.
pub fn plan(dir: &Path, opts: &LoadOptions) -> Result<Plan> {
    let (cfg, fp, extents) = measure(dir, opts)?;
    let budget = match opts.ram_budget {
        Some(b) => Some(placement(&fp, &check_budget(&fp, b, opts)?)),
        None => None,
    };
    let context = opts.context.min(fp.context_max).max(1);
    Ok(Plan {
        model: dir.display().to_string(),
        family: cfg.family.model_type(),
        download: download(&extents),
        resident_total_bytes: fp.resident_bytes(),
        resident_bytes: fp.resident.clone(),
        experts: Experts {
            moe_layers: fp.moe_layers,
            per_layer: fp.experts_per_layer,
            top_k: fp.top_k,
            ram_bytes: fp.expert_ram,
            disk_bytes: fp.expert_disk,
            disk_total_bytes: fp.experts_disk_total,
            zero_copy: fp.expert_zero_copy,
        },
        context,
        kv_bytes: fp.kv_bytes_per_position * context as u64,
        read_mode: opts.read_mode.name().to_string(),
        budget,
        smallest_budget_bytes: smallest_budget(&fp, opts, |_| true),
        all_experts_budget_bytes: smallest_budget(&fp, opts, |p| {
            p.slots_per_layer >= p.experts_per_layer
        }),
    })
}

/// The model in `dir` measured from its headers as loading with `opts`
/// measures it.
fn measure(dir: &Path, opts: &LoadOptions) -> Result<(ModelConfig, Footprint, Vec<ShardExtent>)> {
    let cfg = ModelConfig::load(dir)?;
    let (mut index, extents) = WeightIndex::open_headers(dir)?;
    index.set_at_load(opts.quantize_at_load.clone().map(|policy| {
        crate::formats::weights::index::AtLoad {
            policy,
            layers: cfg.num_layers,
        }
    }));
    let fp = Footprint::measure(&cfg, &index)?;
    Ok((cfg, fp, extents))
}

/// The smallest budget (bytes) whose plan gives every MoE layer at least
/// `slots` cache slots (at most its experts): what a run keeping
/// `--expert-cache slots` needs, planned with `opts` ([`smallest_budget`]).
pub fn budget_for_slots(dir: &Path, opts: &LoadOptions, slots: usize) -> Result<u64> {
    let (_, fp, _) = measure(dir, opts)?;
    Ok(smallest_budget(&fp, opts, |p| {
        p.slots_per_layer >= slots.min(p.experts_per_layer)
    }))
}

fn placement(fp: &Footprint, p: &BudgetPlan) -> Placement {
    let warm = p.slots_per_layer as u64 * p.moe_layers as u64 * p.expert_ram;
    let cached_share = p.slots_per_layer as f64 / p.experts_per_layer.max(1) as f64;
    Placement {
        budget_bytes: p.budget,
        slack: p.reserves.clone(),
        slots_per_layer: p.slots_per_layer,
        warm_expert_bytes: warm,
        cold_expert_bytes: (fp.experts_disk_total as f64 * (1.0 - cached_share)) as u64,
        projected_peak_bytes: p.projected_peak,
        prefill_pass_positions: p.prefill_pass.positions,
        prefill_pass_bytes_per_position: p.prefill_pass.bytes_per_position,
        prefill_pass_sub_rows: p.prefill_pass.sub_rows,
        prefill_pass_sub_bytes_per_row: p.prefill_pass.sub_bytes_per_row,
        vram_bytes: 0,
    }
}

fn download(extents: &[ShardExtent]) -> Download {
    Download {
        shards: extents.len(),
        complete_shards: extents.iter().filter(|e| e.complete()).count(),
        bytes_on_disk: extents
            .iter()
            .map(|e| e.file_bytes.min(e.header_bytes))
            .sum(),
        bytes_total: extents.iter().map(|e| e.header_bytes).sum(),
        partial: extents
            .iter()
            .filter(|e| !e.complete())
            .map(|e| e.path.display().to_string())
            .collect(),
    }
}

/// The smallest budget in bytes whose plan exists and satisfies `enough`.
/// What the reserves take grows more slowly than the budget, so what is
/// left for experts only grows with it and a bisection finds the edge.
pub fn smallest_budget(
    fp: &Footprint,
    opts: &LoadOptions,
    enough: impl Fn(&BudgetPlan) -> bool,
) -> u64 {
    let fits = |b: u64| check_budget(fp, b, opts).is_ok_and(|p| enough(&p));
    let mut hi = 1u64 << 20;
    while !fits(hi) {
        if hi >= 1 << 62 {
            return u64::MAX;
        }
        hi *= 2;
    }
    let mut lo = hi / 2; // does not fit (or is below 1 MiB)
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

/// `bytes` as GB (10^9, as `--ram-gb` reads it) rounded up to 0.01, so
/// that passing the figure back gives at least `bytes`.
pub fn gb_at_least(bytes: u64) -> f64 {
    let mut gb = (bytes as f64 / 1e7).ceil() / 100.0;
    while ((gb * 1e9) as u64) < bytes {
        gb += 0.01;
    }
    gb
}

/// Predicted reads and speed of one decoded token.
///
/// Reads: a layer misses `top_k × (1 − slots/experts)` experts per token
/// when routing is uniform (the worst case for a cache; skewed routing and
/// pins from a usage history hit more, so read less). Time: those bytes at
/// the disk's measured rate, plus the compute of one token (from a tuned
/// decode when there is one, otherwise the bytes one token touches at the
/// measured memory bandwidth), not overlapped (pipelining only helps).
#[derive(Clone, Debug, Serialize)]
pub struct Prediction {
    pub mb_read_per_token: f64,
    pub hit_rate: f64,
    pub disk_gb_per_s: f64,
    pub compute_s_per_token: f64,
    pub tok_per_s: f64,
    /// `disk` or `compute`: the larger share of a token's time.
    pub bottleneck: &'static str,
    /// Where the disk and compute figures come from.
    pub source: String,
}

/// What a prediction is made from.
#[derive(Clone, Debug)]
pub struct Rates {
    pub disk_gb_per_s: f64,
    /// Seconds of compute per token, if measured by a tuned decode.
    pub compute_s_per_token: Option<f64>,
    /// Memory read bandwidth, GB/s (used when compute is not measured).
    pub mem_gb_per_s: Option<f64>,
    pub source: String,
}

/// The prediction for `plan` at `slots` per layer from `rates`.
pub fn predict(plan: &Plan, slots: usize, rates: &Rates) -> Prediction {
    let e = &plan.experts;
    let hit_rate = (slots as f64 / e.per_layer.max(1) as f64).min(1.0);
    let misses = e.moe_layers as f64 * e.top_k as f64 * (1.0 - hit_rate);
    let bytes = misses * e.disk_bytes as f64;
    let disk_s = bytes / (rates.disk_gb_per_s.max(1e-6) * 1e9);
    // Without a tuned decode: every resident byte but the embeddings (one
    // row read per token) and the active experts pass through memory.
    let touched = plan.resident_total_bytes - plan.resident_bytes.get("embed").unwrap_or(&0)
        + (e.moe_layers * e.top_k) as u64 * e.ram_bytes;
    let compute_s = rates
        .compute_s_per_token
        .unwrap_or_else(|| touched as f64 / (rates.mem_gb_per_s.unwrap_or(10.0).max(1e-3) * 1e9));
    Prediction {
        mb_read_per_token: bytes / 1e6,
        hit_rate,
        disk_gb_per_s: rates.disk_gb_per_s,
        compute_s_per_token: compute_s,
        tok_per_s: 1.0 / (disk_s + compute_s).max(1e-9),
        bottleneck: if disk_s > compute_s {
            "disk"
        } else {
            "compute"
        },
        source: rates.source.clone(),
    }
}

/// The rates a tuned profile measured: its read mode's best disk rate,
/// and the compute of its winning decode (its time less its reads).
pub fn rates_from_profile(p: &crate::fs::tuned::TunedProfile, path: &Path) -> Option<Rates> {
    let disk = p
        .disk
        .iter()
        .filter(|d| d.read_mode == p.read_mode)
        .map(|d| d.gb_per_s)
        .fold(0.0, f64::max);
    if disk <= 0.0 {
        return None;
    }
    let best = p
        .probes
        .iter()
        .filter(|q| q.decode_tok_s > 0.0)
        .max_by(|a, b| a.decode_tok_s.total_cmp(&b.decode_tok_s));
    let compute =
        best.map(|q| (1.0 / q.decode_tok_s - q.mb_read_per_token / (disk * 1e3)).max(0.0));
    Some(Rates {
        disk_gb_per_s: disk,
        compute_s_per_token: compute,
        mem_gb_per_s: None,
        source: format!("tuned profile {}", path.display()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gb_figures_round_up_to_what_they_name() {
        for b in [
            1u64,
            999_999_999,
            2_350_000_000,
            2_350_000_001,
            7_000_000_000,
        ] {
            let gb = gb_at_least(b);
            assert!((gb * 1e9) as u64 >= b, "{b} -> {gb}");
            assert!(
                ((gb - 0.011) * 1e9) < b as f64,
                "{b} -> {gb} is not the least"
            );
        }
    }
}
