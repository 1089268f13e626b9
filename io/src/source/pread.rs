//! The page-cache modes: `buffered`, `drop` and `pread`, all one `pread`
//! loop into pooled aligned buffers. `drop` then tells the kernel to evict
//! the range. `expect_random` sets `POSIX_FADV_RANDOM`: no read-ahead on
//! expert ranges (8 MiB per read on a virtio disk with read_ahead_kb =
//! 8192).
//!
//! Every mode reads into a pooled buffer. `pread` once read into a fresh
//! `Vec` per read, the simplest baseline; that paid the kernel's page faults
//! and zeroing inside every read, made it 5x slower with a large expert
//! cache, and is gone: `pread` now reads exactly as `buffered` does, and
//! stays a name so profiles and scripts that use it keep working.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;

use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};

use crate::error::IoError;
use crate::file::OpenFile;
use crate::mode::ReadMode;
use crate::slab::{Slab, SlabPool};
use crate::source::RangeReader;

/// A reader for the `buffered`, `drop` and `pread` modes.
pub(crate) struct PreadReader {
    file: Arc<OpenFile>,
    mode: ReadMode,
    pool: Arc<SlabPool>,
}

impl PreadReader {
    pub(crate) fn new(file: OpenFile, mode: ReadMode, pool: Arc<SlabPool>) -> Self {
        assert!(
            matches!(mode, ReadMode::Buffered | ReadMode::Drop | ReadMode::Pread),
            "PreadReader cannot serve mode {mode}"
        );
        // Expert reads are random: without this hint every read also pulls
        // the device's read-ahead window (8 MiB on a virtio disk with
        // read_ahead_kb = 8192) into the page cache. Advisory: a file system
        // that ignores it only costs the read-ahead back.
        let _ = posix_fadvise(file.fd(), 0, 0, PosixFadviseAdvice::POSIX_FADV_RANDOM);
        PreadReader {
            file: Arc::new(file),
            mode,
            pool,
        }
    }

    fn read_pooled(&self, offset: u64, len: usize) -> Result<Slab, IoError> {
        let mut buf = self.pool.take(len)?;
        let got = self.file.read_at_most(buf.as_mut_slice(), offset)?;
        if got < len {
            self.pool.give(buf);
            return Err(self.file.short_read(offset, len, got));
        }
        Ok(Slab::from_aligned(buf, 0, len, Some(self.pool.clone())))
    }

    fn drop_from_cache(&self, offset: u64, len: usize) -> Result<(), IoError> {
        let fd = self.file.file().as_raw_fd();
        posix_fadvise(
            fd,
            offset as libc::off_t,
            len as libc::off_t,
            PosixFadviseAdvice::POSIX_FADV_DONTNEED,
        )
        .map_err(|errno| IoError::os("fadvise", self.file.path(), offset, len, errno.into()))
    }
}

impl RangeReader for PreadReader {
    fn expect_random(&self) {
        let _ = posix_fadvise(self.file.fd(), 0, 0, PosixFadviseAdvice::POSIX_FADV_RANDOM);
    }

    fn read(&self, offset: u64, len: usize) -> Result<Slab, IoError> {
        self.file.check_range(offset, len)?;
        let slab = self.read_pooled(offset, len)?;
        if self.mode == ReadMode::Drop {
            self.drop_from_cache(offset, len)?;
        }
        Ok(slab)
    }

    fn path(&self) -> &Path {
        self.file.path()
    }

    fn len_bytes(&self) -> u64 {
        self.file.len_bytes()
    }

    fn effective_mode(&self) -> ReadMode {
        self.mode
    }

    fn open_file(&self) -> Option<Arc<OpenFile>> {
        Some(self.file.clone())
    }
}
