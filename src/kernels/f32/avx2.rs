//! AVX2+FMA f32 dot product: 4 × 8-lane accumulators, scalar tail.

use std::arch::x86_64::*;

/// Dot product of equal-length slices.
///
/// # Safety
/// The CPU must support AVX2 and FMA, and `a.len() == b.len()`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, lane) in acc.iter_mut().enumerate() {
            // SAFETY: i + 8k + 8 <= i + 32 <= n, so both 8-float loads are in bounds.
            unsafe {
                let va = _mm256_loadu_ps(pa.add(i + 8 * k));
                let vb = _mm256_loadu_ps(pb.add(i + 8 * k));
                *lane = _mm256_fmadd_ps(va, vb, *lane);
            }
        }
        i += 32;
    }
    while i + 8 <= n {
        // SAFETY: i + 8 <= n, so both loads are in bounds.
        unsafe {
            acc[0] = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i)),
                _mm256_loadu_ps(pb.add(i)),
                acc[0],
            );
        }
        i += 8;
    }
    let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds exactly 8 floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), s) };
    let mut total: f32 = lanes.iter().sum();
    while i < n {
        total += a[i] * b[i];
        i += 1;
    }
    total
}
