//! int4-weight integer dot products over the `crate::formats::quant` int4 layout
//! (byte `j` of a row: column `2j` in the low nibble, `2j+1` in the high
//! one, each stored as `q + 8`).
//!
//! Layout choice: the activation row is split once per activation row
//! ([`split`]) into `even[j] = x[2j]` and `odd[j] = x[2j+1]` (0 past the
//! row's end), so the kernels never shuffle weights: byte `j`'s low nibble
//! meets `even[j]`, its high nibble `odd[j]`. The SIMD versions multiply the
//! unsigned nibbles `u = q + 8` (0..15) by `x` (`maddubs` / `vpdpbusd`) and
//! subtract `8·Σx` once; padding nibbles meet a 0 and add nothing. Every
//! version returns the exact `i32` sum `Σ q[c]·x[c]`; the scalar function is
//! the reference twin and the tests hold the SIMD ones bit-identical to it.
//!
//! Batches ([`dot_block`]: a block of weight rows × up to a few dozen
//! activation rows, `out[t·rows + r]`) take each activation row
//! interleaved per 64-byte weight step ([`interleave`]: 64 even, then 64
//! odd activations), so one step's two activation vectors are adjacent
//! aligned loads. The VNNI version unpacks each weight vector once for a
//! register tile of 4 weight rows × 4 activation rows (8 `vpdpbusd` per
//! unpack, 16 accumulators, each taking both nibbles).

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

use super::cpu::{isa, Isa};
use super::{BatchFormat, BatchKernel};

/// Splits an activation row into its even and odd columns, each
/// `cols.div_ceil(2)` long; an odd row's last `odd` entry is 0. Dispatched:
/// AVX-512BW where available, else [`split_scalar`].
pub fn split(x: &[i8], even: &mut [i8], odd: &mut [i8]) {
    let half = x.len().div_ceil(2);
    assert!(
        even.len() == half && odd.len() == half,
        "split: half length"
    );
    #[cfg(target_arch = "x86_64")]
    if isa() >= Isa::Avx512 {
        // SAFETY: `isa()` reported AVX-512F/BW; half lengths (asserted).
        return unsafe { avx512::split(x, even, odd) };
    }
    split_scalar(x, even, odd)
}

/// The scalar twin of [`split`].
pub fn split_scalar(x: &[i8], even: &mut [i8], odd: &mut [i8]) {
    let half = x.len().div_ceil(2);
    assert!(
        even.len() == half && odd.len() == half,
        "split: half length"
    );
    for (j, pair) in x.chunks(2).enumerate() {
        even[j] = pair[0];
        odd[j] = pair.get(1).copied().unwrap_or(0);
    }
}

/// Scalar reference: `Σ_j (lo(w[j]) − 8)·even[j] + (hi(w[j]) − 8)·odd[j]`.
pub fn dot_scalar(w: &[u8], even: &[i8], odd: &[i8]) -> i32 {
    assert!(
        w.len() == even.len() && w.len() == odd.len(),
        "dot: length mismatch"
    );
    let mut s = 0i32;
    for ((&b, &e), &o) in w.iter().zip(even).zip(odd) {
        s += ((b & 15) as i32 - 8) * e as i32 + ((b >> 4) as i32 - 8) * o as i32;
    }
    s
}

/// `Σ q[c]·x[c]` over a split activation row, dispatched to the best ISA.
/// `xsum` must be `Σ even + Σ odd` (= `Σ x`).
#[inline]
pub fn dot(w: &[u8], even: &[i8], odd: &[i8], xsum: i32) -> i32 {
    assert!(
        w.len() == even.len() && w.len() == odd.len(),
        "dot: length mismatch"
    );
    debug_assert_eq!(xsum, even.iter().chain(odd).map(|&v| v as i32).sum::<i32>());
    #[cfg(target_arch = "x86_64")]
    match isa() {
        // SAFETY: `isa()` reported AVX-512F/BW/VNNI; equal lengths (asserted);
        // `xsum` is Σx by this function's contract.
        Isa::Avx512Vnni => return unsafe { avx512::dot(w, even, odd, xsum) },
        // SAFETY: `isa()` reported at least AVX2; equal lengths (asserted);
        // `xsum` is Σx by this function's contract.
        Isa::Avx2 | Isa::Avx512 => return unsafe { avx2::dot(w, even, odd, xsum) },
        Isa::Scalar => {}
    }
    let _ = xsum;
    dot_scalar(w, even, odd)
}

