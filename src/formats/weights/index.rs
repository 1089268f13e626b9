//! The shard index: every tensor of every `*.safetensors` shard in a model
//! directory, indexed once by name (GLM-5 has ~120k tensors in 144 shards).
//!
//! Invariants checked at load: each header parses, its offsets are contiguous
//! (the safetensors crate validates that), every tensor lies inside its file,
//! and no tensor name appears in two shards. Only headers are read here;
//! tensor bytes are read on demand through `moestream-io` readers.

mod gguf;

use super::dtype::{self, DType};
use crate::error::{Error, Result};
use crate::formats::quant::grouped::{GFormat, GMatrix};
use crate::formats::quant::policy::{Policy, Width};
use crate::formats::quant::{fp8, QBits, QMatrix, Words};
use crate::formats::tensor::{Mat, MatData};
use crate::kernels::ggml::BlockType;
use moestream_io::{RangeReader, ReadMode, Slab};
use std::collections::HashMap;
use std::io::Read;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
    /// Set for a packed integer tensor of the moestream container.
    pub quant: Option<QuantMeta>,
    /// Set for a GGUF tensor of a block type (not F32/F16/BF16): its ggml
    /// type id; `shape` is then the logical `[rows, cols]`.
    pub ggml: Option<u32>,
}

/// What the container's header metadata says of a packed tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantMeta {
    pub packing: Packing,
    /// Logical columns (the stored shape is `(rows, row_bytes())`).
    pub cols: usize,
}

/// How a packed tensor's rows are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Packing {
    /// One F32 scale per row.
    Row(QBits),
    /// F16 scales (and mins) per group of columns.
    Grouped(GFormat),
}

impl QuantMeta {
    /// Bytes of one packed row.
    pub fn row_bytes(&self) -> usize {
        match self.packing {
            Packing::Row(q) => q.row_bytes(self.cols),
            Packing::Grouped(f) => f.row_bytes(self.cols),
        }
    }

    /// The format's name (`int4`, `q4g64`).
    pub fn name(&self) -> String {
        match self.packing {
            Packing::Row(q) => format!("int{}", q.bits()),
            Packing::Grouped(f) => f.name(),
        }
    }

    /// The companion's dtype and shape for `rows` rows.
    fn companion(&self, rows: usize) -> (safetensors::Dtype, Vec<usize>) {
        match self.packing {
            Packing::Row(_) => (safetensors::Dtype::F32, vec![rows]),
            Packing::Grouped(f) => (
                safetensors::Dtype::F16,
                vec![rows, f.params_per_row(self.cols)],
            ),
        }
    }

    /// Bytes of a `rows`-row tensor and its companion.
    pub fn bytes(&self, rows: usize) -> u64 {
        let params = match self.packing {
            Packing::Row(_) => 4,
            Packing::Grouped(f) => 2 * f.params_per_row(self.cols),
        };
        (rows * (self.row_bytes() + params)) as u64
    }

    /// The matrix of `rows` rows from its packed bytes and companion.
    fn mat(&self, rows: usize, data: Words<u8>, comp: CompanionWords) -> Result<Mat, String> {
        let cols = self.cols;
        Ok(match (self.packing, comp) {
            (Packing::Row(bits), CompanionWords::F32(scales)) => {
                let q = QMatrix {
                    bits,
                    rows,
                    cols,
                    data,
                    scales,
                };
                q.check()?;
                Mat::quant(q)
            }
            (Packing::Grouped(format), CompanionWords::F16(params)) => {
                let g = GMatrix {
                    format,
                    rows,
                    cols,
                    data,
                    params,
                };
                g.check()?;
                Mat::grouped(g)
            }
            _ => unreachable!("the companion's type follows the packing"),
        })
    }
}

/// A packed tensor's companion viewed in its element type.
enum CompanionWords {
    F32(Words<f32>),
    F16(Words<u16>),
}

impl CompanionWords {
    /// The companion of `meta` from its bytes (copied).
    fn copied(meta: &QuantMeta, bytes: &[u8]) -> CompanionWords {
        match meta.packing {
            Packing::Row(_) => CompanionWords::F32(f32s(bytes).into()),
            Packing::Grouped(_) => CompanionWords::F16(
                bytes
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .collect::<Vec<_>>()
                    .into(),
            ),
        }
    }

