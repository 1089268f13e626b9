//! AVX-512F attention products: score tiles of up to 8 query rows × 3
//! panel blocks (24 accumulators, lanes over positions) and value tiles of
//! up to 6 rows × 64 dimensions (24 accumulators, lanes over dimensions,
//! masked tails).

use super::{QueryRows, Weighted, BLOCK, VALUE_TILE};
use std::arch::x86_64::*;
use std::ops::Range;

/// Score tile rows and blocks.
const TILE_ROWS: usize = 8;
const TILE_BLOCKS: usize = 3;
/// Dimensions one value tile holds (4 vectors).
const VALUE_DIMS: usize = 64;

/// [`super::scores`] on AVX-512F.
///
/// # Safety
/// The CPU must support AVX-512F, and the bounds [`super::scores`] asserts
/// must hold.
#[target_feature(enable = "avx512f")]
pub unsafe fn scores(
    rows: QueryRows,
    panel: &[f32],
    blocks: Range<usize>,
    scale: f32,
    (out, out_stride): (&mut [f32], usize),
) {
    let dim = rows.dim;
    // Blocks outermost: a tile step's keys stay in L1 while every row tile
    // scores them (the whole panel of a long span is larger than L2).
    let mut b = blocks.start;
    while b < blocks.end {
        let nb = (blocks.end - b).min(TILE_BLOCKS);
        for r0 in (0..rows.offsets.len()).step_by(TILE_ROWS) {
            let r1 = (r0 + TILE_ROWS).min(rows.offsets.len());
            let mut q = [std::ptr::null::<f32>(); TILE_ROWS];
            let mut o = [std::ptr::null_mut::<f32>(); TILE_ROWS];
            for r in r0..r1 {
                q[r - r0] = rows.q[rows.offsets[r]..].as_ptr();
                o[r - r0] = out[r * out_stride + b * BLOCK..].as_mut_ptr();
            }
            let k = panel[b * BLOCK * dim..].as_ptr();
            // SAFETY: rows r0..r1 have `dim` floats at `q`, the panel holds
            // blocks b..b+nb of `BLOCK * dim` floats from `k`, and each out
            // row has nb * BLOCK floats from `o` (bounds asserted by
            // `super::scores`).
            unsafe { score_tile(r1 - r0, nb, (&q, &o), k, dim, scale) };
        }
        b += nb;
    }
}

/// Picks the tile of `rows` × `blocks` (`rows` ≤ 8, `blocks` ≤ 3).
///
/// # Safety
/// As [`tile`], for the first `rows` pointers.
#[target_feature(enable = "avx512f")]
unsafe fn score_tile(
    rows: usize,
    blocks: usize,
    (q, o): (&[*const f32; TILE_ROWS], &[*mut f32; TILE_ROWS]),
    k: *const f32,
    dim: usize,
    scale: f32,
) {
    macro_rules! pick {
        ($($r:literal),*) => {
            match (rows, blocks) {
                $(($r, 1) => tile::<$r, 1>(q, o, k, dim, scale),
                  ($r, 2) => tile::<$r, 2>(q, o, k, dim, scale),
                  ($r, 3) => tile::<$r, 3>(q, o, k, dim, scale),)*
                _ => unreachable!("tiles of 1..=8 rows and 1..=3 blocks"),
            }
        };
    }
    // SAFETY: forwarded from the caller.
    unsafe { pick!(1, 2, 3, 4, 5, 6, 7, 8) }
}

