//! int8-weight integer dot products: packed two's-complement weight bytes
//! (`crate::formats::quant` int8 layout) against an int8-quantized activation row
//! (values in `[-127, 127]`, never -128). Every version returns the exact
//! `i32` sum `Σ w[c]·x[c]`; the scalar function is the reference twin of
//! the AVX2 (sign trick into `maddubs`) and AVX-512 VNNI (`vpdpbusd`)
//! versions, and the tests hold them bit-identical.
//!
//! Batches ([`dot_block`]: a block of weight rows × up to a few dozen
//! activation rows, `out[t·rows + r]`) take activation rows padded with
//! zeros to whole 64-byte steps ([`padded_len`]), so every activation load
//! is a whole aligned vector and only the weights' last step is masked.
//! The VNNI version keeps a register tile of 4 weight rows × 4 activation
//! rows (16 accumulators) and reduces the 16 at once (`reduce16`).
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
use super::{BatchFormat, BatchKernel};

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

/// Bytes of one activation row in the [`dot_block`] layout: `cols` rounded
/// up to whole 64-byte steps (the padding holds zeros).
pub fn padded_len(cols: usize) -> usize {
    cols.next_multiple_of(64)
}

/// Batched dots of a block of weight rows with a batch of activation rows:
/// `out[t·rows + r]` = [`dot`] of weight row `r` (`cols` bytes each; `rows =
/// w.len() / cols`) with activation row `t` of `x` (`n = xsum.len()` rows of
/// `stride` bytes, a multiple of 64 and at least `cols`, zero past `cols`),
/// `xsum[t] = Σ x[t, :]`. The VNNI version works in tiles of 4 weight rows ×
/// 4 activation rows (each weight vector loaded once for four activation
/// rows); the AVX2 version in tiles of 2 × 2; `x` must not hold -128.
pub fn dot_block(w: &[u8], cols: usize, x: &[i8], stride: usize, xsum: &[i32], out: &mut [i32]) {
    let n = xsum.len();
    check_block(w, cols, x, stride, n, out);
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx512Vnni {
        debug_assert!(super::xsums_hold(x, stride, xsum));
        if n >= super::PANEL_ACTS_MIN {
            match super::batch_kernel(BatchFormat::Int8, n) {
                BatchKernel::Amx => {
                    // SAFETY: as for `dot_block` below; `batch_kernel` reports AMX
                    // only where `cpu::amx` found it and the tile permission.
                    return unsafe { avx512::dot_amx(w, cols, x, stride, xsum, out) };
                }
                BatchKernel::Panels => {
                    // SAFETY: as for `dot_block` below; `dot_panels` has its contract.
                    return unsafe { avx512::dot_panels(w, cols, x, stride, xsum, out) };
                }
                BatchKernel::Tiles => {}
            }
        }
        // SAFETY: `isa()` reported AVX-512F/BW/VNNI; the layout was checked by
        // `check_block`; `xsum[t]` is Σx[t] by this function's contract.
        return unsafe { avx512::dot_block(w, cols, x, stride, xsum, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa() >= Isa::Avx2
        && n >= super::PANEL_ACTS_MIN
        && super::batch_kernel(BatchFormat::Int8, n) != BatchKernel::Tiles
    {
        debug_assert!(super::xsums_hold(x, stride, xsum));
        // SAFETY: `isa()` reported AVX2; the layout was checked by
        // `check_block`; `x` holds no -128 by this function's contract.
        return unsafe { avx2::dot_panels(w, cols, x, stride, xsum, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa() >= Isa::Avx2 {
        // SAFETY: `isa()` reported AVX2; the layout was checked by
        // `check_block`; `x` holds no -128 by this function's contract.
        return unsafe { avx2::dot_block(w, cols, x, stride, n, out) };
    }
    dot_block_scalar(w, cols, x, stride, xsum, out)
}

/// The scalar twin of [`dot_block`] (`xsum` only gives `n`).
pub fn dot_block_scalar(
    w: &[u8],
    cols: usize,
    x: &[i8],
    stride: usize,
    xsum: &[i32],
    out: &mut [i32],
) {
    let n = xsum.len();
    check_block(w, cols, x, stride, n, out);
    let rows = out.len().checked_div(n).unwrap_or(0);
    for (t, o) in out.chunks_exact_mut(rows.max(1)).enumerate() {
        for (r, o) in o.iter_mut().enumerate() {
            *o = dot_scalar(&w[r * cols..(r + 1) * cols], &x[t * stride..][..cols]);
        }
    }
}

/// The fewest activation rows from which the panels run this format's
/// blocks faster than the register tiles on this CPU (`kernels::race`;
/// `None`: never, as where neither AVX2 kernel runs).
pub(crate) fn race_panels_and_tiles() -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if isa() >= Isa::Avx2 {
        const COLS: usize = 2048;
        let vnni = isa() == Isa::Avx512Vnni;
        return super::race::panels_from(COLS, COLS, &mut |k, w, x, xsum, out| {
            // SAFETY: the ISA was checked (VNNI or AVX2); `race::faster`
            // passes whole rows of `COLS` bytes, activation rows of `COLS`
            // (a multiple of 64) bytes with their sums and no -128, and
            // `out` of rows × activation rows.
            unsafe {
                match (vnni, k) {
                    (true, BatchKernel::Panels) => avx512::dot_panels(w, COLS, x, COLS, xsum, out),
                    (true, _) => avx512::dot_block(w, COLS, x, COLS, xsum, out),
                    (false, BatchKernel::Panels) => avx2::dot_panels(w, COLS, x, COLS, xsum, out),
                    (false, _) => avx2::dot_block(w, COLS, x, COLS, xsum.len(), out),
                }
            }
        });
    }
    None
}

/// The shape contract of [`dot_block`].
fn check_block(w: &[u8], cols: usize, x: &[i8], stride: usize, n: usize, out: &[i32]) {
    assert!(
        stride.is_multiple_of(64) && stride >= cols && x.len() == n * stride,
        "dot_block: activation layout"
    );
    let rows = out.len().checked_div(n).unwrap_or(0);
    assert!(
        out.len() == rows * n && (n == 0 || w.len() == rows * cols),
        "dot_block: block shape"
    );
    debug_assert!(cols <= COLS_MAX);
    debug_assert!((0..n).all(|t| x[t * stride + cols..(t + 1) * stride]
        .iter()
        .all(|&v| v == 0)));
    debug_assert!(!x.contains(&i8::MIN));
}

/// Independent accumulators of the peak probe: more than `vpdpbusd`'s
/// latency times its issue rate on the CPUs we target (Zen 4, Ice Lake and
/// later), so the loop is bound by its throughput alone.
const PEAK_CHAINS: usize = 12;
/// Multiply-adds one [`vnni_peak_probe`] round does (a `vpdpbusd` is 64).
pub const PEAK_MACS_PER_STEP: usize = PEAK_CHAINS * 64;

/// The machine's VNNI peak probe (results/kernels.md): `steps` rounds of
/// twelve independent register-only `vpdpbusd` ([`PEAK_MACS_PER_STEP`]
/// multiply-adds a round), or `None` on a CPU without AVX-512 VNNI. `a`
/// and `b` are the broadcast operands (pass them through `black_box`).
pub fn vnni_peak_probe(steps: usize, a: i32, b: i32) -> Option<i32> {
    #[cfg(target_arch = "x86_64")]
    if super::cpu::has_avx512_vnni() {
        // SAFETY: AVX-512F/BW/VNNI detected just above.
        return Some(unsafe { avx512::dpbusd_peak(steps, a, b) });
    }
    let _ = (steps, a, b);
    None
}

/// The integer multiply-add a peak probe runs ([`int_peak_probe`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeakOp {
    /// AVX-512 VNNI `vpdpbusd` on zmm registers (64 multiply-adds each).
    Vnni,
    /// AVX2 `vpmaddubsw` + `vpmaddwd` + `vpaddd` on ymm registers (32
    /// multiply-adds a chain step), the AVX2 dots' sequence.
    Avx2,
    /// AMX-INT8 `tdpbssd` on four independent accumulator tiles (16 × 16 ×
    /// 64 multiply-adds each), where [`super::cpu::amx`] allows the tiles;
    /// never [`PeakOp::detect`]'s answer: the prefill figures are stated
    /// against the VNNI peak, with this one beside it.
    Amx,
}

impl PeakOp {
    /// The best one this CPU runs, checked at run time (the dispatch cap
    /// `MOESTREAM_ISA` applies: the probe measures what the kernels use).
    pub fn detect() -> Option<PeakOp> {
        match isa() {
            Isa::Avx512Vnni => Some(PeakOp::Vnni),
            Isa::Avx2 | Isa::Avx512 => Some(PeakOp::Avx2),
            Isa::Scalar => None,
        }
    }

    /// Multiply-adds one probe round does.
    pub fn macs_per_step(self) -> usize {
        match self {
            PeakOp::Vnni => PEAK_MACS_PER_STEP,
            PeakOp::Avx2 => AVX2_PEAK_CHAINS * 32,
            PeakOp::Amx => AMX_PEAK_MACS_PER_STEP,
        }
    }

    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            PeakOp::Vnni => "avx512-vnni vpdpbusd",
            PeakOp::Avx2 => "avx2 vpmaddubsw+vpmaddwd",
            PeakOp::Amx => "amx-int8 tdpbssd",
        }
    }
}

/// Multiply-adds of one AMX probe round: four 16 × 16 × 64 tile multiplies.
const AMX_PEAK_MACS_PER_STEP: usize = 4 * 16 * 16 * 64;

/// Independent chains of the AVX2 probe (six products and six sums fill 15
/// of the 16 ymm registers).
const AVX2_PEAK_CHAINS: usize = 6;

/// `steps` rounds of `op`'s peak probe ([`PeakOp::macs_per_step`]
/// multiply-adds a round, register-only, independent accumulators), or
/// `None` where this CPU lacks `op`'s instructions. `a` and `b` are the
/// broadcast operands (pass them through `black_box`).
pub fn int_peak_probe(op: PeakOp, steps: usize, a: i32, b: i32) -> Option<i32> {
    match op {
        PeakOp::Vnni => vnni_peak_probe(steps, a, b),
        PeakOp::Avx2 => {
            #[cfg(target_arch = "x86_64")]
            if super::cpu::has_avx2() {
                // SAFETY: AVX2 detected just above.
                return Some(unsafe { avx2::maddubs_peak(steps, a, b) });
            }
            let _ = (steps, a, b);
            None
        }
        PeakOp::Amx => {
            #[cfg(target_arch = "x86_64")]
            if super::cpu::amx() {
                // SAFETY: AMX-TILE/INT8 and the tile permission (`cpu::amx`).
                return Some(unsafe { super::amx::peak(steps, a as i8, b as i8) });
            }
            let _ = (steps, a, b);
            None
        }
    }
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

    /// `x` laid out as [`dot_block`] wants: `n` rows padded to `stride`.
    fn padded(rows: &[Vec<i8>], stride: usize) -> Vec<i8> {
        let mut x = vec![0i8; rows.len() * stride];
        for (t, row) in rows.iter().enumerate() {
            x[t * stride..][..row.len()].copy_from_slice(row);
        }
        x
    }

    /// Batched dots of `rows` weight rows with `n` activation rows, every
    /// available version against single scalar dots.
    fn check_block(rows: usize, cols: usize, n: usize, seed: u32) {
        let (w, _) = pattern(rows * cols, seed);
        let acts: Vec<Vec<i8>> = (0..n)
            .map(|t| pattern(cols, seed + 1 + t as u32).1)
            .collect();
        let stride = padded_len(cols);
        let x = padded(&acts, stride);
        let xsum: Vec<i32> = acts
            .iter()
            .map(|a| a.iter().map(|&v| v as i32).sum())
            .collect();
        let want: Vec<i32> = (0..rows * n)
            .map(|k| dot_scalar(&w[k % rows * cols..(k % rows + 1) * cols], &acts[k / rows]))
            .collect();
        let what = format!("{rows}x{cols}, n={n}");
        let mut got = vec![7i32; rows * n];
        dot_block_scalar(&w, cols, &x, stride, &xsum, &mut got);
        assert_eq!(got, want, "scalar twin, {what}");
        let mut got = vec![7i32; rows * n];
        dot_block(&w, cols, &x, stride, &xsum, &mut got);
        assert_eq!(got, want, "dispatched, {what}");
        #[cfg(target_arch = "x86_64")]
        {
            if cpu::has_avx2() {
                let mut got = vec![7i32; rows * n];
                // SAFETY: AVX2 detected just above; padded layout and shapes
                // built above; x has no -128.
                unsafe { avx2::dot_block(&w, cols, &x, stride, n, &mut got) };
                assert_eq!(got, want, "avx2, {what}");
                let mut got = vec![7i32; rows * n];
                // SAFETY: as just above (`dot_panels` has `dot_block`'s contract).
                unsafe { avx2::dot_panels(&w, cols, &x, stride, &xsum, &mut got) };
                assert_eq!(got, want, "avx2 panels, {what}");
            }
            if cpu::has_avx512_vnni() {
                let mut got = vec![7i32; rows * n];
                // SAFETY: AVX-512F/BW/VNNI detected just above; padded layout
                // and shapes built above; xsum = Σx.
                unsafe { avx512::dot_block(&w, cols, &x, stride, &xsum, &mut got) };
                assert_eq!(got, want, "vnni, {what}");
                let mut got = vec![7i32; rows * n];
                // SAFETY: as just above (`dot_panels` has `dot_block`'s contract).
                unsafe { avx512::dot_panels(&w, cols, &x, stride, &xsum, &mut got) };
                assert_eq!(got, want, "vnni panels, {what}");
            }
            if cpu::has_amx_int8() {
                let mut got = vec![7i32; rows * n];
                // SAFETY: AMX-INT8 and the tile permission detected just above
                // (with AVX-512F/BW); `dot_amx` has `dot_block`'s contract.
                unsafe { avx512::dot_amx(&w, cols, &x, stride, &xsum, &mut got) };
                assert_eq!(got, want, "amx, {what}");
            }
        }
    }

    #[test]
    fn batched_dots_agree_for_every_batch_to_17() {
        for n in 0..=17 {
            for (rows, cols) in [(1, 1), (4, 64), (5, 65), (9, 127), (3, 300), (8, 2048)] {
                check_block(rows, cols, n, (rows * 31 + cols + n) as u32);
            }
        }
    }

    /// Panel shapes: row counts around the 16-row panels and 32-row pairs,
    /// batches around the 12-row tiles and the panel threshold.
    #[test]
    fn batched_dots_agree_for_prefill_batches() {
        for n in [12, 13, 23, 24, 25, 31, 32, 40, 64] {
            for (rows, cols) in [(15, 64), (16, 130), (17, 64), (33, 200), (50, 2048)] {
                check_block(rows, cols, n, (rows * 7 + cols + n) as u32);
            }
        }
    }

    #[test]
    fn batched_dots_agree_for_every_length_to_300() {
        for cols in 0..=300 {
            check_block(6, cols, 5, cols as u32);
        }
    }

    #[test]
    fn batched_dots_at_extreme_values() {
        for n in [6, 30] {
            dots_at_extreme_values(n);
        }
    }

    fn dots_at_extreme_values(n: usize) {
        let (rows, cols) = (5, 1000);
        let stride = padded_len(cols);
        for wv in [-128i8, 127] {
            for xv in [-127i8, 127] {
                let w = vec![wv as u8; rows * cols];
                let x = padded(&vec![vec![xv; cols]; n], stride);
                let xsum = vec![xv as i32 * cols as i32; n];
                let mut got = vec![0i32; rows * n];
                dot_block(&w, cols, &x, stride, &xsum, &mut got);
                assert_eq!(got, vec![wv as i32 * xv as i32 * cols as i32; rows * n]);
            }
        }
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

        #[test]
        fn batched_dots_agree_on_random_shapes(
            rows in 0usize..40, cols in 0usize..400, n in 1usize..40, seed in any::<u32>(),
        ) {
            check_block(rows, cols, n, seed);
        }
    }
}
