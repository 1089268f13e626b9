//! AVX2 block dots, bit-identical to the scalar twins (see `scalar`): the
//! integer partials are exact (`maddubs` of unsigned levels or `|w|` by
//! signed activations never saturates here: a pair is at most 2·128·127 =
//! 32512 for Q8_0, 2·63·127 for the K levels; `madd` then widens to i32),
//! and every f32 step is the twin's, in
//! its order: Q8_0/Q4_0's sixteen lanes as two registers, `lo` (lanes
//! 0..8) and `hi` (8..16); the K types' super-block sums reduced exactly
//! and added to `[s, t]` ([`k_step`]). Also used by the AVX-512 file: the
//! loads, the mins of Q4_K/Q5_K (eight lanes) and the final steps.
//!
//! Loads go through [`load32`] and [`load16`], which slice first: a short
//! slice panics instead of reading past it, so these functions need only
//! the CPU features from their callers.

use super::codec::{f16_to_f32, le16, q2_k, q3_k, q4_0, q4_k, q5_k, q6_k, q8_0};
use super::codec::{scales_k4, scales_q3, QK, QK_K};
use super::scalar::ActRow;
use super::BlockType;
use std::arch::x86_64::*;

/// `out[k]` = the dot of row `k` of `w` (`out.len()` rows) with `a`.
///
/// # Safety
/// The CPU must support AVX2. (Lengths are checked by slicing.)
#[target_feature(enable = "avx2")]
pub unsafe fn dot_rows(ty: BlockType, w: &[u8], a: &ActRow, out: &mut [f32]) {
    let rb = w.len() / out.len().max(1);
    let rows = out.iter_mut().zip(w.chunks_exact(rb.max(1)));
    // One loop an arm, so the row kernel inlines into it.
    match ty {
        BlockType::Q4_0 => {
            for (o, r) in rows {
                *o = dot_q4_0(r, a);
            }
        }
        BlockType::Q8_0 => {
            for (o, r) in rows {
                *o = dot_q8_0(r, a);
            }
        }
        BlockType::Q4K => {
            for (o, r) in rows {
                *o = dot_q4_k(r, a);
            }
        }
        BlockType::Q5K => {
            for (o, r) in rows {
                *o = dot_q5_k(r, a);
            }
        }
        BlockType::Q6K => {
            for (o, r) in rows {
                *o = dot_q6_k(r, a);
            }
        }
        BlockType::Q3K => {
            for (o, r) in rows {
                *o = dot_q3_k(r, a);
            }
        }
        BlockType::Q2K => {
            for (o, r) in rows {
                *o = dot_q2_k(r, a);
            }
        }
        BlockType::Q5_0 | BlockType::Q5_1 | BlockType::IQ4NL | BlockType::IQ4XS => {
            unreachable!("{}: ggml::dot_rows routes it to ext", ty.name())
        }
    }
}

/// How far ahead of the block being read the weights are prefetched. With
/// the hardware prefetchers alone the kernels ran 5–25% slower from memory
/// on most shapes (interleaved A/B runs, two threads; results/kernels.md).
const PREFETCH_AHEAD: usize = 4096;

/// Prefetches `len / 64` lines (at least one) from `PREFETCH_AHEAD` past
/// the start of `s`, which may lie past its end: as many lines as the block
/// consumes, so the hints cost a load slot per line and no more.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn prefetch(s: &[u8], len: usize) {
    let p = s.as_ptr().wrapping_add(PREFETCH_AHEAD);
    // A prefetch is a hint: it never faults, whatever the address.
    for line in 0..(len / 64).max(1) {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * line).cast());
    }
}

/// 32 bytes from the front of `s`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn load32<T: Copy>(s: &[T]) -> __m256i {
    let s = &s[..32 / size_of::<T>()];
    // SAFETY: `s` spans exactly 32 readable bytes (the slice above).
    unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
}

/// 16 bytes from the front of `s`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn load16<T: Copy>(s: &[T]) -> __m128i {
    let s = &s[..16 / size_of::<T>()];
    // SAFETY: `s` spans exactly 16 readable bytes (the slice above).
    unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
}

/// `scalar::reduce16` of lanes `lo` (0..8) and `hi` (8..16), in its order.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn reduce16(lo: __m256, hi: __m256) -> f32 {
    reduce8(_mm256_add_ps(lo, hi))
}

