//! AVX2 grouped dots: each 32-column chunk is unpacked once into 32 levels
//! in column order (int4: one 16-byte broadcast, a per-lane shift and a
//! mask; int2: one 8-byte broadcast and shifts by 0, 2, 4, 6; int3: int2
//! plus the high bits spread by a byte shuffle and a bit test), then meets
//! each of the `T` activation rows in `maddubs` (levels ≤ 7 or 15 times
//! |x| ≤ 127: pairs ≤ 3810, no saturation) and `madd` with ones, so i32
//! lane `l` sums columns `4l..4l + 4`; the lanes of a group total its exact
//! `Σ u·x`. [`fold_row`] takes eight groups' lanes at a time to their eight
//! sums (one horizontal sum) and folds them into the f32 lanes with one
//! `fmadd` a term, as the defined order says (group `g` in lane `g mod 8`).

use super::{ActRow, GBits, GFormat, CHUNK, LANES};
use std::arch::x86_64::*;

/// How far ahead of the group being read the dots prefetch the weights (as
/// the GGUF kernels do): with the hardware prefetchers alone the one-row
/// matmul of a 6144x2048 q4g64 matrix ran at half the speed
/// (results/kernels.md).
pub(super) const PREFETCH_AHEAD: usize = 4096;

/// The defined dot of one weight row with `T` activation rows (see
/// `grouped::dot_scalar`).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; the shapes of
/// `grouped::dot_scalar` hold (checked by the caller).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot<const T: usize>(
    f: GFormat,
    w: &[u8],
    params: &[u16],
    acts: [ActRow<'_>; T],
) -> [f32; T] {
    let (cb, per) = (f.chunk_bytes(), f.group().cols() / CHUNK);
    let ones = _mm256_set1_epi16(1);
    fold_row(f, params, &acts, |g| {
        // A hint, never a fault, wherever it points.
        _mm_prefetch::<_MM_HINT_T0>(
            w.as_ptr()
                .wrapping_add(g * per * cb + PREFETCH_AHEAD)
                .cast(),
        );
        let mut p = [_mm256_setzero_si256(); T];
        for k in g * per..(g + 1) * per {
            // SAFETY: chunk k < groups·per lies inside the row (shape checked).
            let u = unsafe { unpack(f.bits(), w.as_ptr().add(k * cb)) };
            for (p, a) in p.iter_mut().zip(&acts) {
                // SAFETY: x holds groups·per·32 bytes (shape checked).
                let x = unsafe { _mm256_loadu_si256(a.x.as_ptr().add(k * CHUNK).cast()) };
                let s = _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), ones);
                *p = _mm256_add_epi32(*p, s);
            }
        }
        p
    })
}

/// `out[r]` = [`dot`] of weight row `r` of `w` (`out.len()` packed rows,
/// `params` their companions, row after row) with the one activation row.
///
/// # Safety
/// As [`dot`], for every row; `w` and `params` hold `out.len()` whole rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_rows(f: GFormat, w: &[u8], params: &[u16], act: ActRow<'_>, out: &mut [f32]) {
    let (rb, pr) = (w.len() / out.len(), params.len() / out.len());
    for (r, o) in out.iter_mut().enumerate() {
        let (w, p) = (&w[r * rb..(r + 1) * rb], &params[r * pr..(r + 1) * pr]);
        // SAFETY: the caller's contract for `dot`, for row r.
        [*o] = unsafe { dot(f, w, p, [act]) };
    }
}

/// The 32 levels of the chunk at `p`, in column order.
///
/// # Safety
/// The CPU must support AVX2; `p` points at one whole chunk of `bits`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn unpack(bits: GBits, p: *const u8) -> __m256i {
    // SAFETY: a chunk is 16 (int4), 8 (int2) or 12 (int3) readable bytes.
    unsafe {
        match bits {
            GBits::Q4 => {
                let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast()));
                let v = _mm256_srlv_epi64(v, _mm256_set_epi64x(4, 4, 0, 0));
                _mm256_and_si256(v, _mm256_set1_epi8(15))
            }
            GBits::Q2 => low2(p),
            GBits::Q3 => {
                let hi = _mm256_set1_epi32(p.add(8).cast::<i32>().read_unaligned());
                let spread = _mm256_shuffle_epi8(
                    hi,
                    _mm256_set_epi64x(
                        0x0303030303030303,
                        0x0202020202020202,
                        0x0101010101010101,
                        0,
                    ),
                );
                let bit = _mm256_set1_epi64x(0x8040201008040201u64 as i64);
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
                _mm256_or_si256(low2(p), _mm256_and_si256(set, _mm256_set1_epi8(4)))
            }
        }
    }
}

/// The low two bits of 32 levels from the 8 bytes at `p`.
///
/// # Safety
/// The CPU must support AVX2; `p` has 8 readable bytes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn low2(p: *const u8) -> __m256i {
    // SAFETY: 8 readable bytes (the caller's contract).
    let v = _mm256_set1_epi64x(unsafe { p.cast::<i64>().read_unaligned() });
    let v = _mm256_srlv_epi64(v, _mm256_set_epi64x(6, 4, 2, 0));
    _mm256_and_si256(v, _mm256_set1_epi8(3))
}

