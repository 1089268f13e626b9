//! Routing traces: what every MoE layer's router chose for every token, and
//! what the expert cache did about it, as Parquet (docs/TRACE.md has the
//! schema; pandas and polars read it directly).
//!
//! - [`record`]: the store's recorder (`--trace FILE`), one row per token ×
//!   MoE layer, written when the layer's fetch finishes.
//! - [`write`](mod@write): the Parquet file: this run's rows go to a private part file
//!   while it runs; when it ends they are appended to `FILE` (the rows
//!   already there copied first, under a lock), so several runs'
//!   traces concatenate, told apart by the `run` column.
//! - [`read`]: a trace back into per-layer accesses for `moestream replay`.
//!
//! Recording is off unless asked for: the store holds an `Option`, checked
//! once per layer, and allocates nothing for it when off.

pub mod read;
pub mod record;
pub mod write;

use arrow_schema::{DataType, Field, Schema, SchemaRef};
use std::sync::Arc;

/// The trace format's version, in the file's key-value metadata under
/// [`VERSION_KEY`].
/// Version 2 added [`DEEPER_GUESSES`]; a version-1 file (without them) is
/// read as if they were null.
pub const VERSION: &str = "2";
pub const VERSION_KEY: &str = "moestream.trace.version";

/// The columns a version-1 trace lacks: the lookahead's guesses from two
/// decoder layers back (attn, output), what `--prefetch-depth 2` reads.
pub const DEEPER_GUESSES: [&str; 2] = ["guess_attn_2", "guess_output_2"];

/// Lookahead guesses a row holds: per depth (1, 2) and variant (attn,
/// output), `depth_index * 2 + variant`.
pub const GUESSES: usize = 4;

/// Where a chosen expert came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// A pinned cache slot (the hot tier).
    Pinned,
    /// An unpinned cache slot (the warm tier).
    Warm,
    /// Not cached; a lookahead prefetch had read it (or was reading it).
    Prefetched,
    /// Not cached; read on demand.
    Miss,
}

impl Tier {
    pub fn name(self) -> &'static str {
        match self {
            Tier::Pinned => "pinned",
            Tier::Warm => "warm",
            Tier::Prefetched => "prefetched",
            Tier::Miss => "miss",
        }
    }

    pub fn from_name(s: &str) -> Option<Tier> {
        [Tier::Pinned, Tier::Warm, Tier::Prefetched, Tier::Miss]
            .into_iter()
            .find(|t| t.name() == s)
    }
}

fn list(name: &str, item: DataType, nullable: bool) -> Field {
    Field::new_list(name, Field::new_list_field(item, true), nullable)
}

/// The trace's Arrow schema (docs/TRACE.md explains each column).
pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("run", DataType::Utf8, false),
        Field::new("step", DataType::UInt64, false),
        Field::new("token", DataType::UInt64, false),
        Field::new("layer", DataType::UInt32, false),
        Field::new("row", DataType::UInt32, false),
        list("experts", DataType::UInt32, false),
        list("weights", DataType::Float32, false),
        Field::new("margin", DataType::Float32, false),
        list("guess_attn", DataType::UInt32, true),
        list("guess_output", DataType::UInt32, true),
        list("tier", DataType::Utf8, false),
        list("bytes_read", DataType::UInt64, false),
        list("read_us", DataType::UInt64, false),
        Field::new("slots", DataType::UInt32, false),
        Field::new("n_experts", DataType::UInt32, false),
        Field::new("expert_bytes", DataType::UInt64, false),
        list(DEEPER_GUESSES[0], DataType::UInt32, true),
        list(DEEPER_GUESSES[1], DataType::UInt32, true),
    ]))
}

/// A run's id: UTC start time and process id (unique across the runs one
/// file concatenates).
pub fn run_id() -> String {
    format!(
        "{}-{}",
        chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ"),
        std::process::id()
    )
}

/// Trace errors: the file and what failed.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("trace {path}: {source}")]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("trace {path}: {source}")]
    Parquet {
        path: std::path::PathBuf,
        source: parquet::errors::ParquetError,
    },
    #[error("trace {path}: {source}")]
    Arrow {
        path: std::path::PathBuf,
        source: arrow_schema::ArrowError,
    },
    #[error("trace {path}: {what}")]
    Format {
        path: std::path::PathBuf,
        what: String,
    },
}

impl TraceError {
    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> TraceError {
        TraceError::Io {
            path: path.to_owned(),
            source,
        }
    }