    /// The companion of `meta` as a window of `slab`, when aligned.
    fn shared(meta: &QuantMeta, slab: &Arc<Slab>, w: Range<usize>) -> Option<CompanionWords> {
        match meta.packing {
            Packing::Row(_) => Words::shared(slab, w).map(CompanionWords::F32),
            Packing::Grouped(_) => Words::shared(slab, w).map(CompanionWords::F16),
        }
    }
}

/// Header-metadata key prefix of a packed tensor: `moestream.quant.<name>`
/// maps to `{"bits": B, "cols": C}`, and for a grouped format also
/// `"group": G, "min": true|false`.
pub const QUANT_META_PREFIX: &str = "moestream.quant.";

/// Header-metadata key prefix of a tensor of llama.cpp blocks:
/// `moestream.blocks.<name>` maps to `{"type": "Q4_K", "cols": C}` (the
/// stored tensor is `U8 [rows, row_bytes(cols)]`, ggml's blocks as they are).
pub const BLOCKS_META_PREFIX: &str = "moestream.blocks.";

/// Name of the per-row scales of packed tensor `name`.
pub fn scales_name(name: &str) -> String {
    format!("{name}.scales")
}

/// Name of the FP8 block-scale grid of `name` (`….weight_scale_inv`).
pub fn scale_inv_name(name: &str) -> String {
    format!("{name}_scale_inv")
}

/// How a tensor is stored, with its companion (scales) where it has one.
#[derive(Clone, Debug)]
pub enum Stored {
    /// F32, BF16 or F16 elements.
    Float(DType),
    /// Packed integers with an F32 `.scales` companion (one per row).
    Quant {
        meta: QuantMeta,
        scales: TensorEntry,
    },
    /// FP8 e4m3 with an F32 `weight_scale_inv` grid of 128×128 blocks.
    Fp8 { scale_inv: TensorEntry },
    /// llama.cpp blocks (a GGUF tensor), kept and multiplied as they are.
    Ggml(BlockType),
}

/// A resolved tensor: its entry, storage and logical shape.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub name: String,
    pub entry: TensorEntry,
    pub stored: Stored,
    pub shape: Vec<usize>,
}

impl Resolved {
    /// The companion tensor (scales), if any.
    pub fn companion(&self) -> Option<&TensorEntry> {
        match &self.stored {
            Stored::Float(_) | Stored::Ggml(_) => None,
            Stored::Quant { scales, .. } => Some(scales),
            Stored::Fp8 { scale_inv } => Some(scale_inv),
        }
    }
}

/// The runtime quantizer: the bit policy applied to float tensors as they
/// load (`--quantize-at-load`), exactly as the converter would store them.
#[derive(Clone, Debug)]
pub struct AtLoad {
    pub policy: Policy,
    /// Decoder layers of the model (later indices are MTP layers).
    pub layers: usize,
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
    pub reader: Arc<dyn RangeReader>,
}

/// All tensors of a checkpoint directory, by name.
pub struct WeightIndex {
    pub dir: PathBuf,
    pub shards: Vec<Shard>,
    tensors: HashMap<String, TensorEntry>,
    at_load: Option<AtLoad>,
    /// Bytes handed out by `read_mat`/`read_f32` (the resident weights).
    handed_out: std::sync::atomic::AtomicU64,
}

impl WeightIndex {
    /// Indexes every `*.safetensors` file in `dir`, opening readers in `mode`.
    pub fn open(dir: &Path, mode: ReadMode) -> Result<WeightIndex> {
        Self::open_with(dir, mode, false).map(|(index, _)| index)
    }

    /// Indexes the headers of every shard of `dir` without requiring their
    /// data (a partial download: each shard need only hold its header), and
    /// says how much of each shard's data is there. Nothing but headers is
    /// read; the index serves shapes and byte counts ([`resolve`],
    /// [`kept_bytes`]), and reading a tensor past a shard's end fails.
    ///
    /// [`resolve`]: WeightIndex::resolve
    /// [`kept_bytes`]: WeightIndex::kept_bytes
    pub fn open_headers(dir: &Path) -> Result<(WeightIndex, Vec<ShardExtent>)> {
        Self::open_with(dir, ReadMode::Buffered, true)
    }

