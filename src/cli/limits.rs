//! Range checks of the numeric flags that feed arithmetic, allocation or
//! `Duration` arithmetic, each against a named limit, before anything uses
//! them: a value out of range is refused with an error naming the flag and
//! the range (a count of 2^64 - 1 overflowed a sum, or sized a vector,
//! and a duration of 1e300 seconds panicked in `Duration::from_secs_f64`).
//! A value that only caps itself (more cache slots than a layer has
//! experts) is used clamped, with a line on stderr saying so.
//!
//! The limits sit far above any real use and far below what overflows.

use super::ModelArgs;
use anyhow::{bail, Result};
use moestream::model::Model;
use std::ops::RangeInclusive;

/// Most MoE layers ahead a lookahead prefetches (`--prefetch-depth`).
pub(super) const PREFETCH_DEPTH_MAX: usize = 64;
/// Most context positions a plan reserves (`--context`; the model's own
/// maximum clamps it further).
pub(super) const CONTEXT_MAX: usize = 1 << 24;
/// Largest RAM budget, in GB (`--ram-gb`): a petabyte.
pub(super) const RAM_GB_MAX: f64 = 1e6;
/// Longest disk probe or tuning cell, in seconds.
pub(super) const SECONDS_MAX: f64 = 600.0;
/// Most repetitions, rounds, pairs or epochs a measuring command runs.
pub(super) const REPEATS_MAX: usize = 10_000;
/// Most concurrent clients of `bench serve`.
pub(super) const CLIENTS_MAX: usize = 4096;

/// `v` of flag `flag` (spelled with its dashes) if it lies in `range`.
pub(super) fn count(flag: &str, v: usize, range: RangeInclusive<usize>) -> Result<usize> {
    if !range.contains(&v) {
        bail!("{flag} {v} is outside {}..={}", range.start(), range.end());
    }
    Ok(v)
}

/// Seconds `s` of flag `flag` if finite and in `0..=max`.
pub(super) fn seconds(flag: &str, s: f64, max: f64) -> Result<f64> {
    if !(s.is_finite() && (0.0..=max).contains(&s)) {
        bail!("{flag} {s:?} is outside 0..={max:?} seconds");
    }
    Ok(s)
}

/// The model flags every loading command shares, checked before any is
/// used (`--threads`, `--cache-aware-routing` and `--quantize-at-load` are
/// checked where they are read).
pub(super) fn model_args(m: &ModelArgs) -> Result<()> {
    count("--prefetch-depth", m.prefetch_depth, 1..=PREFETCH_DEPTH_MAX)?;
    if let Some(c) = m.context {
        count("--context", c, 1..=CONTEXT_MAX)?;
    }
    if let Some(gb) = m.budget_gb() {
        if !(gb > 0.0 && gb <= RAM_GB_MAX) {
            bail!("--ram-gb {gb:?} is outside (0, {RAM_GB_MAX:?}] GB");
        }
    }
    Ok(())
}

/// Says on stderr which model flags `model` used clamped: more cache slots
/// than its largest layer has experts, more context than the model's
/// positions.
pub(super) fn note_clamps(m: &ModelArgs, model: &Model) {
    let positions = model.cfg.rope.max_position_embeddings;
    if let Some(c) = m.context.filter(|&c| c > positions) {
        eprintln!("--context {c}: using {positions} (the model's max_position_embeddings)");
    }
    let experts = model.cfg.num_experts;
    if model.plan.is_none() && experts > 0 && m.expert_cache > experts {
        eprintln!(
            "--expert-cache {}: using {experts} (the experts of a layer)",
            m.expert_cache
        );
    }
}
