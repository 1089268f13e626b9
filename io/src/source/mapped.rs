//! The `mmap` mode: the file is mapped once at open and each read copies its
//! range out of the mapping into a pooled buffer, so a slab never borrows
//! the mapping.
//!
//! Caveat (the reason `Mmap::map` is unsafe): if another process truncates
//! the file while it is mapped, touching the lost pages raises SIGBUS. So
//! each read first checks the file's size (one fstat) and refuses a range
//! the file no longer holds with a named error; and a process-wide SIGBUS
//! handler, installed with the first mapping, turns the remaining race (a
//! truncation between the check and the copy, or a disk error under the
//! mapping) into a message naming the file being copied and a failure exit,
//! never a silent death.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Once};

use memmap2::Mmap;

use crate::error::IoError;
use crate::mode::ReadMode;
use crate::slab::{Slab, SlabPool};
use crate::source::RangeReader;

/// A reader over a read-only mapping of the whole file.
pub(crate) struct MmapReader {
    /// `None` for an empty file (a zero-length mapping is not allowed).
    map: Option<Mmap>,
    /// Kept open to check the file's current size before each copy.
    file: File,
    path: PathBuf,
    /// The path as bytes with a newline, leaked so the SIGBUS handler can
    /// print it at any time.
    path_line: &'static [u8],
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
        install_sigbus_handler();
        let mut line = path.as_os_str().as_encoded_bytes().to_vec();
        line.push(b'\n');
        Ok(MmapReader {
            map,
            file,
            path: path.to_owned(),
            path_line: Box::leak(line.into_boxed_slice()),
            pool,
        })
    }

    /// Refuses a range the file no longer holds (it shrank since mapped).
    fn check_still_holds(&self, offset: u64, len: usize, end: u64) -> Result<(), IoError> {
        let now = self
            .file
            .metadata()
            .map_err(|e| IoError::os("stat", &self.path, offset, len, e))?
            .len();
        if now < end {
            return Err(IoError::FileShrank {
                path: self.path.clone(),
                offset,
                len,
                now,
            });
        }
        Ok(())
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
        self.check_still_holds(offset, len, end)?;
        let mut buf = self.pool.take(len)?;
        COPYING.store(self.path_line.as_ptr().cast_mut(), Ordering::Relaxed);
        COPYING_LEN.store(self.path_line.len(), Ordering::Relaxed);
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

/// The path (with a newline) of the mapped file most recently copied from,
/// for the SIGBUS handler (a leaked, never-freed byte string, or null).
static COPYING: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
static COPYING_LEN: AtomicUsize = AtomicUsize::new(0);

/// Installs [`on_sigbus`] once per process.
fn install_sigbus_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: a zeroed sigaction is valid; the handler only makes
        // async-signal-safe calls (write, _exit).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigbus as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
        }
    });
}

/// Prints which mapped file faulted and exits with status 135 (128 +
/// SIGBUS, what a shell reports for the signal).
extern "C" fn on_sigbus(_signal: libc::c_int) {
    const HEAD: &[u8] = b"moestream: SIGBUS while copying from a memory-mapped model file (it was truncated or its disk failed during the run; --io direct or buffered reads report this as an error): ";
    let ptr = COPYING.load(Ordering::Relaxed);
    let len = COPYING_LEN.load(Ordering::Relaxed);
    // SAFETY: write(2) and _exit(2) are async-signal-safe; `ptr` is null or
    // a leaked byte string of `len` bytes that is never freed.
    unsafe {
        libc::write(2, HEAD.as_ptr().cast(), HEAD.len());
        if !ptr.is_null() {
            libc::write(2, ptr.cast(), len);
        }
        libc::_exit(135);
    }
}
