//! Log-probabilities of a chosen token and the most likely alternatives,
//! from the model's logits (before any penalty or temperature), as the
//! OpenAI API reports them.

/// One position's log-probabilities.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// The chosen token's.
    pub logprob: f32,
    /// The `top` most likely tokens, most likely first (ties by lower id).
    pub top: Vec<(u32, f32)>,
}

/// The log-softmax of `logits` at `chosen`, and the `top` most likely.
pub fn token_logprobs(logits: &[f32], chosen: u32, top: usize) -> TokenLogprobs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let log_z = max as f64 + sum.ln();
    let lp = |l: f32| (l as f64 - log_z) as f32;
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    let top = top.min(logits.len());
    if top > 0 {
        order.select_nth_unstable_by(top - 1, |&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        });
    }
    order.truncate(top);
    order.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    TokenLogprobs {
        logprob: lp(logits[chosen as usize]),
        top: order.iter().map(|&i| (i, lp(logits[i as usize]))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_and_top_order() {
        let l = [0.0f32, 2.0f32.ln(), 0.0, 3.0f32.ln()];
        // softmax = [1, 2, 1, 3] / 7.
        let t = token_logprobs(&l, 1, 3);
        assert!((t.logprob - (2.0f32 / 7.0).ln()).abs() < 1e-6);
        let ids: Vec<u32> = t.top.iter().map(|x| x.0).collect();
        assert_eq!(ids, [3, 1, 0]);
        assert!((t.top[0].1 - (3.0f32 / 7.0).ln()).abs() < 1e-6);
        assert!(token_logprobs(&l, 0, 0).top.is_empty());
        assert_eq!(token_logprobs(&l, 0, 9).top.len(), 4);
    }
}
