//! What a trace says about its routing, in the three numbers a caching
//! policy and a prefetcher live on (issue 14's knobs of realistic synthetic
//! routing):
//!
//! - popularity skew: the share of selections that go to the top 10% of
//!   each layer's experts (0.1 when uniform; a Zipf(1) law over 128
//!   experts gives about 0.53);
//! - temporal reuse: of a token's experts in a layer, the share the next
//!   token chooses again (k/n when independent);
//! - cross-layer predictability: of the experts a layer chose for a decode
//!   token, the share the lookahead guessed (recall@k), per variant.

use crate::formats::trace::read::Run;

/// The routing knobs of a trace (each `None` without the rows to tell).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Knobs {
    pub top10_share: Option<f64>,
    pub reuse: Option<f64>,
    /// Recall@k of the attn and the output guess.
    pub recall: [Option<f64>; 2],
}

fn ratio((a, b): (u64, u64)) -> Option<f64> {
    (b > 0).then(|| a as f64 / b as f64)
}

/// Measures the knobs over every run and MoE layer.
pub fn measure(runs: &[Run]) -> Knobs {
    let mut top = (0, 0);
    let mut reuse = (0, 0);
    let mut recall = [(0, 0); 2];
    for l in runs.iter().flat_map(|r| &r.layers) {
        if l.fetches.is_empty() {
            continue;
        }
        let mut count = vec![0u64; l.n_experts.max(1)];
        for &e in &l.picks {
            if let Some(c) = count.get_mut(e) {
                *c += 1;
            }
        }
        count.sort_unstable_by(|a, b| b.cmp(a));
        let top_n = count.len().div_ceil(10);
        top.0 += count[..top_n].iter().sum::<u64>();
        top.1 += l.picks.len() as u64;
        for w in l.rows.windows(2) {
            let (a, b) = (&l.picks[w[0].clone()], &l.picks[w[1].clone()]);
            reuse.0 += a.iter().filter(|e| b.contains(e)).count() as u64;
            reuse.1 += a.len() as u64;
        }
        for f in &l.fetches {
            let chosen = &l.picks[l.rows[f.rows.start].clone()];
            for (v, g) in f.guess.iter().enumerate() {
                if let Some(g) = g {
                    let guess = &l.guesses[g.clone()];
                    recall[v].0 += chosen.iter().filter(|e| guess.contains(e)).count() as u64;
                    recall[v].1 += chosen.len() as u64;
                }
            }
        }
    }
    Knobs {
        top10_share: ratio(top),
        reuse: ratio(reuse),
        recall: recall.map(ratio),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::trace::read::{Fetch, LayerTrace};

    #[test]
    fn measures_skew_reuse_and_recall() {
        // 20 experts; tokens choose {0, 1}, {0, 2}, {0, 1}, {3, 4}; the
        // guesses (from token 1 on) are the previous token's experts.
        let steps: [&[usize]; 4] = [&[0, 1], &[0, 2], &[0, 1], &[3, 4]];
        let mut l = LayerTrace {
            n_experts: 20,
            ..LayerTrace::default()
        };
        for (t, s) in steps.iter().enumerate() {
            let (p0, r0, g0) = (l.picks.len(), l.rows.len(), l.guesses.len());
            l.picks.extend_from_slice(s);
            l.rows.push(p0..l.picks.len());
            if t > 0 {
                l.guesses.extend_from_slice(steps[t - 1]);
            }
            l.fetches.push(Fetch {
                clock: t as u64,
                slots: 2,
                ids: 0..0,
                rows: r0..l.rows.len(),
                guess: [(t > 0).then_some(g0..l.guesses.len()), None],
                deeper: [None, None],
            });
        }
        let runs = [Run {
            layers: vec![l],
            ..Run::default()
        }];
        let k = measure(&runs);
        // Top 10% of 20 = 2 experts: 0 (3 picks) and 1 (2) of 8.
        assert_eq!(k.top10_share, Some(5.0 / 8.0));
        // Overlaps 1, 1, 0 of 2 each.
        assert_eq!(k.reuse, Some(2.0 / 6.0));
        assert_eq!(k.recall, [Some(2.0 / 6.0), None]);
    }
}
