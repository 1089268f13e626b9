//! AVX-512F BF16×f32 dot product: the accumulation order of
//! `kernels::f32::avx512::dot` (2 × 16-lane accumulators, masked tail), with
//! each 16-weight load widened exactly from BF16.

use std::arch::x86_64::*;

/// Loads the BF16 weights at `p` selected by `m` as f32 (others 0).
///
/// # Safety
/// AVX-512F/BW must be available and the masked lanes of `p..p+16` readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn load16(p: *const u16, m: __mmask16) -> __m512 {
    // SAFETY: only lanes enabled by `m` are read, and the caller guarantees those are in bounds.
    let h = unsafe { _mm256_maskz_loadu_epi16(m, p as *const i16) };
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
}

/// Dot product of equal-length slices.
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512BW, and `w.len() == x.len()`.
#[target_feature(enable = "avx512f,avx512bw")]
pub unsafe fn dot(w: &[u16], x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let n = w.len();
    let (pw, px) = (w.as_ptr(), x.as_ptr());
    let mut acc0 = _mm512_setzero_ps();
    let mut acc1 = _mm512_setzero_ps();
    let mut i = 0;
    while i + 32 <= n {
        // SAFETY: i + 32 <= n, so all loads are in bounds.
        unsafe {
            acc0 = _mm512_fmadd_ps(load16(pw.add(i), 0xffff), _mm512_loadu_ps(px.add(i)), acc0);
            acc1 = _mm512_fmadd_ps(
                load16(pw.add(i + 16), 0xffff),
                _mm512_loadu_ps(px.add(i + 16)),
                acc1,
            );
        }
        i += 32;
    }
    if i < n {
        let rest = n - i;
        let m: __mmask16 = if rest >= 16 {
            0xffff
        } else {
            (1u16 << rest) - 1
        };
        // SAFETY: the mask enables only lanes i..i+min(rest,16) < n.
        unsafe {
            acc0 = _mm512_fmadd_ps(
                load16(pw.add(i), m),
                _mm512_maskz_loadu_ps(m, px.add(i)),
                acc0,
            );
        }
        i += rest.min(16);
        if i < n {
            let m2: __mmask16 = (1u16 << (n - i)) - 1;
            // SAFETY: n - i < 16 lanes remain, all in bounds under the mask.
            unsafe {
                acc1 = _mm512_fmadd_ps(
                    load16(pw.add(i), m2),
                    _mm512_maskz_loadu_ps(m2, px.add(i)),
                    acc1,
                );
            }
        }
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1))
}
