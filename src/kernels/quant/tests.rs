//! Tests of the quantized matmul driver: activation quantization, the
//! integer path against the scalar twins and against f32 (error bound),
//! the float path against the dequantized row, batching and threading.

use super::*;
// Test data is made with the container's quantizer (a room above); the kernels
// themselves see only slices.
use crate::formats::quant::{unpack_row, QMatrix};
use crate::kernels::{set_threading, threading, Threading};
use proptest::prelude::*;

const ALL_BITS: [QBits; 3] = [QBits::Int2, QBits::Int4, QBits::Int8];

fn values(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (((i * 7919 + seed * 104729) % 2003) as f32 - 1001.0) / 257.0)
        .collect()
}

/// The integer path computed row by row with the scalar twins only.
fn int_reference(m: &QMatrix, x: &[f32], n: usize) -> Vec<f32> {
    let (rows, cols) = (m.rows, m.cols);
    let mut y = vec![0f32; n * rows];
    for t in 0..n {
        let mut q = vec![0i8; cols];
        let (xs, _) = quantize_activation(&x[t * cols..(t + 1) * cols], &mut q);
        let half = cols.div_ceil(2);
        let (mut e, mut o) = (vec![0i8; half], vec![0i8; half]);
        int4::split(&q, &mut e, &mut o);
        for r in 0..rows {
            let w = m.row(r);
            let acc = match m.bits {
                QBits::Int8 => int8::dot_scalar(w, &q),
                QBits::Int4 => int4::dot_scalar(w, &e, &o),
                QBits::Int2 => int2::dot_scalar(w, &q),
            };
            y[t * rows + r] = acc as f32 * m.scales[r] * xs;
        }
    }
    y
}

fn run_int(m: &QMatrix, x: &[f32], n: usize) -> Vec<f32> {
    let mut y = vec![f32::NAN; n * m.rows];
    matmul_int(m.bits, &m.data, &m.scales, m.rows, m.cols, x, n, &mut y);
    y
}

fn run_float(m: &QMatrix, x: &[f32], n: usize) -> Vec<f32> {
    let mut y = vec![f32::NAN; n * m.rows];
    matmul_float(m.bits, &m.data, &m.scales, m.rows, m.cols, x, n, &mut y);
    y
}

fn bits_of(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn activation_quantization_follows_the_spec() {
    // absmax 127 -> scale 1: ties go to even, q never -128.
    let x = [127.0f32, -127.0, 2.5, 3.5, -2.5, 0.4, -0.6, 0.0];
    let mut q = [0i8; 8];
    let (s, sum) = quantize_activation(&x, &mut q);
    assert_eq!(s, 1.0);
    assert_eq!(q, [127, -127, 2, 4, -2, 0, -1, 0]);
    assert_eq!(sum, q.iter().map(|&v| v as i32).sum::<i32>());
    // All zero: scale 0, q 0.
    let mut q = [5i8; 3];
    assert_eq!(quantize_activation(&[0.0, -0.0, 0.0], &mut q), (0.0, 0));
    assert_eq!(q, [0; 3]);
    // Empty.
    assert_eq!(quantize_activation(&[], &mut []), (0.0, 0));
}

#[test]
fn two_add_rounding_is_round_ties_even() {
    for i in -127 * 256..=127 * 256 {
        let v = i as f32 / 256.0;
        assert_eq!(round_ties_even_small(v), v.round_ties_even(), "{v}");
    }
    for v in [
        0.5f32, 1.5, 2.5, -0.5, -1.5, 126.5, -126.5, 0.49999997, 1e-40,
    ] {
        assert_eq!(round_ties_even_small(v), v.round_ties_even(), "{v}");
    }
    assert!(round_ties_even_small(f32::NAN).is_nan());
}

/// The dispatched (and, where available, the AVX-512) quantizer against the
/// scalar twin: same scale bits, same integers, same sum.
fn check_activation_twins(x: &[f32]) {
    let mut want = vec![0i8; x.len()];
    let (s, sum) = quantize_activation_scalar(x, &mut want);
    let mut got = vec![99i8; x.len()];
    let (s2, sum2) = quantize_activation(x, &mut got);
    assert_eq!(
        (s.to_bits(), sum, &want),
        (s2.to_bits(), sum2, &got),
        "dispatched {x:?}"
    );
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
        let mut got = vec![99i8; x.len()];
        // SAFETY: AVX-512F/BW detected just above; equal lengths.
        let (s3, sum3) = unsafe { avx512::quantize_activation(x, &mut got) };
        assert_eq!(
            (s.to_bits(), sum, &want),
            (s3.to_bits(), sum3, &got),
            "avx512 {x:?}"
        );
    }
}

