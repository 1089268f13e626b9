//! AVX-512 VNNI dots of Q5_0, Q5_1, IQ4_NL and IQ4_XS, bit-identical to
//! the twins (`ext::scalar`): four 32-value blocks a register (block `b +
//! i` in lanes `4i..4i+4`, one block a 128-bit lane), `vpdpbusd` of
//! unsigned bytes by the split activations straight into the twin's lanes.
//! The bytes are unsigned levels: Q5's five-bit levels (the fifth bits
//! added under a byte mask built from `qh`), the IQ4 types' kvalues plus
//! 128 (1..=241, a `vpshufb` table); `c8` (`−8·Σx` a lane) times 2 or 16
//! takes the 16 or 128 back out, exactly. IQ4_XS's sub-block scales then
//! multiply the i32 lanes (`vpmulld`; at most 8·127·127·32 in size).
//! One activation row a pass, as Q4_0.

use super::super::avx2::{load16, prefetch};
use super::super::avx512::{add_lanes16, f16x4, join, load64, load_masked, load_ps4, reduce16};
use super::super::avx512::{q4_0_nibbles, spread, SPREAD4};
use super::super::codec::le16;
use super::super::scalar::ActRow;
use super::super::BlockType;
use super::{iq4_nl, iq4_xs, le32, q5_0, q5_1, scales_xs, KVALUES};
use std::arch::x86_64::*;

/// `out[k][t]` = the dot of row `k` of `w` with `a[t]`, row by row.
///
/// # Safety
/// The CPU must support AVX2, F16C, AVX-512F, AVX-512BW and AVX-512 VNNI.
/// (Lengths are checked by slicing.)
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
pub(in super::super) unsafe fn dot_rows_n<const N: usize>(
    ty: BlockType,
    w: &[u8],
    a: &[ActRow; N],
    out: &mut [[f32; N]],
) {
    let rb = w.len() / out.len().max(1);
    let rows = out.iter_mut().zip(w.chunks_exact(rb.max(1)));
    let table = kv_table();
    // One loop an arm, so the row kernel inlines into it.
    match ty {
        BlockType::Q5_0 => {
            for (o, r) in rows {
                for (o, a) in o.iter_mut().zip(a) {
                    *o = dot32::<{ q5_0::BYTES }, false>(
                        r,
                        a,
                        |q, l, h, c| q5_0_lanes(q, l, h, c),
                        |b| [le16(b, 0), 0],
                    );
                }
            }
        }
        BlockType::Q5_1 => {
            for (o, r) in rows {
                for (o, a) in o.iter_mut().zip(a) {
                    let h = |b: &[u8]| [le16(b, q5_1::D), le16(b, q5_1::M)];
                    *o = dot32::<{ q5_1::BYTES }, true>(
                        r,
                        a,
                        |q, l, h, c| q5_1_lanes(q, l, h, c),
                        h,
                    );
                }
            }
        }
        BlockType::IQ4NL => {
            for (o, r) in rows {
                for (o, a) in o.iter_mut().zip(a) {
                    let lanes = |q: [&[u8]; 4], xl, xh, c| {
                        let q = q.map(|q| &q[iq4_nl::QS..]);
                        let p = iq4_dot(q4_0_nibbles(group(q)), xl, xh, c, table);
                        [p, p]
                    };
                    *o = dot32::<{ iq4_nl::BYTES }, false>(r, a, lanes, |b| [le16(b, 0), 0]);
                }
            }
        }
        BlockType::IQ4XS => {
            for (o, r) in rows {
                for (o, a) in o.iter_mut().zip(a) {
                    *o = dot_iq4_xs(r, a, table);
                }
            }
        }
        _ => unreachable!("{}: not an ext type", ty.name()),
    }
}

/// The kvalues plus 128 (as unsigned bytes) in every 128-bit lane.
#[inline]
#[target_feature(enable = "avx512f")]
fn kv_table() -> __m512i {
    let t: [u8; 16] = KVALUES.map(|k| (k as i16 + 128) as u8);
    _mm512_broadcast_i32x4(load16(&t))
}

