//! `AlignedBuf`: an owned heap buffer usable as an O_DIRECT target.
//!
//! Invariant (relied on by every `unsafe` block in this module and by the
//! ring, which hands the pointer to the kernel):
//! - the pointer is aligned to [`ALIGN`] (4096) bytes;
//! - the capacity is a multiple of [`ALIGN`]; a capacity of 0 means nothing
//!   is allocated and the pointer is a dangling, aligned, never-dereferenced
//!   placeholder;
//! - all `capacity` bytes are initialized (zeroed at allocation), so any
//!   length up to the capacity may be exposed as a slice;
//! - `len <= capacity`.
//!
//! The allocation never moves while the buffer lives, so moving an
//! `AlignedBuf` (into an in-flight operation, into a slab, into a pool) keeps
//! the address the kernel was given valid.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

use crate::error::IoError;

/// Block alignment for O_DIRECT: offsets, lengths and buffer addresses are
/// multiples of this.
pub const ALIGN: usize = 4096;

/// Rounds `n` up to a multiple of [`ALIGN`].
pub const fn align_up(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// Rounds `n` down to a multiple of [`ALIGN`].
pub const fn align_down_u64(n: u64) -> u64 {
    n - n % ALIGN as u64
}

/// An owned, zero-initialized, 4096-aligned heap buffer (see the module docs
/// for its invariant).
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    capacity: usize,
    len: usize,
}

// SAFETY: `AlignedBuf` uniquely owns its allocation, like `Vec<u8>`; no
// interior mutability or thread-bound state is involved.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only allow reads of initialized bytes.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// An empty buffer with no allocation.
    pub const fn empty() -> Self {
        AlignedBuf {
            ptr: dangling_aligned(),
            capacity: 0,
            len: 0,
        }
    }

    /// Allocates a zeroed buffer of length `len` whose capacity is `len`
    /// rounded up to [`ALIGN`].
    pub fn new(len: usize) -> Result<Self, IoError> {
        let capacity = align_up(len);
        if capacity == 0 {
            return Ok(Self::empty());
        }
        let layout = Layout::from_size_align(capacity, ALIGN)
            .map_err(|_| IoError::Alloc { bytes: capacity })?;
        // SAFETY: `layout` has a non-zero size (capacity > 0 checked above).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(IoError::Alloc { bytes: capacity })?;
        Ok(AlignedBuf { ptr, capacity, len })
    }

    /// Length of the exposed bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no bytes are exposed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Allocated bytes, a multiple of [`ALIGN`].
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Sets the exposed length. Panics if `len > capacity` (a programmer error).
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.capacity,
            "AlignedBuf::set_len({len}) beyond capacity {}",
            self.capacity
        );
        self.len = len;
    }

    /// The exposed bytes `[0, len)`.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the pointer is non-null and aligned, and `len <= capacity`
        // bytes are allocated and initialized (module invariant); for
        // capacity 0, len is 0 and a dangling aligned pointer is allowed.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The exposed bytes `[0, len)`, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` guarantees uniqueness.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Raw pointer to the start of the allocation, for handing to the kernel.
    /// The caller must keep `self` alive (not dropped, not reused) until the
    /// kernel is done with the pointer.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Default for AlignedBuf {
    fn default() -> Self {
        Self::empty()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.capacity == 0 {
            return;
        }
        // SAFETY: a non-zero capacity means `ptr` came from `alloc_zeroed`
        // with exactly this layout (size = capacity, align = ALIGN), which
        // was valid at allocation.
        unsafe {
            let layout = Layout::from_size_align_unchecked(self.capacity, ALIGN);
            alloc::dealloc(self.ptr.as_ptr(), layout);
        }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .finish()
    }
}

/// A non-null pointer aligned to [`ALIGN`] that is never dereferenced.
const fn dangling_aligned() -> NonNull<u8> {
    NonNull::<Page>::dangling().cast()
}

/// A type whose alignment is [`ALIGN`], used only for its dangling pointer.
#[repr(C, align(4096))]
struct Page([u8; ALIGN]);

const _: () = assert!(std::mem::align_of::<Page>() == ALIGN);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_rounds_up_to_align() {
        for (len, capacity) in [
            (0, 0),
            (1, 4096),
            (4096, 4096),
            (4097, 8192),
            (10_000, 12_288),
        ] {
            let buf = AlignedBuf::new(len).unwrap();
            assert_eq!(buf.len(), len);
            assert_eq!(buf.capacity(), capacity);
            assert_eq!(buf.capacity() % ALIGN, 0);
        }
    }

    #[test]
    fn pointer_is_aligned() {
        for len in [0, 1, 4095, 4096, 65_537] {
            let mut buf = AlignedBuf::new(len).unwrap();
            assert_eq!(buf.as_mut_ptr() as usize % ALIGN, 0, "len {len}");
        }
    }

    #[test]
    fn zeroed_then_writable() {
        let mut buf = AlignedBuf::new(5000).unwrap();
        assert!(buf.as_slice().iter().all(|&b| b == 0));
        buf.as_mut_slice()[4999] = 7;
        buf.set_len(8192);
        assert_eq!(buf.as_slice()[4999], 7);
        assert_eq!(buf.as_slice()[8191], 0);
        buf.set_len(0);
        assert!(buf.is_empty());
    }

    #[test]
    #[should_panic(expected = "beyond capacity")]
    fn set_len_beyond_capacity_panics() {
        let mut buf = AlignedBuf::new(10).unwrap();
        buf.set_len(4097);
    }

    #[test]
    fn align_helpers() {
        assert_eq!(align_up(0), 0);
        assert_eq!(align_up(1), 4096);
        assert_eq!(align_down_u64(4095), 0);
        assert_eq!(align_down_u64(8193), 8192);
    }
}