#[test]
fn activation_twins_agree_on_named_rows() {
    for len in 0..=70 {
        check_activation_twins(&values(len, len));
    }
    check_activation_twins(&[0.0; 33]);
    check_activation_twins(&[-0.0, 0.0, -0.0]);
    check_activation_twins(&[1.0, f32::NAN, -3.0, 2.5, f32::NAN]);
    check_activation_twins(&[f32::NAN; 17]);
    check_activation_twins(&[f32::INFINITY, 1.0, -2.0]);
    check_activation_twins(&[f32::NEG_INFINITY, f32::INFINITY, 0.0]);
    check_activation_twins(&[1e-42, -3e-43, 0.0, 1e-45]);
    check_activation_twins(&[3e38, -3e38, 1.0, -1.0]);
    // Exact ties at scale 1.
    let ties: Vec<f32> = (-254..=254)
        .map(|i| i as f32 / 2.0)
        .chain([127.0])
        .collect();
    check_activation_twins(&ties);
}

#[test]
fn activation_extremes_stay_in_range() {
    for x in [
        vec![-1.0f32; 9],
        vec![1e-30, -1e-30, 5e-31],
        vec![3e38, -3e38, 1.0],
        vec![f32::MIN_POSITIVE, -f32::MIN_POSITIVE * 0.5],
    ] {
        let mut q = vec![0i8; x.len()];
        let (s, sum) = quantize_activation(&x, &mut q);
        assert!(s > 0.0, "{x:?}");
        assert!(q.iter().all(|&v| v != i8::MIN), "{x:?} -> {q:?}");
        assert!(q.iter().any(|&v| v.abs() == 127), "{x:?} -> {q:?}");
        assert_eq!(sum, q.iter().map(|&v| v as i32).sum::<i32>());
    }
}

#[test]
fn int_path_matches_the_scalar_twins_bit_for_bit() {
    // The last shapes are large enough to run in parallel blocks.
    for (rows, cols) in [
        (1, 1),
        (3, 7),
        (17, 64),
        (9, 129),
        (33, 300),
        (300, 1001),
        (64, 4099),
    ] {
        for bits in ALL_BITS {
            for n in [1, 2, 5] {
                let m = QMatrix::quantize(&values(rows * cols, rows), rows, cols, bits);
                let x = values(n * cols, cols + n);
                let got = run_int(&m, &x, n);
                let want = int_reference(&m, &x, n);
                assert_eq!(
                    bits_of(&got),
                    bits_of(&want),
                    "{bits:?} {rows}x{cols} n={n}"
                );
            }
        }
    }
}

#[test]
fn batched_int_path_matches_the_scalar_twins_for_every_n_to_17() {
    // Row counts off the 4-row tiles, columns off the 64-byte steps; the
    // larger shapes run in parallel row blocks.
    for (rows, cols) in [
        (1, 1),
        (5, 63),
        (7, 130),
        (13, 257),
        (66, 1001),
        (130, 2050),
    ] {
        for bits in [QBits::Int8, QBits::Int4] {
            let m = QMatrix::quantize(&values(rows * cols, rows + cols), rows, cols, bits);
            for n in 1..=17 {
                let x = values(n * cols, cols + n);
                assert_eq!(
                    bits_of(&run_int(&m, &x, n)),
                    bits_of(&int_reference(&m, &x, n)),
                    "{bits:?} {rows}x{cols} n={n}"
                );
            }
        }
    }
}

