//! `ReadMode`: how bytes travel from the file to a slab.
//!
//! All modes return byte-identical results; they differ only in how they use
//! the page cache, which is why the best one is measured per disk rather than
//! fixed:
//! - `direct`: O_DIRECT, bypassing the page cache; reads the 4096-aligned
//!   superset of the range into an aligned buffer and windows into it.
//! - `buffered`: pread through the page cache into a pooled aligned buffer
//!   (the page cache acts as a free second-level cache).
//! - `drop`: buffered, then `posix_fadvise(DONTNEED)` on the range, so the
//!   read does not grow the page cache.
//! - `mmap`: map the file once and copy the range out.
//! - `pread`: once a fresh `Vec` per read (the simplest baseline), which
//!   paid page faults inside every read; now the same reads as `buffered`,
//!   kept as a name for existing profiles and scripts.

use std::fmt;
use std::str::FromStr;

use crate::error::IoError;

/// How a [`crate::RangeReader`] reads its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReadMode {
    Direct,
    Buffered,
    Drop,
    Mmap,
    Pread,
}

impl ReadMode {
    /// Every mode, in a fixed order (for benchmarks and tests).
    pub const ALL: [ReadMode; 5] = [
        ReadMode::Direct,
        ReadMode::Buffered,
        ReadMode::Drop,
        ReadMode::Mmap,
        ReadMode::Pread,
    ];

    /// The mode's name as accepted by `FromStr`.
    pub fn name(self) -> &'static str {
        match self {
            ReadMode::Direct => "direct",
            ReadMode::Buffered => "buffered",
            ReadMode::Drop => "drop",
            ReadMode::Mmap => "mmap",
            ReadMode::Pread => "pread",
        }
    }
}

impl fmt::Display for ReadMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReadMode {
    type Err = IoError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ReadMode::ALL
            .into_iter()
            .find(|mode| mode.name() == s)
            .ok_or_else(|| IoError::UnknownMode { name: s.to_owned() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for mode in ReadMode::ALL {
            assert_eq!(mode.to_string().parse::<ReadMode>().unwrap(), mode);
        }
        assert_eq!("drop".parse::<ReadMode>().unwrap(), ReadMode::Drop);
    }

    #[test]
    fn unknown_name_is_an_error() {
        let err = "Direct".parse::<ReadMode>().unwrap_err();
        assert!(err.to_string().contains("\"Direct\""));
    }
}
