//! Grouped dots: the packing round-trips, the scalar twin against the
//! natural-order sum, every ISA bit-identical to the twin, the matmul
//! against the dequantized row.

use super::matmul::dequantize_row;
use super::*;
use crate::kernels::cpu;
use proptest::prelude::*;

/// A deterministic byte stream.
fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}

/// Finite f16 parameters (|v| < 4) from bytes.
fn params(len: usize, seed: u64) -> Vec<u16> {
    bytes(len * 2, seed)
        .chunks(2)
        .map(|b| half::f16::from_f32((i16::from_le_bytes([b[0], b[1]]) as f32) / 8192.0).to_bits())
        .collect()
}

/// `T` activation rows of `cols` columns padded to whole groups.
fn acts(f: GFormat, cols: usize, t: usize, seed: u64) -> (Vec<Vec<i8>>, Vec<Vec<i32>>) {
    let mut xs = Vec::new();
    let mut sums = Vec::new();
    for k in 0..t {
        let mut x: Vec<i8> = bytes(cols, seed * 31 + k as u64)
            .iter()
            .map(|&b| (b as i8).max(-127))
            .collect();
        x.resize(f.padded_cols(cols), 0);
        let gc = f.group().cols();
        sums.push(
            x.chunks(gc)
                .map(|g| g.iter().map(|&v| v as i32).sum())
                .collect(),
        );
        xs.push(x);
    }
    (xs, sums)
}

/// Every version against the scalar twin for `T` activation rows; the twin
/// within f32 rounding of the natural sum over the dequantized row.
fn check<const T: usize>(f: GFormat, cols: usize, seed: u64) {
    let w = bytes(f.row_bytes(cols), seed);
    let p = params(f.params_per_row(cols), seed + 7);
    let (x, s) = acts(f, cols, T, seed);
    let a: [ActRow<'_>; T] = std::array::from_fn(|t| ActRow {
        x: &x[t],
        xs: &s[t],
    });
    let want = dot_scalar(f, &w, &p, a);
    let what = format!("{f} cols {cols} T {T} seed {seed}");
    let mut row = vec![0f32; f.padded_cols(cols)];
    dequantize_row(f, &w, &p, &mut row);
    for t in 0..T {
        let natural: f64 = row
            .iter()
            .zip(&x[t])
            .map(|(&w, &x)| w as f64 * x as f64)
            .sum();
        let mag: f64 = row
            .iter()
            .zip(&x[t])
            .map(|(&w, &x)| (w as f64 * x as f64).abs())
            .sum();
        let tol = 1e-5 * mag + 1e-3;
        assert!(
            (want[t] as f64 - natural).abs() <= tol,
            "{what}: {} vs {natural}",
            want[t]
        );
    }
    let bits = |v: [f32; T]| v.map(f32::to_bits);
    assert_eq!(bits(dot(f, &w, &p, a)), bits(want), "dispatched, {what}");
    #[cfg(target_arch = "x86_64")]
    {
        if cpu::has_avx2() && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
            // SAFETY: AVX2, FMA and F16C detected just above; shapes built above.
            let got = unsafe { avx2::dot(f, &w, &p, a) };
            assert_eq!(bits(got), bits(want), "avx2, {what}");
        }
        if cpu::has_avx512_vnni() && is_x86_feature_detected!("avx512vl") {
            // SAFETY: AVX-512F/BW/VL/VNNI detected just above (with AVX2, FMA
            // and F16C on every such CPU); shapes built above.
            let got = unsafe { avx512::dot(f, &w, &p, a) };
            assert_eq!(bits(got), bits(want), "avx512, {what}");
        }
    }
}

#[test]
fn names_parse_back_and_int3_int2_always_store_a_min() {
    let all = GFormat::all();
    assert_eq!(
        all.len(),
        12,
        "q4 sym/asym + q3 + q2, three group sizes each"
    );
    for f in all {
        assert_eq!(GFormat::parse(&f.name()), Some(f));
    }
    assert_eq!(GFormat::parse("q4g64").map(|f| f.has_min()), Some(false));
    assert_eq!(GFormat::parse("q4g64a").map(|f| f.has_min()), Some(true));
    assert_eq!(GFormat::parse("q3g64").map(|f| f.has_min()), Some(true));
    assert!(GFormat::new(GBits::Q2, Group::G32, false).is_none());
    assert!(GFormat::parse("q4g48").is_none() && GFormat::parse("q3g64a").is_none());
}

