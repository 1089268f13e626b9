//! AVX-512 VNNI int4 dot over a split activation row: per 64 weight bytes
//! (128 columns), the low and high nibbles go through `vpdpbusd` against the
//! even and odd activations (u4 × i8, groups of four into i32, no
//! saturation); `8·Σx` is subtracted once. The tail is a masked load:
//! masked-off weight bytes read 0 and add nothing.

use super::super::amx;
use super::super::panel512::{self, PanelFormat};
use super::super::tile512::{self, TileStep};
use std::arch::x86_64::*;

/// `Σ q[c]·x[c]` with `q = nibble − 8`.
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512BW and AVX-512 VNNI; `w`, `even`
/// and `odd` have equal lengths; `xsum == Σ even + Σ odd`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn dot(w: &[u8], even: &[i8], odd: &[i8], xsum: i32) -> i32 {
    debug_assert!(w.len() == even.len() && w.len() == odd.len());
    let n = w.len();
    let (pw, pe, po) = (w.as_ptr(), even.as_ptr(), odd.as_ptr());
    let nib = _mm512_set1_epi8(15);
    let mut acc = [_mm512_setzero_si512(); 4];
    let mut i = 0;
    while i + 128 <= n {
        for k in 0..2 {
            let j = i + 64 * k;
            // SAFETY: j + 64 <= i + 128 <= n: the three 64-byte loads are in bounds.
            let (vw, ve, vo) = unsafe { load3(pw.add(j), pe.add(j), po.add(j)) };
            (acc[2 * k], acc[2 * k + 1]) = block(acc[2 * k], acc[2 * k + 1], vw, ve, vo, nib);
        }
        i += 128;
    }
    if i + 64 <= n {
        // SAFETY: i + 64 <= n: the three 64-byte loads are in bounds.
        let (vw, ve, vo) = unsafe { load3(pw.add(i), pe.add(i), po.add(i)) };
        (acc[0], acc[1]) = block(acc[0], acc[1], vw, ve, vo, nib);
        i += 64;
    }
    if i < n {
        let m: __mmask64 = (1u64 << (n - i)) - 1;
        // SAFETY: n - i < 64; the mask enables only bytes i..n; masked-off bytes
        // are not read (fault suppression) and load as 0, so they add nothing.
        let (vw, ve, vo) = unsafe {
            (
                _mm512_maskz_loadu_epi8(m, pw.add(i).cast()),
                _mm512_maskz_loadu_epi8(m, pe.add(i).cast()),
                _mm512_maskz_loadu_epi8(m, po.add(i).cast()),
            )
        };
        (acc[2], acc[3]) = block(acc[2], acc[3], vw, ve, vo, nib);
    }
    let sum = _mm512_add_epi32(
        _mm512_add_epi32(acc[0], acc[1]),
        _mm512_add_epi32(acc[2], acc[3]),
    );
    _mm512_reduce_add_epi32(sum).wrapping_sub(xsum.wrapping_mul(8))
}

/// 64 bytes from each of the three pointers.
///
/// # Safety
/// The CPU must support AVX-512F; each pointer must have 64 readable bytes.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load3(w: *const u8, e: *const i8, o: *const i8) -> (__m512i, __m512i, __m512i) {
    // SAFETY: the caller guarantees 64 readable bytes behind each pointer.
    unsafe {
        (
            _mm512_loadu_si512(w.cast()),
            _mm512_loadu_si512(e.cast()),
            _mm512_loadu_si512(o.cast()),
        )
    }
}

/// Adds one 64-byte block's `Σ lo·even` to `a` and `Σ hi·odd` to `b`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn block(
    a: __m512i,
    b: __m512i,
    vw: __m512i,
    ve: __m512i,
    vo: __m512i,
    nib: __m512i,
) -> (__m512i, __m512i) {
    let lo = _mm512_and_si512(vw, nib);
    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(vw), nib);
    (
        _mm512_dpbusd_epi32(a, lo, ve),
        _mm512_dpbusd_epi32(b, hi, vo),
    )
}

/// `even[j] = x[2j]`, `odd[j] = x[2j+1]` (0 past the end): 64 activations
/// per step as 32 16-bit lanes, low bytes to `even`, high bytes to `odd`;
/// scalar tail.
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512BW;
/// `even.len() == odd.len() == x.len().div_ceil(2)`.
#[target_feature(enable = "avx512f,avx512bw")]
pub unsafe fn split(x: &[i8], even: &mut [i8], odd: &mut [i8]) {
    let n = x.len();
    debug_assert!(even.len() == n.div_ceil(2) && odd.len() == n.div_ceil(2));
    let mut i = 0;
    while i + 64 <= n {
        // SAFETY: i + 64 <= n bytes of `x`; i/2 + 32 <= n/2 bytes of each half.
        unsafe {
            let v = _mm512_loadu_si512(x.as_ptr().add(i).cast());
            let e = _mm512_cvtepi16_epi8(v);
            let o = _mm512_cvtepi16_epi8(_mm512_srli_epi16::<8>(v));
            _mm256_storeu_si256(even.as_mut_ptr().add(i / 2).cast(), e);
            _mm256_storeu_si256(odd.as_mut_ptr().add(i / 2).cast(), o);
        }
        i += 64;
    }
    super::split_scalar(&x[i..], &mut even[i / 2..], &mut odd[i / 2..]);
}

