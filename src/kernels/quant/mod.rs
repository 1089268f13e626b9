//! Quantized matmul (SPEC §5): `Y[t, r] = W[r, :] · X[t, :]` for a
//! `crate::formats::quant` packed matrix (int8, int4 or int2 rows with one f32 scale
//! per row) and `n` f32 activation rows.
//!
//! Two paths, chosen by the process-wide [`set_int_dot`] switch (the CLI's
//! `--no-int-dot` turns it off):
//! - integer (default): each activation row is quantized once per call to
//!   int8 ([`quantize_activation`]: absmax/127, ties to even, never -128),
//!   each weight row meets every activation row in an exact `i32` dot
//!   ([`int8`], [`int4`], [`int2`]), and the result is scaled once:
//!   `y = (acc as f32) * scales[r] * xscale`, in exactly that order, so every
//!   ISA gives the same bits;
//! - float: the row is unpacked to its integers in a per-thread buffer and
//!   `y = scales[r] * f32::dot(row, x)`.
//!
//! Each weight row is streamed from memory once for all `n` activation rows.
//! Fewer than four activation rows (decode, short verify blocks) meet many
//! weight rows per `dot_rows` call, one activation row a pass, the rows
//! strictly one after another (memory-bound; the block stays in L2 for the
//! next pass). Batches of four or more (int8, int4; verify blocks, batched
//! serving, prefill) go to `dot_block`: a block of
//! weight rows (a few pages, a whole number of tiles, [`par_row_blocks`])
//! meets up to 16 activation rows per call in register tiles of 4 weight
//! rows × 4 activation rows, so each loaded (and, for int4, unpacked) weight
//! vector feeds four `vpdpbusd`; the activations are laid out once per call
//! for cheap aligned loads (zero-padded rows; int4: even and odd columns
//! interleaved per 64-byte step, [`int4::interleave`]).
//! Error of the integer path against the float product on the dequantized
//! weights: only the activation is rounded, by at most `xscale / 2` per
//! column, so `|y_int − y| ≤ ½ · scales[r] · xscale · Σ_c |q[r, c]|` (plus
//! f32 rounding of the final products); against the original f32 weights
//! add the weight rounding, `½ · scales[r] · Σ_c |x[c]|`.

use super::cpu::{isa, Isa};
use super::{
    f32 as kf32, int2, int4, int8, par_row_blocks, par_row_blocks_aligned, PANEL_ACTS_MIN,
};
use std::cell::RefCell;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

/// An integer width of a packed matrix (the container's int8, int4, int2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QBits {
    Int2,
    Int4,
    Int8,
}

impl QBits {
    /// Bits per weight.
    pub fn bits(self) -> u32 {
        match self {
            QBits::Int2 => 2,
            QBits::Int4 => 4,
            QBits::Int8 => 8,
        }
    }

    /// The width of `bits`, if the container has one.
    pub fn from_bits(bits: u32) -> Option<QBits> {
        match bits {
            2 => Some(QBits::Int2),
            4 => Some(QBits::Int4),
            8 => Some(QBits::Int8),
            _ => None,
        }
    }

    /// Largest stored value, `2^(b-1) - 1`.
    pub fn qmax(self) -> i32 {
        (1 << (self.bits() - 1)) - 1
    }

    /// Smallest stored value, `-2^(b-1)`.
    pub fn qmin(self) -> i32 {
        -(1 << (self.bits() - 1))
    }

    /// Weights per byte.
    pub fn per_byte(self) -> usize {
        (8 / self.bits()) as usize
    }

