//! Q5_0, Q5_1, IQ4_NL and IQ4_XS: the block types llama.cpp's own
//! quantizations fall back to on widths that are not whole 256-value
//! super-blocks (Q4_K → Q5_0, Q5_K → Q5_1, IQ4_XS → IQ4_NL), and IQ4_XS
//! itself. Their bytes (ggml-common.h), ggml's `dequantize_row_*` bit for
//! bit, the weight encoders, and the dots (`scalar`, the twin; `avx2`,
//! `avx512`).
//!
//! All four meet the split Q8_0 activations of Q4_0 (each 32-value block's
//! low half, then its high half, with `c8 = −8·Σx` per four-byte lane): their
//! level bytes use Q4_0's nibble order (value `i` in the low nibble of byte
//! `i`, value `16 + i` in its high nibble, per 32 values), so the same
//! activation row serves them. (ggml pairs IQ4_XS with Q8_K and Q5_1 with
//! Q8_1; the per-32 Q8_0 scale is at least as fine, and Q8_1's `s = d·Σq`
//! is kept here as the exact integer `Σq`.)
//!
//! Encoders: Q5_0 and Q5_1 are ggml's `quantize_row_q5_0_ref` /
//! `quantize_row_q5_1_ref` (same bytes). IQ4_NL and IQ4_XS use a plain
//! scale (not ggml's search) with a stated error bound:
//! - IQ4_NL: `d` = the f16 of `max / −127` (`max` the value of largest
//!   magnitude, so it maps to the table's −127), each value the nearest
//!   table entry of `x / d`. Error per value ≤ `14·|d|` (the widest half
//!   gap, 24/2, or the 127 − 113 the positive side lacks) plus the f16
//!   rounding of `d` times 127.
//! - IQ4_XS: each 32-value sub-block's scale `s = max / −127`; `d` the f16
//!   of `S / −32` with `S` the scale of largest magnitude, the 6-bit scale
//!   `round(s / d)` in −32..=31, each value the nearest table entry of `x /
//!   (d·sc)`. Error per value ≤ `14·|d·sc| + 127·|s − d·sc|`.
//!
//! Imports run one way: this module builds on `codec` and the parent's
//! lanes and loads (`scalar`, `avx2`, `avx512`); none of those knows it.
//! `ggml`'s doors ([`super::dequantize_row`], [`super::quantize_row`],
//! [`super::first_non_finite`], [`super::dot_rows`], `dot_rows_n`) send
//! the types [`owns`] here.

pub(super) mod scalar;

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(super) mod avx512;
#[cfg(test)]
mod tests;

use super::codec::{f16_to_f32, f32_to_f16, first_bad_block, le16, nearest_int, QK, QK_K};
use super::scalar::ActRow;
use super::BlockType;

/// Whether `ty` is one of this module's types.
pub(super) fn owns(ty: BlockType) -> bool {
    matches!(
        ty,
        BlockType::Q5_0 | BlockType::Q5_1 | BlockType::IQ4NL | BlockType::IQ4XS
    )
}

/// ggml's `kvalues_iq4nl`: the sixteen levels of IQ4_NL and IQ4_XS.
pub(super) const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Q5_0: `d: f16`, `qh: u32` (bit `i`: the fifth bit of value `i`),
/// `qs: [u8; 16]` (Q4_0's nibbles); value = `(level − 16)·d`.
pub(super) mod q5_0 {
    pub const D: usize = 0;
    pub const QH: usize = 2;
    pub const QS: usize = 6;
    pub const BYTES: usize = QS + super::QK / 2;
}
/// Q5_1: `d, m: f16`, `qh: u32`, `qs: [u8; 16]`; value = `level·d + m`.
pub(super) mod q5_1 {
    pub const D: usize = 0;
    pub const M: usize = 2;
    pub const QH: usize = 4;
    pub const QS: usize = 8;
    pub const BYTES: usize = QS + super::QK / 2;
}
/// IQ4_NL: `d: f16`, `qs: [u8; 16]` (Q4_0's nibbles, each an index into
/// [`KVALUES`]); value = `d·KVALUES[index]`.
pub(super) mod iq4_nl {
    pub const D: usize = 0;
    pub const QS: usize = 2;
    pub const BYTES: usize = QS + super::QK / 2;
}
/// IQ4_XS: `d: f16`, `scales_h: u16` (bits `2j..2j+2`: the top two bits of
/// sub-block `j`'s 6-bit scale), `scales_l: [u8; 4]` (nibble `j % 2` of
/// byte `j / 2`: its low four bits), `qs: [u8; 128]` (sub-block `j`'s 16
/// bytes at `16j`, IQ4_NL's nibbles); value = `d·(scale − 32)·KVALUES[index]`.
pub(super) mod iq4_xs {
    pub const D: usize = 0;
    pub const SCALES_H: usize = 2;
    pub const SCALES_L: usize = 4;
    pub const QS: usize = 8;
    pub const BYTES: usize = QS + super::QK_K / 2;
}

