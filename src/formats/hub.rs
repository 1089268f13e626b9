//! `--model org/name`: a model in the local Hugging Face hub cache, as
//! `huggingface-cli download` or `snapshot_download` leave it, resolved
//! offline. The cache is `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
//! `~/.cache/huggingface/hub`; a model lives in `models--org--name/`, its
//! snapshots in `snapshots/<commit>/`, and `refs/<revision>` names the
//! commit of a branch or tag (`main` by default). A revision may also be a
//! commit itself.

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// The hub cache directory this process would use.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("HF_HUB_CACHE") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("HF_HOME") {
        return Some(PathBuf::from(d).join("hub"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface/hub"))
}

/// Whether `spec` reads as a hub id (`org/name`) rather than a path: one
/// slash, no leading `.` or `/`, and no such file or directory.
pub fn looks_like_repo_id(spec: &str) -> bool {
    let parts: Vec<&str> = spec.split('/').collect();
    parts.len() == 2
        && parts.iter().all(|p| !p.is_empty() && !p.starts_with('.'))
        && !Path::new(spec).exists()
}

/// The snapshot directory of `repo` (`org/name`) at `revision` (`main`
/// when `None`) in the hub cache `cache`. A missing model, revision or
/// snapshot is an error listing what the cache holds.
pub fn resolve_in(cache: &Path, repo: &str, revision: Option<&str>) -> Result<PathBuf> {
    let dir = cache.join(format!("models--{}", repo.replace('/', "--")));
    if !dir.is_dir() {
        return Err(Error::Request(format!(
            "model `{repo}` is not in the Hugging Face cache {} (it holds: {})",
            cache.display(),
            list(cache, "models--").join(", ")
        )));
    }
    let revision = revision.unwrap_or("main");
    let refs = dir.join("refs").join(revision);
    let commit = if refs.is_file() {
        crate::fs::read_to_string(&refs, crate::fs::read::JSON_SIDE_FILE)?
            .trim()
            .to_string()
    } else {
        revision.to_string()
    };
    let snapshot = dir.join("snapshots").join(&commit);
    if !snapshot.is_dir() {
        return Err(Error::Request(format!(
            "model `{repo}` has no snapshot for revision `{revision}` in {} (refs: {}; snapshots: {})",
            dir.display(),
            list(&dir.join("refs"), "").join(", "),
            list(&dir.join("snapshots"), "").join(", ")
        )));
    }
    Ok(snapshot)
}

/// `spec` as a model directory: a path as it is, or a hub id resolved in
/// [`cache_dir`].
pub fn resolve(spec: &Path, revision: Option<&str>) -> Result<PathBuf> {
    let Some(s) = spec.to_str().filter(|s| looks_like_repo_id(s)) else {
        return Ok(spec.to_path_buf());
    };
    let cache = cache_dir().ok_or_else(|| {
        Error::Request(format!(
            "`{s}` is neither a directory nor findable: no HOME for the hub cache"
        ))
    })?;
    resolve_in(&cache, s, revision)
}

/// Names in `dir` (with `prefix` stripped, `--` shown as `/`), sorted;
/// `(none)` when there are none.
fn list(dir: &Path, prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    let n = e.file_name().to_string_lossy().to_string();
                    n.strip_prefix(prefix).map(|n| n.replace("--", "/"))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    if v.is_empty() {
        v.push("(none)".into());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hub-layout cache: `models--acme--tiny` with blobs, a snapshot of
    /// symlinks, and `refs/main`.
    fn hub() -> tempfile::TempDir {
        let cache = tempfile::tempdir().unwrap();
        let m = cache.path().join("models--acme--tiny");
        std::fs::create_dir_all(m.join("blobs")).unwrap();
        std::fs::create_dir_all(m.join("refs")).unwrap();
        std::fs::write(m.join("blobs/abc"), b"{}").unwrap();
        for commit in ["c0ffee", "beef01"] {
            let snap = m.join("snapshots").join(commit);
            std::fs::create_dir_all(&snap).unwrap();
            std::os::unix::fs::symlink("../../blobs/abc", snap.join("config.json")).unwrap();
        }
        std::fs::write(m.join("refs/main"), "c0ffee\n").unwrap();
        std::fs::write(m.join("refs/v2"), "beef01").unwrap();
        cache
    }

    #[test]
    fn ids_resolve_to_snapshots_by_ref_or_commit() {
        let cache = hub();
        let c = cache.path();
        let snap = |rev| resolve_in(c, "acme/tiny", rev).unwrap();
        assert!(snap(None).ends_with("snapshots/c0ffee"));
        assert!(snap(Some("v2")).ends_with("snapshots/beef01"));
        assert!(snap(Some("beef01")).ends_with("snapshots/beef01"));
        assert!(snap(None).join("config.json").is_file());
    }

    #[test]
    fn what_is_missing_is_named_with_what_is_there() {
        let cache = hub();
        let c = cache.path();
        let e = resolve_in(c, "acme/huge", None).unwrap_err().to_string();
        assert!(e.contains("acme/huge") && e.contains("acme/tiny"), "{e}");
        let e = resolve_in(c, "acme/tiny", Some("v9"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("v9") && e.contains("main") && e.contains("c0ffee"),
            "{e}"
        );
    }

    #[test]
    fn paths_are_not_ids() {
        assert!(looks_like_repo_id("org/name-that-is-not-here"));
        for p in ["./a/b", "/abs", "one", "a/b/c", "../x", "a/"] {
            assert!(!looks_like_repo_id(p), "{p}");
        }
    }
}
