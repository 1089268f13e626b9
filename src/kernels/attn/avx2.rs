//! AVX2 + FMA attention products: score tiles of up to 6 query rows × one
//! panel block (12 accumulators, lanes over positions) and value tiles of
//! up to 6 rows × 16 dimensions (lanes over dimensions, masked tails).

use super::{QueryRows, Weighted, BLOCK, VALUE_TILE};
use std::arch::x86_64::*;
use std::ops::Range;

/// Score tile rows.
const TILE_ROWS: usize = 6;
/// Dimensions one value tile holds (2 vectors).
const VALUE_DIMS: usize = 16;

/// [`super::scores`] on AVX2.
///
/// # Safety
/// The CPU must support AVX2 and FMA, and the bounds [`super::scores`]
/// asserts must hold.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn scores(
    rows: QueryRows,
    panel: &[f32],
    blocks: Range<usize>,
    scale: f32,
    (out, out_stride): (&mut [f32], usize),
) {
    let dim = rows.dim;
    // Blocks outermost: a block's keys stay in L1 while every row tile
    // scores them.
    for b in blocks {
        for r0 in (0..rows.offsets.len()).step_by(TILE_ROWS) {
            let r1 = (r0 + TILE_ROWS).min(rows.offsets.len());
            let mut q = [std::ptr::null::<f32>(); TILE_ROWS];
            let mut o = [std::ptr::null_mut::<f32>(); TILE_ROWS];
            for r in r0..r1 {
                q[r - r0] = rows.q[rows.offsets[r]..].as_ptr();
                o[r - r0] = out[r * out_stride + b * BLOCK..].as_mut_ptr();
            }
            let k = panel[b * BLOCK * dim..].as_ptr();
            macro_rules! pick {
                ($($r:literal),*) => {
                    match r1 - r0 {
                        $($r => tile::<$r>(&q, &o, k, dim, scale),)*
                        _ => unreachable!("tiles of 1..=6 rows"),
                    }
                };
            }
            // SAFETY: rows r0..r1 have `dim` floats at `q`, block b holds
            // `BLOCK * dim` floats from `k`, and each out row has BLOCK
            // floats from `o` (bounds asserted by `super::scores`).
            unsafe { pick!(1, 2, 3, 4, 5, 6) };
        }
    }
}

/// `R` rows × one block of scores: per dimension two panel loads and `R`
/// broadcasts feed `2R` fused chains.
///
/// # Safety
/// AVX2 and FMA; `q[r]` has `dim` floats and `o[r]` BLOCK floats for
/// `r < R`; `k` has `BLOCK * dim` floats.
#[target_feature(enable = "avx2,fma")]
unsafe fn tile<const R: usize>(
    q: &[*const f32; TILE_ROWS],
    o: &[*mut f32; TILE_ROWS],
    k: *const f32,
    dim: usize,
    scale: f32,
) {
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for d in 0..dim {
        // SAFETY: dimension d of the block lies within BLOCK * dim floats.
        let (k0, k1) = unsafe {
            (
                _mm256_loadu_ps(k.add(d * BLOCK)),
                _mm256_loadu_ps(k.add(d * BLOCK + 8)),
            )
        };
        for r in 0..R {
            // SAFETY: d < dim floats of row r.
            let qv = _mm256_set1_ps(unsafe { *q[r].add(d) });
            acc[r][0] = _mm256_fmadd_ps(qv, k0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(qv, k1, acc[r][1]);
        }
    }
    let s = _mm256_set1_ps(scale);
    for r in 0..R {
        // SAFETY: out row r holds BLOCK floats.
        unsafe {
            _mm256_storeu_ps(o[r], _mm256_mul_ps(acc[r][0], s));
            _mm256_storeu_ps(o[r].add(8), _mm256_mul_ps(acc[r][1], s));
        }
    }
}

/// Rows `rows` (≤ 6) of [`super::weighted_values`] over `positions`.
///
/// # Safety
/// AVX2 and FMA; every row's weights, values and output are in bounds
/// over `positions` (checked by `super::weighted_values`).
#[target_feature(enable = "avx2,fma")]
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
        let masks = [lane_mask(width), lane_mask(width.saturating_sub(8))];
        let span = (positions.len(), wv.v_stride);
        macro_rules! pick {
            ($($r:literal),*) => {
                match rows.len() {
                    $($r => values::<$r>(&w, &o, v.add(c0), span, &masks),)*
                    _ => unreachable!("value tiles of 1..=6 rows"),
                }
            };
        }
        // SAFETY: each row's `width` floats from `o`, its weights over the
        // positions from `w`, and each position's `width` values from
        // `v + c0` are in bounds (forwarded from the caller).
        unsafe { pick!(1, 2, 3, 4, 5, 6) };
    }
}

/// The first `lanes` (≤ 8, more are capped) of eight, as a maskload mask.
fn lane_mask(lanes: usize) -> __m256i {
    let m: [i32; 8] = std::array::from_fn(|i| if i < lanes { -1 } else { 0 });
    // SAFETY: reads eight i32 from a local array.
    unsafe { _mm256_loadu_si256(m.as_ptr().cast()) }
}