/// `out[k]` = [`dot`] of row `k` of `w` (`out.len()` rows of `even.len()`
/// bytes); one call for the whole block on the VNNI path.
#[inline]
pub fn dot_rows(w: &[u8], even: &[i8], odd: &[i8], xsum: i32, out: &mut [i32]) {
    let rb = even.len();
    assert!(
        odd.len() == rb && w.len() == out.len() * rb,
        "dot_rows: length mismatch"
    );
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx512Vnni && rb > 0 {
        debug_assert_eq!(xsum, even.iter().chain(odd).map(|&v| v as i32).sum::<i32>());
        // SAFETY: `isa()` reported AVX-512F/BW/VNNI; row lengths (asserted);
        // `xsum` is Σx by this function's contract.
        return unsafe { avx512::dot_rows(w, even, odd, xsum, out) };
    }
    for (o, row) in out.iter_mut().zip(w.chunks(rb.max(1))) {
        *o = dot(&row[..rb], even, odd, xsum);
    }
    if rb == 0 {
        out.fill(0);
    }
}

/// Bytes of one activation row of `cols` columns in the [`dot_block`]
/// layout: per 64 weight bytes (128 columns), 64 even then 64 odd
/// activations, the last step zero padded.
pub fn interleaved_len(cols: usize) -> usize {
    2 * cols.div_ceil(2).next_multiple_of(64)
}

/// Lays an activation row out for [`dot_block`]: step `k` of `out` holds
/// `even[64k..64k + 64]` then `odd[64k..64k + 64]` (see [`split`]), zeros
/// past the row's end. Dispatched through [`split`].
pub fn interleave(x: &[i8], out: &mut [i8]) {
    assert_eq!(out.len(), interleaved_len(x.len()), "interleave: length");
    for (x, out) in x.chunks(128).zip(out.chunks_exact_mut(128)) {
        let half = x.len().div_ceil(2);
        let (even, odd) = out.split_at_mut(64);
        split(x, &mut even[..half], &mut odd[..half]);
        even[half..].fill(0);
        odd[half..].fill(0);
    }
}

