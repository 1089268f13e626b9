//! Attention's two products over a cache, for many query rows at once:
//! scores (a query row against every cached key) and the weighted sum of
//! cached values. Every score is one fused multiply-add chain over the
//! head's dimensions in order, and every output element one chain over the
//! positions in order; the SIMD versions only run many chains side by side
//! (lanes over positions for scores, over dimensions for values), so a
//! result never depends on which rows or positions share a tile, on the
//! ISA, or on the thread: the scalar twins here give the same bits.
//!
//! Keys are read from a panel ([`fill_panel`]): one head's keys transposed
//! into blocks of [`BLOCK`] positions, `(blocks, dim, BLOCK)`, so a block's
//! sixteen chains advance with one vector load per dimension.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

use super::cpu::{isa, Isa};
use std::ops::Range;

/// Positions per key-panel block.
pub const BLOCK: usize = 16;

/// Most query rows one [`scores`] or [`weighted_values`] call takes. The
/// kernels walk positions outermost, each stretch of keys or values
/// staying in L1 while every tile of the call uses it, so a call reads the
/// cache once for all its rows; with GQA a task's 16 query rows × 8 heads
/// of a KV head go in two calls. 64 rather than 128 keeps a call's score
/// rows (64 × the span, f32) nearer L2: at 8k positions attention took
/// 11.7 s at 64 and 12.3 s at 128, and 15.2 s in the build before (16
/// pairs, 4-row value tiles) (results/long-prompts.md).
pub const ROWS_MAX: usize = 64;

/// Floats of the panel of `positions` keys of `dim` floats.
pub fn panel_len(positions: usize, dim: usize) -> usize {
    positions.div_ceil(BLOCK) * BLOCK * dim
}

/// One part of every key: key `j`'s floats `keys[j * stride..][..width]`.
#[derive(Clone, Copy)]
pub struct KeyPart<'a> {
    pub keys: &'a [f32],
    pub stride: usize,
    pub width: usize,
}

/// Writes the panel of `n` keys, each the concatenation of `parts` (MLA's
/// keys are a head's reconstructed part and the shared rotary part), into
/// `panel` (`panel_len(n, dim)` floats, `dim` the parts' widths summed;
/// the last block's missing positions are zeros).
pub fn fill_panel(parts: &[KeyPart], n: usize, panel: &mut [f32]) {
    fill_panel_by(parts, n, |j| j, panel)
}

/// [`fill_panel`] of the keys at `positions` (key `j` of the panel is
/// position `positions[j]`): a DSA selection's keys.
pub fn fill_panel_at(parts: &[KeyPart], positions: &[usize], panel: &mut [f32]) {
    fill_panel_by(parts, positions.len(), |j| positions[j], panel)
}

fn fill_panel_by(parts: &[KeyPart], n: usize, at: impl Fn(usize) -> usize, panel: &mut [f32]) {
    let dim: usize = parts.iter().map(|p| p.width).sum();
    let panel = &mut panel[..panel_len(n, dim)];
    for (b, block) in panel.chunks_exact_mut(BLOCK * dim).enumerate() {
        for lane in 0..BLOCK {
            let j = b * BLOCK + lane;
            let mut d = 0;
            for p in parts {
                let key = (j < n).then(|| &p.keys[at(j) * p.stride..at(j) * p.stride + p.width]);
                for i in 0..p.width {
                    block[(d + i) * BLOCK + lane] = key.map_or(0.0, |k| k[i]);
                }
                d += p.width;
            }
        }
    }
}

/// Query rows and where their results go.
#[derive(Clone, Copy)]
pub struct QueryRows<'a> {
    /// Holds every row.
    pub q: &'a [f32],
    /// Row `r` is `q[offsets[r]..][..dim]` (at most [`ROWS_MAX`]).
    pub offsets: &'a [usize],
    pub dim: usize,
}

