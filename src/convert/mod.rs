//! `moestream convert`: a Hugging Face checkpoint (FP8 e4m3 with 128×128
//! block scales, BF16, F16 or F32) into the moestream container
//! (docs/FORMAT.md), or a GGUF kept as stored (its blocks bit for bit,
//! each routed expert's three tensors coalesced into one aligned span;
//! output files `model-0000i-of-0000N.safetensors`, metadata files derived
//! from its header).
//!
//! Each input shard becomes one output file of the same name, written to a
//! temporary name, synced, renamed, then read back and checked (header and a
//! checksum of every data byte). Every tensor is stored at the width the bit
//! [`Policy`] gives its [`Class`], through [`Mat::encode`] — the same encoder
//! the runtime quantizer uses, so both give identical bytes. A routed
//! expert's gate, up and down (and their scales) are written contiguously
//! from a 4096-byte boundary, in the file of the shard that held the first
//! of them, so one O_DIRECT read fetches the expert.
//!
//! Resumable: `moestream-convert.json` in the output records the input's
//! fingerprint (config.json's checksum, and each shard's size and header
//! checksum) and each finished file (its length and data checksum); a rerun
//! with `resume` refuses a different input, skips finished files only after
//! re-reading and re-checking them, and redoes everything else, including a
//! file whose write was cut short. Until the last step the manifest has no
//! census, which marks the directory unfinished: the runtime refuses to load
//! it ([`check_finished`]).
//!
//! Never destructive: the output may not be the input, and an output that
//! already holds a model is refused unless `force`, which builds the new
//! container in a temporary sibling directory and swaps it in only once it
//! is complete.

pub mod gguf_export;
pub mod gguf_write;
pub mod writer;

use crate::error::{Error, Result};
use crate::formats::config::ModelConfig;
use crate::formats::quant::importance::Importance;
use crate::formats::quant::policy::{Class, Policy, Width};
use crate::formats::tensor::{Mat, MatData};
use crate::formats::weights::index::{
    scales_name, Resolved, Stored, BLOCKS_META_PREFIX, QUANT_META_PREFIX,
};
use crate::formats::weights::WeightIndex;
use moestream_io::ReadMode;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use writer::{Checksum, FileWriter, Layout};

pub use crate::formats::weights::container::{
    check_finished, CONTAINER_KEY, FORMAT_VERSION, MANIFEST,
};

/// What to convert and how.
#[derive(Clone, Debug)]
pub struct ConvertOptions {
    pub input: PathBuf,
    pub output: PathBuf,
    pub policy: Policy,
    /// Continue an interrupted conversion into `output`.
    pub resume: bool,
    /// Replace an output directory that already holds a model (or a
    /// conversion): the new container is built beside it and swapped in
    /// when complete.
    pub force: bool,
    /// Draw a progress bar on stderr.
    pub progress: bool,
    /// Weigh each integer matrix's rounding error by its input's
    /// calibrated importance (`convert --importance`).
    pub importance: Option<Weighting>,
}

/// An importance file and the fewest calibration rows an input must have
/// seen to be weighted by it (a rarely routed expert is quantized
/// unweighted: a few rows say little of its inputs).
#[derive(Clone, Debug)]
pub struct Weighting {
    pub file: Importance,
    pub min_rows: u64,
}

impl Weighting {
    /// The column weights of matrix `name` of `cols` columns, if weighted.
    fn of(&self, name: &str, cols: usize) -> Result<Option<&[f32]>> {
        self.file.weights_for(name, cols, self.min_rows)
    }

    /// What the manifest records, so a resume with another file is refused.
    fn summary(&self) -> String {
        format!(
            " importance={} ({} tokens, min rows {})",
            self.file.origin.display(),
            self.file.tokens,
            self.min_rows
        )
    }
}

/// One census row: tensors and bytes stored in one class at one width.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CensusRow {
    pub tensors: u64,
    pub bytes: u64,
}

/// Bytes and share of the model per class and width (padding excluded).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Census {
    /// `(class, width)` → row, e.g. `("expert_down", "int4")`.
    pub rows: BTreeMap<String, BTreeMap<String, CensusRow>>,
    pub total_bytes: u64,
    pub padding_bytes: u64,
}

impl Census {
    fn add(&mut self, class: &str, width: &str, bytes: u64) {
        let row = self
            .rows
            .entry(class.to_string())
            .or_default()
            .entry(width.to_string())
            .or_default();
        row.tensors += 1;
        row.bytes += bytes;
        self.total_bytes += bytes;
    }

