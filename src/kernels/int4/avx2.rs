//! AVX2 int4 dot over a split activation row: per 32 weight bytes, the low
//! and high nibbles (`and` / `shift + and`) go through `maddubs` against
//! the even and odd activations. Each 16-bit pair is at most 2·15·127 =
//! 3810 and the low + high sum at most 7620: no saturation. `madd` with
//! ones widens to i32; `8·Σx` is subtracted once at the end.

use super::super::int8::avx2_hsum as hsum;
use super::super::panel256::{self, PanelFormat};
use super::super::tile256::{self, Tile256};
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

/// `out[t·rows + r]` = [`dot`] of weight row `r` with interleaved activation
/// row `t` (the layout of `int4::dot_block`), in tiles of 2 weight rows × 2
/// activation rows: each 32-byte weight vector is unpacked once for both
/// activation rows. Bytes past the last whole 32 take a scalar tail.
///
/// # Safety
/// The CPU must support AVX2; the layout and shapes of `int4::dot_block`
/// hold; `xsum[t] == Σ x[t, :]`.
#[target_feature(enable = "avx2")]
pub unsafe fn dot_block(
    w: &[u8],
    row_bytes: usize,
    x: &[i8],
    stride: usize,
    xsum: &[i32],
    out: &mut [i32],
) {
    let n = xsum.len();
    debug_assert!(stride.is_multiple_of(128) && stride >= 2 * row_bytes && x.len() == n * stride);
    let correct = |t: usize, a: i32| a.wrapping_sub(xsum[t].wrapping_mul(8));
    // SAFETY: the caller's contract is `tile256::dot_block`'s for this format.
    unsafe { tile256::dot_block::<Nibbles>(w, row_bytes, x, stride, n, out, correct) }
}

/// int4's AVX2 tile: the low and high nibbles of each weight byte against
/// the even and odd activations.
struct Nibbles;

impl Tile256 for Nibbles {
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn tile<const R: usize, const T: usize>(
        w: &[u8],
        row_bytes: usize,
        x: &[i8],
        stride: usize,
        r0: usize,
        t0: usize,
    ) -> [[i32; T]; R] {
        // SAFETY: the trait's contract is `tile`'s.
        unsafe { tile::<R, T>(w, row_bytes, x, stride, r0, t0) }
    }
}

/// The biased sums `Σ u·x` (`u = q + 8`) of weight rows `r0..r0 + R` with
/// activation rows `t0..t0 + T`.
///
/// # Safety
/// The CPU must support AVX2; the layout of `int4::dot_block`; the rows of
/// the tile exist.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn tile<const R: usize, const T: usize>(
    w: &[u8],
    rb: usize,
    x: &[i8],
    stride: usize,
    r0: usize,
    t0: usize,
) -> [[i32; T]; R] {
    let w = &w[r0 * rb..(r0 + R) * rb];
    let x = &x[t0 * stride..(t0 + T) * stride];
    let (nib, ones) = (_mm256_set1_epi8(15), _mm256_set1_epi16(1));
    let mut acc = [[_mm256_setzero_si256(); T]; R];
    let whole = rb - rb % 32;
    for j in (0..whole).step_by(32) {
        let at = j / 64 * 128 + j % 64;
        // SAFETY: j + 32 <= rb: in bounds of each weight row; `at + 96 <=
        // 2·rb.next_multiple_of(64) <= stride`: in bounds of each activation row.
        let vw: [__m256i; R] = std::array::from_fn(|r| unsafe {
            _mm256_loadu_si256(w.as_ptr().add(r * rb + j).cast())
        });
        let lo = vw.map(|v| _mm256_and_si256(v, nib));
        let hi = vw.map(|v| _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib));
        #[allow(clippy::needless_range_loop)] // acc is indexed [r][t]: a register tile
        for t in 0..T {
            // SAFETY: as above.
            let (ve, vo) = unsafe {
                let p = x.as_ptr().add(t * stride + at);
                (
                    _mm256_loadu_si256(p.cast()),
                    _mm256_loadu_si256(p.add(64).cast()),
                )
            };
            for r in 0..R {
                let pairs = _mm256_add_epi16(
                    _mm256_maddubs_epi16(lo[r], ve),
                    _mm256_maddubs_epi16(hi[r], vo),
                );
                acc[r][t] = _mm256_add_epi32(acc[r][t], _mm256_madd_epi16(pairs, ones));
            }
        }
    }
    std::array::from_fn(|r| {
        std::array::from_fn(|t| {
            let x = &x[t * stride..(t + 1) * stride];
            let tail = (whole..rb).fold(0i32, |s, j| {
                let (b, at) = (w[r * rb + j], j / 64 * 128 + j % 64);
                s.wrapping_add((b & 15) as i32 * x[at] as i32 + (b >> 4) as i32 * x[at + 64] as i32)
            });
            hsum(acc[r][t]).wrapping_add(tail)
        })
    })
}

