//! A trace read back for the replay: per run and MoE layer, the layer's
//! fetches in order, each with the rows' selections (for the usage
//! counters policies read), the union of experts it looked up (sorted, as
//! the store looks them up), the usable slots it had, its lookahead guesses
//! and, per looked-up expert, the access at which the layer next looks it
//! up (Belady's input). Also what the run itself counted (hits, misses,
//! pinned hits), from the `tier` column.

use super::write::batches;
use super::{Result, Tier, TraceError, DEEPER_GUESSES, GUESSES};
use arrow_array::cast::AsArray;
use arrow_array::types::{UInt32Type, UInt64Type};
use arrow_array::{Array, ListArray, RecordBatch};
use std::ops::Range;
use std::path::Path;

/// Most decoder layers a trace may name (every `layer` is below it): far
/// above every real model; a run's per-layer tables are sized by the
/// largest `layer`.
pub const LAYERS_MAX: u32 = 1 << 14;
/// Most per-layer tables (one per run and layer up to its largest
/// `layer`) a trace read allocates, about 700 MB: 40,000 runs of a
/// 100-layer model. Each run's table is sized by its largest `layer`, so
/// without it many one-row runs naming a high layer would allocate far more
/// than the file holds.
pub const LAYER_TABLES_MAX: usize = 1 << 22;
/// Largest `expert_bytes` (and `bytes_read` item) a trace may hold, 64 GiB:
/// far above any real expert, low enough that a replay's byte sums cannot
/// overflow.
pub const EXPERT_BYTES_MAX: u64 = 1 << 36;
/// Largest `token` a trace may hold, 2^40 (a run's token count is the
/// largest plus one): with at most [`LAYER_TABLES_MAX`] runs, the token
/// counts of every run sum without overflow.
pub const TOKENS_MAX: u64 = 1 << 40;

/// One fetch of a layer: a forward's rows of it, served together.
#[derive(Clone, Debug)]
pub struct Fetch {
    /// Tokens forwarded in the run before this forward (the usage clock).
    pub clock: u64,
    /// Usable cache slots the run had (after growing for this fetch).
    pub slots: u32,
    /// Into [`LayerTrace::ids`] and [`LayerTrace::next`].
    pub ids: Range<usize>,
    /// Into [`LayerTrace::rows`].
    pub rows: Range<usize>,
    /// Per lookahead variant (attn, output): into [`LayerTrace::guesses`].
    pub guess: [Option<Range<usize>>; 2],
    /// The same from two decoder layers back (what a lookahead of depth 2
    /// also reads); `None` in version-1 traces.
    pub deeper: [Option<Range<usize>>; 2],
}

/// One MoE layer of one run.
#[derive(Clone, Debug, Default)]
pub struct LayerTrace {
    pub n_experts: usize,
    /// Bytes one expert read costs.
    pub expert_bytes: u64,
    pub fetches: Vec<Fetch>,
    /// Each fetch's looked-up experts, sorted and unique.
    pub ids: Vec<usize>,
    /// Per entry of `ids`: the index of the next fetch of this layer that
    /// looks the expert up (`u64::MAX`: none).
    pub next: Vec<u64>,
    /// Per row: its selections, a range of `picks`.
    pub rows: Vec<Range<usize>>,
    pub picks: Vec<usize>,
    pub guesses: Vec<usize>,
}

impl LayerTrace {
    /// Looked-up experts (accesses) of the layer.
    pub fn accesses(&self) -> usize {
        self.ids.len()
    }

    /// Fills [`LayerTrace::next`] from the fetches' `ids`: per looked-up
    /// expert, the next fetch that looks it up.
    pub fn fill_next(&mut self) {
        let experts = self.ids.iter().max().map_or(0, |&m| m + 1);
        let mut seen = vec![u64::MAX; experts];
        self.next = vec![u64::MAX; self.ids.len()];
        for (f, fetch) in self.fetches.iter().enumerate().rev() {
            for k in fetch.ids.clone() {
                let e = self.ids[k];
                self.next[k] = seen[e];
                seen[e] = f as u64;
            }
        }
    }
}

/// What the run counted itself (the `tier` column).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recorded {
    pub pinned_hits: u64,
    pub hits: u64,
    pub misses: u64,
    /// Of the misses, those a prefetch had read.
    pub prefetched: u64,
    pub bytes_read: u64,
}

/// One run of a trace.
#[derive(Clone, Debug, Default)]
pub struct Run {
    pub id: String,
    /// Tokens forwarded.
    pub tokens: u64,
    /// Indexed by store layer; empty for dense layers.
    pub layers: Vec<LayerTrace>,
    pub recorded: Recorded,
}

impl Run {
    /// Accesses (expert lookups) over every layer.
    pub fn accesses(&self) -> usize {
        self.layers.iter().map(LayerTrace::accesses).sum()
    }
}

