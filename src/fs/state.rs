//! Where moestream keeps what it learns about a model between runs: the
//! expert usage history (for pinning) lives under the cache directory
//! (`$MOESTREAM_CACHE`, else `$XDG_CACHE_HOME/moestream`, else
//! `~/.cache/moestream`), in `models/<key>/`, never in the model directory,
//! which may be read-only or shared (a hub cache, a mounted disk). The key
//! is [`model_key`]: the model's canonical path, its
//! config.json and every shard's name and size, so a rewritten model starts
//! a fresh history. Tuned profiles live beside it, in `tune/`. Stale temp
//! files are removed by [`crate::fs::remove_stale`].

use crate::error::{Error, Result};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The state directory of the model in `dir` (not created).
pub fn model_state_dir(dir: &Path) -> Result<PathBuf> {
    model_state_dir_in(&cache_dir(), dir)
}

/// [`model_state_dir`] under the cache directory `cache`.
pub fn model_state_dir_in(cache: &Path, dir: &Path) -> Result<PathBuf> {
    let key = model_key(dir)?;
    Ok(cache.join("models").join(format!("{key:016x}")))
}

/// Where `demo` keeps its model: `$MOESTREAM_CACHE`, else
/// `$XDG_CACHE_HOME/moestream`, else `~/.cache/moestream`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("MOESTREAM_CACHE") {
        return PathBuf::from(d);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("moestream")
}

/// The block device holding `path`: its kernel name where sysfs tells it.
pub fn device_of(path: &Path) -> Result<String> {
    let meta = std::fs::metadata(path).map_err(|e| Error::file(path, e))?;
    let dev = meta.dev();
    let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
    let uevent = format!("/sys/dev/block/{major}:{minor}/uevent");
    let name = std::fs::read_to_string(uevent).ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("DEVNAME=").map(str::to_owned))
    });
    Ok(name.unwrap_or_else(|| format!("dev-{major}:{minor}")))
}

/// A key of the model: FNV-1a over its canonical path, config.json and the
/// name and size of every shard, so a rewritten model gets a new profile.
pub fn model_key(dir: &Path) -> Result<u64> {
    let canon = dir.canonicalize().map_err(|e| Error::file(dir, e))?;
    let mut h = Fnv::default();
    h.update(canon.as_os_str().as_encoded_bytes());
    // A model given as one file is a GGUF file: its path and size key it.
    if !dir.is_dir() {
        let len = std::fs::metadata(dir)
            .map_err(|e| Error::file(dir, e))?
            .len();
        h.update(&len.to_le_bytes());
        return Ok(h.0);
    }
    let config = dir.join("config.json");
    h.update(crate::fs::read_to_string(&config, crate::fs::read::JSON_SIDE_FILE)?.as_bytes());
    let mut shards: Vec<(String, u64)> = std::fs::read_dir(dir)
        .map_err(|e| Error::file(dir, e))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let len = e.metadata().ok()?.len();
            name.ends_with(".safetensors").then_some((name, len))
        })
        .collect();
    shards.sort();
    for (name, len) in shards {
        h.update(name.as_bytes());
        h.update(&len.to_le_bytes());
    }
    Ok(h.0)
}

#[derive(Clone, Copy)]
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}