    /// The census as an aligned text table.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{:<14} {:<6} {:>8} {:>16} {:>7}\n",
            "class", "width", "tensors", "bytes", "share"
        );
        for (class, widths) in &self.rows {
            for (width, row) in widths {
                let share = 100.0 * row.bytes as f64 / self.total_bytes.max(1) as f64;
                s += &format!(
                    "{class:<14} {width:<6} {:>8} {:>16} {share:>6.2}%\n",
                    row.tensors, row.bytes
                );
            }
        }
        s += &format!(
            "{:<14} {:<6} {:>8} {:>16} {:>7}\n",
            "total", "", "", self.total_bytes, "100%"
        );
        s += &format!("(alignment padding: {} bytes)\n", self.padding_bytes);
        s
    }
}

/// One finished output file, as the manifest records it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileRecord {
    pub bytes: u64,
    /// [`Checksum`] of the data section, hex.
    pub checksum: String,
}

/// The conversion manifest (`moestream-convert.json`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub input: PathBuf,
    /// What the conversion was made from (absent in manifests of older
    /// versions, which cannot be resumed).
    #[serde(default)]
    pub input_fingerprint: Option<InputFingerprint>,
    pub policy: String,
    pub files: BTreeMap<String, FileRecord>,
    /// Present once the conversion finished.
    pub census: Option<Census>,
}

/// What identifies a conversion's input without reading all its weights:
/// config.json's checksum and each shard's name, size, header checksum
/// (the header fixes every tensor's name, type, shape and offset) and data
/// checksum (of its first and last MiB: two checkpoints whose configs and
/// headers agree differ there).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct InputFingerprint {
    pub config_checksum: String,
    pub shards: Vec<ShardPrint>,
}

/// One input shard in an [`InputFingerprint`].
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ShardPrint {
    pub name: String,
    pub bytes: u64,
    pub header_checksum: String,
    /// [`crate::fs::print::Print::data_hex`] of the shard ("" in manifests
    /// of older versions, which then cannot be resumed).
    #[serde(default)]
    pub data_checksum: String,
}

impl InputFingerprint {
    /// The fingerprint of the checkpoint `index` was opened from (a GGUF:
    /// its derived config.json, and each file's header up to its data).
    fn of(input: &Path, index: &WeightIndex) -> Result<InputFingerprint> {
        let gguf = crate::formats::gguf::is_gguf(input);
        let config = crate::formats::model_files::read(input, "config.json")?
            .ok_or_else(|| Error::config(input.join("config.json"), "(file)", "missing"))?;
        let mut shards = Vec::with_capacity(index.shards.len());
        for shard in &index.shards {
            if gguf && !shard.path.is_file() {
                continue; // a shard derived in memory (MLA's kv_b_proj)
            }
            let (bytes, header) = if gguf {
                gguf_header_bytes(&shard.path)?
            } else {
                header_bytes(&shard.path)?
            };
            shards.push(ShardPrint {
                name: file_name(&shard.path),
                bytes,
                header_checksum: checksum_hex(&header),
                data_checksum: crate::fs::print::Print::of(&shard.path)?.data_hex(),
            });
        }
        Ok(InputFingerprint {
            config_checksum: checksum_hex(config.text.as_bytes()),
            shards,
        })
    }

    /// Why `self` (the recorded input) is not `now`, if it is not.
    fn difference(&self, now: &InputFingerprint) -> Option<String> {
        if self.config_checksum != now.config_checksum {
            return Some("config.json differs".into());
        }
        if self.shards.len() != now.shards.len() {
            return Some(format!(
                "it had {} shards, the input has {}",
                self.shards.len(),
                now.shards.len()
            ));
        }
        self.shards
            .iter()
            .zip(&now.shards)
            .find(|(a, b)| a != b)
            .map(|(a, b)| {
                let part = if a.data_checksum != b.data_checksum
                    && a.header_checksum == b.header_checksum
                {
                    "its data"
                } else {
                    "its header or size"
                };
                format!(
                    "shard {} ({} bytes then) differs from {} ({} bytes now) in {part}",
                    a.name, a.bytes, b.name, b.bytes
                )
            })
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().to_string())
}

fn checksum_hex(bytes: &[u8]) -> String {
    let mut c = Checksum::default();
    c.update(bytes);
    format!("{:016x}", c.finish())
}

/// A safetensors file's size and its header bytes (length prefix included).
fn header_bytes(path: &Path) -> Result<(u64, Vec<u8>)> {
    use std::io::Read;
    let mut f = crate::fs::open(path)?;
    let size = f.metadata().map_err(|e| Error::file(path, e))?.len();
    let mut n8 = [0u8; 8];
    f.read_exact(&mut n8).map_err(|e| Error::file(path, e))?;
    let n = u64::from_le_bytes(n8).min(size.saturating_sub(8));
    Ok((size, [n8.to_vec(), prefix(path, 8, n)?].concat()))
}