#[test]
fn prefill_batches_match_the_scalar_twins_on_amx_panels_and_tiles() {
    // Batches past the panel threshold (one `dot_block` call per block of
    // rows for every activation row), row counts off the 32-row panel
    // pairs, and batches longer than one panel call (256 + a tile-path
    // tail of 14); the AMX tiles (the default where the CPU has them), the
    // panel kernel and the 4×4 tiles give the same bits.
    for (rows, cols) in [(17, 130), (50, 257), (130, 2050)] {
        for bits in [QBits::Int8, QBits::Int4] {
            let m = QMatrix::quantize(&values(rows * cols, rows + cols), rows, cols, bits);
            for n in [23, 24, 37, 64, 270] {
                let x = values(n * cols, cols + n);
                let want = bits_of(&int_reference(&m, &x, n));
                let got = bits_of(&run_int(&m, &x, n));
                assert_eq!(got, want, "{bits:?} {rows}x{cols} n={n}");
                use crate::kernels::{set_batch_kernel, BatchChoice};
                for k in [BatchChoice::Amx, BatchChoice::Panels, BatchChoice::Tiles] {
                    set_batch_kernel(k);
                    let other = bits_of(&run_int(&m, &x, n));
                    set_batch_kernel(BatchChoice::Measured);
                    assert_eq!(other, want, "{k:?}, {bits:?} {rows}x{cols} n={n}");
                }
            }
        }
    }
}

#[test]
fn int_path_extreme_weights_and_activations() {
    let (rows, cols) = (4, 333);
    for bits in [QBits::Int8, QBits::Int4] {
        let (lo, hi) = (bits.qmin(), bits.qmax());
        // Rows of all qmin, all qmax, alternating, zero.
        let rowvals: [Box<dyn Fn(usize) -> i32>; 4] = [
            Box::new(move |_| lo),
            Box::new(move |_| hi),
            Box::new(move |c| if c % 2 == 0 { lo } else { hi }),
            Box::new(|_| 0),
        ];
        let mut data = vec![0u8; rows * bits.row_bytes(cols)];
        for (r, f) in rowvals.iter().enumerate() {
            let row: Vec<u8> = match bits {
                QBits::Int8 => (0..cols).map(|c| f(c) as i8 as u8).collect(),
                _ => (0..cols.div_ceil(2))
                    .map(|j| {
                        let hi = if 2 * j + 1 < cols {
                            f(2 * j + 1) + 8
                        } else {
                            8
                        };
                        ((f(2 * j) + 8) as u8) | (hi as u8) << 4
                    })
                    .collect(),
            };
            let rb = bits.row_bytes(cols);
            data[r * rb..(r + 1) * rb].copy_from_slice(&row);
        }
        let m = QMatrix {
            bits,
            rows,
            cols,
            data: data.into(),
            scales: vec![0.5, 1.0, 2.0, 1.0].into(),
        };
        for xv in [127.0f32, -127.0, 1.0] {
            // Six activation rows take the batched path.
            let x6 = vec![xv; 6 * cols];
            let want6 = bits_of(&int_reference(&m, &x6, 6));
            assert_eq!(bits_of(&run_int(&m, &x6, 6)), want6, "{bits:?} x={xv} n=6");
            let x = vec![xv; cols];
            let got = run_int(&m, &x, 1);
            assert_eq!(
                bits_of(&got),
                bits_of(&int_reference(&m, &x, 1)),
                "{bits:?} x={xv}"
            );
            // x = ±127 quantizes exactly (scale 1), so y is exact here.
            if xv.abs() == 127.0 {
                assert_eq!(got[0], 0.5 * (lo * cols as i32) as f32 * xv);
            }
        }
    }
}

#[test]
fn float_path_is_the_scaled_f32_dot_of_the_unpacked_row() {
    let (rows, cols, n) = (300, 1001, 3);
    for bits in ALL_BITS {
        let m = QMatrix::quantize(&values(rows * cols, 3), rows, cols, bits);
        let x = values(n * cols, 4);
        let got = run_float(&m, &x, n);
        let mut row = vec![0f32; cols];
        for r in 0..rows {
            unpack_row(bits, m.row(r), &mut row);
            for t in 0..n {
                let want = m.scales[r] * kf32::dot(&row, &x[t * cols..(t + 1) * cols]);
                assert_eq!(
                    got[t * rows + r].to_bits(),
                    want.to_bits(),
                    "{bits:?} r={r} t={t}"
                );
            }
        }
    }
}

