//! The scalar twins: activation quantization (ggml's `vec_dot_type`s) and
//! the block dots that define, operation for operation, what the AVX2 and
//! AVX-512 versions compute.
//!
//! Dot semantics (every ISA; the tests hold them bit-identical). Every dot
//! keeps sixteen f32 lanes; a block adds one exact integer partial `p` to
//! each of its lanes as `lane + (p as f32)·f` (one product, one sum, each
//! rounded; no FMA), with `f = d_w·d_x` (one rounded product), and the
//! row's result is [`reduce16`] of the lanes. Which values go to which lane:
//! - Q8_0: block `b`'s values `4k..4k+4` (`Σ w·x`) to lane `8·(b % 2) + k`;
//! - Q4_0: block `b`'s values `4k..4k+4` and `16+4k..16+4k+4` (`Σ (q −
//!   8)·x`) to lane `4·(b % 4) + k` (the weights' nibble order, so SIMD never
//!   shuffles them);
//! - the K types (Q4_K, Q5_K, Q6_K, Q3_K, Q2_K) keep two f32 accumulators
//!   instead, `s` and `t`, both from +0: super-block `b` adds its exact
//!   integer sum `P = Σ sc_j·(level − bias)·x` over its 256 values (`bias`
//!   32 for Q6_K, 4 for Q3_K, else 0; `sc_j` the value's sub-block scale)
//!   as `s + (P as f32)·(d_w·d_x)`, and, for the types with mins (Q4_K,
//!   Q5_K, Q2_K), `M = Σ_j m_j·(Σ x over sub-block j)` as `t + (M as
//!   f32)·(dmin_w·d_x)`; the result is `s − t` (`s` without mins). Whole
//!   super-block sums are what any multiply, SIMD lanes or matrix tiles,
//!   can produce exactly, so the prefill tiles give these bits too.
//!
//! The Q8_0/Q4_0 lanes are those the AVX-512 registers hold naturally (a
//! 64-byte register's i32 lane covers four consecutive bytes); AVX2 keeps
//! them as two 8-lane registers.

use super::codec::{f16_to_f32, f32_to_f16, le16, nearest_int, q2_k, q3_k, q4_0, q4_k, q5_k};
use super::codec::{q2_level, q3_level, q6_k, q6_level, q8_0, scales_k4, scales_q3, QK, QK_K};
use super::BlockType;

/// One quantized activation row as the dots read it.
#[derive(Clone, Copy)]
pub(crate) struct ActRow<'a> {
    /// The int8 values: natural order (Q8_0, Q6_K, Q3_K, Q2_K); for Q4_0
    /// (and Q5_0, Q5_1, IQ4_NL, IQ4_XS) the low halves
    /// of every block (`x_b[0..16]`, block after block) followed by the high
    /// halves (`x_b[16..32]`); for Q4_K/Q5_K each 128 values in the order of
    /// their level bytes, sub-blocks `0, 2, 1, 3` ([`kmin_pos`]).
    pub qs: &'a [i8],
    /// The f16-rounded Q8_0 scale of each 32 values, or Q8_K's f32 `d` of
    /// each 256.
    pub d: &'a [f32],
    /// Q8_K only: `Σ x` over each 16 values.
    pub bsums: &'a [i16],
    /// Q4_0 (and `ext`'s types) only: `−8·(Σ x)` over each of the four lanes
    /// of each 32 values (the
    /// SIMD versions multiply unsigned nibbles and add this back).
    pub c8: &'a [i32],
}

impl ActRow<'_> {
    /// Asserts that this row fits `w`, a row of `ty` blocks (the SIMD
    /// versions index by these lengths).
    pub fn check(&self, ty: BlockType, w: &[u8]) {
        let nb = w.len() / ty.block_bytes();
        assert_eq!(w.len(), nb * ty.block_bytes(), "ggml dot: partial block");
        let cols = nb * ty.block_elems();
        assert_eq!(self.qs.len(), cols, "ggml dot: activation length");
        let (nd, bsums, c8) = super::act_lens(ty, cols);
        assert_eq!(self.d.len(), nd, "ggml dot: activation scales");
        assert!(
            self.bsums.len() == bsums && self.c8.len() == c8,
            "ggml dot: activation sums"
        );
    }
}

/// [`vec_dot`] of each `w.len() / out.len()`-byte row of `w` into `out`.
pub(crate) fn dot_rows(ty: BlockType, w: &[u8], a: &ActRow, out: &mut [f32]) {
    let rb = w.len() / out.len().max(1);
    assert_eq!(w.len(), rb * out.len(), "ggml dot_rows: rows");
    for (o, row) in out.iter_mut().zip(w.chunks_exact(rb.max(1))) {
        *o = vec_dot(ty, row, a);
    }
    if rb == 0 {
        out.fill(0.0);
    }
}

