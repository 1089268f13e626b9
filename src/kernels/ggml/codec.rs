//! The bytes of ggml's blocks (ggml-common.h) and their conversions to and
//! from f32: the f16 scales, the packed 6-bit scales of Q4_K/Q5_K and
//! Q3_K, `dequantize_row_*` exactly as ggml evaluates it, and the weight
//! encoders.
//!
//! Dequantization is ggml's C, operation for operation and unfused (ggml's
//! base library, where `dequantize_row_*` lives, is built without FMA on
//! x86, so `d1 * q - m1` rounds twice there too): every f32 equals ggml's
//! bit for bit.
//!
//! Encoders: Q4_0 and Q8_0 are ggml's `quantize_row_q4_0_ref` /
//! `quantize_row_q8_0_ref` (same bytes). The K types use a simpler scale
//! search than ggml's iterative `make_qkx2_quants` / `make_qx_quants`, but
//! produce valid blocks with a proven error bound:
//! - Q4_K/Q5_K: per 32-value sub-block, `lo = min(0, min x)` and
//!   `step = (max x − lo) / nmax`; the super-block scales `d`, `dmin` are
//!   the f16 values at or above `max step / 63` and `max(−lo) / 63`; the
//!   6-bit scale is `ceil(step / d)` (so the grid spans the sub-block) and the
//!   6-bit min `round(−lo / dmin)`; each value then takes the nearest level
//!   of the final grid. Error per value ≤ `d·sc / 2 + dmin / 2`.
//! - Q6_K: per 16-value sub-block the value of largest magnitude maps to
//!   −32 (`s = max / −32`, as ggml); `d` is the f16 at or above
//!   `max |s| / 127`, the 8-bit scale `round(s / d)`, and each value the
//!   nearest level in −32..=31. Error per value ≤ `d·|sc| + 16·d`.
//! - Q3_K: the same with levels −4..=3 (`s = max / −4`) and 6-bit signed
//!   scales: `d` the f16 at or above `max |s| / 31`, `sc = round(s / d)` in
//!   −31..=31. Error per value ≤ `d·|sc| + 2·d`.
//! - Q2_K: as Q4_K over 16-value sub-blocks with levels 0..=3 and 4-bit
//!   scales and mins (`/ 15` instead of `/ 63`). Error per value ≤
//!   `d·sc / 2 + dmin / 2`.
//!
//! Non-finite inputs give non-finite scales ([`first_non_finite`] finds
//! them); nothing panics on them.
//!
//! `ext`'s types (Q5_0, Q5_1, IQ4_NL, IQ4_XS) are not handled here: the
//! doors in `ggml` route them to `ext`, which builds on this file (imports
//! run one way).

use super::BlockType;

/// Values per block of the 32-wide types.
pub(super) const QK: usize = 32;
/// Values per super-block of the K types.
pub(super) const QK_K: usize = 256;

