//! The grouped quantizer (docs/FORMAT.md, "Grouped formats"): round to
//! nearest with a search over each group's scale (and min), minimizing the
//! squared error weighted by an optional per-column importance (the mean
//! squared input of each column: llama.cpp's imatrix idea). The converter
//! and `--quantize-at-load` both call [`GMatrix::quantize`].
//!
//! Per group of weights `w` (importance `a`, all 1 without one): each
//! candidate `(d, m)` — the plain min–max one (`d = (max − min) / levels_max`,
//! `m = min`; symmetric: `d = absmax / 7` and `d = −v / 8` for the weight `v`
//! of largest magnitude) and [`SEARCH_STEPS`] stretched or shrunk ranges — is
//! refined once by the weighted least-squares `(d, m)` of its levels; every
//! candidate is rounded to f16, the levels requantized at the rounded values
//! (`u = clamp(round_half_even((w − m) / d), 0, levels_max)`), and the one of
//! least `Σ a·(d·u + m − w)²` is kept (the first on ties). Since the plain
//! candidate is among them, a group's RMS error is at most the plain one's:
//! `range / (2·levels_max)` plus f16 rounding (bounds in the tests).

use super::Words;
use super::ROWS_PER_TASK;
use crate::kernels::grouped::{self, dequantize_row, pack_chunk, CHUNK};
pub use crate::kernels::grouped::{GBits, GFormat, Group};
use half::f16;
use rayon::prelude::*;

/// Stretched or shrunk ranges tried beside the plain one.
pub const SEARCH_STEPS: usize = 16;

/// A grouped `(rows, cols)` matrix: packed levels and f16 parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct GMatrix {
    pub format: GFormat,
    pub rows: usize,
    pub cols: usize,
    /// `rows · format.row_bytes(cols)` bytes.
    pub data: Words<u8>,
    /// `rows · format.params_per_row(cols)` f16 bits: per row the scales,
    /// then (asymmetric) the mins.
    pub params: Words<u16>,
}

impl GMatrix {
    /// Quantizes row-major `w` `(rows, cols)`; `importance` (one
    /// non-negative weight per column) weights each column's squared error.
    pub fn quantize(
        w: &[f32],
        rows: usize,
        cols: usize,
        format: GFormat,
        importance: Option<&[f32]>,
    ) -> GMatrix {
        assert_eq!(w.len(), rows * cols, "matrix data does not match its shape");
        if let Some(a) = importance {
            assert_eq!(a.len(), cols, "one importance per column");
        }
        let (rb, pr) = (format.row_bytes(cols), format.params_per_row(cols));
        let mut data = vec![0u8; rows * rb];
        let mut params = vec![0u16; rows * pr];
        // Rows are independent: the same bytes in any order, on any thread.
        data.par_chunks_exact_mut(rb.max(1))
            .zip(params.par_chunks_exact_mut(pr.max(1)))
            .zip(w.par_chunks_exact(cols.max(1)))
            .with_min_len(ROWS_PER_TASK)
            .for_each(|((d, p), row)| quantize_row(format, row, importance, d, p));
        GMatrix {
            format,
            rows,
            cols,
            data: data.into(),
            params: params.into(),
        }
    }

    /// Checks the byte and parameter counts against the shape.
    pub fn check(&self) -> Result<(), String> {
        let f = self.format;
        let (bytes, params) = (
            self.rows * f.row_bytes(self.cols),
            self.rows * f.params_per_row(self.cols),
        );
        if self.data.len() != bytes {
            return Err(format!(
                "{} packed bytes, {f} ({}, {}) needs {bytes}",
                self.data.len(),
                self.rows,
                self.cols
            ));
        }
        if self.params.len() != params {
            return Err(format!(
                "{} group parameters, {f} ({}, {}) needs {params}",
                self.params.len(),
                self.rows,
                self.cols
            ));
        }
        Ok(())
    }

    /// The row of the first parameter that is not finite, if any.
    pub fn first_non_finite_row(&self) -> Option<usize> {
        let pr = self.format.params_per_row(self.cols).max(1);
        self.params
            .iter()
            .position(|&b| !f16::from_bits(b).is_finite())
            .map(|i| i / pr)
    }