/// The columns of one batch the replay reads.
struct Cols<'a> {
    run: &'a arrow_array::StringArray,
    token: &'a [u64],
    layer: &'a [u32],
    row: &'a [u32],
    experts: &'a ListArray,
    /// In [`GUESSES`] order: attn, output, then the deeper two.
    guess: [&'a ListArray; GUESSES],
    tier: &'a ListArray,
    bytes_read: &'a ListArray,
    slots: &'a [u32],
    n_experts: &'a [u32],
    expert_bytes: &'a [u64],
}

impl<'a> Cols<'a> {
    fn of(b: &'a RecordBatch) -> Cols<'a> {
        let col = |name: &str| b.column_by_name(name).expect("a checked column");
        Cols {
            run: col("run").as_string::<i32>(),
            token: col("token").as_primitive::<UInt64Type>().values(),
            layer: col("layer").as_primitive::<UInt32Type>().values(),
            row: col("row").as_primitive::<UInt32Type>().values(),
            experts: col("experts").as_list::<i32>(),
            guess: [
                col("guess_attn").as_list::<i32>(),
                col("guess_output").as_list::<i32>(),
                col(DEEPER_GUESSES[0]).as_list::<i32>(),
                col(DEEPER_GUESSES[1]).as_list::<i32>(),
            ],
            tier: col("tier").as_list::<i32>(),
            bytes_read: col("bytes_read").as_list::<i32>(),
            slots: col("slots").as_primitive::<UInt32Type>().values(),
            n_experts: col("n_experts").as_primitive::<UInt32Type>().values(),
            expert_bytes: col("expert_bytes").as_primitive::<UInt64Type>().values(),
        }
    }
}

/// The `u32` items of list `l`'s entry `i`.
fn u32s(l: &ListArray, i: usize) -> &[u32] {
    let o = l.value_offsets();
    let v = l.values().as_primitive::<UInt32Type>().values();
    &v[o[i] as usize..o[i + 1] as usize]
}

/// Range-checks every value of row `i` (the file's row `at`) that sizes
/// something or indexes it, against the row's own `n_experts` and the
/// named limits, before any of it is used: a layer below [`LAYERS_MAX`];
/// 1 to [`crate::formats::config::EXPERTS_MAX`] experts; chosen and guessed experts
/// below `n_experts`, at most `n_experts` of them; `slots` at most
/// `n_experts` (the store caps its caches there); byte counts at most
/// [`EXPERT_BYTES_MAX`]; `token` below [`TOKENS_MAX`].
fn check_row(c: &Cols, i: usize, at: u64, path: &Path) -> Result<()> {
    let bad = |what: String| Err(TraceError::format(path, format!("row {at}: {what}")));
    let n = c.n_experts[i];
    if n == 0 || n as usize > crate::formats::config::EXPERTS_MAX {
        let max = crate::formats::config::EXPERTS_MAX;
        return bad(format!("`n_experts` {n} is outside 1..={max}"));
    }
    let layer = c.layer[i];
    if layer >= LAYERS_MAX {
        return bad(format!("`layer` {layer} is not below {LAYERS_MAX}"));
    }
    if c.slots[i] > n {
        return bad(format!("`slots` {} exceeds `n_experts` {n}", c.slots[i]));
    }
    if c.expert_bytes[i] > EXPERT_BYTES_MAX {
        let b = c.expert_bytes[i];
        return bad(format!("`expert_bytes` {b} exceeds {EXPERT_BYTES_MAX}"));
    }
    if c.token[i] >= TOKENS_MAX {
        return bad(format!("`token` {} is not below {TOKENS_MAX}", c.token[i]));
    }
    let names = [
        "guess_attn",
        "guess_output",
        DEEPER_GUESSES[0],
        DEEPER_GUESSES[1],
    ];
    let guesses = names.into_iter().zip(c.guess);
    for (name, list) in [("experts", c.experts)].into_iter().chain(guesses) {
        if !list.is_valid(i) {
            continue;
        }
        let ids = u32s(list, i);
        if ids.len() > n as usize {
            return bad(format!("`{name}` lists {} experts of {n}", ids.len()));
        }
        if let Some(e) = ids.iter().find(|&&e| e >= n) {
            return bad(format!(
                "`{name}` holds expert {e}, not below `n_experts` {n}"
            ));
        }
    }
    let bytes = c.bytes_read.value(i);
    let bytes = bytes.as_primitive::<UInt64Type>();
    if let Some(b) = bytes.iter().flatten().find(|&b| b > EXPERT_BYTES_MAX) {
        return bad(format!("`bytes_read` holds {b}, over {EXPERT_BYTES_MAX}"));
    }
    Ok(())
}

/// Builds the runs row by row.
#[derive(Default)]
struct Builder {
    runs: Vec<Run>,
    /// The fetch being read: (layer) of the last run.
    open: Option<usize>,
    /// (expert, tier) of the open fetch's rows.
    tiers: Vec<(usize, Tier)>,
    /// Per-layer tables allocated over every run (see [`LAYER_TABLES_MAX`]).
    tables: usize,
}

impl Builder {
    fn row(&mut self, c: &Cols, i: usize, at: u64, path: &Path) -> Result<()> {
        check_row(c, i, at, path)?;
        let run = c.run.value(i);
        if self.runs.last().is_none_or(|r| r.id != run) {
            self.close();
            self.runs.push(Run {
                id: run.to_owned(),
                ..Run::default()
            });
        }
        let layer = c.layer[i] as usize;
        if c.row[i] == 0 || self.open != Some(layer) {
            self.close();
            self.open = Some(layer);
            self.start(c, i, layer)
                .map_err(|what| TraceError::format(path, format!("row {at}: {what}")))?;
        }
        let r = self.runs.last_mut().expect("a run");
        r.tokens = r.tokens.max(c.token[i] + 1);
        let l = &mut r.layers[layer];
        let picks = u32s(c.experts, i);
        let start = l.picks.len();
        l.picks.extend(picks.iter().map(|&e| e as usize));
        l.rows.push(start..l.picks.len());
        l.fetches.last_mut().expect("an open fetch").rows.end = l.rows.len();
        let tiers = c.tier.value(i);
        let tiers = tiers.as_string::<i32>();
        let bytes = c.bytes_read.value(i);
        let bytes = bytes.as_primitive::<UInt64Type>().values();
        if tiers.len() != picks.len() {
            return Err(TraceError::format(
                path,
                "a row's tier list is not its experts'",
            ));
        }
        for (k, &e) in picks.iter().enumerate() {
            let tier = Tier::from_name(tiers.value(k))
                .ok_or_else(|| TraceError::format(path, format!("tier `{}`", tiers.value(k))))?;
            self.tiers.push((e as usize, tier));
            let b = bytes.get(k).copied().unwrap_or(0);
            r.recorded.bytes_read = r.recorded.bytes_read.saturating_add(b);
        }
        Ok(())
    }

