//! The raw disk sweep behind `moestream bench io`: random reads over a set
//! of files for every (read mode × block size × queue depth) cell, one
//! [`SweepRow`] per cell, plus its CSV and SVG renderings.
//!
//! What this module owns:
//! - the cell loop ([`sweep`]): before each cell the files are dropped from
//!   the page cache (`POSIX_FADV_DONTNEED`, clean pages only), so even the
//!   page-cache modes start from the disk; each cell uses its own offsets
//!   (seed) and runs for `cell_time` or `reads_max` reads, and at least
//!   `depth` reads;
//! - the two engines a cell runs on. `direct` and `buffered` keep `depth`
//!   reads in flight through one io_uring [`Reactor`] (a freed slot is
//!   refilled as soon as its completion is reaped); where io_uring is
//!   unavailable, and for `drop`, `mmap` and `pread`, `depth` threads each
//!   do synchronous reads through [`crate::open_with_pool`] (the bench's
//!   threaded loop). Readers are told [`crate::RangeReader::expect_random`], as
//!   the engine does for expert reads;
//! - per-read latency (submission to completion, nearest-rank p50/p99) and
//!   the bytes the device delivered (`read_bytes` of `/proc/self/io`), so
//!   reads served by the page cache show;
//! - [`write_csv`] and [`sweep_svg`] (GB/s against block size, one panel per
//!   queue depth, one line per mode).
//!
//! Offsets are 4096-aligned and chosen over all files, weighted by size; a
//! read stays inside one file ([`crate::bench`]'s `Targets`), and a file
//! shorter than the block size is skipped for that size. No knowledge of
//! models: the caller picks the files.

use std::cell::RefCell;
use std::fmt;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};

use crate::aligned::align_up;
use crate::bench::{mix, percentile_us, run_threads, Stop, Targets};
use crate::error::IoError;
use crate::file::OpenFile;
use crate::mode::ReadMode;
use crate::plot::{Figure, Panel, Series};
use crate::reactor::{Reactor, ReactorConfig, ReadReq};
use crate::slab::SlabPool;
use crate::source::open_with_pool;

/// The largest queue depth a sweep accepts.
pub const SWEEP_DEPTH_MAX: usize = 4096;

/// What to sweep.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepConfig {
    /// Read modes, in row order.
    pub modes: Vec<ReadMode>,
    /// Block sizes in bytes (each > 0).
    pub read_sizes: Vec<usize>,
    /// Queue depths (each in `1..=SWEEP_DEPTH_MAX`).
    pub depths: Vec<usize>,
    /// How long each cell runs (at least `depth` reads are always made).
    pub cell_time: Duration,
    /// At most this many reads per cell (raised to the depth if lower).
    pub reads_max: Option<u64>,
    /// Seed of the offsets; each cell derives its own from it.
    pub seed: u64,
}

impl Default for SweepConfig {
    fn default() -> Self {
        SweepConfig {
            modes: ReadMode::ALL.to_vec(),
            read_sizes: [1, 2, 4, 8, 16].iter().map(|m| m << 20).collect(),
            depths: vec![1, 2, 4, 8, 16],
            cell_time: Duration::from_secs(1),
            reads_max: None,
            seed: 1,
        }
    }
}

/// How a cell's reads were issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadEngine {
    /// One io_uring reactor keeping `depth` reads in flight.
    IoUring,
    /// `depth` threads, each doing synchronous reads.
    Threads,
}

impl ReadEngine {
    /// The engine's name in tables and CSV.
    pub fn name(self) -> &'static str {
        match self {
            ReadEngine::IoUring => "io_uring",
            ReadEngine::Threads => "threads",
        }
    }
}

