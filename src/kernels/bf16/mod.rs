//! BF16-weight kernels: dot products of BF16 weight rows (stored as raw
//! `u16`) with f32 activations, accumulated in f32. Widening BF16 to f32 is
//! exact (the 16 bits become the high half of an f32), and every version
//! here accumulates in exactly the order of its `kernels::f32` counterpart,
//! so a BF16 matrix gives bit-identical results to the same matrix widened
//! to f32 — keeping experts in BF16 halves their RAM and skips the widening
//! on every cache miss without changing a token.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

use super::cpu::{isa, Isa};

/// Exact widening of one BF16 value.
#[inline]
pub fn widen(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// Scalar reference: the same 8 interleaved partial sums as `f32::dot_scalar`.
pub fn dot_scalar(w: &[u16], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len());
    let mut acc = [0f32; 8];
    let chunks = w.len() / 8 * 8;
    for i in (0..chunks).step_by(8) {
        for l in 0..8 {
            acc[l] += widen(w[i + l]) * x[i + l];
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for i in chunks..w.len() {
        s += widen(w[i]) * x[i];
    }
    s
}

/// Dot product, dispatched to the best ISA.
#[inline]
pub fn dot(w: &[u16], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len(), "dot: length mismatch");
    #[cfg(target_arch = "x86_64")]
    match isa() {
        // SAFETY: `isa()` reported AVX-512F on this CPU; lengths are equal (asserted).
        Isa::Avx512 | Isa::Avx512Vnni => return unsafe { avx512::dot(w, x) },
        // SAFETY: `isa()` reported AVX2 and FMA on this CPU; lengths are equal (asserted).
        Isa::Avx2 => return unsafe { avx2::dot(w, x) },
        Isa::Scalar => {}
    }
    dot_scalar(w, x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::f32 as kf32;
    use proptest::prelude::*;

    fn widened(w: &[u16]) -> Vec<f32> {
        w.iter().map(|b| widen(*b)).collect()
    }

    /// Finite BF16 bit patterns of moderate magnitude.
    fn bf16s(n: usize) -> impl Strategy<Value = Vec<u16>> {
        proptest::collection::vec(-8.0f32..8.0, n)
            .prop_map(|v| v.iter().map(|f| (f.to_bits() >> 16) as u16).collect())
    }

    proptest! {
        #[test]
        fn each_version_is_bit_identical_to_its_f32_twin(
            (w, x) in (0usize..300).prop_flat_map(|n| (bf16s(n), proptest::collection::vec(-4.0f32..4.0, n)))
        ) {
            let wf = widened(&w);
            prop_assert_eq!(dot_scalar(&w, &x).to_bits(), kf32::dot_scalar(&wf, &x).to_bits());
            prop_assert_eq!(dot(&w, &x).to_bits(), kf32::dot(&wf, &x).to_bits());
            #[cfg(target_arch = "x86_64")]
            {
                if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                    // SAFETY: AVX2 and FMA detected just above; equal lengths.
                    let (a, b) = unsafe { (avx2::dot(&w, &x), kf32::avx2_dot(&wf, &x)) };
                    prop_assert_eq!(a.to_bits(), b.to_bits());
                }
                if is_x86_feature_detected!("avx512f") {
                    // SAFETY: AVX-512F detected just above; equal lengths.
                    let (a, b) = unsafe { (avx512::dot(&w, &x), kf32::avx512_dot(&wf, &x)) };
                    prop_assert_eq!(a.to_bits(), b.to_bits());
                }
            }
        }
    }

    #[test]
    fn widening_is_exact() {
        for v in [1.0f32, -2.5, 0.0, -0.0, 3.140625, f32::INFINITY] {
            let b = (v.to_bits() >> 16) as u16;
            assert_eq!(widen(b).to_bits(), v.to_bits());
        }
    }
}
