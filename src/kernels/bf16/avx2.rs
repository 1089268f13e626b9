//! AVX2+FMA BF16×f32 dot product: the accumulation order of
//! `kernels::f32::avx2::dot` (4 × 8-lane accumulators, scalar tail), with
//! each 8-weight load widened exactly from BF16.

use std::arch::x86_64::*;

/// Loads 8 BF16 weights at `p` as f32.
///
/// # Safety
/// AVX2 must be available and `p..p+8` readable.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load8(p: *const u16) -> __m256 {
    // SAFETY: the caller guarantees 8 readable u16 (16 bytes) at `p`.
    let h = unsafe { _mm_loadu_si128(p as *const __m128i) };
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
}

/// Dot product of equal-length slices.
///
/// # Safety
/// The CPU must support AVX2 and FMA, and `w.len() == x.len()`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot(w: &[u16], x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let n = w.len();
    let (pw, px) = (w.as_ptr(), x.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, lane) in acc.iter_mut().enumerate() {
            // SAFETY: i + 8k + 8 <= i + 32 <= n, so both loads are in bounds.
            unsafe {
                let vw = load8(pw.add(i + 8 * k));
                let vx = _mm256_loadu_ps(px.add(i + 8 * k));
                *lane = _mm256_fmadd_ps(vw, vx, *lane);
            }
        }
        i += 32;
    }
    while i + 8 <= n {
        // SAFETY: i + 8 <= n, so both loads are in bounds.
        unsafe {
            acc[0] = _mm256_fmadd_ps(load8(pw.add(i)), _mm256_loadu_ps(px.add(i)), acc[0]);
        }
        i += 8;
    }
    let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds exactly 8 floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), s) };
    let mut total: f32 = lanes.iter().sum();
    while i < n {
        total += super::widen(w[i]) * x[i];
        i += 1;
    }
    total
}
