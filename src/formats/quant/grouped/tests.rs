//! The grouped quantizer: packed levels dequantize to what the search
//! chose, every group within the stated bound on random weights, and
//! importance lowering the importance-weighted error.

use super::*;

/// Gaussian-ish weights with a few outliers, from a fixed seed.
fn weights(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f32 / (1u64 << 53) as f32
    };
    (0..len)
        .map(|i| {
            let g = (0..4).map(|_| next()).sum::<f32>() - 2.0;
            if i % 97 == 13 {
                g * 6.0
            } else {
                g * 0.05
            }
        })
        .collect()
}

/// The RMS error of each group of each row of `w` quantized at `f`.
fn group_rms(m: &GMatrix, w: &[f32]) -> Vec<(f32, f32)> {
    let (f, cols, gc) = (m.format, m.cols, m.format.group().cols());
    let d = m.dequantize();
    let mut out = Vec::new();
    for r in 0..m.rows {
        for g0 in (0..cols).step_by(gc) {
            let span = r * cols + g0..r * cols + (g0 + gc).min(cols);
            let e: f32 = span.clone().map(|i| (w[i] - d[i]).powi(2)).sum::<f32>();
            let rms = (e / span.len() as f32).sqrt();
            out.push((rms, rms_error_bound(f, &w[span])));
        }
    }
    out
}

#[test]
fn every_format_round_trips_within_its_bound_on_random_weights() {
    let (rows, cols) = (7, 300);
    let w = weights(rows * cols, 1);
    for f in GFormat::all() {
        let m = GMatrix::quantize(&w, rows, cols, f, None);
        m.check().unwrap();
        for (k, (rms, bound)) in group_rms(&m, &w).into_iter().enumerate() {
            assert!(rms <= bound, "{f} group {k}: rms {rms} > bound {bound}");
        }
    }
}

#[test]
fn constant_and_zero_groups_are_exact() {
    for f in GFormat::all() {
        let w = vec![0.0f32; 2 * 70];
        assert!(GMatrix::quantize(&w, 2, 70, f, None)
            .dequantize()
            .iter()
            .all(|&v| v == 0.0));
        if f.has_min() {
            let w = vec![0.375f32; 70];
            let d = GMatrix::quantize(&w, 1, 70, f, None).dequantize();
            assert!(d.iter().all(|&v| v == 0.375), "{f}: {:?}", &d[..4]);
        }
    }
}

#[test]
fn the_search_is_no_worse_than_plain_rounding() {
    let f = GFormat::parse("q4g64a").unwrap();
    let w = weights(64, 9);
    let (lo, hi) = w
        .iter()
        .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    let plain = evaluate(f, &w, &|_| 1.0, (hi - lo) / 15.0, lo, 15.0).err;
    let mut levels = [0u8; 64];
    let (d, m) = quantize_group(f, &w, None, &mut levels);
    let best = evaluate(f, &w, &|_| 1.0, d.to_f32(), m.to_f32(), 15.0).err;
    assert!(best < plain, "search {best} vs plain {plain}");
}

/// Importance that is large on a few columns of each group and small
/// elsewhere lowers the importance-weighted error (against the same
/// quantizer without it) for every format.
#[test]
fn importance_lowers_the_weighted_error() {
    let (rows, cols) = (16, 256);
    let w = weights(rows * cols, 4);
    let imp: Vec<f32> = (0..cols)
        .map(|c| if c % 5 == 0 { 50.0 } else { 0.05 })
        .collect();
    for f in GFormat::all() {
        let weighted = |m: &GMatrix| -> f64 {
            let d = m.dequantize();
            (0..rows * cols)
                .map(|i| imp[i % cols] as f64 * ((w[i] - d[i]) as f64).powi(2))
                .sum()
        };
        let plain = weighted(&GMatrix::quantize(&w, rows, cols, f, None));
        let with = weighted(&GMatrix::quantize(&w, rows, cols, f, Some(&imp)));
        assert!(
            with < 0.9 * plain,
            "{f}: weighted error {with} with importance, {plain} without"
        );
    }
}

#[test]
fn the_matrix_check_names_the_mismatch() {
    let f = GFormat::parse("q3g32").unwrap();
    let mut m = GMatrix::quantize(&weights(2 * 40, 2), 2, 40, f, None);
    m.params = vec![0u16; 3].into();
    let why = m.check().unwrap_err();
    assert!(
        why.contains("3 group parameters") && why.contains("needs 8"),
        "{why}"
    );
}
