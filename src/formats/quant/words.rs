//! Storage of a packed matrix's bytes and scales: an owned vector, or a
//! zero-copy window into the read slab an expert arrived in.
//!
//! A routed expert's gate, up and down (with their scales) are read as one
//! span into one slab; decoding them as windows of that slab, instead of
//! copying, saves a copy of every miss and keeps the slab's buffer (already
//! faulted in, recycled by the slab pool) as the cached expert's memory.
//! A window is only made when it is aligned for its element type;
//! otherwise the caller copies.

use moestream_io::Slab;
use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;

/// Element types a slab window may be viewed as: every bit pattern is a
/// valid value, and the alignment is at most 4.
pub trait Plain: Copy + 'static {}
impl Plain for u8 {}
impl Plain for u16 {}
impl Plain for f32 {}

/// Owned elements, or a window of a shared slab viewed as `T`.
#[derive(Clone)]
pub enum Words<T: Plain> {
    Owned(Vec<T>),
    Shared {
        slab: Arc<Slab>,
        /// Byte offset of the first element in `slab.bytes()`.
        start: usize,
        /// Elements.
        len: usize,
    },
}

impl<T: Plain> Words<T> {
    /// A view of `slab.bytes()[window]` as `T`s, or `None` when the window
    /// is misaligned for `T`, not a whole number of `T`s, or outside the
    /// slab.
    pub fn shared(slab: &Arc<Slab>, window: Range<usize>) -> Option<Words<T>> {
        let size = std::mem::size_of::<T>();
        let bytes = slab.bytes().get(window.clone())?;
        let aligned = (bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>());
        if !aligned || !bytes.len().is_multiple_of(size) {
            return None;
        }
        Some(Words::Shared {
            slab: slab.clone(),
            start: window.start,
            len: bytes.len() / size,
        })
    }

    /// Whether this is a window of a slab.
    pub fn is_shared(&self) -> bool {
        matches!(self, Words::Shared { .. })
    }
}

impl<T: Plain> Deref for Words<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            Words::Owned(v) => v,
            Words::Shared { slab, start, len } => {
                let bytes = &slab.bytes()[*start..*start + *len * std::mem::size_of::<T>()];
                // SAFETY: `shared` checked that the window lies in the slab,
                // is aligned for `T` and holds exactly `len` of them; `T` is
                // `Plain` (any bit pattern is a value); the slab's bytes are
                // immutable and live as long as the `Arc` this borrows from.
                unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), *len) }
            }
        }
    }
}

impl<T: Plain> From<Vec<T>> for Words<T> {
    fn from(v: Vec<T>) -> Self {
        Words::Owned(v)
    }
}

impl<T: Plain + PartialEq> PartialEq for Words<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Plain + fmt::Debug> fmt::Debug for Words<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.is_shared() { "shared" } else { "owned" };
        write!(f, "Words({kind}, {} elements)", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_view_the_slab_and_refuse_misalignment() {
        let mut bytes = Vec::new();
        for x in [1.5f32, -2.0, 3.25] {
            bytes.extend(x.to_le_bytes());
        }
        bytes.extend([7u8, 8, 9]);
        let buf = moestream_io::AlignedBuf::new(4096).unwrap();
        let mut buf = buf;
        buf.as_mut_slice()[..bytes.len()].copy_from_slice(&bytes);
        let slab = Arc::new(Slab::from_aligned(buf, 0, bytes.len(), None));
        let f: Words<f32> = Words::shared(&slab, 0..12).unwrap();
        assert_eq!(&*f, &[1.5, -2.0, 3.25]);
        let b: Words<u8> = Words::shared(&slab, 12..15).unwrap();
        assert_eq!(&*b, &[7, 8, 9]);
        assert!(Words::<f32>::shared(&slab, 1..5).is_none(), "misaligned");
        assert!(
            Words::<f32>::shared(&slab, 0..6).is_none(),
            "not whole f32s"
        );
        assert!(Words::<u8>::shared(&slab, 10..20).is_none(), "outside");
        assert_eq!(f, Words::Owned(vec![1.5, -2.0, 3.25]));
    }
}