impl QueryRows<'_> {
    fn check(&self) {
        assert!(self.offsets.len() <= ROWS_MAX, "at most ROWS_MAX rows");
        assert!(
            self.offsets.iter().all(|&o| o + self.dim <= self.q.len()),
            "rows in bounds"
        );
    }
}

/// `out[r * out_stride + j] = scale · Σ_d q_r[d] · key_j[d]` (one fused
/// chain in `d` order, then the product by `scale`) for the panel's
/// positions `j` of `blocks` (whole blocks).
pub fn scores(
    rows: QueryRows,
    panel: &[f32],
    blocks: Range<usize>,
    scale: f32,
    (out, out_stride): (&mut [f32], usize),
) {
    rows.check();
    let dim = rows.dim;
    assert!(
        panel.len() >= blocks.end * BLOCK * dim,
        "blocks in the panel"
    );
    assert!(blocks.end * BLOCK <= out_stride, "blocks within a row");
    assert!(out.len() >= rows.offsets.len() * out_stride, "out rows");
    #[cfg(target_arch = "x86_64")]
    match isa() {
        Isa::Avx512 | Isa::Avx512Vnni => {
            // SAFETY: AVX-512F is present; rows, panel blocks and out rows
            // are in bounds (asserted above).
            return unsafe { avx512::scores(rows, panel, blocks, scale, (out, out_stride)) };
        }
        // SAFETY: AVX2 and FMA are present; bounds as above.
        Isa::Avx2 => return unsafe { avx2::scores(rows, panel, blocks, scale, (out, out_stride)) },
        Isa::Scalar => {}
    }
    scores_scalar(rows, panel, blocks, scale, (out, out_stride))
}

/// The scalar twin of [`scores`].
pub fn scores_scalar(
    rows: QueryRows,
    panel: &[f32],
    blocks: Range<usize>,
    scale: f32,
    (out, out_stride): (&mut [f32], usize),
) {
    let dim = rows.dim;
    for (r, &off) in rows.offsets.iter().enumerate() {
        let q = &rows.q[off..off + dim];
        for b in blocks.clone() {
            let block = &panel[b * BLOCK * dim..(b + 1) * BLOCK * dim];
            for lane in 0..BLOCK {
                let mut acc = 0f32;
                for (d, &qd) in q.iter().enumerate() {
                    acc = qd.mul_add(block[d * BLOCK + lane], acc);
                }
                out[r * out_stride + b * BLOCK + lane] = acc * scale;
            }
        }
    }
}

/// Weights and values of [`weighted_values`].
#[derive(Clone, Copy)]
pub struct Weighted<'a> {
    /// Row `r`'s weight of position `p` is `w[r * w_stride + p]`.
    pub w: &'a [f32],
    pub w_stride: usize,
    /// Position `p`'s value is `v[p * v_stride..][..dim]`.
    pub v: &'a [f32],
    pub v_stride: usize,
    /// Row `r` sums positions `spans[r]`.
    pub spans: &'a [Range<usize>],
}

/// `out[offsets[r] + d] += Σ_{p ∈ spans[r]} w_r[p] · value_p[d]`, one
/// fused chain per element in position order, for each row `r`. Rows that
/// share positions run them together.
pub fn weighted_values(wv: Weighted, (out, offsets): (&mut [f32], &[usize]), dim: usize) {
    let rows = offsets.len();
    assert!(
        rows <= ROWS_MAX && wv.spans.len() == rows,
        "one span per row"
    );
    assert!(offsets.iter().all(|&o| o + dim <= out.len()), "out rows");
    for (r, span) in wv.spans.iter().enumerate() {
        assert!(
            span.is_empty() || r * wv.w_stride + span.end <= wv.w.len(),
            "weights"
        );
        assert!(
            span.is_empty() || (span.end - 1) * wv.v_stride + dim <= wv.v.len(),
            "values"
        );
    }
    value_tiles(wv, (out, offsets), dim, sum_rows);
}