/// `scalar::reduce8`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn reduce8(s8: __m256) -> f32 {
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    let s1 = _mm_add_ss(s2, _mm_shuffle_ps::<0b01>(s2, s2));
    _mm_cvtss_f32(s1)
}

/// `acc + (p as f32)·f`, lane by lane.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn add_lanes(acc: __m256, p: __m256i, f: __m256) -> __m256 {
    _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(p), f))
}

/// One K super-block into `acc` (lanes `[s, t, ·, ·]`, see `scalar`):
/// the exact sums `P` of the eight lanes of `p` and `M` of `mins`, then
/// `acc + [P, M]·f` with `f = [d_w·d_x, dmin_w·d_x, 0, 0]`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn k_step(acc: __m128, p: __m256i, mins: __m256i, f: __m128) -> __m128 {
    let h = _mm256_hadd_epi32(p, mins);
    let h = _mm256_hadd_epi32(h, h);
    let pm = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
    _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(pm), f))
}

/// `[f, g, 0, 0]`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn k_scales(f: f32, g: f32) -> __m128 {
    _mm_setr_ps(f, g, 0.0, 0.0)
}

/// The K dot `s − t` of [`k_step`]'s accumulator.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn k_result(acc: __m128) -> f32 {
    _mm_cvtss_f32(_mm_sub_ss(acc, _mm_movehdup_ps(acc)))
}

/// The eight min lanes of a Q4_K/Q5_K super-block:
/// `m_j·(bsums[2j] + bsums[2j+1])`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn mins_lanes(m: &[u8; 8], bsums: &[i16]) -> __m256i {
    mins_dot(mins_pairs(m), bsums)
}

/// The eight mins of a Q4_K/Q5_K super-block, each twice, as i16.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn mins_pairs(m: &[u8; 8]) -> __m256i {
    let mv = _mm_cvtsi64_si128(i64::from_le_bytes(*m));
    _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mv, mv))
}

/// [`mins_lanes`] from its [`mins_pairs`].
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn mins_dot(pairs: __m256i, bsums: &[i16]) -> __m256i {
    _mm256_madd_epi16(pairs, load32(bsums))
}

/// Two blocks a step, each to `acc[b % 2]`.
#[inline]
#[target_feature(enable = "avx2")]
fn dot_q8_0(w: &[u8], a: &ActRow) -> f32 {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); 2];
    for (b, blk) in w.chunks_exact(q8_0::BYTES).enumerate() {
        prefetch(blk, q8_0::BYTES);
        let vw = load32(&blk[q8_0::QS..]);
        let vx = load32(&a.qs[QK * b..]);
        // |w| · (x with w's sign) = w·x; x is never −128.
        let pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(vw), _mm256_sign_epi8(vx, vw));
        let f = _mm256_set1_ps(f16_to_f32(le16(blk, q8_0::D)) * a.d[b]);
        acc[b % 2] = add_lanes(acc[b % 2], _mm256_madd_epi16(pairs, ones), f);
    }
    reduce16(acc[0], acc[1])
}

/// `Σ (level − 8)·x` of two Q4_0 blocks (`q0`, `q1`: their 16 level bytes)
/// in the twin's lanes: `c` adds `−8·Σx` to the unsigned-level sums.
#[inline]
#[target_feature(enable = "avx2")]
fn q4_0_lanes(q0: __m128i, q1: __m128i, xl: __m256i, xh: __m256i, c: __m256i) -> __m256i {
    let (mask, ones) = (_mm256_set1_epi8(15), _mm256_set1_epi16(1));
    let vq = _mm256_set_m128i(q1, q0);
    let lo = _mm256_and_si256(vq, mask);
    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(vq), mask);
    let p16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_maddubs_epi16(hi, xh));
    _mm256_add_epi32(_mm256_madd_epi16(p16, ones), c)
}