/// A GGUF file's size and its header (every byte before its data).
fn gguf_header_bytes(path: &Path) -> Result<(u64, Vec<u8>)> {
    let g = crate::formats::gguf::file::GgufFile::open(path)?;
    Ok((g.file_len, prefix(path, 0, g.data_offset)?))
}

/// Up to `n` bytes of `path` from byte `at`.
fn prefix(path: &Path, at: u64, n: u64) -> Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = crate::fs::open(path)?;
    f.seek(SeekFrom::Start(at))
        .map_err(|e| Error::file(path, e))?;
    let mut out = Vec::new();
    f.take(n)
        .read_to_end(&mut out)
        .map_err(|e| Error::file(path, e))?;
    Ok(out)
}

/// What a conversion did.
#[derive(Clone, Debug)]
pub struct ConvertReport {
    pub written: Vec<String>,
    pub skipped: Vec<String>,
    pub census: Census,
    /// With an importance file: how many integer matrices it weighted, of
    /// how many.
    pub weighted: Option<(usize, usize)>,
}

/// How one source tensor is stored.
#[derive(Clone, Debug)]
enum Encoding {
    /// Through [`Mat::encode`] at a width.
    Matrix(Width),
    /// A float vector (norms, biases) widened to f32.
    Vector,
    /// Copied byte for byte (integer buffers and other non-float tensors).
    Raw,
}

/// One input tensor and where its output goes.
#[derive(Clone, Debug)]
struct Source {
    res: Resolved,
    class: Class,
    encoding: Encoding,
}

impl Source {
    /// The output tensors: name, dtype, shape, length.
    fn outputs(&self) -> Vec<(String, String, Vec<usize>, u64)> {
        let name = self.res.name.clone();
        let shape = self.res.shape.clone();
        let n: usize = shape.iter().product();
        match &self.encoding {
            Encoding::Matrix(Width::Int(q)) => {
                let (rows, cols) = (shape[0], shape[1]);
                let rb = q.row_bytes(cols);
                vec![
                    (
                        name.clone(),
                        "U8".into(),
                        vec![rows, rb],
                        (rows * rb) as u64,
                    ),
                    (
                        scales_name(&name),
                        "F32".into(),
                        vec![rows],
                        rows as u64 * 4,
                    ),
                ]
            }
            Encoding::Matrix(Width::Blocks(ty)) => {
                let rb = ty.row_bytes(shape[1]).expect("a fitted width");
                let len = (shape[0] * rb) as u64;
                vec![(name, "U8".into(), vec![shape[0], rb], len)]
            }
            Encoding::Matrix(Width::Grouped(f)) => {
                let (rows, cols) = (shape[0], shape[1]);
                let (rb, pr) = (f.row_bytes(cols), f.params_per_row(cols));
                vec![
                    (
                        name.clone(),
                        "U8".into(),
                        vec![rows, rb],
                        (rows * rb) as u64,
                    ),
                    (
                        scales_name(&name),
                        "F16".into(),
                        vec![rows, pr],
                        (rows * pr * 2) as u64,
                    ),
                ]
            }
            Encoding::Matrix(Width::Bf16) => vec![(name, "BF16".into(), shape, n as u64 * 2)],
            Encoding::Matrix(Width::F32) | Encoding::Vector => {
                vec![(name, "F32".into(), shape, n as u64 * 4)]
            }
            Encoding::Raw => vec![(
                name,
                format!("{:?}", self.res.entry.stored),
                self.res.entry.shape.clone(),
                self.res.entry.len as u64,
            )],
        }
    }

    fn width_name(&self) -> String {
        match &self.encoding {
            Encoding::Matrix(w) => w.to_string(),
            Encoding::Vector => "f32".into(),
            Encoding::Raw => format!("{:?}", self.res.entry.stored).to_lowercase(),
        }
    }

    /// Input bytes (the tensor and its companion), for the progress bar.
    fn input_bytes(&self) -> u64 {
        self.res.entry.len as u64 + self.res.companion().map_or(0, |c| c.len as u64)
    }
}

/// The routed-expert group of `name`: `(prefix up to "experts.{e}.", rank
/// of the part: gate 0, up 1, down 2)`.
fn expert_group(name: &str) -> Option<(String, usize)> {
    let at = name.find(".experts.")?;
    let rest = &name[at + ".experts.".len()..];
    let dot = rest.find('.')?;
    rest[..dot].parse::<usize>().ok()?;
    let prefix = name[..at + ".experts.".len() + dot + 1].to_string();
    let part = &name[prefix.len()..];
    let rank = ["gate_proj", "w1", "up_proj", "w3", "down_proj", "w2"]
        .iter()
        .position(|p| part.starts_with(p))
        .map_or(3, |i| i / 2);
    Some((prefix, rank))
}

