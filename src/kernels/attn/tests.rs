//! Twin tests of the attention products: every ISA version gives the
//! scalar twin's bits, whatever rows and positions share a tile, and the
//! twin is within f32 rounding of an f64 reference.

use super::*;
use proptest::prelude::*;

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32 / 4_194_304.0
                - 2.0
        })
        .collect()
}

type ScoresFn = fn(QueryRows, &[f32], Range<usize>, f32, (&mut [f32], usize));

/// The ISA versions this CPU runs, by name.
fn score_versions() -> Vec<(&'static str, ScoresFn)> {
    let mut v: Vec<(&'static str, ScoresFn)> = vec![("dispatch", scores)];
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: AVX2 and FMA were detected; the caller passes the
            // bounds `scores` asserts (the tests build them so).
            v.push(("avx2", |r, p, b, s, o| unsafe {
                avx2::scores(r, p, b, s, o)
            }));
        }
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F was detected; bounds as above.
            v.push(("avx512", |r, p, b, s, o| unsafe {
                avx512::scores(r, p, b, s, o)
            }));
        }
    }
    v
}

fn check_scores(dim: usize, n: usize, rows: usize, blocks: Range<usize>) {
    let stride = dim + 3;
    let keys = values(n * stride, 1);
    let mut panel = vec![f32::NAN; panel_len(n, dim)];
    let part = KeyPart {
        keys: &keys,
        stride,
        width: dim,
    };
    fill_panel(&[part], n, &mut panel);
    let q = values(rows * dim * 2 + 2, 2);
    let offsets: Vec<usize> = (0..rows).map(|r| r * 2 * dim + r % 3).collect();
    let rows = QueryRows {
        q: &q,
        offsets: &offsets,
        dim,
    };
    let out_stride = n.div_ceil(BLOCK) * BLOCK + 5;
    let mut want = vec![f32::NAN; offsets.len() * out_stride];
    scores_scalar(rows, &panel, blocks.clone(), 0.3, (&mut want, out_stride));
    for (r, &off) in offsets.iter().enumerate() {
        for j in blocks.start * BLOCK..(blocks.end * BLOCK).min(n) {
            let exact: f64 = (0..dim)
                .map(|d| f64::from(q[off + d]) * f64::from(keys[j * stride + d]))
                .sum();
            let bound: f64 = (0..dim)
                .map(|d| (f64::from(q[off + d]) * f64::from(keys[j * stride + d])).abs())
                .sum();
            let got = f64::from(want[r * out_stride + j]);
            assert!(
                (got - 0.3 * exact).abs() <= 1e-5 * bound.max(1.0),
                "twin vs f64"
            );
        }
    }
    for (name, f) in score_versions() {
        let mut got = vec![f32::NAN; offsets.len() * out_stride];
        f(rows, &panel, blocks.clone(), 0.3, (&mut got, out_stride));
        for r in 0..offsets.len() {
            for j in blocks.start * BLOCK..blocks.end * BLOCK {
                let (a, b) = (got[r * out_stride + j], want[r * out_stride + j]);
                assert_eq!(a.to_bits(), b.to_bits(), "{name}: row {r}, position {j}");
            }
        }
    }
}

fn sum_versions() -> Vec<(&'static str, SumRows)> {
    let mut v: Vec<(&'static str, SumRows)> = vec![("dispatch", sum_rows)];
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: AVX2 and FMA were detected; `check_values` runs
            // `weighted_values` (which checks the bounds) first.
            v.push(("avx2", |w, r, p, o, d| unsafe {
                avx2::sum_rows(w, r, p, o, d)
            }));
        }
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F was detected; bounds as above.
            v.push(("avx512", |w, r, p, o, d| unsafe {
                avx512::sum_rows(w, r, p, o, d)
            }));
        }
    }
    v
}

fn check_values(dim: usize, n: usize, spans: &[Range<usize>]) {
    let (w_stride, v_stride) = (n + 2, dim + 1);
    let w = values(spans.len() * w_stride, 3);
    let v = values(n * v_stride, 4);
    let offsets: Vec<usize> = (0..spans.len()).map(|r| r * (dim + 2) + 1).collect();
    let out_len = spans.len() * (dim + 2) + 1;
    let start = values(out_len, 5);
    let wv = Weighted {
        w: &w,
        w_stride,
        v: &v,
        v_stride,
        spans,
    };
    let mut want = start.clone();
    weighted_values_scalar(wv, (&mut want, &offsets), dim);
    for (r, span) in spans.iter().enumerate() {
        for d in 0..dim {
            let exact: f64 = f64::from(start[offsets[r] + d])
                + span
                    .clone()
                    .map(|p| f64::from(w[r * w_stride + p]) * f64::from(v[p * v_stride + d]))
                    .sum::<f64>();
            let got = f64::from(want[offsets[r] + d]);
            assert!((got - exact).abs() <= 1e-5 * (span.len() as f64 + 1.0) * 4.0);
        }
    }
    let mut got = start.clone();
    weighted_values(wv, (&mut got, &offsets), dim);
    assert!(
        got.iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "dispatch"
    );
    for (name, f) in sum_versions() {
        let mut got = start.clone();
        value_tiles(wv, (&mut got, &offsets), dim, f);
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "{name}: element {i}");
        }
    }
}

#[test]
fn scores_of_every_tile_shape_equal_the_twin() {
    for dim in [1, 7, 16, 64, 128] {
        for rows in 1..=ROWS_MAX {
            check_scores(dim, 53, rows, 0..4);
        }
        check_scores(dim, 100, 9, 1..7);
    }
}