/// Batched dots of a block of weight rows with a batch of activation rows:
/// `out[t·rows + r]` = [`dot`] of weight row `r` (`row_bytes` bytes each; `rows
/// = w.len() / row_bytes`) with activation row `t` of `x` (`n = xsum.len()`
/// rows of `stride` bytes, a multiple of 128 and at least
/// `interleaved_len(2·row_bytes)`, each laid out by [`interleave`] and zero
/// past it), `xsum[t] = Σ x[t, :]`. The VNNI version works in tiles of 4
/// weight rows × 4 activation rows (each row unpacked once per 64 bytes for
/// four activation rows); the AVX2 version in tiles of 2 × 2.
pub fn dot_block(
    w: &[u8],
    row_bytes: usize,
    x: &[i8],
    stride: usize,
    xsum: &[i32],
    out: &mut [i32],
) {
    let n = xsum.len();
    check_block(w, row_bytes, x, stride, n, out);
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx512Vnni {
        debug_assert!(super::xsums_hold(x, stride, xsum));
        if n >= super::PANEL_ACTS_MIN {
            match super::batch_kernel(BatchFormat::Int4, n) {
                BatchKernel::Amx => {
                    // SAFETY: as for `dot_block` below; `batch_kernel` reports AMX
                    // only where `cpu::amx` found it and the tile permission.
                    return unsafe { avx512::dot_amx(w, row_bytes, x, stride, xsum, out) };
                }
                BatchKernel::Panels => {
                    // SAFETY: as for `dot_block` below; `dot_panels` has its contract.
                    return unsafe { avx512::dot_panels(w, row_bytes, x, stride, xsum, out) };
                }
                BatchKernel::Tiles => {}
            }
        }
        // SAFETY: `isa()` reported AVX-512F/BW/VNNI; the layout was checked by
        // `check_block`; `xsum[t]` is Σx[t] by this function's contract.
        return unsafe { avx512::dot_block(w, row_bytes, x, stride, xsum, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa() >= Isa::Avx2
        && n >= super::PANEL_ACTS_MIN
        && super::batch_kernel(BatchFormat::Int4, n) != BatchKernel::Tiles
    {
        debug_assert!(super::xsums_hold(x, stride, xsum));
        // SAFETY: `isa()` reported AVX2; the layout was checked by
        // `check_block`; `xsum[t]` is Σx[t] by this function's contract.
        return unsafe { avx2::dot_panels(w, row_bytes, x, stride, xsum, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa() >= Isa::Avx2 {
        // SAFETY: `isa()` reported AVX2; the layout was checked by
        // `check_block`; `xsum[t]` is Σx[t] by this function's contract.
        return unsafe { avx2::dot_block(w, row_bytes, x, stride, xsum, out) };
    }
    dot_block_scalar(w, row_bytes, x, stride, xsum, out)
}

/// The fewest activation rows from which the panels run this format's
/// blocks faster than the register tiles on this CPU (`kernels::race`;
/// `None`: never, as where neither AVX2 kernel runs).
pub(crate) fn race_panels_and_tiles() -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if isa() >= Isa::Avx2 {
        const COLS: usize = 2048;
        const RB: usize = COLS / 2;
        let stride = interleaved_len(COLS);
        let vnni = isa() == Isa::Avx512Vnni;
        return super::race::panels_from(RB, stride, &mut |k, w, x, xsum, out| {
            // SAFETY: the ISA was checked (VNNI or AVX2); `race::faster`
            // passes whole rows of `RB` bytes, activation rows of
            // `interleaved_len(2·RB)` bytes with their sums, and `out` of
            // rows × activation rows.
            unsafe {
                match (vnni, k) {
                    (true, BatchKernel::Panels) => avx512::dot_panels(w, RB, x, stride, xsum, out),
                    (true, _) => avx512::dot_block(w, RB, x, stride, xsum, out),
                    (false, BatchKernel::Panels) => avx2::dot_panels(w, RB, x, stride, xsum, out),
                    (false, _) => avx2::dot_block(w, RB, x, stride, xsum, out),
                }
            }
        });
    }
    None
}

/// The scalar twin of [`dot_block`] (`xsum` only gives `n`).
pub fn dot_block_scalar(
    w: &[u8],
    row_bytes: usize,
    x: &[i8],
    stride: usize,
    xsum: &[i32],
    out: &mut [i32],
) {
    let n = xsum.len();
    check_block(w, row_bytes, x, stride, n, out);
    let rows = out.len().checked_div(n).unwrap_or(0);
    for (t, out) in out.chunks_exact_mut(rows.max(1)).enumerate() {
        let x = &x[t * stride..(t + 1) * stride];
        for (r, o) in out.iter_mut().enumerate() {
            let row = &w[r * row_bytes..(r + 1) * row_bytes];
            *o = row.iter().enumerate().fold(0i32, |s, (j, &b)| {
                let at = j / 64 * 128 + j % 64;
                s + ((b & 15) as i32 - 8) * x[at] as i32 + ((b >> 4) as i32 - 8) * x[at + 64] as i32
            });
        }
    }
}

/// The shape contract of [`dot_block`].
fn check_block(w: &[u8], row_bytes: usize, x: &[i8], stride: usize, n: usize, out: &[i32]) {
    assert!(
        stride.is_multiple_of(128) && stride >= 2 * row_bytes && x.len() == n * stride,
        "dot_block: activation layout"
    );
    let rows = out.len().checked_div(n).unwrap_or(0);
    assert!(
        out.len() == rows * n && (n == 0 || w.len() == rows * row_bytes),
        "dot_block: block shape"
    );
    debug_assert!((0..n).all(|t| {
        let row = &x[t * stride..(t + 1) * stride];
        let steps = row_bytes.div_ceil(64);
        let padding = (row_bytes..steps * 64).map(|j| j / 64 * 128 + j % 64);
        row[steps * 128..].iter().all(|&v| v == 0)
            && padding.clone().all(|at| row[at] == 0 && row[at + 64] == 0)
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::quant::{unpack_row, QBits};
    use crate::kernels::cpu;
    use proptest::prelude::*;

    /// Every available version against the scalar twin, and the twin
    /// against the natural-order sum over the unpacked row.
    fn check(w: &[u8], x: &[i8]) {
        let cols = x.len();
        assert_eq!(w.len(), QBits::Int4.row_bytes(cols));
        let mut q = vec![0f32; cols];
        unpack_row(QBits::Int4, w, &mut q);
        let natural: i32 = q.iter().zip(x).map(|(&q, &x)| q as i32 * x as i32).sum();
        let half = cols.div_ceil(2);
        let (mut e, mut o) = (vec![0i8; half], vec![0i8; half]);
        split(x, &mut e, &mut o);
        let xsum: i32 = x.iter().map(|&v| v as i32).sum();
        let want = dot_scalar(w, &e, &o);
        assert_eq!(want, natural, "scalar vs natural, cols {cols}");
        assert_eq!(dot(w, &e, &o, xsum), want, "dispatched, cols {cols}");
        #[cfg(target_arch = "x86_64")]
        {
            if cpu::has_avx2() {
                // SAFETY: AVX2 detected just above; equal lengths; xsum = Σx.
                let got = unsafe { avx2::dot(w, &e, &o, xsum) };
                assert_eq!(got, want, "avx2, cols {cols}");
            }
            if cpu::has_avx512_vnni() {
                // SAFETY: AVX-512F/BW/VNNI detected just above; equal lengths; xsum = Σx.
                let got = unsafe { avx512::dot(w, &e, &o, xsum) };
                assert_eq!(got, want, "vnni, cols {cols}");
            }
        }
    }

    /// A packed row of `cols` nibbles from `f`, padding nibble 8.
    fn packed(cols: usize, f: impl Fn(usize) -> i32) -> Vec<u8> {
        (0..cols.div_ceil(2))
            .map(|j| {
                let lo = (f(2 * j) + 8) as u8;
                let hi = if 2 * j + 1 < cols {
                    (f(2 * j + 1) + 8) as u8
                } else {
                    8
                };
                lo | hi << 4
            })
            .collect()
    }

    fn xs(cols: usize, seed: usize) -> Vec<i8> {
        (0..cols)
            .map(|c| ((c * 7919 + seed * 31) % 255) as i32 - 127)
            .map(|v| v as i8)
            .collect()
    }

    #[test]
    fn twins_agree_for_every_length_to_300() {
        for cols in 0..=300 {
            let w = packed(cols, |c| ((c * 13 + cols) % 16) as i32 - 8);
            check(&w, &xs(cols, cols));
        }
    }

    #[test]
    fn twins_agree_at_extreme_values() {
        for cols in [
            1usize, 2, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1001, 2048,
        ] {
            for q in [-8i32, 7, 0, -1] {
                for xv in [127i8, -127, 0] {
                    check(&packed(cols, |_| q), &vec![xv; cols]);
                }
            }
        }
    }

    #[test]
    fn split_pads_odd_rows_with_zero() {
        let (mut e, mut o) = ([9i8; 3], [9i8; 3]);
        split_scalar(&[1, 2, 3, 4, 5], &mut e, &mut o);
        assert_eq!((e, o), ([1, 3, 5], [2, 4, 0]));
    }

    #[test]
    fn split_twins_agree_for_every_length_to_300() {
        for cols in 0..=300 {
            let x = xs(cols, 3);
            let half = cols.div_ceil(2);
            let (mut e, mut o) = (vec![0i8; half], vec![0i8; half]);
            split_scalar(&x, &mut e, &mut o);
            let (mut e2, mut o2) = (vec![9i8; half], vec![9i8; half]);
            split(&x, &mut e2, &mut o2);
            assert_eq!((&e, &o), (&e2, &o2), "dispatched, cols {cols}");
            #[cfg(target_arch = "x86_64")]
            if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
                let (mut e3, mut o3) = (vec![9i8; half], vec![9i8; half]);
                // SAFETY: AVX-512F/BW detected just above; half lengths.
                unsafe { avx512::split(&x, &mut e3, &mut o3) };
                assert_eq!((&e, &o), (&e3, &o3), "avx512, cols {cols}");
            }
        }
    }

    #[test]
    fn row_blocks_agree_with_single_rows() {
        for cols in (0usize..=200).chain([1023, 1024, 1025, 4096]) {
            let half = cols.div_ceil(2);
            let (mut e, mut o) = (vec![0i8; half], vec![0i8; half]);
            split_scalar(&xs(cols, 5), &mut e, &mut o);
            let xsum: i32 = e.iter().chain(&o).map(|&v| v as i32).sum();
            for rows in [0usize, 1, 2, 3, 7] {
                let w: Vec<u8> = (0..rows * half).map(|i| (i * 37 + cols) as u8).collect();
                let want: Vec<i32> = (0..rows)
                    .map(|r| dot_scalar(&w[r * half..(r + 1) * half], &e, &o))
                    .collect();
                let mut got = vec![7i32; rows];
                dot_rows(&w, &e, &o, xsum, &mut got);
                assert_eq!(got, want, "dispatched, {rows} rows of {cols}");
                #[cfg(target_arch = "x86_64")]
                if cpu::has_avx512_vnni() && half > 0 {
                    let mut got = vec![7i32; rows];
                    // SAFETY: AVX-512F/BW/VNNI detected just above; row lengths; xsum = Σx.
                    unsafe { avx512::dot_rows(&w, &e, &o, xsum, &mut got) };
                    assert_eq!(got, want, "vnni, {rows} rows of {cols}");
                }
            }
        }
    }

    /// Batched dots of `rows` random weight rows with `n` activation rows
    /// of `cols` columns, every available version against single scalar
    /// dots over the split rows.
    fn check_block(rows: usize, cols: usize, n: usize, seed: usize) {
        let (rb, half) = (QBits::Int4.row_bytes(cols), cols.div_ceil(2));
        let w: Vec<u8> = (0..rows * rb)
            .map(|i| ((i * 2654435761 + seed * 97) >> 7) as u8)
            .collect();
        let stride = interleaved_len(cols).max(128);
        let mut x = vec![0i8; n * stride];
        let mut want = vec![0i32; rows * n];
        let mut xsum = vec![0i32; n];
        for t in 0..n {
            let a = xs(cols, seed * 17 + t);
            interleave(&a, &mut x[t * stride..][..interleaved_len(cols)]);
            xsum[t] = a.iter().map(|&v| v as i32).sum();
            let (mut e, mut o) = (vec![0i8; half], vec![0i8; half]);
            split_scalar(&a, &mut e, &mut o);
            for r in 0..rows {
                want[t * rows + r] = dot_scalar(&w[r * rb..(r + 1) * rb], &e, &o);
            }
        }
        let what = format!("{rows}x{cols}, n={n}");
        let mut got = vec![7i32; rows * n];
        dot_block_scalar(&w, rb, &x, stride, &xsum, &mut got);
        assert_eq!(got, want, "scalar twin, {what}");
        let mut got = vec![7i32; rows * n];
        dot_block(&w, rb, &x, stride, &xsum, &mut got);
        assert_eq!(got, want, "dispatched, {what}");
        #[cfg(target_arch = "x86_64")]
        {
            if cpu::has_avx2() {
                let mut got = vec![7i32; rows * n];
                // SAFETY: AVX2 detected just above; interleaved layout and
                // shapes built above; xsum = Σx.
                unsafe { avx2::dot_block(&w, rb, &x, stride, &xsum, &mut got) };
                assert_eq!(got, want, "avx2, {what}");
                let mut got = vec![7i32; rows * n];
                // SAFETY: as just above (`dot_panels` has `dot_block`'s contract).
                unsafe { avx2::dot_panels(&w, rb, &x, stride, &xsum, &mut got) };
                assert_eq!(got, want, "avx2 panels, {what}");
            }
            if cpu::has_avx512_vnni() {
                let mut got = vec![7i32; rows * n];
                // SAFETY: AVX-512F/BW/VNNI detected just above; interleaved
                // layout and shapes built above; xsum = Σx.
                unsafe { avx512::dot_block(&w, rb, &x, stride, &xsum, &mut got) };
                assert_eq!(got, want, "vnni, {what}");
                let mut got = vec![7i32; rows * n];
                // SAFETY: as just above (`dot_panels` has `dot_block`'s contract).
                unsafe { avx512::dot_panels(&w, rb, &x, stride, &xsum, &mut got) };
                assert_eq!(got, want, "vnni panels, {what}");
            }
            if cpu::has_amx_int8() {
                let mut got = vec![7i32; rows * n];
                // SAFETY: AMX-INT8 and the tile permission detected just above
                // (with AVX-512F/BW); `dot_amx` has `dot_block`'s contract.
                unsafe { avx512::dot_amx(&w, rb, &x, stride, &xsum, &mut got) };
                assert_eq!(got, want, "amx, {what}");
            }
        }
    }

    #[test]
    fn interleave_puts_even_then_odd_per_step() {
        let x: Vec<i8> = (0..131).map(|c| (c % 100) as i8).collect();
        let mut out = vec![9i8; interleaved_len(131)];
        interleave(&x, &mut out);
        assert_eq!(out.len(), 256);
        assert_eq!((out[0], out[64], out[63], out[127]), (0, 1, 26, 27));
        assert_eq!((out[128], out[192], out[129], out[193]), (28, 29, 30, 0));
        assert!(out[130..192].iter().chain(&out[194..]).all(|&v| v == 0));
    }

    #[test]
    fn batched_dots_agree_for_every_batch_to_17() {
        for n in 0..=17 {
            for (rows, cols) in [(1, 1), (4, 128), (5, 129), (9, 255), (3, 600), (8, 4096)] {
                check_block(rows, cols, n, rows * 31 + cols + n);
            }
        }
    }

    /// Panel shapes: row counts around the 16-row panels and 32-row pairs,
    /// batches around the 12-row tiles and the panel threshold.
    #[test]
    fn batched_dots_agree_for_prefill_batches() {
        for n in [12, 13, 23, 24, 25, 31, 32, 40, 64] {
            for (rows, cols) in [(15, 128), (16, 257), (17, 128), (33, 300), (50, 4096)] {
                check_block(rows, cols, n, rows * 7 + cols + n);
            }
        }
    }

    #[test]
    fn batched_dots_agree_for_every_length_to_300() {
        for cols in 0..=300 {
            check_block(6, cols, 5, cols);
        }
    }

    proptest! {
        #[test]
        fn twins_agree_on_random_rows(
            (w, x) in (0usize..700).prop_flat_map(|cols| (
                proptest::collection::vec(any::<u8>(), cols.div_ceil(2)),
                proptest::collection::vec(-127i8..=127, cols),
            ))
        ) {
            // Any padding nibble: it meets a 0 in `odd`.
            check(&w, &x);
        }

        #[test]
        fn batched_dots_agree_on_random_shapes(
            rows in 0usize..40, cols in 0usize..700, n in 1usize..40, seed in 0usize..10_000,
        ) {
            check_block(rows, cols, n, seed);
        }
    }
}
