//! The recorder behind `--trace`: the store reports what happens to each
//! MoE layer's fetch (the rows' routes, the lookahead's guesses, each
//! expert's tier, the bytes and latency of its read), and when the fetch
//! finishes the recorder writes one row per token of it.
//!
//! A fetch serves every row (token) of a forward at once: each expert of
//! the union is looked up and read once. Its tier is the same for every
//! row that chose it; its bytes and latency are charged to the first row
//! that chose it (later rows get 0 bytes and a null latency), so summing
//! `bytes_read` over rows gives the bytes the run read.

use super::write::TraceWriter;
use super::{schema, Result, Tier, TraceError, GUESSES};
use arrow_array::builder::{
    Float32Builder, ListBuilder, StringBuilder, UInt32Builder, UInt64Builder,
};
use arrow_array::{ArrayRef, RecordBatch};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Rows buffered before they are handed to the Parquet writer.
const BATCH_ROWS: usize = 8192;

/// What one layer has seen since its last fetch finished.
#[derive(Default)]
struct LayerRows {
    /// Every row's chosen experts and weights, one after another.
    experts: Vec<u32>,
    weights: Vec<f32>,
    /// Per row: (start in `experts`, count, router margin).
    rows: Vec<(usize, usize, f32)>,
    /// Per lookahead depth and variant (`depth_index * 2 + variant`): the
    /// guess for this layer, if one is pending (kept for a single-row
    /// fetch, as the recall stats score it).
    guess: [(bool, Vec<u32>); GUESSES],
    /// Per expert of the fetch's union.
    fetched: Vec<Fetched>,
}

/// One expert of a fetch.
struct Fetched {
    expert: usize,
    tier: Tier,
    bytes: u64,
    read_us: Option<u64>,
    /// Whether a row has been charged its bytes.
    charged: bool,
}

/// The layer facts every row repeats.
#[derive(Clone, Copy, Debug)]
pub struct LayerShape {
    pub n_experts: u32,
    /// Bytes one expert of the layer reads.
    pub expert_bytes: u64,
}

/// The trace's columns being filled.
struct Columns {
    run: StringBuilder,
    step: UInt64Builder,
    token: UInt64Builder,
    layer: UInt32Builder,
    row: UInt32Builder,
    experts: ListBuilder<UInt32Builder>,
    weights: ListBuilder<Float32Builder>,
    margin: Float32Builder,
    /// In [`GUESSES`] order; the deeper two are the schema's last columns.
    guess: [ListBuilder<UInt32Builder>; GUESSES],
    tier: ListBuilder<StringBuilder>,
    bytes_read: ListBuilder<UInt64Builder>,
    read_us: ListBuilder<UInt64Builder>,
    slots: UInt32Builder,
    n_experts: UInt32Builder,
    expert_bytes: UInt64Builder,
    len: usize,
}

impl Columns {
    fn new() -> Columns {
        Columns {
            run: StringBuilder::new(),
            step: UInt64Builder::new(),
            token: UInt64Builder::new(),
            layer: UInt32Builder::new(),
            row: UInt32Builder::new(),
            experts: ListBuilder::new(UInt32Builder::new()),
            weights: ListBuilder::new(Float32Builder::new()),
            margin: Float32Builder::new(),
            guess: std::array::from_fn(|_| ListBuilder::new(UInt32Builder::new())),
            tier: ListBuilder::new(StringBuilder::new()),
            bytes_read: ListBuilder::new(UInt64Builder::new()),
            read_us: ListBuilder::new(UInt64Builder::new()),
            slots: UInt32Builder::new(),
            n_experts: UInt32Builder::new(),
            expert_bytes: UInt64Builder::new(),
            len: 0,
        }
    }

    /// The rows so far as one batch; the builders start over.
    fn batch(&mut self) -> std::result::Result<RecordBatch, arrow_schema::ArrowError> {
        self.len = 0;
        let [g0, g1, g2, g3] = &mut self.guess;
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.run.finish()),
            Arc::new(self.step.finish()),
            Arc::new(self.token.finish()),
            Arc::new(self.layer.finish()),
            Arc::new(self.row.finish()),
            Arc::new(self.experts.finish()),
            Arc::new(self.weights.finish()),
            Arc::new(self.margin.finish()),
            Arc::new(g0.finish()),
            Arc::new(g1.finish()),
            Arc::new(self.tier.finish()),
            Arc::new(self.bytes_read.finish()),
            Arc::new(self.read_us.finish()),
            Arc::new(self.slots.finish()),
            Arc::new(self.n_experts.finish()),
            Arc::new(self.expert_bytes.finish()),
            Arc::new(g2.finish()),
            Arc::new(g3.finish()),
        ];
        RecordBatch::try_new(schema(), columns)
    }
}

/// Records one run's trace (see the module docs).
pub struct Recorder {
    writer: Option<TraceWriter>,
    run: String,
    /// Forwards finished since recording began.
    step: u64,
    /// Tokens forwarded since recording began (the usage clock's advance).
    token: u64,
    layers: Vec<LayerRows>,
    shapes: Vec<LayerShape>,
    cols: Columns,
    /// The first write error; recording stops there and `finish` reports it.
    error: Option<TraceError>,
}

impl Recorder {
    /// Starts recording run `run` of a store whose layers have `shapes`
    /// into the trace at `path`.
    pub fn new(path: &Path, run: String, shapes: Vec<LayerShape>) -> Result<Recorder> {
        Ok(Recorder {
            writer: Some(TraceWriter::create(path)?),
            run,
            step: 0,
            token: 0,
            layers: shapes.iter().map(|_| LayerRows::default()).collect(),
            shapes,
            cols: Columns::new(),
            error: None,
        })
    }

