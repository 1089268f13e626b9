//! The trace file: a run writes its rows to a part file of its own
//! (`FILE.part-PID-N`, through [`crate::fs::Output`]: removed on any
//! error), then [`TraceWriter::finish`] appends them to
//! `FILE` under an exclusive lock (`FILE.lock`): the rows `FILE` already
//! holds are copied into a temp file, this run's after them, and the temp
//! file renamed over `FILE`. Readers never see a half-written trace, and
//! runs finishing at once (two servers, a tune's successive loads) all
//! land, one after another. Files other tools wrote in this schema (a
//! filtered trace saved by pyarrow) are read too: their list item fields
//! are renamed to ours.

use super::{schema, Result, TraceError, DEEPER_GUESSES, VERSION, VERSION_KEY};
use crate::fs::lock::Lock;
use crate::fs::Output;
use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, ListArray, RecordBatch};
use arrow_schema::{DataType, Field};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Rows per Parquet row group (a reader's unit of work).
const ROW_GROUP_ROWS: usize = 1 << 18;

/// Part files this process has opened (part names stay unique).
static PARTS: AtomicU64 = AtomicU64::new(0);

/// One run's rows on their way into a trace file.
pub struct TraceWriter {
    path: PathBuf,
    part: PathBuf,
    writer: Option<ArrowWriter<Output>>,
    rows: u64,
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    s.into()
}

fn properties() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .set_key_value_metadata(Some(vec![KeyValue::new(
            VERSION_KEY.to_owned(),
            VERSION.to_owned(),
        )]))
        .build()
}

/// The most bytes a trace file may hold (a read refuses a larger one).
pub const TRACE: crate::fs::Cap = crate::fs::Cap {
    what: "trace",
    bytes: 1 << 40,
};

fn fs_err(path: &Path, e: crate::Error) -> TraceError {
    match e {
        crate::Error::File { source, .. } => TraceError::io(path, source),
        crate::Error::FileRefused { reason, .. } => TraceError::format(path, reason),
        e => TraceError::format(path, e.to_string()),
    }
}

fn open_writer(path: &Path) -> Result<ArrowWriter<Output>> {
    let out = Output::create(path).map_err(|e| fs_err(path, e))?;
    ArrowWriter::try_new(out, schema(), Some(properties()))
        .map_err(|e| TraceError::parquet(path, e))
}

/// Writes the footer, then syncs and renames the file into place (the
/// temp file is removed on an error).
fn close_writer(w: ArrowWriter<Output>, path: &Path) -> Result<()> {
    let out = w.into_inner().map_err(|e| TraceError::parquet(path, e))?;
    out.finish().map_err(|e| fs_err(path, e))
}

impl TraceWriter {
    /// Starts a run's rows for the trace at `path` (its directory must
    /// exist; the file itself is touched only by [`TraceWriter::finish`]).
    pub fn create(path: &Path) -> Result<TraceWriter> {
        let n = PARTS.fetch_add(1, Ordering::Relaxed);
        let part = with_suffix(path, &format!(".part-{}-{n}", std::process::id()));
        let writer = open_writer(&part)?;
        Ok(TraceWriter {
            path: path.to_owned(),
            part,
            writer: Some(writer),
            rows: 0,
        })
    }

    /// The trace file the rows go to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `batch` (of [`schema`]) to the run's part file.
    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let w = self.writer.as_mut().expect("a finished trace writer");
        w.write(batch)
            .map_err(|e| TraceError::parquet(&self.part, e))?;
        self.rows += batch.num_rows() as u64;
        Ok(())
    }

    /// Closes the run's part file and appends its rows to the trace file;
    /// returns the rows this run added.
    pub fn finish(mut self) -> Result<u64> {
        let w = self.writer.take().expect("a trace writer finishes once");
        close_writer(w, &self.part)?;
        let appended = append(&self.path, &self.part);
        let _ = std::fs::remove_file(&self.part);
        appended.map(|()| self.rows)
    }
}

impl Drop for TraceWriter {
    fn drop(&mut self) {
        // Not finished (an error on the way): leave no part file behind.
        if self.writer.take().is_some() {
            let _ = std::fs::remove_file(&self.part);
        }
    }
}