/// `R` rows × 16 dimensions: per position two value loads and `R` weight
/// broadcasts feed `2R` fused chains.
///
/// # Safety
/// AVX2 and FMA; for `r < R`, `w[r]` has `n` weights and `o[r]` the masked
/// lanes; position `p`'s masked values are at `v + p * stride`.
#[target_feature(enable = "avx2,fma")]
unsafe fn values<const R: usize>(
    w: &[*const f32; VALUE_TILE],
    o: &[*mut f32; VALUE_TILE],
    v: *const f32,
    (n, stride): (usize, usize),
    masks: &[__m256i; 2],
) {
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for r in 0..R {
        for c in 0..2 {
            // SAFETY: the masked lanes of out row r are in bounds.
            acc[r][c] = unsafe { _mm256_maskload_ps(o[r].wrapping_add(c * 8), masks[c]) };
        }
    }
    for p in 0..n {
        // SAFETY: position p's masked values are in bounds.
        let vv = unsafe {
            [
                _mm256_maskload_ps(v.add(p * stride), masks[0]),
                _mm256_maskload_ps(v.wrapping_add(p * stride + 8), masks[1]),
            ]
        };
        for r in 0..R {
            // SAFETY: row r has n weights.
            let wb = _mm256_set1_ps(unsafe { *w[r].add(p) });
            acc[r][0] = _mm256_fmadd_ps(wb, vv[0], acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(wb, vv[1], acc[r][1]);
        }
    }
    for r in 0..R {
        for c in 0..2 {
            // SAFETY: the masked lanes of out row r are in bounds.
            unsafe { _mm256_maskstore_ps(o[r].wrapping_add(c * 8), masks[c], acc[r][c]) };
        }
    }
}

/// [`super::exp_scalar`] on eight lanes, step for step.
///
/// # Safety
/// AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
unsafe fn exp8(x: __m256) -> __m256 {
    use super::{EXP_MIN, EXP_POLY, LN2_HI, LN2_LO, LOG2E};
    let xc = _mm256_max_ps(x, _mm256_set1_ps(EXP_MIN));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        xc,
        _mm256_set1_ps(LOG2E),
    ));
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), xc);
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
    let mut y = _mm256_set1_ps(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
    }
    let y = _mm256_add_ps(
        _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r),
        _mm256_set1_ps(1.0),
    );
    let e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    let scaled = _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e)));
    let under = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(EXP_MIN));
    _mm256_blendv_ps(scaled, _mm256_setzero_ps(), under)
}

/// [`super::softmax`] on AVX2: lanes 0–7 and 8–15 of the sixteen partial
/// sums in two registers.
///
/// # Safety
/// AVX2 and FMA; `x` is not empty.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn softmax(x: &mut [f32]) {
    let (n, p) = (x.len(), x.as_mut_ptr());
    let mask = |i: usize| lane_mask(n.saturating_sub(i));
    let mut max = _mm256_set1_ps(f32::NEG_INFINITY);
    for i in (0..n).step_by(8) {
        let m = mask(i);
        // SAFETY: the mask's lanes are i..min(i + 8, n), in bounds; the
        // pointer is formed with wrapping_add and read only under it.
        let v = unsafe { _mm256_maskload_ps(p.wrapping_add(i), m) };
        max = _mm256_blendv_ps(max, _mm256_max_ps(max, v), _mm256_castsi256_ps(m));
    }
    let mut lanes = [0f32; 8];
    // SAFETY: eight floats into a local array.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), max) };
    let max = _mm256_set1_ps(lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max));
    let mut sums = [_mm256_setzero_ps(); 2];
    for i in (0..n).step_by(8) {
        let m = mask(i);
        // SAFETY: as above.
        let v = unsafe { _mm256_maskload_ps(p.wrapping_add(i), m) };
        // SAFETY: AVX2 and FMA are present (this function's contract).
        let e = unsafe { exp8(_mm256_sub_ps(v, max)) };
        // SAFETY: as above.
        unsafe { _mm256_maskstore_ps(p.wrapping_add(i), m, e) };
        let s = &mut sums[(i / 8) % 2];
        *s = _mm256_blendv_ps(*s, _mm256_add_ps(*s, e), _mm256_castsi256_ps(m));
    }
    let mut lanes = [0f32; 16];
    // SAFETY: sixteen floats into a local array.
    unsafe {
        _mm256_storeu_ps(lanes.as_mut_ptr(), sums[0]);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(8), sums[1]);
    }
    let sum = _mm256_set1_ps(super::sum_lanes(lanes));
    for i in (0..n).step_by(8) {
        let m = mask(i);
        // SAFETY: as above.
        unsafe {
            let v = _mm256_maskload_ps(p.wrapping_add(i), m);
            _mm256_maskstore_ps(p.wrapping_add(i), m, _mm256_div_ps(v, sum));
        }
    }
}
