//! The GGUF container (llama.cpp's format, versions 2 and 3): a header of
//! typed metadata and tensor infos, then aligned tensor data. Only the
//! header is read here; tensor bytes are read on demand by the weight index.
//!
//! Invariants checked at open, each failure naming the file and the key or
//! tensor: the magic and version; every length fits in what is left of the
//! file (so a lying count cannot allocate gigabytes); at most four
//! dimensions, none zero; every tensor's type is a known ggml type, its
//! row length a whole number of blocks, its offset aligned, its bytes inside
//! the file; no two tensors overlap or share a name.
//!
//! Metadata memory is a bounded multiple of the file: arrays are stored as
//! the file stores them, one typed vector each ([`Array`]: a u8 array costs
//! a byte per element, not a 40-byte [`Value`] each), and every count is
//! checked against the bytes its elements need in what is left of the
//! file, so the header's in-memory form is at most a few times its size
//! (strings and keys: a `String` of 24 bytes and its allocation per 8-byte
//! length prefix, the worst case).

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

/// The four magic bytes of every GGUF file.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Data alignment when `general.alignment` is absent.
const ALIGNMENT_DEFAULT: u64 = 32;
/// Most tensors one file may declare.
const TENSORS_MAX: u64 = 1 << 24;
/// Most metadata entries one file may declare.
const KEYS_MAX: u64 = 1 << 20;
/// Most dimensions of a tensor (ggml's GGML_MAX_DIMS).
const DIMS_MAX: u32 = 4;
/// Longest key or tensor name.
const NAME_BYTES_MAX: u64 = 1 << 16;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(Array),
}

/// A metadata array: one typed vector, as the file stores it (GGUF arrays
/// hold one element type; arrays of arrays nest once).
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    Str(Vec<String>),
    Array(Vec<Array>),
}

/// Applies `$e` to the vector inside an [`Array`], whatever its type.
macro_rules! each_array {
    ($a:expr, $v:ident => $e:expr) => {
        match $a {
            Array::U8($v) => $e,
            Array::I8($v) => $e,
            Array::U16($v) => $e,
            Array::I16($v) => $e,
            Array::U32($v) => $e,
            Array::I32($v) => $e,
            Array::U64($v) => $e,
            Array::I64($v) => $e,
            Array::F32($v) => $e,
            Array::F64($v) => $e,
            Array::Bool($v) => $e,
            Array::Str($v) => $e,
            Array::Array($v) => $e,
        }
    };
}

impl Array {
    /// Elements in the array.
    pub fn len(&self) -> usize {
        each_array!(self, v => v.len())
    }

    /// Whether the array has no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as a [`Value`] (a string is cloned).
    pub fn get(&self, i: usize) -> Option<Value> {
        Some(match self {
            Array::U8(v) => Value::U8(*v.get(i)?),
            Array::I8(v) => Value::I8(*v.get(i)?),
            Array::U16(v) => Value::U16(*v.get(i)?),
            Array::I16(v) => Value::I16(*v.get(i)?),
            Array::U32(v) => Value::U32(*v.get(i)?),
            Array::I32(v) => Value::I32(*v.get(i)?),
            Array::U64(v) => Value::U64(*v.get(i)?),
            Array::I64(v) => Value::I64(*v.get(i)?),
            Array::F32(v) => Value::F32(*v.get(i)?),
            Array::F64(v) => Value::F64(*v.get(i)?),
            Array::Bool(v) => Value::Bool(*v.get(i)?),
            Array::Str(v) => Value::Str(v.get(i)?.clone()),
            Array::Array(v) => Value::Array(v.get(i)?.clone()),
        })
    }

    /// The strings, if this is an array of strings.
    pub fn strings(&self) -> Option<&[String]> {
        match self {
            Array::Str(v) => Some(v),
            _ => None,
        }
    }

