//! AVX-512 VNNI grouped dots: chunks are unpacked as in the AVX2 version
//! (`super::avx2::unpack`), two to a 512-bit vector, and meet the
//! activations in `vpdpbusd` (u8 × i8 in groups of four into i32, no
//! saturation); at the end of a group the two 256-bit halves are added and
//! the group's eight `i32` lanes go to the shared `avx2::fold_row`. Groups of 32
//! take the 256-bit `vpdpbusd` (AVX-512VL).
//! int4 groups of 64 and 128 ([`dot_q4`]) unpack two chunks from one
//! 32-byte load: a qword permute puts each chunk in two 128-bit lanes, one
//! variable shift and a mask give its low and high nibbles. At one
//! activation row ([`dot_rows`]) such a row walks its weights by pointer,
//! and every dot prefetches the
//! weights 4 KiB ahead: the hardware prefetchers alone left the one-row
//! matmul waiting on memory at half the speed.

use super::avx2::{fold8, fold_row, fold_tail, hsum, unpack, PREFETCH_AHEAD};
use super::LANES;
use super::{ActRow, GBits, GFormat, CHUNK};
use std::arch::x86_64::*;

/// The defined dot of one weight row with `T` activation rows (see
/// `grouped::dot_scalar`).
///
/// # Safety
/// The CPU must support AVX-512F/BW/VL/VNNI, AVX2, FMA and F16C; the
/// shapes of `grouped::dot_scalar` hold (checked by the caller).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot<const T: usize>(
    f: GFormat,
    w: &[u8],
    params: &[u16],
    acts: [ActRow<'_>; T],
) -> [f32; T] {
    let (cb, per) = (f.chunk_bytes(), f.group().cols() / CHUNK);
    if f.bits() == GBits::Q4 && per > 1 {
        // SAFETY: the caller's contract; int4 with whole chunk pairs a group.
        return unsafe { dot_q4(f, w, params, acts) };
    }
    if f.bits() == GBits::Q4 {
        // SAFETY: the caller's contract; int4 with one chunk a group.
        return unsafe { dot_q4g32(f, w, params, acts) };
    }
    fold_row(f, params, &acts, |g| {
        // A hint, never a fault, wherever it points.
        _mm_prefetch::<_MM_HINT_T0>(
            w.as_ptr()
                .wrapping_add(g * per * cb + PREFETCH_AHEAD)
                .cast(),
        );
        if per == 1 {
            // SAFETY: chunk g lies inside the row and each activation row.
            unsafe { group32(f, w.as_ptr().add(g * cb), &acts, g * CHUNK) }
        } else {
            // SAFETY: chunks g·per..(g + 1)·per lie inside the row and each
            // activation row (shapes checked by the caller).
            unsafe { group_pairs(f, w, &acts, g * per, per) }
        }
    })
}

/// `out[r]` = [`dot`] of weight row `r` of `w` (`out.len()` packed rows,
/// `params` their companions, row after row) with the one activation row.
///
/// # Safety
/// As [`dot`], for every row; `w` and `params` hold `out.len()` whole rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_rows(f: GFormat, w: &[u8], params: &[u16], act: ActRow<'_>, out: &mut [f32]) {
    let (rb, pr) = (w.len() / out.len(), params.len() / out.len());
    let q4 = f.bits() == GBits::Q4 && f.group().cols() > CHUNK;
    for (r, o) in out.iter_mut().enumerate() {
        let (w, p) = (&w[r * rb..(r + 1) * rb], &params[r * pr..(r + 1) * pr]);
        *o = if q4 {
            // SAFETY: the caller's contract for `dot`, for row r; int4 with
            // whole chunk pairs a group.
            unsafe { row_q4(f, w, p, act) }
        } else {
            // SAFETY: the caller's contract for `dot`, for row r.
            let [v] = unsafe { dot(f, w, p, [act]) };
            v
        };
    }
}

/// [`dot_q4`] of one weight row with one activation row, its weights and
/// activations walked by pointer.
///
/// # Safety
/// As [`dot_q4`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn row_q4(f: GFormat, w: &[u8], params: &[u16], act: ActRow<'_>) -> f32 {
    let pairs = f.group().cols() / (2 * CHUNK);
    let (mut wp, mut xp) = (w.as_ptr(), act.x.as_ptr());
    let [v] = fold_row16(f, params, &[act], |_| {
        // A hint, never a fault, wherever it points.
        _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH_AHEAD).cast());
        let mut acc = _mm512_setzero_si512();
        for _ in 0..pairs {
            // SAFETY: the groups come in order, so the next chunk pair (32
            // bytes) and its 64 activations lie inside the row (the
            // caller's contract: `groups` whole groups in `w` and `act.x`).
            unsafe {
                let x = _mm512_loadu_si512(xp.cast());
                acc = _mm512_dpbusd_epi32(acc, q4_pair(wp), x);
                (wp, xp) = (wp.add(2 * 16), xp.add(2 * CHUNK));
            }
        }
        [acc]
    });
    v
}

