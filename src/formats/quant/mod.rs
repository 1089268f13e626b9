//! Symmetric per-row integer quantization (SPEC §4): the one quantizer that
//! both the converter and the runtime (`--quantize-at-load`) call, so the
//! two produce identical bytes.
//!
//! A row `w` of `cols` weights gets `scale = max(absmax(w) / qmax, 1e-8)`
//! with `qmax = 2^(b-1) - 1`, and `q = round_half_even(w / scale)` clamped
//! to `[-2^(b-1), qmax]`; `w ≈ q · scale`. Packing (rows padded to whole
//! bytes, each row starting on a byte):
//! - int8: one two's-complement byte per weight;
//! - int4: `q + 8` (0..15) per nibble, even column in the low nibble, odd
//!   column in the high one; an odd row's last high nibble is 8 (q = 0);
//! - int2: `q + 2` (0..3) per 2-bit field, column `4j + k` in bits `2k..2k+1`
//!   of byte `j`; padding fields are 2 (q = 0). For experiments only.

pub mod fp8;
pub mod grouped;
pub mod importance;
pub mod kquant;
pub mod policy;
pub mod recipe;
pub mod words;

pub use words::Words;

/// Smallest per-row scale (an all-zero row quantizes to zeros, not NaN).
pub const SCALE_MIN: f32 = 1e-8;

/// Rows one parallel task of a searching quantizer ([`kquant::quantize`],
/// [`grouped::GMatrix::quantize`]) takes at least: a row's scale search is
/// tens of microseconds, and fewer rows a task would cost more in scheduling.
pub(crate) const ROWS_PER_TASK: usize = 16;

pub use crate::kernels::quant::QBits;

/// The scale of one row (see the module doc).
pub fn row_scale(row: &[f32], bits: QBits) -> f32 {
    let absmax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
    (absmax / bits.qmax() as f32).max(SCALE_MIN)
}

/// The integer of `w` at `scale`, clamped to the width's range.
#[inline]
pub fn quantize_value(w: f32, scale: f32, bits: QBits) -> i32 {
    let q = (w / scale).round_ties_even();
    // NaN weights quantize to 0 (`as` maps NaN to 0).
    (q.clamp(bits.qmin() as f32, bits.qmax() as f32)) as i32
}

/// Quantizes and packs one row into `out` (`bits.row_bytes(row.len())`
/// bytes); returns its scale.
pub fn quantize_row(row: &[f32], bits: QBits, out: &mut [u8]) -> f32 {
    let scale = row_scale(row, bits);
    pack_row(row, scale, bits, out);
    scale
}

/// The fractions of the absmax scale [`quantize_row_weighted`] rounds at:
/// 1.00 down to 0.80 in steps of 0.01, then 0.75 down to 0.10 in steps of
/// 0.05 (narrow widths, and rows with an outlier, do best well below it).
fn shrink_factors() -> impl Iterator<Item = f32> {
    let fine = (0..=20).map(|k| 1.0 - k as f32 / 100.0);
    let coarse = (0..14).map(|k| 0.75 - k as f32 * 0.05);
    fine.chain(coarse)
}

/// [`quantize_row`] minimizing the importance-weighted squared error
/// `Σ_c importance[c] · (w_c − s·q_c)²` (llama.cpp's imatrix idea): rounds
/// at each of [`shrink_factors`] times the absmax scale, and also refits
/// the scale to each rounding by weighted least squares; keeps the best. The plain absmax scale is the first
/// candidate and only a strictly smaller error replaces it, so the weighted
/// error is never above [`quantize_row`]'s. Returns the stored scale.
pub fn quantize_row_weighted(row: &[f32], importance: &[f32], bits: QBits, out: &mut [u8]) -> f32 {
    assert_eq!(row.len(), importance.len(), "one importance per column");
    let absmax_scale = row_scale(row, bits);
    let (mut best_err, mut best) = (f64::INFINITY, (absmax_scale, absmax_scale));
    for factor in shrink_factors() {
        let round_at = (absmax_scale * factor).max(SCALE_MIN);
        let (mut wq, mut qq, mut ww) = (0f64, 0f64, 0f64);
        for (&w, &imp) in row.iter().zip(importance) {
            let q = f64::from(quantize_value(w, round_at, bits));
            let (w, imp) = (f64::from(w), f64::from(imp));
            wq += imp * w * q;
            qq += imp * q * q;
            ww += imp * w * w;
        }
        let at = f64::from(round_at);
        let refit = (wq / qq) as f32;
        let refit_ok = qq > 0.0 && refit.is_finite() && refit >= SCALE_MIN;
        let unfit = (ww - 2.0 * at * wq + at * at * qq, round_at);
        let fit = (
            if refit_ok {
                ww - wq * wq / qq
            } else {
                f64::INFINITY
            },
            refit,
        );
        for (err, scale) in [unfit, fit] {
            if err < best_err {
                (best_err, best) = (err, (round_at, scale));
            }
        }
    }
    pack_row(row, best.0, bits, out);
    best.1
}