#[test]
fn unpacking_matches_the_container_unpacker() {
    for bits in ALL_BITS {
        for cols in 0..40 {
            let packed: Vec<u8> = (0..bits.row_bytes(cols))
                .map(|i| (i * 89 + cols) as u8)
                .collect();
            let (mut want, mut got) = (vec![0f32; cols], vec![f32::NAN; cols]);
            unpack_row(bits, &packed, &mut want);
            unpack_ints(bits, &packed, &mut got);
            assert_eq!(bits_of(&got), bits_of(&want), "{bits:?} cols {cols}");
        }
    }
}

#[test]
fn batches_equal_separate_matvecs_bit_for_bit() {
    let (rows, cols) = (96, 2050);
    for bits in ALL_BITS {
        let m = QMatrix::quantize(&values(rows * cols, 11), rows, cols, bits);
        for n in [1usize, 4, 16] {
            let x = values(n * cols, 12);
            for path in [run_int, run_float] {
                let y = path(&m, &x, n);
                for t in 0..n {
                    let yt = path(&m, &x[t * cols..(t + 1) * cols], 1);
                    assert_eq!(
                        bits_of(&y[t * rows..(t + 1) * rows]),
                        bits_of(&yt),
                        "{bits:?} n={n} t={t}"
                    );
                }
            }
        }
    }
}

#[test]
fn every_threading_gives_the_same_bits() {
    let (rows, cols, n) = (512, 1536, 4);
    let m = QMatrix::quantize(&values(rows * cols, 5), rows, cols, QBits::Int4);
    let x = values(n * cols, 6);
    let before = threading();
    let want = int_reference(&m, &x, n);
    for t in [Threading::Single, Threading::Pool] {
        set_threading(t);
        assert_eq!(bits_of(&run_int(&m, &x, n)), bits_of(&want), "{t:?}");
    }
    set_threading(before);
}

/// `|y_int − Σ ŵ·x|` over one row, against the bound derived in the module
/// doc (activation rounding ≤ xscale/2 per column; weight rounding ≤
/// scale/2 per column when compared with the original weights).
fn check_error_bound(w: &[f32], rows: usize, cols: usize, x: &[f32], bits: QBits) {
    let m = QMatrix::quantize(w, rows, cols, bits);
    let y = int_reference(&m, x, 1);
    assert_eq!(bits_of(&run_int(&m, x, 1)), bits_of(&y));
    let absmax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let xscale = absmax as f64 / 127.0;
    let mut q = vec![0f32; cols];
    for r in 0..rows {
        unpack_row(bits, m.row(r), &mut q);
        let s = m.scales[r] as f64;
        let deq: f64 = q
            .iter()
            .zip(x)
            .map(|(&q, &x)| q as f64 * s * x as f64)
            .sum();
        let orig: f64 = w[r * cols..(r + 1) * cols]
            .iter()
            .zip(x)
            .map(|(&w, &x)| w as f64 * x as f64)
            .sum();
        let sum_q: f64 = q.iter().map(|v| v.abs() as f64).sum();
        let sum_x: f64 = x.iter().map(|v| v.abs() as f64).sum();
        // f32 rounding: the exact i32 → f32 conversion and two products, each
        // ≤ 2^-24 relative, plus float division slack in xscale.
        let rounding = 4.0 * f64::from(f32::EPSILON) * (y[r].abs() as f64 + s * xscale * sum_q);
        let act_bound = 0.5 * s * xscale * sum_q + rounding;
        let yr = y[r] as f64;
        prop_assert_le((yr - deq).abs(), act_bound, "vs dequantized", bits, r);
        let both_bound = act_bound + 0.5 * s * sum_x;
        prop_assert_le((yr - orig).abs(), both_bound, "vs original", bits, r);
    }
}

fn prop_assert_le(err: f64, bound: f64, what: &str, bits: QBits, r: usize) {
    assert!(
        err <= bound,
        "{what}: {bits:?} row {r}: error {err} > bound {bound}"
    );
}