#[test]
fn row_sizes_follow_the_layout() {
    let f = GFormat::parse("q4g64").unwrap();
    assert_eq!(
        (f.groups(2048), f.row_bytes(2048), f.params_per_row(2048)),
        (32, 1024, 32)
    );
    assert_eq!(f.bits_per_weight(2048), 4.25);
    let f = GFormat::parse("q3g128").unwrap();
    assert_eq!(
        (f.row_bytes(200), f.params_per_row(200)),
        (2 * 48, 4),
        "200 pads to 256"
    );
    let f = GFormat::parse("q2g32").unwrap();
    assert_eq!((f.row_bytes(64), f.bits_per_weight(64)), (16, 3.0));
}

#[test]
fn chunks_pack_and_unpack_in_column_order() {
    for bits in [GBits::Q2, GBits::Q3, GBits::Q4] {
        let levels: [u8; CHUNK] =
            std::array::from_fn(|c| ((c * 5 + 3) as u32 % (bits.levels_max() + 1)) as u8);
        let mut out = vec![0u8; CHUNK * bits.bits() as usize / 8];
        pack_chunk(bits, &levels, &mut out);
        assert_eq!(unpack_chunk(bits, &out), levels, "{bits:?}");
    }
    // int4: column j low, j + 16 high; int2: column j + 8k in bits 2k.
    let mut l = [0u8; CHUNK];
    (l[0], l[16], l[9]) = (1, 2, 3);
    let mut o = [0u8; 16];
    pack_chunk(GBits::Q4, &l, &mut o);
    assert_eq!((o[0], o[9]), (0x21, 0x03));
    let mut o = [0u8; 8];
    pack_chunk(GBits::Q2, &l, &mut o);
    assert_eq!(
        (o[0], o[1]),
        (0b0010_0001, 0b0000_1100),
        "column 9 = byte 1, k = 1"
    );
    let mut o = [0u8; 12];
    (l[0], l[31]) = (7, 4);
    pack_chunk(GBits::Q3, &l, &mut o);
    assert_eq!((o[0] & 3, &o[8..12]), (3, &[1u8, 0, 0, 0x80][..]));
}

#[test]
fn twins_agree_for_every_format_and_batch() {
    for f in GFormat::all() {
        for cols in [1usize, 31, 32, 33, 64, 100, 128, 129, 257, 1000, 2048] {
            let seed = cols as u64 * 13 + f.group().cols() as u64;
            check::<1>(f, cols, seed);
            check::<2>(f, cols, seed + 1);
            check::<3>(f, cols, seed + 2);
            check::<4>(f, cols, seed + 3);
        }
    }
}

/// `dot_rows` (dispatched and each ISA's) against the scalar twin row by
/// row, and the one-row matmul (which takes it) against `dot`.
fn check_rows(f: GFormat, rows: usize, cols: usize, seed: u64) {
    let (rb, pr) = (f.row_bytes(cols), f.params_per_row(cols));
    let w = bytes(rows * rb, seed);
    let p = params(rows * pr, seed + 3);
    let (x, s) = acts(f, cols, 1, seed);
    let a = ActRow {
        x: &x[0],
        xs: &s[0],
    };
    let want: Vec<u32> = (0..rows)
        .map(|r| dot_scalar(f, &w[r * rb..][..rb], &p[r * pr..][..pr], [a])[0].to_bits())
        .collect();
    let what = format!("{f} rows {rows} cols {cols}");
    let mut out = vec![0f32; rows];
    dot_rows(f, &w, &p, a, &mut out);
    assert_eq!(
        out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        want,
        "dispatched, {what}"
    );
    #[cfg(target_arch = "x86_64")]
    {
        if cpu::has_avx2() && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
            // SAFETY: AVX2, FMA and F16C detected just above; whole rows built above.
            unsafe { avx2::dot_rows(f, &w, &p, a, &mut out) };
            assert_eq!(
                out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want,
                "avx2, {what}"
            );
        }
        if cpu::has_avx512_vnni() && is_x86_feature_detected!("avx512vl") {
            // SAFETY: AVX-512F/BW/VL/VNNI detected just above (with AVX2, FMA
            // and F16C on every such CPU); whole rows built above.
            unsafe { avx512::dot_rows(f, &w, &p, a, &mut out) };
            assert_eq!(
                out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want,
                "avx512, {what}"
            );
        }
    }
}

