//! Writes a GGUF file (version 3, little-endian, 32-byte alignment): the
//! header from the metadata and tensor list, then each tensor's bytes as a
//! callback streams them, so a file far larger than RAM can be written.
//! The file is written through [`crate::fs::Output`] (a temp file beside
//! the target, renamed into place when complete, removed on an error): a
//! crash never leaves half a model.

use crate::error::{Error, Result};
use crate::formats::gguf::file::{ggml_type, Array, Value, MAGIC};
use std::io::Write;
use std::path::Path;

/// Data alignment of the files written here (GGUF's default).
const ALIGNMENT: u64 = 32;

/// One tensor to write.
#[derive(Clone, Debug)]
pub struct TensorSpec {
    pub name: String,
    /// ggml order: `dims[0]` is the row length.
    pub dims: Vec<u64>,
    /// ggml type id.
    pub ty: u32,
}

impl TensorSpec {
    /// Bytes of its data.
    pub fn bytes(&self) -> u64 {
        let (_, block_elems, block_bytes) = ggml_type(self.ty).expect("a known ggml type");
        let numel: u64 = self.dims.iter().product();
        assert_eq!(
            self.dims[0] % block_elems,
            0,
            "{}: rows of whole blocks",
            self.name
        );
        numel / block_elems * block_bytes
    }
}

/// Writes `path`: `metadata`, `tensors`, and for tensor `i` exactly
/// `tensors[i].bytes()` bytes from `fill(i, sink)`.
pub fn write_gguf(
    path: &Path,
    metadata: &[(String, Value)],
    tensors: &[TensorSpec],
    mut fill: impl FnMut(usize, &mut dyn Write) -> Result<()>,
) -> Result<()> {
    let out = crate::fs::Output::create(path)?;
    let tmp = out.tmp().to_path_buf();
    let mut w = Counting {
        inner: out,
        written: 0,
    };
    header(&mut w, metadata, tensors).map_err(|e| Error::file(&tmp, e))?;
    pad(&mut w).map_err(|e| Error::file(&tmp, e))?;
    for (i, t) in tensors.iter().enumerate() {
        let start = w.written;
        fill(i, &mut w)?;
        let got = w.written - start;
        if got != t.bytes() {
            return Err(Error::Request(format!(
                "GGUF writer: tensor `{}` got {got} bytes, its type and shape need {}",
                t.name,
                t.bytes()
            )));
        }
        pad(&mut w).map_err(|e| Error::file(&tmp, e))?;
    }
    // Dropped on an error above, the output removes its temp file.
    w.inner.finish()
}

