//! The scalar twins of Q5_0, Q5_1, IQ4_NL and IQ4_XS: what the AVX2 and
//! AVX-512 dots compute, operation for operation (the lane conventions of
//! `ggml::scalar`: sixteen f32 lanes, each block adding exact integer
//! partials `p` as `lane + (p as f32)·f`, then `reduce16`).
//!
//! Every type runs over 32-value blocks `b` (IQ4_XS: sub-block `j` of
//! super-block `B` is block `b = 8B + j`) against the split Q8_0
//! activations, Q4_0's lanes: byte `i` of a block's 16 level bytes holds
//! values `i` (low nibble, meeting `x_lo[16b + i]`) and `16 + i` (high,
//! `x_hi[16b + i]`), and both go to lane `4·(b % 4) + i / 4`.
//! - Q5_0: `p = Σ (level − 16)·x`, `f = d_w·d_x`;
//! - Q5_1: `p = Σ level·x` with `f = d_w·d_x`, then a second step `s = Σ x`
//!   with `f = m_w·d_x` (value = `level·d + m`);
//! - IQ4_NL: `p = Σ KVALUES[index]·x`, `f = d_w·d_x`;
//! - IQ4_XS: `p = sc_j·Σ KVALUES[index]·x` (`sc_j` the sub-block's signed
//!   scale), `f = d_w·d_x` with `d_w` the super-block's f16.

use super::super::codec::{f16_to_f32, le16, QK};
use super::super::scalar::{reduce16, ActRow};
use super::super::BlockType;
use super::{iq4_nl, iq4_xs, le32, nibble, q5_0, q5_1, q5_levels, scales_xs, KVALUES};

/// [`vec_dot`] of each `w.len() / out.len()`-byte row of `w` into `out`
/// (whole rows of whole blocks, checked by `ggml::dot_rows`).
pub(in super::super) fn dot_rows(ty: BlockType, w: &[u8], a: &ActRow, out: &mut [f32]) {
    let rb = w.len() / out.len().max(1);
    for (o, row) in out.iter_mut().zip(w.chunks_exact(rb.max(1))) {
        *o = vec_dot(ty, row, a);
    }
}

/// `W_row · x` for one row of `ty` blocks (see the module doc).
pub(in super::super) fn vec_dot(ty: BlockType, w: &[u8], a: &ActRow) -> f32 {
    match ty {
        BlockType::Q5_0 => dot_q5_0(w, a),
        BlockType::Q5_1 => dot_q5_1(w, a),
        BlockType::IQ4NL => dot_iq4_nl(w, a),
        BlockType::IQ4XS => dot_iq4_xs(w, a),
        _ => unreachable!("{}: not an ext type", ty.name()),
    }
}

/// The four lane partials of block `b`: `Σ q(v)·x(v)` over each lane's
/// eight values, `q(v)` the signed weight level of value `v` of the block.
#[inline]
fn lanes(a: &ActRow, b: usize, q: impl Fn(usize) -> i32) -> [i32; 4] {
    let nb = a.qs.len() / QK;
    let (xlo, xhi) = a.qs.split_at(16 * nb);
    let mut p = [0i32; 4];
    for i in 0..16 {
        p[i / 4] += q(i) * xlo[16 * b + i] as i32 + q(16 + i) * xhi[16 * b + i] as i32;
    }
    p
}

/// `acc[lanes of b] + (p as f32)·f`.
#[inline]
fn add(acc: &mut [f32; 16], b: usize, p: &[i32; 4], f: f32) {
    for (a, &p) in acc[4 * (b % 4)..4 * (b % 4) + 4].iter_mut().zip(p) {
        *a += p as f32 * f;
    }
}

fn dot_q5_0(w: &[u8], a: &ActRow) -> f32 {
    let mut acc = [0f32; 16];
    for (b, blk) in w.chunks_exact(q5_0::BYTES).enumerate() {
        let lev = q5_levels(&blk[q5_0::QS..], le32(blk, q5_0::QH));
        let p = lanes(a, b, |v| lev[v] as i32 - 16);
        add(&mut acc, b, &p, f16_to_f32(le16(blk, q5_0::D)) * a.d[b]);
    }
    reduce16(&acc)
}

fn dot_q5_1(w: &[u8], a: &ActRow) -> f32 {
    let mut acc = [0f32; 16];
    for (b, blk) in w.chunks_exact(q5_1::BYTES).enumerate() {
        let lev = q5_levels(&blk[q5_1::QS..], le32(blk, q5_1::QH));
        let p = lanes(a, b, |v| lev[v] as i32);
        let s = lanes(a, b, |_| 1);
        add(&mut acc, b, &p, f16_to_f32(le16(blk, q5_1::D)) * a.d[b]);
        add(&mut acc, b, &s, f16_to_f32(le16(blk, q5_1::M)) * a.d[b]);
    }
    reduce16(&acc)
}

fn dot_iq4_nl(w: &[u8], a: &ActRow) -> f32 {
    let mut acc = [0f32; 16];
    for (b, blk) in w.chunks_exact(iq4_nl::BYTES).enumerate() {
        let qs = &blk[iq4_nl::QS..];
        let p = lanes(a, b, |v| KVALUES[nibble(qs, v) as usize] as i32);
        add(&mut acc, b, &p, f16_to_f32(le16(blk, iq4_nl::D)) * a.d[b]);
    }
    reduce16(&acc)
}

fn dot_iq4_xs(w: &[u8], a: &ActRow) -> f32 {
    let mut acc = [0f32; 16];
    for (sb, blk) in w.chunks_exact(iq4_xs::BYTES).enumerate() {
        let (dw, sc) = (f16_to_f32(le16(blk, iq4_xs::D)), scales_xs(blk));
        for (j, &s) in sc.iter().enumerate() {
            let (b, qs) = (8 * sb + j, &blk[iq4_xs::QS + 16 * j..]);
            let p = lanes(a, b, |v| KVALUES[nibble(qs, v) as usize] as i32);
            add(&mut acc, b, &p.map(|p| s as i32 * p), dw * a.d[b]);
        }
    }
    reduce16(&acc)
}
