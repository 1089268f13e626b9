//! The safe writer, the only writer of the codebase. A write goes to a temp
//! file beside the target, named `NAME.tmp-PID-RANDOM` (unpredictable: a
//! name planted in advance cannot be hit) and created with `O_CREAT |
//! O_EXCL | O_NOFOLLOW` (a symlink or file planted at that name is never
//! followed or reused); it is synced and renamed over the target, so
//! readers see the old file or the new one. A target that exists and is
//! not a regular file (a device, FIFO, socket or directory) is refused by
//! name before anything is created: a rename over `/dev/full` would
//! replace the device. The temp file is removed on every error, and when
//! an [`Output`] is dropped unfinished; [`remove_stale`] removes those of
//! processes that died before they could.

use super::read::check_regular;
use crate::error::{Error, Result};
use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::io::{BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The buffer of a streamed output: large sequential writes.
const BUFFER_BYTES: usize = 8 << 20;

/// A file being written: its temp file until [`Output::finish`] renames it
/// over the target. Dropped unfinished, it removes the temp file.
pub struct Output {
    path: PathBuf,
    tmp: PathBuf,
    out: Option<BufWriter<File>>,
}

/// The prefix of every temp file of `path` (what [`remove_stale`] takes).
pub fn tmp_prefix(path: &Path) -> String {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    format!("{name}.tmp-")
}

/// `PID-RANDOM`: a temp name's tail no other process (or call) shares or
/// can guess: 64 bits from the process's random hasher keys, the time and
/// a counter.
pub fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(SEQ.fetch_add(1, Ordering::Relaxed));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    h.write_u128(now.map_or(0, |d| d.as_nanos()));
    format!("{}-{:016x}", std::process::id(), h.finish())
}

/// The temp name of one write of `path`.
fn tmp_name(path: &Path) -> PathBuf {
    path.with_file_name(format!("{}{}", tmp_prefix(path), unique_suffix()))
}

/// Refuses a target that exists and is not a regular file (symlinks
/// followed: a link to a device is refused too).
pub fn check_target(path: &Path) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(md) => check_regular(path, &md),
        Err(_) => Ok(()),
    }
}

impl Output {
    /// Starts writing `path`.
    pub fn create(path: &Path) -> Result<Output> {
        check_target(path)?;
        if path.file_name().is_none() {
            return Err(super::read::refused(path, "not a file name"));
        }
        let tmp = tmp_name(path);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
            .map_err(|e| Error::file(&tmp, e))?;
        Ok(Output {
            path: path.to_path_buf(),
            tmp,
            out: Some(BufWriter::with_capacity(BUFFER_BYTES, file)),
        })
    }

    /// The file this output replaces when finished.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The temp file being written (the name errors should give).
    pub fn tmp(&self) -> &Path {
        &self.tmp
    }

    /// Flushes, syncs and renames the temp file over the target; on an
    /// error the temp file is removed.
    pub fn finish(mut self) -> Result<()> {
        let out = self.out.take().expect("an output finishes once");
        let done = (|| {
            let file = out
                .into_inner()
                .map_err(|e| Error::file(&self.tmp, e.into_error()))?;
            file.sync_all().map_err(|e| Error::file(&self.tmp, e))?;
            check_target(&self.path)?;
            std::fs::rename(&self.tmp, &self.path).map_err(|e| Error::file(&self.path, e))
        })();
        if done.is_err() {
            let _ = std::fs::remove_file(&self.tmp);
            return done;
        }
        sync_parent(&self.path);
        Ok(())
    }
}

