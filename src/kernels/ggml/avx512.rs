//! AVX-512 VNNI block dots and activation quantizers, bit-identical to the
//! scalar twins (see `scalar`). Q8_0 and Q4_0 multiply bytes with
//! `vpdpbusd` straight into the twin's sixteen lanes (two Q8_0 or four Q4_0
//! blocks a register, four blocks' f16 scales converted at once); the K
//! types take `maddubs` pairs of unsigned levels × activations (at most
//! 2·63·127, no saturation) into `vpdpwssd` against each sub-block's scale
//! as i16, so the scales cost no extra multiply; each super-block's sixteen
//! i32 lanes are summed exactly and added in f32 (`avx2::k_step`).
//!
//! Loads slice first ([`load64`], [`load_masked`], `avx2::load32`): a
//! short slice panics rather than being read past.

use super::avx2::{self, load16, load32, prefetch};
use super::codec::{
    le16, q2_k, q3_k, q4_0, q4_k, q5_k, q6_k, q8_0, scales_k4, scales_q3, QK, QK_K,
};
use super::scalar::ActRow;
use super::BlockType;
use std::arch::x86_64::*;

/// `out[k]` = the dot of row `k` of `w` (`out.len()` rows) with `a`.
///
/// # Safety
/// The CPU must support AVX2, F16C, AVX-512F, AVX-512BW and AVX-512 VNNI.
/// (Lengths are checked by slicing.)
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
pub unsafe fn dot_rows(ty: BlockType, w: &[u8], a: &ActRow, out: &mut [f32]) {
    let (out, _) = out.as_chunks_mut::<1>();
    // SAFETY: this function's own contract (the same CPU features).
    unsafe { dot_rows_n(ty, w, &[*a], out) }
}

/// `out[k][t]` = the dot of row `k` of `w` (`out.len()` rows) with `a[t]`:
/// each weight block is loaded and unpacked once for all `N` activation
/// rows (prefill chunks, verify blocks, batched requests), and each row's
/// lanes see exactly the operations of the one-row dot, so the results are
/// the same bits.
///
/// # Safety
/// The CPU must support AVX2, F16C, AVX-512F, AVX-512BW and AVX-512 VNNI.
/// (Lengths are checked by slicing.)
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
pub unsafe fn dot_rows_n<const N: usize>(
    ty: BlockType,
    w: &[u8],
    a: &[ActRow; N],
    out: &mut [[f32; N]],
) {
    let rb = w.len() / out.len().max(1);
    let rows = out.iter_mut().zip(w.chunks_exact(rb.max(1)));
    // Each arm is one loop, so the row kernel inlines and its constants are
    // loaded once per call, not once per row.
    match ty {
        BlockType::Q4_0 if N == 1 => dot_q4_0(w, &a[0], out.as_flattened_mut()),
        BlockType::Q4_0 => {
            // One activation row a pass (see `dot_q4_0`), row by row.
            for (o, r) in rows {
                for (o, a) in o.iter_mut().zip(a) {
                    dot_q4_0(r, a, std::slice::from_mut(o));
                }
            }
        }
        BlockType::Q8_0 => {
            let (s01, s23) = (load64(&SPREAD_01), load64(&SPREAD_23));
            for (o, r) in rows {
                *o = dot_q8_0(r, a, s01, s23);
            }
        }
        BlockType::Q4K => {
            let idx = kmin_idx();
            for (o, r) in rows {
                *o = dot_q4_k(r, a, &idx);
            }
        }
        BlockType::Q5K => {
            let idx = kmin_idx();
            for (o, r) in rows {
                *o = dot_q5_k(r, a, &idx);
            }
        }
        BlockType::Q6K => {
            let idx = sym_idx();
            for (o, r) in rows {
                *o = dot_q6_k(r, a, &idx);
            }
        }
        BlockType::Q3K => {
            let idx = sym_idx();
            for (o, r) in rows {
                *o = dot_q3_k(r, a, &idx);
            }
        }
        BlockType::Q2K => {
            let idx = sym_idx();
            for (o, r) in rows {
                *o = dot_q2_k(r, a, &idx);
            }
        }
        BlockType::Q5_0 | BlockType::Q5_1 | BlockType::IQ4NL | BlockType::IQ4XS => {
            unreachable!("{}: ggml::dot_rows_n routes it to ext", ty.name())
        }
    }
}

/// 64 bytes from the front of `s`.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn load64<T: Copy>(s: &[T]) -> __m512i {
    let s = &s[..64 / size_of::<T>()];
    // SAFETY: `s` spans exactly 64 readable bytes (the slice above).
    unsafe { _mm512_loadu_si512(s.as_ptr().cast()) }
}

/// The bytes of `s` (at most 64) in the low bytes, zeros above.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) fn load_masked<T: Copy>(s: &[T]) -> __m512i {
    let n = size_of_val(s).min(64);
    let m: __mmask64 = if n == 64 { !0 } else { (1u64 << n) - 1 };
    // SAFETY: the mask enables bytes 0..n of `s` only (n ≤ its byte length);
    // masked-off bytes are not read and load as zero.
    unsafe { _mm512_maskz_loadu_epi8(m, s.as_ptr().cast()) }
}