/// [`dot`] for int4 groups of 64 or 128 columns: each 32-byte chunk pair is
/// one load unpacked by [`q4_pair`].
///
/// # Safety
/// As [`dot`]; `f` is int4 with groups of 64 or 128 columns.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_q4<const T: usize>(
    f: GFormat,
    w: &[u8],
    params: &[u16],
    acts: [ActRow<'_>; T],
) -> [f32; T] {
    let per = f.group().cols() / CHUNK;
    // Several activation rows keep the 256-bit fold: with the 512-bit one
    // their eight groups' accumulators spill (measured slower at four rows).
    fold_row(f, params, &acts, |g| {
        let mut acc = [_mm512_setzero_si512(); T];
        for k in (g * per..(g + 1) * per).step_by(2) {
            // SAFETY: chunks k and k + 1 (32 bytes from byte 16·k) lie inside
            // the row (shapes checked by the caller).
            let u = unsafe { q4_pair(w.as_ptr().add(k * 16)) };
            for (acc, a) in acc.iter_mut().zip(&acts) {
                // SAFETY: 64 activations from chunk k (the caller's contract).
                let x = unsafe { _mm512_loadu_si512(a.x.as_ptr().add(k * CHUNK).cast()) };
                *acc = _mm512_dpbusd_epi32(*acc, u, x);
            }
        }
        acc.map(|v| halves(v))
    })
}

/// `avx2::fold_row` for one activation row whose groups' `i32` lanes come
/// as 16 (a 512-bit accumulator): eight groups' sums by [`pair_halves`]
/// and [`hsum8_pairs`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn fold_row16<const T: usize>(
    f: GFormat,
    params: &[u16],
    acts: &[ActRow<'_>; T],
    mut group: impl FnMut(usize) -> [__m512i; T],
) -> [f32; T] {
    let groups = acts.first().map_or(0, |a| a.xs.len());
    let whole = groups - groups % LANES;
    let mut lanes = [_mm256_setzero_ps(); T];
    for g0 in (0..whole).step_by(LANES) {
        let p: [[__m512i; T]; LANES] = std::array::from_fn(|j| group(g0 + j));
        for (t, lanes) in lanes.iter_mut().enumerate() {
            let z = std::array::from_fn(|j| pair_halves(p[2 * j][t], p[2 * j + 1][t]));
            // SAFETY: groups g0..g0 + 8 exist (g0 + 8 <= whole).
            unsafe { fold8(f, params, acts[t].xs, g0, hsum8_pairs(z), lanes) };
        }
    }
    fold_tail(f, params, acts, lanes, whole, |g| {
        group(g).map(|v| hsum(halves(v)))
    })
}

/// Two groups' 16 lanes each folded to 8 with the same totals: group `a`
/// in the low half, `b` in the high half.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn pair_halves(a: __m512i, b: __m512i) -> __m512i {
    _mm512_add_epi32(
        _mm512_shuffle_i32x4::<0b01_00_01_00>(a, b),
        _mm512_shuffle_i32x4::<0b11_10_11_10>(a, b),
    )
}

/// [`dot`] for int4 groups of 32 columns: two groups a 512-bit vector (one
/// [`q4_pair`] load meets 64 activations), eight groups' sums from four
/// such vectors ([`hsum8_pairs`]), a last short block through the shared
/// fold's scalar steps.
///
/// # Safety
/// As [`dot`]; `f` is int4 with groups of 32 columns.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_q4g32<const T: usize>(
    f: GFormat,
    w: &[u8],
    params: &[u16],
    acts: [ActRow<'_>; T],
) -> [f32; T] {
    let groups = acts.first().map_or(0, |a| a.xs.len());
    let whole = groups - groups % LANES;
    let mut lanes = [_mm256_setzero_ps(); T];
    for g0 in (0..whole).step_by(LANES) {
        // A hint, never a fault, wherever it points: the 128 bytes of
        // these eight groups, 4 KiB ahead.
        let ahead = w.as_ptr().wrapping_add(g0 * 16 + PREFETCH_AHEAD);
        _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64).cast());
        let z: [[__m512i; T]; 4] = std::array::from_fn(|j| {
            let g = g0 + 2 * j;
            // SAFETY: groups g and g + 1 (32 bytes from byte 16·g) lie inside
            // the row, their 64 activations inside each activation row.
            unsafe {
                let u = q4_pair(w.as_ptr().add(g * 16));
                std::array::from_fn(|t| {
                    let x = _mm512_loadu_si512(acts[t].x.as_ptr().add(g * CHUNK).cast());
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, x)
                })
            }
        });
        for (t, lanes) in lanes.iter_mut().enumerate() {
            let s = hsum8_pairs(std::array::from_fn(|j| z[j][t]));
            // SAFETY: groups g0..g0 + 8 exist (g0 + 8 <= whole).
            unsafe { fold8(f, params, acts[t].xs, g0, s, lanes) };
        }
    }
    fold_tail(f, params, &acts, lanes, whole, |g| {
        // SAFETY: chunk g lies inside the row and each activation row.
        unsafe { group32(f, w.as_ptr().add(g * 16), &acts, g * CHUNK) }.map(|p| hsum(p))
    })
}

