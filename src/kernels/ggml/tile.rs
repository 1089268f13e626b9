//! Repacked, tiled Q4_0 and Q4_K dots for calls with many activation rows
//! (prefill, large batches): each task repacks its block of weight rows
//! once per call into its thread's scratch, then every weight row meets the
//! activation rows [`TILE_ACTS`] at a time, so the unpacking of a block
//! (nibbles, 6-bit scales, f16 scales) is paid once per call instead of
//! once per activation row, and the per-block f32 scale products need no
//! scalar work.
//!
//! The results are the per-row dots' bits ([`super::scalar`]): every
//! accumulator of the twin gets the same f32 operations in the same order.
//! Q4_0's sixteen lanes split into independent groups of eight (lanes 0..8
//! take block pairs `k` with `k` even, lanes 8..16 those with `k` odd),
//! and each group is its own sweep over the row here, with one 8-lane
//! accumulator a (weight row, activation row) pair; a lane still sees its
//! blocks in order. The Q4_K tiles keep the twin's `[s, t]` a pair, one sweep over
//! the row. A Q4_0 row with an odd number of blocks gets a padding block of
//! zero levels, zero scale and zero lane sums, which adds `0·0 = +0` to
//! lanes 4..8 of its group: a lane starts at +0 and a rounded-to-nearest
//! sum is −0 only when both terms are, so these lanes keep their value.
//!
//! Layouts (per weight row, in its block's scratch):
//! - Q4_0, per block pair `k` (blocks `2k`, `2k + 1`): 32 low-nibble
//!   levels (block `2k`'s 16, then `2k + 1`'s), 32 high-nibble levels, and
//!   eight f32 scales `[d_2k ×4, d_2k+1 ×4]`. The activations are laid out
//!   once per call to match: per pair 32 low-half values, 32 high-half
//!   values, the eight `c8` lane sums and `[dx_2k ×4, dx_2k+1 ×4]`.
//! - Q4_K, per super-block: the 256 levels as eight runs of 32 (chunk `c`'s
//!   low nibbles, then its high ones, `c = 0..4`), the eight sub-block
//!   scales each as sixteen i16 (a register's worth), the mins as sixteen
//!   i16 (`m_j` twice), and `[d, dmin]` as f32. The activations are the
//!   prepared rows ([`ActRow`](super::scalar::ActRow)) regrouped like
//!   Q4_0's.
//!
//! Both activation layouts interleave [`TILE_ACTS`] rows pair by pair (or
//! super-block by super-block), so a tile's loads run off three base
//! pointers, each record sliced once as a fixed-size array: with a slice
//! per row the tile held twelve (pointer, length) pairs and spilled them,
//! at 22% of the AVX2 peak for Q4_0 against 33% regrouped.
//!
//! Dispatch (`tiled`): the AVX2 kernels (`tile_avx2`) where `matmul` runs the AVX2
//! dots and a call has at least [`TILE_ACTS_MIN`] activation rows; the
//! scalar functions here are their twins (tests hold them bit-identical,
//! and both to the per-row dots). The AVX-512 VNNI dispatch keeps its
//! shared-unpacking kernels.

use super::codec::{f16_to_f32, le16, q4_0, q4_k, scales_k4, QK_K};
use super::scalar::{reduce16, KAcc};
use super::{Activations, BlockType};

/// Fewest activation rows a call takes the tiled kernels for.
pub(crate) const TILE_ACTS_MIN: usize = 8;
/// Activation rows one weight row meets at a time.
pub(crate) const TILE_ACTS: usize = 4;

/// One block of weight rows, repacked (see the module doc).
#[derive(Default)]
pub(super) struct Packed {
    /// Unsigned levels: Q4_0 64 a pair, Q4_K 256 a super-block.
    pub lev: Vec<u8>,
    /// f32 scales: Q4_0 eight a pair, Q4_K `[d, dmin]` a super-block.
    pub d: Vec<f32>,
    /// Q4_K: eight sub-block scales of sixteen i16 a super-block.
    pub sc: Vec<i16>,
    /// Q4_K: sixteen i16 mins (`m_j` twice) a super-block.
    pub mins: Vec<i16>,
    /// Pairs (Q4_0) or super-blocks (Q4_K) a row.
    pub units: usize,
    ty: Option<BlockType>,
}

