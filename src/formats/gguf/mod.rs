//! llama.cpp's GGUF files, run as they are: `--model X.gguf` (or the first
//! file of a split set, `X-00001-of-0000N.gguf`) wherever a model directory
//! is taken.
//!
//! - [`file`](mod@file) parses and checks one file's header;
//! - [`names`] maps llama.cpp's tensor names to the Hugging Face names the
//!   loader asks for; a stacked expert tensor `[E, rows, cols]` becomes E
//!   entries, each a byte range of the file, so the expert store reads an
//!   expert's gate, up and down slices as one batch of three reads;
//! - [`config`] turns the `{arch}.*` metadata into the config.json the
//!   engine's one config parser checks;
//! - [`vocab`] turns `tokenizer.ggml.*` into a tokenizer.json;
//! - the writers live with the other writers: [`crate::convert::gguf_write`]
//!   writes GGUF files, and [`crate::convert::gguf_export`] a Qwen3-MoE model
//!   as one llama.cpp runs (`moestream export-gguf`).
//!
//! [`GgufModel::document`] serves the metadata files a directory would hold
//! (config.json, tokenizer.json, tokenizer_config.json with the chat
//! template), derived from the header, so every reader of a model's
//! metadata takes GGUF through one door ([`crate::formats::model_files`]).

pub mod config;
pub mod file;
pub mod names;
pub mod vocab;

use crate::error::{Error, Result};
use file::{GgufFile, TensorInfo, Value};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// The GGUF architectures the engine runs (`general.architecture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Qwen3Moe,
    Qwen2Moe,
    Olmoe,
    /// `llama` with experts: Mixtral.
    Llama,
    /// DeepSeek-V3 (MLA).
    Deepseek2,
    Glm4Moe,
}

impl Arch {
    const ALL: [(Arch, &'static str, &'static str); 6] = [
        (Arch::Qwen3Moe, "qwen3moe", "qwen3_moe"),
        (Arch::Qwen2Moe, "qwen2moe", "qwen2_moe"),
        (Arch::Olmoe, "olmoe", "olmoe"),
        (Arch::Llama, "llama", "mixtral"),
        (Arch::Deepseek2, "deepseek2", "deepseek_v3"),
        (Arch::Glm4Moe, "glm4moe", "glm4_moe"),
    ];

    fn parse(name: &str) -> Option<Arch> {
        Self::ALL.iter().find(|a| a.1 == name).map(|a| a.0)
    }

    /// The GGUF spelling (`general.architecture`, the metadata key prefix).
    pub fn name(self) -> &'static str {
        Self::ALL.iter().find(|a| a.0 == self).expect("listed").1
    }

    /// The Hugging Face `model_type` of the family.
    pub fn model_type(self) -> &'static str {
        Self::ALL.iter().find(|a| a.0 == self).expect("listed").2
    }

    fn supported() -> String {
        Self::ALL.map(|a| a.1).join(", ")
    }
}

/// Whether `path` names a GGUF model: a `.gguf` file.
pub fn is_gguf(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
        && !path.is_dir()
}

/// One tensor of the model under its Hugging Face name.
#[derive(Clone, Debug)]
pub struct Placed {
    /// Index into [`GgufModel::files`].
    pub file: usize,
    pub info: TensorInfo,
    /// Row-major shape of this (possibly per-expert) tensor.
    pub shape: Vec<usize>,
    /// Absolute offset and length of its bytes.
    pub offset: u64,
    pub len: u64,
}

/// A GGUF model: its files (one, or a split set), its architecture and its
/// tensors by Hugging Face name.
#[derive(Debug)]
pub struct GgufModel {
    pub path: PathBuf,
    pub arch: Arch,
    pub files: Vec<GgufFile>,
    pub tensors: HashMap<String, Placed>,
    /// The split MLA `attn_k_b` / `attn_v_b` of each layer that has them:
    /// (layer, k_b, v_b), rebuilt into `kv_b_proj` by the weight index.
    pub kv_b_parts: Vec<(usize, TensorInfo, TensorInfo)>,
    /// The derived tokenizer.json, once asked for: a load asks up to three
    /// times (tokenizer, grammars, chat template) and deriving it walks the
    /// whole vocabulary.
    tokenizer_json: OnceLock<String>,
}