/// Packs `row` rounded at `scale` into `out` (`bits.row_bytes(row.len())`).
fn pack_row(row: &[f32], scale: f32, bits: QBits, out: &mut [u8]) {
    assert_eq!(out.len(), bits.row_bytes(row.len()), "packed row length");
    match bits {
        QBits::Int8 => {
            for (o, &w) in out.iter_mut().zip(row) {
                *o = quantize_value(w, scale, bits) as i8 as u8;
            }
        }
        QBits::Int4 | QBits::Int2 => {
            let (b, per) = (bits.bits() as usize, bits.per_byte());
            let offset = -bits.qmin();
            for (j, o) in out.iter_mut().enumerate() {
                let mut byte = 0u8;
                for k in 0..per {
                    let q = row
                        .get(j * per + k)
                        .map_or(0, |&w| quantize_value(w, scale, bits));
                    byte |= ((q + offset) as u8) << (k * b);
                }
                *o = byte;
            }
        }
    }
}

/// A quantized `(rows, cols)` matrix: packed rows and one scale per row.
#[derive(Clone, Debug, PartialEq)]
pub struct QMatrix {
    pub bits: QBits,
    pub rows: usize,
    pub cols: usize,
    /// `rows * bits.row_bytes(cols)` bytes.
    pub data: Words<u8>,
    pub scales: Words<f32>,
}

impl QMatrix {
    /// Quantizes row-major `w` `(rows, cols)`.
    pub fn quantize(w: &[f32], rows: usize, cols: usize, bits: QBits) -> QMatrix {
        QMatrix::quantize_with(w, rows, cols, bits, quantize_row)
    }

    /// [`QMatrix::quantize`] weighting each column's error by `importance`
    /// (see [`quantize_row_weighted`]).
    pub fn quantize_weighted(
        w: &[f32],
        rows: usize,
        cols: usize,
        bits: QBits,
        importance: &[f32],
    ) -> QMatrix {
        assert_eq!(importance.len(), cols, "one importance per column");
        QMatrix::quantize_with(w, rows, cols, bits, |row, bits, out| {
            quantize_row_weighted(row, importance, bits, out)
        })
    }

    /// Quantizes each row with `row_fn` (packing it, returning its scale).
    fn quantize_with(
        w: &[f32],
        rows: usize,
        cols: usize,
        bits: QBits,
        row_fn: impl Fn(&[f32], QBits, &mut [u8]) -> f32,
    ) -> QMatrix {
        assert_eq!(w.len(), rows * cols, "matrix data does not match its shape");
        let rb = bits.row_bytes(cols);
        let mut data = vec![0u8; rows * rb];
        let mut scales = vec![0f32; rows];
        if cols > 0 {
            for ((row, out), s) in w
                .chunks_exact(cols)
                .zip(data.chunks_exact_mut(rb))
                .zip(&mut scales)
            {
                *s = row_fn(row, bits, out);
            }
        }
        QMatrix {
            bits,
            rows,
            cols,
            data: data.into(),
            scales: scales.into(),
        }
    }

    /// Checks the byte and scale counts against the shape.
    pub fn check(&self) -> Result<(), String> {
        let want = self.rows * self.bits.row_bytes(self.cols);
        if self.data.len() != want {
            return Err(format!(
                "{} packed bytes, int{} ({}, {}) needs {want}",
                self.data.len(),
                self.bits.bits(),
                self.rows,
                self.cols
            ));
        }
        if self.scales.len() != self.rows {
            return Err(format!(
                "{} scales for {} rows",
                self.scales.len(),
                self.rows
            ));
        }
        Ok(())
    }

