//! The SwiGLU feed-forward block `down(silu(gate x) * up x)`: dense MLP
//! layers, shared experts and every routed expert share this type.

use crate::kernels::f32::matmul;

/// Gate, up and down projections, row-major f32.
pub struct Mlp {
    /// (inter, hidden)
    pub gate: Vec<f32>,
    /// (inter, hidden)
    pub up: Vec<f32>,
    /// (hidden, inter)
    pub down: Vec<f32>,
    pub hidden: usize,
    pub inter: usize,
}

/// `x * sigmoid(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

impl Mlp {
    /// Bytes held by the three matrices.
    pub fn bytes(&self) -> usize {
        (self.gate.len() + self.up.len() + self.down.len()) * 4
    }

    /// Applies the block to `n` rows of `x` `(n, hidden)` into `out` `(n, hidden)`.
    pub fn forward(&self, x: &[f32], n: usize, out: &mut [f32]) {
        let (h, i) = (self.hidden, self.inter);
        let mut g = vec![0f32; n * i]; // (n, inter)
        let mut u = vec![0f32; n * i]; // (n, inter)
        matmul(&self.gate, i, h, x, n, &mut g);
        matmul(&self.up, i, h, x, n, &mut u);
        for (gv, uv) in g.iter_mut().zip(&u) {
            *gv = silu(*gv) * uv;
        }
        matmul(&self.down, h, i, &g, n, out);
    }
}