    /// Bytes of one packed row of `cols` weights.
    pub fn row_bytes(self, cols: usize) -> usize {
        cols.div_ceil(self.per_byte())
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(test)]
mod tests;

/// Longest row the integer path accepts: its exact sums fit an `i32`.
pub const COLS_MAX: usize = int8::COLS_MAX;
/// Weight rows one `dot_rows` or `dot_block` call covers (its results live
/// on the stack).
const ROWS_PER_CALL: usize = 64;
/// Activation rows one `dot_block` call covers.
const ACTS_PER_CALL: usize = 16;
/// Most activation rows one panel `dot_block` call covers: the weights'
/// repack is paid once per this many rows, and the thread's accumulator
/// stays `ROWS_PER_CALL × 256` sums however long the batch.
const PANEL_ACTS_PER_CALL: usize = 256;
/// Row blocks are whole multiples of this many rows: the 4-row register
/// tiles and the 32-row panel pairs of `dot_block` (`kernels::panel512`).
const BLOCK_ROWS_MULTIPLE: usize = 32;

/// Fewest activation rows that take the tiled `dot_block` path. Below it
/// the weights stream at memory bandwidth one activation row a pass (the
/// block stays in L2 for the next pass), which measured faster than
/// streaming four weight rows at once: int8 6144x2048 n = 2 took 452–476 µs
/// by rows against 643–670 µs tiled (results/kernels.md).
const BATCH_ROWS_MIN: usize = 4;

static INT_DOT: AtomicBool = AtomicBool::new(true);

/// Selects the integer path (`true`, the default) or the float path for
/// every later [`matmul`] in the process.
pub fn set_int_dot(on: bool) {
    INT_DOT.store(on, Ordering::Relaxed);
}

/// Whether [`matmul`] takes the integer path.
pub fn int_dot() -> bool {
    INT_DOT.load(Ordering::Relaxed)
}

/// Quantizes an activation row to int8: `scale = absmax(x) / 127`,
/// `q = round_ties_even(x / scale)` clamped to `[-127, 127]` (never -128,
/// which the AVX2 sign trick could not negate). An all-zero row gives scale
/// 0 and all-zero `q`; NaN entries quantize to 0 and do not count toward the
/// absmax. Returns `(scale, Σ q)`. Dispatched: AVX-512 where available, else
/// [`quantize_activation_scalar`] (bit-identical).
pub fn quantize_activation(x: &[f32], q: &mut [i8]) -> (f32, i32) {
    assert_eq!(x.len(), q.len(), "activation length");
    #[cfg(target_arch = "x86_64")]
    if isa() >= Isa::Avx512 {
        // SAFETY: `isa()` reported AVX-512F/BW; equal lengths (asserted).
        return unsafe { avx512::quantize_activation(x, q) };
    }
    quantize_activation_scalar(x, q)
}

/// The scalar twin of [`quantize_activation`].
pub fn quantize_activation_scalar(x: &[f32], q: &mut [i8]) -> (f32, i32) {
    assert_eq!(x.len(), q.len(), "activation length");
    let absmax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    if absmax == 0.0 {
        q.fill(0);
        return (0.0, 0);
    }
    let scale = absmax / 127.0;
    let mut sum = 0i32;
    for (o, &v) in q.iter_mut().zip(x) {
        let r = round_ties_even_small((v / scale).clamp(-127.0, 127.0)) as i8;
        sum += r as i32;
        *o = r;
    }
    (scale, sum)
}

/// `v.round_ties_even()` for `|v| ≤ 2^22` (and NaN → NaN) in two adds:
/// `v + 1.5·2^23` lands where the f32 spacing is 1, so the hardware's
/// round-to-nearest-even does the rounding, and the constant is even, so
/// ties keep their parity. Without SSE4.1 in the baseline target,
/// `round_ties_even` is a library call per element.
#[inline]
fn round_ties_even_small(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2^23
    (v + MAGIC) - MAGIC
}

/// `y[r] = W[r, :] · x` (see [`matmul`]).
#[allow(clippy::too_many_arguments)]
pub fn matvec(
    bits: QBits,
    w: &[u8],
    scales: &[f32],
    rows: usize,
    cols: usize,
    x: &[f32],
    y: &mut [f32],
) {
    matmul(bits, w, scales, rows, cols, x, 1, y)
}

/// `Y[t, r] = scales[r] · Σ_c q[r, c] · X[t, c]` for packed `w`
/// (`rows · bits.row_bytes(cols)` bytes), `X (n, cols)` and `Y (n, rows)`,
/// on the path [`int_dot`] selects.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    bits: QBits,
    w: &[u8],
    scales: &[f32],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) {
    if int_dot() {
        matmul_int(bits, w, scales, rows, cols, x, n, y)
    } else {
        matmul_float(bits, w, scales, rows, cols, x, n, y)
    }
}