/// Two 32-byte halves as one register (`lo` in bytes 0..32).
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// `acc + (p as f32)·f`, lane by lane.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn add_lanes16(acc: __m512, p: __m512i, f: __m512) -> __m512 {
    _mm512_add_ps(acc, _mm512_mul_ps(_mm512_cvtepi32_ps(p), f))
}

/// `scalar::reduce16`.
#[inline]
#[target_feature(enable = "avx2,avx512f")]
pub(super) fn reduce16(acc: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(acc);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
    avx2::reduce16(lo, hi)
}

/// Up to four f16 values (`h`, low bits first) as f32 lanes 0..4.
#[inline]
#[target_feature(enable = "f16c")]
pub(super) fn f16x4(h: u64) -> __m128 {
    _mm_cvtph_ps(_mm_cvtsi64_si128(h as i64))
}

/// `d_w·d_x` of four blocks: `h` their f16 scales, `dx` their activation
/// scales.
#[inline]
#[target_feature(enable = "f16c,avx512f")]
fn scales4(h: [u16; 4], dx: [f32; 4]) -> __m128 {
    let h = h.iter().rev().fold(0u64, |acc, &h| acc << 16 | h as u64);
    _mm_mul_ps(f16x4(h), _mm_setr_ps(dx[0], dx[1], dx[2], dx[3]))
}

/// The four lanes of `f` spread over sixteen by the `vpermps` indices `idx`
/// (one of the `SPREAD*` constants).
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn spread(idx: __m512i, f: __m128) -> __m512 {
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(f))
}

/// Each of four values over four lanes (Q4_0: four lanes a block).
pub(super) const SPREAD4: [i32; 16] = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3];
/// Values 0 and 1 (or 2 and 3) over eight lanes each (Q8_0: two blocks a
/// register).
const SPREAD_01: [i32; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];
const SPREAD_23: [i32; 16] = [2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3];

/// Two Q8_0 blocks' level bytes (`w0`, `w1`: 32 each) as one register's
/// magnitudes and sign mask, shared by every activation row.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw")]
fn q8_levels(w0: &[u8], w1: &[u8]) -> (__m512i, __mmask64) {
    let vw = join(load32(w0), load32(w1));
    (_mm512_abs_epi8(vw), _mm512_movepi8_mask(vw))
}

/// `Σ w·x` over two Q8_0 blocks' values in the twin's lanes (`lev`: their
/// [`q8_levels`]; `x`: 64 activations).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
fn q8_pair(lev: (__m512i, __mmask64), x: __m512i) -> __m512i {
    let zero = _mm512_setzero_si512();
    // |w| · (x negated where w < 0) = w·x; x is never −128.
    let xs = _mm512_mask_sub_epi8(x, lev.1, zero, x);
    _mm512_dpbusd_epi32(zero, lev.0, xs)
}

/// Four blocks a step (two registers, block `b + i` in lanes `8·(i % 2)..`),
/// then any last two or one.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
fn dot_q8_0<const N: usize>(w: &[u8], a: &[ActRow; N], s01: __m512i, s23: __m512i) -> [f32; N] {
    const B: usize = q8_0::BYTES;
    let nb = w.len() / B;
    let mut acc = [_mm512_setzero_ps(); N];
    let full = nb / 4 * 4;
    for (g, grp) in w[..full * B].chunks_exact(4 * B).enumerate() {
        prefetch(grp, 4 * B);
        let h = (0..4)
            .rev()
            .fold(0u64, |h, i| h << 16 | le16(grp, B * i) as u64);
        let dw = f16x4(h);
        let l01 = q8_levels(&grp[q8_0::QS..], &grp[B + q8_0::QS..]);
        let l23 = q8_levels(&grp[2 * B + q8_0::QS..], &grp[3 * B + q8_0::QS..]);
        for (acc, a) in acc.iter_mut().zip(a) {
            let x = &a.qs[4 * QK * g..];
            let f = _mm_mul_ps(dw, load_ps4(&a.d[4 * g..]));
            *acc = add_lanes16(*acc, q8_pair(l01, load64(x)), spread(s01, f));
            *acc = add_lanes16(*acc, q8_pair(l23, load64(&x[64..])), spread(s23, f));
        }
    }
    for b in (full..nb).step_by(2) {
        for (acc, a) in acc.iter_mut().zip(a) {
            *acc = q8_0_tail(*acc, &w[B * b..], &a.qs[QK * b..], &a.d[b..], s01);
        }
    }
    acc.map(|acc| reduce16(acc))
}