/// Best effort: syncs the directory of `path` so the rename is durable.
fn sync_parent(path: &Path) {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if let Ok(d) = File::open(parent) {
        let _ = d.sync_all();
    }
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.out.as_mut().expect("an unfinished output").write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.out
            .as_mut()
            .expect("an unfinished output")
            .write_all(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.as_mut().expect("an unfinished output").flush()
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if self.out.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Writes `bytes` to `path` through an [`Output`]: the old file or the new
/// one, never a mix, never a temp file left.
pub fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut out = Output::create(path)?;
    out.write_all(bytes)
        .map_err(|e| Error::file(out.tmp(), e))?;
    out.finish()
}

/// Appends to `path` (a results CSV, say): the old content is read through
/// the bounded reader (at most `cap`), `tail(fresh)` adds to it (`fresh`:
/// the file was empty or absent), and the whole is written through
/// [`write`](fn@write), so a failed append leaves the old file whole.
pub fn append(
    path: &Path,
    cap: super::Cap,
    tail: impl FnOnce(bool) -> std::result::Result<Vec<u8>, String>,
) -> Result<()> {
    let mut bytes = match std::fs::symlink_metadata(path) {
        Ok(_) => super::read(path, cap)?,
        Err(_) => Vec::new(),
    };
    let more = tail(bytes.is_empty()).map_err(|e| super::read::refused(path, e))?;
    bytes.extend(more);
    write(path, &bytes)
}

/// Writes `path` with a library that only writes to a path it opens
/// itself (plotters): `draw` gets a path in a fresh private directory
/// beside the target (`NAME.tmp-PID-RANDOM/`, created exclusively, so
/// nothing planted is followed); the file it leaves there, if regular, is
/// renamed over the target. The directory is removed whatever happens.
pub fn write_via<E: std::fmt::Display>(
    path: &Path,
    draw: impl FnOnce(&Path) -> std::result::Result<(), E>,
) -> Result<()> {
    check_target(path)?;
    let Some(name) = path.file_name() else {
        return Err(super::read::refused(path, "not a file name"));
    };
    let dir = tmp_name(path);
    std::fs::create_dir(&dir).map_err(|e| Error::file(&dir, e))?;
    let inner = dir.join(name);
    let done = draw(&inner)
        .map_err(|e| super::read::refused(path, e.to_string()))
        .and_then(|()| {
            let md = std::fs::symlink_metadata(&inner).map_err(|e| Error::file(&inner, e))?;
            check_regular(&inner, &md)?;
            check_target(path)?;
            std::fs::rename(&inner, path).map_err(|e| Error::file(path, e))
        });
    let _ = std::fs::remove_dir_all(&dir);
    done
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
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        let _ = if is_dir {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_device_fifo_or_directory_at_the_path_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let link = dir.path().join("full");
        std::os::unix::fs::symlink("/dev/full", &link).unwrap();
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        for (p, what) in [
            (&fifo, "FIFO"),
            (&link, "character device"),
            (&sub, "directory"),
        ] {
            let e = write(p, b"x").unwrap_err().to_string();
            assert!(
                e.contains(&p.display().to_string()) && e.contains(what),
                "{e}"
            );
        }
        let e = write(Path::new("/dev/full"), b"x").unwrap_err().to_string();
        assert!(
            e.contains("/dev/full") && e.contains("character device"),
            "{e}"
        );
        assert_eq!(entries(dir.path()), ["fifo", "full", "sub"]);
    }

    #[test]
    fn a_symlink_planted_at_the_temp_name_cannot_redirect_the_write() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let out = dir.path().join("out.json");
        // The old predictable names, planted as links to the victim.
        let pid = std::process::id();
        for n in 0..4 {
            let planted = dir.path().join(format!("out.json.tmp-{pid}-{n}"));
            std::os::unix::fs::symlink(&victim, planted).unwrap();
        }
        write(&out, b"new").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert_eq!(std::fs::read(&out).unwrap(), b"new");
        assert!(!std::fs::symlink_metadata(&out).unwrap().is_symlink());
    }

    #[test]
    fn an_output_dropped_or_failing_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("big.bin");
        let mut o = Output::create(&out).unwrap();
        o.write_all(&[7u8; 1000]).unwrap();
        assert!(o.tmp().exists());
        drop(o);
        assert!(entries(dir.path()).is_empty());
        // The target turns into a directory while written: refused at the
        // rename, the temp file removed.
        let mut o = Output::create(&out).unwrap();
        o.write_all(b"x").unwrap();
        std::fs::create_dir(&out).unwrap();
        assert!(o.finish().is_err());
        assert_eq!(entries(dir.path()), ["big.bin"]);
    }

    #[test]
    fn stale_temp_entries_of_dead_processes_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        // A pid above the kernel's maximum (4194304) never runs.
        let dead = dir.path().join("usage.json.tmp-99999999-0");
        let dead_dir = dir.path().join(".m.tmp-99999998");
        let live = tmp_name(&dir.path().join("usage.json"));
        let other = dir.path().join("usage.json");
        for f in [&dead, &live, &other] {
            std::fs::write(f, b"x").unwrap();
        }
        std::fs::create_dir(&dead_dir).unwrap();
        remove_stale(dir.path(), &tmp_prefix(&other));
        remove_stale(dir.path(), ".m.tmp-");
        assert!(!dead.exists() && !dead_dir.exists());
        assert!(live.exists() && other.exists());
    }
}
