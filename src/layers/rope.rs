//! Rotary position embeddings: the inverse frequencies of each scaling
//! scheme (default, linear, llama3, yarn — as transformers'
//! `ROPE_INIT_FUNCTIONS` define them) and their application to a head, in
//! either the half-split (`rotate_half`) or the interleaved convention.

use crate::formats::config::{RopeConfig, RopeScaling};

/// Precomputed rotary parameters for one attention flavour.
#[derive(Clone, Debug)]
pub struct Rope {
    /// `rotary_dim / 2` inverse frequencies, in f32 as transformers keeps them.
    inv_freq: Vec<f32>,
    /// Multiplies cos and sin (yarn's attention factor; 1 otherwise).
    attention_scaling: f32,
    rotary_dim: usize,
    interleaved: bool,
}

impl Rope {
    /// Builds the tables for `cfg`.
    pub fn new(cfg: &RopeConfig) -> Rope {
        let dim = cfg.rotary_dim;
        let base = cfg.theta;
        // pos_freqs = base ** (arange(0, dim, 2) / dim), computed in f32.
        let pos_freqs: Vec<f32> = (0..dim / 2)
            .map(|i| (base as f32).powf((2 * i) as f32 / dim as f32))
            .collect();
        let default: Vec<f32> = pos_freqs.iter().map(|p| 1.0 / p).collect();
        let (inv_freq, attention_scaling) = match &cfg.scaling {
            RopeScaling::Default => (default, 1.0),
            RopeScaling::Linear { factor } => {
                (default.iter().map(|f| f / *factor as f32).collect(), 1.0)
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => (
                llama3(
                    &default,
                    *factor,
                    *low_freq_factor,
                    *high_freq_factor,
                    *original_max_position_embeddings,
                ),
                1.0,
            ),
            RopeScaling::Yarn { .. } => yarn(&pos_freqs, cfg),
        };
        Rope {
            inv_freq,
            attention_scaling,
            rotary_dim: dim,
            interleaved: cfg.interleaved,
        }
    }

    /// The same frequencies with the given pair convention.
    pub fn with_interleaved(&self, interleaved: bool) -> Rope {
        Rope {
            interleaved,
            ..self.clone()
        }
    }

    /// cos and sin of each frequency at `pos`, times the attention scaling.
    pub fn cos_sin(&self, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
        for (i, f) in self.inv_freq.iter().enumerate() {
            let angle = pos as f32 * f;
            cos[i] = (angle as f64).cos() as f32 * self.attention_scaling;
            sin[i] = (angle as f64).sin() as f32 * self.attention_scaling;
        }
    }

    /// Rotates, at position `pos`, every `head_dim`-wide head of `x` from
    /// dim `skip` on (the rotary slice). cos/sin are computed once for all
    /// heads.
    pub fn apply_heads(&self, x: &mut [f32], head_dim: usize, skip: usize, pos: usize) {
        let half = self.rotary_dim / 2;
        let mut cos = [0f32; crate::formats::config::ROTARY_DIM_MAX / 2];
        let mut sin = [0f32; crate::formats::config::ROTARY_DIM_MAX / 2];
        assert!(half <= cos.len(), "rotary dim too large");
        assert!(
            skip + self.rotary_dim <= head_dim,
            "rotary slice outside the head"
        );
        self.cos_sin(pos, &mut cos[..half], &mut sin[..half]);
        for head in x.chunks_exact_mut(head_dim) {
            self.apply_with(&mut head[skip..], &cos[..half], &sin[..half]);
        }
    }

    /// Rotates with precomputed `cos`/`sin` (length `rotary_dim / 2`).
    fn apply_with(&self, head: &mut [f32], cos: &[f32], sin: &[f32]) {
        let half = self.rotary_dim / 2;
        for i in 0..half {
            let (a, b) = if self.interleaved {
                (2 * i, 2 * i + 1)
            } else {
                (i, i + half)
            };
            let (x1, x2) = (head[a], head[b]);
            head[a] = x1 * cos[i] - x2 * sin[i];
            head[b] = x2 * cos[i] + x1 * sin[i];
        }
    }
}

fn llama3(inv: &[f32], factor: f64, low: f64, high: f64, old_ctx: f64) -> Vec<f32> {
    let low_wavelen = old_ctx / low;
    let high_wavelen = old_ctx / high;
    inv.iter()
        .map(|&f| {
            let wavelen = 2.0 * std::f64::consts::PI / f as f64;
            if wavelen > low_wavelen {
                (f as f64 / factor) as f32
            } else if wavelen < high_wavelen {
                f
            } else {
                let smooth = (old_ctx / wavelen - low) / (high - low);
                ((1.0 - smooth) * f as f64 / factor + smooth * f as f64) as f32
            }
        })
        .collect()
}

fn yarn_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

/// transformers' `_compute_yarn_parameters`.
fn yarn(pos_freqs: &[f32], cfg: &RopeConfig) -> (Vec<f32>, f32) {
    let RopeScaling::Yarn {
        factor,
        original_max_position_embeddings: orig,
        beta_fast,
        beta_slow,
        mscale,
        mscale_all_dim,
        attention_factor,
        truncate,
    } = cfg.scaling.clone()
    else {
        unreachable!("yarn() called for a non-yarn config")
    };
    let dim = cfg.rotary_dim as f64;
    let base = cfg.theta;
    let attention = attention_factor.unwrap_or_else(|| match (mscale, mscale_all_dim) {
        (Some(m), Some(a)) if m != 0.0 && a != 0.0 => {
            yarn_mscale(factor, m) / yarn_mscale(factor, a)
        }
        _ => yarn_mscale(factor, 1.0),
    });
    let corr =
        |rot: f64| dim * (orig / (rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln());
    let (mut low, mut high) = (corr(beta_fast), corr(beta_slow));
    if truncate {
        low = low.floor();
        high = high.ceil();
    }
    let low = low.max(0.0) as f32;
    let mut high = high.min(dim - 1.0) as f32;
    if low == high {
        high += 0.001;
    }
    let inv = pos_freqs
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
            let extra_factor = 1.0 - ramp;
            let interp = 1.0 / (factor as f32 * p);
            let extra = 1.0 / p;
            interp * (1.0 - extra_factor) + extra * extra_factor
        })
        .collect();
    (inv, attention as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(interleaved: bool) -> RopeConfig {
        RopeConfig {
            theta: 10000.0,
            scaling: RopeScaling::Default,
            rotary_dim: 4,
            interleaved,
            max_position_embeddings: 128,
        }
    }

    #[test]
    fn position_zero_is_identity() {
        let r = Rope::new(&cfg(false));
        let mut h = [1.0f32, 2.0, 3.0, 4.0, 5.0];
        r.apply_heads(&mut h, 5, 0, 0);
        assert_eq!(h, [1.0, 2.0, 3.0, 4.0, 5.0]);
    }

    #[test]
    fn rotation_preserves_pair_norms() {
        for inter in [false, true] {
            let r = Rope::new(&cfg(inter));
            let mut h = [1.0f32, 2.0, 3.0, 4.0];
            r.apply_heads(&mut h, 4, 0, 7);
            let n: f32 = h.iter().map(|v| v * v).sum();
            assert!((n - 30.0).abs() < 1e-4);
        }
    }
}