/// The last one or two Q8_0 blocks (`w`, `x`, `dx` start at the first).
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
fn q8_0_tail(acc: __m512, w: &[u8], x: &[i8], dx: &[f32], s01: __m512i) -> __m512 {
    let pair = dx.len() >= 2;
    // A lone block stands in for its missing partner (whose lanes are dropped).
    let second = if pair { &w[q8_0::BYTES..] } else { w };
    let h = [le16(w, 0), le16(second, 0), 0, 0];
    let f = scales4(h, [dx[0], if pair { dx[1] } else { 0.0 }, 0.0, 0.0]);
    let p = q8_pair(
        q8_levels(&w[q8_0::QS..], &second[q8_0::QS..]),
        load_masked(&x[..x.len().min(2 * QK)]),
    );
    let lanes: __mmask16 = if pair { !0 } else { 0x00ff };
    _mm512_mask_mov_ps(acc, lanes, add_lanes16(acc, p, spread(s01, f)))
}

/// Four Q4_0 blocks' level bytes (`vq`: 16 each, one block a 128-bit
/// lane) as their unsigned low and high nibbles.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) fn q4_0_nibbles(vq: __m512i) -> (__m512i, __m512i) {
    let mask = _mm512_set1_epi8(15);
    let lo = _mm512_and_si512(vq, mask);
    (lo, _mm512_and_si512(_mm512_srli_epi16::<4>(vq), mask))
}

/// The nibbles (`lev`: [`q4_0_nibbles`]) against the split activation
/// halves, plus `c`: the exact lanes.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
fn q4_0_lanes(lev: (__m512i, __m512i), xl: __m512i, xh: __m512i, c: __m512i) -> __m512i {
    _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(c, lev.0, xl), lev.1, xh)
}

/// The levels of four Q4_0 blocks (`blk[i]` starts block `i`), one block a
/// 128-bit lane, and their f16 scales as f32 lanes 0..4. (Four 16-byte
/// loads: one 64-byte load and a word permute needs fewer instructions but
/// splits cache lines, and ran 10–20% slower from memory.)
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f")]
fn q4_0_group(blk: [&[u8]; 4]) -> (__m512i, __m128) {
    let q = |i: usize| load16(&blk[i][q4_0::QS..]);
    let vq = join(_mm256_set_m128i(q(1), q(0)), _mm256_set_m128i(q(3), q(2)));
    let h = blk
        .iter()
        .rev()
        .fold(0u64, |h, b| h << 16 | le16(b, q4_0::D) as u64);
    (vq, f16x4(h))
}

/// Four blocks a step, block `b + i` in lanes `4i..4i+4`; the unsigned
/// nibbles meet the split activation halves, and `c8` adds `−8·Σx`. A last
/// group of one to three blocks leaves the other lanes as they were.
///
/// One activation row a pass, the row loop inside: sharing the unpacked
/// nibbles among several activation rows (as the other types do) ran
/// 10–50% slower here (results/kernels.md), since a Q4_0 group's unpacking is two instructions and the
/// per-row work around it is the cost.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
fn dot_q4_0(w: &[u8], a: &ActRow, out: &mut [f32]) {
    const B: usize = q4_0::BYTES;
    let rb = w.len() / out.len().max(1);
    let nb = rb / B;
    let (xlo, xhi) = a.qs.split_at(16 * nb);
    let s4 = load64(&SPREAD4);
    let full = nb / 4 * 4;
    for (o, row) in out.iter_mut().zip(w.chunks_exact(rb.max(1))) {
        let mut acc = _mm512_setzero_ps();
        let groups = row[..full * B]
            .chunks_exact(4 * B)
            .zip(xlo.chunks_exact(64))
            .zip(xhi.chunks_exact(64));
        for (((grp, xl), xh), (c, dx)) in groups.zip(a.c8.chunks_exact(16).zip(a.d.chunks_exact(4)))
        {
            prefetch(grp, 4 * B);
            let (vq, dw) = q4_0_group([&grp[..B], &grp[B..], &grp[2 * B..], &grp[3 * B..]]);
            let p = q4_0_lanes(q4_0_nibbles(vq), load64(xl), load64(xh), load64(c));
            acc = add_lanes16(acc, p, spread(s4, _mm_mul_ps(dw, load_ps4(dx))));
        }
        if full < nb {
            acc = q4_0_tail(acc, &row[full * B..], a, full, s4);
        }
        *o = reduce16(acc);
    }
}

/// The last one to three Q4_0 blocks of a row (`w`), from block `b`; the
/// other lanes stay as they were.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
fn q4_0_tail(acc: __m512, w: &[u8], a: &ActRow, b: usize, s4: __m512i) -> __m512 {
    const B: usize = q4_0::BYTES;
    let k = w.len() / B;
    let nb = b + k;
    let (xlo, xhi) = a.qs.split_at(16 * nb);
    // Past the row's end, the last block stands in (its lanes are dropped).
    let (vq, dw) = q4_0_group(std::array::from_fn(|i| &w[B * i.min(k - 1)..]));
    let r = 16 * b..16 * nb;
    let (xl, xh) = (load_masked(&xlo[r.clone()]), load_masked(&xhi[r]));
    let p = q4_0_lanes(q4_0_nibbles(vq), xl, xh, load_masked(&a.c8[4 * b..]));
    let dx: [f32; 4] = std::array::from_fn(|i| if i < k { a.d[b + i] } else { 0.0 });
    let f = _mm_mul_ps(dw, _mm_setr_ps(dx[0], dx[1], dx[2], dx[3]));
    let lanes: __mmask16 = (1u16 << (4 * k)) - 1;
    _mm512_mask_mov_ps(acc, lanes, add_lanes16(acc, p, spread(s4, f)))
}

