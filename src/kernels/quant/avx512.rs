//! AVX-512 activation quantization, bit-identical to the scalar
//! `quantize_activation`: the same IEEE division, the same clamp, and
//! round-to-nearest-even by `vcvtps2dq` with an explicit rounding mode.
//! NaN handling matches the scalar twin: `vmaxps(|v|, m)` returns `m` when
//! `|v|` is NaN, so NaN never reaches the absmax, and a NaN quotient is
//! masked to 0 after the conversion.

use std::arch::x86_64::*;

/// See `quantize_activation`.
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512BW; `x.len() == q.len()`.
#[target_feature(enable = "avx512f,avx512bw")]
pub unsafe fn quantize_activation(x: &[f32], q: &mut [i8]) -> (f32, i32) {
    debug_assert_eq!(x.len(), q.len());
    let n = x.len();
    let (px, pq) = (x.as_ptr(), q.as_mut_ptr());
    let sign = _mm512_set1_epi32(i32::MAX);
    let mut m = _mm512_setzero_ps();
    let mut i = 0;
    while i < n {
        let k = mask16(n - i);
        // SAFETY: the mask enables only floats i..min(n, i + 16); masked-off
        // lanes are not read and load as 0.0, which cannot raise the max.
        let v = unsafe { _mm512_maskz_loadu_ps(k, px.add(i)) };
        let a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), sign));
        m = _mm512_max_ps(a, m);
        i += 16;
    }
    let absmax = _mm512_reduce_max_ps(m);
    if absmax == 0.0 {
        q.fill(0);
        return (0.0, 0);
    }
    let scale = absmax / 127.0;
    let (vs, lo, hi) = (
        _mm512_set1_ps(scale),
        _mm512_set1_ps(-127.0),
        _mm512_set1_ps(127.0),
    );
    let mut sum = _mm512_setzero_si512();
    let mut i = 0;
    while i < n {
        let k = mask16(n - i);
        // SAFETY: as above, only floats i..min(n, i + 16) are read.
        let v = unsafe { _mm512_maskz_loadu_ps(k, px.add(i)) };
        let d = _mm512_div_ps(v, vs);
        // Operand order keeps a NaN quotient NaN (max/min return the second
        // operand when one is NaN), as `f32::clamp` does.
        let c = _mm512_min_ps(hi, _mm512_max_ps(lo, d));
        let ordered = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(d, d);
        let r = _mm512_maskz_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            ordered, c,
        );
        sum = _mm512_add_epi32(sum, r);
        // SAFETY: the mask enables only bytes i..min(n, i + 16) of `q`.
        unsafe { _mm512_mask_cvtepi32_storeu_epi8(pq.add(i).cast(), k, r) };
        i += 16;
    }
    (scale, _mm512_reduce_add_epi32(sum))
}

/// Lanes `0..min(rest, 16)`.
#[inline]
fn mask16(rest: usize) -> __mmask16 {
    if rest >= 16 {
        !0
    } else {
        (1u16 << rest) - 1
    }
}

/// See `scale_sums`: `y[r] = (a[r] as f32 · s[r]) · xs`, 16 lanes a step,
/// the same two IEEE products in the same order (`vcvtdq2ps` rounds to
/// nearest, as `as f32` does).
///
/// # Safety
/// The CPU must support AVX-512F; `a`, `s` and `y` have equal lengths.
#[target_feature(enable = "avx512f")]
pub unsafe fn scale_sums(a: &[i32], s: &[f32], xs: f32, y: &mut [f32]) {
    debug_assert!(a.len() == y.len() && s.len() == y.len());
    let n = y.len();
    let vx = _mm512_set1_ps(xs);
    let mut i = 0;
    while i < n {
        let k = mask16(n - i);
        // SAFETY: the mask enables only elements i..min(n, i + 16) of each
        // slice (equal lengths, the caller's contract).
        unsafe {
            let va = _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(k, a.as_ptr().add(i).cast()));
            let vs = _mm512_maskz_loadu_ps(k, s.as_ptr().add(i));
            let v = _mm512_mul_ps(_mm512_mul_ps(va, vs), vx);
            _mm512_mask_storeu_ps(y.as_mut_ptr().add(i), k, v);
        }
        i += 16;
    }
}
