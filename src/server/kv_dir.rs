//! `--kv-dir`: the server's kept prefixes on disk, one [`crate::engine::kv_file`]
//! per prefix, named `<16 hex digits>.kv` by a hash of its tokens. Saved
//! when the server goes idle and at shutdown, restored at start.
//!
//! Invariants:
//! - One server per directory: [`KvDir::new`] takes an exclusive lock
//!   (`.moestream-kv.lock`); a second server fails at start, naming the
//!   directory and the holder.
//! - Only files this runtime wrote are touched: the name pattern and the KV
//!   magic. A user's file, even one named `*.kv`, is never read past its
//!   magic nor removed; neither is a file of another model.
//! - KV is keyed to the weights' content, not only their names and sizes:
//!   the key hashes [`crate::fs::state::model_key`] with each weight file's
//!   [`crate::fs::print::Print`] (size, mtime, first and last MiB), so
//!   weights rewritten in place refuse the old KV (and it is removed).
//! - Restoring is bounded: headers are read first, and only the newest
//!   files the prefix slots (and the RAM plan's positions) can hold are
//!   read whole.
//! - A slot file (`POST /slots/{id}?action=save`, llama-server's) has the
//!   name the client gave, checked by [`check_slot_name`] to be a plain
//!   file name inside the directory that none of the automatic files or
//!   the lock can have; the automatic sweep never touches it.

use crate::engine::kv_file::{self, Head};
use crate::engine::Prefix;
use crate::error::{Error, Result};
use crate::fs::lock::Lock;
use crate::model::kv::KvLayout;
use crate::model::Model;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

/// The KV directory of one model, locked for this process.
pub struct KvDir {
    dir: PathBuf,
    model_key: u64,
    /// The model's canonical path, recorded in every file written.
    model_dir: String,
    /// The files of this model (restored or written): the only ones
    /// [`KvDir::save`] may remove.
    owned: HashSet<PathBuf>,
    _lock: Lock,
}

const EXT: &str = "kv";
/// The lock file that keeps a second server out.
pub const LOCK_FILE: &str = ".moestream-kv.lock";

