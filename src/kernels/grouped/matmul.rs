//! Grouped matmul: `Y[t, r] = Σ_c w[r, c] · X[t, c]` for a grouped packed
//! matrix (`rows · f.row_bytes(cols)` bytes, `rows · f.params_per_row(cols)`
//! f16 parameters) and `n` f32 activation rows.
//!
//! On the integer path (the default, `quant::int_dot`) each activation row
//! is quantized once per call to int8 (`quant::quantize_activation`), padded
//! with zeros to whole groups, with the sum of each group; every weight row
//! then meets up to [`ACTS_PER_CALL`] activation rows per `grouped::dot`
//! call (each chunk unpacked once for all of them), and
//! `y = dot · xscale`. From `kernels::PANEL_ACTS_MIN` activation rows, int4
//! formats run on repacked panels (`tiles`: AMX tiles where the CPU has
//! them, else AVX-512 VNNI registers), with the same bits. The float path
//! dequantizes a row into a per-thread buffer and takes f32 dots
//! (`--no-int-dot`).

use super::{dot, dot_rows, group_params, unpack_chunk, ActRow, GFormat, CHUNK};
#[cfg(target_arch = "x86_64")]
use super::{tiles, GBits};
use crate::kernels::quant::{int_dot, quantize_activation};
#[cfg(target_arch = "x86_64")]
use crate::kernels::{cpu, panel512::PANEL_ROWS, par_row_blocks_aligned, PANEL_ACTS_MIN};
use crate::kernels::{f32 as kf32, par_row_blocks};
use std::cell::RefCell;

/// Activation rows one `grouped::dot` call takes (each unpacked weight chunk
/// meets all of them).
pub const ACTS_PER_CALL: usize = 4;
/// Weight rows one `grouped::dot_rows` call takes for a single activation
/// row (decode): one dispatch a block, the results on the stack.
const ROWS_PER_CALL: usize = 64;

/// `Y (n, rows) = X (n, cols) · Wᵀ` on the path `quant::int_dot` selects.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    f: GFormat,
    w: &[u8],
    params: &[u16],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) {
    if int_dot() {
        matmul_int(f, w, params, rows, cols, x, n, y)
    } else {
        matmul_float(f, w, params, rows, cols, x, n, y)
    }
}

/// The integer path of [`matmul`], whatever the switch says.
#[allow(clippy::too_many_arguments)]
pub fn matmul_int(
    f: GFormat,
    w: &[u8],
    params: &[u16],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) {
    check_shapes(f, w, params, rows, cols, x, n, y);
    ACTS.with_borrow_mut(|acts| {
        acts.prepare(f, cols, x, n);
        acts.product(f, (w, params, rows), cols, y)
    });
}

/// One grouped matrix of [`matmul_int_pair`]: `(w, params, rows)`.
pub type Packed<'a> = (&'a [u8], &'a [u16], usize);

/// [`matmul_int`] of two matrices of the same format and columns (an MLP's
/// gate and up) against the same `x`, quantized once for both: the bits
/// two [`matmul_int`] calls give.
#[allow(clippy::too_many_arguments)]
pub fn matmul_int_pair(
    f: GFormat,
    a: Packed<'_>,
    b: Packed<'_>,
    cols: usize,
    x: &[f32],
    n: usize,
    ya: &mut [f32],
    yb: &mut [f32],
) {
    check_shapes(f, a.0, a.1, a.2, cols, x, n, ya);
    check_shapes(f, b.0, b.1, b.2, cols, x, n, yb);
    ACTS.with_borrow_mut(|acts| {
        acts.prepare(f, cols, x, n);
        acts.product(f, a, cols, ya);
        acts.product(f, b, cols, yb);
    });
}