/// A writer that counts bytes (for offsets and padding).
struct Counting<W> {
    inner: W,
    written: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn pad<W: Write>(w: &mut Counting<W>) -> std::io::Result<()> {
    let n = w.written.next_multiple_of(ALIGNMENT) - w.written;
    w.write_all(&vec![0u8; n as usize])
}

fn header<W: Write>(
    w: &mut W,
    metadata: &[(String, Value)],
    tensors: &[TensorSpec],
) -> std::io::Result<()> {
    w.write_all(&MAGIC)?;
    w.write_all(&3u32.to_le_bytes())?;
    w.write_all(&(tensors.len() as u64).to_le_bytes())?;
    w.write_all(&(metadata.len() as u64).to_le_bytes())?;
    for (k, v) in metadata {
        string(w, k)?;
        w.write_all(&type_id(v).to_le_bytes())?;
        value(w, v)?;
    }
    let mut offset = 0u64;
    for t in tensors {
        string(w, &t.name)?;
        w.write_all(&(t.dims.len() as u32).to_le_bytes())?;
        for d in &t.dims {
            w.write_all(&d.to_le_bytes())?;
        }
        w.write_all(&t.ty.to_le_bytes())?;
        w.write_all(&offset.to_le_bytes())?;
        offset = (offset + t.bytes()).next_multiple_of(ALIGNMENT);
    }
    Ok(())
}

fn string<W: Write>(w: &mut W, s: &str) -> std::io::Result<()> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

fn type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::Str(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn value<W: Write>(w: &mut W, v: &Value) -> std::io::Result<()> {
    match v {
        Value::U8(x) => w.write_all(&[*x]),
        Value::I8(x) => w.write_all(&x.to_le_bytes()),
        Value::U16(x) => w.write_all(&x.to_le_bytes()),
        Value::I16(x) => w.write_all(&x.to_le_bytes()),
        Value::U32(x) => w.write_all(&x.to_le_bytes()),
        Value::I32(x) => w.write_all(&x.to_le_bytes()),
        Value::U64(x) => w.write_all(&x.to_le_bytes()),
        Value::I64(x) => w.write_all(&x.to_le_bytes()),
        Value::F32(x) => w.write_all(&x.to_le_bytes()),
        Value::F64(x) => w.write_all(&x.to_le_bytes()),
        Value::Bool(x) => w.write_all(&[*x as u8]),
        Value::Str(s) => string(w, s),
        Value::Array(items) => array(w, items),
    }
}

fn array<W: Write>(w: &mut W, items: &Array) -> std::io::Result<()> {
    w.write_all(&items.elem_type().to_le_bytes())?;
    w.write_all(&(items.len() as u64).to_le_bytes())?;
    match items {
        Array::U8(v) => w.write_all(v),
        Array::I8(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
        Array::U16(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
        Array::I16(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
        Array::U32(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
        Array::I32(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
        Array::U64(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
        Array::I64(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
        Array::F32(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
        Array::F64(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
        Array::Bool(v) => v.iter().try_for_each(|x| w.write_all(&[*x as u8])),
        Array::Str(v) => v.iter().try_for_each(|x| string(w, x)),
        Array::Array(v) => v.iter().try_for_each(|x| array(w, x)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::gguf::file::GgufFile;

    #[test]
    fn a_written_file_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.gguf");
        let metadata = vec![
            (
                "general.architecture".to_string(),
                Value::Str("qwen3moe".into()),
            ),
            ("x.list".to_string(), Value::Array(Array::I32(vec![-1, 7]))),
            ("x.f".to_string(), Value::F32(0.5)),
        ];
        let tensors = vec![
            TensorSpec {
                name: "a".into(),
                dims: vec![3, 2],
                ty: 0,
            },
            TensorSpec {
                name: "b".into(),
                dims: vec![32, 1],
                ty: 8,
            },
        ];
        write_gguf(&path, &metadata, &tensors, |i, w| {
            let n = tensors[i].bytes() as usize;
            w.write_all(&vec![i as u8 + 1; n])
                .map_err(|e| Error::file("t", e))
        })
        .unwrap();
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.version, 3);
        for (k, v) in &metadata {
            assert_eq!(f.get(k), Some(v), "{k}");
        }
        assert_eq!(f.tensors.len(), 2);
        let bytes = std::fs::read(&path).unwrap();
        for (t, fill) in f.tensors.iter().zip([1u8, 2]) {
            let data = &bytes[t.offset as usize..(t.offset + t.bytes) as usize];
            assert!(data.iter().all(|&b| b == fill), "{}", t.name);
        }
        assert_eq!(f.tensors[1].bytes, 34);
        let leftovers = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(leftovers, 1, "no temp file left behind");
    }

    #[test]
    fn a_short_fill_is_an_error_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.gguf");
        let tensors = vec![TensorSpec {
            name: "a".into(),
            dims: vec![4],
            ty: 0,
        }];
        let err = write_gguf(&path, &[], &tensors, |_, w| {
            w.write_all(&[0u8; 3]).map_err(|e| Error::file("t", e))
        })
        .unwrap_err();
        assert!(err.to_string().contains("tensor `a` got 3 bytes"), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
