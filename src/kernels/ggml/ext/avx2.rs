//! AVX2 dots of Q5_0, Q5_1, IQ4_NL and IQ4_XS, bit-identical to the twins
//! (`ext::scalar`): two 32-value blocks a 256-bit register (block `b` even
//! in lanes 0..4, `b + 1` in 4..8, register `(b / 2) % 2`), the twin's f32
//! steps in its order. The integer partials are exact: `maddubs` of the
//! five-bit levels (≤ 2·31·127 a pair) or of `|kvalue|` by the activation
//! with the kvalue's sign (≤ 2·127·127; no kvalue is 0 and no activation
//! −128), widened by `madd`.

use super::super::avx2::{add_lanes, load16, load32, prefetch, reduce16};
use super::super::codec::{f16_to_f32, le16};
use super::super::scalar::ActRow;
use super::super::BlockType;
use super::{iq4_nl, iq4_xs, le32, q5_0, q5_1, scales_xs, KVALUES};
use std::arch::x86_64::*;

/// `out[k]` = the dot of row `k` of `w` (`out.len()` rows) with `a`.
///
/// # Safety
/// The CPU must support AVX2. (Lengths are checked by slicing.)
#[target_feature(enable = "avx2")]
pub(in super::super) unsafe fn dot_rows(ty: BlockType, w: &[u8], a: &ActRow, out: &mut [f32]) {
    let rb = w.len() / out.len().max(1);
    let rows = out.iter_mut().zip(w.chunks_exact(rb.max(1)));
    // One loop an arm, so the row kernel inlines into it.
    match ty {
        BlockType::Q5_0 => {
            for (o, r) in rows {
                *o = dot32::<{ q5_0::BYTES }, false>(
                    r,
                    a,
                    |q, l, h, c| q5_0_lanes(q, l, h, c),
                    |b| [d_at(b, q5_0::D), 0.0],
                );
            }
        }
        BlockType::Q5_1 => {
            for (o, r) in rows {
                let scales = |b: &[u8]| [d_at(b, q5_1::D), d_at(b, q5_1::M)];
                *o = dot32::<{ q5_1::BYTES }, true>(
                    r,
                    a,
                    |q, l, h, c| q5_1_lanes(q, l, h, c),
                    scales,
                );
            }
        }
        BlockType::IQ4NL => {
            let table = kv_table();
            for (o, r) in rows {
                let lanes = |q: [&[u8]; 2], xl, xh, _c| {
                    let q = [&q[0][iq4_nl::QS..], &q[1][iq4_nl::QS..]];
                    let (lo, hi) = iq4_pairs(nibbles(q), xl, xh, table);
                    let ones = _mm256_set1_epi16(1);
                    let p =
                        _mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones));
                    [p, p]
                };
                *o = dot32::<{ iq4_nl::BYTES }, false>(r, a, lanes, |b| [d_at(b, iq4_nl::D), 0.0]);
            }
        }
        BlockType::IQ4XS => {
            let table = kv_table();
            for (o, r) in rows {
                *o = dot_iq4_xs(r, a, table);
            }
        }
        _ => unreachable!("{}: not an ext type", ty.name()),
    }
}

/// The f16 at `blk[at..]` as f32.
#[inline]
fn d_at(blk: &[u8], at: usize) -> f32 {
    f16_to_f32(le16(blk, at))
}

/// The sixteen kvalues in both 128-bit lanes (a `pshufb` table).
#[inline]
#[target_feature(enable = "avx2")]
fn kv_table() -> __m256i {
    _mm256_broadcastsi128_si256(load16(&KVALUES))
}

/// The level bytes (16 each, `q[i]` block `i`) of two blocks as their low
/// and high nibbles, block `i` in 128-bit lane `i`.
#[inline]
#[target_feature(enable = "avx2")]
fn nibbles(q: [&[u8]; 2]) -> (__m256i, __m256i) {
    let mask = _mm256_set1_epi8(15);
    let vq = _mm256_set_m128i(load16(q[1]), load16(q[0]));
    let lo = _mm256_and_si256(vq, mask);
    (lo, _mm256_and_si256(_mm256_srli_epi16::<4>(vq), mask))
}

/// 16 in byte `j` of lane `i` where bit `j` (`low`) or bit `16 + j`
/// (`high`) of block `i`'s `qh` is set: the fifth bits of its levels.
#[inline]
#[target_feature(enable = "avx2")]
fn fifth_bits(qh: [u32; 2]) -> (__m256i, __m256i) {
    let v = _mm256_set_epi32(0, 0, 0, qh[1] as i32, 0, 0, 0, qh[0] as i32);
    let sel = |a: i8, b: i8| {
        let h = _mm_setr_epi8(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b);
        _mm256_set_m128i(h, h)
    };
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let pick = |s: __m256i| {
        let b = _mm256_and_si256(_mm256_shuffle_epi8(v, s), bit);
        _mm256_and_si256(_mm256_cmpeq_epi8(b, bit), _mm256_set1_epi8(16))
    };
    (pick(sel(0, 1)), pick(sel(2, 3)))
}

/// The five-bit levels of two Q5 blocks (level bytes at `qs`, high bits at
/// `qh` of each) as `Σ level·x` lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn q5_dot(blk: [&[u8]; 2], qs: usize, qh: usize, xl: __m256i, xh: __m256i) -> __m256i {
    let (lo, hi) = nibbles([&blk[0][qs..], &blk[1][qs..]]);
    let (blo, bhi) = fifth_bits([le32(blk[0], qh), le32(blk[1], qh)]);
    let (lo, hi) = (_mm256_or_si256(lo, blo), _mm256_or_si256(hi, bhi));
    let p16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_maddubs_epi16(hi, xh));
    _mm256_madd_epi16(p16, _mm256_set1_epi16(1))
}