/// `vpshufb` controls turning eight scale bytes (in every 128-bit lane)
/// into i16 lanes `16h..16h+16` holding scale `j[h]` (high bytes zeroed).
const fn spread2(j: [i8; 2]) -> [i8; 64] {
    let mut out = [0i8; 64];
    let mut b = 0;
    while b < 64 {
        out[b] = if b % 2 == 0 { j[b / 32] } else { -128 };
        b += 1;
    }
    out
}

/// `vpermw` indices spreading scales `j0..j0+4` over i16 lanes in eights.
const fn spread_q6(j0: i16) -> [i16; 32] {
    let mut out = [0i16; 32];
    let mut l = 0;
    while l < 32 {
        out[l] = j0 + (l / 8) as i16;
        l += 1;
    }
    out
}

/// Q4_K/Q5_K: register `k` holds level chunks `2k` and `2k+1`; its low
/// nibbles are sub-blocks `4k` and `4k+2`, its high ones `4k+1`, `4k+3`
/// (`vpshufb` controls).
static KMIN_IDX: [[i8; 64]; 4] = [
    spread2([0, 2]),
    spread2([1, 3]),
    spread2([4, 6]),
    spread2([5, 7]),
];
/// Q6_K, Q3_K and Q2_K: register `2h` holds values `128h..128h+64`
/// (sub-blocks `8h..8h+4`), register `2h+1` the next 64.
static Q6_IDX: [[i16; 32]; 4] = [spread_q6(0), spread_q6(4), spread_q6(8), spread_q6(12)];

#[inline]
#[target_feature(enable = "avx512f")]
fn sym_idx() -> [__m512i; 4] {
    std::array::from_fn(|i| load64(&Q6_IDX[i]))
}

/// Sixteen signed scale bytes as i16 lanes 0..16.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn scales_i16(s: __m128i) -> __m512i {
    _mm512_cvtepi8_epi16(_mm256_castsi128_si256(s))
}

/// One Q4_K/Q5_K super-block unpacked for every activation row: `lev[2k]`
/// and `lev[2k+1]`, register `k`'s low and high levels, meet activations
/// `128k..` and `128k+64..` (the permuted layout puts their sub-blocks
/// there) against the i16 sub-block scales `sc[..]` beside them; `mins`:
/// the eight mins as i16 pairs; `d`: `d_w` and `dmin_w` in lanes 0 and 1.
struct KminBlock {
    lev: [__m512i; 4],
    sc: [__m512i; 4],
    mins: __m256i,
    d: __m128,
}

/// A Q4_K/Q5_K super-block `blk` (scales at `scales`) with its levels
/// `lev` (see [`KminBlock`]).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw")]
fn kmin_block(blk: &[u8], scales: &[u8], idx: &[__m512i; 4], lev: [__m512i; 4]) -> KminBlock {
    let (sc, m) = scales_k4(scales);
    // The eight scale bytes in every 128-bit lane; `vpshufb` then spreads
    // two of them as zero-extended i16 over each register's halves.
    let scv = _mm512_set1_epi64(i64::from_le_bytes(sc));
    KminBlock {
        lev,
        sc: idx.map(|i| _mm512_shuffle_epi8(scv, i)),
        mins: avx2::mins_pairs(&m),
        d: f16x4(le16(blk, 0) as u64 | (le16(blk, 2) as u64) << 16),
    }
}

/// Adds one unpacked Q4_K/Q5_K super-block `kb` met by activations `x`
/// (its 256 values), `bsums` (its 16) and `dx` to `acc` (`avx2::k_step`).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
fn kmin_add(acc: &mut __m128, kb: &KminBlock, x: &[i8], bsums: &[i16], dx: f32) {
    let mut p = _mm512_setzero_si512();
    for (j, (lev, sc)) in kb.lev.iter().zip(&kb.sc).enumerate() {
        let xj = load64(&x[64 * j..]);
        p = _mm512_dpwssd_epi32(p, _mm512_maddubs_epi16(*lev, xj), *sc);
    }
    let mins = avx2::mins_dot(kb.mins, bsums);
    let f = _mm_mul_ps(kb.d, _mm_set1_ps(dx));
    *acc = avx2::k_step(*acc, fold256(p), mins, f);
}

/// The sixteen i32 lanes of `p` as eight (exact sums of lanes `i`, `i + 8`).
#[inline]
#[target_feature(enable = "avx2,avx512f")]
pub(super) fn fold256(p: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(p), _mm512_extracti64x4_epi64::<1>(p))
}

#[inline]
#[target_feature(enable = "avx512f")]
fn kmin_idx() -> [__m512i; 4] {
    std::array::from_fn(|i| load64(&KMIN_IDX[i]))
}