/// Two blocks a step: block `b` (even) in lanes 0..4, `b + 1` in 4..8, to
/// `acc[(b / 2) % 2]`; a last lone block leaves lanes 4..8 as they were.
#[inline]
#[target_feature(enable = "avx2")]
fn dot_q4_0(w: &[u8], a: &ActRow) -> f32 {
    const B: usize = q4_0::BYTES;
    let nb = w.len() / B;
    let (xlo, xhi) = a.qs.split_at(16 * nb);
    let mut acc = [_mm256_setzero_ps(); 2];
    let pairs = w
        .chunks_exact(2 * B)
        .zip(xlo.chunks_exact(32))
        .zip(xhi.chunks_exact(32));
    for (k, (((pr, xl), xh), (c, dx))) in pairs
        .zip(a.c8.chunks_exact(8).zip(a.d.chunks_exact(2)))
        .enumerate()
    {
        prefetch(pr, 2 * B);
        let (q0, q1) = (load16(&pr[q4_0::QS..]), load16(&pr[B + q4_0::QS..]));
        let p = q4_0_lanes(q0, q1, load32(xl), load32(xh), load32(c));
        let f0 = f16_to_f32(le16(pr, q4_0::D)) * dx[0];
        let f1 = f16_to_f32(le16(pr, B + q4_0::D)) * dx[1];
        let f = _mm256_set_m128(_mm_set1_ps(f1), _mm_set1_ps(f0));
        acc[k % 2] = add_lanes(acc[k % 2], p, f);
    }
    if nb % 2 == 1 {
        let (b, z) = (nb - 1, _mm_setzero_si128());
        let blk = &w[B * b..];
        let half = |s: &[i8]| _mm256_set_m128i(z, load16(s));
        let c = _mm256_set_m128i(z, load16(&a.c8[4 * b..]));
        let p = q4_0_lanes(
            load16(&blk[q4_0::QS..]),
            z,
            half(&xlo[16 * b..]),
            half(&xhi[16 * b..]),
            c,
        );
        let f = _mm256_set1_ps(f16_to_f32(le16(blk, q4_0::D)) * a.d[b]);
        let k = (b / 2) % 2;
        acc[k] = _mm256_blend_ps::<0b1111_0000>(add_lanes(acc[k], p, f), acc[k]);
    }
    reduce16(acc[0], acc[1])
}

/// The level chunks of one Q4_K/Q5_K super-block into the twin's lanes:
/// `lev(c)` gives chunk `c`'s (low, high) levels; chunk `c` meets the
/// activations at `32·(c % 2) + 128·(c / 2)` (low) and 64 further (high),
/// and goes to register `c % 2`.
#[inline]
#[target_feature(enable = "avx2")]
fn kmin_lanes(sc: &[u8; 8], x: &[i8], lev: impl Fn(usize) -> (__m256i, __m256i)) -> [__m256i; 2] {
    let mut p = [_mm256_setzero_si256(); 2];
    for c in 0..4 {
        let (lo, hi) = lev(c);
        let at = 128 * (c / 2) + 32 * (c % 2);
        let plo = _mm256_maddubs_epi16(lo, load32(&x[at..]));
        let phi = _mm256_maddubs_epi16(hi, load32(&x[at + 64..]));
        let slo = _mm256_madd_epi16(plo, _mm256_set1_epi16(sc[2 * c] as i16));
        let shi = _mm256_madd_epi16(phi, _mm256_set1_epi16(sc[2 * c + 1] as i16));
        p[c % 2] = _mm256_add_epi32(p[c % 2], _mm256_add_epi32(slo, shi));
    }
    p
}

/// Adds one Q4_K/Q5_K super-block: `p` times `d_w·d_x`, the mins times
/// `dmin_w·d_x` ([`k_step`]).
#[inline]
#[target_feature(enable = "avx2")]
fn kmin_add(acc: __m128, p: [__m256i; 2], mins: __m256i, blk: &[u8], dx: f32) -> __m128 {
    let (dw, dminw) = (f16_to_f32(le16(blk, 0)), f16_to_f32(le16(blk, 2)));
    k_step(
        acc,
        _mm256_add_epi32(p[0], p[1]),
        mins,
        k_scales(dw * dx, dminw * dx),
    )
}

#[inline]
#[target_feature(enable = "avx2")]
fn dot_q4_k(w: &[u8], a: &ActRow) -> f32 {
    let mask = _mm256_set1_epi8(15);
    let mut acc = _mm_setzero_ps();
    for (b, blk) in w.chunks_exact(q4_k::BYTES).enumerate() {
        prefetch(blk, q4_k::BYTES);
        let (sc, m) = scales_k4(&blk[q4_k::SCALES..q4_k::QS]);
        let p = kmin_lanes(&sc, &a.qs[QK_K * b..QK_K * (b + 1)], |c| {
            let q = load32(&blk[q4_k::QS + 32 * c..]);
            (
                _mm256_and_si256(q, mask),
                _mm256_and_si256(_mm256_srli_epi16::<4>(q), mask),
            )
        });
        let mins = mins_lanes(&m, &a.bsums[16 * b..]);
        acc = kmin_add(acc, p, mins, blk, a.d[b]);
    }
    k_result(acc)
}