/// The integer path of [`matmul`], whatever the switch says.
#[allow(clippy::too_many_arguments)]
pub fn matmul_int(
    bits: QBits,
    w: &[u8],
    scales: &[f32],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) {
    check_shapes(bits, w, scales, rows, cols, x, n, y);
    assert!(
        cols <= COLS_MAX,
        "{cols} columns: the integer dot allows {COLS_MAX}"
    );
    ACTS.with_borrow_mut(|acts| {
        let batched = n >= BATCH_ROWS_MIN && bits != QBits::Int2;
        acts.prepare(bits, cols, x, n, batched);
        if batched {
            matmul_batched(bits, w, scales, rows, acts, y)
        } else {
            matmul_by_act_row(bits, w, scales, rows, acts, y)
        }
    });
}

/// One packed matrix of [`matmul_int_pair`]: `(w, scales, rows)`.
pub type Packed<'a> = (&'a [u8], &'a [f32], usize);

/// [`matmul_int`] of two matrices of the same packing and columns (an
/// MLP's gate and up) against the same `x`, which is quantized once for
/// both: `ya = x · aᵀ`, `yb = x · bᵀ`, each the bits [`matmul_int`] gives.
#[allow(clippy::too_many_arguments)]
pub fn matmul_int_pair(
    bits: QBits,
    a: Packed<'_>,
    b: Packed<'_>,
    cols: usize,
    x: &[f32],
    n: usize,
    ya: &mut [f32],
    yb: &mut [f32],
) {
    check_shapes(bits, a.0, a.1, a.2, cols, x, n, ya);
    check_shapes(bits, b.0, b.1, b.2, cols, x, n, yb);
    assert!(
        cols <= COLS_MAX,
        "{cols} columns: the integer dot allows {COLS_MAX}"
    );
    ACTS.with_borrow_mut(|acts| {
        let batched = n >= BATCH_ROWS_MIN && bits != QBits::Int2;
        acts.prepare(bits, cols, x, n, batched);
        for ((w, scales, rows), y) in [(a, ya), (b, yb)] {
            if batched {
                matmul_batched(bits, w, scales, rows, acts, y)
            } else {
                matmul_by_act_row(bits, w, scales, rows, acts, y)
            }
        }
    });
}

/// One activation row at a time against many weight rows a call: decode
/// and batches under [`BATCH_ROWS_MIN`] (memory-bound: the rows go strictly
/// one after another), and int2.
fn matmul_by_act_row(
    bits: QBits,
    w: &[u8],
    scales: &[f32],
    rows: usize,
    acts: &Acts,
    y: &mut [f32],
) {
    let (cols, n) = (acts.cols, acts.scale.len());
    let rb = bits.row_bytes(cols);
    par_row_blocks(rows, cols, n, rb, y, |blk| {
        let rs = blk.rows();
        let mut acc = [0i32; ROWS_PER_CALL];
        for t in 0..n {
            for r0 in rs.clone().step_by(ROWS_PER_CALL) {
                let r1 = (r0 + ROWS_PER_CALL).min(rs.end);
                let acc = &mut acc[..r1 - r0];
                acts.dot_rows(bits, &w[r0 * rb..r1 * rb], t, acc);
                for (r, a) in (r0..r1).zip(acc.iter()) {
                    blk.set(t, r, *a as f32 * scales[r] * acts.scale[t]);
                }
            }
        }
    });
}

