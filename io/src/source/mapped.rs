//! The `mmap` mode: the file is mapped once at open and each read copies its
//! range out of the mapping into a pooled buffer, so a slab never borrows
//! the mapping.
//!
//! Caveat (the reason `Mmap::map` is unsafe): if another process truncates
//! the file while it is mapped, touching the lost pages raises SIGBUS. Model
//! files are treated as immutable while they are served.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use crate::error::IoError;
use crate::mode::ReadMode;
use crate::slab::{Slab, SlabPool};
use crate::source::RangeReader;

/// A reader over a read-only mapping of the whole file.
pub(crate) struct MmapReader {
    /// `None` for an empty file (a zero-length mapping is not allowed).
    map: Option<Mmap>,
    path: PathBuf,
    pool: Arc<SlabPool>,
}

impl MmapReader {
    pub(crate) fn open(path: &Path, pool: Arc<SlabPool>) -> Result<Self, IoError> {
        let file = File::open(path).map_err(|e| IoError::os("open", path, 0, 0, e))?;
        let len = file
            .metadata()
            .map_err(|e| IoError::os("stat", path, 0, 0, e))?
            .len();
        let map = if len == 0 {
            None
        } else {
            // SAFETY: the mapping is read-only and private to this reader;
            // this process never writes or truncates the file, and model
            // files are not modified while served (see the module caveat).
            let map = unsafe { Mmap::map(&file) }
                .map_err(|e| IoError::os("mmap", path, 0, len as usize, e))?;
            Some(map)
        };
        Ok(MmapReader {
            map,
            path: path.to_owned(),
            pool,
        })
    }

    fn mapped(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

/// Page size the advice ranges are aligned to.
/// Bytes per WILLNEED advice: below any device's read-ahead cap.
const WILLNEED_CHUNK: usize = 1 << 20;

const PAGE: usize = 4096;

impl RangeReader for MmapReader {
    fn read(&self, offset: u64, len: usize) -> Result<Slab, IoError> {
        let mapped = self.mapped();
        let end = offset.checked_add(len as u64);
        let Some(end) = end.filter(|&end| end <= mapped.len() as u64) else {
            let got = (mapped.len() as u64).saturating_sub(offset).min(len as u64);
            return Err(IoError::ShortRead {
                path: self.path.clone(),
                offset,
                len,
                got: got as usize,
            });
        };
        // The copy's pages are then dropped from the mapping (not from the
        // page cache): RSS holds only what the engine keeps.
        // MADV_RANDOM (see `expect_random`) turns off fault read-ahead, so
        // ask for exactly this range up front: the kernel reads it in large
        // requests instead of one page per fault. One WILLNEED reads at most
        // the device's read-ahead window (the rest would then fault in page
        // by page: 0.1 GB/s for 19 MB reads here), so ask in chunks.
        // Advisory.
        if let Some(map) = &self.map {
            let start = offset as usize / PAGE * PAGE;
            let mut at = start;
            while at < end as usize {
                let n = WILLNEED_CHUNK.min(end as usize - at);
                let _ = map.advise_range(memmap2::Advice::WillNeed, at, n);
                at += n;
            }
        }
        let mut buf = self.pool.take(len)?;
        buf.as_mut_slice()
            .copy_from_slice(&mapped[offset as usize..end as usize]);
        if let Some(map) = &self.map {
            let start = offset as usize / PAGE * PAGE;
            // SAFETY: the mapping is a read-only shared file mapping and no
            // reference into it outlives the copy above, so dropping its
            // pages loses nothing: a later access faults them back in from
            // the page cache or the file. This keeps the bytes out of the
            // process's RSS (the page cache still holds them).
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    start,
                    end as usize - start,
                )
            };
        }
        Ok(Slab::from_aligned(buf, 0, len, Some(self.pool.clone())))
    }

    fn path(&self) -> &Path {
        &self.path
    }

    fn len_bytes(&self) -> u64 {
        self.mapped().len() as u64
    }

    fn effective_mode(&self) -> ReadMode {
        ReadMode::Mmap
    }

    fn expect_random(&self) {
        // Faults on expert ranges must not pull the read-ahead window
        // (llama.cpp's mmap path reads ~10x the bytes it needs on an 8 MiB
        // read-ahead disk). Advisory: failure only costs that.
        if let Some(map) = &self.map {
            let _ = map.advise(memmap2::Advice::Random);
        }
    }
}
