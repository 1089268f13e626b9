//! `RangeReader`: the one interface every read mode sits behind, and
//! [`open`], which picks the implementation for a [`ReadMode`].
//!
//! Invariants shared by every implementation:
//! - a read returns exactly the bytes `[offset, offset + len)` of the file,
//!   byte-identical across modes;
//! - a range that extends past the end of the file (or a file truncated under
//!   us) is an [`IoError::ShortRead`] naming the file; a partially filled
//!   buffer is never returned;
//! - readers are `Send + Sync`: one reader serves many threads.

mod direct;
mod mapped;
mod pread;

use std::path::Path;
use std::sync::{Arc, OnceLock};

use crate::error::IoError;
use crate::file::OpenFile;
use crate::mode::ReadMode;
use crate::slab::{Slab, SlabPool};

/// Idle bytes kept by the pool that [`open`] shares between readers.
pub const SHARED_POOLED_BYTES_MAX: usize = 256 << 20;

/// Reads byte ranges of one file.
pub trait RangeReader: Send + Sync {
    /// Reads `[offset, offset + len)`.
    fn read(&self, offset: u64, len: usize) -> Result<Slab, IoError>;

    /// The file's path.
    fn path(&self) -> &Path;

    /// The file's length at open.
    fn len_bytes(&self) -> u64;

    /// The mode actually in use: `Buffered` when `Direct` was asked for on a
    /// filesystem without O_DIRECT support.
    fn effective_mode(&self) -> ReadMode;

    /// From now on reads are random (routed experts): turn off read-ahead
    /// (`POSIX_FADV_RANDOM` / `MADV_RANDOM`) so a miss never pulls the
    /// device's read-ahead window. Called after the sequential load of the
    /// resident weights, which read-ahead speeds up. Advisory: a file system
    /// that ignores it only costs the read-ahead back.
    fn expect_random(&self) {}

    /// The open file, for submitting reads of it to a [`crate::Reactor`];
    /// `None` for modes that do not read through a descriptor (mmap).
    fn open_file(&self) -> Option<Arc<OpenFile>> {
        None
    }
}

/// Opens `path` for reading in `mode`, recycling buffers through a pool
/// shared by all readers opened this way.
pub fn open(path: impl AsRef<Path>, mode: ReadMode) -> Result<Box<dyn RangeReader>, IoError> {
    open_with_pool(path, mode, shared_pool())
}

/// Opens `path` for reading in `mode`, taking buffers from `pool`.
pub fn open_with_pool(
    path: impl AsRef<Path>,
    mode: ReadMode,
    pool: Arc<SlabPool>,
) -> Result<Box<dyn RangeReader>, IoError> {
    let path = path.as_ref();
    match mode {
        ReadMode::Mmap => Ok(Box::new(mapped::MmapReader::open(path, pool)?)),
        ReadMode::Direct => {
            let file = OpenFile::open(path, true)?;
            if file.is_direct() {
                Ok(Box::new(direct::DirectReader::new(file, pool)))
            } else {
                Ok(Box::new(pread::PreadReader::new(
                    file,
                    ReadMode::Buffered,
                    pool,
                )))
            }
        }
        ReadMode::Buffered | ReadMode::Drop | ReadMode::Pread => {
            let file = OpenFile::open(path, false)?;
            Ok(Box::new(pread::PreadReader::new(file, mode, pool)))
        }
    }
}

/// The pool behind [`open`].
pub fn shared_pool() -> Arc<SlabPool> {
    static POOL: OnceLock<Arc<SlabPool>> = OnceLock::new();
    POOL.get_or_init(|| SlabPool::new(SHARED_POOLED_BYTES_MAX))
        .clone()
}
