//! The searched quantizers of Q5_0, Q5_1, IQ4_NL and IQ4_XS (see the
//! parent's doc for the search; weights `w` per value):
//! - Q5_0 (`x ≈ d·q`, `q` in −16..=15): the symmetric search of Q8_0 and
//!   Q6_K ([`fit_sym`]), both signs (the level range is lopsided).
//! - Q5_1 (`x ≈ d·q + m`, `q` in 0..=31, any `m`): grids spanning `[min x,
//!   max x]` with `31 + δ` steps, each followed by the weighted least squares
//!   for `(d, m)` given its levels.
//! - IQ4_NL (`x ≈ d·kvalues[i]`): `d = max / (kvalues[0] + δ)` and `d = max
//!   / (kvalues[15] + δ)` for each `δ`, each followed by nearest-entry indices
//!   and the weighted least-squares `d` for them.
//! - IQ4_XS: IQ4_NL's search per 32-value sub-block, then (as ggml) `d` =
//!   the sub-block scale of largest magnitude over −32, the 6-bit scale the
//!   nearest multiple in −32..=31, and every index the nearest entry of the
//!   final grid.

use super::{fit_sym, from_f16, level, normal_sums, search_grids, signed_absmax, to_f16, STEPS};
use crate::kernels::ggml::{Planned, IQ4_VALUES};

pub(super) fn plan_q5_0(x: &[f32], w: &[f32]) -> Planned {
    let d = to_f16(fit_sym(x, w, -16, 15));
    let df = from_f16(d);
    let levels = std::array::from_fn(|i| {
        if df != 0.0 {
            (level(x[i] / df, -16, 15) + 16) as u8
        } else {
            16
        }
    });
    Planned::Q5_0 { d, levels }
}

pub(super) fn plan_q5_1(x: &[f32], w: &[f32]) -> Planned {
    let (s, b) = fit_offset(x, w, 31);
    let (d, m) = (to_f16(s), to_f16(b));
    let (df, mf) = (from_f16(d), from_f16(m));
    let levels = std::array::from_fn(|i| {
        if df > 0.0 {
            level((x[i] - mf) / df, 0, 31) as u8
        } else {
            0
        }
    });
    Planned::Q5_1 { d, m, levels }
}

/// The `(s, b)` with `s ≥ 0` of `x ≈ s·q + b`, `q` in `0..=nmax`, with the
/// lowest weighted error over the candidate grids (the parent's search with
/// `m = −b` free).
fn fit_offset(x: &[f32], w: &[f32], nmax: i32) -> (f32, f32) {
    let lo = x.iter().fold(f32::MAX, |a, &v| a.min(v));
    let fit = |x: &[f32], w: &[f32], q: &[f32]| least_squares_free(x, w, q).map(|(s, b)| (s, -b));
    let (s, m) = search_grids(x, w, nmax, lo, fit);
    (s, -m)
}

/// The weighted least-squares `(s, b)` of `x ≈ s·q + b` for fixed levels;
/// `None` unless the scale comes out positive.
fn least_squares_free(x: &[f32], w: &[f32], q: &[f32]) -> Option<(f32, f32)> {
    let [sw, sq, sqq, sx, sqx] = normal_sums(x, w, q);
    let det = sw * sqq - sq * sq;
    if det <= 0.0 {
        return None;
    }
    let s = (sw * sqx - sq * sx) / det;
    let b = (sqq * sx - sq * sqx) / det;
    (s > 0.0 && b.is_finite()).then_some((s, b))
}

/// The index of the table entry nearest `t` (the lower one on a tie).
fn nearest(t: f32) -> usize {
    let mut best = 0;
    for (i, &k) in IQ4_VALUES.iter().enumerate().skip(1) {
        if (k as f32 - t).abs() < (IQ4_VALUES[best] as f32 - t).abs() {
            best = i;
        }
    }
    best
}

/// Weighted squared error of `x` on the table times `d`, nearest entries.
fn nl_error(x: &[f32], w: &[f32], d: f32) -> f32 {
    x.iter()
        .zip(w)
        .map(|(&v, &wi)| {
            let i = if d != 0.0 { nearest(v / d) } else { 0 };
            let e = d * IQ4_VALUES[i] as f32 - v;
            wi * e * e
        })
        .sum()
}

/// The scale `d` of `x ≈ d·kvalues[i]` with the lowest weighted error over
/// the candidates (module doc); 0 for an all-zero `x`.
fn fit_nl(x: &[f32], w: &[f32]) -> f32 {
    let mx = signed_absmax(x);
    if mx == 0.0 || !mx.is_finite() {
        return mx;
    }
    let (first, last) = (IQ4_VALUES[0] as f32, IQ4_VALUES[15] as f32);
    let start = mx / first;
    let mut best = (nl_error(x, w, start), start);
    for k in 0..STEPS {
        let delta = 20.0 * k as f32 / (STEPS - 1) as f32 - 10.0;
        for target in [first + delta, last + delta] {
            let d0 = mx / target;
            let (mut sqx, mut sqq) = (0f32, 0f32);
            for (&v, &wi) in x.iter().zip(w) {
                let q = IQ4_VALUES[nearest(v / d0)] as f32;
                sqx += wi * q * v;
                sqq += wi * q * q;
            }
            if sqq <= 0.0 {
                continue;
            }
            let d = sqx / sqq;
            let err = nl_error(x, w, d);
            if err < best.0 {
                best = (err, d);
            }
        }
    }
    best.1
}

/// The nearest-entry indices of `x` on the table times `d`.
fn indices<const N: usize>(x: &[f32], d: impl Fn(usize) -> f32) -> [u8; N] {
    std::array::from_fn(|i| {
        let d = d(i);
        if d != 0.0 {
            nearest(x[i] / d) as u8
        } else {
            // Index 8 decodes to d·1 = 0.
            8
        }
    })
}

pub(super) fn plan_iq4_nl(x: &[f32], w: &[f32]) -> Planned {
    let d = to_f16(fit_nl(x, w));
    let df = from_f16(d);
    Planned::Iq4Nl {
        d,
        idx: indices(x, |_| df),
    }
}

pub(super) fn plan_iq4_xs(x: &[f32], w: &[f32]) -> Planned {
    let s: [f32; 8] =
        std::array::from_fn(|j| fit_nl(&x[32 * j..32 * j + 32], &w[32 * j..32 * j + 32]));
    let d = to_f16(signed_absmax(&s) / -32.0);
    let df = from_f16(d);
    let sc = s.map(|s| {
        if df != 0.0 {
            level(s / df, -32, 31) as i8
        } else {
            0
        }
    });
    Planned::Iq4Xs {
        d,
        sc,
        idx: indices(x, |i| df * sc[i / 32] as f32),
    }
}
