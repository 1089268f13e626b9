//! Scratch buffers of the forward pass, reused across forwards so a decode
//! step allocates nothing once the first one has run.
//!
//! [`Scratch::zeroed`] hands out a zeroed `f32` buffer taken from a
//! per-thread free list (the smallest pooled buffer that is large enough,
//! else the largest one, grown); dropping it returns the allocation to the
//! list. A decode step asks for the same sizes in the same order every
//! time, so after the first step every request is served from the list.
//! The list keeps at most [`POOLED_MAX`] buffers and [`POOLED_BYTES_MAX`]
//! bytes, and never a buffer over [`BUFFER_BYTES_MAX`] (a long prefill's
//! attention scratch is freed, not kept): what stays pooled is within the
//! RAM plan's activation item.
//!
//! [`with_vec`] lends a reusable `Vec` of any element type for the same
//! purpose (index lists, routing pairs), one per type and thread.

use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ops::{Deref, DerefMut};

/// Buffers a thread keeps pooled.
pub const POOLED_MAX: usize = 64;
/// Bytes a thread keeps pooled.
pub const POOLED_BYTES_MAX: usize = 64 << 20;
/// The largest buffer that is pooled rather than freed.
pub const BUFFER_BYTES_MAX: usize = 16 << 20;

thread_local! {
    static POOL: RefCell<Vec<Vec<f32>>> = RefCell::new(Vec::with_capacity(POOLED_MAX));
    static POOLED_BYTES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    static VECS: RefCell<HashMap<TypeId, Vec<Box<dyn Any>>>> = RefCell::new(HashMap::new());
}

/// A zeroed `f32` buffer on loan from the thread's pool.
pub struct Scratch {
    buf: Vec<f32>,
}

impl Scratch {
    /// A buffer of `len` zeros.
    pub fn zeroed(len: usize) -> Scratch {
        let mut buf = POOL
            .try_with(|p| {
                let mut p = p.borrow_mut();
                let fit = p
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| b.capacity() >= len)
                    .min_by_key(|(_, b)| b.capacity())
                    .map(|(i, _)| i);
                let pick = fit.or_else(|| {
                    p.iter()
                        .enumerate()
                        .max_by_key(|(_, b)| b.capacity())
                        .map(|(i, _)| i)
                });
                pick.map(|i| {
                    let b = p.swap_remove(i);
                    POOLED_BYTES.with(|n| n.set(n.get() - bytes_of(&b)));
                    b
                })
            })
            .ok()
            .flatten()
            .unwrap_or_default();
        buf.clear();
        if buf.capacity() < len {
            // Exactly `len`, never the amortized doubling `resize` would
            // make of a smaller pooled buffer: the plan's activations item
            // bounds the largest request, not twice a recycled one.
            buf = Vec::with_capacity(len);
        }
        buf.resize(len, 0.0);
        Scratch { buf }
    }
}

impl Deref for Scratch {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        &self.buf
    }
}

impl DerefMut for Scratch {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.buf
    }
}

impl<'a> IntoIterator for &'a Scratch {
    type Item = &'a f32;
    type IntoIter = std::slice::Iter<'a, f32>;

    fn into_iter(self) -> Self::IntoIter {
        self.buf.iter()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        let bytes = bytes_of(&buf);
        if bytes == 0 || bytes > BUFFER_BYTES_MAX {
            return;
        }
        // During thread teardown the pool may be gone: the buffer is freed.
        let _ = POOL.try_with(|p| {
            let mut p = p.borrow_mut();
            let pooled = POOLED_BYTES.with(|n| n.get());
            if p.len() < POOLED_MAX && pooled + bytes <= POOLED_BYTES_MAX {
                POOLED_BYTES.with(|n| n.set(pooled + bytes));
                p.push(buf);
            }
        });
    }
}

fn bytes_of(b: &Vec<f32>) -> usize {
    b.capacity() * std::mem::size_of::<f32>()
}

/// Runs `f` with an empty `Vec<T>` whose allocation is reused by the next
/// call on this thread (nested calls for the same `T` get separate ones).
pub fn with_vec<T: 'static, R>(f: impl FnOnce(&mut Vec<T>) -> R) -> R {
    let key = TypeId::of::<T>();
    let taken: Option<Box<dyn Any>> = VECS
        .try_with(|m| m.borrow_mut().get_mut(&key).and_then(Vec::pop))
        .ok()
        .flatten();
    let mut v: Box<Vec<T>> = match taken.map(|b| b.downcast::<Vec<T>>()) {
        Some(Ok(v)) => v,
        _ => Box::new(Vec::new()),
    };
    v.clear();
    let r = f(&mut v);
    v.clear();
    let _ = VECS.try_with(|m| {
        let mut m = m.borrow_mut();
        let list = m.entry(key).or_default();
        if list.len() < POOLED_MAX {
            list.push(v as Box<dyn Any>);
        }
    });
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_zeroed_and_reused() {
        let ptr = {
            let mut a = Scratch::zeroed(1000);
            assert!(a.iter().all(|&x| x == 0.0));
            a[3] = 7.0;
            a.as_ptr()
        };
        let b = Scratch::zeroed(500);
        assert_eq!(b.len(), 500);
        assert!(
            b.iter().all(|&x| x == 0.0),
            "reused buffers come back zeroed"
        );
        assert_eq!(b.as_ptr(), ptr, "the pooled allocation was reused");
        let c = Scratch::zeroed(2000);
        assert_eq!(c.len(), 2000);
        assert_ne!(c.as_ptr(), b.as_ptr());
    }

    #[test]
    fn a_grown_buffer_holds_exactly_the_request() {
        drop(Scratch::zeroed(3000));
        let big = Scratch::zeroed(5000);
        assert_eq!(
            big.buf.capacity(),
            5000,
            "no amortized doubling of a pooled 3000"
        );
    }

    #[test]
    fn huge_buffers_are_freed_not_pooled() {
        drop(Scratch::zeroed(BUFFER_BYTES_MAX / 4 + 1));
        assert!(POOL.with(|p| p.borrow().iter().all(|b| bytes_of(b) <= BUFFER_BYTES_MAX)));
        for _ in 0..2 * POOLED_MAX {
            drop(Scratch::zeroed(BUFFER_BYTES_MAX / 8));
        }
        let pooled: usize = POOL.with(|p| p.borrow().iter().map(bytes_of).sum());
        assert_eq!(pooled, POOLED_BYTES.with(|n| n.get()));
        assert!(pooled <= POOLED_BYTES_MAX);
    }

    #[test]
    fn lent_vecs_are_empty_and_nest() {
        let outer = with_vec::<usize, _>(|v| {
            v.extend([1, 2, 3]);
            let inner = with_vec::<usize, _>(|w| {
                assert!(w.is_empty());
                w.push(9);
                w.len()
            });
            assert_eq!(v.len(), 3);
            inner
        });
        assert_eq!(outer, 1);
        with_vec::<usize, _>(|v| assert!(v.is_empty()));
    }
}
