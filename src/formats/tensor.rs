//! Weight matrices in the element type they are kept in RAM. F32 and BF16
//! checkpoints keep their own type (BF16 halves the RAM of every expert and
//! needs no widening on a cache miss); F16 is widened to f32 on load; packed
//! int8/int4/int2 container tensors (per row or grouped) stay packed. BF16 products are identical
//! to the f32 path on the widened weights; packed products run the integer
//! kernels; GGUF block matrices (Q4_0 … Q6_K) stay in their blocks and
//! multiply through [`crate::kernels::ggml`].

use crate::formats::quant::grouped::GMatrix;
use crate::formats::quant::policy::Width;
use crate::formats::quant::QMatrix;
use crate::formats::quant::Words;
use crate::formats::weights::dtype::{self, DType};
use crate::kernels::ggml::{self, BlockType};
use crate::kernels::{bf16, f32 as kf32, matmul_rows};

/// The elements of a matrix.
#[derive(Clone, Debug, PartialEq)]
pub enum MatData {
    F32(Vec<f32>),
    /// Raw BF16 bit patterns.
    Bf16(Vec<u16>),
    /// Packed integers with per-row scales.
    Q(QMatrix),
    /// Packed integers with f16 scales (and mins) per group of columns.
    Grouped(GMatrix),
    /// llama.cpp blocks, `rows * ty.row_bytes(cols)` bytes.
    Ggml {
        ty: BlockType,
        data: Words<u8>,
    },
}

/// A row-major `(rows, cols)` weight matrix, as PyTorch's `Linear` stores it.
#[derive(Clone, Debug, PartialEq)]
pub struct Mat {
    pub rows: usize,
    pub cols: usize,
    pub data: MatData,
}

impl Mat {
    /// The flat index of the first NaN or infinite element (for packed
    /// matrices: the first row whose scale is not finite), if any.
    pub fn first_non_finite(&self) -> Option<usize> {
        match &self.data {
            MatData::F32(v) => v.iter().position(|x| !x.is_finite()),
            // BF16 NaN and Inf have every exponent bit set.
            MatData::Bf16(v) => v.iter().position(|b| b & 0x7f80 == 0x7f80),
            MatData::Q(q) => q
                .scales
                .iter()
                .position(|x| !x.is_finite())
                .map(|row| row * self.cols),
            MatData::Grouped(g) => g.first_non_finite_row().map(|row| row * self.cols),
            MatData::Ggml { ty, data } => ggml::first_non_finite(*ty, data),
        }
    }

    /// An f32 matrix.
    pub fn f32(rows: usize, cols: usize, data: Vec<f32>) -> Mat {
        assert_eq!(
            data.len(),
            rows * cols,
            "matrix data does not match its shape"
        );
        Mat {
            rows,
            cols,
            data: MatData::F32(data),
        }
    }

    /// A matrix from stored little-endian bytes of `dt`, kept in BF16 when
    /// stored in BF16, else f32.
    pub fn from_bytes(dt: DType, bytes: &[u8], rows: usize, cols: usize) -> Mat {
        assert_eq!(
            bytes.len(),
            rows * cols * dt.size(),
            "byte length does not match the shape"
        );
        let data = match dt {
            DType::BF16 => MatData::Bf16(
                bytes
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .collect(),
            ),
            DType::F32 | DType::F16 => {
                let mut out = vec![0f32; rows * cols];
                dtype::to_f32(dt, bytes, &mut out);
                MatData::F32(out)
            }
        };
        Mat { rows, cols, data }
    }

    /// A packed matrix.
    pub fn quant(q: QMatrix) -> Mat {
        Mat {
            rows: q.rows,
            cols: q.cols,
            data: MatData::Q(q),
        }
    }

    /// A grouped packed matrix.
    pub fn grouped(g: GMatrix) -> Mat {
        Mat {
            rows: g.rows,
            cols: g.cols,
            data: MatData::Grouped(g),
        }
    }

