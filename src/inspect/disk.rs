//! The disk under a model, as `plan`, `doctor` and `status` see it: the
//! block device and its read-ahead (sysfs), whether its file system takes
//! O_DIRECT, and a short cold probe of expert-sized random reads over the
//! model's shards (the sweep of `moestream bench io`, one cell).
//!
//! Everything here is read-only and bounded: sysfs files are small, the
//! probe runs for the time asked and drops only clean pages of the model's
//! own files from the page cache.

use crate::error::{Error, Result};
use moestream_io::{sweep, ReadMode, SweepConfig};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The weight files of a model: `dir`'s `*.safetensors` files, sorted, or
/// the files of a GGUF model (one, or a split set in order).
pub fn shard_files(dir: &Path) -> Result<Vec<PathBuf>> {
    if crate::formats::gguf::is_gguf(dir) {
        let model = crate::formats::gguf::GgufModel::open(dir)?;
        return Ok(model.files.iter().map(|f| f.path.clone()).collect());
    }
    let mut out = Vec::new();
    for ent in std::fs::read_dir(dir).map_err(|e| Error::file(dir, e))? {
        let p = ent.map_err(|e| Error::file(dir, e))?.path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

/// The sysfs directory of the block device holding `path`
/// (`/sys/dev/block/MAJ:MIN`), if it is one.
fn sysfs_dir(path: &Path) -> Option<PathBuf> {
    let dev = std::fs::metadata(path).ok()?.dev();
    let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
    let dir = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    dir.exists().then_some(dir)
}

/// The read-ahead of the device holding `path`, in KiB (a partition's is
/// its disk's), if sysfs tells it.
pub fn read_ahead_kb(path: &Path) -> Option<u64> {
    let dir = sysfs_dir(path)?;
    [dir.join("queue"), dir.join("../queue")]
        .iter()
        .find_map(|q| std::fs::read_to_string(q.join("read_ahead_kb")).ok())
        .and_then(|s| s.trim().parse().ok())
}

/// Whether the device holding `path` is rotational (a spinning disk), if
/// sysfs tells it.
pub fn rotational(path: &Path) -> Option<bool> {
    let dir = sysfs_dir(path)?;
    [dir.join("queue"), dir.join("../queue")]
        .iter()
        .find_map(|q| std::fs::read_to_string(q.join("rotational")).ok())
        .map(|s| s.trim() == "1")
}

/// Whether `file` opens with O_DIRECT (its file system supports it).
pub fn direct_io(file: &Path) -> Result<bool> {
    Ok(moestream_io::OpenFile::open(file, true)?.is_direct())
}

/// Free bytes on the file system holding `path`.
pub fn free_bytes(path: &Path) -> Option<u64> {
    let s = nix::sys::statvfs::statvfs(path).ok()?;
    Some(s.blocks_available() as u64 * s.fragment_size() as u64)
}

/// What a probe measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Probe {
    pub read_mode: String,
    pub read_bytes: usize,
    pub depth: usize,
    pub seconds: f64,
    pub gb_per_s: f64,
    pub latency_ms_p50: f64,
    pub latency_ms_p99: f64,
}

/// Cold random reads of `read_bytes` over `files` in `mode`, `depth` at
/// once, for `seconds` (the files are dropped from the page cache first).
/// An error when no file is as long as one read (a partial download).
pub fn probe(
    files: &[PathBuf],
    read_bytes: usize,
    mode: ReadMode,
    depth: usize,
    seconds: f64,
) -> Result<Probe> {
    let long: Vec<PathBuf> = files
        .iter()
        .filter(|f| std::fs::metadata(f).is_ok_and(|m| m.len() >= read_bytes as u64))
        .cloned()
        .collect();
    if long.is_empty() {
        return Err(Error::Request(format!(
            "no shard holds a whole {}-byte read to probe the disk with",
            read_bytes
        )));
    }
    let cfg = SweepConfig {
        modes: vec![mode],
        read_sizes: vec![read_bytes],
        depths: vec![depth.max(1)],
        cell_time: Duration::from_secs_f64(seconds.max(0.01)),
        reads_max: None,
        seed: 11,
    };
    let rows = sweep(&long, &cfg, |_| {})?;
    let r = rows.first().expect("one cell swept");
    Ok(Probe {
        read_mode: r.mode_label(),
        read_bytes,
        depth: r.depth,
        seconds: r.seconds,
        gb_per_s: r.gb_per_s,
        latency_ms_p50: r.latency_us_p50 / 1e3,
        latency_ms_p99: r.latency_us_p99 / 1e3,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_reads_whole_files_and_refuses_short_ones() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("a.safetensors");
        std::fs::write(&f, vec![7u8; 1 << 20]).unwrap();
        let p = probe(
            std::slice::from_ref(&f),
            64 << 10,
            ReadMode::Buffered,
            2,
            0.01,
        )
        .unwrap();
        assert!(p.gb_per_s > 0.0 && p.read_bytes == 64 << 10);
        let e = probe(&[f], 2 << 20, ReadMode::Buffered, 1, 0.01).unwrap_err();
        assert!(e.to_string().contains("no shard holds"), "{e}");
        assert_eq!(shard_files(d.path()).unwrap().len(), 1);
        assert!(free_bytes(d.path()).is_some_and(|b| b > 0));
    }
}