/// One weight row of a [`Packed`] block.
#[derive(Clone, Copy)]
pub(super) struct PackedRow<'a> {
    pub lev: &'a [u8],
    pub d: &'a [f32],
    pub sc: &'a [i16],
    pub mins: &'a [i16],
    pub units: usize,
}

impl Packed {
    /// Repacks the rows of `w` (whole rows of `ty` blocks, `rb` bytes each).
    pub fn pack(&mut self, ty: BlockType, w: &[u8], rb: usize) {
        let rows = w.len() / rb.max(1);
        let nb = rb / ty.block_bytes();
        self.ty = Some(ty);
        match ty {
            BlockType::Q4_0 => self.pack_q4_0(w, rows, nb),
            BlockType::Q4K => self.pack_q4_k(w, rows, nb),
            _ => unreachable!("tiled kernels take Q4_0 and Q4_K only"),
        }
    }

    fn pack_q4_0(&mut self, w: &[u8], rows: usize, nb: usize) {
        const B: usize = q4_0::BYTES;
        let np = nb.div_ceil(2);
        self.units = np;
        self.lev.clear();
        self.lev.resize(rows * np * 64, 0);
        self.d.clear();
        self.d.resize(rows * np * 8, 0.0);
        for r in 0..rows {
            let row = &w[r * nb * B..(r + 1) * nb * B];
            for (b, blk) in row.chunks_exact(B).enumerate() {
                let (k, i) = (b / 2, b % 2);
                let lev = &mut self.lev[(r * np + k) * 64..][..64];
                for (l, &q) in blk[q4_0::QS..].iter().enumerate() {
                    lev[16 * i + l] = q & 15;
                    lev[32 + 16 * i + l] = q >> 4;
                }
                let d = f16_to_f32(le16(blk, q4_0::D));
                self.d[(r * np + k) * 8 + 4 * i..][..4].fill(d);
            }
        }
    }

    fn pack_q4_k(&mut self, w: &[u8], rows: usize, nb: usize) {
        const B: usize = q4_k::BYTES;
        self.units = nb;
        let total = rows * nb;
        self.lev.resize(total * QK_K, 0);
        self.d.resize(total * 2, 0.0);
        self.sc.resize(total * 128, 0);
        self.mins.resize(total * 16, 0);
        for (u, blk) in w[..total * B].chunks_exact(B).enumerate() {
            let lev = &mut self.lev[u * QK_K..(u + 1) * QK_K];
            for c in 0..4 {
                let qs = &blk[q4_k::QS + 32 * c..][..32];
                for (l, &q) in qs.iter().enumerate() {
                    lev[64 * c + l] = q & 15;
                    lev[64 * c + 32 + l] = q >> 4;
                }
            }
            let (sc, m) = scales_k4(&blk[q4_k::SCALES..q4_k::QS]);
            for (j, &s) in sc.iter().enumerate() {
                self.sc[u * 128 + 16 * j..][..16].fill(s as i16);
            }
            for (j, &m) in m.iter().enumerate() {
                self.mins[u * 16 + 2 * j..][..2].fill(m as i16);
            }
            self.d[2 * u] = f16_to_f32(le16(blk, q4_k::D));
            self.d[2 * u + 1] = f16_to_f32(le16(blk, q4_k::DMIN));
        }
    }

    /// Row `r` of the block.
    pub fn row(&self, r: usize) -> PackedRow<'_> {
        let u = self.units;
        let (lev, d, sc, mins) = match self.ty {
            Some(BlockType::Q4_0) => (64, 8, 0, 0),
            _ => (QK_K, 2, 128, 16),
        };
        let part = |len: usize| r * u * len..(r + 1) * u * len;
        PackedRow {
            lev: &self.lev[part(lev)],
            d: &self.d[part(d)],
            sc: &self.sc[part(sc)],
            mins: &self.mins[part(mins)],
            units: u,
        }
    }
}