impl GgufModel {
    /// Opens (once per process; later calls share it) the model at `path`.
    pub fn open(path: &Path) -> Result<Arc<GgufModel>> {
        static CACHE: OnceLock<Mutex<HashMap<PathBuf, Arc<GgufModel>>>> = OnceLock::new();
        let key = std::fs::canonicalize(path).map_err(|e| Error::File {
            path: path.to_path_buf(),
            source: e,
        })?;
        let cache = CACHE.get_or_init(Default::default);
        if let Some(m) = cache.lock().expect("gguf cache").get(&key) {
            return Ok(m.clone());
        }
        let model = Arc::new(Self::open_uncached(path)?);
        cache.lock().expect("gguf cache").insert(key, model.clone());
        Ok(model)
    }

    fn open_uncached(path: &Path) -> Result<GgufModel> {
        let first = GgufFile::open(path)?;
        let mut siblings = Vec::new();
        for p in split_siblings(&first)? {
            siblings.push(GgufFile::open(&p)?);
        }
        GgufModel::from_files(path, first, siblings)
    }

    /// The model of parsed files: the first of the set and the others.
    fn from_files(path: &Path, first: GgufFile, others: Vec<GgufFile>) -> Result<GgufModel> {
        let arch_name = first
            .get("general.architecture")
            .and_then(Value::as_str)
            .ok_or_else(|| first.error("metadata `general.architecture` is missing"))?;
        let arch = Arch::parse(arch_name).ok_or_else(|| {
            first.error(format!(
                "metadata `general.architecture` `{arch_name}` is not supported (supported: {})",
                Arch::supported()
            ))
        })?;
        let mut files = vec![first];
        files.extend(others);
        let (tensors, kv_b_parts) = place(arch, &files)?;
        Ok(GgufModel {
            path: path.to_path_buf(),
            arch,
            files,
            tensors,
            kv_b_parts,
            tokenizer_json: OnceLock::new(),
        })
    }

    /// Every GGUF tensor name of the set.
    pub fn gguf_names(&self) -> HashSet<String> {
        self.files
            .iter()
            .flat_map(|f| f.tensors.iter().map(|t| t.name.clone()))
            .collect()
    }

    /// The metadata file `name` a model directory would hold, derived from
    /// the header: config.json, tokenizer.json, tokenizer_config.json;
    /// `None` for any other (e.g. generation_config.json: GGUF has none).
    pub fn document(&self, name: &str) -> Result<Option<String>> {
        let meta = &self.files[0];
        let json = match name {
            "config.json" => config::derive(meta, self.arch, &self.gguf_names())?,
            "tokenizer.json" => {
                if let Some(text) = self.tokenizer_json.get() {
                    return Ok(Some(text.clone()));
                }
                let text = self.tokenizer_json()?.to_string();
                return Ok(Some(self.tokenizer_json.get_or_init(|| text).clone()));
            }
            "tokenizer_config.json" => self.tokenizer_config(),
            _ => return Ok(None),
        };
        Ok(Some(json.to_string()))
    }

    fn tokenizer_json(&self) -> Result<serde_json::Value> {
        let meta = &self.files[0];
        let v = vocab_keys(meta)?;
        vocab::tokenizer_json(&v.borrow()).map_err(|why| meta.error(format!("tokenizer: {why}")))
    }

    fn tokenizer_config(&self) -> serde_json::Value {
        let meta = &self.files[0];
        let mut c = serde_json::Map::new();
        if let Some(t) = meta.get("tokenizer.chat_template").and_then(Value::as_str) {
            c.insert("chat_template".into(), t.into());
        }
        let tokens = match meta.get("tokenizer.ggml.tokens") {
            Some(Value::Array(t)) => t.strings().unwrap_or_default(),
            _ => &[],
        };
        for (key, field) in [("bos", "bos_token"), ("eos", "eos_token")] {
            let id = meta
                .get(&format!("tokenizer.ggml.{key}_token_id"))
                .and_then(Value::as_u64);
            if let Some(s) = id.and_then(|i| tokens.get(i as usize)) {
                c.insert(field.into(), s.clone().into());
            }
        }
        serde_json::Value::Object(c)
    }
}