#[test]
fn row_blocks_agree_with_the_twin_row_by_row() {
    for f in GFormat::all() {
        for (rows, cols) in [
            (1usize, 64usize),
            (3, 100),
            (7, 257),
            (65, 2048),
            (130, 128),
            // Whole blocks of 16 scales and a tail (int4 g64: 16 + 9, 32 + 1).
            (5, 1600),
            (2, 2112),
        ] {
            check_rows(f, rows, cols, rows as u64 * 7 + cols as u64);
        }
    }
}

/// An f32 activation row as `matmul_int` quantizes it: its scale, its int8
/// levels padded to whole groups, and each group's sum.
fn quantized(f: GFormat, x: &[f32]) -> (f32, Vec<i8>, Vec<i32>) {
    let mut q = vec![0i8; f.padded_cols(x.len())];
    let (scale, _) = crate::kernels::quant::quantize_activation(x, &mut q[..x.len()]);
    let xs = q
        .chunks(f.group().cols())
        .map(|g| g.iter().map(|&v| v as i32).sum())
        .collect();
    (scale, q, xs)
}

#[test]
fn one_row_matmul_equals_the_dot_of_each_row() {
    for name in ["q4g64", "q4g128a", "q3g64", "q2g32"] {
        let f = GFormat::parse(name).unwrap();
        let (rows, cols) = (200, 384);
        let (rb, pr) = (f.row_bytes(cols), f.params_per_row(cols));
        let w = bytes(rows * rb, 11);
        let p = params(rows * pr, 12);
        let x: Vec<f32> = (0..cols)
            .map(|i| ((i * 29 % 97) as f32 - 48.0) / 20.0)
            .collect();
        let mut y = vec![0f32; rows];
        matmul_int(f, &w, &p, rows, cols, &x, 1, &mut y);
        let (scale, q, xs) = quantized(f, &x);
        let a = [ActRow { x: &q, xs: &xs }];
        for r in 0..rows {
            let d = dot(f, &w[r * rb..][..rb], &p[r * pr..][..pr], a)[0] * scale;
            assert_eq!(y[r].to_bits(), d.to_bits(), "{name} row {r}");
        }
    }
}

/// The matmul of many activation rows against the twin for every pair:
/// int4 of every group size, symmetric and not, a short last panel and
/// tile, on each batch kernel (the AMX tiles where the CPU has them, the
/// VNNI panels, the dots; all give the same bits, so switching them under
/// other tests is harmless).
#[test]
fn prefill_matmul_equals_the_twin_for_every_pair() {
    use crate::kernels::{set_batch_kernel, BatchChoice};
    for choice in [
        BatchChoice::Measured,
        BatchChoice::Panels,
        BatchChoice::Tiles,
    ] {
        set_batch_kernel(choice);
        prefill_pairs();
    }
    set_batch_kernel(BatchChoice::Measured);
}

fn prefill_pairs() {
    for name in [
        "q4g32", "q4g64", "q4g128", "q4g32a", "q4g64a", "q4g128a", "q3g64",
    ] {
        let f = GFormat::parse(name).unwrap();
        for (rows, cols, n) in [(40usize, 384usize, 24usize), (17, 200, 37), (33, 1000, 50)] {
            let (rb, pr) = (f.row_bytes(cols), f.params_per_row(cols));
            let w = bytes(rows * rb, rows as u64);
            let p = params(rows * pr, cols as u64);
            let x: Vec<f32> = (0..n * cols)
                .map(|i| ((i * 29 % 97) as f32 - 48.0) / 20.0 + (i % 7) as f32)
                .collect();
            let mut y = vec![0f32; n * rows];
            matmul_int(f, &w, &p, rows, cols, &x, n, &mut y);
            for t in 0..n {
                let (scale, q, xs) = quantized(f, &x[t * cols..(t + 1) * cols]);
                let a = [ActRow { x: &q, xs: &xs }];
                for r in 0..rows {
                    let want = dot_scalar(f, &w[r * rb..][..rb], &p[r * pr..][..pr], a)[0] * scale;
                    let got = y[t * rows + r];
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{name} {rows}x{cols} n {n}: t {t} r {r}"
                    );
                }
            }
        }
    }
}