#[inline]
#[target_feature(enable = "avx2")]
fn dot_q5_k(w: &[u8], a: &ActRow) -> f32 {
    let (mask, one) = (_mm256_set1_epi8(15), _mm256_set1_epi8(1));
    let mut acc = _mm_setzero_ps();
    for (b, blk) in w.chunks_exact(q5_k::BYTES).enumerate() {
        prefetch(blk, q5_k::BYTES);
        let (sc, m) = scales_k4(&blk[q5_k::SCALES..q5_k::QH]);
        let qh = load32(&blk[q5_k::QH..]);
        // Bit `s` of each qh byte, as 16 (the level's fifth bit).
        let bit = |s: usize| {
            let v = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(s as i32));
            _mm256_slli_epi16::<4>(_mm256_and_si256(v, one))
        };
        let p = kmin_lanes(&sc, &a.qs[QK_K * b..QK_K * (b + 1)], |c| {
            let q = load32(&blk[q5_k::QS + 32 * c..]);
            let lo = _mm256_or_si256(_mm256_and_si256(q, mask), bit(2 * c));
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), mask);
            (lo, _mm256_or_si256(hi, bit(2 * c + 1)))
        });
        let mins = mins_lanes(&m, &a.bsums[16 * b..]);
        acc = kmin_add(acc, p, mins, blk, a.d[b]);
    }
    k_result(acc)
}

/// Q6_K: `maddubs` of the unsigned level (0..64) minus `maddubs` of 32 gives
/// the exact signed pair sums `(level − 32)·x` (|·| ≤ 8128), then `madd`
/// with the sub-blocks' signed scales.
#[inline]
#[target_feature(enable = "avx2")]
fn dot_q6_k(w: &[u8], a: &ActRow) -> f32 {
    let (mask, three, m32) = (
        _mm256_set1_epi8(15),
        _mm256_set1_epi8(3),
        _mm256_set1_epi8(32),
    );
    let mut acc = _mm_setzero_ps();
    for (b, blk) in w.chunks_exact(q6_k::BYTES).enumerate() {
        prefetch(blk, q6_k::BYTES);
        let x = &a.qs[QK_K * b..QK_K * (b + 1)];
        let sc: [i8; 16] = std::array::from_fn(|j| blk[q6_k::SCALES + j] as i8);
        let mut p = [_mm256_setzero_si256(); 2];
        for h in 0..2 {
            let ql = [
                load32(&blk[q6_k::QL + 64 * h..]),
                load32(&blk[q6_k::QL + 64 * h + 32..]),
            ];
            let qh = load32(&blk[q6_k::QH + 32 * h..]);
            for s in 0..4 {
                let nib = _mm256_srl_epi16(ql[s % 2], _mm_cvtsi32_si128(4 * (s / 2) as i32));
                let top = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * s as i32));
                let top = _mm256_slli_epi16::<4>(_mm256_and_si256(top, three));
                let lev = _mm256_or_si256(_mm256_and_si256(nib, mask), top);
                let xs = load32(&x[128 * h + 32 * s..]);
                let pairs =
                    _mm256_sub_epi16(_mm256_maddubs_epi16(lev, xs), _mm256_maddubs_epi16(m32, xs));
                let ps = _mm256_madd_epi16(pairs, scale_pair(&sc, 8 * h + 2 * s));
                p[s % 2] = _mm256_add_epi32(p[s % 2], ps);
            }
        }
        let f = k_scales(f16_to_f32(le16(blk, q6_k::D)) * a.d[b], 0.0);
        acc = k_step(acc, _mm256_add_epi32(p[0], p[1]), _mm256_setzero_si256(), f);
    }
    k_result(acc)
}

