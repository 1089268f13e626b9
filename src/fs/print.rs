//! A cheap fingerprint of a file's content: its size, its mtime and
//! hashes of its first and last MiB. Weights rewritten in place, even at
//! the same size, change it; reading it costs two MiB per file whatever
//! the file's size.

use crate::error::{Error, Result};
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// Bytes hashed at each end of the file.
pub const END_BYTES: u64 = 1 << 20;

/// The parts of a file's fingerprint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Print {
    pub bytes: u64,
    /// Modification time, nanoseconds since the epoch (0 where unknown).
    pub mtime_ns: u128,
    /// CRC-32 of the first and of the last [`END_BYTES`] (the same for a
    /// file no longer than that).
    pub head_crc: u32,
    pub tail_crc: u32,
}

impl Print {
    /// The fingerprint of the regular file `path`.
    pub fn of(path: &Path) -> Result<Print> {
        let mut file = super::read::open(path)?;
        let md = file.metadata().map_err(|e| Error::file(path, e))?;
        let bytes = md.len();
        let mtime_ns = md
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        let head_crc = crc_of(&mut file, path, 0)?;
        let tail_crc = crc_of(&mut file, path, bytes.saturating_sub(END_BYTES))?;
        Ok(Print {
            bytes,
            mtime_ns,
            head_crc,
            tail_crc,
        })
    }

    /// The data part alone (size and end hashes, no mtime), as hex: what a
    /// copy of the same bytes shares.
    pub fn data_hex(&self) -> String {
        format!("{:08x}{:08x}", self.head_crc, self.tail_crc)
    }

    /// Feeds every part to `h`.
    pub fn feed(&self, h: &mut impl std::hash::Hasher) {
        h.write_u64(self.bytes);
        h.write_u128(self.mtime_ns);
        h.write_u32(self.head_crc);
        h.write_u32(self.tail_crc);
    }
}

fn crc_of(file: &mut std::fs::File, path: &Path, from: u64) -> Result<u32> {
    file.seek(SeekFrom::Start(from))
        .map_err(|e| Error::file(path, e))?;
    let mut buf = Vec::with_capacity(END_BYTES as usize);
    file.take(END_BYTES)
        .read_to_end(&mut buf)
        .map_err(|e| Error::file(path, e))?;
    Ok(crc32fast::hash(&buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_size_new_bytes_change_the_print() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w");
        let mut data = vec![1u8; 3 << 20];
        std::fs::write(&p, &data).unwrap();
        let a = Print::of(&p).unwrap();
        *data.last_mut().unwrap() = 2;
        std::fs::write(&p, &data).unwrap();
        let b = Print::of(&p).unwrap();
        assert_eq!(a.bytes, b.bytes);
        assert_ne!(a.data_hex(), b.data_hex());
    }
}