    /// Row `r` dequantized into `out` (`cols` values).
    pub fn dequant_row(&self, r: usize, out: &mut [f32]) {
        unpack_row(self.bits, self.row(r), out);
        let s = self.scales[r];
        out.iter_mut().for_each(|v| *v *= s);
    }

    /// The whole matrix dequantized, row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        if self.cols > 0 {
            for (r, o) in out.chunks_exact_mut(self.cols).enumerate() {
                self.dequant_row(r, o);
            }
        }
        out
    }

    /// `y (n, rows) = x (n, cols) · selfᵀ` through the integer kernels,
    /// which see the packed bytes and scales as slices.
    pub fn matmul(&self, x: &[f32], n: usize, y: &mut [f32]) {
        crate::kernels::quant::matmul(
            self.bits,
            &self.data,
            &self.scales,
            self.rows,
            self.cols,
            x,
            n,
            y,
        )
    }

    /// [`QMatrix::matmul`] of `self` and `other` against the same `x`
    /// (an MLP's gate and up): on the integer path `x` is quantized once
    /// for both where their packing and columns agree. The same bits as
    /// two [`QMatrix::matmul`] calls.
    pub fn matmul_pair(&self, other: &QMatrix, x: &[f32], n: usize, y: &mut [f32], yo: &mut [f32]) {
        if !crate::kernels::quant::int_dot() || self.bits != other.bits || self.cols != other.cols {
            self.matmul(x, n, y);
            other.matmul(x, n, yo);
            return;
        }
        crate::kernels::quant::matmul_int_pair(
            self.bits,
            (&self.data, &self.scales, self.rows),
            (&other.data, &other.scales, other.rows),
            self.cols,
            x,
            n,
            y,
            yo,
        )
    }

    /// The packed bytes of row `r`.
    pub fn row(&self, r: usize) -> &[u8] {
        let rb = self.bits.row_bytes(self.cols);
        &self.data[r * rb..(r + 1) * rb]
    }
}