/// Sort key that orders `…experts.10.` after `…experts.9.`.
fn natural_key(s: &str) -> Vec<(String, u64)> {
    s.split('.')
        .map(|p| match p.parse::<u64>() {
            Ok(n) => (String::new(), n),
            Err(_) => (p.to_string(), 0),
        })
        .collect()
}

/// A file's routed experts: natural-order key of the group → (part rank, source).
type ExpertGroups = BTreeMap<Vec<(String, u64)>, Vec<(usize, Source)>>;

/// The planned output files: name → (layout, sources in write order).
struct OutputPlan {
    files: Vec<(String, Layout, Vec<Source>)>,
    census: Census,
}

fn plan(index: &WeightIndex, layers: usize, policy: &Policy) -> Result<OutputPlan> {
    let gguf = crate::formats::gguf::is_gguf(&index.dir);
    let sources = if gguf {
        kept_sources(index, layers)?
    } else {
        sources(index, layers, policy)?
    };
    let mut census = Census::default();
    let mut files = Vec::new();
    let n = index.shards.len();
    for (i, (plain, groups)) in by_file(index, sources).into_iter().enumerate() {
        let fname = if gguf {
            format!("model-{:05}-of-{n:05}.safetensors", i + 1)
        } else {
            file_name(&index.shards[i].path)
        };
        let (layout, order) = file_layout(i, plain, groups, &mut census);
        files.push((fname, layout, order));
    }
    Ok(OutputPlan { files, census })
}

/// What is written for every tensor of `index` (FP8 scale companions
/// travel with their matrix): its class and encoding under `policy`.
fn sources(index: &WeightIndex, layers: usize, policy: &Policy) -> Result<Vec<Source>> {
    let mut sources = Vec::new();
    for (name, e) in index.iter() {
        let is_companion = name
            .strip_suffix("_scale_inv")
            .and_then(|base| index.entry(base).ok())
            .is_some_and(|b| b.stored == safetensors::Dtype::F8_E4M3);
        if is_companion {
            continue;
        }
        let float = e.stored == safetensors::Dtype::F8_E4M3
            || crate::formats::weights::dtype::DType::from_safetensors(e.stored).is_some();
        if !float {
            // Integer buffers and other non-float tensors are copied as stored.
            sources.push(Source {
                res: Resolved {
                    name: name.clone(),
                    entry: e.clone(),
                    stored: Stored::Float(crate::formats::weights::dtype::DType::F32),
                    shape: e.shape.clone(),
                },
                class: Class::Other,
                encoding: Encoding::Raw,
            });
            continue;
        }
        let res = index.resolve(name)?;
        let class = Class::of(name, &res.shape, layers);
        let encoding = if res.shape.len() == 2 {
            Encoding::Matrix(policy.width(class).fitted(res.shape[1]))
        } else if matches!(res.stored, Stored::Fp8 { .. }) {
            unreachable!("resolve() refuses FP8 tensors that are not matrices")
        } else {
            Encoding::Vector
        };
        sources.push(Source {
            res,
            class,
            encoding,
        });
    }
    Ok(sources)
}

/// Every tensor of a GGUF `index` kept as stored: block tensors as their
/// blocks (bit for bit), float tensors in their dtype; a type the kernels
/// do not run is refused naming the tensor.
fn kept_sources(index: &WeightIndex, layers: usize) -> Result<Vec<Source>> {
    let mut sources = Vec::new();
    for (name, _) in index.iter() {
        let res = index.resolve(name)?;
        let class = Class::of(name, &res.shape, layers);
        let encoding = match res.stored {
            Stored::Ggml(ty) => Encoding::Matrix(Width::Blocks(ty)),
            _ => Encoding::Raw,
        };
        sources.push(Source {
            res,
            class,
            encoding,
        });
    }
    Ok(sources)
}

/// `sources` per output file (one per input shard): the plain tensors of
/// its shard, and the expert groups whose lowest shard it is.
fn by_file(index: &WeightIndex, sources: Vec<Source>) -> Vec<(Vec<Source>, ExpertGroups)> {
    // Each expert group goes to the file of its lowest shard.
    let mut group_shard: HashMap<String, usize> = HashMap::new();
    for s in &sources {
        if let Some((g, _)) = expert_group(&s.res.name) {
            let sh = group_shard.entry(g).or_insert(s.res.entry.shard);
            *sh = (*sh).min(s.res.entry.shard);
        }
    }
    let mut per_file: Vec<(Vec<Source>, ExpertGroups)> =
        index.shards.iter().map(|_| Default::default()).collect();
    for s in sources {
        match expert_group(&s.res.name) {
            Some((g, rank)) => {
                let f = group_shard[&g];
                per_file[f]
                    .1
                    .entry(natural_key(&g))
                    .or_default()
                    .push((rank, s));
            }
            None => {
                let f = s.res.entry.shard;
                per_file[f].0.push(s);
            }
        }
    }
    per_file
}