/// `W_row · x` for one row of `ty` blocks (see the module doc).
pub(crate) fn vec_dot(ty: BlockType, w: &[u8], a: &ActRow) -> f32 {
    a.check(ty, w);
    match ty {
        BlockType::Q4_0 => dot_q4_0(w, a),
        BlockType::Q8_0 => dot_q8_0(w, a),
        BlockType::Q4K => dot_q4_k(w, a),
        BlockType::Q5K => dot_q5_k(w, a),
        BlockType::Q6K => dot_q6_k(w, a),
        BlockType::Q3K => dot_q3_k(w, a),
        BlockType::Q2K => dot_q2_k(w, a),
        BlockType::Q5_0 | BlockType::Q5_1 | BlockType::IQ4NL | BlockType::IQ4XS => {
            unreachable!("{}: ggml::dot_rows routes it to ext", ty.name())
        }
    }
}

/// The fixed reduction of sixteen lanes: halves, then quarters, then
/// pairs (`(a[i] + a[i+8])`, `+ (…[i+4])`, `+ (…[i+2])`, `+ (…[i+1])`).
#[inline]
pub(crate) fn reduce16(a: &[f32; 16]) -> f32 {
    let s8: [f32; 8] = std::array::from_fn(|i| a[i] + a[i + 8]);
    reduce8(&s8)
}

/// The last three steps of [`reduce16`].
#[inline]
pub(crate) fn reduce8(a: &[f32; 8]) -> f32 {
    let s4: [f32; 4] = std::array::from_fn(|i| a[i] + a[i + 4]);
    let s2 = [s4[0] + s4[2], s4[1] + s4[3]];
    s2[0] + s2[1]
}

/// `acc[L] + (p[L] as f32)·f` for every lane given.
#[inline]
fn add_lanes(acc: &mut [f32], p: &[i32], f: f32) {
    for (a, &p) in acc.iter_mut().zip(p) {
        *a += p as f32 * f;
    }
}

/// Where value `v` of a Q4_K/Q5_K super-block sits in its activation row
/// (see [`ActRow::qs`]).
#[inline]
pub(crate) fn kmin_pos(v: usize) -> usize {
    const SLOT: [usize; 4] = [0, 2, 1, 3];
    v / 128 * 128 + SLOT[v % 128 / 32] * 32 + v % 32
}

fn dot_q8_0(w: &[u8], a: &ActRow) -> f32 {
    let mut acc = [0f32; 16];
    for (b, blk) in w.chunks_exact(q8_0::BYTES).enumerate() {
        let (qs, x) = (&blk[q8_0::QS..], &a.qs[QK * b..QK * (b + 1)]);
        let mut p = [0i32; 8];
        for (i, (&q, &x)) in qs.iter().zip(x).enumerate() {
            p[i / 4] += q as i8 as i32 * x as i32;
        }
        let lanes = 8 * (b % 2)..8 * (b % 2) + 8;
        add_lanes(&mut acc[lanes], &p, f16_to_f32(le16(blk, q8_0::D)) * a.d[b]);
    }
    reduce16(&acc)
}

fn dot_q4_0(w: &[u8], a: &ActRow) -> f32 {
    let nb = w.len() / q4_0::BYTES;
    let (xlo, xhi) = a.qs.split_at(16 * nb);
    let mut acc = [0f32; 16];
    for (b, blk) in w.chunks_exact(q4_0::BYTES).enumerate() {
        let mut p = [0i32; 4];
        for (i, &q) in blk[q4_0::QS..].iter().enumerate() {
            let (lo, hi) = ((q & 15) as i32 - 8, (q >> 4) as i32 - 8);
            p[i / 4] += lo * xlo[16 * b + i] as i32 + hi * xhi[16 * b + i] as i32;
        }
        let lanes = 4 * (b % 4)..4 * (b % 4) + 4;
        add_lanes(&mut acc[lanes], &p, f16_to_f32(le16(blk, q4_0::D)) * a.d[b]);
    }
    reduce16(&acc)
}

/// The K types' f32 steps (module doc): `s` and `t`, one super-block at
/// a time.
#[derive(Clone, Copy, Default)]
pub(crate) struct KAcc {
    pub s: f32,
    pub t: f32,
}

impl KAcc {
    /// Adds one super-block: `p`·`f` to `s`, `m`·`g` to `t`.
    #[inline]
    pub fn add(&mut self, p: i32, f: f32, m: i32, g: f32) {
        self.s += p as f32 * f;
        self.t += m as f32 * g;
    }