const _: () = {
    assert!(q5_0::BYTES == 22 && q5_1::BYTES == 24);
    assert!(iq4_nl::BYTES == 18 && iq4_xs::BYTES == 136);
};

/// The 32 five-bit levels of a Q5_0/Q5_1 block (`qs` its 16 level bytes,
/// `qh` its high bits).
#[inline]
pub(super) fn q5_levels(qs: &[u8], qh: u32) -> [u8; QK] {
    std::array::from_fn(|v| {
        let nib = if v < 16 { qs[v] & 15 } else { qs[v - 16] >> 4 };
        nib | (((qh >> v) & 1) as u8) << 4
    })
}

/// The little-endian `u32` at `b[at..at + 4]`.
#[inline]
pub(super) fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The eight signed scales (`6-bit − 32`) of an IQ4_XS block.
#[inline]
pub(super) fn scales_xs(blk: &[u8]) -> [i8; 8] {
    let h = le16(blk, iq4_xs::SCALES_H);
    std::array::from_fn(|j| {
        let lo = (blk[iq4_xs::SCALES_L + j / 2] >> (4 * (j % 2))) & 15;
        let hi = ((h >> (2 * j)) & 3) as u8;
        (lo | hi << 4) as i8 - 32
    })
}

/// The nibble (table index) of value `v` of a 32-value group of level bytes.
#[inline]
pub(super) fn nibble(qs: &[u8], v: usize) -> u8 {
    if v < 16 {
        qs[v] & 15
    } else {
        qs[v - 16] >> 4
    }
}

/// See [`super::dequantize_row`] (lengths checked there).
pub(super) fn dequantize_row(ty: BlockType, bytes: &[u8], out: &mut [f32]) {
    let (be, bb) = (ty.block_elems(), ty.block_bytes());
    for (blk, o) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(be)) {
        dequantize_block(ty, blk, o)
    }
}

/// See [`super::quantize_row`] (lengths checked there).
pub(super) fn quantize_row(ty: BlockType, x: &[f32], out: &mut [u8]) {
    let (be, bb) = (ty.block_elems(), ty.block_bytes());
    for (x, blk) in x.chunks_exact(be).zip(out.chunks_exact_mut(bb)) {
        encode_block(ty, x, blk)
    }
}

/// See [`super::first_non_finite`]: the f16 `d` (and Q5_1's `m`) of each
/// block.
pub(super) fn first_non_finite(ty: BlockType, bytes: &[u8]) -> Option<usize> {
    let block = match ty {
        BlockType::Q5_0 => first_bad_block::<{ q5_0::BYTES }, { q5_0::D }, { q5_0::D }>(bytes),
        BlockType::Q5_1 => first_bad_block::<{ q5_1::BYTES }, { q5_1::D }, { q5_1::M }>(bytes),
        BlockType::IQ4NL => {
            first_bad_block::<{ iq4_nl::BYTES }, { iq4_nl::D }, { iq4_nl::D }>(bytes)
        }
        BlockType::IQ4XS => {
            first_bad_block::<{ iq4_xs::BYTES }, { iq4_xs::D }, { iq4_xs::D }>(bytes)
        }
        _ => unreachable!("{}: not an ext type", ty.name()),
    };
    block.map(|b| b * ty.block_elems())
}