/// `out[k]` = [`dot`] of row `k` of `w` (`out.len()` rows of `even.len()`
/// bytes): one call for a block of rows, which go strictly one after
/// another (pairing rows to share the activation loads is 30% faster from
/// cache but two interleaved streams halve the rate from memory).
///
/// # Safety
/// As [`dot`], for every row; `w.len() == out.len() * even.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn dot_rows(w: &[u8], even: &[i8], odd: &[i8], xsum: i32, out: &mut [i32]) {
    let rb = even.len();
    debug_assert!(odd.len() == rb && w.len() == out.len() * rb);
    for (k, o) in out.iter_mut().enumerate() {
        // SAFETY: the caller's contract for `dot`, for row k.
        *o = unsafe { dot(&w[k * rb..(k + 1) * rb], even, odd, xsum) };
    }
}

/// `out[t·rows + r]` = [`dot`] of weight row `r` (`row_bytes` bytes each)
/// with interleaved activation row `t` (`stride` bytes each, see
/// `int4::interleave`), for `n = xsum.len()`, in the shared register tiles
/// (`kernels::tile512`): each weight vector is unpacked once for four
/// activation rows (8 `vpdpbusd`).
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512BW and AVX-512 VNNI; `stride` is a
/// multiple of 128 and at least `2·row_bytes`; `x.len() == n·stride`, each
/// row laid out by `int4::interleave` with zeros past its columns;
/// `w.len() == rows·row_bytes` and `out.len() == rows·n` for some `rows`;
/// `xsum[t] == Σ x[t, :]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn dot_block(
    w: &[u8],
    row_bytes: usize,
    x: &[i8],
    stride: usize,
    xsum: &[i32],
    out: &mut [i32],
) {
    // SAFETY: the caller's contract is `tile512::dot_block`'s for this format.
    unsafe { tile512::dot_block::<Nibbles>(w, row_bytes, x, stride, xsum, out) }
}

/// int4's tile step: each weight byte holds column `2k` in its low nibble and
/// `2k + 1` in its high one, stored as `u = q + 8`; each 64-byte step meets
/// 64 even then 64 odd activations.
struct Nibbles;

impl TileStep for Nibbles {
    const BIAS: i32 = 8;
    const X_PER_STEP: usize = 128;

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
        let nib = _mm512_set1_epi8(15);
        // SAFETY: the mask enables only bytes of row r (masked-off bytes are
        // not read and load as 0: both nibbles 0, adding nothing).
        let vw: [__m512i; R] = std::array::from_fn(|r| unsafe {
            _mm512_maskz_loadu_epi8(m, pw.add(r * row_bytes + i).cast())
        });
        let lo = vw.map(|v| _mm512_and_si512(v, nib));
        let hi = vw.map(|v| _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib));
        #[allow(clippy::needless_range_loop)] // acc is indexed [r][t]: a register tile
        for t in 0..T {
            // SAFETY: i / 64 < row_bytes.div_ceil(64) steps, and 128 bytes a
            // step fit in `stride`: bytes 2i..2i + 128 lie inside row t.
            let (ve, vo) = unsafe {
                let p = px.add(t * stride + 2 * i);
                (
                    _mm512_loadu_si512(p.cast()),
                    _mm512_loadu_si512(p.add(64).cast()),
                )
            };
            for r in 0..R {
                acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], lo[r], ve);
                acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], hi[r], vo);
            }
        }
    }
}

/// [`dot_block`] for many activation rows: the weight block is unpacked
/// and repacked once into panels of 16 rows (`kernels::panel512`), which
/// then meet every activation row without horizontal sums.
///
/// # Safety
/// As [`dot_block`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn dot_panels(
    w: &[u8],
    row_bytes: usize,
    x: &[i8],
    stride: usize,
    xsum: &[i32],
    out: &mut [i32],
) {
    // SAFETY: the caller's contract is `panel512::dot_panels`'s for this format.
    unsafe { panel512::dot_panels::<Nibbles>(w, row_bytes, x, stride, xsum, out) }
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
    row_bytes: usize,
    x: &[i8],
    stride: usize,
    xsum: &[i32],
    out: &mut [i32],
) {
    // SAFETY: the caller's contract is `amx::dot_tiles`'s for this format.
    unsafe { amx::dot_tiles::<Nibbles>(w, row_bytes, x, stride, xsum, out) }
}

impl PanelFormat for Nibbles {
    const BIAS: i32 = 8;
    const X_PER_STEP: usize = 128;

    /// Dword `j` of a weight step holds columns `2(4j + k)` (low nibbles)
    /// and `2(4j + k) + 1` (high), which meet quad `j` of the step's even
    /// activations and quad `16 + j` of its odd ones.
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
        let nib = _mm512_set1_epi8(15);
        // SAFETY: the trait's contract: `m` enables only bytes of the rows.
        let t = unsafe { panel512::load_transposed(pw, row_bytes, rows, 64 * c, m) };
        for (j, v) in t.into_iter().enumerate() {
            let lo = _mm512_and_si512(v, nib);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib);
            // SAFETY: `out` has room for 32 vectors (X_PER_STEP / 4).
            unsafe {
                out.add(j).write(lo);
                out.add(16 + j).write(hi);
            }
        }
    }
}
