//! AVX-512 VNNI grouped dots: chunks are unpacked as in the AVX2 version
//! (`super::avx2::unpack`), two to a 512-bit vector, and meet the
//! activations in `vpdpbusd` (u8 × i8 in groups of four into i32, no
//! saturation); at the end of a group the two 256-bit halves (lane `l` of
//! its even and odd chunks) are added, which gives exactly the defined
//! `P[g][l]`. Groups of 32 take the 256-bit `vpdpbusd` (AVX-512VL).
//! int4 groups of 64 and 128 ([`dot_q4`]) unpack two chunks from one
//! 32-byte load: a qword permute puts each chunk in two 128-bit lanes, one
//! variable shift and a mask give its low and high nibbles. At one
//! activation row ([`dot_rows`]) such a row converts its scales sixteen at
//! a time and walks its weights by pointer, and every dot prefetches the
//! weights 4 KiB ahead: the hardware prefetchers alone left the one-row
//! matmul waiting on memory at half the speed.

use super::avx2::{min_term, reduce8, scale, unpack, PREFETCH_AHEAD};
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
    let groups = acts.first().map_or(0, |a| a.xs.len());
    let mut main = [_mm256_setzero_ps(); T];
    for (g, &bits) in params[..groups].iter().enumerate() {
        // A hint, never a fault, wherever it points.
        _mm_prefetch::<_MM_HINT_T0>(
            w.as_ptr()
                .wrapping_add(g * per * cb + PREFETCH_AHEAD)
                .cast(),
        );
        let p = if per == 1 {
            // SAFETY: chunk g lies inside the row and each activation row.
            unsafe { group32(f, w.as_ptr().add(g * cb), &acts, g * CHUNK) }
        } else {
            // SAFETY: chunks g·per..(g + 1)·per lie inside the row and each
            // activation row (shapes checked by the caller).
            unsafe { group_pairs(f, w, &acts, g * per, per) }
        };
        let d = scale(bits);
        for (m, p) in main.iter_mut().zip(p) {
            *m = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), *m);
        }
    }
    std::array::from_fn(|t| reduce8(main[t]) + min_term(f, params, acts[t].xs))
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

/// [`dot_q4`] of one weight row with one activation row, its scales
/// converted sixteen at a time and broadcast from memory (the same f32
/// values, so the same bits).
///
/// # Safety
/// As [`dot_q4`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn row_q4(f: GFormat, w: &[u8], params: &[u16], act: ActRow<'_>) -> f32 {
    const BLOCK: usize = 16;
    let pairs = f.group().cols() / (2 * CHUNK);
    let groups = act.xs.len();
    let mut main = _mm256_setzero_ps();
    let mut d = [0f32; BLOCK];
    let (mut wp, mut xp) = (w.as_ptr(), act.x.as_ptr());
    for g0 in (0..groups).step_by(BLOCK) {
        let n = BLOCK.min(groups - g0);
        if n == BLOCK {
            // SAFETY: 16 f16 scales from group g0 (g0 + 16 <= groups).
            let v = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(params.as_ptr().add(g0).cast())) };
            // SAFETY: 16 f32 of `d`.
            unsafe { _mm512_storeu_ps(d.as_mut_ptr(), v) };
        } else {
            for (d, &b) in d.iter_mut().zip(&params[g0..g0 + n]) {
                *d = half::f16::from_bits(b).to_f32();
            }
        }
        for &d in &d[..n] {
            // A hint, never a fault, wherever it points.
            _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(PREFETCH_AHEAD).cast());
            let mut acc = _mm512_setzero_si512();
            for _ in 0..pairs {
                // SAFETY: the next chunk pair (32 bytes) and its 64
                // activations lie inside the row (the caller's contract:
                // `groups` whole groups in `w` and `act.x`).
                unsafe {
                    let x = _mm512_loadu_si512(xp.cast());
                    acc = _mm512_dpbusd_epi32(acc, q4_pair(wp), x);
                    (wp, xp) = (wp.add(2 * 16), xp.add(2 * CHUNK));
                }
            }
            let p = _mm256_cvtepi32_ps(fold(acc));
            main = _mm256_fmadd_ps(_mm256_set1_ps(d), p, main);
        }
    }
    reduce8(main) + min_term(f, params, act.xs)
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
    let groups = acts.first().map_or(0, |a| a.xs.len());
    let mut main = [_mm256_setzero_ps(); T];
    for (g, &bits) in params[..groups].iter().enumerate() {
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
        let d = scale(bits);
        for (m, v) in main.iter_mut().zip(acc) {
            *m = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(fold(v)), *m);
        }
    }
    std::array::from_fn(|t| reduce8(main[t]) + min_term(f, params, acts[t].xs))
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

/// Lane `l` of the two 256-bit halves added: the defined `P[g][l]` of a
/// group whose even and odd chunks met the activations in the two halves.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn fold(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
}

/// `P[g]` of a 32-column group whose chunk is at `w` and whose activations
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

/// `P[g]` of a group of `per` (2 or 4) chunks from chunk `k0`.
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
    acc.map(|v| fold(v))
}
