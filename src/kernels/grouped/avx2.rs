//! AVX2 grouped dots: each 32-column chunk is unpacked once into 32 levels
//! in column order (int4: one 16-byte broadcast, a per-lane shift and a
//! mask; int2: one 8-byte broadcast and shifts by 0, 2, 4, 6; int3: int2
//! plus the high bits spread by a byte shuffle and a bit test), then meets
//! each of the `T` activation rows in `maddubs` (levels ≤ 7 or 15 times
//! |x| ≤ 127: pairs ≤ 3810, no saturation) and `madd` with ones, so i32
//! lane `l` sums columns `4l..4l + 4`, as the defined order says. Each
//! group's lanes go into the f32 lanes by one `fmadd` with its scale; the
//! mins take 8 groups a vector.

use super::{ActRow, GBits, GFormat, CHUNK, LANES};
use std::arch::x86_64::*;

/// How far ahead of the group being read the dots prefetch the weights (as
/// the GGUF kernels do): with the hardware prefetchers alone the one-row
/// matmul of a 6144x2048 q4g64 matrix ran at half the speed
/// (results/kernels.md).
pub(super) const PREFETCH_AHEAD: usize = 4096;

/// The defined dot of one weight row with `T` activation rows (see
/// `grouped::dot_scalar`).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; the shapes of
/// `grouped::dot_scalar` hold (checked by the caller).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot<const T: usize>(
    f: GFormat,
    w: &[u8],
    params: &[u16],
    acts: [ActRow<'_>; T],
) -> [f32; T] {
    let (cb, per) = (f.chunk_bytes(), f.group().cols() / CHUNK);
    let groups = acts.first().map_or(0, |a| a.xs.len());
    let ones = _mm256_set1_epi16(1);
    let mut main = [_mm256_setzero_ps(); T];
    for (g, &bits) in params[..groups].iter().enumerate() {
        // A hint, never a fault, wherever it points.
        _mm_prefetch::<_MM_HINT_T0>(
            w.as_ptr()
                .wrapping_add(g * per * cb + PREFETCH_AHEAD)
                .cast(),
        );
        let d = scale(bits);
        let mut p = [_mm256_setzero_si256(); T];
        for k in g * per..(g + 1) * per {
            // SAFETY: chunk k < groups·per lies inside the row (shape checked).
            let u = unsafe { unpack(f.bits(), w.as_ptr().add(k * cb)) };
            for (p, a) in p.iter_mut().zip(&acts) {
                // SAFETY: x holds groups·per·32 bytes (shape checked).
                let x = unsafe { _mm256_loadu_si256(a.x.as_ptr().add(k * CHUNK).cast()) };
                let s = _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), ones);
                *p = _mm256_add_epi32(*p, s);
            }
        }
        for (m, p) in main.iter_mut().zip(p) {
            *m = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), *m);
        }
    }
    std::array::from_fn(|t| reduce8(main[t]) + min_term(f, params, acts[t].xs))
}

/// `out[r]` = [`dot`] of weight row `r` of `w` (`out.len()` packed rows,
/// `params` their companions, row after row) with the one activation row.
///
/// # Safety
/// As [`dot`], for every row; `w` and `params` hold `out.len()` whole rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_rows(f: GFormat, w: &[u8], params: &[u16], act: ActRow<'_>, out: &mut [f32]) {
    let (rb, pr) = (w.len() / out.len(), params.len() / out.len());
    for (r, o) in out.iter_mut().enumerate() {
        let (w, p) = (&w[r * rb..(r + 1) * rb], &params[r * pr..(r + 1) * pr]);
        // SAFETY: the caller's contract for `dot`, for row r.
        [*o] = unsafe { dot(f, w, p, [act]) };
    }
}

/// f16 bits broadcast as f32.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn scale(bits: u16) -> __m256 {
    _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// The 32 levels of the chunk at `p`, in column order.
///
/// # Safety
/// The CPU must support AVX2; `p` points at one whole chunk of `bits`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn unpack(bits: GBits, p: *const u8) -> __m256i {
    // SAFETY: a chunk is 16 (int4), 8 (int2) or 12 (int3) readable bytes.
    unsafe {
        match bits {
            GBits::Q4 => {
                let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast()));
                let v = _mm256_srlv_epi64(v, _mm256_set_epi64x(4, 4, 0, 0));
                _mm256_and_si256(v, _mm256_set1_epi8(15))
            }
            GBits::Q2 => low2(p),
            GBits::Q3 => {
                let hi = _mm256_set1_epi32(p.add(8).cast::<i32>().read_unaligned());
                let spread = _mm256_shuffle_epi8(
                    hi,
                    _mm256_set_epi64x(
                        0x0303030303030303,
                        0x0202020202020202,
                        0x0101010101010101,
                        0,
                    ),
                );
                let bit = _mm256_set1_epi64x(0x8040201008040201u64 as i64);
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
                _mm256_or_si256(low2(p), _mm256_and_si256(set, _mm256_set1_epi8(4)))
            }
        }
    }
}

/// The low two bits of 32 levels from the 8 bytes at `p`.
///
/// # Safety
/// The CPU must support AVX2; `p` has 8 readable bytes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn low2(p: *const u8) -> __m256i {
    // SAFETY: 8 readable bytes (the caller's contract).
    let v = _mm256_set1_epi64x(unsafe { p.cast::<i64>().read_unaligned() });
    let v = _mm256_srlv_epi64(v, _mm256_set_epi64x(6, 4, 2, 0));
    _mm256_and_si256(v, _mm256_set1_epi8(3))
}

/// The defined reduction of 8 lanes: `(lo + hi)`, then pairs two apart,
/// then the last two.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn reduce8(v: __m256) -> f32 {
    let q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let h = _mm_add_ps(q, _mm_movehl_ps(q, q));
    _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps::<1>(h, h)))
}

/// `grouped::min_term`, 8 groups a vector, the tail in scalar lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn min_term(f: GFormat, params: &[u16], xs: &[i32]) -> f32 {
    let groups = xs.len();
    let mins = if f.has_min() {
        &params[groups..]
    } else {
        &params[..groups]
    };
    let sym = _mm256_set1_ps(-8.0);
    let mut acc = _mm256_setzero_ps();
    let whole = groups - groups % LANES;
    for g in (0..whole).step_by(LANES) {
        // SAFETY: g + 8 <= groups: 8 f16 of `mins` and 8 i32 of `xs`.
        let (m, s) = unsafe {
            (
                _mm256_cvtph_ps(_mm_loadu_si128(mins.as_ptr().add(g).cast())),
                _mm256_cvtepi32_ps(_mm256_loadu_si256(xs.as_ptr().add(g).cast())),
            )
        };
        let m = if f.has_min() {
            m
        } else {
            _mm256_mul_ps(m, sym)
        };
        acc = _mm256_fmadd_ps(m, s, acc);
    }
    let mut lanes = [0f32; LANES];
    // SAFETY: 8 f32 of `lanes`.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
    for g in whole..groups {
        let (_, m) = super::group_params(f, params, g);
        lanes[g % LANES] = m.mul_add(xs[g] as f32, lanes[g % LANES]);
    }
    super::reduce8(lanes)
}