/// See [`super::dot_rows`] (which checked the lengths), dispatched the
/// same way.
pub(super) fn dot_rows(ty: BlockType, w: &[u8], a: &ActRow, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match super::simd() {
        super::Simd::Vnni => {
            let (out, _) = out.as_chunks_mut::<1>();
            // SAFETY: `simd()` saw AVX2, F16C, AVX-512F/BW and VNNI.
            return unsafe { avx512::dot_rows_n(ty, w, &[*a], out) };
        }
        // SAFETY: `simd()` saw AVX2.
        super::Simd::Avx2 => return unsafe { avx2::dot_rows(ty, w, a, out) },
        super::Simd::Scalar => {}
    }
    scalar::dot_rows(ty, w, a, out)
}

/// One block of one of this module's types (see [`super::dequantize_row`]).
fn dequantize_block(ty: BlockType, blk: &[u8], o: &mut [f32]) {
    match ty {
        BlockType::Q5_0 => {
            let d = f16_to_f32(le16(blk, q5_0::D));
            let lev = q5_levels(&blk[q5_0::QS..q5_0::BYTES], le32(blk, q5_0::QH));
            for (o, &l) in o.iter_mut().zip(&lev) {
                *o = (l as i32 - 16) as f32 * d;
            }
        }
        BlockType::Q5_1 => {
            let (d, m) = (
                f16_to_f32(le16(blk, q5_1::D)),
                f16_to_f32(le16(blk, q5_1::M)),
            );
            let lev = q5_levels(&blk[q5_1::QS..q5_1::BYTES], le32(blk, q5_1::QH));
            for (o, &l) in o.iter_mut().zip(&lev) {
                // Two roundings, as ggml's non-FMA build.
                *o = l as f32 * d + m;
            }
        }
        BlockType::IQ4NL => {
            let d = f16_to_f32(le16(blk, iq4_nl::D));
            let qs = &blk[iq4_nl::QS..iq4_nl::BYTES];
            for (v, o) in o.iter_mut().enumerate() {
                *o = d * KVALUES[nibble(qs, v) as usize] as f32;
            }
        }
        BlockType::IQ4XS => {
            let d = f16_to_f32(le16(blk, iq4_xs::D));
            let sc = scales_xs(blk);
            for (j, o) in o.chunks_exact_mut(QK).enumerate() {
                let dl = d * sc[j] as f32;
                let qs = &blk[iq4_xs::QS + 16 * j..iq4_xs::QS + 16 * j + 16];
                for (v, o) in o.iter_mut().enumerate() {
                    *o = dl * KVALUES[nibble(qs, v) as usize] as f32;
                }
            }
        }
        _ => unreachable!("{}: not an ext type", ty.name()),
    }
}

/// See [`super::quantize_row`]: one block.
fn encode_block(ty: BlockType, x: &[f32], blk: &mut [u8]) {
    match ty {
        BlockType::Q5_0 => encode_q5_0(x, blk),
        BlockType::Q5_1 => encode_q5_1(x, blk),
        BlockType::IQ4NL => {
            let d = f32_to_f16(signed_absmax(x) / -127.0);
            let df = f16_to_f32(d);
            let idx: [u8; QK] = std::array::from_fn(|v| nearest_level(x[v], df));
            pack_iq4_nl(d, &idx, blk)
        }
        BlockType::IQ4XS => encode_iq4_xs(x, blk),
        _ => unreachable!("{}: not an ext type", ty.name()),
    }
}

/// The first value of largest magnitude (NaN never counts), 0 if none.
fn signed_absmax(x: &[f32]) -> f32 {
    x.iter()
        .fold(0f32, |best, &v| if v.abs() > best.abs() { v } else { best })
}

/// The index of the table entry nearest `x / d` (ties to the lower
/// entry; 0 when `d` is 0 or the quotient is NaN).
pub(super) fn nearest_level(x: f32, d: f32) -> u8 {
    let t = if d != 0.0 { x / d } else { 0.0 };
    let mut best = 0u8;
    for (i, &k) in KVALUES.iter().enumerate().skip(1) {
        if (k as f32 - t).abs() < (KVALUES[best as usize] as f32 - t).abs() {
            best = i as u8;
        }
    }
    best
}