    /// The dot, `s − t`.
    #[inline]
    pub fn result(self) -> f32 {
        self.s - self.t
    }
}

/// Q4_K and Q5_K: `level(blk, v)` is the unsigned level of value `v`.
fn dot_kmin(w: &[u8], a: &ActRow, bytes: usize, level: impl Fn(&[u8], usize) -> u8) -> f32 {
    let mut acc = KAcc::default();
    for (b, blk) in w.chunks_exact(bytes).enumerate() {
        let (sc, m) = scales_k4(&blk[q4_k::SCALES..q4_k::SCALES + 12]);
        let x = &a.qs[QK_K * b..QK_K * (b + 1)];
        let p: i32 = (0..QK_K)
            .map(|v| sc[v / 32] as i32 * level(blk, v) as i32 * x[kmin_pos(v)] as i32)
            .sum();
        let bs = &a.bsums[16 * b..16 * b + 16];
        let mins: i32 = (0..8)
            .map(|j| m[j] as i32 * (bs[2 * j] as i32 + bs[2 * j + 1] as i32))
            .sum();
        let (dw, dminw) = (f16_to_f32(le16(blk, 0)), f16_to_f32(le16(blk, 2)));
        acc.add(p, dw * a.d[b], mins, dminw * a.d[b]);
    }
    acc.result()
}

fn dot_q4_k(w: &[u8], a: &ActRow) -> f32 {
    dot_kmin(w, a, q4_k::BYTES, |blk, v| {
        let byte = blk[q4_k::QS + 32 * (v / 64) + v % 32];
        if v % 64 < 32 {
            byte & 15
        } else {
            byte >> 4
        }
    })
}

fn dot_q5_k(w: &[u8], a: &ActRow) -> f32 {
    dot_kmin(w, a, q5_k::BYTES, |blk, v| {
        let (c, l) = (v / 64, v % 32);
        let byte = blk[q5_k::QS + 32 * c + l];
        let (nib, bit) = if v % 64 < 32 {
            (byte & 15, 2 * c)
        } else {
            (byte >> 4, 2 * c + 1)
        };
        nib | ((blk[q5_k::QH + l] >> bit) & 1) << 4
    })
}

/// Q6_K and Q3_K: `BYTES`-byte blocks with the f16 `d` at `D`, sixteen
/// signed scales from `scales(blk)` and `level(blk, v) − bias` the signed
/// level of value `v`.
fn dot_sym<const BYTES: usize, const D: usize>(
    w: &[u8],
    a: &ActRow,
    bias: i32,
    scales: impl Fn(&[u8]) -> [i8; 16],
    level: impl Fn(&[u8], usize) -> u8,
) -> f32 {
    let mut acc = KAcc::default();
    for (b, blk) in w.chunks_exact(BYTES).enumerate() {
        let x = &a.qs[QK_K * b..QK_K * (b + 1)];
        let sc = scales(blk);
        let p: i32 = x
            .iter()
            .enumerate()
            .map(|(v, &x)| sc[v / 16] as i32 * (level(blk, v) as i32 - bias) * x as i32)
            .sum();
        acc.add(p, f16_to_f32(le16(blk, D)) * a.d[b], 0, 0.0);
    }
    acc.s
}

fn dot_q6_k(w: &[u8], a: &ActRow) -> f32 {
    let scales = |blk: &[u8]| std::array::from_fn(|j| blk[q6_k::SCALES + j] as i8);
    dot_sym::<{ q6_k::BYTES }, { q6_k::D }>(w, a, 32, scales, q6_level)
}

fn dot_q3_k(w: &[u8], a: &ActRow) -> f32 {
    let scales = |blk: &[u8]| scales_q3(&blk[q3_k::SCALES..q3_k::D]);
    dot_sym::<{ q3_k::BYTES }, { q3_k::D }>(w, a, 4, scales, q3_level)
}

fn dot_q2_k(w: &[u8], a: &ActRow) -> f32 {
    let mut acc = KAcc::default();
    for (b, blk) in w.chunks_exact(q2_k::BYTES).enumerate() {
        let x = &a.qs[QK_K * b..QK_K * (b + 1)];
        let s = &blk[q2_k::SCALES..q2_k::QS];
        let p: i32 = x
            .iter()
            .enumerate()
            .map(|(v, &x)| (s[v / 16] & 15) as i32 * q2_level(blk, v) as i32 * x as i32)
            .sum();
        let bs = &a.bsums[16 * b..16 * b + 16];
        let mins: i32 = (0..16).map(|j| (s[j] >> 4) as i32 * bs[j] as i32).sum();
        let dx = a.d[b];
        let (dw, dminw) = (
            f16_to_f32(le16(blk, q2_k::D)),
            f16_to_f32(le16(blk, q2_k::DMIN)),
        );
        acc.add(p, dw * dx, mins, dminw * dx);
    }
    acc.result()
}

