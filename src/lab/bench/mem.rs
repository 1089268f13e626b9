//! Memory read bandwidth: `threads` threads each stream their share of a
//! buffer far larger than the last-level cache and sum it, as the decode
//! kernels stream weights. The buffer is written once (so every page is
//! backed by its own memory, not the shared zero page) and read once as a
//! warm-up before the timed repetitions; the readers are started once and
//! each timed pass runs between two barriers. The result is the median and
//! best GB/s (10^9 bytes per second) over the repetitions.

use std::sync::Barrier;
use std::time::Instant;

/// What [`read_bandwidth`] measured.
#[derive(Clone, Debug, PartialEq)]
pub struct MemBandwidth {
    /// Bytes read per repetition.
    pub bytes: usize,
    pub threads: usize,
    pub reps: usize,
    /// Median over the repetitions, GB/s.
    pub median_gbs: f64,
    /// Fastest repetition, GB/s.
    pub best_gbs: f64,
}

/// Measures read bandwidth over a `bytes` buffer (rounded down to whole
/// 64-byte lines) with `threads` threads, `reps` timed passes.
pub fn read_bandwidth(bytes: usize, threads: usize, reps: usize) -> MemBandwidth {
    assert!(threads >= 1 && reps >= 1, "need a thread and a repetition");
    let lines = (bytes / 64).max(threads);
    // Distinct non-zero words so no page is deduplicated or left unbacked.
    let buf: Vec<[u64; 8]> = (0..lines as u64)
        .map(|i| std::array::from_fn(|k| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ k as u64))
        .collect();
    let bytes = lines * 64;
    let part = lines.div_ceil(threads);
    // Readers live across all passes (a fresh thread may start on its
    // parent's core), and the calling thread reads the first part itself, so
    // exactly `threads` threads compete for the cores; each pass starts and
    // ends on a barrier.
    let mut parts = buf.chunks(part);
    let own = parts.next().unwrap_or(&[]);
    let start_line = Barrier::new(threads);
    let finish_line = Barrier::new(threads);
    let mut gbs: Vec<f64> = std::thread::scope(|s| {
        for chunk in parts {
            let (start_line, finish_line) = (&start_line, &finish_line);
            s.spawn(move || {
                std::hint::black_box(sum_lines(chunk)); // warm-up pass
                for _ in 0..reps {
                    start_line.wait();
                    std::hint::black_box(sum_lines(chunk));
                    finish_line.wait();
                }
            });
        }
        std::hint::black_box(sum_lines(own));
        (0..reps)
            .map(|_| {
                start_line.wait();
                let t0 = Instant::now();
                std::hint::black_box(sum_lines(own));
                finish_line.wait();
                bytes as f64 / t0.elapsed().as_secs_f64() / 1e9
            })
            .collect()
    });
    gbs.sort_by(f64::total_cmp);
    MemBandwidth {
        bytes,
        threads,
        reps,
        median_gbs: gbs[reps / 2],
        best_gbs: gbs[reps - 1],
    }
}

/// Sum of all words, with the widest loads the CPU has.
fn sum_lines(lines: &[[u64; 8]]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F detected just above.
        return unsafe { sum_lines_avx512(lines) };
    }
    sum_lines_portable(lines)
}

/// Eight independent lanes: compiles to vector adds on any target.
fn sum_lines_portable(lines: &[[u64; 8]]) -> u64 {
    let mut acc = [0u64; 8];
    for line in lines {
        for (a, v) in acc.iter_mut().zip(line) {
            *a = a.wrapping_add(*v);
        }
    }
    acc.iter().fold(0, |a, v| a.wrapping_add(*v))
}

/// One 64-byte load per line, four lines in flight.
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_lines_avx512(lines: &[[u64; 8]]) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_si512(); 4];
    let mut chunks = lines.chunks_exact(4);
    for four in &mut chunks {
        for (a, line) in acc.iter_mut().zip(four) {
            // SAFETY: `line` is 64 readable bytes.
            let v = unsafe { _mm512_loadu_si512(line.as_ptr().cast()) };
            *a = _mm512_add_epi64(*a, v);
        }
    }
    let s = _mm512_add_epi64(
        _mm512_add_epi64(acc[0], acc[1]),
        _mm512_add_epi64(acc[2], acc[3]),
    );
    (_mm512_reduce_add_epi64(s) as u64).wrapping_add(sum_lines_portable(chunks.remainder()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_agree() {
        let lines: Vec<[u64; 8]> = (0..1003u64)
            .map(|i| std::array::from_fn(|k| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ k as u64))
            .collect();
        let want = lines.iter().flatten().fold(0u64, |a, v| a.wrapping_add(*v));
        assert_eq!(sum_lines(&lines), want);
        assert_eq!(sum_lines_portable(&lines), want);
    }

    #[test]
    fn small_buffer_reports_sane_numbers() {
        let m = read_bandwidth(1 << 20, 2, 3);
        assert_eq!(m.bytes, 1 << 20);
        assert!(m.median_gbs > 0.0 && m.best_gbs >= m.median_gbs);
    }

    /// The machine's figure: `cargo test --release --lib bench::mem --
    /// --ignored --nocapture --test-threads=1`. 256 MiB is the working set
    /// of the kernel benches; 1 GiB is far past any cache.
    #[test]
    #[ignore = "reads 1 GiB several times; run by hand for results/kernels.md"]
    fn print_read_bandwidth() {
        for mib in [256usize, 1024] {
            for threads in [1, 2] {
                let m = read_bandwidth(mib << 20, threads, 9);
                println!(
                    "read bandwidth, {mib} MiB, {threads} thread(s): median {:.1} GB/s, best {:.1} GB/s",
                    m.median_gbs, m.best_gbs
                );
            }
        }
    }
}
