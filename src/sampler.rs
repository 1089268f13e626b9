//! Next-token choice: greedy argmax, or temperature / top-k / top-p
//! sampling with a seeded generator (so a seed reproduces a run).

/// Sampling settings; `temperature == 0` means greedy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_p: f32,
    /// 0 disables the top-k filter.
    pub top_k: usize,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
        }
    }
}

/// The highest temperature accepted (beyond it every distribution is flat
/// to f32 precision).
pub const TEMPERATURE_MAX: f32 = 1e3;

impl SamplingParams {
    /// Refuses settings that would make sampling meaningless: a temperature
    /// that is not finite or outside `[0, TEMPERATURE_MAX]`, a `top_p`
    /// outside `(0, 1]` or not finite. The message names the setting.
    pub fn validate(&self) -> Result<(), String> {
        let t = self.temperature;
        if !(t.is_finite() && (0.0..=TEMPERATURE_MAX).contains(&t)) {
            return Err(format!(
                "temperature {t} is outside [0, {TEMPERATURE_MAX}] (0 is greedy)"
            ));
        }
        let p = self.top_p;
        if !(p.is_finite() && p > 0.0 && p <= 1.0) {
            return Err(format!("top_p {p} is outside (0, 1]"));
        }
        Ok(())
    }
}

/// splitmix64: a small, well-mixed, seedable generator.
pub struct Rng(u64);

impl Rng {
    /// Seeded generator.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Index of the largest logit (first on ties, as torch.argmax).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in logits.iter().enumerate() {
        if *v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Picks the next token from `logits`.
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
}

impl Sampler {
    /// A sampler with `params`.
    pub fn new(params: SamplingParams) -> Sampler {
        Sampler {
            params,
            rng: Rng::new(params.seed),
        }
    }

    /// The next token id.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let p = self.params;
        if p.temperature <= 0.0 || p.top_k == 1 {
            return argmax(logits);
        }
        let mut cand: Vec<(usize, f64)> = logits
            .iter()
            .enumerate()
            .map(|(i, l)| (i, *l as f64 / p.temperature as f64))
            .collect();
        cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if p.top_k > 0 {
            cand.truncate(p.top_k);
        }
        let max = cand[0].1;
        let mut sum = 0.0;
        for c in &mut cand {
            c.1 = (c.1 - max).exp();
            sum += c.1;
        }
        let mut kept = 0;
        let mut cum = 0.0;
        for c in &mut cand {
            c.1 /= sum;
            cum += c.1;
            kept += 1;
            if cum >= p.top_p as f64 {
                break;
            }
        }
        cand.truncate(kept);
        let total: f64 = cand.iter().map(|c| c.1).sum();
        let mut r = self.rng.next_f64() * total;
        for c in &cand {
            r -= c.1;
            if r < 0.0 {
                return c.0 as u32;
            }
        }
        cand[cand.len() - 1].0 as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_is_argmax() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0]), 1);
    }

    #[test]
    fn seed_reproduces_and_top_k_restricts() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let params = SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 3,
            seed: 42,
        };
        let a: Vec<u32> = {
            let mut s = Sampler::new(params);
            (0..100).map(|_| s.sample(&logits)).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(params);
            (0..100).map(|_| s.sample(&logits)).collect()
        };
        assert_eq!(a, b);
        let mut top: Vec<usize> = (0..50).collect();
        top.sort_by(|x, y| logits[*y].total_cmp(&logits[*x]));
        assert!(a.iter().all(|t| top[..3].contains(&(*t as usize))));
        assert!(
            top[..3].iter().all(|t| a.contains(&(*t as u32))),
            "all of top-3 drawn in 100 samples"
        );
    }

    #[test]
    fn out_of_range_settings_are_named() {
        let ok = SamplingParams::default();
        assert!(ok.validate().is_ok());
        for (t, p, needle) in [
            (f32::NAN, 1.0, "temperature"),
            (-0.5, 1.0, "temperature"),
            (f32::INFINITY, 1.0, "temperature"),
            (1.0, 0.0, "top_p"),
            (1.0, 2.0, "top_p"),
            (1.0, f32::NAN, "top_p"),
        ] {
            let bad = SamplingParams {
                temperature: t,
                top_p: p,
                ..ok
            };
            let e = bad.validate().unwrap_err();
            assert!(e.contains(needle), "{t} {p}: {e}");
        }
    }

    #[test]
    fn tiny_top_p_is_greedy() {
        let logits = [0.0f32, 5.0, 1.0, 4.9];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_p: 1e-6,
            top_k: 0,
            seed: 7,
        });
        assert!((0..50).all(|_| s.sample(&logits) == 1));
    }
}