/// The eight sums of four vectors that each hold two groups' `i32` lanes
/// (group `2j` in the low half of `z[j]`, `2j + 1` in the high half):
/// pairs of vectors interleaved and added within 128-bit lanes twice, the
/// 128-bit lanes of each group added, then the sums put in group order.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn hsum8_pairs(z: [__m512i; 4]) -> __m256i {
    let pair = |a: __m512i, b: __m512i| {
        _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b))
    };
    // Per 128-bit lane k: [z0, z1, z0, z1] partial sums, then [z0, z1, z2, z3]
    // sums of lane k's four values.
    let (c01, c23) = (pair(z[0], z[1]), pair(z[2], z[3]));
    let d = _mm512_add_epi32(
        _mm512_unpacklo_epi64(c01, c23),
        _mm512_unpackhi_epi64(c01, c23),
    );
    // Lanes 0 and 1 (the low group of each vector) added, and 2 and 3:
    // lane 0 = [g0, g2, g4, g6], lane 2 = [g1, g3, g5, g7].
    let e = _mm512_add_epi32(d, _mm512_shuffle_i32x4::<0b10_11_00_01>(d, d));
    let order = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 11, 3, 10, 2, 9, 1, 8, 0);
    _mm512_castsi512_si256(_mm512_permutexvar_epi32(order, e))
}

/// The levels of the int4 chunk pair (32 bytes) at `p`, spread to
/// `[lo c0, hi c0, lo c1, hi c1]` (the 128-bit lanes `unpack` gives for
/// the two chunks) by a qword permute, a shift of the odd qword pairs by 4
/// and a nibble mask.
///
/// # Safety
/// The CPU must support AVX-512F; `p` has 32 readable bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_pair(p: *const u8) -> __m512i {
    let spread = _mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0);
    let shift = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
    // SAFETY: 32 readable bytes at `p` (the caller's contract).
    let v = unsafe { _mm256_loadu_si256(p.cast()) };
    let v = _mm512_permutexvar_epi64(spread, _mm512_castsi256_si512(v));
    _mm512_and_si512(_mm512_srlv_epi64(v, shift), _mm512_set1_epi8(15))
}

/// The two 256-bit halves added: eight lanes with the same total.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn halves(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
}

/// The `i32` lanes of a 32-column group whose chunk is at `w` and whose activations
/// start at column `at`.
///
/// # Safety
/// As [`dot`]; the chunk and `at..at + 32` of each activation row exist.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2")]
unsafe fn group32<const T: usize>(
    f: GFormat,
    w: *const u8,
    acts: &[ActRow<'_>; T],
    at: usize,
) -> [__m256i; T] {
    // SAFETY: the caller's contract.
    let u = unsafe { unpack(f.bits(), w) };
    std::array::from_fn(|t| {
        // SAFETY: 32 activations from `at` (the caller's contract).
        let x = unsafe { _mm256_loadu_si256(acts[t].x.as_ptr().add(at).cast()) };
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, x)
    })
}

/// The `i32` lanes of a group of `per` (2 or 4) chunks from chunk `k0`.
///
/// # Safety
/// As [`dot`]; chunks `k0..k0 + per` exist in `w` and in each activation row.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2")]
unsafe fn group_pairs<const T: usize>(
    f: GFormat,
    w: &[u8],
    acts: &[ActRow<'_>; T],
    k0: usize,
    per: usize,
) -> [__m256i; T] {
    let cb = f.chunk_bytes();
    let mut acc = [_mm512_setzero_si512(); T];
    for k in (k0..k0 + per).step_by(2) {
        // SAFETY: chunks k and k + 1 lie inside the row (the caller's contract).
        let u = unsafe {
            let p = w.as_ptr().add(k * cb);
            _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(unpack(f.bits(), p)),
                unpack(f.bits(), p.add(cb)),
            )
        };
        for (acc, a) in acc.iter_mut().zip(acts) {
            // SAFETY: 64 activations from chunk k (the caller's contract).
            let x = unsafe { _mm512_loadu_si512(a.x.as_ptr().add(k * CHUNK).cast()) };
            *acc = _mm512_dpbusd_epi32(*acc, u, x);
        }
    }
    acc.map(|v| halves(v))
}