impl Acts {
    /// `y = x · wᵀ` for the prepared activations: the panels from
    /// `PANEL_ACTS_MIN` rows where [`panel_engine`] allows, else the dots.
    fn product(&self, f: GFormat, (w, params, rows): Packed<'_>, cols: usize, y: &mut [f32]) {
        let (rb, pr) = (f.row_bytes(cols), f.params_per_row(cols));
        let (acts, n) = (self, self.scale.len());
        #[cfg(target_arch = "x86_64")]
        if let Some(engine) = panel_engine(f, cols, n) {
            return acts.matmul_tiles(engine, f, w, params, rows, cols, y);
        }
        par_row_blocks(rows, cols, n, rb, y, |blk| {
            if n == 1 {
                let rs = blk.rows();
                let mut out = [0f32; ROWS_PER_CALL];
                for r0 in rs.clone().step_by(ROWS_PER_CALL) {
                    let r1 = (r0 + ROWS_PER_CALL).min(rs.end);
                    let out = &mut out[..r1 - r0];
                    let (wb, pb) = (&w[r0 * rb..r1 * rb], &params[r0 * pr..r1 * pr]);
                    dot_rows(f, wb, pb, acts.row(0), out);
                    for (r, v) in (r0..r1).zip(out.iter()) {
                        blk.set(0, r, v * acts.scale[0]);
                    }
                }
                return;
            }
            for r in blk.rows() {
                let (wr, pr) = (&w[r * rb..(r + 1) * rb], &params[r * pr..(r + 1) * pr]);
                for t0 in (0..n).step_by(ACTS_PER_CALL) {
                    let t1 = (t0 + ACTS_PER_CALL).min(n);
                    let mut out = [0f32; ACTS_PER_CALL];
                    acts.dots(f, wr, pr, t0, &mut out[..t1 - t0]);
                    for (t, v) in (t0..t1).zip(out) {
                        blk.set(t, r, v * acts.scale[t]);
                    }
                }
            }
        });
    }
}

/// The panel kernel [`matmul_int`] takes, if any: int4, enough activation
/// rows, AVX-512 VNNI, and the process-wide batch choice
/// (`kernels::set_batch_kernel`): the AMX tiles where the CPU (and
/// process) may use them, else (or with `BatchChoice::Panels`) the VNNI
/// panels; `BatchChoice::Tiles` keeps the dots.
#[cfg(target_arch = "x86_64")]
fn panel_engine(f: GFormat, cols: usize, n: usize) -> Option<tiles::Engine> {
    use crate::kernels::BatchChoice;
    if f.bits() != GBits::Q4 || cols == 0 || n < PANEL_ACTS_MIN {
        return None;
    }
    if cpu::isa() < cpu::Isa::Avx512Vnni || !super::simd_ok() {
        return None;
    }
    match crate::kernels::batch_choice() {
        BatchChoice::Tiles => None,
        BatchChoice::Panels => Some(tiles::Engine::Vnni),
        _ if cpu::amx() => Some(tiles::Engine::Amx),
        _ => Some(tiles::Engine::Vnni),
    }
}

/// The float path of [`matmul`], whatever the switch says.
#[allow(clippy::too_many_arguments)]
pub fn matmul_float(
    f: GFormat,
    w: &[u8],
    params: &[u16],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) {
    check_shapes(f, w, params, rows, cols, x, n, y);
    let (rb, pr) = (f.row_bytes(cols), f.params_per_row(cols));
    par_row_blocks(rows, cols, n, rb, y, |blk| {
        ROW_F32.with_borrow_mut(|row| {
            row.resize(cols, 0.0);
            for r in blk.rows() {
                dequantize_row(
                    f,
                    &w[r * rb..(r + 1) * rb],
                    &params[r * pr..(r + 1) * pr],
                    row,
                );
                for t in 0..n {
                    blk.set(t, r, kf32::dot(row, &x[t * cols..(t + 1) * cols]));
                }
            }
        });
    });
}

