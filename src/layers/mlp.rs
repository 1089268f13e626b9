//! The SwiGLU feed-forward block `down(silu(gate x) * up x)`: dense MLP
//! layers, shared experts and every routed expert share this type.

use crate::formats::tensor::Mat;
use crate::layers::scratch::Scratch;
use crate::layers::tap::{self, Block, Part};

/// Gate, up and down projections, row-major, each in its kept element type.
pub struct Mlp {
    /// (inter, hidden)
    pub gate: Mat,
    /// (inter, hidden)
    pub up: Mat,
    /// (hidden, inter)
    pub down: Mat,
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
        self.gate.bytes() + self.up.bytes() + self.down.bytes()
    }

    /// Applies the block to `n` rows of `x` `(n, hidden)` into `out` `(n, hidden)`;
    /// `block` names it for calibration taps.
    pub fn forward(&self, block: Block, x: &[f32], n: usize, out: &mut [f32]) {
        let i = self.inter;
        let mut g = Scratch::zeroed(n * i); // (n, inter)
        let mut u = Scratch::zeroed(n * i); // (n, inter)
        tap::record(Part::MlpIn(block), x, self.hidden);
        self.gate.matmul_pair(&self.up, x, n, &mut g, &mut u);
        for (gv, uv) in g.iter_mut().zip(&u) {
            *gv = silu(*gv) * uv;
        }
        tap::record(Part::MlpDown(block), &g, i);
        self.down.matmul(&g, n, out);
    }
}
