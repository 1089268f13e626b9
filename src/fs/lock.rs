//! Locks: an exclusive `flock` on a lock file, held for the life of a
//! [`Lock`] (the kernel drops it when the process dies, so a crash never
//! leaves it held). [`Lock::exclusive`] waits for it (a usage history's
//! or a trace's writers take turns); [`Lock::try_dir`] fails at once,
//! naming the directory and the holder's pid, which the lock file records
//! (a second server on one KV directory).

use super::read::refused;
use crate::error::{Error, Result};
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// An exclusive hold on a lock file.
#[derive(Debug)]
pub struct Lock {
    /// Held only to keep the descriptor (and so the lock) open.
    _file: File,
}

fn open_lock_file(path: &Path) -> Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::file(path, e))?;
    let md = file.metadata().map_err(|e| Error::file(path, e))?;
    super::read::check_regular(path, &md)?;
    Ok(file)
}

impl Lock {
    /// Takes the lock file `path`, waiting while another process holds it.
    pub fn exclusive(path: &Path) -> Result<Lock> {
        let file = open_lock_file(path)?;
        file.lock().map_err(|e| Error::file(path, e))?;
        Ok(Lock { _file: file })
    }

    /// Takes the lock file `name` in `dir` and records this process in it,
    /// or fails at once naming the directory and the process holding it.
    pub fn try_dir(dir: &Path, name: &str) -> Result<Lock> {
        let path = dir.join(name);
        let mut file = open_lock_file(&path)?;
        if let Err(e) = file.try_lock() {
            let mut holder = String::new();
            let _ = (&file).take(64).read_to_string(&mut holder);
            let holder = holder.trim();
            let who = if holder.is_empty() {
                "another process"
            } else {
                holder
            };
            return Err(refused(
                dir,
                format!("in use by {who} (lock file {}: {e})", path.display()),
            ));
        }
        let stamp = format!("pid {}\n", std::process::id());
        let _ = file
            .set_len(0)
            .and_then(|_| file.rewind())
            .and_then(|_| file.write_all(stamp.as_bytes()));
        Ok(Lock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_naming_the_directory_and_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let first = Lock::try_dir(dir.path(), ".lock").unwrap();
        let e = Lock::try_dir(dir.path(), ".lock").unwrap_err().to_string();
        let pid = format!("pid {}", std::process::id());
        assert!(
            e.contains(&dir.path().display().to_string()) && e.contains(&pid),
            "{e}"
        );
        drop(first);
        Lock::try_dir(dir.path(), ".lock").unwrap();
    }
}