/// Parses a one-file GGUF header held in memory (the start of a file of
/// `file_len` bytes) and derives every metadata document from it
/// (config.json checked by the config parser, tokenizer.json,
/// tokenizer_config.json): the entry point of the `gguf_metadata` fuzz
/// target. `path` only names errors.
pub fn derive_documents(path: &Path, header: &[u8], file_len: u64) -> Result<()> {
    let file = GgufFile::from_bytes(path, header, file_len)?;
    let model = GgufModel::from_files(path, file, Vec::new())?;
    let config = model.document("config.json").and_then(|text| {
        let text = text.unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| model.files[0].error(format!("derived config.json: {e}")))?;
        crate::formats::config::ModelConfig::from_json(path, &v).map(|_| ())
    });
    let tokenizer = model.document("tokenizer.json").map(|_| ());
    let tokenizer_config = model.document("tokenizer_config.json").map(|_| ());
    config.and(tokenizer).and(tokenizer_config)
}

/// The other files of a split set (`split.count` > 1), in order, named as
/// llama.cpp's gguf-split names them.
fn split_siblings(first: &GgufFile) -> Result<Vec<PathBuf>> {
    let count = first
        .get("split.count")
        .and_then(Value::as_u64)
        .unwrap_or(1);
    if count <= 1 {
        return Ok(Vec::new());
    }
    // gguf-split numbers files with five digits.
    if count > 99_999 {
        return Err(first.error(format!(
            "metadata `split.count` {count} exceeds 99999 files"
        )));
    }
    let name = first
        .path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("");
    let marker = format!("-00001-of-{count:05}.gguf");
    let stem = name.strip_suffix(&marker).ok_or_else(|| {
        first.error(format!(
            "metadata `split.count` is {count}; give the first file of the set (…{marker})"
        ))
    })?;
    Ok((2..=count)
        .map(|i| {
            first
                .path
                .with_file_name(format!("{stem}-{i:05}-of-{count:05}.gguf"))
        })
        .collect())
}

type Placement = (
    HashMap<String, Placed>,
    Vec<(usize, TensorInfo, TensorInfo)>,
);

/// Every tensor of `files` under its Hugging Face name, stacked experts
/// expanded; unknown names are an error naming them.
fn place(arch: Arch, files: &[GgufFile]) -> Result<Placement> {
    let mut out = HashMap::new();
    let mut kv_b: HashMap<usize, [Option<TensorInfo>; 2]> = HashMap::new();
    for (fi, f) in files.iter().enumerate() {
        for t in &f.tensors {
            let mapped = names::map(arch, &t.name).ok_or_else(|| {
                f.error(format!(
                    "tensor `{}` is not a {} tensor moestream knows",
                    t.name,
                    arch.name()
                ))
            })?;
            match mapped {
                names::Mapped::One(hf) => {
                    let mut shape = t.shape();
                    if hf.ends_with("shared_expert_gate.weight") && shape.len() == 1 {
                        shape.insert(0, 1);
                    }
                    insert(&mut out, f, hf, placed(fi, t, shape, t.offset, t.bytes))?;
                }
                names::Mapped::Stacked(template) => {
                    let shape = t.shape();
                    if shape.len() != 3 {
                        return Err(f.error(format!(
                            "stacked expert tensor `{}` has shape {shape:?}; expected [experts, rows, cols]",
                            t.name
                        )));
                    }
                    let each = t.bytes / shape[0] as u64;
                    for e in 0..shape[0] {
                        let hf = template.replace("{e}", &e.to_string());
                        let at = t.offset + e as u64 * each;
                        insert(
                            &mut out,
                            f,
                            hf,
                            placed(fi, t, shape[1..].to_vec(), at, each),
                        )?;
                    }
                }
                names::Mapped::KvBPart { layer, value } => {
                    kv_b.entry(layer).or_default()[value as usize] = Some(t.clone());
                }
                names::Mapped::Unused => {}
            }
        }
    }
    let mut parts = Vec::new();
    for (layer, [k, v]) in kv_b {
        match (k, v) {
            (Some(k), Some(v)) => parts.push((layer, k, v)),
            _ => {
                return Err(files[0].error(format!(
                    "layer {layer} has only one of attn_k_b and attn_v_b"
                )))
            }
        }
    }
    Ok((out, parts))
}