/// Four blocks' 16 level bytes (`q[i]`: block `i`'s), block `i` in 128-bit
/// lane `i`. (Four 16-byte loads, as Q4_0: no load splits a line more than
/// the blocks do.)
#[inline]
#[target_feature(enable = "avx2,avx512f")]
fn group(q: [&[u8]; 4]) -> __m512i {
    let l = |i: usize| load16(q[i]);
    join(_mm256_set_m128i(l(1), l(0)), _mm256_set_m128i(l(3), l(2)))
}

/// Four Q5 blocks' five-bit levels (level bytes at `qs`, `qh` at `qh`):
/// byte `16i + j` of the low (high) levels takes 16 where bit `j` (`16 + j`)
/// of block `i`'s `qh` is set.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
fn q5_levels(blk: [&[u8]; 4], qs: usize, qh: usize) -> (__m512i, __m512i) {
    let (lo, hi) = q4_0_nibbles(group(blk.map(|b| &b[qs..])));
    let (mut mlo, mut mhi) = (0u64, 0u64);
    for (i, b) in blk.iter().enumerate() {
        let h = le32(b, qh) as u64;
        mlo |= (h & 0xffff) << (16 * i);
        mhi |= (h >> 16) << (16 * i);
    }
    let sixteen = _mm512_set1_epi8(16);
    (
        _mm512_mask_add_epi8(lo, mlo, lo, sixteen),
        _mm512_mask_add_epi8(hi, mhi, hi, sixteen),
    )
}

/// Q5_0: `Σ level·x + 2·c8`, i.e. `Σ (level − 16)·x`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
fn q5_0_lanes(blk: [&[u8]; 4], xl: __m512i, xh: __m512i, c: __m512i) -> [__m512i; 2] {
    let (lo, hi) = q5_levels(blk, q5_0::QS, q5_0::QH);
    let p = _mm512_dpbusd_epi32(_mm512_slli_epi32::<1>(c), lo, xl);
    let p = _mm512_dpbusd_epi32(p, hi, xh);
    [p, p]
}

/// Q5_1: `Σ level·x`, and `Σ x = −c8 / 8`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
fn q5_1_lanes(blk: [&[u8]; 4], xl: __m512i, xh: __m512i, c: __m512i) -> [__m512i; 2] {
    let (lo, hi) = q5_levels(blk, q5_1::QS, q5_1::QH);
    let zero = _mm512_setzero_si512();
    let p = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, lo, xl), hi, xh);
    [p, _mm512_sub_epi32(zero, _mm512_srai_epi32::<3>(c))]
}

/// `Σ kvalue·x` of a register of IQ4 nibbles: `(kvalue + 128)·x` by
/// `vpdpbusd`, from `16·c8` (`−128·Σx`).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
fn iq4_dot(nib: (__m512i, __m512i), xl: __m512i, xh: __m512i, c: __m512i, t: __m512i) -> __m512i {
    let (lo, hi) = (_mm512_shuffle_epi8(t, nib.0), _mm512_shuffle_epi8(t, nib.1));
    let p = _mm512_dpbusd_epi32(_mm512_slli_epi32::<4>(c), lo, xl);
    _mm512_dpbusd_epi32(p, hi, xh)
}

/// The f32 of four f16 bits (lanes 0..4).
#[inline]
#[target_feature(enable = "f16c")]
fn f16s(h: [u16; 4]) -> __m128 {
    f16x4(h.iter().rev().fold(0u64, |acc, &h| acc << 16 | h as u64))
}

