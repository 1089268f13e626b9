//! A [`WeightIndex`] over a GGUF model: one shard per file of the set, an
//! entry per tensor under its Hugging Face name (per expert for stacked
//! expert tensors), and, for DeepSeek files whose converter split MLA's
//! `kv_b_proj` into `attn_k_b` / `attn_v_b`, one derived in-memory shard
//! holding `kv_b_proj` rebuilt in f32.

use super::{Shard, TensorEntry, WeightIndex};
use crate::error::Result;
use crate::formats::gguf::file::TensorInfo;
use crate::formats::gguf::GgufModel;
use crate::formats::weights::dtype::{self, DType};
use crate::kernels::ggml::{self, BlockType};
use moestream_io::{IoError, RangeReader, ReadMode, Slab};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

impl WeightIndex {
    /// Indexes the GGUF model at `path` (a `.gguf` file, or the first of a
    /// split set), opening its files in `mode`.
    pub(super) fn open_gguf(
        path: &Path,
        mode: ReadMode,
    ) -> Result<(WeightIndex, Vec<super::ShardExtent>)> {
        let model = GgufModel::open(path)?;
        let mut shards = Vec::with_capacity(model.files.len() + 1);
        let mut extents = Vec::new();
        for f in &model.files {
            let reader: Arc<dyn RangeReader> = moestream_io::open(&f.path, mode)?.into();
            shards.push(Shard {
                path: f.path.clone(),
                reader,
            });
            extents.push(super::ShardExtent {
                path: f.path.clone(),
                file_bytes: f.file_len,
                header_bytes: f.file_len,
            });
        }
        let mut tensors = HashMap::with_capacity(model.tensors.len());
        for (name, p) in &model.tensors {
            tensors.insert(
                name.clone(),
                entry(p.file, &p.info, p.shape.clone(), p.offset, p.len),
            );
        }
        let mut index = WeightIndex {
            dir: path.to_path_buf(),
            shards,
            tensors,
            at_load: None,
            handed_out: Default::default(),
        };
        if !model.kv_b_parts.is_empty() {
            index.add_kv_b(&model)?;
        }
        Ok((index, extents))
    }

    /// Rebuilds each layer's `kv_b_proj` `[heads·(nope + v), kv_lora]`
    /// from `attn_k_b` `[heads, kv_lora, nope]` (stored transposed) and
    /// `attn_v_b` `[heads, v, kv_lora]`, into one in-memory f32 shard.
    fn add_kv_b(&mut self, model: &GgufModel) -> Result<()> {
        let mut bytes = Vec::new();
        let mut placed = Vec::new();
        for (layer, k_info, v_info) in &model.kv_b_parts {
            let (k, ks) = self.dequantize(k_info, model)?;
            let (v, vs) = self.dequantize(v_info, model)?;
            let fits = ks.len() == 3 && vs.len() == 3 && vs[0] == ks[0] && vs[2] == ks[1];
            if !fits {
                return Err(model.files[0].error(format!(
                    "layer {layer}: attn_k_b {ks:?} and attn_v_b {vs:?} do not fit one MLA geometry"
                )));
            }
            let (heads, lora, nope, vd) = (ks[0], ks[1], ks[2], vs[1]);
            let mut kv_b = Vec::with_capacity(heads * (nope + vd) * lora);
            for h in 0..heads {
                let kh = &k[h * lora * nope..(h + 1) * lora * nope];
                for i in 0..nope {
                    kv_b.extend((0..lora).map(|j| kh[j * nope + i]));
                }
                kv_b.extend_from_slice(&v[h * vd * lora..(h + 1) * vd * lora]);
            }
            let name = format!("model.layers.{layer}.self_attn.kv_b_proj.weight");
            placed.push((name, bytes.len() as u64, vec![heads * (nope + vd), lora]));
            bytes.extend(kv_b.iter().flat_map(|x| x.to_le_bytes()));
        }
        let shard = self.shards.len();
        let path = model.path.with_extension("gguf#kv_b");
        for (name, offset, shape) in placed {
            let len = shape.iter().product::<usize>() * 4;
            self.tensors.insert(
                name,
                TensorEntry {
                    shard,
                    stored: safetensors::Dtype::F32,
                    shape,
                    offset,
                    len,
                    quant: None,
                    ggml: None,
                },
            );
        }
        self.shards.push(Shard {
            path: path.clone(),
            reader: Arc::new(MemReader { path, bytes }),
        });
        Ok(())
    }

    /// A whole tensor of the model widened to f32, with its shape.
    fn dequantize(&self, t: &TensorInfo, model: &GgufModel) -> Result<(Vec<f32>, Vec<usize>)> {
        let file = model
            .files
            .iter()
            .position(|f| {
                f.tensors
                    .iter()
                    .any(|x| x.name == t.name && x.offset == t.offset)
            })
            .expect("the tensor came from one of the files");
        let data = self.shards[file].reader.read(t.offset, t.bytes as usize)?;
        let shape = t.shape();
        let cols = t.dims[0] as usize;
        let mut out = vec![0f32; shape.iter().product()];
        match float_type(t.ty) {
            Some(dt) => dtype::to_f32(dt, data.bytes(), &mut out),
            None => {
                let ty = BlockType::from_ggml_id(t.ty).ok_or_else(|| {
                    model.files[file].error(format!(
                        "tensor `{}` is {}, which moestream does not compute",
                        t.name,
                        t.type_name()
                    ))
                })?;
                let rb = ty.row_bytes(cols).expect("checked at open");
                for (row, bytes) in out
                    .chunks_exact_mut(cols)
                    .zip(data.bytes().chunks_exact(rb))
                {
                    ggml::dequantize_row(ty, bytes, row);
                }
            }
        }
        Ok((out, shape))
    }
}

/// The float types F32, F16, BF16 by ggml id.
fn float_type(id: u32) -> Option<DType> {
    match id {
        0 => Some(DType::F32),
        1 => Some(DType::F16),
        30 => Some(DType::BF16),
        _ => None,
    }
}

/// The index entry of one (possibly per-expert) tensor.
fn entry(file: usize, t: &TensorInfo, shape: Vec<usize>, offset: u64, len: u64) -> TensorEntry {
    let (stored, ggml) = match float_type(t.ty) {
        Some(DType::F32) => (safetensors::Dtype::F32, None),
        Some(DType::F16) => (safetensors::Dtype::F16, None),
        Some(DType::BF16) => (safetensors::Dtype::BF16, None),
        None => (safetensors::Dtype::U8, Some(t.ty)),
    };
    TensorEntry {
        shard: file,
        stored,
        shape,
        offset,
        len: len as usize,
        quant: None,
        ggml,
    }
}

/// Bytes derived at load, served as a shard.
struct MemReader {
    path: PathBuf,
    bytes: Vec<u8>,
}

impl RangeReader for MemReader {
    fn read(&self, offset: u64, len: usize) -> std::result::Result<Slab, IoError> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        match start
            .checked_add(len)
            .and_then(|end| self.bytes.get(start..end))
        {
            Some(b) => Ok(Slab::from_vec(b.to_vec())),
            None => Err(IoError::ShortRead {
                path: self.path.clone(),
                offset,
                len,
                got: self.bytes.len().saturating_sub(start),
            }),
        }
    }

    fn path(&self) -> &Path {
        &self.path
    }

    fn len_bytes(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn effective_mode(&self) -> ReadMode {
        ReadMode::Buffered
    }
}
