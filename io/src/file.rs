//! `OpenFile`: an open, read-only file plus what was learned about it at open
//! (its path for error messages, its length, whether O_DIRECT works on it).
//!
//! O_DIRECT is probed once per file system (by device number), here: some
//! file systems refuse the flag at open (EINVAL), others accept it and
//! refuse the first read. Either way the file is reopened without it,
//! `is_direct()` says so, the first fallback on a file system prints one
//! line saying direct reads there go through the page cache, and later
//! files on it skip the probe; nothing later has to guess. Invariant: when `is_direct()` is true, every read issued on the
//! file uses a 4096-aligned offset, length and buffer address ([`DirectSpan`]).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::aligned::{align_down_u64, align_up, AlignedBuf, ALIGN};
use crate::error::IoError;

/// A read-only file, opened with O_DIRECT when asked for and supported.
#[derive(Debug)]
pub struct OpenFile {
    file: File,
    path: PathBuf,
    len_bytes: u64,
    direct: bool,
}

impl OpenFile {
    /// Opens `path`; with `want_direct`, tries O_DIRECT and falls back to a
    /// plain open when the filesystem refuses it.
    pub fn open(path: &Path, want_direct: bool) -> Result<Self, IoError> {
        if want_direct {
            use std::os::unix::fs::MetadataExt;
            let dev = std::fs::metadata(path)
                .map_err(|e| IoError::os("stat", path, 0, 0, e))?
                .dev();
            let known = direct_support()
                .lock()
                .expect("probe cache")
                .get(&dev)
                .copied();
            if known != Some(false) {
                let opened = Self::open_direct(path)?;
                let works = opened.is_some();
                let first = direct_support()
                    .lock()
                    .expect("probe cache")
                    .insert(dev, works)
                    .is_none();
                if let Some(file) = opened {
                    return Ok(file);
                }
                if first {
                    eprintln!(
                        "note: {}: this file system refuses O_DIRECT; direct reads here fall back to buffered reads (through the page cache)",
                        path.display()
                    );
                }
            }
        }
        let file = File::open(path).map_err(|e| IoError::os("open", path, 0, 0, e))?;
        Self::with_file(file, path, false)
    }

    /// The open file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The raw descriptor, for the ring.
    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// The path the file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's length at open.
    pub fn len_bytes(&self) -> u64 {
        self.len_bytes
    }

    /// True when reads bypass the page cache (O_DIRECT).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Checks that `[offset, offset + len)` lies inside the file, so that a
    /// read past the end fails before any I/O, naming the file.
    pub fn check_range(&self, offset: u64, len: usize) -> Result<(), IoError> {
        let end = offset.checked_add(len as u64);
        if end.is_some_and(|end| end <= self.len_bytes) {
            return Ok(());
        }
        let got = self.len_bytes.saturating_sub(offset).min(len as u64) as usize;
        Err(self.short_read(offset, len, got))
    }

    /// A [`IoError::ShortRead`] for this file.
    pub fn short_read(&self, offset: u64, len: usize, got: usize) -> IoError {
        IoError::ShortRead {
            path: self.path.clone(),
            offset,
            len,
            got,
        }
    }

