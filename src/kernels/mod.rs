//! Compute kernels. Each format lives in its own folder with the scalar
//! reference (always compiled) beside its SIMD versions; the best version is
//! picked once at run time from the CPU's features ([`cpu`]).

pub mod bf16;
pub mod cpu;
pub mod f32;

use rayon::prelude::*;

/// Below this many multiply-adds a product runs on the calling thread.
const PARALLEL_MACS_MIN: usize = 1 << 18;

/// `Y[t, r] = row_dot(r, X[t, :])` for `n` rows of `X` `(n, cols)` into `Y`
/// `(n, rows)`: the shared skeleton of every format's matmul. Each weight row
/// is streamed once for all `n` inputs; rows are split over rayon workers
/// when the product is large enough to pay for it.
pub fn matmul_rows(
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    row_dot: impl Fn(usize, &[f32]) -> f32 + Sync,
) {
    assert_eq!(x.len(), n * cols);
    assert_eq!(y.len(), n * rows);
    let big = rows * cols * n >= PARALLEL_MACS_MIN;
    if n == 1 {
        let body = |(r, yr): (usize, &mut f32)| *yr = row_dot(r, x);
        if big {
            y.par_iter_mut().enumerate().with_min_len(16).for_each(body);
        } else {
            y.iter_mut().enumerate().for_each(body);
        }
        return;
    }
    // Compute transposed (rows, n) so each task owns a contiguous output block.
    let mut yt = vec![0f32; rows * n];
    let body = |(r, out): (usize, &mut [f32])| {
        for (t, o) in out.iter_mut().enumerate() {
            *o = row_dot(r, &x[t * cols..(t + 1) * cols]);
        }
    };
    if big {
        yt.par_chunks_mut(n)
            .enumerate()
            .with_min_len(8)
            .for_each(body);
    } else {
        yt.chunks_mut(n).enumerate().for_each(body);
    }
    for r in 0..rows {
        for t in 0..n {
            y[t * rows + r] = yt[r * n + t];
        }
    }
}
