//! KV files: a sequence's KV cache saved to disk, so a restarted server
//! continues a conversation without prefilling it again.
//!
//! A file holds the tokens whose positions the cache holds and, per layer,
//! each buffer's filled rows (the order of [`crate::model::kv::LayerKv::buffers_mut`]):
//!
//! ```text
//! "MSKV0001" | header length (u32 LE) | header (JSON) | rows (f32 LE)
//! header: {model_key, model_dir, layouts, tokens, crc32}
//! ```
//!
//! `crc32` covers the tokens and every row. Loading refuses, naming the
//! reason, a file of another model (its key) or shape (its layouts), one
//! whose length or checksum does not match, and anything unparsable: a
//! refused file is recomputed, never used. Files are written through a
//! unique temporary file and a rename, so a crash leaves the old file or
//! the new one. Headers are read alone first ([`read_head`]), so a
//! directory of files is sorted out without reading its rows; a file
//! without the magic is not one of ours and is never touched.

use crate::error::{Error, Result};
use crate::fs::read::Streamed;
use crate::model::kv::{KvCache, KvLayout};
use serde::{Deserialize, Serialize};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

const MAGIC: &[u8; 8] = b"MSKV0001";
/// The largest header accepted (tokens dominate it).
const HEADER_MAX: usize = 64 << 20;
/// How far ahead of the rows being decoded the kernel is asked to read
/// them (32 of a disk's 2 MiB reads). With the device's 128 KiB read-ahead
/// alone a 16k-position cache of the 30B shape restored in 4.5 s inside a
/// 3.4 GB group, with this in 3.3 s (results/long-prompts.md).
const ROWS_AHEAD: u64 = 64 << 20;

#[derive(Serialize, Deserialize)]
struct Header {
    /// The KV key of the model that computed it ([`crate::server::kv_dir`]:
    /// its identity and its weights' content), in hex.
    model_key: String,
    /// The canonical directory (or GGUF file) of that model: a file of this
    /// model whose key is stale (the weights changed) may be removed; one of
    /// another model is left alone.
    #[serde(default)]
    model_dir: String,
    layouts: Vec<KvLayout>,
    tokens: Vec<u32>,
    crc32: u32,
}

/// A KV file's header, read without its rows.
pub struct Head {
    header: Header,
    /// Where the rows start and how many bytes follow.
    rows_at: u64,
    rows_len: u64,
}

impl Head {
    /// The tokens whose positions the file holds.
    pub fn tokens(&self) -> &[u32] {
        &self.header.tokens
    }

    /// The file's length in bytes.
    pub fn file_bytes(&self) -> u64 {
        self.rows_at + self.rows_len
    }

    /// The model directory recorded by the writer ("" for older files).
    pub fn model_dir(&self) -> &str {
        &self.header.model_dir
    }

    /// Refuses a file of another model key or of other layer shapes, or
    /// whose length disagrees with its tokens.
    pub fn check(&self, path: &Path, model_key: u64, layouts: &[KvLayout]) -> Result<()> {
        let want = format!("{model_key:016x}");
        if self.header.model_key != want {
            return Err(bad(
                path,
                format!(
                    "saved by model {} (this model is {want})",
                    self.header.model_key
                ),
            ));
        }
        if self.header.layouts != layouts {
            return Err(bad(
                path,
                "its layer shapes differ from this model's".into(),
            ));
        }
        let n = self.header.tokens.len() as u64;
        let floats: u64 = layouts.iter().map(|l| floats_per_position(*l) as u64).sum();
        if self.rows_len != n * floats * 4 {
            return Err(bad(
                path,
                format!(
                    "{} bytes of rows; {n} positions need {}",
                    self.rows_len,
                    n * floats * 4
                ),
            ));
        }
        Ok(())
    }
}

fn bad(path: &Path, reason: String) -> Error {
    Error::KvFile {
        path: path.to_path_buf(),
        reason,
    }
}

/// Floats a row chunk converts at a time: saving and loading stream the
/// rows through a buffer this size, never a copy of the whole cache (a 16k
/// prompt's KV is gigabytes, and the plan counts it once).
const CHUNK_FLOATS: usize = 1 << 16;

/// The checksum's hasher, started with `tokens`.
fn hasher(tokens: &[u32]) -> crc32fast::Hasher {
    let mut h = crc32fast::Hasher::new();
    for t in tokens {
        h.update(&t.to_le_bytes());
    }
    h
}

/// Calls `each` with the filled rows of every buffer of `kv` (`len`
/// positions), as little-endian bytes, in file order, a chunk of at most
/// [`CHUNK_FLOATS`] floats at a time.
fn for_each_row_chunk<E>(
    kv: &mut KvCache,
    mut each: impl FnMut(&[u8]) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    let len = kv.len();
    let layouts = kv.layouts().to_vec();
    let mut bytes = Vec::with_capacity(4 * CHUNK_FLOATS);
    for (layer, layout) in kv.layers.iter_mut().zip(layouts) {
        for (buf, width) in layer.buffers_mut(layout) {
            for chunk in buf[..len * width].chunks(CHUNK_FLOATS) {
                bytes.clear();
                bytes.extend(chunk.iter().flat_map(|x| x.to_le_bytes()));
                each(&bytes)?;
            }
        }
    }
    Ok(())
}