#[test]
fn int_path_error_bound_named_cases() {
    let (rows, cols) = (8, 777);
    for bits in ALL_BITS {
        check_error_bound(&values(rows * cols, 1), rows, cols, &values(cols, 2), bits);
        // A spiky activation: one huge value makes xscale coarse.
        let mut x = values(cols, 3);
        x[5] = 300.0;
        check_error_bound(&values(rows * cols, 4), rows, cols, &x, bits);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn activation_twins_agree_on_random_rows(
        x in proptest::collection::vec(prop_oneof![
            8 => -100.0f32..100.0,
            1 => any::<f32>(),
            1 => Just(0.0f32),
        ], 0..300),
    ) {
        check_activation_twins(&x);
    }

    #[test]
    fn int_path_within_the_error_bound_and_equal_to_twins(
        (rows, cols, w, x) in (1usize..6, 1usize..400).prop_flat_map(|(rows, cols)| (
            Just(rows),
            Just(cols),
            proptest::collection::vec(-3.0f32..3.0, rows * cols),
            proptest::collection::vec(-10.0f32..10.0, cols),
        )),
        b in 0usize..3,
    ) {
        check_error_bound(&w, rows, cols, &x, ALL_BITS[b]);
    }

    #[test]
    fn random_shapes_batch_like_matvecs(
        rows in 1usize..40, cols in 1usize..300, n in 1usize..18, b in 0usize..3, seed in 0usize..1000,
    ) {
        let m = QMatrix::quantize(&values(rows * cols, seed), rows, cols, ALL_BITS[b]);
        let x = values(n * cols, seed + 1);
        let y = run_int(&m, &x, n);
        prop_assert_eq!(bits_of(&y), bits_of(&int_reference(&m, &x, n)));
        for t in 0..n {
            let yt = run_int(&m, &x[t * cols..(t + 1) * cols], 1);
            prop_assert_eq!(bits_of(&y[t * rows..(t + 1) * rows]), bits_of(&yt));
        }
    }
}

#[test]
fn scale_sums_twins_agree_bit_for_bit() {
    for len in [0usize, 1, 15, 16, 17, 64, 100] {
        let a: Vec<i32> = (0..len).map(|i| (i as i32 * 7919 - 300_000) * 37).collect();
        let s: Vec<f32> = (0..len).map(|i| 1e-3 * (1.0 + i as f32 / 7.0)).collect();
        for xs in [0.0f32, 3.1e-3, 1e30, f32::MIN_POSITIVE] {
            let (mut want, mut got) = (vec![9f32; len], vec![7f32; len]);
            scale_sums_scalar(&a, &s, xs, &mut want);
            scale_sums(&a, &s, xs, &mut got);
            assert_eq!(bits_of(&got), bits_of(&want), "len {len} xs {xs}");
        }
    }
}

#[test]
fn a_gate_up_pair_equals_two_products_bit_for_bit() {
    // One quantization of x for both matrices (different row counts), on
    // the per-row path (n < 4), the tiles and the prefill kernels.
    let (cols, rows_a, rows_b) = (200, 37, 20);
    for bits in [QBits::Int8, QBits::Int4, QBits::Int2] {
        let a = QMatrix::quantize(&values(rows_a * cols, 3), rows_a, cols, bits);
        let b = QMatrix::quantize(&values(rows_b * cols, 4), rows_b, cols, bits);
        for n in [1, 3, 5, 30] {
            let x = values(n * cols, n);
            let (mut ya, mut yb) = (vec![f32::NAN; n * rows_a], vec![f32::NAN; n * rows_b]);
            let pa = (&a.data[..], &a.scales[..], rows_a);
            let pb = (&b.data[..], &b.scales[..], rows_b);
            matmul_int_pair(bits, pa, pb, cols, &x, n, &mut ya, &mut yb);
            assert_eq!(
                bits_of(&ya),
                bits_of(&run_int(&a, &x, n)),
                "{bits:?} n={n} a"
            );
            assert_eq!(
                bits_of(&yb),
                bits_of(&run_int(&b, &x, n)),
                "{bits:?} n={n} b"
            );
        }
    }
}
