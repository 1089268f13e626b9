//! The `direct` mode: O_DIRECT reads of the aligned superset of each range
//! into a pooled aligned buffer, windowed down to the requested bytes.

use std::path::Path;
use std::sync::Arc;

use crate::error::IoError;
use crate::file::{DirectSpan, OpenFile};
use crate::mode::ReadMode;
use crate::slab::{Slab, SlabPool};
use crate::source::RangeReader;

/// A reader over a file opened with O_DIRECT.
pub(crate) struct DirectReader {
    file: Arc<OpenFile>,
    pool: Arc<SlabPool>,
}

impl DirectReader {
    pub(crate) fn new(file: OpenFile, pool: Arc<SlabPool>) -> Self {
        assert!(file.is_direct(), "DirectReader needs an O_DIRECT file");
        DirectReader {
            file: Arc::new(file),
            pool,
        }
    }
}

impl RangeReader for DirectReader {
    fn read(&self, offset: u64, len: usize) -> Result<Slab, IoError> {
        self.file.check_range(offset, len)?;
        let span = DirectSpan::covering(offset, len);
        // The pool hands out aligned buffers with aligned capacity, and
        // `span.read_len` is aligned, so the read meets O_DIRECT's rules.
        let mut buf = self.pool.take(span.read_len)?;
        let got = self
            .file
            .read_at_most(buf.as_mut_slice(), span.read_offset)?;
        let needed = span.start + len;
        if got < needed {
            self.pool.give(buf);
            let got_requested = got.saturating_sub(span.start);
            return Err(self.file.short_read(offset, len, got_requested));
        }
        Ok(Slab::from_aligned(
            buf,
            span.start,
            len,
            Some(self.pool.clone()),
        ))
    }

    fn path(&self) -> &Path {
        self.file.path()
    }

    fn len_bytes(&self) -> u64 {
        self.file.len_bytes()
    }

    fn effective_mode(&self) -> ReadMode {
        ReadMode::Direct
    }

    fn open_file(&self) -> Option<Arc<OpenFile>> {
        Some(self.file.clone())
    }
}
