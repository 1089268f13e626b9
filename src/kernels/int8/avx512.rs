//! AVX-512 VNNI int8 dot: `vpdpbusd` multiplies unsigned by signed bytes
//! and adds groups of four into i32 lanes without saturation. Flipping the
//! sign bit turns `w` into `w + 128` (0..255), so the kernel sums
//! `Σ (w+128)·x` and subtracts `128·Σx` once; all arithmetic wraps modulo
//! 2^32 and the true sum fits an i32, so the result is exact. The tail is
//! a masked load: masked-off lanes read `w = 0, x = 0` and add nothing.

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

/// Four dots of one weight row with four activation rows: the row is loaded
/// and sign-flipped once per 64 bytes for all four. Each result is the
/// exact sum [`dot`] returns.
///
/// # Safety
/// As [`dot`], for each of the four activation rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn dot4(w: &[u8], x: [&[i8]; 4], xsum: [i32; 4]) -> [i32; 4] {
    let n = w.len();
    debug_assert!(x.iter().all(|x| x.len() == n));
    let pw = w.as_ptr();
    let px = x.map(|s| s.as_ptr());
    let flip = _mm512_set1_epi8(i8::MIN);
    let mut acc = [_mm512_setzero_si512(); 4];
    let mut i = 0;
    while i < n {
        let full = n - i >= 64;
        let m: __mmask64 = if full { !0 } else { (1u64 << (n - i)) - 1 };
        // SAFETY: a full step reads bytes i..i + 64 <= n; the tail's mask
        // enables only bytes i..n (masked-off bytes are not read and load as
        // 0: w = 0 flips to 128, times x = 0, adds nothing).
        let load = |p: *const i8| unsafe {
            if full {
                _mm512_loadu_si512(p.add(i).cast())
            } else {
                _mm512_maskz_loadu_epi8(m, p.add(i))
            }
        };
        let vw = _mm512_xor_si512(load(pw.cast()), flip);
        for t in 0..4 {
            acc[t] = _mm512_dpbusd_epi32(acc[t], vw, load(px[t]));
        }
        i += 64;
    }
    std::array::from_fn(|t| _mm512_reduce_add_epi32(acc[t]).wrapping_sub(xsum[t].wrapping_mul(128)))
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