/// Q5_0: `Σ level·x` plus `2·c8` (`−16·Σx`).
#[inline]
#[target_feature(enable = "avx2")]
fn q5_0_lanes(blk: [&[u8]; 2], xl: __m256i, xh: __m256i, c: __m256i) -> [__m256i; 2] {
    let p = q5_dot(blk, q5_0::QS, q5_0::QH, xl, xh);
    let p = _mm256_add_epi32(p, _mm256_slli_epi32::<1>(c));
    [p, p]
}

/// Q5_1: `Σ level·x`, and `Σ x = −c8 / 8`.
#[inline]
#[target_feature(enable = "avx2")]
fn q5_1_lanes(blk: [&[u8]; 2], xl: __m256i, xh: __m256i, c: __m256i) -> [__m256i; 2] {
    let p = q5_dot(blk, q5_1::QS, q5_1::QH, xl, xh);
    let s = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_srai_epi32::<3>(c));
    [p, s]
}

/// The exact i16 pair sums `kvalue·x` of the low and high nibbles.
#[inline]
#[target_feature(enable = "avx2")]
fn iq4_pairs(
    nib: (__m256i, __m256i),
    xl: __m256i,
    xh: __m256i,
    table: __m256i,
) -> (__m256i, __m256i) {
    let pair = |n: __m256i, x: __m256i| {
        let kv = _mm256_shuffle_epi8(table, n);
        _mm256_maddubs_epi16(_mm256_abs_epi8(kv), _mm256_sign_epi8(x, kv))
    };
    (pair(nib.0, xl), pair(nib.1, xh))
}

/// The dot of a row of `B`-byte 32-value blocks: `lanes(blocks, xl, xh,
/// c8)` gives two blocks' exact lanes `[p, s]`, `scales(block)` their f32
/// `[d, m]`; `p` adds with `d·d_x`, then (`TWO`) `s` with `m·d_x`. A last
/// lone block stands in for its missing partner, whose lanes are dropped.
#[inline]
#[target_feature(enable = "avx2")]
fn dot32<const B: usize, const TWO: bool>(
    w: &[u8],
    a: &ActRow,
    lanes: impl Fn([&[u8]; 2], __m256i, __m256i, __m256i) -> [__m256i; 2],
    scales: impl Fn(&[u8]) -> [f32; 2],
) -> f32 {
    let nb = w.len() / B;
    let (xlo, xhi) = a.qs.split_at(16 * nb);
    let z = _mm_setzero_si128();
    let mut acc = [_mm256_setzero_ps(); 2];
    for b in (0..nb).step_by(2) {
        let pair = b + 1 < nb;
        let b0 = &w[B * b..];
        let b1 = if pair { &w[B * (b + 1)..] } else { b0 };
        prefetch(b0, 2 * B);
        let (xl, xh, c) = if pair {
            (
                load32(&xlo[16 * b..]),
                load32(&xhi[16 * b..]),
                load32(&a.c8[4 * b..]),
            )
        } else {
            let half = |s: &[i8]| _mm256_set_m128i(z, load16(s));
            let c = _mm256_set_m128i(z, load16(&a.c8[4 * b..]));
            (half(&xlo[16 * b..]), half(&xhi[16 * b..]), c)
        };
        let [p, s] = lanes([b0, b1], xl, xh, c);
        let (s0, s1) = (scales(b0), scales(b1));
        let dx1 = if pair { a.d[b + 1] } else { 0.0 };
        let f = |i: usize| _mm256_set_m128(_mm_set1_ps(s1[i] * dx1), _mm_set1_ps(s0[i] * a.d[b]));
        let k = (b / 2) % 2;
        let mut v = add_lanes(acc[k], p, f(0));
        if TWO {
            v = add_lanes(v, s, f(1));
        }
        acc[k] = if pair {
            v
        } else {
            _mm256_blend_ps::<0b1111_0000>(v, acc[k])
        };
    }
    reduce16(acc[0], acc[1])
}

/// IQ4_XS: sub-blocks `2k, 2k + 1` a register (to `acc[k % 2]`), the pair
/// sums `madd` with their signed scales.
#[inline]
#[target_feature(enable = "avx2")]
fn dot_iq4_xs(w: &[u8], a: &ActRow, table: __m256i) -> f32 {
    const B: usize = iq4_xs::BYTES;
    let nb = w.len() / B * 8;
    let (xlo, xhi) = a.qs.split_at(16 * nb);
    let mut acc = [_mm256_setzero_ps(); 2];
    for (sb, blk) in w.chunks_exact(B).enumerate() {
        prefetch(blk, B);
        let (dw, sc) = (d_at(blk, iq4_xs::D), scales_xs(blk));
        for k in 0..4 {
            let (j, b) = (2 * k, 8 * sb + 2 * k);
            let q = &blk[iq4_xs::QS + 16 * j..];
            let nib = nibbles([q, &q[16..]]);
            let (lo, hi) = iq4_pairs(nib, load32(&xlo[16 * b..]), load32(&xhi[16 * b..]), table);
            let scv = _mm256_set_m128i(
                _mm_set1_epi16(sc[j + 1] as i16),
                _mm_set1_epi16(sc[j] as i16),
            );
            let p = _mm256_add_epi32(_mm256_madd_epi16(lo, scv), _mm256_madd_epi16(hi, scv));
            let (d0, d1) = (a.d[b], a.d[b + 1]);
            let f = _mm256_set_m128(_mm_set1_ps(dw * d1), _mm_set1_ps(dw * d0));
            acc[k % 2] = add_lanes(acc[k % 2], p, f);
        }
    }
    reduce16(acc[0], acc[1])
}
