//! Stored element types and their conversion to f32. The engine computes in
//! f32; F32, BF16 and F16 checkpoints are read and widened here.

use half::{bf16, f16};

/// Element types the engine reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    BF16,
    F16,
}

impl DType {
    /// Parses the safetensors header spelling; `None` for unsupported types.
    pub fn from_safetensors(d: safetensors::Dtype) -> Option<DType> {
        match d {
            safetensors::Dtype::F32 => Some(DType::F32),
            safetensors::Dtype::BF16 => Some(DType::BF16),
            safetensors::Dtype::F16 => Some(DType::F16),
            _ => None,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::BF16 | DType::F16 => 2,
        }
    }
}

/// Widens little-endian `bytes` of `dtype` into `out` (lengths must agree).
pub fn to_f32(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    assert_eq!(
        bytes.len(),
        out.len() * dtype.size(),
        "byte length / element count mismatch"
    );
    match dtype {
        DType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        DType::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widens_each_dtype_exactly() {
        let vals = [1.5f32, -2.25, 0.0, 65504.0];
        let f32b: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let bf: Vec<u8> = vals
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect();
        let hf: Vec<u8> = vals
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect();
        for (dt, b) in [(DType::F32, f32b), (DType::BF16, bf), (DType::F16, hf)] {
            let mut out = [0f32; 4];
            to_f32(dt, &b, &mut out);
            assert_eq!(&out[..3], &vals[..3], "{dt:?}");
        }
    }
}