fn placed(file: usize, t: &TensorInfo, shape: Vec<usize>, offset: u64, len: u64) -> Placed {
    Placed {
        file,
        info: t.clone(),
        shape,
        offset,
        len,
    }
}

fn insert(out: &mut HashMap<String, Placed>, f: &GgufFile, hf: String, p: Placed) -> Result<()> {
    let gguf = p.info.name.clone();
    if out.insert(hf.clone(), p).is_some() {
        return Err(f.error(format!(
            "tensor `{gguf}` maps to `{hf}`, which another tensor already holds"
        )));
    }
    Ok(())
}

/// The tokenizer keys, owned (arrays converted once).
struct VocabKeys {
    model: String,
    pre: Option<String>,
    tokens: Vec<String>,
    token_types: Option<Vec<i32>>,
    scores: Option<Vec<f32>>,
    merges: Option<Vec<String>>,
    ids: [Option<u32>; 4],
    flags: [Option<bool>; 3],
}

impl VocabKeys {
    fn borrow(&self) -> vocab::GgufVocab<'_> {
        vocab::GgufVocab {
            model: &self.model,
            pre: self.pre.as_deref(),
            tokens: &self.tokens,
            token_types: self.token_types.as_deref(),
            scores: self.scores.as_deref(),
            merges: self.merges.as_deref(),
            bos: self.ids[0],
            eos: self.ids[1],
            unk: self.ids[2],
            pad: self.ids[3],
            add_bos: self.flags[0],
            add_eos: self.flags[1],
            add_space_prefix: self.flags[2],
        }
    }
}

fn vocab_keys(f: &GgufFile) -> Result<VocabKeys> {
    let key = |k: &str| f.get(&format!("tokenizer.ggml.{k}"));
    let array = |k: &str| -> Result<Option<&file::Array>> {
        match key(k) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(_) => Err(f.error(format!("metadata `tokenizer.ggml.{k}` is not an array"))),
        }
    };
    let each = |k: &str, a: &file::Array, want: &str| {
        f.error(format!(
            "metadata `tokenizer.ggml.{k}`: the {} elements are not {want}",
            a.len()
        ))
    };
    let strings = |k: &str| -> Result<Option<Vec<String>>> {
        array(k)?
            .map(|a| {
                a.strings()
                    .map(<[String]>::to_vec)
                    .ok_or_else(|| each(k, a, "strings"))
            })
            .transpose()
    };
    let model = key("model")
        .and_then(Value::as_str)
        .ok_or_else(|| f.error("metadata `tokenizer.ggml.model` is missing"))?;
    let tokens =
        strings("tokens")?.ok_or_else(|| f.error("metadata `tokenizer.ggml.tokens` is missing"))?;
    let numbers = |k: &str, want: &str| -> Result<Option<Vec<f64>>> {
        array(k)?
            .map(|a| {
                (0..a.len())
                    .map(|i| {
                        a.get(i)
                            .and_then(|v| v.as_f64())
                            .ok_or_else(|| each(k, a, want))
                    })
                    .collect()
            })
            .transpose()
    };
    let token_types =
        numbers("token_type", "integers")?.map(|v| v.into_iter().map(|x| x as i32).collect());
    let scores = numbers("scores", "numbers")?.map(|v| v.into_iter().map(|x| x as f32).collect());
    let id = |k: &str| -> Result<Option<u32>> {
        key(k)
            .map(|v| {
                v.as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .ok_or_else(|| {
                        f.error(format!(
                            "metadata `tokenizer.ggml.{k}`: {v:?} is not a token id"
                        ))
                    })
            })
            .transpose()
    };
    let flag = |k: &str| key(k).and_then(Value::as_bool);
    Ok(VocabKeys {
        model: model.to_string(),
        pre: key("pre").and_then(Value::as_str).map(str::to_string),
        tokens,
        token_types,
        scores,
        merges: strings("merges")?,
        ids: [
            id("bos_token_id")?,
            id("eos_token_id")?,
            id("unknown_token_id")?,
            id("padding_token_id")?,
        ],
        flags: [
            flag("add_bos_token"),
            flag("add_eos_token"),
            flag("add_space_prefix"),
        ],
    })
}
