//! The shard index: every tensor of every `*.safetensors` shard in a model
//! directory, indexed once by name (GLM-5 has ~120k tensors in 144 shards).
//!
//! Invariants checked at load: each header parses, its offsets are contiguous
//! (the safetensors crate validates that), every tensor lies inside its file,
//! and no tensor name appears in two shards. Only headers are read here;
//! tensor bytes are read on demand through `moestream-io` readers.

use super::dtype::{self, DType};
use crate::error::{Error, Result};
use crate::tensor::Mat;
use moestream_io::{RangeReader, ReadMode};
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Largest safetensors header accepted (the format's own limit is 100 MB).
const HEADER_BYTES_MAX: u64 = 100 << 20;

/// Where one tensor lives.
#[derive(Clone, Debug)]
pub struct TensorEntry {
    /// Index into [`WeightIndex::shards`].
    pub shard: usize,
    /// The stored element type as the header spells it; checked on use, so an
    /// unused tensor of an exotic type does not stop a model from loading.
    pub stored: safetensors::Dtype,
    pub shape: Vec<usize>,
    /// Absolute byte offset of the first element in the shard file.
    pub offset: u64,
    /// Length in bytes.
    pub len: usize,
}

impl TensorEntry {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// One opened shard.
pub struct Shard {
    pub path: PathBuf,
    pub reader: Box<dyn RangeReader>,
}

/// All tensors of a checkpoint directory, by name.
pub struct WeightIndex {
    pub dir: PathBuf,
    pub shards: Vec<Shard>,
    tensors: HashMap<String, TensorEntry>,
}

impl WeightIndex {
    /// Indexes every `*.safetensors` file in `dir`, opening readers in `mode`.
    pub fn open(dir: &Path, mode: ReadMode) -> Result<WeightIndex> {
        let paths = shard_paths(dir)?;
        let mut shards = Vec::with_capacity(paths.len());
        let mut tensors = HashMap::new();
        for (i, path) in paths.into_iter().enumerate() {
            for (name, mut entry) in read_header(&path)? {
                entry.shard = i;
                if tensors.insert(name.clone(), entry).is_some() {
                    return Err(Error::Shard {
                        path: path.clone(),
                        reason: format!("tensor `{name}` also appears in an earlier shard"),
                    });
                }
            }
            let reader = moestream_io::open(&path, mode)?;
            shards.push(Shard { path, reader });
        }
        Ok(WeightIndex {
            dir: dir.to_path_buf(),
            shards,
            tensors,
        })
    }

    /// The entry for `name`, or a `MissingTensor` error.
    pub fn entry(&self, name: &str) -> Result<&TensorEntry> {
        self.tensors.get(name).ok_or_else(|| Error::MissingTensor {
            name: name.to_string(),
            dir: self.dir.clone(),
        })
    }

    /// Whether the checkpoint holds `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Number of indexed tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether no tensor is indexed.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Iterates over (name, entry).
    pub fn iter(&self) -> impl Iterator<Item = (&String, &TensorEntry)> {
        self.tensors.iter()
    }

    /// Path of the shard holding `entry`.
    pub fn shard_path(&self, entry: &TensorEntry) -> &Path {
        &self.shards[entry.shard].path
    }

    /// The f32-widenable dtype of `e`, or a `Dtype` error naming the tensor.
    pub fn dtype(&self, name: &str, e: &TensorEntry) -> Result<DType> {
        DType::from_safetensors(e.stored).ok_or_else(|| Error::Dtype {
            path: self.shard_path(e).to_path_buf(),
            name: name.to_string(),
            dtype: format!("{:?}", e.stored),
        })
    }

    /// Checks that `name` exists with exactly `shape` and a readable dtype.
    pub fn expect_shape(&self, name: &str, shape: &[usize]) -> Result<&TensorEntry> {
        let e = self.entry(name)?;
        self.dtype(name, e)?;
        if e.shape != shape {
            return Err(Error::Shape {
                path: self.shard_path(e).to_path_buf(),
                name: name.to_string(),
                expected: shape.to_vec(),
                got: e.shape.clone(),
            });
        }
        Ok(e)
    }

    /// Reads matrix `name` of shape `(rows, cols)` in its kept element type
    /// (see [`Mat::from_bytes`]).
    pub fn read_mat(&self, name: &str, rows: usize, cols: usize) -> Result<Mat> {
        let e = self.expect_shape(name, &[rows, cols])?;
        let dt = self.dtype(name, e)?;
        let slab = self.shards[e.shard].reader.read(e.offset, e.len)?;
        Ok(Mat::from_bytes(dt, slab.bytes(), rows, cols))
    }

    /// Reads tensor `name` of `shape` widened to f32.
    pub fn read_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let e = self.expect_shape(name, shape)?;
        let dt = self.dtype(name, e)?;
        let mut out = vec![0f32; e.numel()];
        let slab = self.shards[e.shard].reader.read(e.offset, e.len)?;
        dtype::to_f32(dt, slab.bytes(), &mut out);
        Ok(out)
    }
}

/// The sorted `*.safetensors` files of `dir`; an error if there are none.
fn shard_paths(dir: &Path) -> Result<Vec<PathBuf>> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::file(dir, e))?;
    let mut paths = Vec::new();
    for ent in rd {
        let p = ent.map_err(|e| Error::file(dir, e))?.path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            paths.push(p);
        }
    }
    paths.sort();
    if paths.is_empty() {
        return Err(Error::Shard {
            path: dir.to_path_buf(),
            reason: "no *.safetensors files in the model directory".into(),
        });
    }
    check_index_json(dir, &paths)?;
    Ok(paths)
}

