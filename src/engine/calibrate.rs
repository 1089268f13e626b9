//! Calibration (`moestream calibrate`): the model runs teacher-forced over
//! a text, window by window, with the activation taps on
//! ([`crate::layers::tap`]); what they record becomes an [`Importance`]:
//! per input, the mean square of each column over the rows that passed
//! (every token for attention, dense MLPs, shared experts and lm_head; the
//! tokens routed to it for a routed expert).

use crate::error::{Error, Result};
use crate::formats::quant::importance::{Column, Importance};
use crate::layers::tap::{self, Block, Part, Recorder, Site};
use crate::model::profile::Profile;
use crate::model::Model;
use std::path::Path;

/// Runs `model` over `ids` in windows of `window` positions (each from an
/// empty KV cache) and returns what the taps recorded, to be written to
/// `origin`. The model's tokens are not changed by the taps.
pub fn calibrate(model: &Model, ids: &[u32], window: usize, origin: &Path) -> Result<Importance> {
    let most = model.cfg.rope.max_position_embeddings;
    if window == 0 || window > most {
        return Err(Error::Setting {
            name: "window",
            reason: format!("{window} positions: must be 1..={most} (the model's context)"),
        });
    }
    if ids.is_empty() {
        return Err(Error::Request(
            "calibration needs at least one token".into(),
        ));
    }
    tap::install();
    let run = ids.chunks(window).try_for_each(|chunk| {
        let mut kv = model.new_kv(chunk.len());
        model
            .prefill(chunk, &mut kv, true, &mut Profile::default())
            .map(drop)
    });
    let recorded = tap::finish();
    run?;
    Ok(importance_of(recorded, ids.len() as u64, origin))
}

/// The mean squares of what was recorded, under [`key_of_site`] keys.
fn importance_of(r: Recorder, tokens: u64, origin: &Path) -> Importance {
    let inputs = r
        .sites
        .into_iter()
        .map(|(site, sums)| {
            let rows = sums.rows.max(1) as f64;
            let mean_squares = sums.squares.iter().map(|s| (s / rows) as f32).collect();
            let column = Column {
                mean_squares,
                rows: sums.rows,
            };
            (key_of_site(site), column)
        })
        .collect();
    Importance {
        origin: origin.to_path_buf(),
        inputs,
        tokens,
    }
}

/// The importance-file key of a tap site (the keys
/// [`crate::formats::quant::importance::key_of_tensor`] looks up).
pub fn key_of_site(site: Site) -> String {
    let Site::Layer(l, part) = site else {
        return "head".into();
    };
    let block = |b: Block| match b {
        Block::Dense => "dense".to_string(),
        Block::Shared => "shared".to_string(),
        Block::Expert(e) => format!("expert.{e}"),
    };
    let input = match part {
        Part::AttnIn => "attn_in".to_string(),
        Part::AttnOut => "attn_out".to_string(),
        Part::QLatent => "q_latent".to_string(),
        Part::MlpIn(b) => format!("{}.in", block(b)),
        Part::MlpDown(b) => format!("{}.down", block(b)),
    };
    format!("layers.{l}.{input}")
}