    fn open_with(
        dir: &Path,
        mode: ReadMode,
        partial_ok: bool,
    ) -> Result<(WeightIndex, Vec<ShardExtent>)> {
        if crate::formats::gguf::is_gguf(dir) {
            return Self::open_gguf(dir, mode);
        }
        super::container::check_finished(dir)?;
        let paths = shard_paths(dir)?;
        let mut shards = Vec::with_capacity(paths.len());
        let mut extents = Vec::with_capacity(paths.len());
        let mut tensors = HashMap::new();
        for (i, path) in paths.into_iter().enumerate() {
            let (entries, extent) = read_header_with(&path, partial_ok)?;
            for (name, mut entry) in entries {
                entry.shard = i;
                if tensors.insert(name.clone(), entry).is_some() {
                    return Err(Error::Shard {
                        path: path.clone(),
                        reason: format!("tensor `{name}` also appears in an earlier shard"),
                    });
                }
            }
            let reader: Arc<dyn RangeReader> = moestream_io::open(&path, mode)?.into();
            shards.push(Shard { path, reader });
            extents.push(extent);
        }
        let index = WeightIndex {
            dir: dir.to_path_buf(),
            shards,
            tensors,
            at_load: None,
            handed_out: Default::default(),
        };
        Ok((index, extents))
    }

    /// Quantizes float tensors by `at_load` as they are read.
    pub fn set_at_load(&mut self, at_load: Option<AtLoad>) {
        self.at_load = at_load;
    }