    pub(crate) fn parquet(
        path: &std::path::Path,
        source: parquet::errors::ParquetError,
    ) -> TraceError {
        TraceError::Parquet {
            path: path.to_owned(),
            source,
        }
    }

    pub(crate) fn arrow(path: &std::path::Path, source: arrow_schema::ArrowError) -> TraceError {
        TraceError::Arrow {
            path: path.to_owned(),
            source,
        }
    }

    pub(crate) fn format(path: &std::path::Path, what: impl Into<String>) -> TraceError {
        TraceError::Format {
            path: path.to_owned(),
            what: what.into(),
        }
    }
}

pub type Result<T> = std::result::Result<T, TraceError>;

#[cfg(test)]
mod tests {
    use super::record::{LayerShape, Recorder};
    use super::write::batches;
    use super::*;
    use arrow_array::cast::AsArray;
    use arrow_array::types::UInt64Type;
    use arrow_array::{Array, ArrayRef, ListArray, RecordBatch};

    /// One fetch of two rows in layer 1 (layer 0 dense): expert 3 chosen by
    /// both rows (a warm hit), 5 by row 0 (a miss read in 40 µs), 7 by row
    /// 1 (a landed prefetch).
    fn record(path: &std::path::Path, run: &str) {
        let shapes = vec![
            LayerShape {
                n_experts: 0,
                expert_bytes: 0,
            },
            LayerShape {
                n_experts: 8,
                expert_bytes: 1000,
            },
        ];
        let mut r = Recorder::new(path, run.into(), shapes).unwrap();
        r.route(1, &[5, 3], &[0.75, 0.25], 0.5);
        r.route(1, &[3, 7], &[0.5, 0.5], 0.0);
        r.looked_up(1, 3, Tier::Warm, 0);
        r.looked_up(1, 5, Tier::Miss, 0);
        r.looked_up(1, 7, Tier::Prefetched, 1000);
        r.read(1, 5, 1000, 40);
        r.end_fetch(1, 4);
        r.end_step(2);
        // A decode row with both guesses.
        r.guess(1, 0, &[3, 6]);
        r.guess(1, 1, &[3, 5]);
        r.guess(1, 3, &[6, 2]);
        r.route(1, &[3, 6], &[0.5, 0.5], 0.1);
        r.looked_up(1, 3, Tier::Warm, 0);
        r.looked_up(1, 6, Tier::Miss, 0);
        r.read(1, 6, 1000, 30);
        r.end_fetch(1, 4);
        r.end_step(1);
        r.finish().unwrap();
    }

    /// Writes `b` as a plain parquet file (as another tool would).
    fn write_parquet(path: &std::path::Path, b: &RecordBatch) {
        let file = std::fs::File::create(path).unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(file, b.schema(), None).unwrap();
        w.write(b).unwrap();
        w.close().unwrap();
    }

    fn rows(path: &std::path::Path) -> Vec<RecordBatch> {
        batches(path).unwrap().map(|b| b.unwrap()).collect()
    }

