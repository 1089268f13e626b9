//! f32 kernels: dot product, matrix-vector and matrix-matrix products over
//! row-major weights `(rows, cols)` as PyTorch's `Linear` stores them
//! (`y = W x`). The scalar functions here are the reference twins of the
//! AVX2 and AVX-512 versions; all accumulate in f32 with several partial sums.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

use super::cpu::{isa, Isa};

/// Scalar reference dot product (8 interleaved partial sums, like the SIMD lanes).
pub fn dot_scalar(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8 * 8;
    for i in (0..chunks).step_by(8) {
        for l in 0..8 {
            acc[l] += a[i + l] * b[i + l];
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for i in chunks..a.len() {
        s += a[i] * b[i];
    }
    s
}

/// Dot product, dispatched to the best ISA.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: length mismatch");
    #[cfg(target_arch = "x86_64")]
    match isa() {
        // SAFETY: `isa()` reported AVX-512F on this CPU; lengths are equal (asserted).
        Isa::Avx512 | Isa::Avx512Vnni => return unsafe { avx512::dot(a, b) },
        // SAFETY: `isa()` reported AVX2 and FMA on this CPU; lengths are equal (asserted).
        Isa::Avx2 => return unsafe { avx2::dot(a, b) },
        Isa::Scalar => {}
    }
    dot_scalar(a, b)
}

/// `y[r] = W[r, :] · x` for `W` of shape `(rows, cols)`.
pub fn matvec(w: &[f32], rows: usize, cols: usize, x: &[f32], y: &mut [f32]) {
    matmul(w, rows, cols, x, 1, y)
}

/// `Y[t, r] = W[r, :] · X[t, :]` for `n` rows of `X` `(n, cols)` into `Y` `(n, rows)`.
pub fn matmul(w: &[f32], rows: usize, cols: usize, x: &[f32], n: usize, y: &mut [f32]) {
    assert_eq!(w.len(), rows * cols);
    super::matmul_rows(rows, cols, x, n, y, |r, xr| {
        dot(&w[r * cols..(r + 1) * cols], xr)
    });
}

/// The AVX2 version, for the BF16 kernels' twin tests.
#[cfg(all(test, target_arch = "x86_64"))]
pub(crate) use avx2::dot as avx2_dot;
/// The AVX-512 version, for the BF16 kernels' twin tests.
#[cfg(all(test, target_arch = "x86_64"))]
pub(crate) use avx512::dot as avx512_dot;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rel_close(a: f32, b: f32, scale: f32) -> bool {
        (a - b).abs() <= 1e-6 * scale.max(1.0)
    }

    fn abs_dot(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| (x * y).abs()).sum()
    }

    proptest! {
        #[test]
        fn simd_dot_matches_scalar_twin(v in proptest::collection::vec(-4.0f32..4.0, 0..300)) {
            let w: Vec<f32> = v.iter().rev().map(|x| x * 0.5 - 0.1).collect();
            let scale = abs_dot(&v, &w);
            #[cfg(target_arch = "x86_64")]
            {
                if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                    // SAFETY: AVX2 and FMA detected just above; equal lengths.
                    let s = unsafe { avx2::dot(&v, &w) };
                    prop_assert!(rel_close(s, dot_scalar(&v, &w), scale));
                }
                if is_x86_feature_detected!("avx512f") {
                    // SAFETY: AVX-512F detected just above; equal lengths.
                    let s = unsafe { avx512::dot(&v, &w) };
                    prop_assert!(rel_close(s, dot_scalar(&v, &w), scale));
                }
            }
            let exact: f64 = v.iter().zip(&w).map(|(a, b)| *a as f64 * *b as f64).sum();
            prop_assert!((dot_scalar(&v, &w) as f64 - exact).abs() <= 1e-5 * (scale as f64).max(1.0));
        }

        #[test]
        fn matmul_rows_equal_matvec(rows in 1usize..20, cols in 1usize..40, n in 1usize..5) {
            let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 7 % 13) as f32 - 6.0) / 7.0).collect();
            let x: Vec<f32> = (0..n * cols).map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0).collect();
            let mut y = vec![0f32; n * rows];
            matmul(&w, rows, cols, &x, n, &mut y);
            for t in 0..n {
                let mut yv = vec![0f32; rows];
                matvec(&w, rows, cols, &x[t * cols..(t + 1) * cols], &mut yv);
                prop_assert_eq!(&y[t * rows..(t + 1) * rows], &yv[..]);
            }
        }
    }

    #[test]
    fn named_regression_lengths() {
        for len in [0usize, 1, 7, 8, 9, 15, 16, 17, 31, 33, 1023] {
            let a: Vec<f32> = (0..len).map(|i| (i as f32).sin()).collect();
            let b: Vec<f32> = (0..len).map(|i| (i as f32 * 0.3).cos()).collect();
            let s = dot(&a, &b);
            assert!(
                rel_close(s, dot_scalar(&a, &b), abs_dot(&a, &b)),
                "len {len}"
            );
        }
    }
}