/// If `model.safetensors.index.json` exists, every shard it names must exist
/// (a missing shard is reported by name rather than as a missing tensor).
fn check_index_json(dir: &Path, paths: &[PathBuf]) -> Result<()> {
    let ipath = dir.join("model.safetensors.index.json");
    let Ok(text) = std::fs::read_to_string(&ipath) else {
        return Ok(());
    };
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::config(&ipath, "(file)", format!("not valid JSON: {e}")))?;
    let Some(map) = v.get("weight_map").and_then(|m| m.as_object()) else {
        return Err(Error::config(&ipath, "weight_map", "missing"));
    };
    for (tensor, file) in map {
        let file = file.as_str().unwrap_or_default();
        if !paths
            .iter()
            .any(|p| p.file_name().is_some_and(|n| n == file))
        {
            return Err(Error::Shard {
                path: dir.join(file),
                reason: format!(
                    "shard missing (listed in model.safetensors.index.json for `{tensor}`)"
                ),
            });
        }
    }
    Ok(())
}

/// Parses one shard's header into entries with absolute offsets (shard = 0).
fn read_header(path: &Path) -> Result<Vec<(String, TensorEntry)>> {
    let shard_err = |reason: String| Error::Shard {
        path: path.to_path_buf(),
        reason,
    };
    let mut file = std::fs::File::open(path).map_err(|e| Error::file(path, e))?;
    let file_len = file.metadata().map_err(|e| Error::file(path, e))?.len();
    let mut n8 = [0u8; 8];
    file.read_exact(&mut n8).map_err(|_| {
        shard_err(format!(
            "truncated: {file_len} bytes, too short for a safetensors header"
        ))
    })?;
    let n = u64::from_le_bytes(n8);
    if n > HEADER_BYTES_MAX || 8 + n > file_len {
        return Err(shard_err(format!(
            "header length {n} does not fit in the file ({file_len} bytes): truncated or not safetensors"
        )));
    }
    let mut header = vec![0u8; n as usize];
    file.read_exact(&mut header)
        .map_err(|e| Error::file(path, e))?;
    let meta: safetensors::tensor::Metadata = serde_json::from_slice(&header)
        .map_err(|e| shard_err(format!("bad safetensors header: {e}")))?;
    let data_start = 8 + n;
    let mut out = Vec::new();
    for (name, info) in meta.tensors() {
        let (begin, end) = info.data_offsets;
        let abs_end = data_start + end as u64;
        if abs_end > file_len {
            return Err(shard_err(format!(
                "tensor `{name}` ends at byte {abs_end} but the file has {file_len} bytes (truncated, or the header lies)"
            )));
        }
        out.push((
            name,
            TensorEntry {
                shard: 0,
                stored: info.dtype,
                shape: info.shape.clone(),
                offset: data_start + begin as u64,
                len: end - begin,
            },
        ));
    }
    Ok(out)
}
