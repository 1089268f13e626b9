//! A small random-read benchmark: GB/s and per-read latency of reads of a
//! given size at random 4096-aligned offsets of a file, in one read mode,
//! from a given number of threads. Used by `moestream tune` and `bench` to
//! pick a read mode per disk by measurement.
//!
//! Limits: `reads` bounds the work; offsets come from a seeded generator so
//! runs are repeatable. No result is asserted anywhere; timings are data.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::aligned::ALIGN;
use crate::error::IoError;
use crate::mode::ReadMode;
use crate::source::{open, RangeReader};

/// What to measure.
#[derive(Clone, Copy, Debug)]
pub struct BenchConfig {
    /// Bytes per read (e.g. one expert).
    pub read_bytes: usize,
    /// Reads in total, split between threads.
    pub reads: usize,
    pub threads: usize,
    pub seed: u64,
}

/// What was measured.
#[derive(Clone, Copy, Debug)]
pub struct BenchReport {
    /// The mode actually used (`Buffered` if `Direct` fell back).
    pub mode: ReadMode,
    pub read_bytes: usize,
    pub reads: usize,
    pub threads: usize,
    pub seconds: f64,
    pub gb_per_s: f64,
    pub read_latency_us_p50: f64,
    pub read_latency_us_p99: f64,
}

/// Measures random reads of `config.read_bytes` over `path` in `mode`.
pub fn bench_random_reads(
    path: &Path,
    mode: ReadMode,
    config: BenchConfig,
) -> Result<BenchReport, IoError> {
    assert!(config.threads > 0, "bench needs at least one thread");
    let reader = open(path, mode)?;
    let offset_max = reader.len_bytes().checked_sub(config.read_bytes as u64);
    let Some(offset_max) = offset_max else {
        return Err(IoError::ShortRead {
            path: path.to_owned(),
            offset: 0,
            len: config.read_bytes,
            got: reader.len_bytes() as usize,
        });
    };
    let started = Instant::now();
    let mut latencies = run_threads(reader.as_ref(), offset_max, config)?;
    let seconds = started.elapsed().as_secs_f64();
    latencies.sort();
    let bytes = (latencies.len() * config.read_bytes) as f64;
    Ok(BenchReport {
        mode: reader.effective_mode(),
        read_bytes: config.read_bytes,
        reads: latencies.len(),
        threads: config.threads,
        seconds,
        gb_per_s: bytes / seconds.max(1e-9) / 1e9,
        read_latency_us_p50: percentile_us(&latencies, 50),
        read_latency_us_p99: percentile_us(&latencies, 99),
    })
}

fn run_threads(
    reader: &dyn RangeReader,
    offset_max: u64,
    config: BenchConfig,
) -> Result<Vec<Duration>, IoError> {
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..config.threads)
            .map(|t| {
                let reads =
                    config.reads / config.threads + usize::from(t < config.reads % config.threads);
                let seed = config.seed ^ (t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                scope.spawn(move || run_worker(reader, offset_max, config.read_bytes, reads, seed))
            })
            .collect();
        let mut latencies = Vec::with_capacity(config.reads);
        for worker in workers {
            latencies.extend(worker.join().expect("bench worker panicked")?);
        }
        Ok(latencies)
    })
}

fn run_worker(
    reader: &dyn RangeReader,
    offset_max: u64,
    read_bytes: usize,
    reads: usize,
    seed: u64,
) -> Result<Vec<Duration>, IoError> {
    let mut rng = SplitMix64(seed);
    let blocks = offset_max / ALIGN as u64 + 1;
    let mut latencies = Vec::with_capacity(reads);
    for _ in 0..reads {
        let offset = (rng.next() % blocks) * ALIGN as u64;
        let started = Instant::now();
        let slab = reader.read(offset, read_bytes)?;
        latencies.push(started.elapsed());
        std::hint::black_box(slab.bytes().first());
    }
    Ok(latencies)
}

/// The `p`th percentile (nearest rank) of sorted durations, in microseconds.
fn percentile_us(sorted: &[Duration], p: usize) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (sorted.len() * p).div_ceil(100).clamp(1, sorted.len());
    sorted[rank - 1].as_secs_f64() * 1e6
}

/// A tiny seeded generator (SplitMix64), enough to spread offsets.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_every_mode_and_counts_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        let config = BenchConfig {
            read_bytes: 10_000,
            reads: 21,
            threads: 2,
            seed: 1,
        };
        for mode in ReadMode::ALL {
            let report = bench_random_reads(&path, mode, config).unwrap();
            assert_eq!(report.reads, 21, "{mode}");
            assert!(report.read_latency_us_p50 <= report.read_latency_us_p99);
        }
    }

    #[test]
    fn file_smaller_than_read_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("small");
        std::fs::write(&path, [0u8; 10]).unwrap();
        let config = BenchConfig {
            read_bytes: 11,
            reads: 1,
            threads: 1,
            seed: 0,
        };
        let err = bench_random_reads(&path, ReadMode::Pread, config).unwrap_err();
        assert!(matches!(err, IoError::ShortRead { .. }), "{err}");
    }

    #[test]
    fn percentile_nearest_rank() {
        let d: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        assert_eq!(percentile_us(&d, 50), 50.0);
        assert_eq!(percentile_us(&d, 99), 99.0);
        assert_eq!(percentile_us(&d[..1], 99), 1.0);
        assert_eq!(percentile_us(&[], 99), 0.0);
    }
}
