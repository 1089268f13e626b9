//! `Ring`: the thin, unsafe edge between the reactor and io_uring. It owns
//! the io_uring instance, probes it at construction, pushes read SQEs and
//! reaps CQEs into a list.
//!
//! Invariant: the ring never decides buffer lifetimes. `push_read` is
//! `unsafe` because its caller must keep the buffer and the descriptor alive
//! until the CQE carrying the same `user_data` has been reaped; the reactor
//! does so by keeping the owning operation in its slot table.

use std::io;
use std::os::fd::RawFd;

use io_uring::{opcode, register::Probe, types, IoUring};

use crate::error::IoError;

/// An io_uring instance with a fixed submission queue depth.
pub(crate) struct Ring {
    uring: IoUring,
}

/// One reaped completion: the `user_data` of its SQE and the result
/// (bytes read, or a negated errno).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Completion {
    pub user_data: u64,
    pub result: i32,
}

impl Ring {
    /// Creates a ring with `depth` submission entries and checks that the
    /// kernel supports `IORING_OP_READ`.
    pub(crate) fn new(depth: u32) -> Result<Self, IoError> {
        let uring = IoUring::new(depth).map_err(|e| IoError::RingUnavailable {
            reason: format!("io_uring_setup({depth}) failed: {e}"),
        })?;
        let mut probe = Probe::new();
        uring
            .submitter()
            .register_probe(&mut probe)
            .map_err(|e| IoError::RingUnavailable {
                reason: format!("IORING_REGISTER_PROBE failed: {e}"),
            })?;
        if !probe.is_supported(opcode::Read::CODE) {
            return Err(IoError::RingUnavailable {
                reason: "kernel lacks IORING_OP_READ".to_owned(),
            });
        }
        Ok(Ring { uring })
    }

    /// Queues a read of `len` bytes at `offset` of `fd` into `buf`. Returns
    /// false (and queues nothing) when the submission queue is full.
    ///
    /// # Safety
    /// `buf` must be valid for writes of `len` bytes and `fd` must stay open,
    /// and neither may be freed or reused, until the completion carrying
    /// `user_data` has been returned by [`Ring::reap`].
    pub(crate) unsafe fn push_read(
        &mut self,
        fd: RawFd,
        buf: *mut u8,
        len: u32,
        offset: u64,
        user_data: u64,
    ) -> bool {
        let sqe = opcode::Read::new(types::Fd(fd), buf, len)
            .offset(offset)
            .build()
            .user_data(user_data);
        // SAFETY: the entry's buffer and descriptor stay valid until its
        // completion is reaped, which this function's contract passes on to
        // the caller.
        unsafe { self.uring.submission().push(&sqe).is_ok() }
    }

    /// Submits queued entries and waits for at least `want` completions.
    /// Interruptions and transient busy errors return `Ok(0)`; the caller
    /// reaps and calls again.
    pub(crate) fn submit_and_wait(&mut self, want: usize) -> Result<usize, IoError> {
        match self.uring.submit_and_wait(want) {
            Ok(n) => Ok(n),
            Err(e) if is_transient(&e) => Ok(0),
            Err(e) => Err(IoError::Ring {
                op: "submit_and_wait",
                source: e,
            }),
        }
    }

    /// Moves every available completion into `out`.
    pub(crate) fn reap(&mut self, out: &mut Vec<Completion>) {
        out.extend(self.uring.completion().map(|cqe| Completion {
            user_data: cqe.user_data(),
            result: cqe.result(),
        }));
    }
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
    )
}