/// Every super-block of a Q4_K/Q5_K row (`BYTES` each), unpacked by
/// `block`, met by each activation row.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
fn dot_kmin<const N: usize, const BYTES: usize>(
    w: &[u8],
    a: &[ActRow; N],
    block: impl Fn(&[u8]) -> KminBlock,
) -> [f32; N] {
    let mut acc = [_mm_setzero_ps(); N];
    for (b, blk) in w.chunks_exact(BYTES).enumerate() {
        prefetch(blk, BYTES);
        let kb = block(blk);
        for (acc, a) in acc.iter_mut().zip(a) {
            let (x, bsums) = (&a.qs[QK_K * b..QK_K * (b + 1)], &a.bsums[16 * b..]);
            kmin_add(acc, &kb, x, bsums, a.d[b]);
        }
    }
    acc.map(|acc| avx2::k_result(acc))
}

#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
fn dot_q4_k<const N: usize>(w: &[u8], a: &[ActRow; N], idx: &[__m512i; 4]) -> [f32; N] {
    dot_kmin::<N, { q4_k::BYTES }>(w, a, |blk| {
        kmin_block(blk, &blk[q4_k::SCALES..q4_k::QS], idx, q4_k_levels(blk))
    })
}

/// The 256 unsigned levels of a K super-block in its activation row's
/// order: register `i` meets activations `64i..64i + 64` (for Q4_K/Q5_K
/// the permuted layout, register `2k` the low nibbles of level bytes
/// `64k..`, `2k + 1` their high ones).
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
pub(super) fn k_levels(ty: BlockType, blk: &[u8]) -> [__m512i; 4] {
    match ty {
        BlockType::Q4K => q4_k_levels(blk),
        BlockType::Q5K => q5_k_levels(blk),
        BlockType::Q6K => q6_k_levels(blk),
        BlockType::Q3K => q3_k_levels(blk),
        BlockType::Q2K => q2_k_levels(blk),
        _ => unreachable!("{}: not a K type", ty.name()),
    }
}

/// [`k_levels`] of a Q4_K super-block.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
fn q4_k_levels(blk: &[u8]) -> [__m512i; 4] {
    nibble_levels(&blk[q4_k::QS..])
}

/// The low and high nibbles of 128 level bytes `qs`, 64 bytes a pair of
/// registers.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
fn nibble_levels(qs: &[u8]) -> [__m512i; 4] {
    let mask = _mm512_set1_epi8(15);
    let q = [load64(qs), load64(&qs[64..])];
    std::array::from_fn(|i| {
        let v = if i % 2 == 0 {
            q[i / 2]
        } else {
            _mm512_srli_epi16::<4>(q[i / 2])
        };
        _mm512_and_si512(v, mask)
    })
}

/// Per-byte bit selectors: bytes 0..32 test bit `b[0]`, bytes 32..64 `b[1]`.
#[inline]
#[target_feature(enable = "avx512f")]
fn bits2(b: [u32; 2]) -> __m512i {
    join(
        _mm256_set1_epi8((1u8 << b[0]) as i8),
        _mm256_set1_epi8((1u8 << b[1]) as i8),
    )
}

#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
fn dot_q5_k<const N: usize>(w: &[u8], a: &[ActRow; N], idx: &[__m512i; 4]) -> [f32; N] {
    dot_kmin::<N, { q5_k::BYTES }>(w, a, |blk| {
        kmin_block(blk, &blk[q5_k::SCALES..q5_k::QH], idx, q5_k_levels(blk))
    })
}

/// [`k_levels`] of a Q5_K super-block: Q4_K's nibbles plus 16 where the
/// level's `qh` bit is set (register `2k`'s, chunks `2k`, `2k + 1`, take
/// bits `4k`, `4k + 2`; register `2k + 1`'s bits `4k + 1`, `4k + 3`).
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
fn q5_k_levels(blk: &[u8]) -> [__m512i; 4] {
    let sixteen = _mm512_set1_epi8(16);
    let sel = [bits2([0, 2]), bits2([1, 3]), bits2([4, 6]), bits2([5, 7])];
    let qh = _mm512_broadcast_i64x4(load32(&blk[q5_k::QH..]));
    let nib = nibble_levels(&blk[q5_k::QS..]);
    std::array::from_fn(|i| {
        let m = _mm512_test_epi8_mask(qh, sel[i]);
        _mm512_mask_add_epi8(nib[i], m, nib[i], sixteen)
    })
}

/// Q6_K as the AVX2 version: exact signed pairs `(level − 32)·x` from two
/// `maddubs`, then `vpdpwssd` with the signed scales. Each super-block's
/// levels and scales are unpacked once for every activation row.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
fn dot_q6_k<const N: usize>(w: &[u8], a: &[ActRow; N], idx: &[__m512i; 4]) -> [f32; N] {
    let m32 = _mm512_set1_epi8(32);
    let mut acc = [_mm_setzero_ps(); N];
    for (b, blk) in w.chunks_exact(q6_k::BYTES).enumerate() {
        prefetch(blk, q6_k::BYTES);
        let scv = scales_i16(load16(&blk[q6_k::SCALES..]));
        // Register j: values 64j..64j+64, with scales spread by idx[j].
        let lev = q6_k_levels(blk);
        let sc = idx.map(|i| _mm512_permutexvar_epi16(i, scv));
        let dw = f16x4(le16(blk, q6_k::D) as u64);
        sym_add(&mut acc, a, b, &lev, &sc, m32, dw);
    }
    acc.map(|acc| avx2::k_result(acc))
}