    /// The GGUF type id of the elements.
    pub fn elem_type(&self) -> u32 {
        match self {
            Array::U8(_) => 0,
            Array::I8(_) => 1,
            Array::U16(_) => 2,
            Array::I16(_) => 3,
            Array::U32(_) => 4,
            Array::I32(_) => 5,
            Array::F32(_) => 6,
            Array::Bool(_) => 7,
            Array::Str(_) => 8,
            Array::Array(_) => 9,
            Array::U64(_) => 10,
            Array::I64(_) => 11,
            Array::F64(_) => 12,
        }
    }
}

impl Value {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, if it is an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// The value as a float (integers widen).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// The string, if the value is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The boolean, if the value is one.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }
}

/// Element types ggml defines: (name, elements per block, bytes per block).
/// Sizes are needed to bound every tensor, supported or not.
pub fn ggml_type(id: u32) -> Option<(&'static str, u64, u64)> {
    Some(match id {
        0 => ("F32", 1, 4),
        1 => ("F16", 1, 2),
        2 => ("Q4_0", 32, 18),
        3 => ("Q4_1", 32, 20),
        6 => ("Q5_0", 32, 22),
        7 => ("Q5_1", 32, 24),
        8 => ("Q8_0", 32, 34),
        9 => ("Q8_1", 32, 36),
        10 => ("Q2_K", 256, 84),
        11 => ("Q3_K", 256, 110),
        12 => ("Q4_K", 256, 144),
        13 => ("Q5_K", 256, 176),
        14 => ("Q6_K", 256, 210),
        15 => ("Q8_K", 256, 292),
        16 => ("IQ2_XXS", 256, 66),
        17 => ("IQ2_XS", 256, 74),
        18 => ("IQ3_XXS", 256, 98),
        19 => ("IQ1_S", 256, 50),
        20 => ("IQ4_NL", 32, 18),
        21 => ("IQ3_S", 256, 110),
        22 => ("IQ2_S", 256, 82),
        23 => ("IQ4_XS", 256, 136),
        24 => ("I8", 1, 1),
        25 => ("I16", 1, 2),
        26 => ("I32", 1, 4),
        27 => ("I64", 1, 8),
        28 => ("F64", 1, 8),
        29 => ("IQ1_M", 256, 56),
        30 => ("BF16", 1, 2),
        34 => ("TQ1_0", 256, 54),
        35 => ("TQ2_0", 256, 66),
        39 => ("MXFP4", 32, 17),
        _ => return None,
    })
}

/// One tensor's header entry.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the innermost (contiguous) dimension.
    pub dims: Vec<u64>,
    /// ggml type id (see [`ggml_type`]).
    pub ty: u32,
    /// Absolute byte offset in the file.
    pub offset: u64,
    /// Bytes of data.
    pub bytes: u64,
}

impl TensorInfo {
    /// The shape in row-major order (outermost first), as safetensors and
    /// PyTorch spell it.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    /// The type's name.
    pub fn type_name(&self) -> &'static str {
        ggml_type(self.ty).map_or("?", |t| t.0)
    }
}

/// A parsed GGUF header.
#[derive(Debug)]
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: HashMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_offset: u64,
    pub file_len: u64,
}

impl GgufFile {
    /// Reads and checks the header of `path`.
    pub fn open(path: &Path) -> Result<GgufFile> {
        // A FIFO named `.gguf` is refused on the open, never waited on.
        let file = crate::fs::open(path)?;
        let file_len = file
            .metadata()
            .map_err(|e| Error::File {
                path: path.to_path_buf(),
                source: e,
            })?
            .len();
        let mut r = HeaderReader {
            inner: BufReader::with_capacity(1 << 20, file),
            pos: 0,
            file_len,
            path,
        };
        parse(&mut r)
    }