    /// Reads into `buf` from `offset` until `buf` is full or the file ends;
    /// returns the bytes read. On a direct file, `offset`, `buf.len()` and
    /// the address of `buf` must be aligned; a read that returns an
    /// unaligned count is the end of the file.
    pub fn read_at_most(&self, buf: &mut [u8], offset: u64) -> Result<usize, IoError> {
        let mut got = 0;
        while got < buf.len() {
            match self.file.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(IoError::os("pread", &self.path, offset, buf.len(), e)),
            }
            if self.direct && got % ALIGN != 0 {
                break;
            }
        }
        Ok(got)
    }

    /// Opens with O_DIRECT and probes one aligned read. `Ok(None)` means
    /// the filesystem does not support O_DIRECT.
    fn open_direct(path: &Path) -> Result<Option<Self>, IoError> {
        let opened = File::options()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path);
        let file = match opened {
            Ok(file) => file,
            Err(e) if is_einval(&e) => return Ok(None),
            Err(e) => return Err(IoError::os("open(O_DIRECT)", path, 0, 0, e)),
        };
        let file = Self::with_file(file, path, true)?;
        match file.probe_direct_read() {
            Ok(()) => Ok(Some(file)),
            Err(e) if is_einval(&e) => Ok(None),
            Err(e) => Err(IoError::os("pread(O_DIRECT probe)", path, 0, ALIGN, e)),
        }
    }

    fn probe_direct_read(&self) -> io::Result<()> {
        if self.len_bytes == 0 {
            return Ok(());
        }
        let mut buf = AlignedBuf::new(ALIGN).map_err(io::Error::other)?;
        self.file.read_at(buf.as_mut_slice(), 0).map(|_| ())
    }

    fn with_file(file: File, path: &Path, direct: bool) -> Result<Self, IoError> {
        let meta = file
            .metadata()
            .map_err(|e| IoError::os("stat", path, 0, 0, e))?;
        Ok(OpenFile {
            file,
            path: path.to_owned(),
            len_bytes: meta.len(),
            direct,
        })
    }
}

/// Per device number: whether O_DIRECT works on that file system.
fn direct_support() -> &'static std::sync::Mutex<std::collections::HashMap<u64, bool>> {
    static CACHE: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<u64, bool>>> =
        std::sync::OnceLock::new();
    CACHE.get_or_init(Default::default)
}

fn is_einval(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EINVAL)
}

/// The aligned read that covers a requested range on a direct file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirectSpan {
    /// File offset of the aligned read (`offset` rounded down).
    pub read_offset: u64,
    /// Length of the aligned read (a multiple of [`ALIGN`]).
    pub read_len: usize,
    /// Where the requested bytes start inside the read.
    pub start: usize,
}

impl DirectSpan {
    /// The aligned superset of `[offset, offset + len)`.
    pub fn covering(offset: u64, len: usize) -> Self {
        let read_offset = align_down_u64(offset);
        let start = (offset - read_offset) as usize;
        DirectSpan {
            read_offset,
            read_len: align_up(start + len),
            start,
        }
    }

    /// The span of a plain (unaligned) read: exactly the requested range.
    pub fn exact(offset: u64, len: usize) -> Self {
        DirectSpan {
            read_offset: offset,
            read_len: len,
            start: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_span_table() {
        // (offset, len) -> (read_offset, read_len, start)
        let table = [
            ((0, 0), (0, 0, 0)),
            ((0, 1), (0, 4096, 0)),
            ((0, 4096), (0, 4096, 0)),
            ((1, 4096), (0, 8192, 1)),
            ((4095, 2), (0, 8192, 4095)),
            ((8192, 100), (8192, 4096, 0)),
            ((10_000, 5000), (8192, 8192, 1808)),
        ];
        for ((offset, len), (read_offset, read_len, start)) in table {
            let span = DirectSpan::covering(offset, len);
            assert_eq!(
                span,
                DirectSpan {
                    read_offset,
                    read_len,
                    start
                },
                "offset {offset} len {len}"
            );
        }
    }

    #[test]
    fn missing_file_names_path() {
        let err = OpenFile::open(Path::new("/nonexistent/moestream-x"), false).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/moestream-x"),
            "{err}"
        );
    }

    #[test]
    fn range_check_names_path_and_counts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ten");
        std::fs::write(&path, [0u8; 10]).unwrap();
        let file = OpenFile::open(&path, false).unwrap();
        assert!(file.check_range(0, 10).is_ok());
        assert!(file.check_range(10, 0).is_ok());
        match file.check_range(8, 4).unwrap_err() {
            IoError::ShortRead { path: p, got, .. } => {
                assert_eq!(p, path);
                assert_eq!(got, 2);
            }
            other => panic!("expected ShortRead, got {other}"),
        }
        assert!(file.check_range(u64::MAX, 2).is_err());
    }
}
