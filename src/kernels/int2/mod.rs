//! int2-weight integer dot product, scalar only: int2 is an experiment
//! width (SPEC §4), kept as a reference. Column `4j + k` of a packed row is
//! bits `2k..2k+1` of byte `j`, stored as `q + 2` (0..3).

/// `Σ q[c]·x[c]` over the `x.len()` columns of a packed int2 row.
pub fn dot_scalar(w: &[u8], x: &[i8]) -> i32 {
    assert_eq!(w.len(), x.len().div_ceil(4), "dot: length mismatch");
    let mut s = 0i32;
    for (&b, xs) in w.iter().zip(x.chunks(4)) {
        for (k, &xv) in xs.iter().enumerate() {
            let q = ((b >> (2 * k)) & 3) as i32 - 2;
            s += q * xv as i32;
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::quant::{quantize_row, unpack_row, QBits};

    #[test]
    fn matches_the_unpacked_row() {
        for cols in 0..40 {
            let row: Vec<f32> = (0..cols)
                .map(|c| ((c * 5 % 7) as f32 - 3.0) / 2.0)
                .collect();
            let mut p = vec![0u8; QBits::Int2.row_bytes(cols)];
            quantize_row(&row, QBits::Int2, &mut p);
            let mut q = vec![0f32; cols];
            unpack_row(QBits::Int2, &p, &mut q);
            let x: Vec<i8> = (0..cols)
                .map(|c| (c as i32 * 37 % 255 - 127) as i8)
                .collect();
            let want: i32 = q.iter().zip(&x).map(|(&q, &x)| q as i32 * x as i32).sum();
            assert_eq!(dot_scalar(&p, &x), want, "cols {cols}");
        }
    }
}