    /// The run's id.
    pub fn run(&self) -> &str {
        &self.run
    }

    /// One row's routing in `layer`: chosen experts (best first), their
    /// weights, and the router's top-k margin.
    pub fn route(&mut self, layer: usize, experts: &[usize], weights: &[f32], margin: f32) {
        let l = &mut self.layers[layer];
        l.rows.push((l.experts.len(), experts.len(), margin));
        l.experts.extend(experts.iter().map(|&e| e as u32));
        l.weights.extend_from_slice(weights);
    }

    /// A lookahead guess of `layer`'s experts: `which` is
    /// `depth_index * 2 + variant` (variant 0 = attn, 1 = output; depth
    /// index 0 from the layer before, 1 from two layers before).
    pub fn guess(&mut self, layer: usize, which: usize, experts: &[usize]) {
        let (pending, g) = &mut self.layers[layer].guess[which];
        g.clear();
        g.extend(experts.iter().map(|&e| e as u32));
        *pending = true;
    }

    /// `expert` of the layer's fetch was found in `tier`; `bytes` already
    /// read for it (a prefetch that had landed), else 0.
    pub fn looked_up(&mut self, layer: usize, expert: usize, tier: Tier, bytes: u64) {
        self.layers[layer].fetched.push(Fetched {
            expert,
            tier,
            bytes,
            read_us: None,
            charged: false,
        });
    }

    /// A read of `expert` the fetch waited on landed: its bytes and its
    /// latency from submission, µs.
    pub fn read(&mut self, layer: usize, expert: usize, bytes: u64, read_us: u64) {
        if let Some(f) = self.layers[layer]
            .fetched
            .iter_mut()
            .find(|f| f.expert == expert)
        {
            f.bytes = bytes;
            f.read_us = Some(read_us);
        }
    }

    /// The layer's fetch finished with `slots` usable cache slots: writes
    /// its rows.
    pub fn end_fetch(&mut self, layer: usize, slots: usize) {
        let mut l = std::mem::take(&mut self.layers[layer]);
        let single = l.rows.len() == 1;
        for (row, &(start, n, margin)) in l.rows.iter().enumerate() {
            let c = &mut self.cols;
            c.run.append_value(&self.run);
            c.step.append_value(self.step);
            c.token.append_value(self.token + row as u64);
            c.layer.append_value(layer as u32);
            c.row.append_value(row as u32);
            c.experts
                .values()
                .append_slice(&l.experts[start..start + n]);
            c.experts.append(true);
            c.weights
                .values()
                .append_slice(&l.weights[start..start + n]);
            c.weights.append(true);
            c.margin.append_value(margin);
            for (b, (pending, g)) in c.guess.iter_mut().zip(&l.guess) {
                if single && *pending {
                    b.values().append_slice(g);
                    b.append(true);
                } else {
                    b.append_null();
                }
            }
            for &e in &l.experts[start..start + n] {
                let f = l.fetched.iter_mut().find(|f| f.expert == e as usize);
                let (tier, bytes, us) = match f {
                    Some(f) if !f.charged => {
                        f.charged = true;
                        (f.tier, f.bytes, f.read_us)
                    }
                    Some(f) => (f.tier, 0, None),
                    // A row's expert outside the fetch: never (the fetch
                    // is the rows' union).
                    None => (Tier::Miss, 0, None),
                };
                c.tier.values().append_value(tier.name());
                c.bytes_read.values().append_value(bytes);
                c.read_us.values().append_option(us);
            }
            c.tier.append(true);
            c.bytes_read.append(true);
            c.read_us.append(true);
            c.slots.append_value(slots as u32);
            c.n_experts.append_value(self.shapes[layer].n_experts);
            c.expert_bytes.append_value(self.shapes[layer].expert_bytes);
            c.len += 1;
        }
        // Reuse the layer's vectors (their capacity) for its next fetch.
        l.experts.clear();
        l.weights.clear();
        l.rows.clear();
        l.fetched.clear();
        for (pending, _) in &mut l.guess {
            *pending = false;
        }
        self.layers[layer] = l;
        if self.cols.len >= BATCH_ROWS {
            self.flush();
        }
    }

    /// A forward of `tokens` tokens finished.
    pub fn end_step(&mut self, tokens: u64) {
        self.step += 1;
        self.token += tokens;
    }

    /// Hands the buffered rows to the writer (recording stops at the first
    /// error).
    fn flush(&mut self) {
        if self.cols.len == 0 || self.error.is_some() {
            return;
        }
        let Some(w) = self.writer.as_mut() else {
            return;
        };
        let written = match self.cols.batch() {
            Ok(batch) => w.write(&batch),
            Err(e) => Err(TraceError::arrow(w.path(), e)),
        };
        if let Err(e) = written {
            self.error = Some(e);
        }
    }

    /// Writes what is left and appends the run to the trace file: the rows
    /// added and the file.
    pub fn finish(&mut self) -> Result<(u64, PathBuf)> {
        self.flush();
        let w = self.writer.take().expect("a recorder finishes once");
        let path = w.path().to_owned();
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        Ok((w.finish()?, path))
    }
}

impl Drop for Recorder {
    /// A recorder not finished explicitly finishes when the store goes
    /// (the end of `run`, `bench`, a server's shutdown).
    fn drop(&mut self) {
        if self.writer.is_none() {
            return;
        }
        match self.finish() {
            Ok((rows, path)) => eprintln!(
                "trace: {rows} rows of run {} appended to {}",
                self.run,
                path.display()
            ),
            Err(e) => eprintln!("warning: trace not written: {e}"),
        }
    }
}