/// The layout of output file `i` and its sources in write order: plain
/// tensors in natural order, then each expert group from an aligned start;
/// counts what it writes into `census`.
fn file_layout(
    i: usize,
    mut plain: Vec<Source>,
    groups: ExpertGroups,
    census: &mut Census,
) -> (Layout, Vec<Source>) {
    let mut layout = Layout::new(&i.to_string());
    layout
        .metadata
        .insert(CONTAINER_KEY.into(), FORMAT_VERSION.into());
    layout.metadata.insert("format".into(), "pt".into());
    plain.sort_by_key(|s| natural_key(&s.res.name));
    let mut order = plain;
    let mut aligned_starts = Vec::new();
    for (_, mut members) in groups {
        members.sort_by(|a, b| (a.0, &a.1.res.name).cmp(&(b.0, &b.1.res.name)));
        aligned_starts.push(order.len());
        order.extend(members.into_iter().map(|(_, s)| s));
    }
    for (k, s) in order.iter().enumerate() {
        if aligned_starts.contains(&k) {
            layout.align();
        }
        let outs = s.outputs();
        for (name, dtype, shape, len) in &outs {
            layout.push(name.clone(), dtype, shape.clone(), *len);
        }
        let cols = s.res.shape.get(1).copied().unwrap_or(0);
        let meta = match s.encoding {
            Encoding::Matrix(Width::Int(q)) => Some((
                QUANT_META_PREFIX,
                serde_json::json!({"bits": q.bits(), "cols": cols}),
            )),
            Encoding::Matrix(Width::Grouped(f)) => Some((
                QUANT_META_PREFIX,
                serde_json::json!({
                    "bits": f.bits().bits(), "cols": cols, "group": f.group().cols(), "min": f.has_min()
                }),
            )),
            Encoding::Matrix(Width::Blocks(ty)) => Some((
                BLOCKS_META_PREFIX,
                serde_json::json!({"type": ty.name(), "cols": cols}),
            )),
            _ => None,
        };
        if let Some((prefix, meta)) = meta {
            let key = format!("{prefix}{}", s.res.name);
            layout.metadata.insert(key, meta.to_string());
        }
        let bytes: u64 = outs.iter().map(|o| o.3).sum();
        census.add(s.class.name(), &s.width_name(), bytes);
    }
    if !aligned_starts.is_empty() {
        layout.align();
    }
    census.padding_bytes += layout
        .tensors
        .iter()
        .filter(|t| t.name.starts_with("__pad__."))
        .map(|t| t.len)
        .sum::<u64>();
    (layout, order)
}

/// With an importance file, how many of the plan's integer and block matrices it
/// weights, of how many; every matrix it has an input for is checked
/// against it first, so a file of another model is refused before any
/// byte is written.
fn weighted_count(
    plan: &OutputPlan,
    weighting: Option<&Weighting>,
) -> Result<Option<(usize, usize)>> {
    let Some(wt) = weighting else {
        return Ok(None);
    };
    let (mut weighted, mut total) = (0, 0);
    for s in plan.files.iter().flat_map(|f| f.2.iter()) {
        if let Encoding::Matrix(Width::Int(_) | Width::Blocks(_)) = s.encoding {
            total += 1;
            weighted += usize::from(wt.of(&s.res.name, s.res.shape[1])?.is_some());
        }
    }
    Ok(Some((weighted, total)))
}

/// The stored bytes of `s`: its output tensors' bytes in layout order.
fn encode(index: &WeightIndex, s: &Source, weighting: Option<&Weighting>) -> Result<Vec<Vec<u8>>> {
    let r = &s.res;
    Ok(match &s.encoding {
        Encoding::Raw => {
            let e = &r.entry;
            vec![index.shards[e.shard]
                .reader
                .read(e.offset, e.len)?
                .bytes()
                .to_vec()]
        }
        Encoding::Vector => {
            let v = index.read_f32(&r.name, &r.shape)?;
            vec![v.iter().flat_map(|x| x.to_le_bytes()).collect()]
        }
        Encoding::Matrix(Width::Blocks(ty)) if matches!(r.stored, Stored::Ggml(t) if t == *ty) => {
            // GGUF blocks of the type asked for: kept bit for bit.
            let e = &r.entry;
            let bytes = index.shards[e.shard].reader.read(e.offset, e.len)?;
            vec![bytes.bytes().to_vec()]
        }
        Encoding::Matrix(w) => {
            let (rows, cols) = (r.shape[0], r.shape[1]);
            let f = index.read_mat(&r.name, rows, cols)?.to_f32();
            let weights = match weighting {
                Some(wt) => wt.of(&r.name, cols)?,
                None => None,
            };
            let m = match weights {
                Some(imp) => Mat::encode_weighted(f, rows, cols, *w, imp),
                None => Mat::encode(f, rows, cols, *w),
            };
            match m.data {
                MatData::F32(v) => vec![v.iter().flat_map(|x| x.to_le_bytes()).collect()],
                MatData::Bf16(v) => vec![v.iter().flat_map(|x| x.to_le_bytes()).collect()],
                MatData::Q(q) => vec![
                    q.data.to_vec(),
                    q.scales.iter().flat_map(|x| x.to_le_bytes()).collect(),
                ],
                MatData::Grouped(g) => vec![
                    g.data.to_vec(),
                    g.params.iter().flat_map(|x| x.to_le_bytes()).collect(),
                ],
                MatData::Ggml { data, .. } => vec![data.to_vec()],
            }
        }
    })
}

