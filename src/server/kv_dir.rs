//! `--kv-dir`: the server's kept prefixes on disk, one [`crate::kv_file`]
//! per prefix, named by a hash of its tokens. Saved when the server goes
//! idle and at shutdown (the directory then holds exactly the kept
//! prefixes), restored at start. A file that is refused (corrupt, another
//! model's) is reported, removed, and recomputed when needed.

use crate::engine::Prefix;
use crate::error::{Error, Result};
use crate::kv_file;
use crate::model::Model;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

/// The KV directory of one model.
pub struct KvDir {
    dir: PathBuf,
    model_key: u64,
}

const EXT: &str = "kv";

impl KvDir {
    /// The KV directory `dir` (created) for the model in `model_dir`.
    pub fn new(dir: &Path, model_dir: &Path) -> Result<KvDir> {
        std::fs::create_dir_all(dir).map_err(|e| Error::file(dir, e))?;
        Ok(KvDir {
            dir: dir.to_path_buf(),
            model_key: crate::tune::model_key(model_dir)?,
        })
    }

    fn file_of(&self, tokens: &[u32]) -> PathBuf {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        tokens.hash(&mut h);
        self.dir.join(format!("{:016x}.{EXT}", h.finish()))
    }

    fn kv_files(&self) -> Vec<PathBuf> {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut files: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == EXT))
            .collect();
        files.sort();
        files
    }

    /// The saved prefixes that `model` can use; each refused file is
    /// reported on stderr and removed.
    pub fn restore(&self, model: &Model) -> Vec<Prefix> {
        let layouts = model.new_kv(1).layouts().to_vec();
        let mut out = Vec::new();
        for path in self.kv_files() {
            match kv_file::load(&path, self.model_key, &layouts) {
                Ok((tokens, kv)) => out.push(Prefix { tokens, kv }),
                Err(e) => {
                    eprintln!("warning: {e}; removed, it will be recomputed");
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        out
    }

    /// Makes the directory hold exactly `prefixes`: writes those not saved
    /// yet, removes the files of prefixes no longer kept.
    pub fn save(&self, prefixes: &mut [Prefix]) -> Result<()> {
        let mut keep = HashSet::new();
        for p in prefixes.iter_mut() {
            let path = self.file_of(&p.tokens);
            if !path.exists() {
                kv_file::save(&path, self.model_key, &p.tokens, &mut p.kv)?;
            }
            keep.insert(path);
        }
        for path in self.kv_files() {
            if !keep.contains(&path) {
                std::fs::remove_file(&path).map_err(|e| Error::file(&path, e))?;
            }
        }
        Ok(())
    }
}