    /// Opens a fetch of `layer` at row `i` (checked by [`check_row`]); a
    /// layer whose `n_experts` changes within a run is refused.
    fn start(&mut self, c: &Cols, i: usize, layer: usize) -> std::result::Result<(), String> {
        let r = self.runs.last_mut().expect("a run");
        if r.layers.len() <= layer {
            self.tables += layer + 1 - r.layers.len();
            if self.tables > LAYER_TABLES_MAX {
                return Err(format!(
                    "its runs name more than {LAYER_TABLES_MAX} layers in all (layer {layer} of run {})",
                    r.id
                ));
            }
            r.layers.resize_with(layer + 1, LayerTrace::default);
        }
        let l = &mut r.layers[layer];
        let n = c.n_experts[i] as usize;
        if !l.fetches.is_empty() && l.n_experts != n {
            return Err(format!(
                "`n_experts` {n} of layer {layer}, which earlier rows of run {} gave {}",
                r.id, l.n_experts
            ));
        }
        l.n_experts = n;
        l.expert_bytes = c.expert_bytes[i];
        let mut guess: [Option<Range<usize>>; GUESSES] = Default::default();
        for (g, list) in guess.iter_mut().zip(c.guess) {
            if list.is_valid(i) {
                let start = l.guesses.len();
                l.guesses.extend(u32s(list, i).iter().map(|&e| e as usize));
                *g = Some(start..l.guesses.len());
            }
        }
        let [a1, o1, a2, o2] = guess;
        l.fetches.push(Fetch {
            clock: c.token[i],
            slots: c.slots[i],
            ids: l.ids.len()..l.ids.len(),
            rows: l.rows.len()..l.rows.len(),
            guess: [a1, o1],
            deeper: [a2, o2],
        });
        Ok(())
    }

    /// Closes the open fetch: its union of experts, and the run's counts.
    fn close(&mut self) {
        let Some(layer) = self.open.take() else {
            return;
        };
        let r = self.runs.last_mut().expect("a run");
        let l = &mut r.layers[layer];
        self.tiers.sort_unstable_by_key(|&(e, _)| e);
        self.tiers.dedup_by_key(|&mut (e, _)| e);
        let start = l.ids.len();
        for &(e, tier) in &self.tiers {
            l.ids.push(e);
            match tier {
                Tier::Pinned => r.recorded.pinned_hits += 1,
                Tier::Warm => r.recorded.hits += 1,
                Tier::Prefetched => {
                    r.recorded.misses += 1;
                    r.recorded.prefetched += 1;
                }
                Tier::Miss => r.recorded.misses += 1,
            }
        }
        self.tiers.clear();
        l.fetches.last_mut().expect("an open fetch").ids = start..l.ids.len();
    }

    fn finish(mut self) -> Vec<Run> {
        self.close();
        for r in &mut self.runs {
            for l in &mut r.layers {
                l.fill_next();
            }
        }
        self.runs
    }
}

/// Reads the runs of the trace at `path` (only run `only`, if given).
pub fn read(path: &Path, only: Option<&str>) -> Result<Vec<Run>> {
    let mut b = Builder::default();
    let mut at = 0u64;
    for batch in batches(path)? {
        let batch = batch?;
        let c = Cols::of(&batch);
        for i in 0..batch.num_rows() {
            if only.is_none_or(|id| id == c.run.value(i)) {
                b.row(&c, i, at, path)?;
            }
            at += 1;
        }
    }
    Ok(b.finish())
}