/// Converts `opts.input` into a container at `opts.output`.
pub fn convert(opts: &ConvertOptions) -> Result<ConvertReport> {
    let cfg = ModelConfig::load(&opts.input)?;
    let index = WeightIndex::open(&opts.input, ReadMode::Buffered)?;
    if index.is_container() {
        return Err(Error::Request(format!(
            "{} is already a moestream container",
            opts.input.display()
        )));
    }
    refuse_input_as_output(&opts.input, &opts.output)?;
    let plan = plan(&index, cfg.num_layers, &opts.policy)?;
    let fingerprint = InputFingerprint::of(&opts.input, &index)?;
    let occupied = holds_anything(&opts.output)?;
    if !occupied || (opts.resume && !opts.force) {
        return convert_into(opts, &opts.output, &index, plan, fingerprint);
    }
    if !opts.force {
        return Err(Error::OutputOccupied {
            path: opts.output.clone(),
            conversion: opts.output.join(MANIFEST).exists(),
        });
    }
    let staging = sibling(&opts.output, "convert")?;
    if let (Some(parent), Some(name)) = (staging.parent(), opts.output.file_name()) {
        for what in ["convert", "replaced"] {
            let prefix = format!(".{}.{what}-", name.to_string_lossy());
            crate::fs::remove_stale(parent, &prefix);
        }
    }
    let _ = std::fs::remove_dir_all(&staging);
    let report = convert_into(opts, &staging, &index, plan, fingerprint)?;
    swap_in(&staging, &opts.output)?;
    Ok(report)
}

/// The converter never writes into its input.
fn refuse_input_as_output(input: &Path, output: &Path) -> Result<()> {
    let input = input.canonicalize().map_err(|e| Error::file(input, e))?;
    if let Ok(out) = output.canonicalize() {
        if out == input {
            return Err(Error::Request(format!(
                "the output {} is the input directory; the converter never writes into its input",
                output.display()
            )));
        }
    }
    Ok(())
}

/// Whether `dir` exists and holds any entry.
fn holds_anything(dir: &Path) -> Result<bool> {
    match std::fs::read_dir(dir) {
        Ok(mut rd) => Ok(rd.next().is_some()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::file(dir, e)),
    }
}

/// A hidden sibling of `dir` unique to this process: `.NAME.WHAT-PID`.
fn sibling(dir: &Path, what: &str) -> Result<PathBuf> {
    let name = dir
        .file_name()
        .ok_or_else(|| Error::Request(format!("the output {} has no name", dir.display())))?;
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    Ok(parent.join(format!(
        ".{}.{what}-{}",
        name.to_string_lossy(),
        std::process::id()
    )))
}

/// Replaces `dir` by the complete `staging`: `dir` is renamed aside, the
/// new one renamed in, the old one removed. Every step is a rename, so a
/// crash leaves either the old directory or the new one at `dir` (and the
/// other under a hidden sibling name).
fn swap_in(staging: &Path, dir: &Path) -> Result<()> {
    let old = sibling(dir, "replaced")?;
    std::fs::rename(dir, &old).map_err(|e| Error::file(dir, e))?;
    if let Err(e) = std::fs::rename(staging, dir) {
        let _ = std::fs::rename(&old, dir);
        return Err(Error::file(dir, e));
    }
    std::fs::remove_dir_all(&old).map_err(|e| Error::file(&old, e))
}

