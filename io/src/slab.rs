//! `Slab`, the result of one read, and `SlabPool`, which recycles the aligned
//! buffers slabs are made of.
//!
//! A slab owns its backing memory and a window `[start, start + len)` into
//! it: a direct read fills the aligned superset of the requested range and
//! the window picks the requested bytes out of it. Invariant: the window lies
//! inside the backing memory, and every byte in it came from the file (a read
//! that ended early never becomes a slab).
//!
//! The pool bounds the bytes it keeps (`pooled_bytes_max`); a buffer returned
//! to a full pool is freed. A slab made from a pooled buffer gives it back
//! when dropped.

use std::sync::{Arc, Mutex};

use crate::aligned::AlignedBuf;
use crate::error::IoError;

/// The memory behind a slab.
enum Backing {
    /// An aligned buffer (direct, buffered, drop and mmap reads; the ring).
    Aligned(AlignedBuf),
    /// A plain vector (the `pread` mode).
    Heap(Vec<u8>),
}

impl Backing {
    fn as_slice(&self) -> &[u8] {
        match self {
            Backing::Aligned(buf) => buf.as_slice(),
            Backing::Heap(vec) => vec.as_slice(),
        }
    }
}

/// The bytes of one completed read.
pub struct Slab {
    backing: Backing,
    start: usize,
    len: usize,
    pool: Option<Arc<SlabPool>>,
}

impl Slab {
    /// A slab over `buf[start..start + len]`, returned to `pool` on drop.
    /// Panics if the window is outside the buffer (a programmer error).
    pub fn from_aligned(
        buf: AlignedBuf,
        start: usize,
        len: usize,
        pool: Option<Arc<SlabPool>>,
    ) -> Self {
        assert_window(start, len, buf.len());
        Slab {
            backing: Backing::Aligned(buf),
            start,
            len,
            pool,
        }
    }

    /// A slab holding all of `vec`.
    pub fn from_vec(vec: Vec<u8>) -> Self {
        let len = vec.len();
        Slab {
            backing: Backing::Heap(vec),
            start: 0,
            len,
            pool: None,
        }
    }

    /// The requested bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.backing.as_slice()[self.start..self.start + self.len]
    }

    /// Number of requested bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length read.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl AsRef<[u8]> for Slab {
    fn as_ref(&self) -> &[u8] {
        self.bytes()
    }
}

impl std::fmt::Debug for Slab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slab")
            .field("start", &self.start)
            .field("len", &self.len)
            .field("pooled", &self.pool.is_some())
            .finish()
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        let Some(pool) = self.pool.take() else {
            return;
        };
        if let Backing::Aligned(buf) =
            std::mem::replace(&mut self.backing, Backing::Heap(Vec::new()))
        {
            pool.give(buf);
        }
    }
}

fn assert_window(start: usize, len: usize, buf_len: usize) {
    assert!(
        start.checked_add(len).is_some_and(|end| end <= buf_len),
        "slab window [{start}, {start}+{len}) outside buffer of {buf_len} bytes"
    );
}

/// A bounded pool of aligned buffers, shared between threads.
pub struct SlabPool {
    pooled_bytes_max: usize,
    free: Mutex<FreeList>,
}

#[derive(Default)]
struct FreeList {
    bufs: Vec<AlignedBuf>,
    bytes: usize,
}

impl SlabPool {
    /// A pool keeping at most `pooled_bytes_max` bytes of idle buffers.
    pub fn new(pooled_bytes_max: usize) -> Arc<Self> {
        Arc::new(SlabPool {
            pooled_bytes_max,
            free: Mutex::new(FreeList::default()),
        })
    }

    /// A buffer of length `len`: the smallest pooled one that fits, else a
    /// fresh allocation. Its contents are unspecified (zeroes or stale data).
    pub fn take(&self, len: usize) -> Result<AlignedBuf, IoError> {
        let pooled = self.take_pooled(len);
        let mut buf = match pooled {
            Some(buf) => buf,
            None => AlignedBuf::new(len)?,
        };
        buf.set_len(len);
        Ok(buf)
    }

