//! RMSNorm, with the sum of squares accumulated in f64 (SPEC §3).

use crate::layers::scratch::Scratch;

/// `out = w * (x / sqrt(mean(x²) + eps))`, one row of length `w.len()`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f64, out: &mut [f32]) {
    assert_eq!(x.len(), w.len());
    assert_eq!(out.len(), w.len());
    let ss: f64 = x.iter().map(|v| (*v as f64) * (*v as f64)).sum();
    let inv = (1.0 / (ss / x.len() as f64 + eps).sqrt()) as f32;
    for ((o, xv), wv) in out.iter_mut().zip(x).zip(w) {
        *o = wv * (xv * inv);
    }
}

/// In-place RMSNorm of each `w.len()`-sized row of `x`.
pub fn rms_norm_rows(x: &mut [f32], w: &[f32], eps: f64) {
    let d = w.len();
    assert_eq!(x.len() % d, 0);
    let mut tmp = Scratch::zeroed(d);
    for row in x.chunks_exact_mut(d) {
        rms_norm(row, w, eps, &mut tmp);
        row.copy_from_slice(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_weight_gives_unit_rms() {
        let x = [3.0f32, -4.0, 0.0, 5.0];
        let mut out = [0f32; 4];
        rms_norm(&x, &[1.0; 4], 0.0, &mut out);
        let rms: f32 = (out.iter().map(|v| v * v).sum::<f32>() / 4.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-6);
    }
}