/// ggml's `quantize_row_q5_0_ref`.
fn encode_q5_0(x: &[f32], blk: &mut [u8]) {
    let d = signed_absmax(x) / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    // (x·id + 16.5) truncated, capped at 31: round half up onto 0..=31.
    let levels = std::array::from_fn(|v| ((x[v] * id + 16.5) as i8).min(31) as u8);
    pack_q5(blk, q5_0::QH, q5_0::QS, &levels);
    blk[q5_0::D..q5_0::D + 2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
}

/// ggml's `quantize_row_q5_1_ref`.
fn encode_q5_1(x: &[f32], blk: &mut [u8]) {
    let min = x.iter().fold(f32::MAX, |a, &v| if v < a { v } else { a });
    let max = x.iter().fold(-f32::MAX, |a, &v| if v > a { v } else { a });
    let d = (max - min) / 31.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let levels = std::array::from_fn(|v| ((x[v] - min) * id + 0.5) as u8);
    pack_q5(blk, q5_1::QH, q5_1::QS, &levels);
    blk[q5_1::D..q5_1::D + 2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    blk[q5_1::M..q5_1::M + 2].copy_from_slice(&f32_to_f16(min).to_le_bytes());
}

/// Writes 32 five-bit levels as `qh` at `qh_at` and nibbles at `qs_at`.
/// Levels above 31 keep their low five bits (ggml's `& 0x0F`, `& 0x10`).
pub(super) fn pack_q5(blk: &mut [u8], qh_at: usize, qs_at: usize, levels: &[u8; QK]) {
    let mut qh = 0u32;
    for j in 0..QK / 2 {
        let (a, b) = (levels[j], levels[j + 16]);
        blk[qs_at + j] = (a & 15) | (b & 15) << 4;
        qh |= (((a & 16) >> 4) as u32) << j | (((b & 16) >> 4) as u32) << (j + 16);
    }
    blk[qh_at..qh_at + 4].copy_from_slice(&qh.to_le_bytes());
}

/// Writes an IQ4_NL block: f16 bits `d`, then the 32 table indices.
pub(super) fn pack_iq4_nl(d: u16, idx: &[u8; QK], blk: &mut [u8]) {
    blk[iq4_nl::D..iq4_nl::D + 2].copy_from_slice(&d.to_le_bytes());
    pack_nibbles(idx, &mut blk[iq4_nl::QS..iq4_nl::BYTES]);
}

/// 32 indices (< 16) into 16 bytes of Q4_0's nibble order.
fn pack_nibbles(idx: &[u8], out: &mut [u8]) {
    for j in 0..16 {
        out[j] = idx[j] | idx[j + 16] << 4;
    }
}

/// Writes an IQ4_XS block: f16 bits `d`, eight scales (−32..=31) and 256
/// table indices.
pub(super) fn pack_iq4_xs(d: u16, sc: &[i8; 8], idx: &[u8; QK_K], blk: &mut [u8]) {
    blk[iq4_xs::D..iq4_xs::D + 2].copy_from_slice(&d.to_le_bytes());
    let mut h = 0u16;
    blk[iq4_xs::SCALES_L..iq4_xs::QS].fill(0);
    for (j, &s) in sc.iter().enumerate() {
        let l = (s as i32 + 32) as u8;
        blk[iq4_xs::SCALES_L + j / 2] |= (l & 15) << (4 * (j % 2));
        h |= ((l >> 4) as u16) << (2 * j);
    }
    blk[iq4_xs::SCALES_H..iq4_xs::SCALES_H + 2].copy_from_slice(&h.to_le_bytes());
    for (j, idx) in idx.chunks_exact(QK).enumerate() {
        pack_nibbles(idx, &mut blk[iq4_xs::QS + 16 * j..iq4_xs::QS + 16 * j + 16]);
    }
}

/// The plain IQ4_XS encoder (module doc).
fn encode_iq4_xs(x: &[f32], blk: &mut [u8]) {
    let s: [f32; 8] = std::array::from_fn(|j| signed_absmax(&x[QK * j..QK * (j + 1)]) / -127.0);
    let d = f32_to_f16(signed_absmax(&s) / -32.0);
    let df = f16_to_f32(d);
    let sc = s.map(|s| {
        if df != 0.0 {
            nearest_int((s / df).clamp(-32.0, 31.0)) as i8
        } else {
            0
        }
    });
    let idx = std::array::from_fn(|v| nearest_level(x[v], df * sc[v / QK] as f32));
    pack_iq4_xs(d, &sc, &idx, blk);
}