/// [`dot_block`] by the AVX2 panels (`kernels::panel256`): the weight block
/// repacked once per call into unpacked nibble panels, for many activation
/// rows.
///
/// # Safety
/// As [`dot_block`].
#[target_feature(enable = "avx2")]
pub unsafe fn dot_panels(
    w: &[u8],
    row_bytes: usize,
    x: &[i8],
    stride: usize,
    xsum: &[i32],
    out: &mut [i32],
) {
    // SAFETY: the caller's contract is `panel256::dot_panels`'s for this
    // format (strides are multiples of 128, xsum[t] = Σ x[t, :]).
    unsafe { panel256::dot_panels::<Nibbles>(w, row_bytes, x, stride, xsum, out) }
}

impl PanelFormat for Nibbles {
    const X_PER_STEP: usize = 128;
    const TILE: (usize, usize) = (2, 4);

    /// Dword `j` of a 64-byte weight step holds columns `2(4j + k)` (low
    /// nibbles) and `2(4j + k) + 1` (high), which meet quad `j` of the
    /// step's even activations and quad `16 + j` of its odd ones.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn pack_step(t: [[__m256i; 8]; 2], out: *mut __m256i) {
        let nib = _mm256_set1_epi8(15);
        for (h, half) in t.iter().enumerate() {
            for (j, &v) in half.iter().enumerate() {
                let lo = _mm256_and_si256(v, nib);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib);
                // SAFETY: `out` has room for 32 vectors (X_PER_STEP / 4).
                unsafe {
                    out.add(8 * h + j).write(lo);
                    out.add(16 + 8 * h + j).write(hi);
                }
            }
        }
    }

    /// `vpmaddubsw` of the unsigned nibbles (0..15) with the activation
    /// quads: each 16-bit pair is at most 2·15·128 = 3840 in magnitude, so
    /// eight quads sum in 16-bit lanes (≤ 30720) before one `vpmaddwd`
    /// widens them into the i32 accumulators.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn tile<const G: usize, const T: usize>(
        pw: *const __m256i,
        quads: usize,
        px: *const i8,
        stride: usize,
    ) -> [[__m256i; T]; G] {
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_si256(); T]; G];
        for k0 in (0..quads).step_by(8) {
            let mut pairs = [[_mm256_setzero_si256(); T]; G];
            for k in k0..k0 + 8 {
                // SAFETY: k < quads: vector k of each panel, and bytes
                // 4k..4k + 4 of each activation row (the trait's contract).
                unsafe {
                    let vw: [__m256i; G] = std::array::from_fn(|g| *pw.add(g * quads + k));
                    #[allow(clippy::needless_range_loop)] // a register tile
                    for t in 0..T {
                        let at = px.add(t * stride + 4 * k).cast::<i32>();
                        let vx = _mm256_set1_epi32(at.read_unaligned());
                        for g in 0..G {
                            let p = _mm256_maddubs_epi16(vw[g], vx);
                            pairs[g][t] = _mm256_add_epi16(pairs[g][t], p);
                        }
                    }
                }
            }
            for g in 0..G {
                for t in 0..T {
                    let wide = _mm256_madd_epi16(pairs[g][t], ones);
                    acc[g][t] = _mm256_add_epi32(acc[g][t], wide);
                }
            }
        }
        acc
    }

    fn correct(xsum: i32) -> i32 {
        xsum.wrapping_mul(-8)
    }
}