    /// Row `r` dequantized into `out` (`cols` values).
    pub fn dequant_row(&self, r: usize, out: &mut [f32]) {
        let f = self.format;
        let (rb, pr) = (f.row_bytes(self.cols), f.params_per_row(self.cols));
        let params = &self.params[r * pr..(r + 1) * pr];
        dequantize_row(f, &self.data[r * rb..(r + 1) * rb], params, out);
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

    /// `y (n, rows) = x (n, cols) · selfᵀ` through the grouped kernels.
    pub fn matmul(&self, x: &[f32], n: usize, y: &mut [f32]) {
        let (f, p) = (self.format, &self.params);
        grouped::matmul(f, &self.data, p, self.rows, self.cols, x, n, y)
    }

    /// [`GMatrix::matmul`] of `self` and `other` against the same `x` (an
    /// MLP's gate and up): on the integer path `x` is quantized once for
    /// both where their format and columns agree. The same bits as two
    /// [`GMatrix::matmul`] calls.
    pub fn matmul_pair(&self, other: &GMatrix, x: &[f32], n: usize, y: &mut [f32], yo: &mut [f32]) {
        let same = self.format == other.format && self.cols == other.cols;
        if !same || !crate::kernels::quant::int_dot() {
            self.matmul(x, n, y);
            other.matmul(x, n, yo);
            return;
        }
        grouped::matmul_int_pair(
            self.format,
            (&self.data, &self.params, self.rows),
            (&other.data, &other.params, other.rows),
            self.cols,
            x,
            n,
            y,
            yo,
        )
    }

    /// Bytes held (levels and parameters).
    pub fn bytes(&self) -> usize {
        self.data.len() + 2 * self.params.len()
    }
}

/// Quantizes one row into its packed bytes and parameters.
fn quantize_row(
    f: GFormat,
    row: &[f32],
    importance: Option<&[f32]>,
    data: &mut [u8],
    params: &mut [u16],
) {
    let (gc, groups) = (f.group().cols(), f.groups(row.len()));
    let group_bytes = gc / CHUNK * f.chunk_bytes();
    let mut levels = vec![0u8; gc];
    for g in 0..groups {
        let cols = g * gc..((g + 1) * gc).min(row.len());
        let imp = importance.map(|a| &a[cols.clone()]);
        levels.fill(0);
        let (d, m) = quantize_group(f, &row[cols.clone()], imp, &mut levels[..cols.len()]);
        params[g] = d.to_bits();
        if f.has_min() {
            params[groups + g] = m.to_bits();
        }
        let out = &mut data[g * group_bytes..(g + 1) * group_bytes];
        for (lv, o) in levels
            .chunks_exact(CHUNK)
            .zip(out.chunks_exact_mut(f.chunk_bytes()))
        {
            pack_chunk(f.bits(), lv.try_into().expect("32 levels"), o);
        }
    }
}

/// A candidate's f16 parameters and the weighted error of its levels.
struct Fit {
    d: f16,
    m: f16,
    err: f64,
}

/// The best f16 `(scale, min)` of group `w` (see the module doc), with its
/// levels in `levels`. Symmetric int4 returns `m = −8·d`.
pub fn quantize_group(
    f: GFormat,
    w: &[f32],
    importance: Option<&[f32]>,
    levels: &mut [u8],
) -> (f16, f16) {
    let imp = |c: usize| importance.map_or(1.0, |a| a[c]);
    let top = f.bits().levels_max() as f32;
    let mut best: Option<Fit> = None;
    for (d, m) in candidates(f, w) {
        for (d, m) in [(d, m), refine(f, w, &imp, d, m, top)] {
            let fit = evaluate(f, w, &imp, d, m, top);
            if best.as_ref().is_none_or(|b| fit.err < b.err) {
                best = Some(fit);
            }
        }
    }
    let best = best.expect("at least one candidate");
    let (d, m) = (best.d.to_f32(), min_of(f, best.d, best.m));
    for (o, &v) in levels.iter_mut().zip(w) {
        *o = level(v, d, m, top);
    }
    (best.d, f16::from_f32(m))
}

/// The starting `(d, m)` of the search: the plain one first.
fn candidates(f: GFormat, w: &[f32]) -> Vec<(f32, f32)> {
    let clean = |v: f32| if v.is_finite() { v } else { 0.0 };
    let lo = w.iter().fold(f32::INFINITY, |a, &v| a.min(clean(v)));
    let hi = w.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(clean(v)));
    let steps = (0..SEARCH_STEPS).map(|k| 0.6 + 0.05 * k as f32);
    if f.has_min() {
        let top = f.bits().levels_max() as f32;
        let plain = ((hi - lo) / top, lo);
        let rest = steps.map(|s| ((hi - lo) * s / top, lo + (hi - lo) * (1.0 - s) / 2.0));
        std::iter::once(plain).chain(rest).collect()
    } else {
        let v = if hi.abs() >= lo.abs() { hi } else { lo };
        let plain = [(v.abs() / 7.0, 0.0), (-v / 8.0, 0.0)];
        let rest = steps.map(|s| (-v * s / 8.0, 0.0));
        plain.into_iter().chain(rest).collect()
    }
}