    /// Parses a header held in memory, the start of a file of `file_len`
    /// bytes (`path` only names errors): the entry point of the
    /// `gguf_metadata` fuzz target.
    pub fn from_bytes(path: &Path, header: &[u8], file_len: u64) -> Result<GgufFile> {
        let mut r = HeaderReader {
            inner: header,
            pos: 0,
            file_len,
            path,
        };
        parse(&mut r)
    }

    /// An error about this file.
    pub fn error(&self, reason: impl Into<String>) -> Error {
        Error::Shard {
            path: self.path.clone(),
            reason: reason.into(),
        }
    }

    /// Metadata value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }
}

/// A bounded little-endian reader over the header.
struct HeaderReader<'a, R> {
    inner: R,
    pos: u64,
    file_len: u64,
    path: &'a Path,
}

impl<R: Read> HeaderReader<'_, R> {
    fn error(&self, what: &str, reason: impl std::fmt::Display) -> Error {
        Error::Shard {
            path: self.path.to_path_buf(),
            reason: format!("GGUF header, {what} (at byte {}): {reason}", self.pos),
        }
    }

    fn bytes<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        self.inner
            .read_exact(&mut b)
            .map_err(|_| self.error(what, "the file ends inside the header (truncated)"))?;
        self.pos += N as u64;
        Ok(b)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        self.bytes::<4>(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        self.bytes::<8>(what).map(u64::from_le_bytes)
    }

    /// A count of items of at least `item_bytes` each, bounded by `max` and
    /// by what is left of the file.
    fn count(&mut self, what: &str, item_bytes: u64, max: u64) -> Result<u64> {
        let n = self.u64(what)?;
        let left = self.file_len.saturating_sub(self.pos);
        if n > max || n.saturating_mul(item_bytes) > left {
            return Err(self.error(
                what,
                format!(
                    "count {n} cannot fit (limit {max}, {left} bytes left in the file: truncated, or the header lies)"
                ),
            ));
        }
        Ok(n)
    }

    fn string(&mut self, what: &str, max: u64) -> Result<String> {
        let len = self.count(what, 1, max)?;
        let mut buf = vec![0u8; len as usize];
        self.inner
            .read_exact(&mut buf)
            .map_err(|_| self.error(what, "the file ends inside a string (truncated)"))?;
        self.pos += len;
        String::from_utf8(buf).map_err(|_| self.error(what, "a string is not UTF-8"))
    }
}

fn parse<R: Read>(r: &mut HeaderReader<'_, R>) -> Result<GgufFile> {
    if r.bytes::<4>("magic")? != MAGIC {
        return Err(r.error("magic", "not a GGUF file (no `GGUF` magic)"));
    }
    let version = r.u32("version")?;
    if !(2..=3).contains(&version) {
        let why = if version.swap_bytes() <= 3 {
            "a big-endian GGUF file; only little-endian files are read".to_string()
        } else {
            format!("version {version}; versions 2 and 3 are read")
        };
        return Err(r.error("version", why));
    }
    let n_tensors = r.count("tensor count", 8 + 4 + 8 + 4, TENSORS_MAX)?;
    let n_keys = r.count("metadata count", 8 + 4, KEYS_MAX)?;
    let mut metadata = HashMap::new();
    for i in 0..n_keys {
        let key = r.string(&format!("metadata key {i}"), NAME_BYTES_MAX)?;
        let ty = r.u32(&format!("type of `{key}`"))?;
        let value = read_value(r, &key, ty)?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(r.error(&format!("metadata `{key}`"), "the key appears twice"));
        }
    }
    let alignment = match metadata.get("general.alignment") {
        None => ALIGNMENT_DEFAULT,
        Some(v) => match v.as_u64() {
            Some(a) if a.is_power_of_two() && a <= 1 << 20 => a,
            _ => return Err(r.error("general.alignment", format!("{v:?} is not a power of two"))),
        },
    };
    let mut tensors = Vec::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        tensors.push(read_tensor_info(r, i)?);
    }
    let data_offset = r.pos.div_ceil(alignment) * alignment;
    let mut file = GgufFile {
        path: r.path.to_path_buf(),
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
        file_len: r.file_len,
    };
    place_tensors(&mut file)?;
    Ok(file)
}