/// [`k_levels`] of a Q6_K super-block: register `j` holds values
/// `64j..64j + 64`, the low nibble (or high) of `ql` and two bits of `qh`.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
fn q6_k_levels(blk: &[u8]) -> [__m512i; 4] {
    let (mask, three) = (_mm512_set1_epi8(15), _mm512_set1_epi8(3));
    let [sh_lo, sh_hi] = low2_shifts();
    let mut lev = [_mm512_setzero_si512(); 4];
    for h in 0..2 {
        let ql = load64(&blk[q6_k::QL + 64 * h..]);
        let qh = _mm512_broadcast_i64x4(load32(&blk[q6_k::QH + 32 * h..]));
        let top = |sh| _mm512_slli_epi16::<4>(_mm512_and_si512(_mm512_srlv_epi16(qh, sh), three));
        lev[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, mask), top(sh_lo));
        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(ql), mask);
        lev[2 * h + 1] = _mm512_or_si512(hi, top(sh_hi));
    }
    lev
}

/// Adds super-block `b` (unsigned levels `lev`, register `j` holding values
/// `64j..64j+64`; i16 scales `sc`; f16 scale `dw` in lane 0) met by each
/// activation row: the exact signed pairs `(level − bias)·x` from two
/// `maddubs` (`bias` in every byte), `vpdpwssd` with the scales, the
/// super-block's sum times `d_w·d_x` (`avx2::k_step`).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
fn sym_add<const N: usize>(
    acc: &mut [__m128; N],
    a: &[ActRow; N],
    b: usize,
    lev: &[__m512i; 4],
    sc: &[__m512i; 4],
    bias: __m512i,
    dw: __m128,
) {
    for (acc, a) in acc.iter_mut().zip(a) {
        let x = &a.qs[QK_K * b..QK_K * (b + 1)];
        let mut p = _mm512_setzero_si512();
        for (j, (lev, sc)) in lev.iter().zip(sc).enumerate() {
            let xj = load64(&x[64 * j..]);
            let pj = _mm512_sub_epi16(
                _mm512_maddubs_epi16(*lev, xj),
                _mm512_maddubs_epi16(bias, xj),
            );
            p = _mm512_dpwssd_epi32(p, pj, *sc);
        }
        let f = _mm_mul_ps(dw, _mm_set1_ps(a.d[b]));
        *acc = avx2::k_step(*acc, fold256(p), _mm256_setzero_si256(), f);
    }
}

/// The 2-bit fields of register `j` of a Q3_K/Q2_K super-block (values
/// `64j..64j+64`, the qs bytes `32·(j / 2)..` once per half, shifted by
/// `sh[j % 2]`).
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
fn low2(qs: &[u8], j: usize, sh: &[__m512i; 2]) -> __m512i {
    let q = _mm512_broadcast_i64x4(load32(&qs[32 * (j / 2)..]));
    _mm512_and_si512(_mm512_srlv_epi16(q, sh[j % 2]), _mm512_set1_epi8(3))
}

/// i16-lane shifts bringing bit pairs `2s..2s+2` down: values 0..32 of a
/// register take s = 0 (or 2), values 32..64 take s = 1 (or 3).
#[inline]
#[target_feature(enable = "avx2,avx512f")]
fn low2_shifts() -> [__m512i; 2] {
    let shift = |s: [i16; 2]| join(_mm256_set1_epi16(s[0]), _mm256_set1_epi16(s[1]));
    [shift([0, 2]), shift([4, 6])]
}

/// Q3_K as Q6_K: the unsigned 3-bit level (`low2` plus 4 where bit `4h +
/// s` of `hmask` is set, a masked add) gives exact signed pairs `(level −
/// 4)·x` from two `maddubs`, then `vpdpwssd` with the signed scales.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
fn dot_q3_k<const N: usize>(w: &[u8], a: &[ActRow; N], idx: &[__m512i; 4]) -> [f32; N] {
    let four = _mm512_set1_epi8(4);
    let mut acc = [_mm_setzero_ps(); N];
    for (b, blk) in w.chunks_exact(q3_k::BYTES).enumerate() {
        prefetch(blk, q3_k::BYTES);
        let lev = q3_k_levels(blk);
        let scv = scales_i16(load16(&scales_q3(&blk[q3_k::SCALES..q3_k::D])));
        let sc = idx.map(|i| _mm512_permutexvar_epi16(i, scv));
        let dw = f16x4(le16(blk, q3_k::D) as u64);
        sym_add(&mut acc, a, b, &lev, &sc, four, dw);
    }
    acc.map(|acc| avx2::k_result(acc))
}

