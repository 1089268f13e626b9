//! AVX-512 VNNI int8 dot: `vpdpbusd` multiplies unsigned by signed bytes
//! and adds groups of four into i32 lanes without saturation. Flipping the
//! sign bit turns `w` into `w + 128` (0..255), so the kernel sums
//! `Σ (w+128)·x` and subtracts `128·Σx` once; all arithmetic wraps modulo
//! 2^32 and the true sum fits an i32, so the result is exact. The tail is
//! a masked load: masked-off lanes read `w = 0, x = 0` and add nothing.

use super::super::amx;
use super::super::panel512::{self, PanelFormat};
use super::super::tile512::{self, TileStep};
use super::PEAK_CHAINS;
use std::arch::x86_64::*;

/// `Σ w[c]·x[c]`.
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512BW and AVX-512 VNNI;
/// `w.len() == x.len()`; `xsum == Σ x[c]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn dot(w: &[u8], x: &[i8], xsum: i32) -> i32 {
    debug_assert_eq!(w.len(), x.len());
    let n = w.len();
    let (pw, px) = (w.as_ptr(), x.as_ptr());
    let flip = _mm512_set1_epi8(i8::MIN);
    let mut acc0 = _mm512_setzero_si512();
    let mut acc1 = _mm512_setzero_si512();
    let mut i = 0;
    while i + 128 <= n {
        // SAFETY: i + 128 <= n: all four 64-byte loads are in bounds.
        unsafe {
            let w0 = _mm512_xor_si512(_mm512_loadu_si512(pw.add(i).cast()), flip);
            let w1 = _mm512_xor_si512(_mm512_loadu_si512(pw.add(i + 64).cast()), flip);
            acc0 = _mm512_dpbusd_epi32(acc0, w0, _mm512_loadu_si512(px.add(i).cast()));
            acc1 = _mm512_dpbusd_epi32(acc1, w1, _mm512_loadu_si512(px.add(i + 64).cast()));
        }
        i += 128;
    }
    while i < n {
        let rest = n - i;
        let m: __mmask64 = if rest >= 64 { !0 } else { (1u64 << rest) - 1 };
        // SAFETY: the mask enables only bytes i..i+min(rest, 64) <= n; masked-off
        // bytes are not read (fault suppression) and load as 0.
        unsafe {
            let vw = _mm512_maskz_loadu_epi8(m, pw.add(i).cast());
            let vx = _mm512_maskz_loadu_epi8(m, px.add(i).cast());
            // Masked-off lanes: (0 ^ 0x80) · 0 = 0.
            acc0 = _mm512_dpbusd_epi32(acc0, _mm512_xor_si512(vw, flip), vx);
        }
        i += rest.min(64);
    }
    let biased = _mm512_reduce_add_epi32(_mm512_add_epi32(acc0, acc1));
    biased.wrapping_sub(xsum.wrapping_mul(128))
}

/// `out[k]` = [`dot`] of row `k` of `w` (`out.len()` rows of `x.len()`
/// bytes): one call for a block of rows, which go strictly one after
/// another (pairing rows to share the activation loads is 30% faster from
/// cache but two interleaved streams halve the rate from memory).
///
/// # Safety
/// As [`dot`], for every row; `w.len() == out.len() * x.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn dot_rows(w: &[u8], x: &[i8], xsum: i32, out: &mut [i32]) {
    let rb = x.len();
    debug_assert!(w.len() == out.len() * rb);
    for (k, o) in out.iter_mut().enumerate() {
        // SAFETY: the caller's contract for `dot`, for row k.
        *o = unsafe { dot(&w[k * rb..(k + 1) * rb], x, xsum) };
    }
}

/// The VNNI peak probe: `steps` rounds of `PEAK_CHAINS` independent
/// `vpdpbusd` on registers (64 multiply-adds each, no loads), returning the
/// wrapped sum of the accumulators so the work cannot be dropped.
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512 VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn dpbusd_peak(steps: usize, a: i32, b: i32) -> i32 {
    let (va, vb) = (_mm512_set1_epi32(a), _mm512_set1_epi32(b));
    let mut acc: [__m512i; PEAK_CHAINS] = std::array::from_fn(|k| _mm512_set1_epi32(k as i32));
    for _ in 0..steps {
        for a in acc.iter_mut() {
            *a = _mm512_dpbusd_epi32(*a, va, vb);
        }
    }
    let sum = acc
        .iter()
        .fold(_mm512_setzero_si512(), |s, &a| _mm512_add_epi32(s, a));
    _mm512_reduce_add_epi32(sum)
}