/// Gate and up sharing one quantization give the bits of two products,
/// at one row, a few and a prefill batch.
#[test]
fn pair_matmul_equals_two_matmuls() {
    let f = GFormat::parse("q4g64").unwrap();
    let (ra, rb_, cols) = (40usize, 23usize, 320usize);
    let (wa, pa) = (
        bytes(ra * f.row_bytes(cols), 1),
        params(ra * f.params_per_row(cols), 2),
    );
    let (wb, pb) = (
        bytes(rb_ * f.row_bytes(cols), 3),
        params(rb_ * f.params_per_row(cols), 4),
    );
    for n in [1usize, 5, 30] {
        let x: Vec<f32> = (0..n * cols)
            .map(|i| ((i * 31 % 89) as f32 - 44.0) / 9.0)
            .collect();
        let (mut ya, mut yb) = (vec![0f32; n * ra], vec![0f32; n * rb_]);
        matmul_int_pair(
            f,
            (&wa, &pa, ra),
            (&wb, &pb, rb_),
            cols,
            &x,
            n,
            &mut ya,
            &mut yb,
        );
        let (mut za, mut zb) = (vec![0f32; n * ra], vec![0f32; n * rb_]);
        matmul_int(f, &wa, &pa, ra, cols, &x, n, &mut za);
        matmul_int(f, &wb, &pb, rb_, cols, &x, n, &mut zb);
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&ya), bits(&za), "gate, n {n}");
        assert_eq!(bits(&yb), bits(&zb), "up, n {n}");
    }
}

#[test]
fn twins_agree_at_extreme_levels() {
    for f in GFormat::all() {
        let cols = 8 * 128 + 32;
        let p = params(f.params_per_row(cols), 3);
        for (wb, xv) in [(0xFFu8, 127i8), (0xFF, -127), (0, 127), (0x88, -127)] {
            let w = vec![wb; f.row_bytes(cols)];
            let x = vec![xv; f.padded_cols(cols)];
            let xs: Vec<i32> = x
                .chunks(f.group().cols())
                .map(|g| g.iter().map(|&v| v as i32).sum())
                .collect();
            let a = [ActRow { x: &x, xs: &xs }];
            assert_eq!(
                dot(f, &w, &p, a)[0].to_bits(),
                dot_scalar(f, &w, &p, a)[0].to_bits(),
                "{f}"
            );
        }
    }
}

#[test]
fn matmul_matches_the_dequantized_product() {
    let f = GFormat::parse("q4g32a").unwrap();
    let (rows, cols, n) = (9, 300, 6);
    let w = bytes(rows * f.row_bytes(cols), 5);
    let p = params(rows * f.params_per_row(cols), 6);
    let x: Vec<f32> = (0..n * cols)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
        .collect();
    let (mut yi, mut yf) = (vec![0f32; n * rows], vec![0f32; n * rows]);
    matmul_int(f, &w, &p, rows, cols, &x, n, &mut yi);
    matmul_float(f, &w, &p, rows, cols, &x, n, &mut yf);
    let (rb, pr) = (f.row_bytes(cols), f.params_per_row(cols));
    for r in 0..rows {
        let mut row = vec![0f32; f.padded_cols(cols)];
        dequantize_row(
            f,
            &w[r * rb..(r + 1) * rb],
            &p[r * pr..(r + 1) * pr],
            &mut row,
        );
        let wabs: f32 = row[..cols].iter().map(|v| v.abs()).sum();
        for t in 0..n {
            let xr = &x[t * cols..(t + 1) * cols];
            let xscale = xr.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            // Only the activation is rounded on the integer path: ½·xscale per column.
            let bound = 0.5 * xscale * wabs * 1.001 + 1e-4;
            let (a, b) = (yi[t * rows + r], yf[t * rows + r]);
            assert!(
                (a - b).abs() <= bound,
                "row {r} t {t}: {a} vs {b} (bound {bound})"
            );
        }
    }
}

proptest! {
    #[test]
    fn twins_agree_on_random_shapes(k in 0usize..12, cols in 1usize..700, seed in 0u64..10_000) {
        let f = GFormat::all()[k];
        check::<1>(f, cols, seed);
        check::<4>(f, cols, seed);
    }
}