/// Q4_0: `d: f16`, `qs: [u8; 16]` (value `i` in the low nibble of byte `i`,
/// value `16 + i` in its high nibble, each `q + 8`).
pub(super) mod q4_0 {
    pub const D: usize = 0;
    pub const QS: usize = 2;
    pub const BYTES: usize = QS + super::QK / 2;
}
/// Q8_0: `d: f16`, `qs: [i8; 32]`.
pub(super) mod q8_0 {
    pub const D: usize = 0;
    pub const QS: usize = 2;
    pub const BYTES: usize = QS + super::QK;
}
/// Q4_K: `d, dmin: f16`, `scales: [u8; 12]` (eight 6-bit scales and mins),
/// `qs: [u8; 128]` (byte `32c + l`: value `64c + l` low, `64c + 32 + l` high).
pub(super) mod q4_k {
    pub const D: usize = 0;
    pub const DMIN: usize = 2;
    pub const SCALES: usize = 4;
    pub const QS: usize = 16;
    pub const BYTES: usize = QS + super::QK_K / 2;
}
/// Q5_K: as Q4_K plus `qh: [u8; 32]` before `qs`: bit `2c` of `qh[l]` is the
/// fifth bit of value `64c + l`, bit `2c + 1` that of `64c + 32 + l`.
pub(super) mod q5_k {
    pub const D: usize = 0;
    pub const DMIN: usize = 2;
    pub const SCALES: usize = 4;
    pub const QH: usize = 16;
    pub const QS: usize = QH + super::QK_K / 8;
    pub const BYTES: usize = QS + super::QK_K / 2;
}
/// Q6_K: `ql: [u8; 128]`, `qh: [u8; 64]`, `scales: [i8; 16]`, `d: f16`. In
/// half `h`, value `128h + 32s + l` (s = 0..4) is nibble `s / 2` of
/// `ql[64h + 32(s % 2) + l]` plus bits `2s..2s+2` of `qh[32h + l]` as bits
/// 4..6, minus 32; sub-block `v / 16` has scale `scales[v / 16]`.
pub(super) mod q6_k {
    pub const QL: usize = 0;
    pub const QH: usize = 128;
    pub const SCALES: usize = 192;
    pub const D: usize = 208;
    pub const BYTES: usize = D + 2;
}

/// Q3_K: `hmask: [u8; 32]`, `qs: [u8; 64]`, `scales: [u8; 12]` (sixteen
/// 6-bit scales, each stored `+ 32`), `d: f16`. Value `128h + 32s + l` (s =
/// 0..4): bits `2s..2s+2` of `qs[32h + l]` are its level's low two bits and
/// bit `4h + s` of `hmask[l]` its third; it decodes to `level − 4`;
/// sub-block `v / 16` has scale `v / 16` of `scales_q3`.
pub(super) mod q3_k {
    pub const HMASK: usize = 0;
    pub const QS: usize = 32;
    pub const SCALES: usize = 96;
    pub const D: usize = 108;
    pub const BYTES: usize = D + 2;
}
/// Q2_K: `scales: [u8; 16]` (byte `j`: sub-block `j`'s 4-bit scale low, its
/// 4-bit min high), `qs: [u8; 64]` (value `128h + 32s + l`: bits `2s..2s+2`
/// of `qs[32h + l]`), `d, dmin: f16`.
pub(super) mod q2_k {
    pub const SCALES: usize = 0;
    pub const QS: usize = 16;
    pub const D: usize = 80;
    pub const DMIN: usize = 82;
    pub const BYTES: usize = DMIN + 2;
}

const _: () = {
    assert!(q4_0::BYTES == 18 && q8_0::BYTES == 34);
    assert!(q3_k::BYTES == 110 && q2_k::BYTES == 84);
    assert!(q3_k::QS == q3_k::HMASK + QK_K / 8 && q3_k::SCALES == q3_k::QS + QK_K / 4);
    assert!(q2_k::QS == q2_k::SCALES + QK_K / 16 && q2_k::D == q2_k::QS + QK_K / 4);
    assert!(q4_k::BYTES == 144 && q5_k::BYTES == 176 && q6_k::BYTES == 210);
    assert!(q4_k::SCALES + 12 == q4_k::QS && q5_k::SCALES + 12 == q5_k::QH);
    assert!(q6_k::QH == q6_k::QL + QK_K / 2 && q6_k::SCALES == q6_k::QH + QK_K / 4);
};

/// The little-endian `u16` at `b[at..at + 2]`.
#[inline]
pub(super) fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// IEEE binary16 → binary32, exact for every input (NaN payloads kept).
#[inline]
pub(super) fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    match exp {
        // Zero and subnormals: man · 2^-24, exact in f32.
        0 => f32::from_bits(sign | (man as f32 * (1.0 / 16_777_216.0)).to_bits()),
        0x1f => f32::from_bits(sign | 0x7f80_0000 | (man << 13)),
        _ => f32::from_bits(sign | ((exp + 112) << 23) | (man << 13)),
    }
}

