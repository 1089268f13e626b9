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
//!
//! Where the memory comes from: a buffer of [`MAP_BYTES_MIN`] or more (an
//! expert, a slab) is its own anonymous mapping, zero-filled by the kernel
//! on first touch and never written by us first, and from 2 MiB on placed
//! on a 2 MiB boundary and advised for transparent huge pages. A heap
//! allocation of that size would be zeroed twice (the kernel's page clear,
//! then `alloc_zeroed`'s memset, which faults every 4 KiB page in user
//! space): measured on a 75-slot Qwen3-30B-shaped run, half the profile was
//! the kernel clearing pages for that memset. Smaller buffers come from the
//! heap. Fresh allocations are counted ([`alloc_stats`]) so tests can check
//! that reads recycle buffers instead of faulting in new ones.

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::IoError;

/// Block alignment for O_DIRECT: offsets, lengths and buffer addresses are
/// multiples of this.
pub const ALIGN: usize = 4096;

/// Buffers of at least this many bytes are anonymous mappings, not heap
/// allocations (see the module docs).
pub const MAP_BYTES_MIN: usize = 1 << 20;

/// A transparent huge page: mappings of at least this size start on this
/// boundary.
const HUGE_PAGE: usize = 2 << 20;

static FRESH_BUFFERS: AtomicU64 = AtomicU64::new(0);
static FRESH_BYTES: AtomicU64 = AtomicU64::new(0);

/// Aligned buffers allocated since the process started: (count, bytes).
/// Every one of them is memory the kernel had to fault in and zero on first
/// touch; a read path that recycles its buffers keeps these flat.
pub fn alloc_stats() -> (u64, u64) {
    (
        FRESH_BUFFERS.load(Ordering::Relaxed),
        FRESH_BYTES.load(Ordering::Relaxed),
    )
}

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
        let capacity = len
            .checked_next_multiple_of(ALIGN)
            .ok_or(IoError::Alloc { bytes: len })?;
        if capacity == 0 {
            return Ok(Self::empty());
        }
        let ptr = if capacity >= MAP_BYTES_MIN {
            map_zeroed(capacity)?
        } else {
            heap_zeroed(capacity)?
        };
        FRESH_BUFFERS.fetch_add(1, Ordering::Relaxed);
        FRESH_BYTES.fetch_add(capacity as u64, Ordering::Relaxed);
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

    /// Faults every page of the allocation in now by writing a zero byte to
    /// each (the contents of a fresh buffer are unchanged), so a later read
    /// into it takes no page fault.
    pub(crate) fn prefault(&mut self) {
        let base = self.ptr.as_ptr();
        for offset in (0..self.capacity).step_by(ALIGN) {
            // SAFETY: `offset < capacity`, inside the allocation, and the
            // byte written is the zero it holds (module invariant: freshly
            // allocated bytes are zero; writing a zero over any initialized
            // byte keeps the buffer initialized either way).
            unsafe { std::ptr::write_volatile(base.add(offset), 0) };
        }
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
        if self.capacity >= MAP_BYTES_MIN {
            // SAFETY: a capacity of MAP_BYTES_MIN or more means `ptr` is the
            // start of a mapping of exactly `capacity` bytes made by
            // `map_zeroed`, unmapped only here.
            let rc = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.capacity) };
            debug_assert_eq!(rc, 0, "munmap of an AlignedBuf failed");
            return;
        }
        // SAFETY: a smaller non-zero capacity means `ptr` came from
        // `alloc_zeroed` with exactly this layout (size = capacity, align =
        // ALIGN), which was valid at allocation.
        unsafe {
            let layout = Layout::from_size_align_unchecked(self.capacity, ALIGN);
            alloc::dealloc(self.ptr.as_ptr(), layout);
        }
    }
}

/// A zeroed heap allocation of `capacity` (> 0, a multiple of [`ALIGN`]).
fn heap_zeroed(capacity: usize) -> Result<NonNull<u8>, IoError> {
    let layout =
        Layout::from_size_align(capacity, ALIGN).map_err(|_| IoError::Alloc { bytes: capacity })?;
    // SAFETY: `layout` has a non-zero size (capacity > 0).
    let raw = unsafe { alloc::alloc_zeroed(layout) };
    NonNull::new(raw).ok_or(IoError::Alloc { bytes: capacity })
}

/// An anonymous private mapping of exactly `capacity` bytes (a multiple of
/// [`ALIGN`]), zero-filled by the kernel. From [`HUGE_PAGE`] on it starts on
/// a huge-page boundary (mapped with room to spare, the ends trimmed) and is
/// advised for huge pages, so first touch faults 2 MiB at a time.
fn map_zeroed(capacity: usize) -> Result<NonNull<u8>, IoError> {
    let huge = capacity >= HUGE_PAGE;
    let slack = if huge { HUGE_PAGE } else { 0 };
    let span = capacity
        .checked_add(slack)
        .ok_or(IoError::Alloc { bytes: capacity })?;
    // SAFETY: a fresh anonymous private mapping; no existing memory is
    // touched.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(IoError::Alloc { bytes: capacity });
    }
    let base = raw as usize;
    let start = if huge {
        base.next_multiple_of(HUGE_PAGE)
    } else {
        base
    };
    // SAFETY: [base, start) and [start + capacity, base + span) lie inside
    // the mapping just made and are page-aligned (mmap returns page-aligned
    // addresses; HUGE_PAGE and capacity are multiples of the page size);
    // nothing refers to them. The advice only affects how pages are backed.
    unsafe {
        if start > base {
            libc::munmap(raw, start - base);
        }
        let end = start + capacity;
        if base + span > end {
            libc::munmap(end as *mut libc::c_void, base + span - end);
        }
        if huge {
            libc::madvise(start as *mut libc::c_void, capacity, libc::MADV_HUGEPAGE);
        }
    }
    NonNull::new(start as *mut u8).ok_or(IoError::Alloc { bytes: capacity })
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
    fn mapped_buffers_are_zeroed_aligned_and_counted() {
        for len in [MAP_BYTES_MIN, HUGE_PAGE + 5000, 3 * HUGE_PAGE] {
            let (n0, b0) = alloc_stats();
            let mut buf = AlignedBuf::new(len).unwrap();
            let (n1, b1) = alloc_stats();
            assert!(n1 > n0 && b1 >= b0 + buf.capacity() as u64);
            assert_eq!(buf.as_mut_ptr() as usize % ALIGN, 0);
            if len >= HUGE_PAGE {
                assert_eq!(buf.as_mut_ptr() as usize % HUGE_PAGE, 0);
            }
            assert!(buf.as_slice().iter().all(|&b| b == 0));
            buf.set_len(buf.capacity());
            let last = buf.capacity() - 1;
            buf.as_mut_slice()[last] = 9;
            assert_eq!(buf.as_slice()[last], 9);
        }
    }

    #[test]
    fn align_helpers() {
        assert_eq!(align_up(0), 0);
        assert_eq!(align_up(1), 4096);
        assert_eq!(align_down_u64(4095), 0);
        assert_eq!(align_down_u64(8193), 8192);
    }
}
