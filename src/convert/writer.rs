//! Writing one container file: a safetensors file whose header is padded
//! (with spaces, as the format allows) so the data starts on a 4096-byte
//! boundary, and whose aligned groups (a routed expert's tensors) start on
//! 4096-byte boundaries, the gaps filled by zero `U8` padding tensors
//! (`__pad__.*`), so offsets stay contiguous and any safetensors reader
//! loads the file. The file is written through [`crate::fs::Output`] (a temp
//! file beside it, synced and renamed; removed on any error).

use crate::error::{Error, Result};
use crate::fs::Output;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Alignment of the data section and of every aligned group.
pub const ALIGN: u64 = 4096;

/// One tensor of the file.
#[derive(Clone, Debug, PartialEq)]
pub struct OutTensor {
    pub name: String,
    /// Safetensors dtype spelling: `U8`, `F32`, `BF16`, …
    pub dtype: String,
    pub shape: Vec<usize>,
    pub len: u64,
    /// Offset relative to the start of the data section.
    pub offset: u64,
}

/// The layout of one file: tensors in file order, padding included.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    pub tensors: Vec<OutTensor>,
    pub metadata: BTreeMap<String, String>,
    data_len: u64,
    pads: usize,
    prefix: String,
}

impl Layout {
    /// An empty layout; padding tensors are named `__pad__.{prefix}.{k}`
    /// (the prefix keeps them unique across the files of a model).
    pub fn new(prefix: &str) -> Layout {
        Layout {
            prefix: prefix.to_string(),
            ..Layout::default()
        }
    }

    /// Pads the data section to the next 4096-byte boundary.
    pub fn align(&mut self) {
        let pad = self.data_len.next_multiple_of(ALIGN) - self.data_len;
        if pad > 0 {
            let name = format!("__pad__.{}.{}", self.prefix, self.pads);
            self.pads += 1;
            self.push(name, "U8", vec![pad as usize], pad);
        }
    }

    /// Appends a tensor; returns its index.
    pub fn push(&mut self, name: String, dtype: &str, shape: Vec<usize>, len: u64) -> usize {
        self.tensors.push(OutTensor {
            name,
            dtype: dtype.to_string(),
            shape,
            len,
            offset: self.data_len,
        });
        self.data_len += len;
        self.tensors.len() - 1
    }

    /// Bytes of the data section.
    pub fn data_len(&self) -> u64 {
        self.data_len
    }

    /// The header bytes (length prefix excluded), padded with spaces so the
    /// data section starts on a 4096-byte boundary.
    pub fn header(&self) -> Vec<u8> {
        let mut map = serde_json::Map::new();
        if !self.metadata.is_empty() {
            let md: serde_json::Map<String, serde_json::Value> = self
                .metadata
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect();
            map.insert("__metadata__".into(), md.into());
        }
        for t in &self.tensors {
            map.insert(
                t.name.clone(),
                serde_json::json!({
                    "dtype": t.dtype,
                    "shape": t.shape,
                    "data_offsets": [t.offset, t.offset + t.len],
                }),
            );
        }
        let mut h = serde_json::to_vec(&map).expect("a JSON map serializes");
        let total = (8 + h.len() as u64).next_multiple_of(ALIGN);
        h.resize((total - 8) as usize, b' ');
        h
    }

    /// Absolute offset of the data section in the file.
    pub fn data_start(&self) -> u64 {
        8 + self.header().len() as u64
    }

    /// Size of the finished file.
    pub fn file_len(&self) -> u64 {
        self.data_start() + self.data_len
    }
}

/// A 64-bit FNV-1a over 8-byte little-endian words (the tail zero-padded),
/// fast enough to checksum every byte written and read back.
#[derive(Clone, Copy, Debug)]
pub struct Checksum {
    h: u64,
    tail: [u8; 8],
    tail_len: usize,
}

impl Default for Checksum {
    fn default() -> Self {
        Checksum {
            h: 0xcbf2_9ce4_8422_2325,
            tail: [0; 8],
            tail_len: 0,
        }
    }
}

impl Checksum {
    fn word(&mut self, w: u64) {
        self.h = (self.h ^ w).wrapping_mul(0x0100_0000_01b3);
    }