/// The stated bound on the RMS error of one quantized group `w` (without
/// importance): the plain candidate's worst case, half a step plus the f16
/// rounding of its scale and min (and f16 subnormal spacing). Asymmetric:
/// `range / (2·levels_max) + 2^-10·(range + |min|) + 1e-6`; symmetric int4:
/// `absmax / 14 + 2^-10·absmax + 1e-6`. The search only lowers the error.
pub fn rms_error_bound(f: GFormat, w: &[f32]) -> f32 {
    let lo = w.iter().fold(f32::INFINITY, |a, &v| a.min(v));
    let hi = w.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
    let fine = 1.0 / 1024.0;
    if f.has_min() {
        let range = hi - lo;
        range / (2.0 * f.bits().levels_max() as f32) + fine * (range + lo.abs()) + 1e-6
    } else {
        let amax = lo.abs().max(hi.abs());
        amax / 14.0 + fine * amax + 1e-6
    }
}

/// The min a stored pair means (symmetric: `−8·d`).
fn min_of(f: GFormat, d: f16, m: f16) -> f32 {
    if f.has_min() {
        m.to_f32()
    } else {
        -8.0 * d.to_f32()
    }
}

/// The level of `v` at `(d, m)`.
#[inline]
fn level(v: f32, d: f32, m: f32, top: f32) -> u8 {
    if d == 0.0 || !d.is_finite() {
        return 0;
    }
    // NaN maps to 0 (`as`), as the per-row quantizer does.
    ((v - m) / d).round_ties_even().clamp(0.0, top) as u8
}

/// The weighted least-squares `(d, m)` for the levels of `(d, m)`
/// (symmetric: `d` alone, `m = −8·d`); the input pair when singular.
fn refine(
    f: GFormat,
    w: &[f32],
    imp: &impl Fn(usize) -> f32,
    d: f32,
    m: f32,
    top: f32,
) -> (f32, f32) {
    let (d16, m16) = (f16::from_f32(d), f16::from_f32(m));
    let (dd, mm) = (d16.to_f32(), min_of(f, d16, m16));
    let (mut suu, mut su, mut s1, mut suw, mut sw) = (0f64, 0f64, 0f64, 0f64, 0f64);
    for (c, &v) in w.iter().enumerate() {
        let a = imp(c) as f64;
        let u = level(v, dd, mm, top) as f64 - if f.has_min() { 0.0 } else { 8.0 };
        let v = if v.is_finite() { v as f64 } else { 0.0 };
        (suu, su, s1, suw, sw) = (
            suu + a * u * u,
            su + a * u,
            s1 + a,
            suw + a * u * v,
            sw + a * v,
        );
    }
    if !f.has_min() {
        return if suu > 0.0 {
            ((suw / suu) as f32, 0.0)
        } else {
            (d, m)
        };
    }
    let det = suu * s1 - su * su;
    if det.abs() <= 1e-12 * (suu * s1).max(f64::MIN_POSITIVE) {
        return (d, m);
    }
    (
        ((suw * s1 - su * sw) / det) as f32,
        ((suu * sw - su * suw) / det) as f32,
    )
}

/// `(d, m)` rounded to f16 with its levels' weighted squared error.
fn evaluate(f: GFormat, w: &[f32], imp: &impl Fn(usize) -> f32, d: f32, m: f32, top: f32) -> Fit {
    let (d16, m16) = (f16::from_f32(d), f16::from_f32(m));
    let (dd, mm) = (d16.to_f32(), min_of(f, d16, m16));
    let err = if !dd.is_finite() || !mm.is_finite() {
        f64::INFINITY
    } else {
        w.iter().enumerate().fold(0f64, |e, (c, &v)| {
            let q = dd.mul_add(level(v, dd, mm, top) as f32, mm);
            let v = if v.is_finite() { v } else { 0.0 };
            e + imp(c) as f64 * ((q - v) as f64).powi(2)
        })
    };
    Fit {
        d: d16,
        m: m16,
        err,
    }
}

#[cfg(test)]
mod tests;
