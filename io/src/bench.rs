//! The pieces of random-read measurement the disk sweep ([`crate::sweep`])
//! is built from: [`Targets`], where random reads of one size may land
//! across a set of files, [`Stop`], when a stream of reads ends, and
//! [`run_threads`], the threaded synchronous reader loop. (The older
//! single-mode `bench_random_reads` is gone: `moestream tune` and
//! `bench io` measure a disk with the sweep.)
//!
//! Limits: `reads` bounds the work; offsets come from a seeded generator so
//! runs are repeatable (the `n`th read's offset depends only on the seed and
//! `n`, not on which thread issues it). No result is asserted anywhere;
//! timings are data.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::aligned::ALIGN;
use crate::error::IoError;
use crate::source::RangeReader;

/// Where random reads of one size may land across a set of files: every
/// 4096-aligned offset at which a read of that size fits inside one file.
/// A read picks uniformly among all of them, so a file's share of the reads
/// is proportional to its size (less one read); files shorter than a read
/// get none. A read never crosses the end of its file.
#[derive(Clone, Debug)]
pub(crate) struct Targets {
    /// (index into the caller's file list, aligned starts in the files up to
    /// and including this one).
    cumulative: Vec<(usize, u64)>,
    total: u64,
}

impl Targets {
    /// The targets of reads of `read_bytes` over files of lengths `lens`;
    /// `None` when no file is long enough.
    pub(crate) fn new(lens: &[u64], read_bytes: usize) -> Option<Self> {
        let mut cumulative = Vec::new();
        let mut total = 0u64;
        for (i, &len) in lens.iter().enumerate() {
            let Some(room) = len.checked_sub(read_bytes as u64) else {
                continue;
            };
            total += room / ALIGN as u64 + 1;
            cumulative.push((i, total));
        }
        (total > 0).then_some(Targets { cumulative, total })
    }

    /// The file index and offset of read number `n` of the stream `seed`.
    pub(crate) fn pick(&self, seed: u64, n: u64) -> (usize, u64) {
        let r = mix(seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)) % self.total;
        let k = self.cumulative.partition_point(|&(_, upto)| upto <= r);
        let (file, upto) = self.cumulative[k];
        let before = k.checked_sub(1).map_or(0, |j| self.cumulative[j].1);
        debug_assert!(before <= r && r < upto);
        (file, (r - before) * ALIGN as u64)
    }

    /// Indexes of the files reads may land in.
    #[cfg(test)]
    pub(crate) fn files(&self) -> impl Iterator<Item = usize> + '_ {
        self.cumulative.iter().map(|&(i, _)| i)
    }
}

/// When a stream of reads ends: read number `n` (counted from 0) is issued
/// iff `n < reads_max` and either `n < reads_min` or the deadline has not
/// passed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stop {
    pub reads_min: u64,
    pub reads_max: u64,
    pub deadline: Option<Instant>,
}

impl Stop {
    /// Whether read number `n` is issued.
    pub(crate) fn admits(&self, n: u64) -> bool {
        n < self.reads_max
            && (n < self.reads_min || self.deadline.is_none_or(|d| Instant::now() < d))
    }
}

/// Reads from `threads` threads, each doing synchronous reads of
/// `read_bytes` through `readers[file]` at the offsets `targets` picks,
/// until `stop` ends the stream (read numbers are shared between threads).
/// Returns each read's latency (call to return), unsorted. The first error
/// stops every thread and is returned.
pub(crate) fn run_threads(
    readers: &[Box<dyn RangeReader>],
    targets: &Targets,
    read_bytes: usize,
    threads: usize,
    seed: u64,
    stop: Stop,
) -> Result<Vec<Duration>, IoError> {
    let next = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                let (next, failed) = (&next, &failed);
                scope.spawn(move || {
                    let mut latencies = Vec::new();
                    while !failed.load(Ordering::Relaxed) {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        if !stop.admits(n) {
                            break;
                        }
                        let (file, offset) = targets.pick(seed, n);
                        let started = Instant::now();
                        match readers[file].read(offset, read_bytes) {
                            Ok(slab) => {
                                latencies.push(started.elapsed());
                                std::hint::black_box(slab.bytes().first());
                            }
                            Err(e) => {
                                failed.store(true, Ordering::Relaxed);
                                return Err(e);
                            }
                        }
                    }
                    Ok(latencies)
                })
            })
            .collect();
        let mut latencies = Vec::new();
        let mut first_error = None;
        for worker in workers {
            match worker.join().expect("bench worker panicked") {
                Ok(l) => latencies.extend(l),
                Err(e) => first_error = first_error.or(Some(e)),
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(latencies),
        }
    })
}

/// The `p`th percentile (nearest rank) of sorted durations, in microseconds.
pub(crate) fn percentile_us(sorted: &[Duration], p: usize) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (sorted.len() * p).div_ceil(100).clamp(1, sorted.len());
    sorted[rank - 1].as_secs_f64() * 1e6
}

/// SplitMix64's output function: spreads a counter into a random-looking
/// value, enough to pick offsets.
pub(crate) fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_keep_reads_inside_one_file_and_weight_by_size() {
        // Lengths: too short, one aligned start, unaligned tail, large.
        let lens = [4095, 4096, 3 * 4096 + 100, 40 * 4096];
        let read = 4096;
        let t = Targets::new(&lens, read).unwrap();
        assert_eq!(t.files().collect::<Vec<_>>(), vec![1, 2, 3]);
        let mut hits = [0u64; 4];
        for n in 0..20_000 {
            let (file, offset) = t.pick(7, n);
            assert_eq!(offset % ALIGN as u64, 0);
            assert!(offset + read as u64 <= lens[file], "read {n} crosses");
            hits[file] += 1;
        }
        assert_eq!(hits[0], 0);
        // Starts: 1, 3 and 40 of 44.
        assert!(hits[1] > 200 && hits[1] < 800, "{hits:?}");
        assert!(hits[3] > 17_000, "{hits:?}");
        assert_eq!(t.pick(7, 5), t.pick(7, 5), "repeatable");
        assert!(Targets::new(&lens, 41 * 4096).is_none());
        assert!(Targets::new(&[], 1).is_none());
    }

    #[test]
    fn stop_respects_min_max_and_deadline() {
        let past = Some(Instant::now() - Duration::from_millis(1));
        let s = Stop {
            reads_min: 2,
            reads_max: 5,
            deadline: past,
        };
        assert!(s.admits(0) && s.admits(1) && !s.admits(2));
        let s = Stop {
            deadline: None,
            ..s
        };
        assert!(s.admits(4) && !s.admits(5));
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