    /// Feeds `bytes`.
    pub fn update(&mut self, mut bytes: &[u8]) {
        if self.tail_len > 0 {
            let take = (8 - self.tail_len).min(bytes.len());
            self.tail[self.tail_len..self.tail_len + take].copy_from_slice(&bytes[..take]);
            self.tail_len += take;
            bytes = &bytes[take..];
            if self.tail_len < 8 {
                return;
            }
            self.word(u64::from_le_bytes(self.tail));
            self.tail_len = 0;
        }
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.word(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        let rest = words.remainder();
        self.tail[..rest.len()].copy_from_slice(rest);
        self.tail_len = rest.len();
    }

    /// The digest of everything fed.
    pub fn finish(mut self) -> u64 {
        if self.tail_len > 0 {
            self.tail[self.tail_len..].fill(0);
            self.word(u64::from_le_bytes(self.tail));
            self.word(self.tail_len as u64);
        }
        self.h
    }
}

/// A file being written: a temp file until [`FileWriter::finish`] renames
/// it; dropped unfinished (an error on the way), the temp file is removed.
pub struct FileWriter {
    layout: Layout,
    out: Output,
    next: usize,
    /// Bytes of the next tensor already written (by `write_part`).
    partial: u64,
    written: u64,
    sum: Checksum,
}

impl FileWriter {
    /// Starts `path` (through a temp file) and writes the header of `layout`.
    pub fn create(path: &Path, layout: Layout) -> Result<FileWriter> {
        let mut out = Output::create(path)?;
        let header = layout.header();
        out.write_all(&(header.len() as u64).to_le_bytes())
            .and_then(|_| out.write_all(&header))
            .map_err(|e| Error::file(out.tmp(), e))?;
        Ok(FileWriter {
            layout,
            out,
            next: 0,
            partial: 0,
            written: 0,
            sum: Checksum::default(),
        })
    }

    /// The next tensor to write (padding included), or `None` when done.
    pub fn next_tensor(&self) -> Option<&OutTensor> {
        self.layout.tensors.get(self.next)
    }

    /// Writes the bytes of the next tensor; a length that disagrees with the
    /// layout is a bug in the caller.
    pub fn write(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        assert_eq!(
            self.partial, 0,
            "tensor `{name}` written over a partial one"
        );
        assert_eq!(
            self.layout.tensors[self.next].len,
            bytes.len() as u64,
            "tensor `{name}`: length disagrees with the layout"
        );
        self.write_part(name, bytes)
    }

    /// Writes the next part of the next tensor's bytes (a large tensor can
    /// be streamed in pieces); the tensor is done when its length is reached.
    pub fn write_part(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        let t = &self.layout.tensors[self.next];
        assert_eq!(t.name, name, "tensors written out of layout order");
        let len = t.len;
        assert!(
            self.partial + bytes.len() as u64 <= len,
            "tensor `{name}`: more bytes than the layout gives it"
        );
        self.out
            .write_all(bytes)
            .map_err(|e| Error::file(self.out.tmp(), e))?;
        self.sum.update(bytes);
        self.written += bytes.len() as u64;
        self.partial += bytes.len() as u64;
        if self.partial == len {
            self.partial = 0;
            self.next += 1;
        }
        Ok(())
    }

    /// Writes the zeros of the next tensor if it is padding; returns whether it was.
    pub fn write_padding(&mut self) -> Result<bool> {
        match self.next_tensor() {
            Some(t) if t.name.starts_with("__pad__.") => {
                let (name, len) = (t.name.clone(), t.len as usize);
                self.write(&name, &vec![0u8; len])?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Flushes, syncs and renames the file into place; returns the checksum
    /// of its data section.
    pub fn finish(self) -> Result<u64> {
        assert_eq!(
            self.next,
            self.layout.tensors.len(),
            "file finished with tensors unwritten"
        );
        assert_eq!(self.written, self.layout.data_len());
        self.out.finish()?;
        Ok(self.sum.finish())
    }
}

/// The temporary name older versions wrote `path` under (`NAME.tmp`): a
/// crash of one may have left it; resuming removes it.
pub fn tmp_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_groups_and_data_start_fall_on_4096() {
        let mut l = Layout::new("0");
        l.push("a".into(), "F32", vec![3], 12);
        l.align();
        let g = l.push("b".into(), "U8", vec![5000], 5000);
        l.align();
        assert_eq!(l.tensors[g].offset % ALIGN, 0);
        assert_eq!(l.data_len() % ALIGN, 0);
        assert_eq!(l.data_start() % ALIGN, 0);
        // The header parses as safetensors, offsets contiguous.
        let mut file = (l.header().len() as u64).to_le_bytes().to_vec();
        file.extend(l.header());
        file.resize(l.file_len() as usize, 0);
        let st = safetensors::SafeTensors::deserialize(&file).unwrap();
        assert_eq!(st.tensor("b").unwrap().shape(), [5000]);
        assert!(st.names().iter().any(|n| n.starts_with("__pad__.0.")));
    }

    #[test]
    fn checksum_does_not_depend_on_how_bytes_are_split() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 37 % 251) as u8).collect();
        let mut whole = Checksum::default();
        whole.update(&data);
        let mut parts = Checksum::default();
        for c in data.chunks(13) {
            parts.update(c);
        }
        assert_eq!(whole.finish(), parts.finish());
        let mut other = Checksum::default();
        other.update(&data[..999]);
        assert_ne!(other.finish(), whole.finish());
    }
}