/// Batches (int8, int4): each block of weight rows (a few pages, a whole
/// number of tiles) meets up to [`ACTS_PER_CALL`] activation rows per
/// `dot_block` call, which works in register tiles of weight rows ×
/// activation rows; the block stays in L2 across the calls. From
/// [`PANEL_ACTS_MIN`] rows on (prefill) one call takes every activation
/// row (up to [`PANEL_ACTS_PER_CALL`]), so the call's repack of the weights
/// into panels is paid once per that many rows.
fn matmul_batched(bits: QBits, w: &[u8], scales: &[f32], rows: usize, acts: &Acts, y: &mut [f32]) {
    let (cols, n) = (acts.cols, acts.scale.len());
    let rb = bits.row_bytes(cols);
    let per_call = if n >= PANEL_ACTS_MIN {
        n.min(PANEL_ACTS_PER_CALL)
    } else {
        ACTS_PER_CALL
    };
    par_row_blocks_aligned(rows, cols, n, rb, BLOCK_ROWS_MULTIPLE, y, |blk| {
        let rs = blk.rows();
        BLOCK_ACC.with_borrow_mut(|acc| {
            acc.resize(ROWS_PER_CALL * per_call, 0);
            for r0 in rs.clone().step_by(ROWS_PER_CALL) {
                let r1 = (r0 + ROWS_PER_CALL).min(rs.end);
                for t0 in (0..n).step_by(per_call) {
                    let t1 = (t0 + per_call).min(n);
                    let acc = &mut acc[..(r1 - r0) * (t1 - t0)];
                    acts.dot_block(bits, &w[r0 * rb..r1 * rb], t0..t1, acc);
                    for (t, a) in (t0..t1).zip(acc.chunks_exact(r1 - r0)) {
                        let y = &mut blk.out_row(t)[r0 - rs.start..r1 - rs.start];
                        scale_sums(a, &scales[r0..r1], acts.scale[t], y);
                    }
                }
            }
        });
    });
}

/// `y[r] = a[r] as f32 * s[r] * xs`: integer sums to outputs, in exactly
/// that order (every ISA gives the same bits). Dispatched: AVX-512 where
/// available, else [`scale_sums_scalar`].
pub fn scale_sums(a: &[i32], s: &[f32], xs: f32, y: &mut [f32]) {
    assert!(
        a.len() == y.len() && s.len() == y.len(),
        "scale_sums: lengths"
    );
    #[cfg(target_arch = "x86_64")]
    if isa() >= Isa::Avx512 {
        // SAFETY: `isa()` reported AVX-512F; equal lengths (asserted).
        return unsafe { avx512::scale_sums(a, s, xs, y) };
    }
    scale_sums_scalar(a, s, xs, y)
}

/// The scalar twin of [`scale_sums`].
pub fn scale_sums_scalar(a: &[i32], s: &[f32], xs: f32, y: &mut [f32]) {
    assert!(
        a.len() == y.len() && s.len() == y.len(),
        "scale_sums: lengths"
    );
    for ((y, &a), &s) in y.iter_mut().zip(a).zip(s) {
        *y = a as f32 * s * xs;
    }
}

/// The float path of [`matmul`], whatever the switch says.
#[allow(clippy::too_many_arguments)]
pub fn matmul_float(
    bits: QBits,
    w: &[u8],
    scales: &[f32],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) {
    check_shapes(bits, w, scales, rows, cols, x, n, y);
    let rb = bits.row_bytes(cols);
    par_row_blocks(rows, cols, n, rb, y, |blk| {
        ROW_F32.with_borrow_mut(|row| {
            row.resize(cols, 0.0);
            for r in blk.rows() {
                unpack_ints(bits, &w[r * rb..(r + 1) * rb], row);
                for t in 0..n {
                    let v = scales[r] * kf32::dot(row, &x[t * cols..(t + 1) * cols]);
                    blk.set(t, r, v);
                }
            }
        });
    });
}