/// The conversion proper, into `out`.
fn convert_into(
    opts: &ConvertOptions,
    out: &Path,
    index: &WeightIndex,
    plan: OutputPlan,
    fingerprint: InputFingerprint,
) -> Result<ConvertReport> {
    std::fs::create_dir_all(out).map_err(|e| Error::file(out, e))?;
    let mpath = out.join(MANIFEST);
    let mut manifest = load_manifest(&mpath, opts, &fingerprint)?;
    // Unfinished from here until the census is written.
    manifest.census = None;
    manifest.input_fingerprint = Some(fingerprint);
    save_manifest(&mpath, &manifest)?;
    let total_in: u64 = plan
        .files
        .iter()
        .flat_map(|f| f.2.iter())
        .map(Source::input_bytes)
        .sum();
    let bar = progress_bar(opts.progress, total_in);
    let mut report = ConvertReport {
        written: Vec::new(),
        skipped: Vec::new(),
        census: plan.census.clone(),
        weighted: weighted_count(&plan, opts.importance.as_ref())?,
    };
    for (fname, layout, order) in &plan.files {
        let path = out.join(fname);
        let _ = std::fs::remove_file(writer::tmp_path(&path));
        crate::fs::remove_stale(out, &crate::fs::write::tmp_prefix(&path));
        if let Some(rec) = manifest.files.get(fname) {
            if finished(&path, layout, rec) {
                bar.inc(order.iter().map(Source::input_bytes).sum());
                report.skipped.push(fname.clone());
                continue;
            }
        }
        manifest.files.remove(fname);
        let mut w = FileWriter::create(&path, layout.clone())?;
        for s in order {
            while w.write_padding()? {}
            let outs = s.outputs();
            for ((name, ..), bytes) in outs.iter().zip(encode(index, s, opts.importance.as_ref())?)
            {
                w.write(name, &bytes)?;
            }
            bar.inc(s.input_bytes());
        }
        while w.write_padding()? {}
        let sum = w.finish()?;
        verify(&path, layout, sum)?;
        manifest.files.insert(
            fname.clone(),
            FileRecord {
                bytes: layout.file_len(),
                checksum: format!("{sum:016x}"),
            },
        );
        save_manifest(&mpath, &manifest)?;
        report.written.push(fname.clone());
    }
    bar.finish_and_clear();
    write_index_json(out, &plan)?;
    if crate::formats::gguf::is_gguf(&opts.input) {
        write_derived_files(&opts.input, out)?;
    } else {
        copy_side_files(&opts.input, out)?;
    }
    manifest.census = Some(plan.census);
    save_manifest(&mpath, &manifest)?;
    Ok(report)
}

fn progress_bar(on: bool, total: u64) -> indicatif::ProgressBar {
    if !on {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "converting [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar
}

/// The manifest to continue from: empty for a fresh output; the existing
/// one with `resume` when it was made from the same input and policy.
fn load_manifest(
    path: &Path,
    opts: &ConvertOptions,
    fingerprint: &InputFingerprint,
) -> Result<Manifest> {
    let fresh = Manifest {
        format: FORMAT_VERSION.into(),
        input: opts.input.clone(),
        policy: opts.policy.summary()
            + &opts
                .importance
                .as_ref()
                .map(Weighting::summary)
                .unwrap_or_default(),
        ..Manifest::default()
    };
    if !path.exists() {
        return Ok(fresh);
    }
    let text = crate::fs::read_to_string(path, crate::fs::read::JSON_SIDE_FILE)?;
    if !opts.resume {
        return Err(Error::OutputOccupied {
            path: opts.output.clone(),
            conversion: true,
        });
    }
    let m: Manifest = serde_json::from_str(&text)
        .map_err(|e| Error::config(path, "(file)", format!("not a conversion manifest: {e}")))?;
    if m.policy != fresh.policy || m.format != fresh.format {
        return Err(Error::config(
            path,
            "policy",
            format!(
                "the conversion was started with `{}`, this run asks for `{}`; use a new output directory",
                m.policy, fresh.policy
            ),
        ));
    }
    let why = match &m.input_fingerprint {
        None => Some("the manifest does not record its input (an older version)".to_string()),
        Some(recorded) => recorded.difference(fingerprint),
    };
    if let Some(why) = why {
        return Err(Error::config(
            path,
            "input_fingerprint",
            format!(
                "the conversion was made from {}, not from this input: {why}; use a new output directory",
                m.input.display()
            ),
        ));
    }
    Ok(m)
}

fn save_manifest(path: &Path, m: &Manifest) -> Result<()> {
    let text = serde_json::to_vec_pretty(m).expect("the manifest serializes");
    crate::fs::write(path, &text)
}

/// Whether `path` is the finished file the manifest records: its length and
/// header agree with the plan, and its data with the recorded checksum (a
/// file damaged after it was finished is redone).
fn finished(path: &Path, layout: &Layout, rec: &FileRecord) -> bool {
    let Ok(md) = std::fs::metadata(path) else {
        return false;
    };
    let Ok(sum) = u64::from_str_radix(&rec.checksum, 16) else {
        return false;
    };
    md.len() == rec.bytes && md.len() == layout.file_len() && verify(path, layout, sum).is_ok()
}

fn header_matches(path: &Path, layout: &Layout) -> Result<()> {
    let entries = crate::formats::weights::index::read_header(path)?;
    let found: HashMap<&str, _> = entries.iter().map(|(n, e)| (n.as_str(), e)).collect();
    let start = layout.data_start();
    for t in &layout.tensors {
        let ok = found.get(t.name.as_str()).is_some_and(|e| {
            e.offset == start + t.offset
                && e.len as u64 == t.len
                && header_shape(e) == t.shape
                && format!("{:?}", e.stored) == t.dtype
        });
        if !ok {
            return Err(Error::Shard {
                path: path.to_path_buf(),
                reason: format!("read back: tensor `{}` is not where it was written", t.name),
            });
        }
    }
    if entries.len() != layout.tensors.len() {
        return Err(Error::Shard {
            path: path.to_path_buf(),
            reason: "read back: the header holds tensors that were not written".into(),
        });
    }
    Ok(())
}

/// The shape `e`'s header spells: a block tensor's `[rows, row bytes]`
/// (its entry holds the logical `[rows, cols]`).
fn header_shape(e: &crate::formats::weights::TensorEntry) -> Vec<usize> {
    match (e.ggml, e.shape.first()) {
        (Some(_), Some(&rows)) if rows > 0 => vec![rows, e.len / rows],
        _ => e.shape.clone(),
    }
}

/// Reads a written file back: header as planned, data checksum as written.
fn verify(path: &Path, layout: &Layout, sum: u64) -> Result<()> {
    header_matches(path, layout)?;
    use std::io::{Read, Seek, SeekFrom};
    let mut f = crate::fs::open(path)?;
    f.seek(SeekFrom::Start(layout.data_start()))
        .map_err(|e| Error::file(path, e))?;
    let mut check = Checksum::default();
    let mut buf = vec![0u8; 8 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| Error::file(path, e))?;
        if n == 0 {
            break;
        }
        check.update(&buf[..n]);
    }
    if check.finish() != sum {
        return Err(Error::Shard {
            path: path.to_path_buf(),
            reason: "read back: the data differs from what was written".into(),
        });
    }
    Ok(())
}

