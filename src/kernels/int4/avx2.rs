//! AVX2 int4 dot over a split activation row: per 32 weight bytes, the low
//! and high nibbles (`and` / `shift + and`) go through `maddubs` against
//! the even and odd activations. Each 16-bit pair is at most 2·15·127 =
//! 3810 and the low + high sum at most 7620: no saturation. `madd` with
//! ones widens to i32; `8·Σx` is subtracted once at the end.

use super::super::int8::avx2_hsum as hsum;
use std::arch::x86_64::*;

/// `Σ q[c]·x[c]` with `q = nibble − 8`, scalar tail.
///
/// # Safety
/// The CPU must support AVX2; `w`, `even` and `odd` have equal lengths;
/// `xsum == Σ even + Σ odd`.
#[target_feature(enable = "avx2")]
pub unsafe fn dot(w: &[u8], even: &[i8], odd: &[i8], xsum: i32) -> i32 {
    debug_assert!(w.len() == even.len() && w.len() == odd.len());
    let n = w.len();
    let (pw, pe, po) = (w.as_ptr(), even.as_ptr(), odd.as_ptr());
    let nib = _mm256_set1_epi8(15);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_si256(); 2];
    let mut i = 0;
    while i + 64 <= n {
        for (k, lane) in acc.iter_mut().enumerate() {
            let j = i + 32 * k;
            // SAFETY: j + 32 <= i + 64 <= n: the three 32-byte loads are in bounds.
            let (vw, ve, vo) = unsafe {
                (
                    _mm256_loadu_si256(pw.add(j).cast()),
                    _mm256_loadu_si256(pe.add(j).cast()),
                    _mm256_loadu_si256(po.add(j).cast()),
                )
            };
            *lane = _mm256_add_epi32(*lane, block(vw, ve, vo, nib, ones));
        }
        i += 64;
    }
    if i + 32 <= n {
        // SAFETY: i + 32 <= n: the three loads are in bounds.
        let (vw, ve, vo) = unsafe {
            (
                _mm256_loadu_si256(pw.add(i).cast()),
                _mm256_loadu_si256(pe.add(i).cast()),
                _mm256_loadu_si256(po.add(i).cast()),
            )
        };
        acc[0] = _mm256_add_epi32(acc[0], block(vw, ve, vo, nib, ones));
        i += 32;
    }
    // Unsigned-nibble sum: SIMD head + scalar tail, then one correction.
    let mut biased = hsum(_mm256_add_epi32(acc[0], acc[1]));
    for j in i..n {
        let b = w[j];
        biased =
            biased.wrapping_add((b & 15) as i32 * even[j] as i32 + (b >> 4) as i32 * odd[j] as i32);
    }
    biased.wrapping_sub(xsum.wrapping_mul(8))
}

/// Eight i32 partial sums `Σ u·x` of one 32-byte (64-column) block.
#[inline]
#[target_feature(enable = "avx2")]
fn block(vw: __m256i, ve: __m256i, vo: __m256i, nib: __m256i, ones: __m256i) -> __m256i {
    let lo = _mm256_and_si256(vw, nib);
    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(vw), nib);
    let pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, ve), _mm256_maddubs_epi16(hi, vo));
    _mm256_madd_epi16(pairs, ones)
}
