//! AVX-512F f32 dot product: 2 × 16-lane accumulators, masked tail.

use std::arch::x86_64::*;

/// Dot product of equal-length slices.
///
/// # Safety
/// The CPU must support AVX-512F, and `a.len() == b.len()`.
#[target_feature(enable = "avx512f")]
pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc0 = _mm512_setzero_ps();
    let mut acc1 = _mm512_setzero_ps();
    let mut i = 0;
    while i + 32 <= n {
        // SAFETY: i + 32 <= n, so all four 16-float loads are in bounds.
        unsafe {
            acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i)), _mm512_loadu_ps(pb.add(i)), acc0);
            acc1 = _mm512_fmadd_ps(
                _mm512_loadu_ps(pa.add(i + 16)),
                _mm512_loadu_ps(pb.add(i + 16)),
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
        // SAFETY: the mask enables only lanes i..i+min(rest,16) < n; masked-off
        // lanes are not read.
        unsafe {
            let va = _mm512_maskz_loadu_ps(m, pa.add(i));
            let vb = _mm512_maskz_loadu_ps(m, pb.add(i));
            acc0 = _mm512_fmadd_ps(va, vb, acc0);
        }
        i += rest.min(16);
        if i < n {
            let m2: __mmask16 = (1u16 << (n - i)) - 1;
            // SAFETY: n - i < 16 lanes remain, all in bounds under the mask.
            unsafe {
                let va = _mm512_maskz_loadu_ps(m2, pa.add(i));
                let vb = _mm512_maskz_loadu_ps(m2, pb.add(i));
                acc1 = _mm512_fmadd_ps(va, vb, acc1);
            }
        }
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1))
}