#[test]
fn value_sums_with_causal_and_windowed_spans_equal_the_twin() {
    let causal: Vec<Range<usize>> = (0..ROWS_MAX).map(|r| 0..30 + r % 16).collect();
    let windowed: Vec<Range<usize>> = (0..ROWS_MAX)
        .map(|r| 10 + r % 16..20 + 2 * (r % 16))
        .collect();
    let disjoint = [0..3, 5..9, 9..9, 40..45, 1..2];
    for dim in [1, 5, 8, 15, 16, 17, 64, 65, 128, 200] {
        check_values(dim, 46, &causal);
        check_values(dim, 46, &windowed[..7]);
        check_values(dim, 46, &disjoint);
    }
    // Spans across several position chunks of `value_tiles` (64 positions
    // at 128 dimensions, 16 at 512), starting and ending inside chunks.
    let long: Vec<Range<usize>> = (0..ROWS_MAX)
        .map(|r| 3 * (r % 16)..200 + 7 * (r % 16))
        .collect();
    for dim in [128, 512] {
        check_values(dim, 320, &long);
        check_values(dim, 320, &[0..320, 17..18, 63..65, 100..300]);
    }
}

#[test]
fn a_panel_holds_each_keys_parts_in_its_block_lane_and_zeros_past_the_end() {
    let (keys, rope) = (values(3 * 5, 9), values(3 * 2, 10));
    let mut panel = vec![f32::NAN; panel_len(3, 5)];
    let parts = [
        KeyPart {
            keys: &keys,
            stride: 5,
            width: 3,
        },
        KeyPart {
            keys: &rope,
            stride: 2,
            width: 2,
        },
    ];
    fill_panel(&parts, 3, &mut panel);
    assert_eq!(panel.len(), BLOCK * 5);
    for d in 0..5 {
        for lane in 0..BLOCK {
            let key = |j: usize| {
                if d < 3 {
                    keys[j * 5 + d]
                } else {
                    rope[j * 2 + d - 3]
                }
            };
            let want = if lane < 3 { key(lane) } else { 0.0 };
            assert_eq!(panel[d * BLOCK + lane].to_bits(), want.to_bits());
        }
    }
}

proptest! {
    #[test]
    fn random_shapes_equal_the_twin(
        dim in 1usize..150,
        n in 1usize..90,
        rows in 1usize..=ROWS_MAX,
        ends in proptest::collection::vec((0usize..90, 0usize..90), 1..=ROWS_MAX),
    ) {
        let blocks = n.div_ceil(BLOCK);
        check_scores(dim, n, rows, 0..blocks);
        let spans: Vec<Range<usize>> = ends
            .iter()
            .map(|&(a, b)| a.min(b).min(n)..a.max(b).min(n))
            .collect();
        check_values(dim, n, &spans);
    }
}

type SoftmaxFn = fn(&mut [f32]);

fn softmax_versions() -> Vec<(&'static str, SoftmaxFn)> {
    let mut v: Vec<(&'static str, SoftmaxFn)> = vec![("dispatch", softmax)];
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: AVX2 and FMA were detected; callers pass non-empty rows.
            v.push(("avx2", |x| unsafe { avx2::softmax(x) }));
        }
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F was detected; as above.
            v.push(("avx512", |x| unsafe { avx512::softmax(x) }));
        }
    }
    v
}

#[test]
fn exp_is_within_two_ulp_of_std_and_zero_below_the_normals() {
    let mut x = 0f32;
    while x > EXP_MIN {
        let (got, want) = (exp_scalar(x), x.exp());
        let ulps = (got.to_bits() as i64 - want.to_bits() as i64).abs();
        assert!(ulps <= 2, "exp({x}) = {got}, std {want}");
        x -= 0.000_731;
    }
    for x in [-87.34f32, -100.0, -1e30, f32::NEG_INFINITY] {
        assert_eq!(exp_scalar(x), 0.0, "exp({x})");
    }
    assert_eq!(exp_scalar(0.0), 1.0);
    assert_eq!(exp_scalar(-0.0), 1.0);
}

/// Softmax with `f32::exp` and a plain sum.
fn libm_softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

fn check_softmax(x: &[f32]) {
    let mut want = x.to_vec();
    softmax_scalar(&mut want);
    let total: f64 = want.iter().map(|&v| f64::from(v)).sum();
    assert!((total - 1.0).abs() < 1e-5, "sums to one: {total}");
    let mut reference = x.to_vec();
    libm_softmax(&mut reference);
    for (a, b) in want.iter().zip(&reference) {
        assert!(
            (a - b).abs() <= 1e-6 + 4e-7 * b.abs(),
            "{a} vs libm softmax {b}"
        );
    }
    for (name, f) in softmax_versions() {
        let mut got = x.to_vec();
        f(&mut got);
        for (j, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{name}: element {j} of {}",
                x.len()
            );
        }
    }
}

#[test]
fn softmax_of_every_length_equals_the_twin() {
    for n in 1..70 {
        check_softmax(&values(n, n as u32));
        let spread: Vec<f32> = values(n, 7).iter().map(|v| v * 60.0).collect();
        check_softmax(&spread);
    }
    check_softmax(&values(1000, 11));
    check_softmax(&[-0.0, 0.0, -0.0]);
    check_softmax(&[3.0, -200.0, 2.0, -90.0]);
}