/// ggml's x86 (AVX) `quantize_row_q8_0` for one row: per 32 values, `d =
/// amax / 127` stored as f16 (`d` receives the f16's value), `q = round(x ·
/// (127 / amax))` half to even. Where ggml is undefined or odd, on NaN
/// input: NaN never counts toward `amax`, quantizes to 0, and every `q` is
/// clamped to ±127 (ggml's packing would saturate a NaN to −128).
pub(crate) fn quantize_q8_0(x: &[f32], qs: &mut [i8], d: &mut [f32]) {
    assert!(
        qs.len() == x.len() && d.len() * QK == x.len(),
        "q8_0 shapes"
    );
    for ((x, q), d) in x.chunks_exact(QK).zip(qs.chunks_exact_mut(QK)).zip(d) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        *d = f16_to_f32(f32_to_f16(amax / 127.0));
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        for (q, &v) in q.iter_mut().zip(x) {
            *q = round_small((v * id).clamp(-127.0, 127.0)) as i8;
        }
    }
}

/// Round half to even for `|v| ≤ 2^22` through the f32 adder (NaN stays
/// NaN, which `as i8` turns into 0).
#[inline]
fn round_small(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2^23
    (v + MAGIC) - MAGIC
}

/// A Q8_0 row into the Q4_0 layout of [`ActRow::qs`]: each block's low
/// half, then each block's high half.
pub(crate) fn split_q4_0(natural: &[i8], qs: &mut [i8]) {
    assert_eq!(natural.len(), qs.len(), "q4_0 split shapes");
    let (lo, hi) = qs.split_at_mut(natural.len() / 2);
    for ((q, lo), hi) in natural
        .chunks_exact(QK)
        .zip(lo.chunks_exact_mut(16))
        .zip(hi.chunks_exact_mut(16))
    {
        lo.copy_from_slice(&q[..16]);
        hi.copy_from_slice(&q[16..]);
    }
}

/// The Q4_0 lane sums [`ActRow::c8`] of a split row: `−8·Σ` over lane
/// `4b + k`'s eight values.
pub(crate) fn c8_sums(qs: &[i8], c8: &mut [i32]) {
    assert_eq!(qs.len(), 8 * c8.len(), "q4_0 lane sums shapes");
    let (lo, hi) = qs.split_at(qs.len() / 2);
    for ((c, lo), hi) in c8
        .iter_mut()
        .zip(lo.chunks_exact(4))
        .zip(hi.chunks_exact(4))
    {
        *c = -8 * lo.iter().chain(hi).map(|&v| v as i32).sum::<i32>();
    }
}

/// ggml's `quantize_row_q8_K_ref` for one row: per 256 values, `iscale =
/// −127 / max` where `max` is the first value of largest magnitude, `q =
/// min(127, nearest_int(iscale·x))`, `d = 1 / iscale`, and `bsums` the sums
/// of each 16 `q`. An all-zero block gives `d = 0`, `q = 0`. (Only a NaN
/// with a non-default payload can take `q` outside ±127; it is clamped.)
pub(crate) fn quantize_q8_k(x: &[f32], qs: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
    assert!(
        qs.len() == x.len() && d.len() * QK_K == x.len() && bsums.len() * 16 == x.len(),
        "q8_K shapes"
    );
    let blocks = x.chunks_exact(QK_K).zip(qs.chunks_exact_mut(QK_K));
    for (((x, q), d), bs) in blocks.zip(d).zip(bsums.chunks_exact_mut(16)) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        if amax == 0.0 {
            *d = 0.0;
            q.fill(0);
            bs.fill(0);
            continue;
        }
        let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
        let iscale = -127.0 / max;
        for (q, &v) in q.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).clamp(-127, 127) as i8;
        }
        for (s, q) in bs.iter_mut().zip(q.chunks_exact(16)) {
            *s = q.iter().map(|&v| v as i16).sum();
        }
        *d = 1.0 / iscale;
    }
}

/// Reorders a Q8_K row into the Q4_K/Q5_K layout ([`kmin_pos`]), 32
/// values at a time.
pub(crate) fn permute_kmin(natural: &[i8], out: &mut [i8]) {
    assert_eq!(natural.len(), out.len(), "q8_K permute shapes");
    for (v, q) in natural.chunks_exact(32).enumerate() {
        let at = kmin_pos(32 * v);
        out[at..at + 32].copy_from_slice(q);
    }
}