    /// Returns a buffer to the pool; frees it if the pool is at its limit.
    pub fn give(&self, buf: AlignedBuf) {
        if buf.capacity() == 0 {
            return;
        }
        let mut free = self.lock();
        if free.bytes + buf.capacity() > self.pooled_bytes_max {
            return;
        }
        free.bytes += buf.capacity();
        free.bufs.push(buf);
    }

    /// Bytes of idle buffers held now.
    pub fn pooled_bytes(&self) -> usize {
        self.lock().bytes
    }

    /// The limit on idle bytes.
    pub fn pooled_bytes_max(&self) -> usize {
        self.pooled_bytes_max
    }

    fn take_pooled(&self, len: usize) -> Option<AlignedBuf> {
        let mut free = self.lock();
        let best = free
            .bufs
            .iter()
            .enumerate()
            .filter(|(_, buf)| buf.capacity() >= len)
            .min_by_key(|(_, buf)| buf.capacity())
            .map(|(i, _)| i)?;
        let buf = free.bufs.swap_remove(best);
        free.bytes -= buf.capacity();
        Some(buf)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FreeList> {
        // A panic while holding the lock leaves the list consistent (every
        // mutation is a single push/remove plus counter update), so recover.
        self.free
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl std::fmt::Debug for SlabPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlabPool")
            .field("pooled_bytes", &self.pooled_bytes())
            .field("pooled_bytes_max", &self.pooled_bytes_max)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slab_windows_into_buffer() {
        let mut buf = AlignedBuf::new(8192).unwrap();
        for (i, b) in buf.as_mut_slice().iter_mut().enumerate() {
            *b = i as u8;
        }
        let slab = Slab::from_aligned(buf, 100, 3, None);
        assert_eq!(slab.bytes(), &[100, 101, 102]);
        assert_eq!(slab.len(), 3);
    }

    #[test]
    #[should_panic(expected = "outside buffer")]
    fn window_outside_buffer_panics() {
        let buf = AlignedBuf::new(10).unwrap();
        let _ = Slab::from_aligned(buf, 8, 3, None);
    }

    #[test]
    fn vec_slab() {
        let slab = Slab::from_vec(vec![1, 2, 3]);
        assert_eq!(slab.bytes(), &[1, 2, 3]);
    }

    #[test]
    fn pool_recycles_dropped_slabs() {
        let pool = SlabPool::new(1 << 20);
        let buf = pool.take(5000).unwrap();
        assert_eq!(buf.capacity(), 8192);
        let slab = Slab::from_aligned(buf, 0, 5000, Some(pool.clone()));
        drop(slab);
        assert_eq!(pool.pooled_bytes(), 8192);
        let again = pool.take(6000).unwrap();
        assert_eq!(again.capacity(), 8192);
        assert_eq!(again.len(), 6000);
        assert_eq!(pool.pooled_bytes(), 0);
    }

    #[test]
    fn pool_picks_smallest_fit() {
        let pool = SlabPool::new(1 << 20);
        pool.give(AlignedBuf::new(3 * 4096).unwrap());
        pool.give(AlignedBuf::new(4096).unwrap());
        pool.give(AlignedBuf::new(2 * 4096).unwrap());
        assert_eq!(pool.take(4097).unwrap().capacity(), 2 * 4096);
        assert_eq!(pool.take(1).unwrap().capacity(), 4096);
        assert_eq!(pool.pooled_bytes(), 3 * 4096);
    }

    #[test]
    fn pool_respects_byte_limit() {
        let pool = SlabPool::new(8192);
        pool.give(AlignedBuf::new(4096).unwrap());
        pool.give(AlignedBuf::new(4096).unwrap());
        pool.give(AlignedBuf::new(4096).unwrap());
        assert_eq!(pool.pooled_bytes(), 8192);
        let zero = SlabPool::new(0);
        zero.give(AlignedBuf::new(1).unwrap());
        assert_eq!(zero.pooled_bytes(), 0);
    }
}