/// Reads one metadata value of type `ty` (arrays nest at most twice).
fn read_value<R: Read>(r: &mut HeaderReader<'_, R>, key: &str, ty: u32) -> Result<Value> {
    let what = format!("metadata `{key}`");
    Ok(match ty {
        0 => Value::U8(r.bytes::<1>(&what)?[0]),
        1 => Value::I8(r.bytes::<1>(&what)?[0] as i8),
        2 => Value::U16(u16::from_le_bytes(r.bytes(&what)?)),
        3 => Value::I16(i16::from_le_bytes(r.bytes(&what)?)),
        4 => Value::U32(r.u32(&what)?),
        5 => Value::I32(i32::from_le_bytes(r.bytes(&what)?)),
        6 => Value::F32(f32::from_le_bytes(r.bytes(&what)?)),
        7 => match r.bytes::<1>(&what)?[0] {
            0 => Value::Bool(false),
            1 => Value::Bool(true),
            b => return Err(r.error(&what, format!("bool byte {b} is neither 0 nor 1"))),
        },
        8 => Value::Str(r.string(&what, u64::MAX)?),
        9 => Value::Array(read_array(r, key, 0)?),
        10 => Value::U64(r.u64(&what)?),
        11 => Value::I64(i64::from_le_bytes(r.bytes(&what)?)),
        12 => Value::F64(f64::from_le_bytes(r.bytes(&what)?)),
        _ => return Err(r.error(&what, format!("unknown value type {ty}"))),
    })
}

/// The smallest bytes one element of type `ty` takes in the file.
fn elem_bytes(ty: u32) -> u64 {
    match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        _ => 12,
    }
}

