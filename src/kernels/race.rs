//! The measured choice between the panels and the register tiles of the
//! int8/int4 batched dots (`kernels::measured_panels_from`): which is
//! faster differs by CPU, format and batch (Sapphire Rapids: the VNNI
//! panels from 64 rows; Zen 4, whose 512-bit units are two 256-bit halves:
//! the VNNI tiles up to 64 rows, the panels from 128; AVX2: the int4
//! panels from 32 rows, int8 about even), and both give the same bits, so
//! the choice moves no result, only time.

use super::{BatchKernel, PANEL_ACTS_MIN};
use std::time::{Duration, Instant};

/// Weight bytes of the timed matrix (in `dot_block` calls of
/// [`CALL_ROWS`] rows), flushed from the caches before each repetition:
/// a prefill's weights come from DRAM (a freshly read expert), and the
/// panels' repack meets them there.
const W_BYTES: usize = 2 << 20;
/// Weight rows of one `dot_block` call, as `quant::matmul_int` makes them
/// at expert shapes (16 KiB row blocks rounded up to 32 rows).
const CALL_ROWS: usize = 32;
/// The batches raced, each with the fewest rows the panels then run for:
/// one between the panel threshold and 64 rows, one long.
const POINTS: [(usize, usize); 2] = [(48, PANEL_ACTS_MIN), (192, 128)];
/// Timed repetitions of each kernel, alternating.
const REPS: usize = 5;

/// One 64-byte activation line, so the rows start aligned as in use.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([i8; 64]);

/// `run(kernel, weights, activations, sums, out)`: one `dot_block` call of
/// the format on `kernel` (never called with [`BatchKernel::Amx`]).
pub(crate) type RunFn<'a> = dyn FnMut(BatchKernel, &[u8], &[i8], &[i32], &mut [i32]) + 'a;

/// The fewest activation rows from which the panels beat the tiles, as
/// raced at each of [`POINTS`] in turn ([`faster`]); `None`: the tiles won
/// at every point.
pub(crate) fn panels_from(row_bytes: usize, stride: usize, run: &mut RunFn) -> Option<usize> {
    POINTS
        .iter()
        .find(|&&(n, _)| faster(row_bytes, stride, n, run) == BatchKernel::Panels)
        .map(|&(_, from)| from)
}

/// Times `run` on the panels and on the tiles over [`W_BYTES`] of weight
/// rows of `row_bytes` against `n` activation rows of `stride` bytes (a
/// multiple of 64), [`REPS`] times each alternating, and returns the
/// kernel with the shorter best repetition (the best, not the median:
/// robust to preemption on a busy machine).
fn faster(row_bytes: usize, stride: usize, n: usize, run: &mut RunFn) -> BatchKernel {
    debug_assert!(stride.is_multiple_of(64));
    let w: Vec<u8> = (0..W_BYTES / row_bytes * row_bytes)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    let mut lines = vec![Line([0; 64]); n * stride / 64];
    for (i, v) in lines.iter_mut().flat_map(|l| l.0.iter_mut()).enumerate() {
        *v = (((i * 37 + 11) % 255) as i32 - 127) as i8;
    }
    // SAFETY: `Line` is 64 plain i8 with no padding; `lines` holds
    // `n · stride` of them in all.
    let x: &[i8] = unsafe { std::slice::from_raw_parts(lines.as_ptr().cast(), n * stride) };
    let xsum: Vec<i32> = x
        .chunks_exact(stride)
        .map(|r| r.iter().map(|&v| i32::from(v)).sum())
        .collect();
    let mut out = vec![0i32; CALL_ROWS * n];
    let mut time = |k: BatchKernel| {
        evict(&w);
        let start = Instant::now();
        for blk in w.chunks_exact(CALL_ROWS * row_bytes) {
            run(k, blk, x, &xsum, &mut out);
        }
        start.elapsed()
    };
    let (mut panels, mut tiles) = (Duration::MAX, Duration::MAX);
    for _ in 0..REPS {
        panels = panels.min(time(BatchKernel::Panels));
        tiles = tiles.min(time(BatchKernel::Tiles));
    }
    if panels <= tiles {
        BatchKernel::Panels
    } else {
        BatchKernel::Tiles
    }
}

/// Flushes `w`'s cache lines, so a repetition reads it from DRAM.
fn evict(w: &[u8]) {
    use std::arch::x86_64::{_mm_clflush, _mm_mfence};
    for line in w.chunks(64) {
        // SAFETY: `clflush` of an address inside `w` (SSE2, x86-64's
        // baseline); it changes no memory contents.
        unsafe { _mm_clflush(line.as_ptr()) };
    }
    // SAFETY: a fence, SSE2.
    unsafe { _mm_mfence() };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spins `reps` times: a stand-in kernel's work.
    fn spin(reps: usize) {
        let mut v = 0u64;
        for i in 0..reps {
            v = std::hint::black_box(v.wrapping_mul(31).wrapping_add(i as u64));
        }
    }

    /// [`panels_from`] with stand-in kernels: the tiles spin 4,000 times a
    /// call; the panels spin `panels(n)` at `n` activation rows.
    fn race(panels: fn(usize) -> usize) -> Option<usize> {
        panels_from(2048, 2048, &mut |k, w, x, xsum, out| {
            let n = xsum.len();
            assert_eq!(
                (w.len(), x.len(), out.len()),
                (CALL_ROWS * 2048, n * 2048, CALL_ROWS * n)
            );
            assert_ne!(k, BatchKernel::Amx);
            spin(if k == BatchKernel::Panels {
                panels(n)
            } else {
                4_000
            });
        })
    }

    #[test]
    fn the_race_finds_where_the_panels_win() {
        assert_eq!(race(|_| 400), Some(PANEL_ACTS_MIN));
        assert_eq!(race(|n| if n < 100 { 40_000 } else { 400 }), Some(128));
        assert_eq!(race(|_| 40_000), None);
    }
}