/// The activation rows of a Q4_0 call in the tiled layout (module doc),
/// in groups of [`TILE_ACTS`] rows interleaved pair by pair, so one tile's
/// activations for a pair are one run of each array (the last group is
/// padded with zero rows, whose results are dropped).
#[derive(Default)]
pub(super) struct Acts40 {
    /// Per group, pair and row: 32 low-half values, then 32 high-half ones.
    pub xq: Vec<i8>,
    /// Per group, pair and row: the eight `c8` lane sums.
    pub c: Vec<i32>,
    /// Per group, pair and row: `[dx_2k ×4, dx_2k+1 ×4]`.
    pub dx: Vec<f32>,
    /// Pairs a row.
    pub np: usize,
}

/// One group of [`TILE_ACTS`] activation rows of [`Acts40`].
#[derive(Clone, Copy)]
pub(super) struct Act40<'a> {
    pub xq: &'a [i8],
    pub c: &'a [i32],
    pub dx: &'a [f32],
}

impl Acts40 {
    /// Lays out the first `n` rows of `acts` (prepared for Q4_0, `nb` blocks).
    pub fn prepare(&mut self, acts: &Activations, n: usize, nb: usize) {
        let np = nb.div_ceil(2);
        let padded = n.next_multiple_of(TILE_ACTS);
        self.np = np;
        self.xq.clear();
        self.xq.resize(padded * np * 64, 0);
        self.c.clear();
        self.c.resize(padded * np * 8, 0);
        self.dx.clear();
        self.dx.resize(padded * np * 8, 0.0);
        for t in 0..n {
            let a = acts.row(t);
            let (xlo, xhi) = a.qs.split_at(16 * nb);
            for k in 0..np {
                let len = 16 * (nb - 2 * k).min(2);
                let at = self.at(t, k);
                let xq = &mut self.xq[64 * at..][..64];
                xq[..len].copy_from_slice(&xlo[32 * k..][..len]);
                xq[32..32 + len].copy_from_slice(&xhi[32 * k..][..len]);
                self.c[8 * at..8 * at + len / 4].copy_from_slice(&a.c8[8 * k..][..len / 4]);
                for (i, &d) in a.d[2 * k..(2 * k + 2).min(nb)].iter().enumerate() {
                    self.dx[8 * at + 4 * i..][..4].fill(d);
                }
            }
        }
    }

    /// The record of row `t`, pair `k` (in units of one row's pair).
    fn at(&self, t: usize, k: usize) -> usize {
        let (g, i) = (t / TILE_ACTS, t % TILE_ACTS);
        (g * self.np + k) * TILE_ACTS + i
    }

    /// Group `g` (rows `g·TILE_ACTS..`).
    pub fn group(&self, g: usize) -> Act40<'_> {
        let len = self.np * TILE_ACTS;
        Act40 {
            xq: &self.xq[64 * g * len..64 * (g + 1) * len],
            c: &self.c[8 * g * len..8 * (g + 1) * len],
            dx: &self.dx[8 * g * len..8 * (g + 1) * len],
        }
    }
}

/// The activation rows of a Q4_K call regrouped like [`Acts40`]: per
/// group of [`TILE_ACTS`] rows, super-block and row, the 256 values in the
/// [`ActRow`](super::scalar::ActRow) order, its `d` and its sixteen `bsums`.
#[derive(Default)]
pub(super) struct Acts4k {
    pub qs: Vec<i8>,
    pub d: Vec<f32>,
    pub bsums: Vec<i16>,
    /// Super-blocks a row.
    pub nb: usize,
}

/// One group of [`TILE_ACTS`] activation rows of [`Acts4k`].
#[derive(Clone, Copy)]
pub(super) struct Act4k<'a> {
    pub qs: &'a [i8],
    pub d: &'a [f32],
    pub bsums: &'a [i16],
}