impl fmt::Display for ReadEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One measured cell.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepRow {
    /// The mode asked for.
    pub mode: ReadMode,
    /// The mode in use (`Buffered` where `Direct` fell back).
    pub effective_mode: ReadMode,
    pub engine: ReadEngine,
    /// Bytes per read.
    pub read_bytes: usize,
    pub depth: usize,
    pub reads: u64,
    /// Wall time of the cell, first submission to last completion.
    pub seconds: f64,
    /// Bytes the engine received per second, in GB (1e9 bytes).
    pub gb_per_s: f64,
    pub latency_us_p50: f64,
    pub latency_us_p99: f64,
    /// Bytes the engine received (`reads × read_bytes`).
    pub engine_bytes: u64,
    /// Bytes the device delivered to this process during the cell (delta
    /// of `read_bytes` in `/proc/self/io`); `None` where that file is
    /// unreadable. Below `engine_bytes` when the page cache served reads.
    pub device_bytes: Option<u64>,
}

impl SweepRow {
    /// The mode as shown in tables: `direct>buffered` after a fallback.
    pub fn mode_label(&self) -> String {
        if self.mode == self.effective_mode {
            self.mode.name().to_owned()
        } else {
            format!("{}>{}", self.mode, self.effective_mode)
        }
    }
}