/// Saves `kv` (whose filled positions hold `tokens`) for the model keyed
/// `model_key` in `model_dir`; returns the bytes written. Two passes over
/// the rows (the checksum, which the header before them holds, then the
/// write), streamed: no copy of the cache.
pub fn save(
    path: &Path,
    (model_key, model_dir): (u64, &str),
    tokens: &[u32],
    kv: &mut KvCache,
) -> Result<u64> {
    assert_eq!(
        tokens.len(),
        kv.len(),
        "a KV file's tokens are its positions"
    );
    let mut crc = hasher(tokens);
    let _ = for_each_row_chunk(kv, |b| {
        crc.update(b);
        Ok::<(), ()>(())
    });
    let header = Header {
        model_key: format!("{model_key:016x}"),
        model_dir: model_dir.to_string(),
        layouts: kv.layouts().to_vec(),
        tokens: tokens.to_vec(),
        crc32: crc.finalize(),
    };
    let header = serde_json::to_vec(&header).expect("a KV header serializes");
    let mut out = crate::fs::Output::create(path)?;
    let mut written = 0u64;
    let mut put = |b: &[u8]| {
        written += b.len() as u64;
        out.write_all(b)
    };
    put(MAGIC)
        .and_then(|()| put(&(header.len() as u32).to_le_bytes()))
        .and_then(|()| put(&header))
        .and_then(|()| for_each_row_chunk(kv, &mut put))
        .map_err(|e| Error::file(out.tmp(), e))?;
    out.finish()?;
    Ok(written)
}

/// Reads the header of `path` (a regular file, through the bounded
/// reader); `None` when the file does not start with the KV magic: not a
/// moestream KV file, another program's, never to be touched.
pub fn read_head(path: &Path) -> Result<Option<Head>> {
    let (file, len) = crate::fs::read::open_capped(path, crate::fs::read::KV_FILE)?;
    let mut start = Vec::with_capacity(12);
    (&file)
        .take(12)
        .read_to_end(&mut start)
        .map_err(|e| Error::file(path, e))?;
    if start.len() < MAGIC.len() || &start[..8] != MAGIC {
        return Ok(None);
    }
    if start.len() < 12 {
        return Err(bad(path, format!("truncated: {len} bytes")));
    }
    let hlen = u32::from_le_bytes(start[8..12].try_into().expect("4 bytes")) as u64;
    if hlen > HEADER_MAX as u64 || 12 + hlen > len {
        return Err(bad(
            path,
            format!("header length {hlen} passes the file's end ({len} bytes)"),
        ));
    }
    let mut header = Vec::with_capacity(hlen as usize);
    (&file)
        .take(hlen)
        .read_to_end(&mut header)
        .map_err(|e| Error::file(path, e))?;
    let header: Header =
        serde_json::from_slice(&header).map_err(|e| bad(path, format!("header: {e}")))?;
    Ok(Some(Head {
        header,
        rows_at: 12 + hlen,
        rows_len: len - 12 - hlen,
    }))
}

/// Reads the rows of the file whose checked header is `head`: its tokens
/// and a cache holding exactly their positions.
pub fn load_rows(path: &Path, head: Head, layouts: &[KvLayout]) -> Result<(Vec<u32>, KvCache)> {
    let mut file = crate::fs::open(path)?;
    file.seek(SeekFrom::Start(head.rows_at))
        .map_err(|e| Error::file(path, e))?;
    let tokens = head.header.tokens;
    let n = tokens.len();
    let mut kv = KvCache::new(layouts, n);
    let mut crc = hasher(&tokens);
    let rows = Streamed::new(file, ROWS_AHEAD).map_err(|e| Error::file(path, e))?;
    let mut rows = rows.take(head.rows_len);
    let filled = fill(&mut kv, &mut rows, &mut crc).map_err(|e| Error::file(path, e))?;
    if filled != head.rows_len || crc.finalize() != head.header.crc32 {
        return Err(bad(path, "checksum mismatch (the file is corrupt)".into()));
    }
    kv.advance(n);
    Ok((tokens, kv))
}

/// Loads a KV file saved for the model keyed `model_key` whose layers have
/// `layouts`: its tokens and a cache holding exactly their positions.
pub fn load(path: &Path, model_key: u64, layouts: &[KvLayout]) -> Result<(Vec<u32>, KvCache)> {
    let head =
        read_head(path)?.ok_or_else(|| bad(path, "not a moestream KV file (bad magic)".into()))?;
    head.check(path, model_key, layouts)?;
    load_rows(path, head, layouts)
}

fn floats_per_position(layout: KvLayout) -> usize {
    (layout.attention_bytes_per_token() + layout.index_bytes_per_token()) / 4
}