/// The i16 pair `(sc[j], sc[j + 1])` over the two halves of a register of
/// 32 activations (sub-blocks `j` and `j + 1`, 16 values each).
#[inline]
#[target_feature(enable = "avx2")]
fn scale_pair(sc: &[i8; 16], j: usize) -> __m256i {
    _mm256_set_m128i(
        _mm_set1_epi16(sc[j + 1] as i16),
        _mm_set1_epi16(sc[j] as i16),
    )
}

/// Q3_K as Q6_K: the unsigned 3-bit level (two bits of `qs`, one of
/// `hmask`) times `x` minus 4·x gives the exact signed pairs
/// `(level − 4)·x`, then `madd` with the signed sub-block scales.
#[inline]
#[target_feature(enable = "avx2")]
fn dot_q3_k(w: &[u8], a: &ActRow) -> f32 {
    let (three, one, four) = (
        _mm256_set1_epi8(3),
        _mm256_set1_epi8(1),
        _mm256_set1_epi8(4),
    );
    let mut acc = _mm_setzero_ps();
    for (b, blk) in w.chunks_exact(q3_k::BYTES).enumerate() {
        prefetch(blk, q3_k::BYTES);
        let x = &a.qs[QK_K * b..QK_K * (b + 1)];
        let sc = scales_q3(&blk[q3_k::SCALES..q3_k::D]);
        let hm = load32(&blk[q3_k::HMASK..]);
        let mut p = [_mm256_setzero_si256(); 2];
        for h in 0..2 {
            let q = load32(&blk[q3_k::QS + 32 * h..]);
            for s in 0..4 {
                let low = _mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * s as i32));
                let high = _mm256_srl_epi16(hm, _mm_cvtsi32_si128((4 * h + s) as i32));
                let high = _mm256_slli_epi16::<2>(_mm256_and_si256(high, one));
                let lev = _mm256_or_si256(_mm256_and_si256(low, three), high);
                let xs = load32(&x[128 * h + 32 * s..]);
                let pairs = _mm256_sub_epi16(
                    _mm256_maddubs_epi16(lev, xs),
                    _mm256_maddubs_epi16(four, xs),
                );
                let ps = _mm256_madd_epi16(pairs, scale_pair(&sc, 8 * h + 2 * s));
                p[s % 2] = _mm256_add_epi32(p[s % 2], ps);
            }
        }
        let f = k_scales(f16_to_f32(le16(blk, q3_k::D)) * a.d[b], 0.0);
        acc = k_step(acc, _mm256_add_epi32(p[0], p[1]), _mm256_setzero_si256(), f);
    }
    k_result(acc)
}

/// Q2_K: `maddubs` of the 2-bit levels, `madd` with the 4-bit scales; the
/// sixteen 4-bit mins `madd` with the sixteen `bsums` into the eight min
/// lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn dot_q2_k(w: &[u8], a: &ActRow) -> f32 {
    let (three, fifteen) = (_mm256_set1_epi8(3), _mm_set1_epi8(15));
    let mut acc = _mm_setzero_ps();
    for (b, blk) in w.chunks_exact(q2_k::BYTES).enumerate() {
        prefetch(blk, q2_k::BYTES);
        let x = &a.qs[QK_K * b..QK_K * (b + 1)];
        let sv = load16(&blk[q2_k::SCALES..]);
        let sc: [i8; 16] = std::array::from_fn(|j| (blk[q2_k::SCALES + j] & 15) as i8);
        let mut p = [_mm256_setzero_si256(); 2];
        for h in 0..2 {
            let q = load32(&blk[q2_k::QS + 32 * h..]);
            for s in 0..4 {
                let lev = _mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * s as i32));
                let lev = _mm256_and_si256(lev, three);
                let pairs = _mm256_maddubs_epi16(lev, load32(&x[128 * h + 32 * s..]));
                let ps = _mm256_madd_epi16(pairs, scale_pair(&sc, 8 * h + 2 * s));
                p[s % 2] = _mm256_add_epi32(p[s % 2], ps);
            }
        }
        let m = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(sv), fifteen));
        let mins = _mm256_madd_epi16(m, load32(&a.bsums[16 * b..]));
        let dx = a.d[b];
        let (dw, dminw) = (
            f16_to_f32(le16(blk, q2_k::D)),
            f16_to_f32(le16(blk, q2_k::DMIN)),
        );
        let f = k_scales(dw * dx, dminw * dx);
        acc = k_step(acc, _mm256_add_epi32(p[0], p[1]), mins, f);
    }
    k_result(acc)
}