/// [`k_levels`] of a Q3_K super-block: `low2` plus 4 where bit `4h + s`
/// of `hmask` is set (register `j`'s values 0..32 take bit `2j`, values
/// 32..64 bit `2j + 1`).
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
fn q3_k_levels(blk: &[u8]) -> [__m512i; 4] {
    let (four, sh) = (_mm512_set1_epi8(4), low2_shifts());
    let sel = [bits2([0, 1]), bits2([2, 3]), bits2([4, 5]), bits2([6, 7])];
    let hm = _mm512_broadcast_i64x4(load32(&blk[q3_k::HMASK..]));
    std::array::from_fn(|j| {
        let low = low2(&blk[q3_k::QS..], j, &sh);
        _mm512_mask_add_epi8(low, _mm512_test_epi8_mask(hm, sel[j]), low, four)
    })
}

/// [`k_levels`] of a Q2_K super-block.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
fn q2_k_levels(blk: &[u8]) -> [__m512i; 4] {
    let sh = low2_shifts();
    std::array::from_fn(|j| low2(&blk[q2_k::QS..], j, &sh))
}

/// Q2_K: `maddubs` of the 2-bit levels into `vpdpwssd` with the 4-bit
/// scales; the sixteen 4-bit mins `madd` with the sixteen `bsums` into the
/// eight min lanes (as `avx2`).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
fn dot_q2_k<const N: usize>(w: &[u8], a: &[ActRow; N], idx: &[__m512i; 4]) -> [f32; N] {
    let fifteen = _mm_set1_epi8(15);
    let mut acc = [_mm_setzero_ps(); N];
    for (b, blk) in w.chunks_exact(q2_k::BYTES).enumerate() {
        prefetch(blk, q2_k::BYTES);
        let lev = q2_k_levels(blk);
        let sv = load16(&blk[q2_k::SCALES..]);
        let scv = scales_i16(_mm_and_si128(sv, fifteen));
        let sc = idx.map(|i| _mm512_permutexvar_epi16(i, scv));
        let m = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(sv), fifteen));
        let d = f16x4(le16(blk, q2_k::D) as u64 | (le16(blk, q2_k::DMIN) as u64) << 16);
        for (acc, a) in acc.iter_mut().zip(a) {
            let x = &a.qs[QK_K * b..QK_K * (b + 1)];
            let mut p = _mm512_setzero_si512();
            for (j, (lev, sc)) in lev.iter().zip(&sc).enumerate() {
                let pj = _mm512_maddubs_epi16(*lev, load64(&x[64 * j..]));
                p = _mm512_dpwssd_epi32(p, pj, *sc);
            }
            let mins = _mm256_madd_epi16(m, load32(&a.bsums[16 * b..]));
            let f = _mm_mul_ps(d, _mm_set1_ps(a.d[b]));
            *acc = avx2::k_step(*acc, fold256(p), mins, f);
        }
    }
    acc.map(|acc| avx2::k_result(acc))
}

/// Four f32 from the front of `s`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn load_ps4(s: &[f32]) -> __m128 {
    let s = &s[..4];
    // SAFETY: `s` has exactly 4 readable floats (the slice above).
    unsafe { _mm_loadu_ps(s.as_ptr()) }
}

/// Stores the low byte of each of the sixteen i32 lanes at the front of `s`.
#[inline]
#[target_feature(enable = "avx512f")]
fn store_bytes16(s: &mut [i8], v: __m512i) {
    let s = &mut s[..16];
    // SAFETY: `s` has exactly 16 writable bytes (the slice above).
    unsafe { _mm_storeu_si128(s.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(v)) }
}

/// Sixteen f32 from the front of `s`.
#[inline]
#[target_feature(enable = "avx512f")]
fn load_ps(s: &[f32]) -> __m512 {
    let s = &s[..16];
    // SAFETY: `s` has exactly 16 readable floats (the slice above).
    unsafe { _mm512_loadu_ps(s.as_ptr()) }
}

/// `|v|` lane by lane.
#[inline]
#[target_feature(enable = "avx512f")]
fn abs_ps(v: __m512) -> __m512 {
    _mm512_castsi512_ps(_mm512_and_si512(
        _mm512_castps_si512(v),
        _mm512_set1_epi32(i32::MAX),
    ))
}

/// The largest `|v|` of `x` (a multiple of 16 long), NaN never counting:
/// `vmaxps` returns its second operand, the running max, when `|v|` is NaN.
#[inline]
#[target_feature(enable = "avx512f")]
fn absmax(x: &[f32]) -> f32 {
    let m = x.chunks_exact(16).fold(_mm512_setzero_ps(), |m, v| {
        _mm512_max_ps(abs_ps(load_ps(v)), m)
    });
    _mm512_reduce_max_ps(m)
}