/// Packed row `w` of `cols = out.len()` columns (or of its padded length)
/// with its parameters, dequantized into `out`: `w = d·u + m` per group.
pub fn dequantize_row(f: GFormat, w: &[u8], params: &[u16], out: &mut [f32]) {
    let (cb, gc) = (f.chunk_bytes(), f.group().cols());
    assert_eq!(f.row_bytes(out.len()), w.len(), "dequantize_row: length");
    for (k, (chunk, out)) in w.chunks_exact(cb).zip(out.chunks_mut(CHUNK)).enumerate() {
        let (d, m) = group_params(f, params, k * CHUNK / gc);
        for (o, u) in out.iter_mut().zip(unpack_chunk(f.bits(), chunk)) {
            *o = d.mul_add(u as f32, m);
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn check_shapes(
    f: GFormat,
    w: &[u8],
    params: &[u16],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: &[f32],
) {
    assert_eq!(w.len(), rows * f.row_bytes(cols), "packed weight bytes");
    assert_eq!(
        params.len(),
        rows * f.params_per_row(cols),
        "group parameters"
    );
    assert_eq!(x.len(), n * cols, "activation shape");
    assert_eq!(y.len(), n * rows, "output shape");
}

thread_local! {
    /// The caller's quantized activations, reused across calls.
    static ACTS: RefCell<Acts> = RefCell::new(Acts::default());
    /// One dequantized weight row per thread (float path).
    static ROW_F32: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `n` activation rows quantized once for one product.
#[derive(Default)]
struct Acts {
    /// `(n, padded)` int8 levels, zero past `cols`.
    q: Vec<i8>,
    padded: usize,
    /// `(n, groups)` sums per group.
    xs: Vec<i32>,
    groups: usize,
    scale: Vec<f32>,
}

impl Acts {
    fn prepare(&mut self, f: GFormat, cols: usize, x: &[f32], n: usize) {
        (self.padded, self.groups) = (f.padded_cols(cols), f.groups(cols));
        self.q.clear();
        self.q.resize(n * self.padded, 0);
        self.xs.clear();
        self.scale.clear();
        let gc = f.group().cols();
        for t in 0..n {
            let q = &mut self.q[t * self.padded..(t + 1) * self.padded];
            let (s, _) = quantize_activation(&x[t * cols..(t + 1) * cols], &mut q[..cols]);
            self.scale.push(s);
            let sums = q
                .chunks_exact(gc)
                .map(|g| g.iter().map(|&v| v as i32).sum::<i32>());
            self.xs.extend(sums);
        }
    }

    fn row(&self, t: usize) -> ActRow<'_> {
        ActRow {
            x: &self.q[t * self.padded..(t + 1) * self.padded],
            xs: &self.xs[t * self.groups..(t + 1) * self.groups],
        }
    }

    /// [`matmul_int`]'s product on the panels (see [`panel_engine`]), row
    /// blocks of whole panels.
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    fn matmul_tiles(
        &self,
        engine: tiles::Engine,
        f: GFormat,
        w: &[u8],
        params: &[u16],
        rows: usize,
        cols: usize,
        y: &mut [f32],
    ) {
        let n = self.scale.len();
        let (rb, pr) = (f.row_bytes(cols), f.params_per_row(cols));
        let a = tiles::Rows {
            x: &self.q,
            stride: self.padded,
            xs: &self.xs,
            groups: self.groups,
        };
        par_row_blocks_aligned(rows, cols, n, rb, PANEL_ROWS, y, |blk| {
            let rs = blk.rows();
            let (wb, pb) = (
                &w[rs.start * rb..rs.end * rb],
                &params[rs.start * pr..rs.end * pr],
            );
            let mut out = |t: usize, r0: usize, v: &[f32]| {
                let s = self.scale[t];
                for (o, v) in blk.out_row(t)[r0..r0 + v.len()].iter_mut().zip(v) {
                    *o = v * s;
                }
            };
            // SAFETY: `panel_engine` found the CPU features (AMX usable for
            // `Engine::Amx`) and the format int4; the block holds whole rows;
            // the activations were prepared for `f` and `cols` (`padded =
            // groups · group`, `n` rows).
            unsafe { tiles::dot_block(engine, f, wb, pb, rs.len(), a, &mut out) };
        });
    }

    /// `out[k]` = the dot of weight row `w` with activation row `t0 + k`
    /// (at most [`ACTS_PER_CALL`] rows), before the activation scale.
    fn dots(&self, f: GFormat, w: &[u8], params: &[u16], t0: usize, out: &mut [f32]) {
        let a = |k: usize| self.row(t0 + k);
        match out.len() {
            1 => out.copy_from_slice(&dot(f, w, params, [a(0)])),
            2 => out.copy_from_slice(&dot(f, w, params, [a(0), a(1)])),
            3 => out.copy_from_slice(&dot(f, w, params, [a(0), a(1), a(2)])),
            _ => out.copy_from_slice(&dot(f, w, params, [a(0), a(1), a(2), a(3)])),
        }
    }
}