/// `n` elements, each read by `one`. `n` was checked against the bytes
/// left in the file ([`HeaderReader::count`] with the element's size);
/// the vector grows as elements arrive (a header may claim most of a large
/// file), so it holds at most 3 bytes per byte read (a 24-byte `String`
/// per 8-byte length), twice that while it doubles.
fn read_n<R: Read, T>(
    r: &mut HeaderReader<'_, R>,
    n: u64,
    mut one: impl FnMut(&mut HeaderReader<'_, R>) -> Result<T>,
) -> Result<Vec<T>> {
    let mut items = Vec::with_capacity(n.min(1 << 16) as usize);
    for _ in 0..n {
        items.push(one(r)?);
    }
    Ok(items)
}

/// Reads one array (its element type, count and elements) as a typed
/// vector; arrays of arrays nest once, as llama.cpp writes them.
fn read_array<R: Read>(r: &mut HeaderReader<'_, R>, key: &str, depth: u32) -> Result<Array> {
    let what = format!("metadata `{key}`");
    let elem = r.u32(&what)?;
    if elem == 9 && depth >= 1 {
        return Err(r.error(&what, "arrays nest more than twice"));
    }
    let n = r.count(&what, elem_bytes(elem), u64::MAX)?;
    let w = what.as_str();
    Ok(match elem {
        0 => Array::U8(read_n(r, n, |r| Ok(r.bytes::<1>(w)?[0]))?),
        1 => Array::I8(read_n(r, n, |r| Ok(r.bytes::<1>(w)?[0] as i8))?),
        2 => Array::U16(read_n(r, n, |r| Ok(u16::from_le_bytes(r.bytes(w)?)))?),
        3 => Array::I16(read_n(r, n, |r| Ok(i16::from_le_bytes(r.bytes(w)?)))?),
        4 => Array::U32(read_n(r, n, |r| r.u32(w))?),
        5 => Array::I32(read_n(r, n, |r| Ok(i32::from_le_bytes(r.bytes(w)?)))?),
        6 => Array::F32(read_n(r, n, |r| Ok(f32::from_le_bytes(r.bytes(w)?)))?),
        7 => Array::Bool(read_n(r, n, |r| match r.bytes::<1>(w)?[0] {
            b @ (0 | 1) => Ok(b == 1),
            b => Err(r.error(w, format!("bool byte {b} is neither 0 nor 1"))),
        })?),
        8 => Array::Str(read_n(r, n, |r| r.string(w, u64::MAX))?),
        9 => Array::Array(read_n(r, n, |r| read_array(r, key, depth + 1))?),
        10 => Array::U64(read_n(r, n, |r| r.u64(w))?),
        11 => Array::I64(read_n(r, n, |r| Ok(i64::from_le_bytes(r.bytes(w)?)))?),
        12 => Array::F64(read_n(r, n, |r| Ok(f64::from_le_bytes(r.bytes(w)?)))?),
        _ => return Err(r.error(&what, format!("unknown array element type {elem}"))),
    })
}

fn read_tensor_info<R: Read>(r: &mut HeaderReader<'_, R>, i: u64) -> Result<TensorInfo> {
    let name = r.string(&format!("tensor {i} name"), NAME_BYTES_MAX)?;
    let what = format!("tensor `{name}`");
    let n_dims = r.u32(&what)?;
    if n_dims == 0 || n_dims > DIMS_MAX {
        return Err(r.error(
            &what,
            format!("{n_dims} dimensions (1 to {DIMS_MAX} allowed)"),
        ));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(r.u64(&what)?);
    }
    let ty = r.u32(&what)?;
    let offset = r.u64(&what)?;
    let Some((type_name, block_elems, block_bytes)) = ggml_type(ty) else {
        return Err(r.error(&what, format!("unknown ggml type id {ty}")));
    };
    let numel = dims
        .iter()
        .try_fold(1u64, |acc, &d| {
            (d > 0).then(|| acc.checked_mul(d)).flatten()
        })
        .ok_or_else(|| r.error(&what, format!("dimensions {dims:?} are zero or overflow")))?;
    if dims[0] % block_elems != 0 {
        return Err(r.error(
            &what,
            format!(
                "row length {} is not a whole number of {type_name} blocks ({block_elems})",
                dims[0]
            ),
        ));
    }
    Ok(TensorInfo {
        name,
        dims,
        ty,
        offset,
        bytes: numel / block_elems * block_bytes,
    })
}

/// Makes tensor offsets absolute and checks alignment, bounds and overlap.
fn place_tensors(file: &mut GgufFile) -> Result<()> {
    let (data, align, len) = (file.data_offset, file.alignment, file.file_len);
    let mut seen = std::collections::HashSet::new();
    let mut errors = None;
    for t in &mut file.tensors {
        let end = data
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.bytes));
        let reason = if !seen.insert(t.name.clone()) {
            Some("the name appears twice".to_string())
        } else if t.offset % align != 0 {
            Some(format!("offset {} is not aligned to {align}", t.offset))
        } else if end.is_none_or(|e| e > len) {
            Some(format!(
                "its {} bytes at data offset {} run past the end of the file ({len} bytes; truncated?)",
                t.bytes, t.offset
            ))
        } else {
            None
        };
        if let Some(reason) = reason {
            errors.get_or_insert(format!("tensor `{}`: {reason}", t.name));
            break;
        }
        t.offset += data;
    }
    if let Some(e) = errors {
        return Err(file.error(e));
    }
    let mut order: Vec<&TensorInfo> = file.tensors.iter().collect();
    order.sort_by_key(|t| t.offset);
    for w in order.windows(2) {
        if w[0].offset + w[0].bytes > w[1].offset {
            return Err(file.error(format!(
                "tensors `{}` and `{}` overlap (their offsets lie)",
                w[0].name, w[1].name
            )));
        }
    }
    Ok(())
}
