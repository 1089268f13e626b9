//! Where moestream keeps what it learns about a model between runs: the
//! expert usage history (for pinning) lives under the cache directory
//! (`$MOESTREAM_CACHE`, else `$XDG_CACHE_HOME/moestream`, else
//! `~/.cache/moestream`), in `models/<key>/`, never in the model directory,
//! which may be read-only or shared (a hub cache, a mounted disk). The key
//! is [`crate::lab::tune::model_key`]: the model's canonical path, its
//! config.json and every shard's name and size, so a rewritten model starts
//! a fresh history. Tuned profiles live beside it, in `tune/`. Stale temp
//! files are removed by [`crate::fs::remove_stale`].

use crate::error::Result;
use std::path::{Path, PathBuf};

/// The state directory of the model in `dir` (not created).
pub fn model_state_dir(dir: &Path) -> Result<PathBuf> {
    model_state_dir_in(&crate::lab::synth::cache_dir(), dir)
}

/// [`model_state_dir`] under the cache directory `cache`.
pub fn model_state_dir_in(cache: &Path, dir: &Path) -> Result<PathBuf> {
    let key = crate::lab::tune::model_key(dir)?;
    Ok(cache.join("models").join(format!("{key:016x}")))
}

/// The usage history of the model in `dir`.
pub fn history_path(dir: &Path) -> Result<PathBuf> {
    Ok(model_state_dir(dir)?.join(crate::store::usage::HISTORY_FILE))
}
