//! FP8 e4m3 ("float8_e4m3fn") checkpoints as vendors ship them (DeepSeek-V3,
//! GLM-5): each 2-D weight stored in FP8 with an f32 `weight_scale_inv` grid
//! of one scale per 128×128 block (the last row and column of blocks may be
//! partial). The dequantized weight is `fp8_to_f32(w) · scale[r/128][c/128]`,
//! computed in f32 as torch computes it, so the result is bit-exact.

/// Side of a square scale block.
pub const BLOCK: usize = 128;

/// The exact f32 value of an e4m3fn byte: 1 sign, 4 exponent (bias 7) and
/// 3 mantissa bits; no infinities; `S.1111.111` is NaN; exponent 0 is
/// subnormal (`m/8 · 2^-6`).
pub fn to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((b >> 3) & 0x0F) as i32;
    let man = (b & 0x07) as f32;
    if exp == 0x0F && b & 0x07 == 0x07 {
        return f32::NAN;
    }
    let mag = if exp == 0 {
        man / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    };
    sign * mag
}

/// Dequantizes a row-major `(rows, cols)` FP8 matrix with its
/// `(ceil(rows/128), ceil(cols/128))` block scales.
pub fn dequantize(w: &[u8], scale_inv: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    assert_eq!(w.len(), rows * cols, "fp8 data does not match its shape");
    let bc = cols.div_ceil(BLOCK);
    assert_eq!(
        scale_inv.len(),
        rows.div_ceil(BLOCK) * bc,
        "fp8 scale grid does not match its shape"
    );
    let table: Vec<f32> = (0..=255u8).map(to_f32).collect();
    let mut out = vec![0f32; rows * cols];
    for r in 0..rows {
        let srow = &scale_inv[(r / BLOCK) * bc..(r / BLOCK + 1) * bc];
        for c in 0..cols {
            out[r * cols + c] = table[w[r * cols + c] as usize] * srow[c / BLOCK];
        }
    }
    out
}

/// Shape of the scale grid of a `(rows, cols)` weight.
pub fn scale_grid(rows: usize, cols: usize) -> [usize; 2] {
    [rows.div_ceil(BLOCK), cols.div_ceil(BLOCK)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_landmarks_of_e4m3fn() {
        assert_eq!(to_f32(0x00), 0.0);
        assert_eq!(to_f32(0x38), 1.0); // exp 7, man 0
        assert_eq!(to_f32(0x7E), 448.0); // largest finite
        assert_eq!(to_f32(0xFE), -448.0);
        assert_eq!(to_f32(0x01), 2f32.powi(-9)); // smallest subnormal
        assert_eq!(to_f32(0x08), 2f32.powi(-6)); // smallest normal
        assert!(to_f32(0x7F).is_nan() && to_f32(0xFF).is_nan());
        // Positive codes are strictly increasing.
        let pos: Vec<f32> = (0..0x7Fu8).map(to_f32).collect();
        assert!(pos.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn block_scales_cover_partial_blocks() {
        let (rows, cols) = (130, 3);
        let w = vec![0x38u8; rows * cols]; // all 1.0
        let s = [2.0f32, 3.0];
        assert_eq!(scale_grid(rows, cols), [2, 1]);
        let d = dequantize(&w, &s, rows, cols);
        assert_eq!(d[127 * cols], 2.0);
        assert_eq!(d[128 * cols + 2], 3.0);
    }
}