/// The nearest f16 (ties to even), as bits.
#[inline]
pub(super) fn f32_to_f16(v: f32) -> u16 {
    half::f16::from_f32(v).to_bits()
}

/// The smallest f16 at or above `v` (for `v ≥ 0`), as bits: a scale that
/// never shrinks the grid the encoder planned.
fn f16_at_least(v: f32) -> u16 {
    let h = f32_to_f16(v);
    if f16_to_f32(h) < v && h < 0x7c00 {
        h + 1
    } else {
        h
    }
}

/// ggml's `nearest_int`: round half to even through the f32 adder, exact
/// for `|v| < 2^22` (what every caller passes).
#[inline]
pub(super) fn nearest_int(v: f32) -> i32 {
    let t = v + 12_582_912.0; // 1.5 · 2^23
    (t.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// The eight 6-bit scales and mins of a Q4_K/Q5_K block from its 12 bytes
/// (ggml's `get_scale_min_k4` for j = 0..8, four at a time): `(sc, m)`.
#[inline]
pub(super) fn scales_k4(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let word = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (s0, s1, s2) = (word(0), word(1), word(2));
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const TOP2: u32 = 0x0303_0303;
    let sc_hi = (s2 & LOW4) | ((s0 >> 6) & TOP2) << 4;
    let m_hi = ((s2 >> 4) & LOW4) | ((s1 >> 6) & TOP2) << 4;
    let join = |lo: u32, hi: u32| ((hi as u64) << 32 | lo as u64).to_le_bytes();
    (join(s0 & LOW6, sc_hi), join(s1 & LOW6, m_hi))
}

/// Packs eight 6-bit scales and mins into the 12 bytes [`scales_k4`] reads.
fn pack_scales_k4(sc: &[u8; 8], m: &[u8; 8], out: &mut [u8]) {
    for j in 0..4 {
        out[j] = sc[j] | (sc[j + 4] >> 4) << 6;
        out[j + 4] = m[j] | (m[j + 4] >> 4) << 6;
        out[j + 8] = (sc[j + 4] & 15) | (m[j + 4] & 15) << 4;
    }
}

/// The sixteen signed scales (−32..=31) of a Q3_K block from its 12 bytes:
/// scale `j`'s low four bits are nibble `j / 8` of byte `j % 8`, its top two
/// bits are bits `2·(j / 4)..` of byte `8 + j % 4` (ggml's `kmask` unpacking,
/// four at a time).
#[inline]
pub(super) fn scales_q3(s: &[u8]) -> [i8; 16] {
    let word = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (a, b, t) = (word(0), word(1), word(2));
    const LOW4: u32 = 0x0f0f_0f0f;
    const TOP2: u32 = 0x0303_0303;
    let w = [
        (a & LOW4) | (t & TOP2) << 4,
        (b & LOW4) | ((t >> 2) & TOP2) << 4,
        ((a >> 4) & LOW4) | ((t >> 4) & TOP2) << 4,
        ((b >> 4) & LOW4) | ((t >> 6) & TOP2) << 4,
    ];
    std::array::from_fn(|j| (w[j / 4].to_le_bytes()[j % 4] as i8) - 32)
}

/// Packs sixteen scales (−32..=31) into the 12 bytes [`scales_q3`] reads.
fn pack_scales_q3(sc: &[i8; 16], out: &mut [u8]) {
    out[..12].fill(0);
    for (j, &s) in sc.iter().enumerate() {
        let l = (s as i32 + 32) as u8;
        out[j % 8] |= (l & 15) << (4 * (j / 8));
        out[8 + j % 4] |= (l >> 4) << (2 * (j / 4));
    }
}

/// The 3-bit level (0..8, decoding to `level − 4`) of value `v` of a Q3_K
/// block.
#[inline]
pub(super) fn q3_level(blk: &[u8], v: usize) -> u8 {
    let (h, s, l) = (v / 128, (v % 128) / 32, v % 32);
    let low = (blk[q3_k::QS + 32 * h + l] >> (2 * s)) & 3;
    let high = (blk[q3_k::HMASK + l] >> (4 * h + s)) & 1;
    low | high << 2
}

/// The 2-bit level of value `v` of a Q2_K block.
#[inline]
pub(super) fn q2_level(blk: &[u8], v: usize) -> u8 {
    let (h, s, l) = (v / 128, (v % 128) / 32, v % 32);
    (blk[q2_k::QS + 32 * h + l] >> (2 * s)) & 3
}

/// See [`super::dequantize_row`].
pub(super) fn dequantize_row(ty: BlockType, bytes: &[u8], out: &mut [f32]) {
    let (be, bb) = (ty.block_elems(), ty.block_bytes());
    for (blk, o) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(be)) {
        match ty {
            BlockType::Q4_0 => dequant_q4_0(blk, o),
            BlockType::Q8_0 => dequant_q8_0(blk, o),
            BlockType::Q4K => dequant_q4_k(blk, o),
            BlockType::Q5K => dequant_q5_k(blk, o),
            BlockType::Q6K => dequant_q6_k(blk, o),
            BlockType::Q3K => dequant_q3_k(blk, o),
            BlockType::Q2K => dequant_q2_k(blk, o),
            BlockType::Q5_0 | BlockType::Q5_1 | BlockType::IQ4NL | BlockType::IQ4XS => {
                unreachable!("{}: ggml::dequantize_row routes it to ext", ty.name())
            }
        }
    }
}

fn dequant_q4_0(blk: &[u8], o: &mut [f32]) {
    let d = f16_to_f32(le16(blk, q4_0::D));
    let qs = &blk[q4_0::QS..q4_0::BYTES];
    for j in 0..QK / 2 {
        o[j] = ((qs[j] & 15) as i32 - 8) as f32 * d;
        o[j + QK / 2] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

fn dequant_q8_0(blk: &[u8], o: &mut [f32]) {
    let d = f16_to_f32(le16(blk, q8_0::D));
    for (o, &q) in o.iter_mut().zip(&blk[q8_0::QS..q8_0::BYTES]) {
        *o = q as i8 as f32 * d;
    }
}

fn dequant_q4_k(blk: &[u8], o: &mut [f32]) {
    let d = f16_to_f32(le16(blk, q4_k::D));
    let min = f16_to_f32(le16(blk, q4_k::DMIN));
    let (sc, m) = scales_k4(&blk[q4_k::SCALES..q4_k::QS]);
    for c in 0..4 {
        let q = &blk[q4_k::QS + 32 * c..q4_k::QS + 32 * c + 32];
        let (d1, m1) = (d * sc[2 * c] as f32, min * m[2 * c] as f32);
        let (d2, m2) = (d * sc[2 * c + 1] as f32, min * m[2 * c + 1] as f32);
        for l in 0..32 {
            o[64 * c + l] = d1 * (q[l] & 15) as f32 - m1;
            o[64 * c + 32 + l] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

fn dequant_q5_k(blk: &[u8], o: &mut [f32]) {
    let d = f16_to_f32(le16(blk, q5_k::D));
    let min = f16_to_f32(le16(blk, q5_k::DMIN));
    let (sc, m) = scales_k4(&blk[q5_k::SCALES..q5_k::QH]);
    let qh = &blk[q5_k::QH..q5_k::QS];
    for c in 0..4 {
        let q = &blk[q5_k::QS + 32 * c..q5_k::QS + 32 * c + 32];
        let (d1, m1) = (d * sc[2 * c] as f32, min * m[2 * c] as f32);
        let (d2, m2) = (d * sc[2 * c + 1] as f32, min * m[2 * c + 1] as f32);
        for l in 0..32 {
            let h1 = ((qh[l] >> (2 * c)) & 1) << 4;
            let h2 = ((qh[l] >> (2 * c + 1)) & 1) << 4;
            o[64 * c + l] = d1 * ((q[l] & 15) + h1) as f32 - m1;
            o[64 * c + 32 + l] = d2 * ((q[l] >> 4) + h2) as f32 - m2;
        }
    }
}

/// The 6-bit level (0..64) of value `v` of a Q6_K block.
#[inline]
pub(super) fn q6_level(blk: &[u8], v: usize) -> u8 {
    let (h, s, l) = (v / 128, (v % 128) / 32, v % 32);
    let ql = blk[q6_k::QL + 64 * h + 32 * (s % 2) + l];
    let nib = if s < 2 { ql & 15 } else { ql >> 4 };
    let hi = (blk[q6_k::QH + 32 * h + l] >> (2 * s)) & 3;
    nib | hi << 4
}

fn dequant_q6_k(blk: &[u8], o: &mut [f32]) {
    let d = f16_to_f32(le16(blk, q6_k::D));
    for (v, o) in o.iter_mut().enumerate() {
        let sc = blk[q6_k::SCALES + v / 16] as i8;
        let q = q6_level(blk, v) as i32 - 32;
        *o = d * sc as f32 * q as f32;
    }
}

fn dequant_q3_k(blk: &[u8], o: &mut [f32]) {
    let d = f16_to_f32(le16(blk, q3_k::D));
    let sc = scales_q3(&blk[q3_k::SCALES..q3_k::D]);
    for (v, o) in o.iter_mut().enumerate() {
        let q = q3_level(blk, v) as i32 - 4;
        *o = d * sc[v / 16] as f32 * q as f32;
    }
}

fn dequant_q2_k(blk: &[u8], o: &mut [f32]) {
    let d = f16_to_f32(le16(blk, q2_k::D));
    let min = f16_to_f32(le16(blk, q2_k::DMIN));
    for (v, o) in o.iter_mut().enumerate() {
        let s = blk[q2_k::SCALES + v / 16];
        let (dl, ml) = (d * (s & 15) as f32, min * (s >> 4) as f32);
        *o = dl * q2_level(blk, v) as f32 - ml;
    }
}

/// See [`super::first_non_finite`].
pub(super) fn first_non_finite(ty: BlockType, bytes: &[u8]) -> Option<usize> {
    let block = match ty {
        BlockType::Q4_0 => first_bad_block::<{ q4_0::BYTES }, { q4_0::D }, { q4_0::D }>(bytes),
        BlockType::Q8_0 => first_bad_block::<{ q8_0::BYTES }, { q8_0::D }, { q8_0::D }>(bytes),
        BlockType::Q4K => first_bad_block::<{ q4_k::BYTES }, { q4_k::D }, { q4_k::DMIN }>(bytes),
        BlockType::Q5K => first_bad_block::<{ q5_k::BYTES }, { q5_k::D }, { q5_k::DMIN }>(bytes),
        BlockType::Q6K => first_bad_block::<{ q6_k::BYTES }, { q6_k::D }, { q6_k::D }>(bytes),
        BlockType::Q3K => first_bad_block::<{ q3_k::BYTES }, { q3_k::D }, { q3_k::D }>(bytes),
        BlockType::Q2K => first_bad_block::<{ q2_k::BYTES }, { q2_k::D }, { q2_k::DMIN }>(bytes),
        BlockType::Q5_0 | BlockType::Q5_1 | BlockType::IQ4NL | BlockType::IQ4XS => {
            unreachable!("{}: ggml::first_non_finite routes it to ext", ty.name())
        }
    };
    block.map(|b| b * ty.block_elems())
}

/// The first of the `BB`-byte blocks of `bytes` whose f16 at byte `A` or
/// at byte `B` is NaN or ±Inf (every exponent bit set). One branch-free
/// pass (the common case: none; it runs as a streamed expert lands, so at
/// memory speed matters), then a search only on a hit.
pub(super) fn first_bad_block<const BB: usize, const A: usize, const B: usize>(
    bytes: &[u8],
) -> Option<usize> {
    let bad = |blk: &[u8]| {
        let exp = |at: usize| le16(blk, at) & 0x7c00 == 0x7c00;
        exp(A) | exp(B)
    };
    let any = bytes
        .chunks_exact(BB)
        .fold(false, |acc, blk| acc | bad(blk));
    if any {
        bytes.chunks_exact(BB).position(bad)
    } else {
        None
    }
}

/// See [`super::quantize_row`].
pub(super) fn quantize_row(ty: BlockType, x: &[f32], out: &mut [u8]) {
    let (be, bb) = (ty.block_elems(), ty.block_bytes());
    for (x, blk) in x.chunks_exact(be).zip(out.chunks_exact_mut(bb)) {
        match ty {
            BlockType::Q4_0 => encode_q4_0(x, blk),
            BlockType::Q8_0 => encode_q8_0(x, blk),
            BlockType::Q4K => encode_q4_k(x, blk),
            BlockType::Q5K => encode_q5_k(x, blk),
            BlockType::Q6K => encode_q6_k(x, blk),
            BlockType::Q3K => encode_q3_k(x, blk),
            BlockType::Q2K => encode_q2_k(x, blk),
            BlockType::Q5_0 | BlockType::Q5_1 | BlockType::IQ4NL | BlockType::IQ4XS => {
                unreachable!("{}: ggml::quantize_row routes it to ext", ty.name())
            }
        }
    }
}

/// The first value of largest magnitude (NaN never counts), 0 if none.
fn signed_absmax(x: &[f32]) -> f32 {
    let mut best = 0f32;
    for &v in x {
        if v.abs() > best.abs() {
            best = v;
        }
    }
    best
}

/// ggml's `quantize_row_q4_0_ref`.
fn encode_q4_0(x: &[f32], blk: &mut [u8]) {
    let d = signed_absmax(x) / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    blk[q4_0::D..q4_0::D + 2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    // (x·id + 8.5) truncated: round half up onto 0..=16, then capped at 15.
    let level = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
    for j in 0..QK / 2 {
        blk[q4_0::QS + j] = level(x[j]) | level(x[j + QK / 2]) << 4;
    }
}

/// ggml's `quantize_row_q8_0_ref` (`roundf`: half away from zero).
fn encode_q8_0(x: &[f32], blk: &mut [u8]) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let qs = std::array::from_fn(|i| (x[i] * id).round() as i8);
    pack_q8_0(f32_to_f16(d), &qs, blk);
}

/// Writes a Q8_0 block: f16 bits `d`, then the 32 levels.
pub(super) fn pack_q8_0(d: u16, qs: &[i8; QK], blk: &mut [u8]) {
    blk[q8_0::D..q8_0::D + 2].copy_from_slice(&d.to_le_bytes());
    for (o, &q) in blk[q8_0::QS..q8_0::BYTES].iter_mut().zip(qs) {
        *o = q as u8;
    }
}

/// A planned super-block with scales and mins: value `v` decodes to
/// `d·sc[j]·levels[v] − dmin·m[j]` for its sub-block `j = v / (256 / J)`.
/// Q4_K/Q5_K: `J = 8` sub-blocks of 32, levels ≤ 15 (Q4_K) or ≤ 31 (Q5_K),
/// scales and mins ≤ 63; Q2_K: `J = 16` sub-blocks of 16, levels ≤ 3,
/// scales and mins ≤ 15.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KMinBlock<const J: usize = 8> {
    /// f16 bits of the super-block scale and min scale.
    pub d: u16,
    pub dmin: u16,
    pub sc: [u8; J],
    pub m: [u8; J],
    pub levels: [u8; QK_K],
}

/// A planned symmetric super-block of sixteen 16-value sub-blocks: value
/// `v` decodes to `d·sc[v/16]·(levels[v] − bias)`. Q6_K: bias 32, levels
/// ≤ 63, scales any i8; Q3_K: bias 4, levels ≤ 7, scales −32..=31.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymBlock {
    /// f16 bits of the super-block scale.
    pub d: u16,
    pub sc: [i8; 16],
    pub levels: [u8; QK_K],
}

/// The plain scale search with mins (module doc) over `J` sub-blocks,
/// levels `0..=nmax`, scales and mins `0..=smax`.
fn plan_kmin<const J: usize>(x: &[f32], nmax: u8, smax: u8) -> KMinBlock<J> {
    let n = QK_K / J;
    let mut step = [0f32; J];
    let mut neg_lo = [0f32; J];
    for (j, sub) in x.chunks_exact(n).enumerate() {
        let lo = sub.iter().fold(0f32, |a, &v| a.min(v));
        let hi = sub.iter().fold(lo, |a, &v| a.max(v));
        step[j] = (hi - lo) / nmax as f32;
        neg_lo[j] = -lo;
    }
    let top = smax as f32;
    let d = f16_at_least(step.iter().fold(0f32, |a, &v| a.max(v)) / top);
    let dmin = f16_at_least(neg_lo.iter().fold(0f32, |a, &v| a.max(v)) / top);
    let (df, dminf) = (f16_to_f32(d), f16_to_f32(dmin));
    let fit = |v: f32| v.clamp(0.0, top) as u8;
    let sc = step.map(|s| if df > 0.0 { fit((s / df).ceil()) } else { 0 });
    let m = neg_lo.map(|v| {
        if dminf > 0.0 {
            fit((v / dminf).round())
        } else {
            0
        }
    });
    let mut levels = [0u8; QK_K];
    for (v, l) in levels.iter_mut().enumerate() {
        let (dl, ml) = (df * sc[v / n] as f32, dminf * m[v / n] as f32);
        if dl > 0.0 {
            *l = nearest_int(((x[v] + ml) / dl).clamp(0.0, nmax as f32)) as u8;
        }
    }
    KMinBlock {
        d,
        dmin,
        sc,
        m,
        levels,
    }
}

fn encode_q4_k(x: &[f32], blk: &mut [u8]) {
    pack_q4_k(&plan_kmin(x, 15, 63), blk)
}

/// Writes a planned Q4_K block.
pub(super) fn pack_q4_k(p: &KMinBlock, blk: &mut [u8]) {
    blk[q4_k::D..q4_k::D + 2].copy_from_slice(&p.d.to_le_bytes());
    blk[q4_k::DMIN..q4_k::DMIN + 2].copy_from_slice(&p.dmin.to_le_bytes());
    pack_scales_k4(&p.sc, &p.m, &mut blk[q4_k::SCALES..q4_k::QS]);
    for c in 0..4 {
        for l in 0..32 {
            let (a, b) = (p.levels[64 * c + l], p.levels[64 * c + 32 + l]);
            blk[q4_k::QS + 32 * c + l] = a | b << 4;
        }
    }
}

fn encode_q5_k(x: &[f32], blk: &mut [u8]) {
    pack_q5_k(&plan_kmin(x, 31, 63), blk)
}

/// Writes a planned Q5_K block.
pub(super) fn pack_q5_k(p: &KMinBlock, blk: &mut [u8]) {
    blk[q5_k::D..q5_k::D + 2].copy_from_slice(&p.d.to_le_bytes());
    blk[q5_k::DMIN..q5_k::DMIN + 2].copy_from_slice(&p.dmin.to_le_bytes());
    pack_scales_k4(&p.sc, &p.m, &mut blk[q5_k::SCALES..q5_k::QH]);
    blk[q5_k::QH..q5_k::QS].fill(0);
    for c in 0..4 {
        for l in 0..32 {
            let (a, b) = (p.levels[64 * c + l], p.levels[64 * c + 32 + l]);
            blk[q5_k::QS + 32 * c + l] = (a & 15) | (b & 15) << 4;
            blk[q5_k::QH + l] |= (a >> 4) << (2 * c) | (b >> 4) << (2 * c + 1);
        }
    }
}

fn encode_q6_k(x: &[f32], blk: &mut [u8]) {
    let s: [f32; 16] = std::array::from_fn(|j| signed_absmax(&x[16 * j..16 * j + 16]) / -32.0);
    let d = f16_at_least(s.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0);
    let df = f16_to_f32(d);
    let sc = s.map(|s| {
        if df > 0.0 {
            nearest_int((s / df).clamp(-127.0, 127.0)) as i8
        } else {
            0
        }
    });
    let levels = std::array::from_fn(|v| {
        let dl = df * sc[v / 16] as f32;
        if dl != 0.0 {
            (nearest_int((x[v] / dl).clamp(-32.0, 31.0)) + 32) as u8
        } else {
            32
        }
    });
    pack_q6_k(&SymBlock { d, sc, levels }, blk);
}

/// Writes a planned Q6_K block.
pub(super) fn pack_q6_k(p: &SymBlock, blk: &mut [u8]) {
    blk.fill(0);
    blk[q6_k::D..q6_k::D + 2].copy_from_slice(&p.d.to_le_bytes());
    for (j, &sc) in p.sc.iter().enumerate() {
        blk[q6_k::SCALES + j] = sc as u8;
    }
    for (v, &q) in p.levels.iter().enumerate() {
        let (h, s, l) = (v / 128, (v % 128) / 32, v % 32);
        blk[q6_k::QL + 64 * h + 32 * (s % 2) + l] |= (q & 15) << (4 * (s / 2));
        blk[q6_k::QH + 32 * h + l] |= (q >> 4) << (2 * s);
    }
}

fn encode_q3_k(x: &[f32], blk: &mut [u8]) {
    let s: [f32; 16] = std::array::from_fn(|j| signed_absmax(&x[16 * j..16 * j + 16]) / -4.0);
    let d = f16_at_least(s.iter().fold(0f32, |a, v| a.max(v.abs())) / 31.0);
    let df = f16_to_f32(d);
    let sc = s.map(|s| {
        if df > 0.0 {
            nearest_int((s / df).clamp(-31.0, 31.0)) as i8
        } else {
            0
        }
    });
    let levels = std::array::from_fn(|v| {
        let dl = df * sc[v / 16] as f32;
        if dl != 0.0 {
            (nearest_int((x[v] / dl).clamp(-4.0, 3.0)) + 4) as u8
        } else {
            4
        }
    });
    pack_q3_k(&SymBlock { d, sc, levels }, blk);
}

/// Writes a planned Q3_K block.
pub(super) fn pack_q3_k(p: &SymBlock, blk: &mut [u8]) {
    blk.fill(0);
    blk[q3_k::D..q3_k::D + 2].copy_from_slice(&p.d.to_le_bytes());
    pack_scales_q3(&p.sc, &mut blk[q3_k::SCALES..q3_k::D]);
    for (v, &q) in p.levels.iter().enumerate() {
        let (h, s, l) = (v / 128, (v % 128) / 32, v % 32);
        blk[q3_k::QS + 32 * h + l] |= (q & 3) << (2 * s);
        blk[q3_k::HMASK + l] |= (q >> 2) << (4 * h + s);
    }
}

fn encode_q2_k(x: &[f32], blk: &mut [u8]) {
    pack_q2_k(&plan_kmin::<16>(x, 3, 15), blk)
}

/// Writes a planned Q2_K block.
pub(super) fn pack_q2_k(p: &KMinBlock<16>, blk: &mut [u8]) {
    blk.fill(0);
    blk[q2_k::D..q2_k::D + 2].copy_from_slice(&p.d.to_le_bytes());
    blk[q2_k::DMIN..q2_k::DMIN + 2].copy_from_slice(&p.dmin.to_le_bytes());
    for j in 0..16 {
        blk[q2_k::SCALES + j] = p.sc[j] | p.m[j] << 4;
    }
    for (v, &q) in p.levels.iter().enumerate() {
        let (h, s, l) = (v / 128, (v % 128) / 32, v % 32);
        blk[q2_k::QS + 32 * h + l] |= q << (2 * s);
    }
}