/// The integers of one packed row, as f32 (unscaled), into `out` (`cols`).
pub fn unpack_row(bits: QBits, packed: &[u8], out: &mut [f32]) {
    assert_eq!(packed.len(), bits.row_bytes(out.len()), "packed row length");
    match bits {
        QBits::Int8 => {
            for (o, &b) in out.iter_mut().zip(packed) {
                *o = b as i8 as f32;
            }
        }
        QBits::Int4 | QBits::Int2 => {
            let (b, per) = (bits.bits() as usize, bits.per_byte());
            let mask = (1u8 << b) - 1;
            let offset = -bits.qmin();
            for (c, o) in out.iter_mut().enumerate() {
                let field = (packed[c / per] >> ((c % per) * b)) & mask;
                *o = (field as i32 - offset) as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int4_packing_follows_the_format() {
        // scale = 7/7 = 1: q = w.
        let row = [-7.0f32, 7.0, 0.0, -3.0, 2.0];
        let mut out = [0u8; 3];
        let s = quantize_row(&row, QBits::Int4, &mut out);
        assert_eq!(s, 1.0);
        // (-7+8)=1 low, (7+8)=15 high; 8 | 5<<4; 10 | pad 8<<4.
        assert_eq!(out, [0xF1, 0x58, 0x8A]);
        let mut back = [0f32; 5];
        unpack_row(QBits::Int4, &out, &mut back);
        assert_eq!(back, row);
    }

    #[test]
    fn int2_and_int8_round_trip_their_integers() {
        let row = [-1.0f32, 1.0, 0.0, -1.0, 1.0];
        let mut p2 = [0u8; 2];
        assert_eq!(quantize_row(&row, QBits::Int2, &mut p2), 1.0);
        // q+2: 1,3,2,1 -> 0b01_10_11_01; then 3 | pads 2<<2 | 2<<4 | 2<<6.
        assert_eq!(p2, [0b0110_1101, 0b1010_1011]);
        let w8: Vec<f32> = (-127..=127).map(|v| v as f32).collect();
        let mut p8 = vec![0u8; w8.len()];
        assert_eq!(quantize_row(&w8, QBits::Int8, &mut p8), 1.0);
        let mut back = vec![0f32; w8.len()];
        unpack_row(QBits::Int8, &p8, &mut back);
        assert_eq!(back, w8);
    }

    #[test]
    fn rounding_is_half_even_and_zero_rows_stay_zero() {
        // absmax 127 -> scale 1; 2.5 -> 2, 3.5 -> 4, -2.5 -> -2.
        let row = [127.0f32, 2.5, 3.5, -2.5];
        let m = QMatrix::quantize(&row, 1, 4, QBits::Int8);
        assert_eq!(*m.data, [127u8, 2, 4, (-2i8) as u8]);
        let z = QMatrix::quantize(&[0.0; 6], 2, 3, QBits::Int4);
        assert_eq!(*z.scales, [SCALE_MIN; 2]);
        assert!(z.dequantize().iter().all(|v| *v == 0.0));
    }

    /// `Σ_r Σ_c importance[c] · (w − dequantized)²`.
    fn weighted_error(w: &[f32], m: &QMatrix, importance: &[f32]) -> f64 {
        let d = m.dequantize();
        w.iter()
            .zip(&d)
            .enumerate()
            .map(|(i, (a, b))| f64::from(importance[i % m.cols]) * f64::from(a - b).powi(2))
            .sum()
    }

    #[test]
    fn importance_weighting_lowers_the_weighted_error() {
        // Heavy-tailed rows (one outlier a row) and a few columns that
        // matter a hundred times more than the rest: absmax scaling wastes
        // the grid on the outlier, the weighted search does not.
        let (rows, cols) = (16, 64);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| {
                let v = ((i * 7919 % 263) as f32 - 131.0) / 131.0;
                if i % cols == i / cols {
                    v.signum() * 6.0
                } else {
                    v
                }
            })
            .collect();
        let importance: Vec<f32> = (0..cols)
            .map(|c| if c % 8 == 3 { 100.0 } else { 1.0 })
            .collect();
        for bits in [QBits::Int2, QBits::Int4, QBits::Int8] {
            let plain = QMatrix::quantize(&w, rows, cols, bits);
            let weighted = QMatrix::quantize_weighted(&w, rows, cols, bits, &importance);
            weighted.check().unwrap();
            let (ep, ew) = (
                weighted_error(&w, &plain, &importance),
                weighted_error(&w, &weighted, &importance),
            );
            assert!(ew < 0.97 * ep, "{bits:?}: weighted {ew} vs plain {ep}");
            // The same search blind to importance (uniform weights) does
            // worse on the weighted error: the importance is what helps.
            let blind = QMatrix::quantize_weighted(&w, rows, cols, bits, &vec![1.0; cols]);
            let eb = weighted_error(&w, &blind, &importance);
            assert!(ew < eb, "{bits:?}: weighted {ew} vs blind search {eb}");
        }
    }

    #[test]
    fn uniform_importance_never_does_worse_than_absmax() {
        let (rows, cols) = (5, 33);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 31 % 97) as f32 - 48.0) / 9.0)
            .collect();
        let ones = vec![1.0; cols];
        let zeros = vec![0.0; cols];
        for bits in [QBits::Int2, QBits::Int4, QBits::Int8] {
            let plain = QMatrix::quantize(&w, rows, cols, bits);
            let weighted = QMatrix::quantize_weighted(&w, rows, cols, bits, &ones);
            assert!(weighted_error(&w, &weighted, &ones) <= weighted_error(&w, &plain, &ones));
            // Nothing to weigh by: the plain quantizer's bytes.
            let none = QMatrix::quantize_weighted(&w, rows, cols, bits, &zeros);
            assert_eq!(none, plain, "{bits:?}");
        }
    }

    #[test]
    fn dequantization_error_is_within_half_a_step() {
        let (rows, cols) = (9, 37);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 % 263) as f32 - 131.0) / 37.0)
            .collect();
        for bits in [QBits::Int2, QBits::Int4, QBits::Int8] {
            let m = QMatrix::quantize(&w, rows, cols, bits);
            m.check().unwrap();
            let d = m.dequantize();
            for r in 0..rows {
                let s = m.scales[r];
                for c in 0..cols {
                    let (a, b) = (w[r * cols + c], d[r * cols + c]);
                    assert!((a - b).abs() <= 0.5 * s * 1.0001, "{bits:?} {a} {b}");
                }
            }
        }
    }
}
