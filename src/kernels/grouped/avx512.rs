//! AVX-512 VNNI grouped dots: chunks are unpacked as in the AVX2 version
//! (`super::avx2::unpack`), two to a 512-bit vector, and meet the
//! activations in `vpdpbusd` (u8 × i8 in groups of four into i32, no
//! saturation); at the end of a group the two 256-bit halves (lane `l` of
//! its even and odd chunks) are added, which gives exactly the defined
//! `P[g][l]`. Groups of 32 take the 256-bit `vpdpbusd` (AVX-512VL).
//! int4 groups of 64 and 128 ([`dot_q4`]) unpack two chunks from one
//! 32-byte load: a qword permute puts each chunk in two 128-bit lanes, one
//! variable shift and a mask give its low and high nibbles.

use super::avx2::{min_term, reduce8, scale, unpack};
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
    for (r, o) in out.iter_mut().enumerate() {
        let (w, p) = (&w[r * rb..(r + 1) * rb], &params[r * pr..(r + 1) * pr]);
        // SAFETY: the caller's contract for `dot`, for row r.
        [*o] = unsafe { dot(f, w, p, [act]) };
    }
}

/// [`dot`] for int4 groups of 64 or 128 columns: each 32-byte chunk pair is
/// one load, spread to `[lo c0, hi c0, lo c1, hi c1]` (the 128-bit lanes
/// `unpack` gives for the two chunks) by a qword permute, a shift of the
/// odd qword pairs by 4 and a nibble mask.
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
    let spread = _mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0);
    let shift = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
    let nib = _mm512_set1_epi8(15);
    let mut main = [_mm256_setzero_ps(); T];
    for (g, &bits) in params[..groups].iter().enumerate() {
        let mut acc = [_mm512_setzero_si512(); T];
        for k in (g * per..(g + 1) * per).step_by(2) {
            // SAFETY: chunks k and k + 1 (32 bytes from byte 16·k) lie inside
            // the row (shapes checked by the caller).
            let v = unsafe { _mm256_loadu_si256(w.as_ptr().add(k * 16).cast()) };
            let v = _mm512_permutexvar_epi64(spread, _mm512_castsi256_si512(v));
            let u = _mm512_and_si512(_mm512_srlv_epi64(v, shift), nib);
            for (acc, a) in acc.iter_mut().zip(&acts) {
                // SAFETY: 64 activations from chunk k (the caller's contract).
                let x = unsafe { _mm512_loadu_si512(a.x.as_ptr().add(k * CHUNK).cast()) };
                *acc = _mm512_dpbusd_epi32(*acc, u, x);
            }
        }
        let d = scale(bits);
        for (m, v) in main.iter_mut().zip(acc) {
            let p = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v));
            *m = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), *m);
        }
    }
    std::array::from_fn(|t| reduce8(main[t]) + min_term(f, params, acts[t].xs))
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
    acc.map(|v| _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v)))
}