/// How a tile of rows sums a range of positions they all attend.
type SumRows = fn(Weighted, Range<usize>, Range<usize>, (&mut [f32], &[usize]), usize);

/// Splits the rows into tiles of [`VALUE_TILE`]: each row alone over the
/// part of its span the tile's other rows lack, the tile together over the
/// part all attend, every row in position order. Positions go by in
/// chunks of about [`VALUE_CHUNK_BYTES`] of values, outermost, so every
/// tile of the call meets a chunk's values while they are in cache (the
/// values of a long span are far larger than the caches, and each tile
/// and dimension slice would otherwise stream all of them); a row's chain
/// still runs in position order, chunk after chunk.
fn value_tiles(wv: Weighted, (out, offsets): (&mut [f32], &[usize]), dim: usize, sum: SumRows) {
    let rows = offsets.len();
    let lo = wv.spans.iter().map(|r| r.start).min().unwrap_or(0);
    let hi = wv.spans.iter().map(|r| r.end).max().unwrap_or(0);
    let chunk = (VALUE_CHUNK_BYTES / (4 * dim.max(1))).max(BLOCK);
    let mut run = |rows: Range<usize>, positions: Range<usize>, c: &Range<usize>| {
        let p = positions.start.max(c.start)..positions.end.min(c.end);
        if !p.is_empty() {
            sum(wv, rows, p, (&mut *out, offsets), dim);
        }
    };
    for c0 in (lo..hi).step_by(chunk) {
        let c = c0..(c0 + chunk).min(hi);
        for tile in (0..rows).step_by(VALUE_TILE) {
            let tile = tile..(tile + VALUE_TILE).min(rows);
            let common = tile.clone().map(|r| wv.spans[r].start).max().unwrap_or(0)
                ..tile.clone().map(|r| wv.spans[r].end).min().unwrap_or(0);
            if common.is_empty() {
                for r in tile {
                    run(r..r + 1, wv.spans[r].clone(), &c);
                }
                continue;
            }
            for r in tile.clone() {
                run(r..r + 1, wv.spans[r].start..common.start, &c);
            }
            run(tile.clone(), common.clone(), &c);
            for r in tile {
                run(r..r + 1, common.end..wv.spans[r].end, &c);
            }
        }
    }
}

/// Bytes of values one chunk of [`value_tiles`] covers: two thirds of a
/// 48 KiB L1d (at least [`BLOCK`] positions however wide the values); 32
/// KiB measured 3% faster than 16 KiB (`cargo bench --bench kernels --
/// attention/values`).
const VALUE_CHUNK_BYTES: usize = 32 << 10;

/// Rows one value tile sums together: on AVX-512, 6 rows × 4 vectors are
/// 24 accumulators, so each position's value loads feed 6 rows (4 rows
/// left the value sums at ~70% of the FMA rate the scores reach).
const VALUE_TILE: usize = 6;

/// Rows `rows` (at most [`VALUE_TILE`]) sum `positions`, all in each row's
/// span (checked by [`weighted_values`]).
fn sum_rows(
    wv: Weighted,
    rows: Range<usize>,
    positions: Range<usize>,
    (out, offsets): (&mut [f32], &[usize]),
    dim: usize,
) {
    #[cfg(target_arch = "x86_64")]
    match isa() {
        Isa::Avx512 | Isa::Avx512Vnni => {
            // SAFETY: AVX-512F is present; `weighted_values` checked every
            // row's weights, values and output in bounds over its span,
            // which contains `positions`.
            return unsafe { avx512::sum_rows(wv, rows, positions, (out, offsets), dim) };
        }
        // SAFETY: AVX2 and FMA are present; bounds as above.
        Isa::Avx2 => return unsafe { avx2::sum_rows(wv, rows, positions, (out, offsets), dim) },
        Isa::Scalar => {}
    }
    sum_rows_scalar(wv, rows, positions, (out, offsets), dim)
}

