//! AVX-512 VNNI int4 dot over a split activation row: per 64 weight bytes
//! (128 columns), the low and high nibbles go through `vpdpbusd` against the
//! even and odd activations (u4 × i8, groups of four into i32, no
//! saturation); `8·Σx` is subtracted once. The tail is a masked load:
//! masked-off weight bytes read 0 and add nothing.

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

/// Four dots of one weight row with four split activation rows: the row is
/// loaded and unpacked once per 64 bytes for all four (batched decode and
/// prefill are compute-bound, and unpacking is half the work per byte).
/// Each result is the exact sum [`dot`] returns.
///
/// # Safety
/// As [`dot`], for each of the four activation rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn dot4(w: &[u8], even: [&[i8]; 4], odd: [&[i8]; 4], xsum: [i32; 4]) -> [i32; 4] {
    let n = w.len();
    debug_assert!((0..4).all(|t| even[t].len() == n && odd[t].len() == n));
    let pw = w.as_ptr();
    let pe = even.map(|s| s.as_ptr());
    let po = odd.map(|s| s.as_ptr());
    let nib = _mm512_set1_epi8(15);
    let mut acc = [[_mm512_setzero_si512(); 2]; 4];
    let mut i = 0;
    while i < n {
        let full = n - i >= 64;
        let m: __mmask64 = if full { !0 } else { (1u64 << (n - i)) - 1 };
        // SAFETY: a full step reads bytes i..i + 64 <= n; the tail's mask
        // enables only bytes i..n (masked-off bytes are not read and load as
        // 0, adding nothing).
        let load = |p: *const i8| unsafe {
            if full {
                _mm512_loadu_si512(p.add(i).cast())
            } else {
                _mm512_maskz_loadu_epi8(m, p.add(i))
            }
        };
        let vw = load(pw.cast());
        let lo = _mm512_and_si512(vw, nib);
        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(vw), nib);
        for t in 0..4 {
            acc[t][0] = _mm512_dpbusd_epi32(acc[t][0], lo, load(pe[t]));
            acc[t][1] = _mm512_dpbusd_epi32(acc[t][1], hi, load(po[t]));
        }
        i += 64;
    }
    std::array::from_fn(|t| {
        let s = _mm512_reduce_add_epi32(_mm512_add_epi32(acc[t][0], acc[t][1]));
        s.wrapping_sub(xsum[t].wrapping_mul(8))
    })
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