    /// A matrix of llama.cpp blocks; `None` when `data` is not exactly
    /// `rows` rows of `cols` elements of `ty`.
    pub fn ggml(ty: BlockType, rows: usize, cols: usize, data: Words<u8>) -> Option<Mat> {
        let want = ty.row_bytes(cols)?.checked_mul(rows)?;
        (data.len() == want).then_some(Mat {
            rows,
            cols,
            data: MatData::Ggml { ty, data },
        })
    }

    /// Stores row-major f32 `w` `(rows, cols)` at `width`: the one encoder
    /// of the converter and the runtime quantizer. A block width must be
    /// [`Width::fitted`] to `cols` (whole blocks).
    pub fn encode(w: Vec<f32>, rows: usize, cols: usize, width: Width) -> Mat {
        match width {
            Width::F32 => Mat::f32(rows, cols, w),
            Width::Bf16 => Mat {
                rows,
                cols,
                data: MatData::Bf16(
                    w.iter()
                        .map(|v| half::bf16::from_f32(*v).to_bits())
                        .collect(),
                ),
            },
            Width::Int(bits) => Mat::quant(QMatrix::quantize(&w, rows, cols, bits)),
            Width::Blocks(ty) => {
                let data = crate::formats::quant::kquant::quantize(ty, &w, rows, cols, None);
                Mat::ggml(ty, rows, cols, data.into()).expect("whole blocks")
            }
            Width::Grouped(f) => Mat::grouped(GMatrix::quantize(&w, rows, cols, f, None)),
        }
    }

    /// [`Mat::encode`] weighting each column's rounding error by
    /// `importance` (one per column; see
    /// [`crate::formats::quant::quantize_row_weighted`]). Float widths do
    /// not round, and are stored as [`Mat::encode`] stores them.
    pub fn encode_weighted(
        w: Vec<f32>,
        rows: usize,
        cols: usize,
        width: Width,
        importance: &[f32],
    ) -> Mat {
        match width {
            Width::Int(bits) => {
                Mat::quant(QMatrix::quantize_weighted(&w, rows, cols, bits, importance))
            }
            Width::Blocks(ty) => {
                let q =
                    crate::formats::quant::kquant::quantize(ty, &w, rows, cols, Some(importance));
                Mat::ggml(ty, rows, cols, q.into()).expect("whole blocks")
            }
            Width::Grouped(f) => {
                Mat::grouped(GMatrix::quantize(&w, rows, cols, f, Some(importance)))
            }
            _ => Mat::encode(w, rows, cols, width),
        }
    }

    /// The container width the matrix is kept at.
    pub fn width(&self) -> Option<Width> {
        match &self.data {
            MatData::F32(_) => Some(Width::F32),
            MatData::Bf16(_) => Some(Width::Bf16),
            MatData::Q(q) => Some(Width::Int(q.bits)),
            MatData::Grouped(g) => Some(Width::Grouped(g.format)),
            MatData::Ggml { ty, .. } => Some(Width::Blocks(*ty)),
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        match &self.data {
            MatData::F32(v) => v.len() * 4,
            MatData::Bf16(v) => v.len() * 2,
            MatData::Q(q) => q.data.len() + q.scales.len() * 4,
            MatData::Grouped(g) => g.bytes(),
            MatData::Ggml { data, .. } => data.len(),
        }
    }

    /// The whole matrix widened (or dequantized) to f32, row-major.
    pub fn to_f32(&self) -> Vec<f32> {
        match &self.data {
            MatData::F32(v) => v.clone(),
            MatData::Bf16(v) => v.iter().map(|b| bf16::widen(*b)).collect(),
            MatData::Q(q) => q.dequantize(),
            MatData::Grouped(g) => g.dequantize(),
            MatData::Ggml { .. } => {
                let mut out = vec![0f32; self.rows * self.cols];
                for (r, row) in out.chunks_exact_mut(self.cols.max(1)).enumerate() {
                    self.row_into(r, row);
                }
                out
            }
        }
    }

    /// Row `r` widened to f32 into `out` (an embedding lookup).
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        let c = self.cols;
        assert_eq!(out.len(), c);
        match &self.data {
            MatData::F32(v) => out.copy_from_slice(&v[r * c..(r + 1) * c]),
            MatData::Bf16(v) => {
                for (o, b) in out.iter_mut().zip(&v[r * c..(r + 1) * c]) {
                    *o = bf16::widen(*b);
                }
            }
            MatData::Q(q) => q.dequant_row(r, out),
            MatData::Grouped(g) => g.dequant_row(r, out),
            MatData::Ggml { ty, data } => {
                let rb = ty.row_bytes(c).expect("checked in Mat::ggml");
                ggml::dequantize_row(*ty, &data[r * rb..(r + 1) * rb], out);
            }
        }
    }