fn write_index_json(out: &Path, plan: &OutputPlan) -> Result<()> {
    let mut map = serde_json::Map::new();
    let mut total = 0u64;
    for (fname, layout, _) in &plan.files {
        for t in &layout.tensors {
            if !t.name.starts_with("__pad__.") {
                map.insert(t.name.clone(), fname.clone().into());
                total += t.len;
            }
        }
    }
    let v = serde_json::json!({"metadata": {"total_size": total}, "weight_map": map});
    let path = out.join("model.safetensors.index.json");
    crate::fs::write(
        &path,
        &serde_json::to_vec_pretty(&v).expect("JSON serializes"),
    )
}

/// Writes the metadata files a GGUF's header derives (config.json,
/// tokenizer.json, tokenizer_config.json with the chat template).
fn write_derived_files(input: &Path, out: &Path) -> Result<()> {
    for name in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        if let Some(doc) = crate::formats::model_files::read(input, name)? {
            crate::fs::write(&out.join(name), doc.text.as_bytes())?;
        }
    }
    Ok(())
}

/// Copies config and tokenizer files (every regular file but the shards
/// and their index). config.json loses its `quantization_config`: the
/// container's own metadata says how each tensor is stored.
fn copy_side_files(input: &Path, out: &Path) -> Result<()> {
    let rd = std::fs::read_dir(input).map_err(|e| Error::file(input, e))?;
    for ent in rd {
        let p = ent.map_err(|e| Error::file(input, e))?.path();
        let Some(name) = p.file_name().map(|n| n.to_string_lossy().to_string()) else {
            continue;
        };
        if !p.is_file()
            || name.ends_with(".safetensors")
            || name == "model.safetensors.index.json"
            || name == MANIFEST
        {
            continue;
        }
        let bytes = crate::fs::read(&p, crate::fs::read::SIDE_FILE)?;
        let bytes = if name == "config.json" {
            let mut v: serde_json::Value = serde_json::from_slice(&bytes)
                .map_err(|e| Error::config(&p, "(file)", format!("not valid JSON: {e}")))?;
            if let Some(o) = v.as_object_mut() {
                o.remove("quantization_config");
            }
            serde_json::to_vec_pretty(&v).expect("JSON serializes")
        } else {
            bytes
        };
        crate::fs::write(&out.join(&name), &bytes)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_groups_and_part_ranks() {
        let g = expert_group("model.layers.3.mlp.experts.12.down_proj.weight").unwrap();
        assert_eq!(g, ("model.layers.3.mlp.experts.12.".to_string(), 2));
        let g = expert_group("model.layers.0.block_sparse_moe.experts.1.w3.weight").unwrap();
        assert_eq!(g.1, 1);
        assert!(expert_group("model.layers.0.mlp.shared_experts.up_proj.weight").is_none());
        assert!(natural_key("a.experts.9.") < natural_key("a.experts.10."));
    }
}
