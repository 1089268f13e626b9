//! AVX2 int8 dot: the sign trick. `maddubs` multiplies unsigned by signed
//! bytes, so feed it `|w|` (as u8; |-128| = 128 is exact) and `x` with the
//! sign of `w` applied (`x` is never -128, so negating it is exact). Each
//! 16-bit pair sum is at most 2·128·127 = 32512: no saturation. `madd`
//! with ones widens the pairs to i32 lanes.

use super::super::panel256::{self, PanelFormat};
use super::super::tile256::{self, Tile256};
use std::arch::x86_64::*;

/// `Σ w[c]·x[c]` over 32-byte blocks, scalar tail.
///
/// # Safety
/// The CPU must support AVX2, `w.len() == x.len()`, and `x` must not hold
/// -128.
#[target_feature(enable = "avx2")]
pub unsafe fn dot(w: &[u8], x: &[i8]) -> i32 {
    debug_assert_eq!(w.len(), x.len());
    let n = w.len();
    let (pw, px) = (w.as_ptr(), x.as_ptr());
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_si256(); 2];
    let mut i = 0;
    while i + 64 <= n {
        for (k, lane) in acc.iter_mut().enumerate() {
            // SAFETY: i + 32k + 32 <= i + 64 <= n: both 32-byte loads are in bounds.
            let (vw, vx) = unsafe {
                (
                    _mm256_loadu_si256(pw.add(i + 32 * k).cast()),
                    _mm256_loadu_si256(px.add(i + 32 * k).cast()),
                )
            };
            *lane = _mm256_add_epi32(*lane, block(vw, vx, ones));
        }
        i += 64;
    }
    if i + 32 <= n {
        // SAFETY: i + 32 <= n: both loads are in bounds.
        let (vw, vx) = unsafe {
            (
                _mm256_loadu_si256(pw.add(i).cast()),
                _mm256_loadu_si256(px.add(i).cast()),
            )
        };
        acc[0] = _mm256_add_epi32(acc[0], block(vw, vx, ones));
        i += 32;
    }
    let mut total = hsum(_mm256_add_epi32(acc[0], acc[1]));
    for c in i..n {
        total = total.wrapping_add(w[c] as i8 as i32 * x[c] as i32);
    }
    total
}

/// Eight i32 partial sums of one 32-byte block.
#[inline]
#[target_feature(enable = "avx2")]
fn block(vw: __m256i, vx: __m256i, ones: __m256i) -> __m256i {
    let pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(vw), _mm256_sign_epi8(vx, vw));
    _mm256_madd_epi16(pairs, ones)
}

/// Wrapping sum of eight i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn hsum(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// `out[t·rows + r]` = [`dot`] of weight row `r` with activation row `t` (the
/// layout of `int8::dot_block`), in tiles of 2 weight rows × 2 activation
/// rows: each weight vector is loaded and made absolute once for both
/// activation rows. Bytes past the last whole 32 take a scalar tail.
///
/// # Safety
/// The CPU must support AVX2; the layout and shapes of `int8::dot_block`
/// hold; `x` holds no -128.
#[target_feature(enable = "avx2")]
pub unsafe fn dot_block(w: &[u8], cols: usize, x: &[i8], stride: usize, n: usize, out: &mut [i32]) {
    debug_assert!(stride.is_multiple_of(64) && stride >= cols && x.len() == n * stride);
    // SAFETY: the caller's contract is `tile256::dot_block`'s for this format.
    unsafe { tile256::dot_block::<Signed>(w, cols, x, stride, n, out, |_, a| a) }
}

/// int8's AVX2 tile: weights made absolute against sign-moved activations.
struct Signed;

impl Tile256 for Signed {
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn tile<const R: usize, const T: usize>(
        w: &[u8],
        cols: usize,
        x: &[i8],
        stride: usize,
        r0: usize,
        t0: usize,
    ) -> [[i32; T]; R] {
        // SAFETY: the trait's contract is `tile`'s.
        unsafe { tile::<R, T>(w, cols, x, stride, r0, t0) }
    }
}

/// The sums `Σ w·x` of weight rows `r0..r0 + R` with activation rows
/// `t0..t0 + T`.
///
/// # Safety
/// The CPU must support AVX2; the layout of `int8::dot_block`; the rows of
/// the tile exist; `x` holds no -128.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn tile<const R: usize, const T: usize>(
    w: &[u8],
    cols: usize,
    x: &[i8],
    stride: usize,
    r0: usize,
    t0: usize,
) -> [[i32; T]; R] {
    let w = &w[r0 * cols..(r0 + R) * cols];
    let x = &x[t0 * stride..(t0 + T) * stride];
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_si256(); T]; R];
    let whole = cols - cols % 32;
    for j in (0..whole).step_by(32) {
        // SAFETY: j + 32 <= cols <= stride: in bounds of every row.
        let vw: [__m256i; R] = std::array::from_fn(|r| unsafe {
            _mm256_loadu_si256(w.as_ptr().add(r * cols + j).cast())
        });
        let aw = vw.map(|v| _mm256_abs_epi8(v));
        #[allow(clippy::needless_range_loop)] // acc is indexed [r][t]: a register tile
        for t in 0..T {
            // SAFETY: as above.
            let vx = unsafe { _mm256_loadu_si256(x.as_ptr().add(t * stride + j).cast()) };
            for r in 0..R {
                let pairs = _mm256_maddubs_epi16(aw[r], _mm256_sign_epi8(vx, vw[r]));
                acc[r][t] = _mm256_add_epi32(acc[r][t], _mm256_madd_epi16(pairs, ones));
            }
        }
    }
    std::array::from_fn(|r| {
        std::array::from_fn(|t| {
            let tail = (whole..cols).fold(0i32, |s, c| {
                s.wrapping_add(w[r * cols + c] as i8 as i32 * x[t * stride + c] as i32)
            });
            hsum(acc[r][t]).wrapping_add(tail)
        })
    })
}