impl Acts4k {
    /// Regroups the first `n` rows of `acts` (prepared for Q4_K, `nb`
    /// super-blocks).
    pub fn prepare(&mut self, acts: &Activations, n: usize, nb: usize) {
        let padded = n.next_multiple_of(TILE_ACTS);
        self.nb = nb;
        self.qs.clear();
        self.qs.resize(padded * nb * QK_K, 0);
        self.d.clear();
        self.d.resize(padded * nb, 0.0);
        self.bsums.clear();
        self.bsums.resize(padded * nb * 16, 0);
        for t in 0..n {
            let a = acts.row(t);
            for b in 0..nb {
                let (g, i) = (t / TILE_ACTS, t % TILE_ACTS);
                let at = (g * nb + b) * TILE_ACTS + i;
                self.qs[QK_K * at..][..QK_K].copy_from_slice(&a.qs[QK_K * b..][..QK_K]);
                self.d[at] = a.d[b];
                self.bsums[16 * at..][..16].copy_from_slice(&a.bsums[16 * b..][..16]);
            }
        }
    }

    /// Group `g` (rows `g·TILE_ACTS..`).
    pub fn group(&self, g: usize) -> Act4k<'_> {
        let len = self.nb * TILE_ACTS;
        Act4k {
            qs: &self.qs[QK_K * g * len..QK_K * (g + 1) * len],
            d: &self.d[g * len..(g + 1) * len],
            bsums: &self.bsums[16 * g * len..16 * (g + 1) * len],
        }
    }
}

/// The twin of the tiled Q4_0 dot: row `w` against row `i` of group `a`.
pub(super) fn dot_q4_0(w: &PackedRow, a: &Act40, i: usize) -> f32 {
    let mut acc = [0f32; 16];
    for k in 0..w.units {
        let at = k * TILE_ACTS + i;
        let (lev, xq) = (&w.lev[64 * k..][..64], &a.xq[64 * at..][..64]);
        for j in 0..8 {
            let from = 16 * (j / 4) + 4 * (j % 4);
            let mut p = a.c[8 * at + j];
            for l in from..from + 4 {
                p += lev[l] as i32 * xq[l] as i32 + lev[32 + l] as i32 * xq[32 + l] as i32;
            }
            let f = w.d[8 * k + j] * a.dx[8 * at + j];
            acc[8 * (k % 2) + j] += p as f32 * f;
        }
    }
    reduce16(&acc)
}

/// Where the activations chunk `c`'s low (`half = 0`) or high levels meet
/// sit in a Q4_K super-block of an [`ActRow`](super::scalar::ActRow) (its permuted layout).
pub(super) fn kmin_at(c: usize, half: usize) -> usize {
    128 * (c / 2) + 32 * (c % 2) + 64 * half
}

/// The twin of the tiled Q4_K dot: row `w` against row `i` of group `a`.
pub(super) fn dot_q4_k(w: &PackedRow, a: &Act4k, i: usize) -> f32 {
    let mut acc = KAcc::default();
    for b in 0..w.units {
        let at = b * TILE_ACTS + i;
        let (lev, x) = (&w.lev[QK_K * b..][..QK_K], &a.qs[QK_K * at..][..QK_K]);
        let mut p = 0i32;
        for c in 0..4 {
            for half in 0..2 {
                let j = 2 * c + half;
                let s = w.sc[128 * b + 16 * j] as i32;
                let (lev, x) = (&lev[32 * j..][..32], &x[kmin_at(c, half)..][..32]);
                p += (0..32)
                    .map(|l| s * lev[l] as i32 * x[l] as i32)
                    .sum::<i32>();
            }
        }
        let (m, bs) = (&w.mins[16 * b..][..16], &a.bsums[16 * at..][..16]);
        let mins: i32 = (0..16).map(|j| m[j] as i32 * bs[j] as i32).sum();
        acc.add(p, w.d[2 * b] * a.d[at], mins, w.d[2 * b + 1] * a.d[at]);
    }
    acc.result()
}