/// Whether `name` is one this module gives a KV file.
fn is_kv_name(name: &str) -> bool {
    name.strip_suffix(".kv")
        .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The longest slot file name accepted (most filesystems' limit).
pub const SLOT_NAME_BYTES_MAX: usize = 255;

/// Refuses a slot file name that is not a plain file name of this
/// directory: empty, longer than [`SLOT_NAME_BYTES_MAX`], holding a path
/// separator or a NUL, starting with `.` (`.`, `..`, hidden files, the
/// lock), or one of the automatic `<16 hex digits>.kv` names.
pub fn check_slot_name(name: &str) -> std::result::Result<(), String> {
    let why = if name.is_empty() {
        "is empty"
    } else if name.len() > SLOT_NAME_BYTES_MAX {
        "is longer than 255 bytes"
    } else if name.contains(['/', '\\', '\0']) {
        "holds a path separator (a plain file name of --kv-dir is expected)"
    } else if name.starts_with('.') {
        "starts with '.' (no '..', no hidden files)"
    } else if is_kv_name(name) {
        "is the shape of the automatic KV files' names (16 hex digits and .kv)"
    } else {
        return Ok(());
    };
    Err(format!("filename {name:?} {why}"))
}

/// The KV key of the model in `model_dir`: its identity and its weights'
/// content fingerprints.
pub fn kv_key(model_dir: &Path) -> Result<u64> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    crate::fs::state::model_key(model_dir)?.hash(&mut h);
    for file in weight_files(model_dir)? {
        crate::fs::print::Print::of(&file)?.feed(&mut h);
    }
    Ok(h.finish())
}

/// The weight files of a model: the GGUF file itself, or every shard.
fn weight_files(model_dir: &Path) -> Result<Vec<PathBuf>> {
    if crate::formats::gguf::is_gguf(model_dir) {
        return Ok(vec![model_dir.to_path_buf()]);
    }
    let rd = std::fs::read_dir(model_dir).map_err(|e| Error::file(model_dir, e))?;
    let mut files: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    Ok(files)
}

/// A file worth restoring: its header checked, its rows not read yet.
struct Candidate {
    path: PathBuf,
    head: Head,
    mtime: std::time::SystemTime,
}

impl KvDir {
    /// The KV directory `dir` (created, then locked) for the model in
    /// `model_dir`.
    pub fn new(dir: &Path, model_dir: &Path) -> Result<KvDir> {
        std::fs::create_dir_all(dir).map_err(|e| Error::file(dir, e))?;
        let lock = Lock::try_dir(dir, LOCK_FILE)?;
        let canon = model_dir
            .canonicalize()
            .map_err(|e| Error::file(model_dir, e))?;
        Ok(KvDir {
            dir: dir.to_path_buf(),
            model_key: kv_key(model_dir)?,
            model_dir: canon.to_string_lossy().into_owned(),
            owned: HashSet::new(),
            _lock: lock,
        })
    }

    /// The file of `tokens`: the name hashes the model key too, so two
    /// models using one directory in turn never write the same name.
    fn file_of(&self, tokens: &[u32]) -> PathBuf {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.model_key.hash(&mut h);
        tokens.hash(&mut h);
        self.dir.join(format!("{:016x}.{EXT}", h.finish()))
    }

    /// The entries named like KV files, sorted.
    fn kv_files(&self) -> Vec<PathBuf> {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut files: Vec<PathBuf> = rd
            .flatten()
            .filter(|e| e.file_name().to_str().is_some_and(is_kv_name))
            .map(|e| e.path())
            .collect();
        files.sort();
        files
    }

    /// Sorts one file out: a candidate for this model, or `None` (reported;
    /// removed only when it is this runtime's and unusable for good).
    fn examine(&mut self, path: PathBuf, layouts: &[KvLayout]) -> Option<Candidate> {
        let head = match kv_file::read_head(&path) {
            Ok(Some(head)) => head,
            Ok(None) => {
                eprintln!(
                    "note: {}: not a moestream KV file; left alone",
                    path.display()
                );
                return None;
            }
            Err(e @ Error::KvFile { .. }) => {
                eprintln!("warning: {e}; removed, it will be recomputed");
                let _ = std::fs::remove_file(&path);
                return None;
            }
            Err(e) => {
                eprintln!("warning: {e}; left alone");
                return None;
            }
        };
        if let Err(e) = head.check(&path, self.model_key, layouts) {
            if head.model_dir() == self.model_dir {
                eprintln!("warning: {e}; removed, it will be recomputed");
                let _ = std::fs::remove_file(&path);
            } else {
                eprintln!("note: {e}; another model's, left alone");
            }
            return None;
        }
        let mtime = std::fs::metadata(&path).and_then(|m| m.modified());
        self.owned.insert(path.clone());
        Some(Candidate {
            mtime: mtime.unwrap_or(std::time::UNIX_EPOCH),
            path,
            head,
        })
    }

    /// The saved prefixes that `model` can use, at most `slots` of them
    /// (the newest), oldest first. Headers are read first; only the files
    /// kept are read whole. Each refused file is reported on stderr.
    pub fn restore(&mut self, model: &Model, slots: usize) -> Vec<Prefix> {
        let layouts = model.new_kv(1).layouts().to_vec();
        let mut found: Vec<Candidate> = self
            .kv_files()
            .into_iter()
            .filter_map(|p| self.examine(p, &layouts))
            .collect();
        found.sort_by_key(|c| std::cmp::Reverse(c.mtime));
        let mut positions = 0usize;
        let budget = model.context_budget.unwrap_or(usize::MAX);
        let mut chosen = Vec::new();
        for c in found {
            let n = c.head.tokens().len();
            if chosen.len() == slots || positions + n > budget {
                continue;
            }
            positions += n;
            chosen.push(c);
        }
        let mut out = Vec::new();
        for c in chosen.into_iter().rev() {
            match kv_file::load_rows(&c.path, c.head, &layouts) {
                Ok((tokens, kv)) => out.push(Prefix { tokens, kv }),
                Err(e) => {
                    eprintln!("warning: {e}; removed, it will be recomputed");
                    let _ = std::fs::remove_file(&c.path);
                }
            }
        }
        out
    }

    /// Saves `prefix` as the slot file `name` (checked with
    /// [`check_slot_name`]); returns the bytes written.
    pub fn save_named(&self, name: &str, prefix: &mut Prefix) -> Result<u64> {
        let path = self.slot_path(name)?;
        let owner = (self.model_key, self.model_dir.as_str());
        kv_file::save(&path, owner, &prefix.tokens, &mut prefix.kv)
    }

    /// Loads the slot file `name`: a prefix of this model (its key and
    /// `layouts`) of at most `positions_max` positions, and the file's
    /// bytes. Every refusal names the file and the reason.
    pub fn load_named(
        &self,
        name: &str,
        layouts: &[KvLayout],
        positions_max: usize,
    ) -> Result<(Prefix, u64)> {
        let path = self.slot_path(name)?;
        let bad = |reason: String| Error::KvFile {
            path: path.clone(),
            reason,
        };
        let head = kv_file::read_head(&path)?
            .ok_or_else(|| bad("not a moestream KV file (bad magic)".into()))?;
        head.check(&path, self.model_key, layouts)?;
        let n = head.tokens().len();
        if n > positions_max {
            return Err(bad(format!(
                "it holds {n} positions; a slot of this server holds {positions_max} (--context)"
            )));
        }
        let bytes = head.file_bytes();
        let (tokens, kv) = kv_file::load_rows(&path, head, layouts)?;
        Ok((Prefix { tokens, kv }, bytes))
    }

    /// The path of slot file `name`, refused unless a plain name.
    fn slot_path(&self, name: &str) -> Result<PathBuf> {
        check_slot_name(name).map_err(Error::Request)?;
        Ok(self.dir.join(name))
    }

    /// Makes the directory hold exactly `prefixes` of this model: writes
    /// those not saved yet, removes this model's files no longer kept.
    pub fn save(&mut self, prefixes: &mut [Prefix]) -> Result<()> {
        let mut keep = HashSet::new();
        for p in prefixes.iter_mut() {
            let path = self.file_of(&p.tokens);
            if !self.owned.contains(&path) {
                let owner = (self.model_key, self.model_dir.as_str());
                kv_file::save(&path, owner, &p.tokens, &mut p.kv)?;
                self.owned.insert(path.clone());
            }
            keep.insert(path);
        }
        let gone: Vec<PathBuf> = self.owned.difference(&keep).cloned().collect();
        for path in gone {
            self.owned.remove(&path);
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(Error::file(&path, e))
                }
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_this_module_gives_are_kv_files() {
        assert!(is_kv_name("0123456789abcdef.kv"));
        for n in [
            "notes.kv",
            "0123456789abcdef.kv.bak",
            "0123456789abcdeg.kv",
            ".kv",
        ] {
            assert!(!is_kv_name(n), "{n}");
        }
    }

    #[test]
    fn slot_names_are_plain_file_names_the_automatic_files_cannot_have() {
        for ok in ["conv", "slot0.bin", "a b", "notes.kv", "é"] {
            assert_eq!(check_slot_name(ok), Ok(()), "{ok}");
        }
        let long = "x".repeat(256);
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            "/etc/passwd",
            "a\\b",
            "a\0b",
            ".hidden",
            LOCK_FILE,
            "0123456789abcdef.kv",
            &long,
        ] {
            let e = check_slot_name(bad).unwrap_err();
            assert!(e.starts_with("filename"), "{bad:?}: {e}");
        }
    }
}