    /// Whether any tensor is a packed or block tensor of the container.
    pub fn is_container(&self) -> bool {
        !crate::formats::gguf::is_gguf(&self.dir)
            && self
                .tensors
                .values()
                .any(|e| e.quant.is_some() || e.ggml.is_some())
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

    fn shard_error(&self, e: &TensorEntry, name: &str, reason: String) -> Error {
        Error::Shard {
            path: self.shard_path(e).to_path_buf(),
            reason: format!("tensor `{name}`: {reason}"),
        }
    }

    /// Resolves `name`: how it is stored, its companion and logical shape,
    /// with every stored shape checked against the others.
    pub fn resolve(&self, name: &str) -> Result<Resolved> {
        let e = self.entry(name)?;
        if let Some(id) = e.ggml {
            return self.resolve_ggml(name, e, id);
        }
        let companion = |cname: &str, dtype: safetensors::Dtype| -> Result<TensorEntry> {
            let c = self.entry(cname).map_err(|_| {
                self.shard_error(e, name, format!("its companion `{cname}` is missing"))
            })?;
            if c.stored != dtype {
                return Err(self.shard_error(
                    c,
                    cname,
                    format!("stored as {:?}, scales must be {dtype:?}", c.stored),
                ));
            }
            Ok(c.clone())
        };
        let (stored, shape) = if let Some(meta) = e.quant {
            let rows = e.shape.first().copied().unwrap_or(0);
            let want = [rows, meta.row_bytes()];
            if e.stored != safetensors::Dtype::U8 || e.shape != want {
                return Err(self.shard_error(
                    e,
                    name,
                    format!(
                        "packed {} tensor of {} columns must be U8 {want:?}, header says {:?} {:?}",
                        meta.name(),
                        meta.cols,
                        e.stored,
                        e.shape
                    ),
                ));
            }
            let (dtype, shape) = meta.companion(rows);
            let scales = companion(&scales_name(name), dtype)?;
            if scales.shape != shape {
                return Err(self.shard_error(
                    &scales,
                    &scales_name(name),
                    format!(
                        "shape {:?}, expected {shape:?} ({})",
                        scales.shape,
                        meta.name()
                    ),
                ));
            }
            (Stored::Quant { meta, scales }, vec![rows, meta.cols])
        } else if e.stored == safetensors::Dtype::F8_E4M3 {
            if e.shape.len() != 2 {
                return Err(self.shard_error(e, name, "FP8 tensors must be 2-D".into()));
            }
            let scale_inv = companion(&scale_inv_name(name), safetensors::Dtype::F32)?;
            let grid = fp8::scale_grid(e.shape[0], e.shape[1]);
            if scale_inv.shape != grid {
                return Err(self.shard_error(
                    &scale_inv,
                    &scale_inv_name(name),
                    format!(
                        "shape {:?}, expected the 128x128 block grid {grid:?}",
                        scale_inv.shape
                    ),
                ));
            }
            (Stored::Fp8 { scale_inv }, e.shape.clone())
        } else {
            (Stored::Float(self.dtype(name, e)?), e.shape.clone())
        };
        Ok(Resolved {
            name: name.to_string(),
            entry: e.clone(),
            stored,
            shape,
        })
    }

    /// A GGUF block tensor: a type the kernels run, as a matrix.
    fn resolve_ggml(&self, name: &str, e: &TensorEntry, id: u32) -> Result<Resolved> {
        let ty = BlockType::from_ggml_id(id).ok_or_else(|| {
            let known = crate::formats::gguf::file::ggml_type(id).map_or("?", |t| t.0);
            let supported: Vec<&str> = BlockType::ALL.iter().map(|t| t.name()).collect();
            self.shard_error(
                e,
                name,
                format!(
                    "stored as {known}, which moestream does not compute (supported: F32, F16, BF16, {})",
                    supported.join(", ")
                ),
            )
        })?;
        if e.shape.len() != 2 {
            return Err(self.shard_error(
                e,
                name,
                format!(
                    "{} blocks in shape {:?}; only matrices may be block-quantized",
                    ty.name(),
                    e.shape
                ),
            ));
        }
        Ok(Resolved {
            name: name.to_string(),
            entry: e.clone(),
            stored: Stored::Ggml(ty),
            shape: e.shape.clone(),
        })
    }

    /// Resolves `name` and checks its logical shape is exactly `shape`.
    pub fn expect_shape(&self, name: &str, shape: &[usize]) -> Result<Resolved> {
        let r = self.resolve(name)?;
        if r.shape != shape {
            return Err(Error::Shape {
                path: self.shard_path(&r.entry).to_path_buf(),
                name: name.to_string(),
                expected: shape.to_vec(),
                got: r.shape.clone(),
            });
        }
        Ok(r)
    }

    /// The bytes of `r` and of its companion.
    fn read_resolved(
        &self,
        r: &Resolved,
    ) -> Result<(moestream_io::Slab, Option<moestream_io::Slab>)> {
        let e = &r.entry;
        let data = self.shards[e.shard].reader.read(e.offset, e.len)?;
        let comp = match r.companion() {
            Some(c) => Some(self.shards[c.shard].reader.read(c.offset, c.len)?),
            None => None,
        };
        Ok((data, comp))
    }

    /// The matrix `r` from its stored bytes (and its companion's), in its
    /// kept element type, with the runtime quantizer applied to float and
    /// FP8 tensors when one is set.
    pub fn decode_mat(&self, r: &Resolved, data: &[u8], companion: Option<&[u8]>) -> Result<Mat> {
        let (rows, cols) = (r.shape[0], r.shape[1]);
        let width = self
            .at_load
            .as_ref()
            .map(|a| a.policy.width_of(&r.name, &r.shape, a.layers));
        // What the runtime quantizer narrows is checked first: it would
        // quantize a NaN to 0 and pass.
        let floats = |dt: Option<DType>| -> Result<Vec<f32>> {
            let out = match dt {
                Some(dt) => {
                    let mut out = vec![0f32; rows * cols];
                    dtype::to_f32(dt, data, &mut out);
                    out
                }
                None => fp8::dequantize(data, &f32s(companion.unwrap_or_default()), rows, cols),
            };
            if width.is_some() {
                if let Some(index) = out.iter().position(|x| !x.is_finite()) {
                    return Err(non_finite(&r.name, index));
                }
            }
            Ok(out)
        };
        Ok(match (r.stored.clone(), width) {
            (Stored::Ggml(ty), _) => {
                Mat::ggml(ty, rows, cols, data.to_vec().into()).ok_or_else(|| {
                    self.shard_error(
                        &r.entry,
                        &r.name,
                        "byte length does not match the shape".into(),
                    )
                })?
            }
            (Stored::Quant { meta, .. }, _) => {
                let comp = CompanionWords::copied(&meta, companion.unwrap_or_default());
                meta.mat(rows, data.to_vec().into(), comp)
                    .map_err(|why| self.shard_error(&r.entry, &r.name, why))?
            }
            (Stored::Float(dt), None) => Mat::from_bytes(dt, data, rows, cols),
            (Stored::Fp8 { .. }, None) => Mat::f32(rows, cols, floats(None)?),
            (Stored::Float(dt), Some(w)) => Mat::encode(floats(Some(dt))?, rows, cols, w),
            (Stored::Fp8 { .. }, Some(w)) => Mat::encode(floats(None)?, rows, cols, w),
        })
    }

    /// [`WeightIndex::decode_mat`] over windows of read slabs: a packed
    /// tensor stays in its slab (zero copy) when both windows are aligned;
    /// anything else is decoded from the bytes as `decode_mat` does.
    pub fn decode_mat_in(
        &self,
        r: &Resolved,
        (slab, window): (&Arc<Slab>, Range<usize>),
        companion: Option<(&Arc<Slab>, Range<usize>)>,
    ) -> Result<Mat> {
        if let Stored::Ggml(ty) = r.stored {
            let data = Words::shared(slab, window).ok_or_else(|| {
                self.shard_error(
                    &r.entry,
                    &r.name,
                    "the read does not cover the tensor".into(),
                )
            })?;
            return Mat::ggml(ty, r.shape[0], r.shape[1], data).ok_or_else(|| {
                self.shard_error(
                    &r.entry,
                    &r.name,
                    "byte length does not match the shape".into(),
                )
            });
        }
        if let (Stored::Quant { meta, .. }, Some((cs, cw))) = (&r.stored, &companion) {
            let data = Words::shared(slab, window.clone());
            let comp = CompanionWords::shared(meta, cs, cw.clone());
            if let (Some(data), Some(comp)) = (data, comp) {
                return meta
                    .mat(r.shape[0], data, comp)
                    .map_err(|why| self.shard_error(&r.entry, &r.name, why));
            }
        }
        let bytes = slab
            .bytes()
            .get(window)
            .expect("the span covers the tensor");
        let comp = companion.map(|(s, w)| &s.bytes()[w]);
        self.decode_mat(r, bytes, comp)
    }

    /// Bytes `r` takes in RAM once decoded by [`WeightIndex::decode_mat`].
    pub fn kept_bytes(&self, r: &Resolved) -> u64 {
        let n: usize = r.shape.iter().product();
        let rows = r.shape.first().copied().unwrap_or(1);
        let cols = r.shape.get(1).copied().unwrap_or(1);
        let width = self
            .at_load
            .as_ref()
            .map(|a| a.policy.width_of(&r.name, &r.shape, a.layers));
        let packed = |q: QBits| (rows * q.row_bytes(cols) + rows * 4) as u64;
        match (&r.stored, width) {
            (Stored::Ggml(_), _) => r.entry.len as u64,
            (Stored::Quant { meta, .. }, _) => meta.bytes(rows),
            (_, Some(Width::Int(q))) => packed(q),
            (_, Some(Width::Blocks(ty))) => (rows * ty.row_bytes(cols).unwrap_or(0)) as u64,
            (_, Some(Width::Grouped(f))) => {
                (rows * (f.row_bytes(cols) + 2 * f.params_per_row(cols))) as u64
            }
            (_, Some(Width::Bf16)) | (Stored::Float(DType::BF16), None) => n as u64 * 2,
            _ => n as u64 * 4,
        }
    }

    /// Reads matrix `name` of shape `(rows, cols)` in its kept element type
    /// (see [`WeightIndex::decode_mat`]).
    pub fn read_mat(&self, name: &str, rows: usize, cols: usize) -> Result<Mat> {
        let m = self.read_mat_uncounted(name, rows, cols)?;
        check_finite(name, &m)?;
        self.count(m.bytes());
        Ok(m)
    }

    fn read_mat_uncounted(&self, name: &str, rows: usize, cols: usize) -> Result<Mat> {
        let r = self.expect_shape(name, &[rows, cols])?;
        let (data, comp) = self.read_resolved(&r)?;
        self.decode_mat(&r, data.bytes(), comp.as_ref().map(|c| c.bytes()))
    }

    fn count(&self, bytes: usize) {
        self.handed_out
            .fetch_add(bytes as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Bytes of every matrix and vector read so far through [`read_mat`]
    /// and [`read_f32`] (at load: the resident weights).
    ///
    /// [`read_mat`]: WeightIndex::read_mat
    /// [`read_f32`]: WeightIndex::read_f32
    pub fn resident_bytes(&self) -> u64 {
        self.handed_out.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Reads tensor `name` of `shape` as f32: widened, or dequantized (a
    /// matrix the runtime quantizer narrows is narrowed and widened back, so
    /// it holds exactly what a converted container would give).
    pub fn read_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let r = self.expect_shape(name, shape)?;
        if shape.len() == 2 {
            let v = self.read_mat_uncounted(name, shape[0], shape[1])?.to_f32();
            if let Some(index) = v.iter().position(|x| !x.is_finite()) {
                return Err(non_finite(name, index));
            }
            self.count(v.len() * 4);
            return Ok(v);
        }
        let Stored::Float(dt) = r.stored else {
            return Err(self.shard_error(&r.entry, name, "only matrices may be quantized".into()));
        };
        let mut out = vec![0f32; r.entry.numel()];
        let (data, _) = self.read_resolved(&r)?;
        dtype::to_f32(dt, data.bytes(), &mut out);
        if let Some(index) = out.iter().position(|x| !x.is_finite()) {
            return Err(non_finite(name, index));
        }
        self.count(out.len() * 4);
        Ok(out)
    }
}

/// Refuses `m` (tensor `name`) when a value it multiplies by is NaN or
/// infinite: an element of a float matrix, a row's scale of a packed one,
/// a block's f16 scale (`d`, `dmin`) of GGUF blocks. The integer kernels
/// would not carry such a scale into the output: a NaN it gives an
/// intermediate activation quantizes to 0 for the next product, so the
/// check is made here, once, where the bytes enter (at load, and as a
/// streamed expert lands), not in the kernels' loops.
pub fn check_finite(name: &str, m: &Mat) -> Result<()> {
    let Some(index) = m.first_non_finite() else {
        return Ok(());
    };
    let cols = m.cols.max(1);
    let (row, col) = (index / cols, index % cols);
    let at = match &m.data {
        MatData::Q(_) | MatData::Grouped(_) => format!("row {row}"),
        MatData::Ggml { ty, .. } => {
            let be = ty.block_elems();
            format!(
                "row {row}, {} block {} (elements {col}..{} of the row)",
                ty.name(),
                col / be,
                col + be
            )
        }
        MatData::F32(_) | MatData::Bf16(_) => return Err(non_finite(name, index)),
    };
    Err(Error::NonFiniteScale {
        name: name.to_string(),
        at,
    })
}

fn non_finite(name: &str, index: usize) -> Error {
    Error::NonFiniteWeight {
        name: name.to_string(),
        index,
    }
}

/// Little-endian f32s of `bytes`.
pub fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
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
    if !ipath.exists() {
        return Ok(());
    }
    let text = crate::fs::read_to_string(&ipath, crate::fs::read::JSON_SIDE_FILE)?;
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

/// How much of a shard is on disk against what its header describes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardExtent {
    pub path: PathBuf,
    /// The file's length.
    pub file_bytes: u64,
    /// The length its header implies: the 8-byte length, the header, and
    /// the data up to the end of its last tensor.
    pub header_bytes: u64,
}

impl ShardExtent {
    /// Whether every tensor's data is in the file.
    pub fn complete(&self) -> bool {
        self.file_bytes >= self.header_bytes
    }
}

/// Parses one shard's header into entries with absolute offsets (shard = 0).
pub(crate) fn read_header(path: &Path) -> Result<Vec<(String, TensorEntry)>> {
    read_header_with(path, false).map(|(entries, _)| entries)
}

/// [`read_header`], and the shard's extent; with `partial_ok` the tensors
/// need not lie inside the file (only the header must be whole).
fn read_header_with(
    path: &Path,
    partial_ok: bool,
) -> Result<(Vec<(String, TensorEntry)>, ShardExtent)> {
    let shard_err = |reason: String| Error::Shard {
        path: path.to_path_buf(),
        reason,
    };
    // A FIFO or device would block or never end: refused on the open.
    let mut file = crate::fs::open(path)?;
    let file_len = file.metadata().map_err(|e| Error::file(path, e))?.len();
    let mut n8 = [0u8; 8];
    file.read_exact(&mut n8).map_err(|_| {
        shard_err(format!(
            "truncated: {file_len} bytes, too short for a safetensors header"
        ))
    })?;
    let n = header_len(path, n8, file_len)?;
    let mut header = vec![0u8; n];
    file.read_exact(&mut header)
        .map_err(|e| Error::file(path, e))?;
    let entries = parse_header(path, &header, if partial_ok { u64::MAX } else { file_len })?;
    let data_start = 8 + n as u64;
    let extent = ShardExtent {
        path: path.to_path_buf(),
        file_bytes: file_len,
        header_bytes: entries
            .iter()
            .map(|(_, e)| e.offset + e.len as u64)
            .fold(data_start, u64::max),
    };
    Ok((entries, extent))
}

/// The header length a shard's first 8 bytes give, checked against the
/// file's length and [`HEADER_BYTES_MAX`].
fn header_len(path: &Path, n8: [u8; 8], file_len: u64) -> Result<usize> {
    let n = u64::from_le_bytes(n8);
    if n > HEADER_BYTES_MAX || n.saturating_add(8) > file_len {
        return Err(Error::Shard {
            path: path.to_path_buf(),
            reason: format!(
                "header length {n} does not fit in the file ({file_len} bytes): truncated or not safetensors"
            ),
        });
    }
    Ok(n as usize)
}

/// Parses a shard's JSON header (the bytes after its 8-byte length) for a
/// file of `file_len` bytes: every tensor must lie inside the file, with
/// its begin at or before its end; `path` only names errors. The entry
/// point of the `safetensors_header` fuzz target.
pub fn parse_header(
    path: &Path,
    header: &[u8],
    file_len: u64,
) -> Result<Vec<(String, TensorEntry)>> {
    let shard_err = |reason: String| Error::Shard {
        path: path.to_path_buf(),
        reason,
    };
    let meta: safetensors::tensor::Metadata = serde_json::from_slice(header)
        .map_err(|e| shard_err(format!("bad safetensors header: {e}")))?;
    let data_start = 8 + header.len() as u64;
    let quant = quant_metadata(&meta).map_err(shard_err)?;
    let blocks = block_metadata(&meta).map_err(shard_err)?;
    let mut out = Vec::new();
    for (name, info) in meta.tensors() {
        let (begin, end) = info.data_offsets;
        let abs_end = data_start.saturating_add(end as u64);
        if begin > end || abs_end > file_len {
            return Err(shard_err(format!(
                "tensor `{name}` spans bytes {begin}..{end} of the data, past the file's {file_len} bytes or reversed (truncated, or the header lies)"
            )));
        }
        let q = quant.get(&name).copied();
        let mut entry = TensorEntry {
            shard: 0,
            stored: info.dtype,
            shape: info.shape.clone(),
            offset: data_start + begin as u64,
            len: end - begin,
            quant: q,
            ggml: None,
        };
        if let Some(&(ty, cols)) = blocks.get(&name) {
            as_blocks(&name, &mut entry, ty, cols).map_err(shard_err)?;
        }
        out.push((name, entry));
    }
    Ok(out)
}

/// Makes `e` (tensor `name`) the block tensor its metadata declares:
/// stored `U8 [rows, row_bytes(cols)]`, logical shape `[rows, cols]`.
fn as_blocks(
    name: &str,
    e: &mut TensorEntry,
    ty: BlockType,
    cols: usize,
) -> std::result::Result<(), String> {
    let rows = e.shape.first().copied().unwrap_or(0);
    let Some(rb) = ty.row_bytes(cols) else {
        return Err(format!(
            "tensor `{name}`: {} blocks hold {} values, but its metadata says {cols} columns (not whole blocks)",
            ty.name(),
            ty.block_elems()
        ));
    };
    if e.quant.is_some() || e.stored != safetensors::Dtype::U8 || e.shape != [rows, rb] {
        return Err(format!(
            "tensor `{name}`: {} blocks of {cols} columns must be U8 [rows, {rb}] ({} blocks a row), header says {:?} {:?}",
            ty.name(),
            cols / ty.block_elems(),
            e.stored,
            e.shape
        ));
    }
    e.shape = vec![rows, cols];
    e.ggml = Some(ty.ggml_id());
    Ok(())
}

/// The block tensors a header's `__metadata__` declares: name → (type, cols).
fn block_metadata(
    meta: &safetensors::tensor::Metadata,
) -> std::result::Result<HashMap<String, (BlockType, usize)>, String> {
    let mut out = HashMap::new();
    for (k, v) in meta.metadata().iter().flat_map(|m| m.iter()) {
        let Some(name) = k.strip_prefix(BLOCKS_META_PREFIX) else {
            continue;
        };
        let bad = |why: &str| format!("metadata `{k}` = `{v}`: {why}");
        let j: serde_json::Value =
            serde_json::from_str(v).map_err(|e| bad(&format!("not JSON: {e}")))?;
        let names: Vec<&str> = BlockType::ALL.iter().map(|t| t.name()).collect();
        let ty = j
            .get("type")
            .and_then(|t| t.as_str())
            .and_then(BlockType::parse)
            .ok_or_else(|| bad(&format!("`type` must be one of {}", names.join(", "))))?;
        let cols = j
            .get("cols")
            .and_then(|c| c.as_u64())
            .ok_or_else(|| bad("`cols` missing"))? as usize;
        if meta.info(name).is_none() {
            return Err(bad("names a tensor the header does not hold"));
        }
        out.insert(name.to_string(), (ty, cols));
    }
    Ok(out)
}

/// The packed tensors a header's `__metadata__` declares.
fn quant_metadata(
    meta: &safetensors::tensor::Metadata,
) -> std::result::Result<HashMap<String, QuantMeta>, String> {
    let mut out = HashMap::new();
    let Some(md) = meta.metadata() else {
        return Ok(out);
    };
    use crate::formats::weights::container::{CONTAINER_KEY, FORMAT_VERSION};
    if let Some(v) = md.get(CONTAINER_KEY).filter(|v| *v != FORMAT_VERSION) {
        return Err(format!(
            "metadata `{CONTAINER_KEY}` = `{v}`: container version {v} is not supported (this build reads version {FORMAT_VERSION})"
        ));
    }
    for (k, v) in md {
        let Some(name) = k.strip_prefix(QUANT_META_PREFIX) else {
            continue;
        };
        let bad = |why: &str| format!("metadata `{k}` = `{v}`: {why}");
        let j: serde_json::Value =
            serde_json::from_str(v).map_err(|e| bad(&format!("not JSON: {e}")))?;
        let packing = packing(&j).map_err(|why| bad(&why))?;
        let cols = j
            .get("cols")
            .and_then(|c| c.as_u64())
            .ok_or_else(|| bad("`cols` missing"))? as usize;
        if meta.info(name).is_none() {
            return Err(bad("names a tensor the header does not hold"));
        }
        out.insert(name.to_string(), QuantMeta { packing, cols });
    }
    Ok(out)
}

/// The packing a tensor's metadata names: `bits` alone (per row: 2, 4, 8),
/// or `bits`, `group` and `min` (grouped: docs/FORMAT.md).
fn packing(j: &serde_json::Value) -> std::result::Result<Packing, String> {
    use crate::formats::quant::grouped::{GBits, Group};
    let bits = j.get("bits").and_then(|b| b.as_u64());
    let Some(group) = j.get("group") else {
        return bits
            .and_then(|b| QBits::from_bits(b as u32))
            .map(Packing::Row)
            .ok_or_else(|| "`bits` must be 2, 4 or 8".into());
    };
    let group = group
        .as_u64()
        .and_then(|g| Group::from_cols(g as usize))
        .ok_or("`group` must be 32, 64 or 128")?;
    let bits = match bits {
        Some(2) => GBits::Q2,
        Some(3) => GBits::Q3,
        Some(4) => GBits::Q4,
        _ => return Err("`bits` of a grouped format must be 2, 3 or 4".into()),
    };
    let min = j
        .get("min")
        .and_then(|m| m.as_bool())
        .ok_or("`min` (true or false) missing")?;
    GFormat::new(bits, group, min)
        .map(Packing::Grouped)
        .ok_or_else(|| "grouped int3 and int2 always store a min (`min`: true)".into())
}