/// Runs the sweep over `files`: for each mode, block size and depth (in
/// that nesting order) one cell, handed to `on_row` as soon as it is
/// measured and returned in the same order. Errors before any measurement
/// when the configuration or the files cannot work (naming the files), and
/// on the first failed read.
pub fn sweep(
    files: &[PathBuf],
    cfg: &SweepConfig,
    mut on_row: impl FnMut(&SweepRow),
) -> Result<Vec<SweepRow>, IoError> {
    let lens = validate(files, cfg)?;
    let ring = Reactor::probe().is_ok();
    let mut rows = Vec::new();
    let mut cell = 0u64;
    for &mode in &cfg.modes {
        for &read_bytes in &cfg.read_sizes {
            let targets =
                Targets::new(&lens, read_bytes).expect("validate checked that every size fits");
            for &depth in &cfg.depths {
                cell += 1;
                let seed = mix(cfg.seed ^ cell.wrapping_mul(0xA076_1D64_78BD_642F));
                let row = run_cell(files, &targets, mode, read_bytes, depth, seed, cfg, ring)?;
                on_row(&row);
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

/// Checks the configuration and returns the files' lengths.
fn validate(files: &[PathBuf], cfg: &SweepConfig) -> Result<Vec<u64>, IoError> {
    let bad = |what: String| Err(IoError::BadInput { what });
    if files.is_empty() {
        return bad("no files to read".to_owned());
    }
    if let Some(d) = cfg.depths.iter().find(|&&d| d == 0 || d > SWEEP_DEPTH_MAX) {
        return bad(format!("queue depth {d} is outside 1..={SWEEP_DEPTH_MAX}"));
    }
    if cfg.read_sizes.contains(&0) {
        return bad("a block size of 0 bytes".to_owned());
    }
    let mut lens = Vec::with_capacity(files.len());
    for path in files {
        let meta = std::fs::metadata(path).map_err(|e| IoError::os("stat", path, 0, 0, e))?;
        if !meta.is_file() {
            return bad(format!("{} is not a file", path.display()));
        }
        lens.push(meta.len());
    }
    for &size in &cfg.read_sizes {
        if Targets::new(&lens, size).is_none() {
            let listed: Vec<String> = files
                .iter()
                .zip(&lens)
                .map(|(p, len)| format!("{} ({len} bytes)", p.display()))
                .collect();
            return bad(format!(
                "a block of {size} bytes ({}) fits in no file: {}",
                size_label(size),
                listed.join(", ")
            ));
        }
    }
    Ok(lens)
}

/// Measures one cell.
#[allow(clippy::too_many_arguments)]
fn run_cell(
    files: &[PathBuf],
    targets: &Targets,
    mode: ReadMode,
    read_bytes: usize,
    depth: usize,
    seed: u64,
    cfg: &SweepConfig,
    ring: bool,
) -> Result<SweepRow, IoError> {
    let pool = SlabPool::new(depth * align_up(read_bytes));
    // Open every file (a file too short for this size is never picked).
    // The O_DIRECT probe reads one block, so open first, then drop the
    // cache.
    let readers = files
        .iter()
        .map(|path| {
            let reader = open_with_pool(path, mode, pool.clone())?;
            reader.expect_random();
            Ok(reader)
        })
        .collect::<Result<Vec<_>, IoError>>()?;
    let effective_mode = readers
        .iter()
        .map(|r| r.effective_mode())
        .find(|&m| m != mode)
        .unwrap_or(mode);
    let ring_files = (ring && matches!(mode, ReadMode::Direct | ReadMode::Buffered))
        .then(|| {
            readers
                .iter()
                .map(|r| r.open_file())
                .collect::<Option<Vec<_>>>()
        })
        .flatten();
    drop_page_cache(files)?;
    let device_before = device_read_bytes();
    let started = Instant::now();
    let stop = Stop {
        reads_min: depth as u64,
        reads_max: cfg.reads_max.unwrap_or(u64::MAX).max(depth as u64),
        deadline: started.checked_add(cfg.cell_time),
    };
    let (engine, mut latencies) = match ring_files {
        Some(fs) => {
            let lat = run_ring(&fs, targets, read_bytes, depth, seed, stop, pool)?;
            (ReadEngine::IoUring, lat)
        }
        None => {
            let lat = run_threads(&readers, targets, read_bytes, depth, seed, stop)?;
            (ReadEngine::Threads, lat)
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    let device_bytes = device_before
        .zip(device_read_bytes())
        .map(|(before, after)| after.saturating_sub(before));
    latencies.sort();
    let reads = latencies.len() as u64;
    let engine_bytes = reads * read_bytes as u64;
    Ok(SweepRow {
        mode,
        effective_mode,
        engine,
        read_bytes,
        depth,
        reads,
        seconds,
        gb_per_s: engine_bytes as f64 / seconds.max(1e-9) / 1e9,
        latency_us_p50: percentile_us(&latencies, 50),
        latency_us_p99: percentile_us(&latencies, 99),
        engine_bytes,
        device_bytes,
    })
}

/// Keeps `depth` reads in flight through one reactor until `stop` ends the
/// stream; returns each read's latency (pulled for submission to reaped).
fn run_ring(
    files: &[Arc<OpenFile>],
    targets: &Targets,
    read_bytes: usize,
    depth: usize,
    seed: u64,
    stop: Stop,
    pool: Arc<SlabPool>,
) -> Result<Vec<Duration>, IoError> {
    let config = ReactorConfig {
        depth: depth as u32,
        inflight_bytes_max: depth * align_up(read_bytes),
        ..ReactorConfig::default()
    };
    let mut reactor = Reactor::new(config, pool)?;
    let submitted = RefCell::new(Vec::<Instant>::new());
    let failed = RefCell::new(None::<IoError>);
    let mut latencies = Vec::new();
    let mut n = 0u64;
    reactor.submit_stream_with(
        || {
            if failed.borrow().is_some() || !stop.admits(n) {
                return None;
            }
            let (file, offset) = targets.pick(seed, n);
            let file = files[file].clone();
            submitted.borrow_mut().push(Instant::now());
            let req = ReadReq {
                tag: n,
                file,
                offset,
                len: read_bytes,
            };
            n += 1;
            Some(req)
        },
        |(tag, result)| {
            let latency = submitted.borrow()[tag as usize].elapsed();
            match result {
                Ok(slab) => {
                    latencies.push(latency);
                    std::hint::black_box(slab.bytes().first());
                }
                Err(e) => {
                    failed.borrow_mut().get_or_insert(e);
                }
            }
        },
    )?;
    match failed.into_inner() {
        Some(e) => Err(e),
        None => Ok(latencies),
    }
}

/// Drops `files` from the page cache: each is synced first (dirty pages
/// cannot be dropped), then `POSIX_FADV_DONTNEED` over the whole file.
pub fn drop_page_cache(files: &[PathBuf]) -> Result<(), IoError> {
    for path in files {
        let file = File::open(path).map_err(|e| IoError::os("open", path, 0, 0, e))?;
        file.sync_all()
            .map_err(|e| IoError::os("fsync", path, 0, 0, e))?;
        posix_fadvise(
            file.as_raw_fd(),
            0,
            0,
            PosixFadviseAdvice::POSIX_FADV_DONTNEED,
        )
        .map_err(|errno| IoError::os("fadvise(DONTNEED)", path, 0, 0, errno.into()))?;
    }
    Ok(())
}

/// Bytes this process has caused to be fetched from storage so far
/// (`read_bytes` of `/proc/self/io`, all threads); `None` where unreadable.
pub fn device_read_bytes() -> Option<u64> {
    parse_proc_io(&std::fs::read_to_string("/proc/self/io").ok()?)
}

fn parse_proc_io(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("read_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The CSV header written by [`write_csv`].
pub const CSV_HEADER: &str = "mode,effective_mode,engine,block_bytes,block_mib,depth,reads,seconds,gb_per_s,p50_us,p99_us,engine_mb,device_mb";

/// Writes `rows` as CSV: [`CSV_HEADER`], then one line per row (an empty
/// `device_mb` where the device counter was unavailable).
pub fn write_csv(rows: &[SweepRow], mut out: impl Write) -> std::io::Result<()> {
    writeln!(out, "{CSV_HEADER}")?;
    for r in rows {
        let device_mb = r
            .device_bytes
            .map_or(String::new(), |b| format!("{:.3}", b as f64 / 1e6));
        writeln!(
            out,
            "{},{},{},{},{},{},{},{:.4},{:.4},{:.1},{:.1},{:.3},{}",
            r.mode,
            r.effective_mode,
            r.engine,
            r.read_bytes,
            r.read_bytes as f64 / (1 << 20) as f64,
            r.depth,
            r.reads,
            r.seconds,
            r.gb_per_s,
            r.latency_us_p50,
            r.latency_us_p99,
            r.engine_bytes as f64 / 1e6,
            device_mb
        )?;
    }
    out.flush()
}

/// A block size for axis labels: `512`, `4K`, `1.5M`, `16M`.
pub fn size_label(bytes: usize) -> String {
    let units = [(1usize << 30, "G"), (1 << 20, "M"), (1 << 10, "K")];
    for (unit, suffix) in units {
        if bytes >= unit {
            let v = bytes as f64 / unit as f64;
            return if bytes.is_multiple_of(unit) {
                format!("{}{suffix}", bytes / unit)
            } else {
                format!("{v:.1}{suffix}")
            };
        }
    }
    bytes.to_string()
}

/// An SVG plot of `rows`: GB/s (y) against block size (x, log2), one
/// panel per queue depth (sharing the y scale), one line per mode.
pub fn sweep_svg(rows: &[SweepRow], title: &str) -> String {
    let mut depths: Vec<usize> = rows.iter().map(|r| r.depth).collect();
    depths.sort_unstable();
    depths.dedup();
    let mut sizes: Vec<usize> = rows.iter().map(|r| r.read_bytes).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let panels = depths
        .iter()
        .map(|&depth| {
            let mut series: Vec<Series> = Vec::new();
            for r in rows.iter().filter(|r| r.depth == depth) {
                let name = r.mode_label();
                let point = (r.read_bytes as f64, r.gb_per_s);
                match series.iter_mut().find(|s| s.name == name) {
                    Some(s) => s.points.push(point),
                    None => series.push(Series {
                        name,
                        points: vec![point],
                    }),
                }
            }
            for s in &mut series {
                s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
            }
            Panel {
                title: format!("queue depth {depth}"),
                series,
            }
        })
        .collect();
    Figure {
        title: title.to_owned(),
        x_label: "block size (bytes, log2)".to_owned(),
        y_label: "GB/s".to_owned(),
        x_ticks: sizes.iter().map(|&s| (s as f64, size_label(s))).collect(),
        panels,
    }
    .to_svg()
}

/// Writes a file of `len` patterned bytes (tests).
#[cfg(test)]
fn write_file(path: &std::path::Path, len: usize) {
    let data: Vec<u8> = (0..len).map(|i| (i * 31 + i / 4093) as u8).collect();
    std::fs::write(path, data).unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quick(modes: Vec<ReadMode>, sizes: Vec<usize>, depths: Vec<usize>) -> SweepConfig {
        SweepConfig {
            modes,
            read_sizes: sizes,
            depths,
            cell_time: Duration::from_millis(20),
            reads_max: Some(64),
            seed: 3,
        }
    }

    #[test]
    fn one_row_per_cell_in_every_mode() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.bin");
        write_file(&a, 256 << 10);
        let cfg = quick(ReadMode::ALL.to_vec(), vec![4096, 16384], vec![1, 2]);
        let mut streamed = 0;
        let rows = sweep(&[a], &cfg, |_| streamed += 1).unwrap();
        assert_eq!(rows.len(), 5 * 2 * 2);
        assert_eq!(streamed, rows.len());
        let mut i = 0;
        for &mode in &cfg.modes {
            for &size in &cfg.read_sizes {
                for &depth in &cfg.depths {
                    let r = &rows[i];
                    i += 1;
                    assert_eq!((r.mode, r.read_bytes, r.depth), (mode, size, depth));
                    assert!(r.reads >= depth as u64 && r.reads <= 64, "{r:?}");
                    assert!(r.gb_per_s > 0.0, "{r:?}");
                    assert!(r.latency_us_p50 <= r.latency_us_p99, "{r:?}");
                    assert!(r.latency_us_p50 > 0.0, "{r:?}");
                    assert_eq!(r.engine_bytes, r.reads * size as u64);
                    let sync_only =
                        matches!(mode, ReadMode::Drop | ReadMode::Mmap | ReadMode::Pread);
                    if sync_only {
                        assert_eq!(r.engine, ReadEngine::Threads, "{r:?}");
                    }
                    if Reactor::probe().is_ok() && !sync_only {
                        assert_eq!(r.engine, ReadEngine::IoUring, "{r:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn reads_max_and_depth_bound_the_reads() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.bin");
        write_file(&a, 64 << 10);
        let mut cfg = quick(
            vec![ReadMode::Buffered, ReadMode::Pread],
            vec![4096],
            vec![1, 3],
        );
        cfg.reads_max = Some(2);
        cfg.cell_time = Duration::from_secs(5);
        let rows = sweep(&[a], &cfg, |_| {}).unwrap();
        let reads: Vec<u64> = rows.iter().map(|r| r.reads).collect();
        // depth 1: capped at 2; depth 3: raised to the depth.
        assert_eq!(reads, vec![2, 3, 2, 3]);
    }

    /// Two files of different, unaligned sizes, one too short for the
    /// largest block, and one unaligned block size: a read crossing a
    /// file's end would fail the sweep with a short read.
    #[test]
    fn reads_stay_inside_files_of_different_sizes() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("small.bin");
        let large = dir.path().join("large.bin");
        write_file(&small, 20 * 1024 + 100);
        write_file(&large, 96 * 1024 + 7);
        let cfg = quick(
            ReadMode::ALL.to_vec(),
            vec![4096, 10_000, 16384, 32768],
            vec![1, 4],
        );
        let rows = sweep(&[small, large], &cfg, |_| {}).unwrap();
        assert_eq!(rows.len(), 5 * 4 * 2);
        assert!(rows.iter().all(|r| r.reads > 0));
    }

    #[test]
    fn a_block_that_fits_no_file_is_an_error_naming_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("tiny.bin");
        write_file(&a, 8192);
        let cfg = quick(vec![ReadMode::Pread], vec![4096, 16384], vec![1]);
        let err = sweep(std::slice::from_ref(&a), &cfg, |_| {}).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, IoError::BadInput { .. }), "{msg}");
        assert!(msg.contains("16384") && msg.contains("tiny.bin"), "{msg}");

        let zero_depth = quick(vec![ReadMode::Pread], vec![4096], vec![0]);
        assert!(sweep(std::slice::from_ref(&a), &zero_depth, |_| {}).is_err());
        let missing = dir.path().join("missing.bin");
        let msg = sweep(
            &[missing],
            &quick(vec![ReadMode::Pread], vec![1], vec![1]),
            |_| {},
        )
        .unwrap_err()
        .to_string();
        assert!(msg.contains("missing.bin"), "{msg}");
        assert!(sweep(&[], &SweepConfig::default(), |_| {}).is_err());
    }

    fn row(mode: ReadMode, read_bytes: usize, depth: usize, gb_per_s: f64) -> SweepRow {
        SweepRow {
            mode,
            effective_mode: mode,
            engine: ReadEngine::Threads,
            read_bytes,
            depth,
            reads: 10,
            seconds: 0.5,
            gb_per_s,
            latency_us_p50: 10.0,
            latency_us_p99: 20.0,
            engine_bytes: 10 * read_bytes as u64,
            device_bytes: Some(123_000_000),
        }
    }

    #[test]
    fn csv_has_the_header_and_one_line_per_row() {
        let mut rows = vec![
            row(ReadMode::Direct, 1 << 20, 1, 1.5),
            row(ReadMode::Mmap, 4096, 8, 0.25),
        ];
        rows[1].device_bytes = None;
        let mut out = Vec::new();
        write_csv(&rows, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], CSV_HEADER);
        let fields = CSV_HEADER.split(',').count();
        assert!(lines.iter().all(|l| l.split(',').count() == fields));
        assert!(lines[1].starts_with("direct,direct,threads,1048576,1,1,10,"));
        assert!(lines[1].ends_with(",123.000"), "{}", lines[1]);
        assert!(lines[2].ends_with(','), "{}", lines[2]);
    }

    #[test]
    fn svg_has_a_panel_per_depth_and_a_line_per_mode() {
        let mut rows = Vec::new();
        for depth in [1, 4] {
            for mode in [ReadMode::Direct, ReadMode::Pread, ReadMode::Mmap] {
                for size in [1 << 20, 4 << 20] {
                    rows.push(row(mode, size, depth, depth as f64 * 0.1));
                }
            }
        }
        let svg = sweep_svg(&rows, "disk <vda> & \"q30b24\"");
        assert!(svg.starts_with("<svg"), "{}", &svg[..40]);
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2 * 3);
        assert!(svg.contains("queue depth 1") && svg.contains("queue depth 4"));
        assert!(svg.contains("disk &lt;vda&gt; &amp; &quot;q30b24&quot;"));
        assert!(!svg.contains("<vda>"));
        assert!(
            svg.contains(">1M<") && svg.contains(">4M<"),
            "x tick labels"
        );
        for mode in ["direct", "pread", "mmap"] {
            assert!(svg.contains(&format!(">{mode}<")), "legend {mode}");
        }
    }

    #[test]
    fn proc_io_parses_read_bytes() {
        let text = "rchar: 10\nwchar: 0\nread_bytes: 4096\nwrite_bytes: 0\n";
        assert_eq!(parse_proc_io(text), Some(4096));
        assert_eq!(parse_proc_io("rchar: 1\n"), None);
        assert!(device_read_bytes().is_some() || !std::path::Path::new("/proc/self/io").exists());
    }

    #[test]
    fn size_labels() {
        assert_eq!(size_label(4096), "4K");
        assert_eq!(size_label(16 << 20), "16M");
        assert_eq!(size_label(3 << 19), "1.5M");
        assert_eq!(size_label(100), "100");
    }
}
