//! `IoError`: every way a read can fail, named by the layer that saw it.
//!
//! Operating errors (a missing file, a truncated file, a kernel without
//! io_uring) are values of this enum; programmer errors (a window outside its
//! buffer) are assertions. Every error about a file names the file, and every
//! error about a read also names the byte range, so a message alone locates
//! the problem.

use std::io;
use std::path::PathBuf;

/// The error type of every fallible operation in this crate.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    /// A system call on a file failed (`op` is "open", "pread", "fadvise", ...).
    #[error("{op} {} (offset {offset}, {len} bytes): {source}", path.display())]
    Os {
        op: &'static str,
        path: PathBuf,
        offset: u64,
        len: usize,
        #[source]
        source: io::Error,
    },

    /// The file ended before the requested range did. The partially filled
    /// buffer is dropped with this error; it is never handed out.
    #[error(
        "short read of {}: wanted {len} bytes at offset {offset}, got {got} (file too short or truncated)",
        path.display()
    )]
    ShortRead {
        path: PathBuf,
        offset: u64,
        len: usize,
        got: usize,
    },

    /// An O_DIRECT operation was given an offset, length or address that is
    /// not a multiple of the block alignment.
    #[error("unaligned {what}: {value} is not a multiple of {align}")]
    Unaligned {
        what: &'static str,
        value: u64,
        align: usize,
    },

    /// A memory-mapped file shrank while served: its mapping no longer
    /// covers the range (touching it would kill the process with SIGBUS).
    #[error(
        "{}: the file shrank to {now} bytes while mapped (read of {len} bytes at offset {offset}); the model changed during the run",
        path.display()
    )]
    FileShrank {
        path: PathBuf,
        offset: u64,
        len: usize,
        now: u64,
    },

    /// An aligned buffer could not be allocated.
    #[error("allocation of an aligned buffer of {bytes} bytes failed")]
    Alloc { bytes: usize },

    /// io_uring cannot be used here (old kernel, seccomp filter, missing
    /// opcode); callers fall back to the synchronous `RangeReader`.
    #[error("io_uring unavailable: {reason}")]
    RingUnavailable { reason: String },

    /// A ring system call (`io_uring_enter`) failed.
    #[error("io_uring {op}: {source}")]
    Ring {
        op: &'static str,
        #[source]
        source: io::Error,
    },

    /// A request that cannot be carried out as given (e.g. a disk sweep
    /// whose block size fits in none of its files); `what` says why and
    /// names the files involved.
    #[error("{what}")]
    BadInput { what: String },

    /// A read mode name did not parse.
    #[error("unknown read mode {name:?} (expected direct, buffered, drop, mmap or pread)")]
    UnknownMode { name: String },
}

impl IoError {
    /// Builds an [`IoError::Os`] for an operation on `path` over `[offset, offset + len)`.
    pub fn os(
        op: &'static str,
        path: impl Into<PathBuf>,
        offset: u64,
        len: usize,
        source: io::Error,
    ) -> Self {
        IoError::Os {
            op,
            path: path.into(),
            offset,
            len,
            source,
        }
    }
}