/// The scalar twin of the value sums.
fn sum_rows_scalar(
    wv: Weighted,
    rows: Range<usize>,
    positions: Range<usize>,
    (out, offsets): (&mut [f32], &[usize]),
    dim: usize,
) {
    for r in rows {
        let o = &mut out[offsets[r]..offsets[r] + dim];
        for p in positions.clone() {
            let w = wv.w[r * wv.w_stride + p];
            let v = &wv.v[p * wv.v_stride..p * wv.v_stride + dim];
            for (x, &vd) in o.iter_mut().zip(v) {
                *x = w.mul_add(vd, *x);
            }
        }
    }
}

/// [`weighted_values`] on the scalar twin, each row alone (for the twin
/// tests).
#[cfg(test)]
fn weighted_values_scalar(wv: Weighted, (out, offsets): (&mut [f32], &[usize]), dim: usize) {
    for (r, span) in wv.spans.iter().enumerate() {
        sum_rows_scalar(wv, r..r + 1, span.clone(), (out, offsets), dim);
    }
}

#[cfg(test)]
mod tests;

/// `exp(x)` for the attention softmax: Cephes' polynomial on the
/// remainder after `n · ln 2`, scaled by `2^n`, in fused steps the SIMD
/// versions repeat lane by lane. Within 2 ulp of `f32::exp` where the
/// result is normal; 0 below `EXP_MIN` (where `exp` is subnormal). For
/// `x ≤ 0` (a score less the maximum).
pub fn exp_scalar(x: f32) -> f32 {
    let n = (x.max(EXP_MIN) * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_HI, x.max(EXP_MIN));
    let r = n.mul_add(-LN2_LO, r);
    let mut y = EXP_POLY[0];
    for c in &EXP_POLY[1..] {
        y = y.mul_add(r, *c);
    }
    let y = y.mul_add(r * r, r) + 1.0;
    let scaled = y * f32::from_bits(((n as i32 + 127) as u32) << 23);
    if x < EXP_MIN {
        0.0
    } else {
        scaled
    }
}

/// Below this the softmax's `exp` is 0 (the smallest normal's log).
pub(crate) const EXP_MIN: f32 = -87.33;
pub(crate) const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split in two so `x - n ln 2` is exact for the `n` that occur.
pub(crate) const LN2_HI: f32 = 0.693_359_4;
pub(crate) const LN2_LO: f32 = -2.121_944_4e-4;
/// Cephes `expf`'s coefficients, highest degree first.
pub(crate) const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_2e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    0.166_666_65,
    0.5,
];

/// In-place softmax of attention scores in f32: the maximum, `exp` of
/// each score less it ([`exp_scalar`]'s steps), their sum in sixteen
/// partial sums (element `j` in sum `j % 16`, then halves added pairwise),
/// and each divided by it. The same bits on every ISA.
pub fn softmax(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    match isa() {
        // SAFETY: AVX-512F is present.
        Isa::Avx512 | Isa::Avx512Vnni => return unsafe { avx512::softmax(x) },
        // SAFETY: AVX2 and FMA are present.
        Isa::Avx2 => return unsafe { avx2::softmax(x) },
        Isa::Scalar => {}
    }
    softmax_scalar(x)
}

/// The scalar twin of [`softmax`].
pub fn softmax_scalar(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut lanes = [0f32; 16];
    for (j, v) in x.iter_mut().enumerate() {
        *v = exp_scalar(*v - max);
        lanes[j % 16] += *v;
    }
    let sum = sum_lanes(lanes);
    for v in x.iter_mut() {
        *v /= sum;
    }
}

/// The sixteen partial sums added in halves: `l[i] + l[i + 8]`, then
/// `+ [i + 4]`, `+ [i + 2]`, `+ [i + 1]`.
pub(crate) fn sum_lanes(mut l: [f32; 16]) -> f32 {
    for half in [8, 4, 2, 1] {
        for i in 0..half {
            l[i] += l[i + half];
        }
    }
    l[0]
}