    #[test]
    fn rows_charge_a_fetchs_reads_to_the_first_row_and_runs_concatenate() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        record(&path, "a");
        record(&path, "b");
        let b = rows(&path);
        assert_eq!(b.len(), 1, "small traces read back as one batch");
        let b = &b[0];
        assert_eq!(b.num_rows(), 6);
        // Run b's rows follow run a's.
        let col = |n: &str| b.column_by_name(n).unwrap().slice(3, 3);
        assert_eq!(col("run").as_string::<i32>().value(0), "b");
        let token = col("token");
        assert_eq!(token.as_primitive::<UInt64Type>().values(), &[0, 1, 2]);
        let list = |n: &str, i: usize| -> Vec<u64> {
            let l = col(n);
            let v = l.as_list::<i32>().value(i);
            let v = v.as_primitive::<UInt64Type>();
            v.iter().map(|v| v.unwrap_or(u64::MAX)).collect()
        };
        assert_eq!(list("bytes_read", 0), [1000, 0]); // 5 read, 3 a hit
        assert_eq!(list("bytes_read", 1), [0, 1000]); // 3 charged already, 7 prefetched
        assert_eq!(list("read_us", 0), [40, u64::MAX]);
        assert_eq!(list("read_us", 1), [u64::MAX, u64::MAX]);
        let tier = col("tier");
        let tier = tier.as_list::<i32>().value(1);
        let tier = tier.as_string::<i32>();
        assert_eq!((tier.value(0), tier.value(1)), ("warm", "prefetched"));
        // Guesses only on the single-row fetch.
        let g = col("guess_output");
        assert!(g.is_null(0) && g.is_null(1));
        let g2 = g.as_list::<i32>().value(2);
        let g2 = g2.as_primitive::<arrow_array::types::UInt32Type>();
        assert_eq!(g2.values(), &[3, 5]);
        let runs = read::read(&path, None).unwrap();
        assert_eq!(runs.len(), 2);
        let r = &runs[1];
        assert_eq!(r.tokens, 3);
        assert_eq!(r.recorded.hits, 2);
        assert_eq!(r.recorded.misses, 3);
        assert_eq!(r.recorded.prefetched, 1);
        assert_eq!(r.recorded.bytes_read, 3000);
        let l = &r.layers[1];
        assert_eq!(l.ids, [3, 5, 7, 3, 6]);
        assert_eq!(l.next, [1, u64::MAX, u64::MAX, u64::MAX, u64::MAX]);
        assert_eq!(l.fetches[1].clock, 2);
        // The output guess from two layers back; none from attn.
        let f = &l.fetches[1];
        let deeper = f.deeper[1].clone().map(|g| l.guesses[g].to_vec());
        assert_eq!((f.deeper[0].clone(), deeper), (None, Some(vec![6, 2])));
        assert!(l.fetches[0].deeper.iter().all(Option::is_none));
        assert_eq!(read::read(&path, Some("a")).unwrap().len(), 1);
    }

    /// A version-1 trace (no deeper guesses) reads with them null, and a
    /// run appended to it lands after its rows.
    #[test]
    fn a_version_1_trace_reads_and_takes_new_runs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        record(&path, "a");
        let ours = rows(&path).remove(0);
        let keep: Vec<usize> = (0..ours.num_columns())
            .filter(|&i| !DEEPER_GUESSES.contains(&ours.schema().field(i).name().as_str()))
            .collect();
        let v1 = ours.project(&keep).unwrap();
        write_parquet(&path, &v1);
        let runs = read::read(&path, None).unwrap();
        let f = &runs[0].layers[1].fetches[1];
        assert!(f.guess[1].is_some() && f.deeper.iter().all(Option::is_none));
        record(&path, "b");
        let runs = read::read(&path, None).unwrap();
        let ids: Vec<&str> = runs.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        assert!(runs[0].layers[1].fetches[1].deeper[1].is_none());
        assert!(runs[1].layers[1].fetches[1].deeper[1].is_some());
    }

    /// A trace another tool rewrote (pyarrow names list items `element`)
    /// reads back the same.
    #[test]
    fn list_item_names_of_other_writers_are_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        record(&path, "a");
        let ours = rows(&path).remove(0);
        let rename = |a: &ArrayRef| -> ArrayRef {
            match a.data_type() {
                DataType::List(f) => {
                    let l = a.as_list::<i32>();
                    let item = Arc::new(Field::new("element", f.data_type().clone(), true));
                    Arc::new(
                        ListArray::try_new(
                            item,
                            l.offsets().clone(),
                            l.values().clone(),
                            l.nulls().cloned(),
                        )
                        .unwrap(),
                    )
                }
                _ => a.clone(),
            }
        };
        let columns: Vec<ArrayRef> = ours.columns().iter().map(rename).collect();
        let fields: Vec<Field> = ours
            .schema()
            .fields()
            .iter()
            .zip(&columns)
            .map(|(f, c)| Field::new(f.name(), c.data_type().clone(), f.is_nullable()))
            .collect();
        let theirs = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
        let other = dir.path().join("other.parquet");
        write_parquet(&other, &theirs);
        assert_eq!(rows(&other), [ours]);
    }

    #[test]
    fn another_schema_is_refused_by_column() {
        let dir = tempfile::tempdir().unwrap();
        let other = dir.path().join("x.parquet");
        let a: ArrayRef = Arc::new(arrow_array::UInt32Array::from(vec![1, 2]));
        let b = RecordBatch::try_from_iter([("run", a)]).unwrap();
        write_parquet(&other, &b);
        let e = batches(&other).err().unwrap().to_string();
        assert!(e.contains("column `run` is UInt32"), "{e}");
    }

    #[test]
    fn a_panic_inside_the_parquet_decoder_is_an_error_naming_the_file() {
        let path = std::path::Path::new("/tmp/t.parquet");
        let e = super::write::undecodable(path, || -> u32 { panic!("assertion failed: x") })
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/tmp/t.parquet") && e.contains("assertion failed"),
            "{e}"
        );
        assert_eq!(super::write::undecodable(path, || 7).unwrap(), 7);
    }
}