/// `R` rows × `NB` blocks of scores: per dimension, `NB` panel loads and
/// `R` broadcasts feed `R · NB` fused chains.
///
/// # Safety
/// AVX-512F; `q[r]` has `dim` floats and `o[r]` `NB * BLOCK` floats for
/// `r < R`; `k` has `NB * BLOCK * dim` floats.
#[target_feature(enable = "avx512f")]
unsafe fn tile<const R: usize, const NB: usize>(
    q: &[*const f32; TILE_ROWS],
    o: &[*mut f32; TILE_ROWS],
    k: *const f32,
    dim: usize,
    scale: f32,
) {
    let mut acc = [[_mm512_setzero_ps(); NB]; R];
    for d in 0..dim {
        let mut kv = [_mm512_setzero_ps(); NB];
        for (b, kb) in kv.iter_mut().enumerate() {
            // SAFETY: block b's dimension d lies within NB * BLOCK * dim.
            *kb = unsafe { _mm512_loadu_ps(k.add((b * dim + d) * BLOCK)) };
        }
        for r in 0..R {
            // SAFETY: d < dim floats of row r.
            let qv = _mm512_set1_ps(unsafe { *q[r].add(d) });
            for b in 0..NB {
                acc[r][b] = _mm512_fmadd_ps(qv, kv[b], acc[r][b]);
            }
        }
    }
    let s = _mm512_set1_ps(scale);
    for r in 0..R {
        #[allow(clippy::needless_range_loop)] // acc is indexed [r][b]: a register tile
        for b in 0..NB {
            // SAFETY: out row r holds NB * BLOCK floats.
            unsafe { _mm512_storeu_ps(o[r].add(b * BLOCK), _mm512_mul_ps(acc[r][b], s)) };
        }
    }
}

/// Rows `rows` (≤ 6) of [`super::weighted_values`] over `positions`.
///
/// # Safety
/// AVX-512F; every row's weights, values and output are in bounds over
/// `positions` (checked by `super::weighted_values`).
#[target_feature(enable = "avx512f")]
pub unsafe fn sum_rows(
    wv: Weighted,
    rows: Range<usize>,
    positions: Range<usize>,
    (out, offsets): (&mut [f32], &[usize]),
    dim: usize,
) {
    let mut w = [std::ptr::null::<f32>(); VALUE_TILE];
    for r in rows.clone() {
        w[r - rows.start] = wv.w[r * wv.w_stride + positions.start..].as_ptr();
    }
    let v = wv.v[positions.start * wv.v_stride..].as_ptr();
    let base = out.as_mut_ptr();
    for c0 in (0..dim).step_by(VALUE_DIMS) {
        let width = (dim - c0).min(VALUE_DIMS);
        let mut o = [std::ptr::null_mut::<f32>(); VALUE_TILE];
        for r in rows.clone() {
            // SAFETY: offsets[r] + dim <= out.len() (checked), c0 < dim.
            o[r - rows.start] = unsafe { base.add(offsets[r] + c0) };
        }
        let span = (positions.len(), wv.v_stride);
        // SAFETY: each row's `width` floats from `o`, its weights over the
        // positions from `w`, and each position's `width` values from
        // `v + c0` are in bounds (forwarded from the caller).
        unsafe { value_tile(rows.len(), width, (&w, &o), v.add(c0), span) };
    }
}

/// Picks the value tile of `rows` (≤ 6) × `width` (≤ 64) dimensions.
///
/// # Safety
/// As [`values`].
#[target_feature(enable = "avx512f")]
unsafe fn value_tile(
    rows: usize,
    width: usize,
    (w, o): (&[*const f32; VALUE_TILE], &[*mut f32; VALUE_TILE]),
    v: *const f32,
    span: (usize, usize),
) {
    let masks: [__mmask16; 4] = std::array::from_fn(|i| {
        let lanes = width.saturating_sub(i * 16).min(16);
        ((1u32 << lanes) - 1) as __mmask16
    });
    let nv = width.div_ceil(16);
    macro_rules! pick {
        ($($r:literal),*) => {
            match (rows, nv) {
                $(($r, 1) => values::<$r, 1>(w, o, v, span, &masks),
                  ($r, 2) => values::<$r, 2>(w, o, v, span, &masks),
                  ($r, 3) => values::<$r, 3>(w, o, v, span, &masks),
                  ($r, 4) => values::<$r, 4>(w, o, v, span, &masks),)*
                _ => unreachable!("value tiles of 1..=6 rows and 1..=4 vectors"),
            }
        };
    }
    // SAFETY: forwarded from the caller.
    unsafe { pick!(1, 2, 3, 4, 5, 6) }
}

