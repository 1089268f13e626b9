//! Where moestream keeps what it learns about a model between runs: the
//! expert usage history (for pinning) lives under the cache directory
//! (`$MOESTREAM_CACHE`, else `$XDG_CACHE_HOME/moestream`, else
//! `~/.cache/moestream`), in `models/<key>/`, never in the model directory,
//! which may be read-only or shared (a hub cache, a mounted disk). The key
//! is [`crate::tune::model_key`]: the model's canonical path, its
//! config.json and every shard's name and size, so a rewritten model starts
//! a fresh history. Tuned profiles live beside it, in `tune/`.

use crate::error::Result;
use std::path::{Path, PathBuf};

/// The state directory of the model in `dir` (not created).
pub fn model_state_dir(dir: &Path) -> Result<PathBuf> {
    model_state_dir_in(&crate::synth::cache_dir(), dir)
}

/// [`model_state_dir`] under the cache directory `cache`.
pub fn model_state_dir_in(cache: &Path, dir: &Path) -> Result<PathBuf> {
    let key = crate::tune::model_key(dir)?;
    Ok(cache.join("models").join(format!("{key:016x}")))
}

/// The usage history of the model in `dir`.
pub fn history_path(dir: &Path) -> Result<PathBuf> {
    Ok(model_state_dir(dir)?.join(crate::store::usage::HISTORY_FILE))
}

/// Removes the entries of `dir` named `PREFIX<pid>...` (temp files and
/// directories of an interrupted writer) whose process is gone. Entries of
/// live processes, and anything unreadable, are left alone.
pub fn remove_stale(dir: &Path, prefix: &str) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in rd.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(prefix)) else {
            continue;
        };
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let Ok(pid) = digits.parse::<u32>() else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let path = entry.path();
        let _ = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_temp_entries_of_dead_processes_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        // A pid above the kernel's maximum (4194304) never runs.
        let dead = dir.path().join("usage.json.tmp-99999999-0");
        let dead_dir = dir.path().join(".m.tmp-99999998");
        let live = dir
            .path()
            .join(format!("usage.json.tmp-{}-3", std::process::id()));
        let other = dir.path().join("usage.json");
        for f in [&dead, &live, &other] {
            std::fs::write(f, b"x").unwrap();
        }
        std::fs::create_dir(&dead_dir).unwrap();
        remove_stale(dir.path(), "usage.json.tmp-");
        remove_stale(dir.path(), ".m.tmp-");
        assert!(!dead.exists() && !dead_dir.exists());
        assert!(live.exists() && other.exists());
    }
}