/// Reads `kv`'s buffers (every position of its capacity) from `rows`, a
/// chunk of at most [`CHUNK_FLOATS`] floats at a time, feeding `crc`;
/// returns the bytes read (short if `rows` ended early: the caller's
/// length check refuses it; `Head::check` has matched the rows' length to
/// the positions, so nothing is left after them).
fn fill(
    kv: &mut KvCache,
    rows: &mut impl Read,
    crc: &mut crc32fast::Hasher,
) -> std::io::Result<u64> {
    let n = kv.capacity();
    let layouts = kv.layouts().to_vec();
    let mut bytes = Vec::with_capacity(4 * CHUNK_FLOATS);
    let mut read = 0u64;
    for (layer, layout) in kv.layers.iter_mut().zip(layouts) {
        for (buf, width) in layer.buffers_mut(layout) {
            for dst in buf[..n * width].chunks_mut(CHUNK_FLOATS) {
                bytes.clear();
                rows.by_ref()
                    .take(4 * dst.len() as u64)
                    .read_to_end(&mut bytes)?;
                read += bytes.len() as u64;
                crc.update(&bytes);
                for (d, b) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
                    *d = f32::from_le_bytes(b.try_into().expect("4 bytes"));
                }
            }
        }
    }
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layouts() -> Vec<KvLayout> {
        vec![
            KvLayout::Gqa { kv_dim: 3 },
            KvLayout::Mla {
                kv_lora: 2,
                rope: 1,
                index_dim: 2,
            },
        ]
    }

    fn filled(tokens: usize) -> KvCache {
        let mut kv = KvCache::new(&layouts(), tokens + 4);
        let layouts = layouts();
        let mut x = 0.0;
        for (layer, layout) in kv.layers.iter_mut().zip(layouts) {
            for (buf, _) in layer.buffers_mut(layout) {
                for v in buf.iter_mut() {
                    x += 1.0;
                    *v = x;
                }
            }
        }
        kv.advance(tokens);
        kv
    }

    /// Every filled row of `kv`, as the file holds them.
    fn rows_of(kv: &mut KvCache) -> Vec<u8> {
        let mut out = Vec::new();
        let _ = for_each_row_chunk(kv, |b| {
            out.extend_from_slice(b);
            Ok::<(), ()>(())
        });
        out
    }

    #[test]
    fn round_trip_keeps_tokens_and_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.kv");
        let mut kv = filled(3);
        save(&path, (7, "m"), &[5, 6, 7], &mut kv).unwrap();
        let (tokens, mut back) = load(&path, 7, &layouts()).unwrap();
        assert_eq!(tokens, [5, 6, 7]);
        assert_eq!(back.len(), 3);
        assert_eq!(rows_of(&mut back), rows_of(&mut kv));
    }

    #[test]
    fn rows_longer_than_a_chunk_round_trip_and_their_corruption_is_found() {
        // 30,000 positions: every buffer (widths 1-3) crosses CHUNK_FLOATS
        // floats or ends between chunks, so the streamed save and load
        // meet chunk edges inside and across buffers.
        let n = 30_000;
        assert!(3 * n > CHUNK_FLOATS && n < CHUNK_FLOATS);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("long.kv");
        let tokens: Vec<u32> = (0..n as u32).collect();
        let mut kv = filled(n);
        let bytes = save(&path, (7, "m"), &tokens, &mut kv).unwrap();
        assert_eq!(bytes, std::fs::metadata(&path).unwrap().len());
        let (back_tokens, mut back) = load(&path, 7, &layouts()).unwrap();
        assert_eq!(back_tokens, tokens);
        assert_eq!(rows_of(&mut back), rows_of(&mut kv));
        let mut raw = std::fs::read(&path).unwrap();
        let mid = raw.len() - 4 * CHUNK_FLOATS - 1;
        raw[mid] ^= 0x40;
        std::fs::write(&path, &raw).unwrap();
        let err = load(&path, 7, &layouts()).err().unwrap().to_string();
        assert!(err.contains("checksum"), "{err}");
    }

    #[test]
    fn refuses_other_models_shapes_and_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.kv");
        save(&path, (7, "m"), &[5, 6], &mut filled(2)).unwrap();
        let err = |r: Result<(Vec<u32>, KvCache)>| r.err().unwrap().to_string();
        assert!(err(load(&path, 8, &layouts())).contains("saved by model"));
        assert!(err(load(&path, 7, &layouts()[..1])).contains("layer shapes"));
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(err(load(&path, 7, &layouts())).contains("checksum"));
        std::fs::write(&path, &bytes[..bytes.len() - 4]).unwrap();
        assert!(err(load(&path, 7, &layouts())).contains("positions need"));
        std::fs::write(&path, b"MSKV0001\xff\xff\xff\x0f{}").unwrap();
        assert!(err(load(&path, 7, &layouts())).contains("header length"));
        std::fs::write(&path, b"hello").unwrap();
        assert!(err(load(&path, 7, &layouts())).contains("bad magic"));
    }
}
