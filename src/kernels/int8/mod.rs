//! int8-weight integer dot products: packed two's-complement weight bytes
//! (`crate::quant` int8 layout) against an int8-quantized activation row
//! (values in `[-127, 127]`, never -128). Every version returns the exact
//! `i32` sum `Σ w[c]·x[c]`; the scalar function is the reference twin of
//! the AVX2 (sign trick into `maddubs`) and AVX-512 VNNI (`vpdpbusd`)
//! versions, and the tests hold them bit-identical.
//!
//! Exactness limit: `|Σ| ≤ 128·127·cols`, which fits an `i32` for
//! `cols ≤ COLS_MAX` (2^17); the SIMD versions may wrap in between but
//! the final sum is exact modulo 2^32 and therefore exact.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
pub(super) use avx2::hsum as avx2_hsum;
#[cfg(target_arch = "x86_64")]
mod avx512;

use super::cpu::{isa, Isa};

/// Longest row whose exact integer dot product fits an `i32`.
pub const COLS_MAX: usize = 1 << 17;
const _: () = assert!(128 * 127 * COLS_MAX as i64 <= i32::MAX as i64);

/// Scalar reference: `Σ w[c]·x[c]` with `w` read as `i8`.
pub fn dot_scalar(w: &[u8], x: &[i8]) -> i32 {
    assert_eq!(w.len(), x.len(), "dot: length mismatch");
    w.iter()
        .zip(x)
        .map(|(&w, &x)| w as i8 as i32 * x as i32)
        .sum()
}

/// `Σ w[c]·x[c]`, dispatched to the best ISA. `xsum` must be `Σ x[c]` (the
/// VNNI version computes `Σ (w+128)·x − 128·Σx`); `x` must not hold -128.
#[inline]
pub fn dot(w: &[u8], x: &[i8], xsum: i32) -> i32 {
    assert_eq!(w.len(), x.len(), "dot: length mismatch");
    debug_assert!(w.len() <= COLS_MAX);
    debug_assert_eq!(xsum, x.iter().map(|&v| v as i32).sum::<i32>());
    debug_assert!(!x.contains(&i8::MIN));
    #[cfg(target_arch = "x86_64")]
    match isa() {
        // SAFETY: `isa()` reported AVX-512F/BW/VNNI; equal lengths (asserted);
        // `xsum` is Σx by this function's contract.
        Isa::Avx512Vnni => return unsafe { avx512::dot(w, x, xsum) },
        // SAFETY: `isa()` reported at least AVX2; equal lengths (asserted);
        // `x` holds no -128 by this function's contract.
        Isa::Avx2 | Isa::Avx512 => return unsafe { avx2::dot(w, x) },
        Isa::Scalar => {}
    }
    let _ = xsum;
    dot_scalar(w, x)
}

/// `out[k]` = [`dot`] of row `k` of `w` (`out.len()` rows of `x.len()`
/// bytes); one call for the whole block on the VNNI path.
#[inline]
pub fn dot_rows(w: &[u8], x: &[i8], xsum: i32, out: &mut [i32]) {
    assert_eq!(w.len(), out.len() * x.len(), "dot_rows: length mismatch");
    debug_assert!(x.len() <= COLS_MAX);
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx512Vnni && !x.is_empty() {
        debug_assert_eq!(xsum, x.iter().map(|&v| v as i32).sum::<i32>());
        // SAFETY: `isa()` reported AVX-512F/BW/VNNI; row lengths (asserted);
        // `xsum` is Σx by this function's contract.
        return unsafe { avx512::dot_rows(w, x, xsum, out) };
    }
    for (o, row) in out.iter_mut().zip(w.chunks(x.len().max(1))) {
        *o = dot(&row[..x.len()], x, xsum);
    }
    if x.is_empty() {
        out.fill(0);
    }
}

