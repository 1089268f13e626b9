//! AVX2 tiles of the repacked Q4_0 and Q4_K rows (`tile`): one weight row
//! against `T` activation rows; Q4_0 one sweep over the row per group of
//! eight lanes, each (weight row, activation row) pair one 8-lane f32
//! accumulator, Q4_K one sweep with the twin's `[s, t]` a pair. The integer sums are the per-row dots' (`maddubs` of
//! unsigned levels by signed activations, never saturating here, then
//! `madd`), the f32 steps the twin's, in its order: `acc + (p as f32)·f`
//! with `f = d_w·d_x` a product of the same two f32s (Q4_K: `p` the
//! super-block's exact sum).
//!
//! Loads slice first (`avx2::load32`, [`load_ps8`]): a short slice panics
//! rather than being read past.

use super::avx2::{k_result, k_scales, k_step, load32, reduce16};
use super::codec::QK_K;
use super::tile::{kmin_at, Act40, Act4k, PackedRow, TILE_ACTS};
use std::arch::x86_64::*;

/// Eight f32 from the front of `s`.
#[inline]
#[target_feature(enable = "avx2")]
fn load_ps8(s: &[f32]) -> __m256 {
    let s = &s[..8];
    // SAFETY: `s` has exactly 8 readable floats (the slice above).
    unsafe { _mm256_loadu_ps(s.as_ptr()) }
}

/// `acc + (p as f32)·f`, lane by lane.
#[inline]
#[target_feature(enable = "avx2")]
fn add_lanes(acc: __m256, p: __m256i, f: __m256) -> __m256 {
    _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(p), f))
}

/// `tile::dot_q4_0` of `w` against each row of group `a`: sweep `g`
/// takes the pairs `k ≡ g (mod 2)` into lanes `8g..8g + 8`. Each pair's
/// tile slices its records once, as fixed-size arrays, so the loop runs
/// on a few base pointers without per-load checks.
///
/// # Safety
/// The CPU must support AVX2. (Lengths are checked by slicing.)
#[target_feature(enable = "avx2")]
pub unsafe fn q4_0(w: &PackedRow, a: &Act40) -> [f32; TILE_ACTS] {
    const T: usize = TILE_ACTS;
    let ones = _mm256_set1_epi16(1);
    let mut sums = [[_mm256_setzero_ps(); T]; 2];
    for (g, acc) in sums.iter_mut().enumerate() {
        for k in (g..w.units).step_by(2) {
            let lev: &[u8; 64] = w.lev[64 * k..][..64].try_into().expect("64 levels");
            let dw: &[f32; 8] = w.d[8 * k..][..8].try_into().expect("8 scales");
            let xq: &[i8; 64 * T] = a.xq[64 * T * k..][..64 * T].try_into().expect("a tile");
            let c: &[i32; 8 * T] = a.c[8 * T * k..][..8 * T].try_into().expect("a tile");
            let dx: &[f32; 8 * T] = a.dx[8 * T * k..][..8 * T].try_into().expect("a tile");
            let (lo, hi) = (load32(&lev[..32]), load32(&lev[32..]));
            let dw = load_ps8(dw);
            for (t, acc) in acc.iter_mut().enumerate() {
                let x = &xq[64 * t..64 * t + 64];
                let p16 = _mm256_add_epi16(
                    _mm256_maddubs_epi16(lo, load32(&x[..32])),
                    _mm256_maddubs_epi16(hi, load32(&x[32..])),
                );
                let p =
                    _mm256_add_epi32(_mm256_madd_epi16(p16, ones), load32(&c[8 * t..8 * t + 8]));
                *acc = add_lanes(*acc, p, _mm256_mul_ps(dw, load_ps8(&dx[8 * t..8 * t + 8])));
            }
        }
    }
    std::array::from_fn(|t| reduce16(sums[0][t], sums[1][t]))
}

/// `tile::dot_q4_k` of `w` against each row of group `a`: one sweep, each
/// super-block's exact sums added to the pair's `[s, t]`
/// (`avx2::k_step`). Records are sliced once a super-block, as in [`q4_0`].
///
/// # Safety
/// The CPU must support AVX2. (Lengths are checked by slicing.)
#[target_feature(enable = "avx2")]
pub unsafe fn q4_k(w: &PackedRow, a: &Act4k) -> [f32; TILE_ACTS] {
    const T: usize = TILE_ACTS;
    let mut acc = [_mm_setzero_ps(); T];
    for b in 0..w.units {
        let lev: &[u8; QK_K] = w.lev[QK_K * b..][..QK_K].try_into().expect("a super-block");
        let sc: &[i16; 128] = w.sc[128 * b..][..128].try_into().expect("its scales");
        let xs: &[i8; QK_K * T] = a.qs[QK_K * T * b..][..QK_K * T].try_into().expect("a tile");
        let bs: &[i16; 16 * T] = a.bsums[16 * T * b..][..16 * T].try_into().expect("a tile");
        let d: &[f32; T] = a.d[T * b..][..T].try_into().expect("a tile");
        let m = load32(&w.mins[16 * b..16 * b + 16]);
        let (dw, dmin) = (w.d[2 * b], w.d[2 * b + 1]);
        for (t, acc) in acc.iter_mut().enumerate() {
            let x = &xs[QK_K * t..QK_K * t + QK_K];
            let mut p = _mm256_setzero_si256();
            for j in 0..8 {
                let (lev, sc) = (
                    load32(&lev[32 * j..32 * j + 32]),
                    load32(&sc[16 * j..16 * j + 16]),
                );
                let at = kmin_at(j / 2, j % 2);
                let pairs = _mm256_maddubs_epi16(lev, load32(&x[at..at + 32]));
                p = _mm256_add_epi32(p, _mm256_madd_epi16(pairs, sc));
            }
            let mins = _mm256_madd_epi16(m, load32(&bs[16 * t..16 * t + 16]));
            *acc = k_step(*acc, p, mins, k_scales(dw * d[t], dmin * d[t]));
        }
    }
    acc.map(|acc| k_result(acc))
}