/// `scalar::quantize_q8_k`, bit for bit: the same f32 product, the same
/// `nearest_int` bit trick, the same clamp.
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512BW. (Lengths are checked by
/// slicing.)
#[target_feature(enable = "avx2,avx512f,avx512bw")]
pub unsafe fn quantize_q8_k(x: &[f32], qs: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
    assert!(
        qs.len() == x.len() && d.len() * QK_K == x.len() && bsums.len() * 16 == x.len(),
        "q8_K shapes"
    );
    let (magic, man, off) = (
        _mm512_set1_ps(12_582_912.0),
        _mm512_set1_epi32(0x007f_ffff),
        _mm512_set1_epi32(0x0040_0000),
    );
    let (lo, hi) = (_mm512_set1_epi32(-127), _mm512_set1_epi32(127));
    let blocks = x.chunks_exact(QK_K).zip(qs.chunks_exact_mut(QK_K));
    for (((x, q), d), bs) in blocks.zip(d).zip(bsums.chunks_exact_mut(16)) {
        let amax = absmax(x);
        if amax == 0.0 {
            *d = 0.0;
            q.fill(0);
            bs.fill(0);
            continue;
        }
        let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
        let iscale = _mm512_set1_ps(-127.0 / max);
        for ((v, q), s) in x
            .chunks_exact(16)
            .zip(q.chunks_exact_mut(16))
            .zip(bs.iter_mut())
        {
            let t = _mm512_add_ps(_mm512_mul_ps(iscale, load_ps(v)), magic);
            let n = _mm512_sub_epi32(_mm512_and_si512(_mm512_castps_si512(t), man), off);
            let n = _mm512_max_epi32(_mm512_min_epi32(n, hi), lo);
            store_bytes16(q, n);
            *s = _mm512_reduce_add_epi32(n) as i16;
        }
        *d = 1.0 / (-127.0 / max);
    }
}

/// `scalar::quantize_q8_0`, bit for bit: sixteen blocks' scales at once
/// (`vcvtps2ph` rounds to nearest even, as the scalar f16 encoder), the
/// same IEEE division and product, round half to even by `vcvtps2dq`, NaN
/// quotients masked to 0.
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512BW. (Lengths are checked by
/// slicing.)
#[target_feature(enable = "avx2,avx512f,avx512bw")]
pub unsafe fn quantize_q8_0(x: &[f32], qs: &mut [i8], d: &mut [f32]) {
    assert!(
        qs.len() == x.len() && d.len() * QK == x.len(),
        "q8_0 shapes"
    );
    let (lo, hi, c127) = (
        _mm512_set1_ps(-127.0),
        _mm512_set1_ps(127.0),
        _mm512_set1_ps(127.0),
    );
    let groups = x
        .chunks(16 * QK)
        .zip(qs.chunks_mut(16 * QK))
        .zip(d.chunks_mut(16));
    for ((x, q), d) in groups {
        let k = d.len();
        let mut am = [0f32; 16];
        for (a, x) in am.iter_mut().zip(x.chunks_exact(QK)) {
            *a = absmax(x);
        }
        let av = load_ps(&am);
        let d16 = _mm512_cvtph_ps(_mm512_cvtps_ph::<
            { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
        >(_mm512_div_ps(av, c127)));
        let nonzero = _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(av, _mm512_setzero_ps());
        let mut id = [0f32; 16];
        // SAFETY: both arrays hold 16 floats; `d` gets its first k ≤ 16 lanes.
        unsafe {
            _mm512_storeu_ps(id.as_mut_ptr(), _mm512_maskz_div_ps(nonzero, c127, av));
            _mm512_mask_storeu_ps(
                d.as_mut_ptr(),
                (1u32 << k).wrapping_sub(1) as __mmask16,
                d16,
            );
        }
        for ((x, q), &id) in x
            .chunks_exact(16)
            .zip(q.chunks_exact_mut(16))
            .zip(id.iter().flat_map(|v| [v, v]))
        {
            let v = _mm512_mul_ps(load_ps(x), _mm512_set1_ps(id));
            // Operand order keeps a NaN product NaN, as `f32::clamp` does.
            let c = _mm512_min_ps(hi, _mm512_max_ps(lo, v));
            let ordered = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(v, v);
            let r = _mm512_maskz_cvt_roundps_epi32::<
                { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
            >(ordered, c);
            store_bytes16(q, r);
        }
    }
}

/// `scalar::c8_sums`: `vpdpbusd` with ones sums each lane's four bytes in
/// each half; four blocks a step.
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512BW and AVX-512 VNNI. (Lengths are
/// checked by slicing.)
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vnni")]
pub unsafe fn c8_sums(qs: &[i8], c8: &mut [i32]) {
    assert_eq!(qs.len(), 8 * c8.len(), "q4_0 lane sums shapes");
    let (lo, hi) = qs.split_at(qs.len() / 2);
    let ones = _mm512_set1_epi8(1);
    for ((c, lo), hi) in c8.chunks_mut(16).zip(lo.chunks(64)).zip(hi.chunks(64)) {
        let s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, load_masked(lo));
        let s = _mm512_dpbusd_epi32(s, ones, load_masked(hi));
        let v = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32::<3>(s));
        let m = (1u32 << c.len()).wrapping_sub(1) as __mmask16;
        // SAFETY: the mask enables the first c.len() ≤ 16 lanes, all in `c`.
        unsafe { _mm512_mask_storeu_epi32(c.as_mut_ptr(), m, v) };
    }
}