/// Appends the rows of the part file `part` to the trace at `path`.
fn append(path: &Path, part: &Path) -> Result<()> {
    let _lock = Lock::exclusive(&with_suffix(path, ".lock"))
        .map_err(|e| TraceError::format(path, e.to_string()))?;
    if !path.exists() {
        return std::fs::rename(part, path).map_err(|e| TraceError::io(path, e));
    }
    // Dropped on an error, the writer's output removes its temp file.
    let mut out = open_writer(path)?;
    for from in [path, part] {
        for batch in batches(from)? {
            out.write(&batch?)
                .map_err(|e| TraceError::parquet(path, e))?;
        }
    }
    close_writer(out, path)
}

/// The record batches of the trace at `path`, checked against [`schema`].
/// The Parquet decoder asserts on some malformed files (the fuzz test found
/// a footer that panics inside `parquet`): each call into it runs under
/// [`undecodable`], so a hostile trace is an error naming the file.
pub fn batches(path: &Path) -> Result<impl Iterator<Item = Result<RecordBatch>>> {
    let (file, _) = crate::fs::read::open_capped(path, TRACE).map_err(|e| fs_err(path, e))?;
    let builder = undecodable(path, || ParquetRecordBatchReaderBuilder::try_new(file))?
        .map_err(|e| TraceError::parquet(path, e))?;
    check_schema(path, builder.schema())?;
    let mut reader = undecodable(path, || builder.with_batch_size(1 << 16).build())?
        .map_err(|e| TraceError::parquet(path, e))?;
    let path = path.to_owned();
    let want = schema();
    Ok(std::iter::from_fn(move || {
        let next = match undecodable(&path, || reader.next()) {
            Ok(next) => next?,
            Err(e) => return Some(Err(e)),
        };
        // Our schema exactly (the file's may carry extra metadata).
        Some(next.map_err(|e| TraceError::arrow(&path, e)).and_then(|b| {
            let columns = want
                .fields()
                .iter()
                .map(|f| match b.column_by_name(f.name()) {
                    Some(c) => conform(c, f),
                    // A version-1 file: no deeper guesses.
                    None => Ok(arrow_array::new_null_array(f.data_type(), b.num_rows())),
                })
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| TraceError::arrow(&path, e))?;
            RecordBatch::try_new(want.clone(), columns).map_err(|e| TraceError::arrow(&path, e))
        }))
    }))
}

/// Runs a call into the Parquet decoder, turning its panic into an error
/// naming the file.
pub(super) fn undecodable<T>(
    path: &Path,
    f: impl FnOnce() -> T,
) -> std::result::Result<T, TraceError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|panic| {
        let why = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("a panic");
        TraceError::Format {
            path: path.to_owned(),
            what: format!("not a readable Parquet trace (the decoder failed: {why})"),
        }
    })
}

/// `t` with every list's item field named and nullable as [`schema`]
/// has it (other writers name it `element`).
fn plain(t: &DataType) -> DataType {
    match t {
        DataType::List(f) => {
            DataType::List(Arc::new(Field::new_list_field(plain(f.data_type()), true)))
        }
        t => t.clone(),
    }
}

/// `a` as [`schema`]'s `field` has it (list item fields renamed).
fn conform(a: &ArrayRef, field: &Field) -> std::result::Result<ArrayRef, arrow_schema::ArrowError> {
    match (a.data_type(), field.data_type()) {
        (DataType::List(have), DataType::List(want)) if have != want => {
            let l = a.as_list::<i32>();
            let values = conform(l.values(), want)?;
            Ok(Arc::new(ListArray::try_new(
                want.clone(),
                l.offsets().clone(),
                values,
                l.nulls().cloned(),
            )?))
        }
        _ => Ok(a.clone()),
    }
}

/// Refuses a file whose columns are not this version's (version 1's,
/// without [`DEEPER_GUESSES`], are read too).
fn check_schema(path: &Path, found: &arrow_schema::Schema) -> Result<()> {
    let want = schema();
    for f in want.fields() {
        match found.field_with_name(f.name()) {
            Ok(g) if plain(g.data_type()) == plain(f.data_type()) => {}
            Ok(g) => {
                return Err(TraceError::format(
                    path,
                    format!(
                        "column `{}` is {}, not {} (not a moestream trace of version {VERSION})",
                        f.name(),
                        g.data_type(),
                        f.data_type()
                    ),
                ))
            }
            Err(_) if DEEPER_GUESSES.contains(&f.name().as_str()) => {}
            Err(_) => {
                return Err(TraceError::format(
                    path,
                    format!(
                        "no column `{}` (not a moestream trace of version {VERSION})",
                        f.name()
                    ),
                ))
            }
        }
    }
    Ok(())
}