/// The integers of one packed row as f32, into `out` (`cols` values): the
/// same values as `crate::formats::quant::unpack_row`, a byte at a time instead of a
/// division per column.
pub fn unpack_ints(bits: QBits, packed: &[u8], out: &mut [f32]) {
    assert_eq!(packed.len(), bits.row_bytes(out.len()), "packed row length");
    match bits {
        QBits::Int8 => {
            for (o, &b) in out.iter_mut().zip(packed) {
                *o = b as i8 as f32;
            }
        }
        QBits::Int4 => {
            unpack_fields::<2>(packed, out, |b| [(b & 15) as i32 - 8, (b >> 4) as i32 - 8])
        }
        QBits::Int2 => unpack_fields::<4>(packed, out, |b| {
            std::array::from_fn(|k| ((b >> (2 * k)) & 3) as i32 - 2)
        }),
    }
}

/// `PER` fields a byte: whole bytes, then the partial last one.
#[inline]
fn unpack_fields<const PER: usize>(packed: &[u8], out: &mut [f32], f: impl Fn(u8) -> [i32; PER]) {
    let whole = out.len() / PER;
    let mut outs = out.chunks_exact_mut(PER);
    for (o, &b) in (&mut outs).zip(packed) {
        for (o, q) in o.iter_mut().zip(f(b)) {
            *o = q as f32;
        }
    }
    let rest = outs.into_remainder();
    if let Some(&b) = packed.get(whole) {
        for (o, q) in rest.iter_mut().zip(f(b)) {
            *o = q as f32;
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn check_shapes(
    bits: QBits,
    w: &[u8],
    scales: &[f32],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: &[f32],
) {
    assert_eq!(w.len(), rows * bits.row_bytes(cols), "packed weight bytes");
    assert_eq!(scales.len(), rows, "one scale per row");
    assert_eq!(x.len(), n * cols, "activation shape");
    assert_eq!(y.len(), n * rows, "output shape");
}

thread_local! {
    /// The caller's quantized activations, reused across calls.
    static ACTS: RefCell<Acts> = RefCell::new(Acts::default());
    /// One unpacked weight row per thread (float path).
    static ROW_F32: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// One `dot_block` call's integer sums per thread (batched path).
    static BLOCK_ACC: RefCell<Vec<i32>> = const { RefCell::new(Vec::new()) };
}

/// `n` activation rows quantized once for one product.
#[derive(Default)]
struct Acts {
    cols: usize,
    /// `(n, stride)` int8 activations in column order, zero past `cols`
    /// (int8, int2).
    q: Aligned64,
    /// Bytes per row of `q`: `cols` in whole 64-byte steps.
    stride: usize,
    /// `(n, 2, half)` even then odd columns of each row (int4, one row).
    split: Vec<i8>,
    /// `(n, istride)` rows laid out by [`int4::interleave`] (int4, batches).
    inter: Aligned64,
    istride: usize,
    scale: Vec<f32>,
    sum: Vec<i32>,
}

impl Acts {
    /// Quantizes the `n` rows of `x` and lays them out for `bits`, batched
    /// or one row at a time.
    fn prepare(&mut self, bits: QBits, cols: usize, x: &[f32], n: usize, batched: bool) {
        self.cols = cols;
        self.stride = int8::padded_len(cols);
        let stride = self.stride;
        let q = self.q.reset(n * stride);
        self.scale.clear();
        self.sum.clear();
        for t in 0..n {
            let (q, pad) = q[t * stride..(t + 1) * stride].split_at_mut(cols);
            let (s, sum) = quantize_activation(&x[t * cols..(t + 1) * cols], q);
            pad.fill(0);
            self.scale.push(s);
            self.sum.push(sum);
        }
        match (bits, batched) {
            (QBits::Int4, false) => self.prepare_split(n),
            (QBits::Int4, true) => self.prepare_interleaved(n),
            _ => {}
        }
    }

    /// `split` from `q`.
    fn prepare_split(&mut self, n: usize) {
        let (cols, half) = (self.cols, self.cols.div_ceil(2));
        self.split.resize(n * 2 * half, 0);
        for t in 0..n {
            let q = &self.q.get()[t * self.stride..][..cols];
            let (even, odd) = self.split[t * 2 * half..(t + 1) * 2 * half].split_at_mut(half);
            int4::split(q, even, odd);
        }
    }

    /// `inter` from `q`.
    fn prepare_interleaved(&mut self, n: usize) {
        let cols = self.cols;
        self.istride = int4::interleaved_len(cols);
        let inter = self.inter.reset(n * self.istride);
        for t in 0..n {
            let q = &self.q.get()[t * self.stride..][..cols];
            int4::interleave(q, &mut inter[t * self.istride..(t + 1) * self.istride]);
        }
    }

    /// Activation row `t` of `q`.
    #[inline]
    fn q_row(&self, t: usize) -> &[i8] {
        &self.q.get()[t * self.stride..][..self.cols]
    }

    /// The exact integer dot of packed row `w` with activation row `t`.
    #[inline]
    fn dot(&self, bits: QBits, w: &[u8], t: usize) -> i32 {
        match bits {
            QBits::Int8 => int8::dot(w, self.q_row(t), self.sum[t]),
            QBits::Int4 => {
                let (even, odd) = self.split_row(t);
                int4::dot(w, even, odd, self.sum[t])
            }
            QBits::Int2 => int2::dot_scalar(w, self.q_row(t)),
        }
    }

    /// The even and odd halves of activation row `t` (int4, one row).
    #[inline]
    fn split_row(&self, t: usize) -> (&[i8], &[i8]) {
        let half = self.cols.div_ceil(2);
        self.split[t * 2 * half..(t + 1) * 2 * half].split_at(half)
    }

    /// [`Acts::dot`] of each `rb`-byte row of `w` with activation row `t`.
    #[inline]
    fn dot_rows(&self, bits: QBits, w: &[u8], t: usize, out: &mut [i32]) {
        match bits {
            QBits::Int8 => int8::dot_rows(w, self.q_row(t), self.sum[t], out),
            QBits::Int4 => {
                let (even, odd) = self.split_row(t);
                int4::dot_rows(w, even, odd, self.sum[t], out)
            }
            QBits::Int2 => {
                let rb = bits.row_bytes(self.cols);
                for (k, o) in out.iter_mut().enumerate() {
                    *o = self.dot(bits, &w[k * rb..(k + 1) * rb], t);
                }
            }
        }
    }

    /// `out[k·rows + r]` = [`Acts::dot`] of weight row `r` of `w` with
    /// activation row `ts.start + k` (int8, int4 batches).
    #[inline]
    fn dot_block(&self, bits: QBits, w: &[u8], ts: Range<usize>, out: &mut [i32]) {
        let xsum = &self.sum[ts.clone()];
        match bits {
            QBits::Int8 => {
                let x = &self.q.get()[ts.start * self.stride..ts.end * self.stride];
                int8::dot_block(w, self.cols, x, self.stride, xsum, out)
            }
            QBits::Int4 => {
                let x = &self.inter.get()[ts.start * self.istride..ts.end * self.istride];
                let rb = bits.row_bytes(self.cols);
                int4::dot_block(w, rb, x, self.istride, xsum, out)
            }
            QBits::Int2 => unreachable!("int2 runs one activation row at a time"),
        }
    }
}

/// A reusable byte buffer whose contents start on a 64-byte boundary, so
/// the kernels' 64-byte activation loads never straddle cache lines.
#[derive(Default)]
struct Aligned64 {
    buf: Vec<i8>,
    start: usize,
    len: usize,
}

impl Aligned64 {
    /// Resizes to `len` bytes (contents unspecified) and returns them.
    fn reset(&mut self, len: usize) -> &mut [i8] {
        if self.buf.len() < len + 63 {
            self.buf = vec![0; len + 63];
        }
        self.start = self.buf.as_ptr().align_offset(64).min(63);
        self.len = len;
        &mut self.buf[self.start..self.start + len]
    }

    fn get(&self) -> &[i8] {
        &self.buf[self.start..self.start + self.len]
    }
}