/// Four dots of one weight row with four activation rows (`xsum[t] = Σ
/// x[t]`), each equal to [`dot`]'s; the VNNI version streams the row once.
#[inline]
pub fn dot4(w: &[u8], x: [&[i8]; 4], xsum: [i32; 4]) -> [i32; 4] {
    assert!(
        x.iter().all(|x| x.len() == w.len()),
        "dot4: length mismatch"
    );
    debug_assert!(w.len() <= COLS_MAX);
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx512Vnni {
        debug_assert!((0..4).all(|t| xsum[t] == x[t].iter().map(|&v| v as i32).sum::<i32>()));
        // SAFETY: `isa()` reported AVX-512F/BW/VNNI; equal lengths (asserted);
        // `xsum[t]` is Σx[t] by this function's contract.
        return unsafe { avx512::dot4(w, x, xsum) };
    }
    std::array::from_fn(|t| dot(w, x[t], xsum[t]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu;
    use proptest::prelude::*;

    /// Every available version against the scalar twin.
    fn check(w: &[u8], x: &[i8]) {
        let want = dot_scalar(w, x);
        let xsum: i32 = x.iter().map(|&v| v as i32).sum();
        assert_eq!(dot(w, x, xsum), want, "dispatched, len {}", w.len());
        #[cfg(target_arch = "x86_64")]
        {
            if cpu::has_avx2() {
                // SAFETY: AVX2 detected just above; equal lengths; x has no -128.
                assert_eq!(unsafe { avx2::dot(w, x) }, want, "avx2, len {}", w.len());
            }
            if cpu::has_avx512_vnni() {
                // SAFETY: AVX-512F/BW/VNNI detected just above; equal lengths; xsum = Σx.
                let got = unsafe { avx512::dot(w, x, xsum) };
                assert_eq!(got, want, "vnni, len {}", w.len());
            }
        }
    }

    fn pattern(len: usize, seed: u32) -> (Vec<u8>, Vec<i8>) {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s
        };
        let w = (0..len).map(|_| next() as u8).collect();
        let x = (0..len)
            .map(|_| (next() % 255) as i32 - 127)
            .map(|v| v as i8)
            .collect();
        (w, x)
    }

    #[test]
    fn twins_agree_for_every_length_to_300() {
        for len in 0..=300 {
            let (w, x) = pattern(len, len as u32);
            check(&w, &x);
        }
    }

    #[test]
    fn twins_agree_at_extreme_values() {
        for len in [
            1usize, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 1000, 6144,
        ] {
            for wv in [-128i8, 127, -127, 0, -1] {
                for xv in [127i8, -127, 0, 1] {
                    check(&vec![wv as u8; len], &vec![xv; len]);
                }
            }
        }
    }

    #[test]
    fn longest_row_of_extremes_is_exact() {
        // |Σ| = 128·127·2^17 is the largest sum the limit allows.
        let w = vec![(-128i8) as u8; COLS_MAX];
        let x = vec![-127i8; COLS_MAX];
        assert_eq!(dot_scalar(&w, &x), 128 * 127 * COLS_MAX as i32);
        check(&w, &x);
        let x = vec![127i8; COLS_MAX];
        check(&w, &x);
    }

    /// Four-row dots against four scalar twins.
    fn check4(w: &[u8], x: [&[i8]; 4]) {
        let want: [i32; 4] = std::array::from_fn(|t| dot_scalar(w, x[t]));
        let xsum = x.map(|x| x.iter().map(|&v| v as i32).sum::<i32>());
        assert_eq!(dot4(w, x, xsum), want, "dispatched, len {}", w.len());
        #[cfg(target_arch = "x86_64")]
        if cpu::has_avx512_vnni() {
            // SAFETY: AVX-512F/BW/VNNI detected just above; equal lengths; xsums.
            let got = unsafe { avx512::dot4(w, x, xsum) };
            assert_eq!(got, want, "vnni dot4, len {}", w.len());
        }
    }

    #[test]
    fn row_blocks_agree_with_single_rows() {
        for len in (0..=200).chain([511, 512, 513, 2048]) {
            for rows in [0usize, 1, 2, 3, 7] {
                let (w, _) = pattern(len * rows, (len + rows) as u32);
                let (_, x) = pattern(len, len as u32 + 9);
                let xsum: i32 = x.iter().map(|&v| v as i32).sum();
                let want: Vec<i32> = (0..rows)
                    .map(|r| dot_scalar(&w[r * len..(r + 1) * len], &x))
                    .collect();
                let mut got = vec![7i32; rows];
                dot_rows(&w, &x, xsum, &mut got);
                assert_eq!(got, want, "dispatched, {rows} rows of {len}");
                #[cfg(target_arch = "x86_64")]
                if cpu::has_avx512_vnni() && len > 0 {
                    let mut got = vec![7i32; rows];
                    // SAFETY: AVX-512F/BW/VNNI detected just above; row lengths; xsum = Σx.
                    unsafe { avx512::dot_rows(&w, &x, xsum, &mut got) };
                    assert_eq!(got, want, "vnni, {rows} rows of {len}");
                }
            }
        }
    }

    #[test]
    fn four_row_dots_agree_for_every_length_to_300() {
        for len in 0..=300 {
            let (w, x0) = pattern(len, len as u32);
            let xs: Vec<Vec<i8>> = (1..4)
                .map(|k| pattern(len, (len * 7 + k) as u32).1)
                .collect();
            check4(&w, [&x0, &xs[0], &xs[1], &xs[2]]);
        }
        let (w, x) = (vec![(-128i8) as u8; 1000], vec![-127i8; 1000]);
        let y = vec![127i8; 1000];
        check4(&w, [&x, &y, &x, &y]);
    }

    proptest! {
        #[test]
        fn twins_agree_on_random_rows(
            (w, x) in (0usize..700).prop_flat_map(|n| (
                proptest::collection::vec(any::<u8>(), n),
                proptest::collection::vec(-127i8..=127, n),
            ))
        ) {
            check(&w, &x);
        }
    }
}