/// `R` rows × `NV` vectors of dimensions: per position, `NV` value loads
/// and `R` weight broadcasts feed `R · NV` fused chains.
///
/// # Safety
/// AVX-512F; for `r < R`, `w[r]` has `n` weights and `o[r]` the masked
/// lanes of `NV` vectors; position `p`'s masked values are at
/// `v + p * stride`.
#[target_feature(enable = "avx512f")]
unsafe fn values<const R: usize, const NV: usize>(
    w: &[*const f32; VALUE_TILE],
    o: &[*mut f32; VALUE_TILE],
    v: *const f32,
    (n, stride): (usize, usize),
    masks: &[__mmask16; 4],
) {
    let mut acc = [[_mm512_setzero_ps(); NV]; R];
    for r in 0..R {
        for c in 0..NV {
            // SAFETY: the masked lanes of out row r are in bounds.
            acc[r][c] = unsafe { _mm512_maskz_loadu_ps(masks[c], o[r].add(c * 16)) };
        }
    }
    for p in 0..n {
        let mut vv = [_mm512_setzero_ps(); NV];
        for (c, x) in vv.iter_mut().enumerate() {
            // SAFETY: position p's masked values are in bounds.
            *x = unsafe { _mm512_maskz_loadu_ps(masks[c], v.add(p * stride + c * 16)) };
        }
        for r in 0..R {
            // SAFETY: row r has n weights.
            let wb = _mm512_set1_ps(unsafe { *w[r].add(p) });
            for c in 0..NV {
                acc[r][c] = _mm512_fmadd_ps(wb, vv[c], acc[r][c]);
            }
        }
    }
    for r in 0..R {
        for c in 0..NV {
            // SAFETY: the masked lanes of out row r are in bounds.
            unsafe { _mm512_mask_storeu_ps(o[r].add(c * 16), masks[c], acc[r][c]) };
        }
    }
}

/// [`super::exp_scalar`] on sixteen lanes, step for step.
///
/// # Safety
/// AVX-512F.
#[target_feature(enable = "avx512f")]
unsafe fn exp16(x: __m512) -> __m512 {
    use super::{EXP_MIN, EXP_POLY, LN2_HI, LN2_LO, LOG2E};
    let xc = _mm512_max_ps(x, _mm512_set1_ps(EXP_MIN));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(xc, _mm512_set1_ps(LOG2E)),
    );
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HI), xc);
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LO), r);
    let mut y = _mm512_set1_ps(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(c));
    }
    let y = _mm512_add_ps(
        _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r),
        _mm512_set1_ps(1.0),
    );
    let e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    let scaled = _mm512_mul_ps(y, _mm512_castsi512_ps(_mm512_slli_epi32::<23>(e)));
    let under = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(EXP_MIN));
    _mm512_mask_blend_ps(under, scaled, _mm512_setzero_ps())
}

/// [`super::softmax`] on AVX-512F.
///
/// # Safety
/// AVX-512F; `x` is not empty.
#[target_feature(enable = "avx512f")]
pub unsafe fn softmax(x: &mut [f32]) {
    let (n, p) = (x.len(), x.as_mut_ptr());
    let mask = |i: usize| -> __mmask16 { ((1u32 << (n - i).min(16)) - 1) as __mmask16 };
    let mut max = _mm512_set1_ps(f32::NEG_INFINITY);
    for i in (0..n).step_by(16) {
        // SAFETY: the mask's lanes are i..min(i + 16, n), in bounds.
        let v = unsafe { _mm512_mask_loadu_ps(max, mask(i), p.add(i)) };
        max = _mm512_max_ps(max, v);
    }
    let max = _mm512_set1_ps(_mm512_reduce_max_ps(max));
    let mut sum = _mm512_setzero_ps();
    for i in (0..n).step_by(16) {
        let m = mask(i);
        // SAFETY: as above.
        let e = unsafe { exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, p.add(i)), max)) };
        // SAFETY: as above.
        unsafe { _mm512_mask_storeu_ps(p.add(i), m, e) };
        sum = _mm512_mask_add_ps(sum, m, sum, e);
    }
    let mut lanes = [0f32; 16];
    // SAFETY: sixteen floats into a local array.
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), sum) };
    let sum = _mm512_set1_ps(super::sum_lanes(lanes));
    for i in (0..n).step_by(16) {
        let m = mask(i);
        // SAFETY: as above.
        unsafe {
            let v = _mm512_maskz_loadu_ps(m, p.add(i));
            _mm512_mask_storeu_ps(p.add(i), m, _mm512_div_ps(v, sum));
        }
    }
}