    /// `Y[t, :] = W · X[t, :]` for `n` rows of `x` `(n, cols)` into `y` `(n, rows)`.
    pub fn matmul(&self, x: &[f32], n: usize, y: &mut [f32]) {
        let c = self.cols;
        match &self.data {
            MatData::F32(w) => kf32::matmul(w, self.rows, c, x, n, y),
            MatData::Bf16(w) => matmul_rows(self.rows, c, x, n, y, |r, xr| {
                bf16::dot(&w[r * c..(r + 1) * c], xr)
            }),
            MatData::Q(q) => q.matmul(x, n, y),
            MatData::Grouped(g) => g.matmul(x, n, y),
            MatData::Ggml { ty, data } => ggml::matmul(*ty, data, self.rows, c, x, n, y),
        }
    }

    /// [`Mat::matmul`] of `self` and `other` against the same `x` (an
    /// MLP's gate and up), sharing the activations' quantization where
    /// both are packed integer matrices ([`QMatrix::matmul_pair`]) or both
    /// grouped ones ([`GMatrix::matmul_pair`]); the same bits as two
    /// [`Mat::matmul`] calls.
    pub fn matmul_pair(&self, other: &Mat, x: &[f32], n: usize, y: &mut [f32], yo: &mut [f32]) {
        match (&self.data, &other.data) {
            (MatData::Q(a), MatData::Q(b)) => a.matmul_pair(b, x, n, y, yo),
            (MatData::Grouped(a), MatData::Grouped(b)) => a.matmul_pair(b, x, n, y, yo),
            _ => {
                self.matmul(x, n, y);
                other.matmul(x, n, yo);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16 as hbf16;

    #[test]
    fn bf16_matrix_matches_its_widened_f32_twin_bit_for_bit() {
        let (rows, cols, n) = (37, 75, 3);
        let vals: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 % 263) as f32 - 131.0) / 37.0)
            .collect();
        let bytes: Vec<u8> = vals
            .iter()
            .flat_map(|v| hbf16::from_f32(*v).to_le_bytes())
            .collect();
        let m = Mat::from_bytes(DType::BF16, &bytes, rows, cols);
        assert!(matches!(m.data, MatData::Bf16(_)));
        assert_eq!(m.bytes(), rows * cols * 2);
        let mut widened = vec![0f32; rows * cols];
        dtype::to_f32(DType::BF16, &bytes, &mut widened);
        let twin = Mat::f32(rows, cols, widened);
        let x: Vec<f32> = (0..n * cols).map(|i| (i as f32 * 0.37).sin()).collect();
        let (mut a, mut b) = (vec![0f32; n * rows], vec![0f32; n * rows]);
        m.matmul(&x, n, &mut a);
        twin.matmul(&x, n, &mut b);
        assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()));
    }

    #[test]
    fn f16_is_widened_on_load() {
        let bytes: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect();
        let m = Mat::from_bytes(DType::F16, &bytes, 1, 2);
        assert!(matches!(m.data, MatData::F32(ref v) if v == &[1.5, -2.0]));
    }
}