/// `out[t·rows + r]` = [`dot`] of weight row `r` (`cols` bytes each) with
/// activation row `t` (`stride` bytes each, zero past `cols`), for
/// `n = xsum.len()`, in the shared register tiles (`kernels::tile512`):
/// each loaded and sign-flipped weight vector feeds four `vpdpbusd`.
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512BW and AVX-512 VNNI; `stride` is a
/// multiple of 64 and at least `cols`; `x.len() == n·stride` with zeros in
/// every row past `cols`; `w.len() == rows·cols` and `out.len() == rows·n`
/// for some `rows`; `xsum[t] == Σ x[t, :]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn dot_block(
    w: &[u8],
    cols: usize,
    x: &[i8],
    stride: usize,
    xsum: &[i32],
    out: &mut [i32],
) {
    // SAFETY: the caller's contract is `tile512::dot_block`'s for this format.
    unsafe { tile512::dot_block::<Flipped>(w, cols, x, stride, xsum, out) }
}

/// int8's tile step: each signed weight byte is flipped to `w + 128`
/// (unsigned) and meets the activation of the same column.
struct Flipped;

impl TileStep for Flipped {
    const BIAS: i32 = 128;
    const X_PER_STEP: usize = 64;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn step<const R: usize, const T: usize>(
        acc: &mut [[__m512i; T]; R],
        pw: *const u8,
        row_bytes: usize,
        px: *const i8,
        stride: usize,
        i: usize,
        m: __mmask64,
    ) {
        let flip = _mm512_set1_epi8(i8::MIN);
        // SAFETY: the mask enables only bytes of row r (masked-off bytes are
        // not read and load as 0, which flips to 128 and meets a zero
        // activation past `cols`).
        let vw: [__m512i; R] = std::array::from_fn(|r| unsafe {
            let v = _mm512_maskz_loadu_epi8(m, pw.add(r * row_bytes + i).cast());
            _mm512_xor_si512(v, flip)
        });
        #[allow(clippy::needless_range_loop)] // acc is indexed [r][t]: a register tile
        for t in 0..T {
            // SAFETY: i < cols <= stride, a multiple of 64: bytes i..i + 64 lie
            // inside activation row t.
            let vx = unsafe { _mm512_loadu_si512(px.add(t * stride + i).cast()) };
            for r in 0..R {
                acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], vw[r], vx);
            }
        }
    }
}

/// [`dot_block`] for many activation rows: the weight block is flipped and
/// repacked once into panels of 16 rows (`kernels::panel512`), which then
/// meet every activation row without horizontal sums.
///
/// # Safety
/// As [`dot_block`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn dot_panels(
    w: &[u8],
    cols: usize,
    x: &[i8],
    stride: usize,
    xsum: &[i32],
    out: &mut [i32],
) {
    // SAFETY: the caller's contract is `panel512::dot_panels`'s for this format.
    unsafe { panel512::dot_panels::<Flipped>(w, cols, x, stride, xsum, out) }
}

/// [`dot_panels`] on the AMX-INT8 tiles (`kernels::amx`), which read the
/// same panels.
///
/// # Safety
/// As [`dot_block`], and the CPU must support AMX-TILE/INT8 with this
/// process holding the tile permission (`cpu::has_amx_int8`).
#[target_feature(enable = "avx512f,avx512bw")]
pub unsafe fn dot_amx(
    w: &[u8],
    cols: usize,
    x: &[i8],
    stride: usize,
    xsum: &[i32],
    out: &mut [i32],
) {
    // SAFETY: the caller's contract is `amx::dot_tiles`'s for this format.
    unsafe { amx::dot_tiles::<Flipped>(w, cols, x, stride, xsum, out) }
}

impl PanelFormat for Flipped {
    const BIAS: i32 = 128;
    const X_PER_STEP: usize = 64;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn pack_step(
        pw: *const u8,
        row_bytes: usize,
        rows: usize,
        c: usize,
        m: __mmask64,
        out: *mut __m512i,
    ) {
        let flip = _mm512_set1_epi8(i8::MIN);
        // SAFETY: the trait's contract: `m` enables only bytes of the rows.
        let t = unsafe { panel512::load_transposed(pw, row_bytes, rows, 64 * c, m) };
        for (j, v) in t.into_iter().enumerate() {
            // SAFETY: `out` has room for 16 vectors (X_PER_STEP / 4).
            unsafe { out.add(j).write(_mm512_xor_si512(v, flip)) };
        }
    }
}