/// The AVX2 peak probe: `steps` rounds of six independent
/// `vpmaddubsw` → `vpmaddwd` → `vpaddd` chains (the AVX2 dots' own
/// sequence, 32 multiply-adds each) on registers, no loads; returns the
/// wrapped sum of the accumulators so the work cannot be dropped. The body
/// is inline assembly so the compiler cannot hoist the loop-invariant
/// products out of the loop.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub unsafe fn maddubs_peak(steps: usize, a: i32, b: i32) -> i32 {
    let (va, vb, ones) = (
        _mm256_set1_epi32(a),
        _mm256_set1_epi32(b),
        _mm256_set1_epi16(1),
    );
    let mut c: [__m256i; 6] = std::array::from_fn(|k| _mm256_set1_epi32(k as i32));
    for _ in 0..steps {
        // SAFETY: register-only AVX2 arithmetic (AVX2 is this function's
        // precondition); no memory is touched.
        unsafe {
            std::arch::asm!(
                "vpmaddubsw {t0}, {a}, {b}",
                "vpmaddubsw {t1}, {a}, {b}",
                "vpmaddubsw {t2}, {a}, {b}",
                "vpmaddubsw {t3}, {a}, {b}",
                "vpmaddubsw {t4}, {a}, {b}",
                "vpmaddubsw {t5}, {a}, {b}",
                "vpmaddwd {t0}, {t0}, {o}",
                "vpmaddwd {t1}, {t1}, {o}",
                "vpmaddwd {t2}, {t2}, {o}",
                "vpmaddwd {t3}, {t3}, {o}",
                "vpmaddwd {t4}, {t4}, {o}",
                "vpmaddwd {t5}, {t5}, {o}",
                "vpaddd {c0}, {c0}, {t0}",
                "vpaddd {c1}, {c1}, {t1}",
                "vpaddd {c2}, {c2}, {t2}",
                "vpaddd {c3}, {c3}, {t3}",
                "vpaddd {c4}, {c4}, {t4}",
                "vpaddd {c5}, {c5}, {t5}",
                a = in(ymm_reg) va,
                b = in(ymm_reg) vb,
                o = in(ymm_reg) ones,
                c0 = inout(ymm_reg) c[0],
                c1 = inout(ymm_reg) c[1],
                c2 = inout(ymm_reg) c[2],
                c3 = inout(ymm_reg) c[3],
                c4 = inout(ymm_reg) c[4],
                c5 = inout(ymm_reg) c[5],
                t0 = out(ymm_reg) _,
                t1 = out(ymm_reg) _,
                t2 = out(ymm_reg) _,
                t3 = out(ymm_reg) _,
                t4 = out(ymm_reg) _,
                t5 = out(ymm_reg) _,
                options(nomem, nostack, preserves_flags),
            );
        }
    }
    let sum = c
        .iter()
        .fold(_mm256_setzero_si256(), |s, &v| _mm256_add_epi32(s, v));
    hsum(sum)
}

/// [`dot_block`] by the AVX2 panels (`kernels::panel256`): the weight block
/// repacked once per call into 8-row panels, for many activation rows.
///
/// # Safety
/// As [`dot_block`]; `xsum.len()` is the number of activation rows.
#[target_feature(enable = "avx2")]
pub unsafe fn dot_panels(
    w: &[u8],
    cols: usize,
    x: &[i8],
    stride: usize,
    xsum: &[i32],
    out: &mut [i32],
) {
    // SAFETY: the caller's contract is `panel256::dot_panels`'s for this
    // format (strides are multiples of 64; the sums need no correction).
    unsafe { panel256::dot_panels::<Signed>(w, cols, x, stride, xsum, out) }
}

impl PanelFormat for Signed {
    const X_PER_STEP: usize = 64;
    const TILE: (usize, usize) = (2, 4);

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn pack_step(t: [[__m256i; 8]; 2], out: *mut __m256i) {
        for (h, half) in t.iter().enumerate() {
            for (j, &v) in half.iter().enumerate() {
                // SAFETY: `out` has room for 16 vectors (X_PER_STEP / 4).
                unsafe { out.add(8 * h + j).write(v) };
            }
        }
    }

    /// The sign trick of [`dot`], with `|w|` taken once per panel vector
    /// for all `T` activation rows.
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
        for k in 0..quads {
            // SAFETY: k < quads: vector k of each panel, and bytes 4k..4k + 4
            // of each activation row (the trait's contract).
            unsafe {
                let vw: [__m256i; G] = std::array::from_fn(|g| *pw.add(g * quads + k));
                let aw = vw.map(|v| _mm256_abs_epi8(v));
                #[allow(clippy::needless_range_loop)] // a register tile
                for t in 0..T {
                    let at = px.add(t * stride + 4 * k).cast::<i32>();
                    let vx = _mm256_set1_epi32(at.read_unaligned());
                    for g in 0..G {
                        let p = _mm256_maddubs_epi16(aw[g], _mm256_sign_epi8(vx, vw[g]));
                        acc[g][t] = _mm256_add_epi32(acc[g][t], _mm256_madd_epi16(p, ones));
                    }
                }
            }
        }
        acc
    }

    fn correct(_xsum: i32) -> i32 {
        0
    }
}
