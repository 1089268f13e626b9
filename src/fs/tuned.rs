//! Per-disk tuned profiles (`moestream tune`, `--io auto`).
//!
//! Which read mode, and whether pipelining and lookahead prefetch pay, is a
//! property of the disk *and* the model (expert size, how skewed routing
//! is), so it is measured, not guessed. `moestream tune` measures the disk
//! with expert-sized reads and decodes a few tokens in each candidate
//! configuration; the winner is saved as a [`TunedProfile`] under the cache
//! directory, keyed by the block device holding the model and by the model
//! itself ([`profile_path`]). `run`, `eval` and `bench decode` load it when
//! `--io`, `--pipeline` and `--prefetch` are left at `auto`.
//!
//! Profiles are written to a temp file and renamed; one that cannot be read
//! or parsed is ignored with a warning by the caller, never trusted.

use crate::error::{Error, Result};
use crate::fs::state::model_key;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Bumped when the profile's meaning changes; older files are ignored.
pub const PROFILE_VERSION: u32 = 1;

/// One measured decode configuration.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Probe {
    pub read_mode: String,
    pub pipeline: bool,
    /// `"off"` or the lookahead as `from-depth` (e.g. `attn-1`).
    pub prefetch: String,
    pub decode_tok_s: f64,
    pub mb_read_per_token: f64,
    pub overlap: f64,
}

/// One point of the disk sweep.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DiskPoint {
    pub read_mode: String,
    /// Reads in flight (threads for synchronous modes).
    pub depth: usize,
    pub read_bytes: usize,
    pub gb_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// What `tune` chose, and the measurements behind the choice.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TunedProfile {
    pub version: u32,
    /// The block device (`vda`, or `dev-MAJ:MIN` when unnamed).
    pub device: String,
    /// The model directory, as given to `tune`.
    pub model: String,
    pub read_mode: String,
    pub pipeline: bool,
    pub prefetch: String,
    /// The `--ram-gb` the probes ran under, if any.
    pub ram_gb: Option<f64>,
    pub disk: Vec<DiskPoint>,
    pub probes: Vec<Probe>,
}

/// Where the profile of the model in `dir` on its disk lives:
/// `<cache>/tune/<device>-<model key>.json`, `<cache>` being the moestream
/// cache directory.
pub fn profile_path(dir: &Path) -> Result<PathBuf> {
    profile_path_in(&crate::fs::state::cache_dir(), dir)
}

/// [`profile_path`] under the cache directory `cache`.
pub fn profile_path_in(cache: &Path, dir: &Path) -> Result<PathBuf> {
    let device = crate::fs::state::device_of(dir)?;
    let key = model_key(dir)?;
    Ok(cache.join("tune").join(format!("{device}-{key:016x}.json")))
}

/// Saves `profile` for the model in `dir` (temp file + rename); returns
/// the path.
pub fn save(dir: &Path, profile: &TunedProfile) -> Result<PathBuf> {
    save_in(&crate::fs::state::cache_dir(), dir, profile)
}

/// [`save`] under the cache directory `cache`.
pub fn save_in(cache: &Path, dir: &Path, profile: &TunedProfile) -> Result<PathBuf> {
    let path = profile_path_in(cache, dir)?;
    let parent = path.parent().expect("the profile path has a directory");
    std::fs::create_dir_all(parent).map_err(|e| Error::file(parent, e))?;
    let json = serde_json::to_vec_pretty(profile).expect("a profile serializes");
    crate::fs::write(&path, &json)?;
    Ok(path)
}

/// The saved profile for the model in `dir`, if there is one: `Ok(None)`
/// when none was saved, an error naming the file when it is unreadable,
/// malformed or of another version.
pub fn load(dir: &Path) -> Result<Option<(PathBuf, TunedProfile)>> {
    load_in(&crate::fs::state::cache_dir(), dir)
}

/// [`load`] under the cache directory `cache`.
pub fn load_in(cache: &Path, dir: &Path) -> Result<Option<(PathBuf, TunedProfile)>> {
    let path = profile_path_in(cache, dir)?;
    if !path.exists() {
        return Ok(None);
    }
    let text = crate::fs::read_to_string(&path, crate::fs::read::JSON_SIDE_FILE)?;
    let p: TunedProfile = serde_json::from_str(&text)
        .map_err(|e| Error::Request(format!("tuned profile {}: {e}", path.display())))?;
    if p.version != PROFILE_VERSION {
        return Err(Error::Request(format!(
            "tuned profile {}: version {} (this build reads {PROFILE_VERSION}; rerun `moestream tune`)",
            path.display(),
            p.version
        )));
    }
    Ok(Some((path, p)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::state::device_of;

    fn model_dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("config.json"), b"{}").unwrap();
        std::fs::write(d.path().join("a.safetensors"), [0u8; 10]).unwrap();
        d
    }

    #[test]
    fn the_key_follows_the_model_contents() {
        let d = model_dir();
        let k = model_key(d.path()).unwrap();
        assert_eq!(k, model_key(d.path()).unwrap());
        std::fs::write(d.path().join("a.safetensors"), [0u8; 11]).unwrap();
        let k2 = model_key(d.path()).unwrap();
        assert_ne!(k, k2, "a resized shard is a new model");
        std::fs::write(d.path().join("config.json"), b"{\"x\":1}").unwrap();
        assert_ne!(k2, model_key(d.path()).unwrap());
        assert!(!device_of(d.path()).unwrap().is_empty());
    }

    #[test]
    fn profiles_round_trip_and_bad_ones_are_named() {
        let cache = tempfile::tempdir().unwrap();
        let c = cache.path();
        let d = model_dir();
        assert!(load_in(c, d.path()).unwrap().is_none());
        let p = TunedProfile {
            version: PROFILE_VERSION,
            device: device_of(d.path()).unwrap(),
            model: d.path().display().to_string(),
            read_mode: "direct".into(),
            pipeline: true,
            prefetch: "attn-1".into(),
            ram_gb: Some(2.0),
            disk: vec![],
            probes: vec![],
        };
        let path = save_in(c, d.path(), &p).unwrap();
        assert!(path.starts_with(c));
        assert_eq!(load_in(c, d.path()).unwrap().unwrap().1, p);
        std::fs::write(&path, b"{not json").unwrap();
        let e = load_in(c, d.path()).unwrap_err().to_string();
        assert!(e.contains(&path.display().to_string()), "{e}");
        let mut old = p.clone();
        old.version = 0;
        std::fs::write(&path, serde_json::to_vec(&old).unwrap()).unwrap();
        let e = load_in(c, d.path()).unwrap_err().to_string();
        assert!(e.contains("version 0"), "{e}");
    }
}