/// The defined fold of a row's groups (see the `grouped` module doc) for
/// `T` activation rows: `group(g)` gives group `g`'s `i32` lanes (whose
/// total is its `Σ u·x`) for each row. Eight groups at a time take one
/// horizontal sum ([`hsum8`]) and one `fmadd` a term ([`fold8`]), group `g`
/// landing in lane `g mod 8`; a last short block goes through the scalar
/// twin's steps. Returns the defined `reduce8` of each row's lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn fold_row<const T: usize>(
    f: GFormat,
    params: &[u16],
    acts: &[ActRow<'_>; T],
    mut group: impl FnMut(usize) -> [__m256i; T],
) -> [f32; T] {
    let groups = acts.first().map_or(0, |a| a.xs.len());
    let whole = groups - groups % LANES;
    let mut lanes = [_mm256_setzero_ps(); T];
    for g0 in (0..whole).step_by(LANES) {
        let p: [[__m256i; T]; LANES] = std::array::from_fn(|j| group(g0 + j));
        for (t, lanes) in lanes.iter_mut().enumerate() {
            let s = hsum8(&std::array::from_fn(|j| p[j][t]));
            // SAFETY: groups g0..g0 + 8 exist (g0 + 8 <= whole).
            unsafe { fold8(f, params, acts[t].xs, g0, s, lanes) };
        }
    }
    fold_tail(f, params, acts, lanes, whole, |g| group(g).map(|p| hsum(p)))
}

/// The end of [`fold_row`]: groups `whole‥` (fewer than eight, `sums(g)`
/// their sums for each activation row) through the scalar twin's steps,
/// then the defined `reduce8` of each row's lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn fold_tail<const T: usize>(
    f: GFormat,
    params: &[u16],
    acts: &[ActRow<'_>; T],
    lanes: [__m256; T],
    whole: usize,
    mut sums: impl FnMut(usize) -> [i32; T],
) -> [f32; T] {
    let groups = acts.first().map_or(0, |a| a.xs.len());
    let mut out = [[0f32; LANES]; T];
    for (o, l) in out.iter_mut().zip(lanes) {
        // SAFETY: 8 f32 of `o`.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), l) };
    }
    for g in whole..groups {
        for ((o, s), a) in out.iter_mut().zip(sums(g)).zip(acts) {
            super::fold_group(f, params, g, s, a.xs[g], &mut o[g % LANES]);
        }
    }
    out.map(super::reduce8)
}

/// Groups `g0‥g0 + 8` (their sums `s`) into `lanes`, as the defined fold
/// does.
///
/// # Safety
/// `g0 + 8 <= xs.len()`, and `params` holds the row's `xs.len()` scales
/// (and as many mins after them).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn fold8(
    f: GFormat,
    params: &[u16],
    xs: &[i32],
    g0: usize,
    s: __m256i,
    lanes: &mut __m256,
) {
    let groups = xs.len();
    // SAFETY: the caller's contract: 8 f16 scales and 8 i32 sums from g0.
    let (d, x) = unsafe {
        (
            _mm256_cvtph_ps(_mm_loadu_si128(params.as_ptr().add(g0).cast())),
            _mm256_loadu_si256(xs.as_ptr().add(g0).cast()),
        )
    };
    if f.has_min() {
        // SAFETY: the caller's contract: 8 f16 mins from groups + g0.
        let m =
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(params.as_ptr().add(groups + g0).cast())) };
        let v = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), *lanes);
        *lanes = _mm256_fmadd_ps(m, _mm256_cvtepi32_ps(x), v);
    } else {
        let s = _mm256_sub_epi32(s, _mm256_slli_epi32::<3>(x));
        *lanes = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), *lanes);
    }
}

/// The sum of the eight lanes of `p`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn hsum(p: __m256i) -> i32 {
    let q = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256::<1>(p));
    let q = _mm_add_epi32(q, _mm_shuffle_epi32::<0b01_00_11_10>(q));
    _mm_cvtsi128_si32(_mm_add_epi32(q, _mm_shuffle_epi32::<0b10_11_00_01>(q)))
}

/// Lane `j` of the result: the sum of the eight lanes of `p[j]`.
#[inline]
#[target_feature(enable = "avx2")]
fn hsum8(p: &[__m256i; LANES]) -> __m256i {
    let a01 = _mm256_hadd_epi32(p[0], p[1]);
    let a23 = _mm256_hadd_epi32(p[2], p[3]);
    let a45 = _mm256_hadd_epi32(p[4], p[5]);
    let a67 = _mm256_hadd_epi32(p[6], p[7]);
    // 128-bit lane 0: the low halves' sums of p0..p3 (b0) or p4..p7 (b1);
    // lane 1 the high halves'.
    let b0 = _mm256_hadd_epi32(a01, a23);
    let b1 = _mm256_hadd_epi32(a45, a67);
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(b0, b1),
        _mm256_permute2x128_si256::<0x31>(b0, b1),
    )
}