/// The dot of a row of `B`-byte 32-value blocks, four a step: `lanes(blocks,
/// xl, xh, c8)` gives the exact lanes `[p, s]`, `h(block)` the f16 bits of
/// `[d, m]`; `p` adds with `d·d_x`, then (`TWO`) `s` with `m·d_x`. A last
/// group of one to three blocks leaves the other lanes as they were.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
fn dot32<const B: usize, const TWO: bool>(
    w: &[u8],
    a: &ActRow,
    lanes: impl Fn([&[u8]; 4], __m512i, __m512i, __m512i) -> [__m512i; 2],
    h: impl Fn(&[u8]) -> [u16; 2],
) -> f32 {
    let nb = w.len() / B;
    let (xlo, xhi) = a.qs.split_at(16 * nb);
    let s4 = load64(&SPREAD4);
    let mut acc = _mm512_setzero_ps();
    for g in (0..nb).step_by(4) {
        let k = (nb - g).min(4);
        // Past the row's end, the last block stands in (its lanes are dropped).
        let blk: [&[u8]; 4] = std::array::from_fn(|i| &w[B * (g + i.min(k - 1))..]);
        prefetch(blk[0], 4 * B);
        let (xl, xh, c, dx) = if k == 4 {
            let (xl, xh) = (load64(&xlo[16 * g..]), load64(&xhi[16 * g..]));
            (xl, xh, load64(&a.c8[4 * g..]), load_ps4(&a.d[g..]))
        } else {
            let r = 16 * g..16 * (g + k);
            let (xl, xh) = (load_masked(&xlo[r.clone()]), load_masked(&xhi[r]));
            let d: [f32; 4] = std::array::from_fn(|i| if i < k { a.d[g + i] } else { 0.0 });
            let dx = _mm_setr_ps(d[0], d[1], d[2], d[3]);
            (xl, xh, load_masked(&a.c8[4 * g..4 * (g + k)]), dx)
        };
        let [p, s] = lanes(blk, xl, xh, c);
        let hs = blk.map(&h);
        let f = |i: usize| spread(s4, _mm_mul_ps(f16s(hs.map(|h| h[i])), dx));
        let mut v = add_lanes16(acc, p, f(0));
        if TWO {
            v = add_lanes16(v, s, f(1));
        }
        let keep: __mmask16 = ((1u32 << (4 * k)) - 1) as u16;
        acc = _mm512_mask_mov_ps(acc, keep, v);
    }
    reduce16(acc)
}

/// IQ4_XS: sub-blocks `4r..4r + 4` a register (64 contiguous level bytes),
/// the i32 lanes times their sub-block's signed scale.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
fn dot_iq4_xs(w: &[u8], a: &ActRow, table: __m512i) -> f32 {
    const B: usize = iq4_xs::BYTES;
    let nb = w.len() / B * 8;
    let (xlo, xhi) = a.qs.split_at(16 * nb);
    let s4 = load64(&SPREAD4);
    let mut acc = _mm512_setzero_ps();
    for (sb, blk) in w.chunks_exact(B).enumerate() {
        prefetch(blk, B);
        let dw = f16s([le16(blk, iq4_xs::D), 0, 0, 0]);
        let dw = _mm_shuffle_ps::<0>(dw, dw);
        let sc = scales_xs(blk);
        for r in 0..2 {
            let b = 8 * sb + 4 * r;
            let nib = q4_0_nibbles(load64(&blk[iq4_xs::QS + 64 * r..]));
            let (xl, xh) = (load64(&xlo[16 * b..]), load64(&xhi[16 * b..]));
            let p = iq4_dot(nib, xl, xh, load64(&a.c8[4 * b..]), table);
            let rep = |j: usize| (sc[4 * r + j] as u8 as u32 * 0x0101_0101) as i32;
            let scv = _mm512_cvtepi8_epi32(_mm_setr_epi32(rep(0), rep(1), rep(2), rep(3)));
            let p = _mm512_mullo_epi32(p, scv);
            acc = add_lanes16(acc, p, spread(s4, _mm_mul_ps(dw, load_ps4(&a.d[b..]))));
        }
    }
    reduce16(acc)
}
