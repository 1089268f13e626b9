//! Next-token choice: greedy argmax, or temperature / top-k / top-p / min-p
//! sampling with a seeded generator (so a seed reproduces a run), after the
//! repetition, presence and frequency penalties.
//!
//! The order, per token (transformers' and vLLM's): penalties (they change
//! greedy too) → greedy argmax, or temperature → top-k → top-p → min-p →
//! draw. That is transformers' warper order (`TemperatureLogitsWarper`,
//! `TopKLogitsWarper`, `TopPLogitsWarper`, `MinPLogitsWarper`); vLLM applies
//! min-p before top-k/top-p instead, which can keep a different set when
//! both top-p and min-p are set. min-p compares each probability with the
//! most likely one's, so which tokens it keeps does not depend on the
//! filters before it; top-p does.
//!
//! Invariant: every id of the history passed to [`Sampler::sample`] is
//! below the vocabulary size (`logits.len()`). The greedy path with no
//! penalty allocates nothing; a sampled draw and the penalties reuse
//! buffers sized on first use.

use std::cmp::Ordering;

/// Sampling settings; `temperature == 0` means greedy. The default is
/// greedy with every filter and penalty off.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// Divides the logits before the softmax; 0 is greedy (argmax).
    pub temperature: f32,
    /// Nucleus filter: keeps the most likely tokens until their mass
    /// reaches `top_p`; 1 keeps all.
    pub top_p: f32,
    /// Keeps the `top_k` most likely tokens; 0 disables the filter.
    pub top_k: usize,
    /// Keeps the tokens whose probability is at least `min_p` times the most
    /// likely token's (transformers' `MinPLogitsWarper`); 0 disables it.
    pub min_p: f32,
    /// Subtracted once from the logit of every token generated so far
    /// (OpenAI's presence penalty; the prompt is not counted); 0 is off.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was generated so
    /// far (OpenAI's frequency penalty; the prompt is not counted); 0 is off.
    pub frequency_penalty: f32,
    /// Every token of the prompt or generated so far has a positive logit
    /// divided by it and a negative one multiplied by it (transformers'
    /// `RepetitionPenaltyLogitsProcessor`); 1 is off.
    pub repetition_penalty: f32,
    /// Seed of the generator behind sampled draws.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            seed: 0,
        }
    }
}

/// The highest temperature accepted (beyond it every distribution is flat
/// to f32 precision).
pub const TEMPERATURE_MAX: f32 = 1e3;

/// The largest presence or frequency penalty magnitude accepted (OpenAI's
/// range is `[-2, 2]`).
pub const PENALTY_MAX: f32 = 2.0;

impl SamplingParams {
    /// Refuses settings that would make sampling meaningless: a value that
    /// is not finite, a temperature outside `[0, TEMPERATURE_MAX]`, a
    /// `top_p` outside `(0, 1]`, a `min_p` outside `[0, 1]`, a presence or
    /// frequency penalty outside `[-PENALTY_MAX, PENALTY_MAX]`, a
    /// repetition penalty that is not positive. The message names the
    /// setting.
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
        let m = self.min_p;
        if !(m.is_finite() && (0.0..=1.0).contains(&m)) {
            return Err(format!("min_p {m} is outside [0, 1] (0 is off)"));
        }
        check_penalty("presence_penalty", self.presence_penalty)?;
        check_penalty("frequency_penalty", self.frequency_penalty)?;
        let r = self.repetition_penalty;
        if !(r.is_finite() && r > 0.0) {
            return Err(format!(
                "repetition_penalty {r} must be positive and finite (1 is off)"
            ));
        }
        Ok(())
    }

    /// Whether any penalty is on (the history matters).
    fn penalized(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }

    /// Whether the choice is the argmax (temperature 0 or top-k 1).
    fn greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }
}

/// Refuses a presence or frequency penalty (named `name`) outside
/// `[-PENALTY_MAX, PENALTY_MAX]` or not finite.
fn check_penalty(name: &str, v: f32) -> Result<(), String> {
    if v.is_finite() && (-PENALTY_MAX..=PENALTY_MAX).contains(&v) {
        return Ok(());
    }
    Err(format!(
        "{name} {v} is outside [-{PENALTY_MAX}, {PENALTY_MAX}] (0 is off)"
    ))
}

/// A random seed, for a run or request that names none (the clock's
/// nanoseconds where the OS gives no random bytes).
pub fn fresh_seed() -> u64 {
    getrandom::u64().unwrap_or_else(|_| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    })
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

pub use crate::kernels::argmax;

/// A logit under the repetition penalty `penalty`: divided when positive,
/// multiplied otherwise (transformers; vLLM alike). Saturates at
/// `±f32::MAX` rather than overflowing to infinity.
fn repetition_penalized(logit: f32, penalty: f32) -> f32 {
    let v = if logit > 0.0 {
        logit / penalty
    } else {
        logit * penalty
    };
    v.clamp(-f32::MAX, f32::MAX)
}

/// A logit under the presence and frequency penalties for a token
/// generated `count` (> 0) times (OpenAI: `logit − frequency·count −
/// presence`). Saturates at `±f32::MAX`.
fn occurrence_penalized(logit: f32, count: u32, presence: f32, frequency: f32) -> f32 {
    (logit - frequency * count as f32 - presence).clamp(-f32::MAX, f32::MAX)
}

/// Applies the repetition penalty once to each distinct token of `prompt`
/// and `generated`. `marks` (at least `logits.len()` long) is all zero on
/// entry and is left so.
fn apply_repetition(
    logits: &mut [f32],
    marks: &mut [u32],
    prompt: &[u32],
    generated: &[u32],
    penalty: f32,
) {
    for &t in prompt.iter().chain(generated) {
        let t = t as usize;
        if marks[t] == 0 {
            marks[t] = 1;
            logits[t] = repetition_penalized(logits[t], penalty);
        }
    }
    for &t in prompt.iter().chain(generated) {
        marks[t as usize] = 0;
    }
}

/// Applies the presence and frequency penalties to each distinct token of
/// `generated`, by its count there. `counts` (at least `logits.len()` long)
/// is all zero on entry and is left so.
fn apply_occurrence(
    logits: &mut [f32],
    counts: &mut [u32],
    generated: &[u32],
    presence: f32,
    frequency: f32,
) {
    for &t in generated {
        counts[t as usize] += 1;
    }
    for &t in generated {
        let t = t as usize;
        if counts[t] > 0 {
            logits[t] = occurrence_penalized(logits[t], counts[t], presence, frequency);
            counts[t] = 0;
        }
    }
}

/// Most likely first; the lower id first on equal weights.
fn by_weight(a: &(usize, f64), b: &(usize, f64)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Turns the sorted candidates' scaled logits into probabilities (in
/// place, summing to 1).
fn softmax_sorted(cand: &mut [(usize, f64)]) {
    let max = cand[0].1;
    let mut sum = 0.0;
    for c in cand.iter_mut() {
        c.1 = (c.1 - max).exp();
        sum += c.1;
    }
    for c in cand.iter_mut() {
        c.1 /= sum;
    }
}

/// How many of the sorted candidates the nucleus filter keeps: the
/// shortest prefix whose mass reaches `top_p` (all when it never does).
fn top_p_kept(cand: &[(usize, f64)], top_p: f32) -> usize {
    let mut cum = 0.0;
    for (i, c) in cand.iter().enumerate() {
        cum += c.1;
        if cum >= top_p as f64 {
            return i + 1;
        }
    }
    cand.len()
}

/// How many of the sorted candidates min-p keeps: those whose probability
/// is at least `min_p` times the first's (always the first).
fn min_p_kept(cand: &[(usize, f64)], min_p: f32) -> usize {
    let floor = min_p as f64 * cand[0].1;
    cand.partition_point(|c| c.1 >= floor).max(1)
}

/// The candidate `u` (uniform in [0, 1)) lands on, by weight.
fn pick(cand: &[(usize, f64)], u: f64) -> u32 {
    let total: f64 = cand.iter().map(|c| c.1).sum();
    let mut r = u * total;
    for c in cand {
        r -= c.1;
        if r < 0.0 {
            return c.0 as u32;
        }
    }
    cand[cand.len() - 1].0 as u32
}

/// Per-sampler buffers of the penalties, sized on the first penalized
/// call and reused.
#[derive(Default)]
struct SamplerScratch {
    /// The penalized copy of the logits.
    logits: Vec<f32>,
    /// Per-id marks and counts; all zero between calls.
    counts: Vec<u32>,
}

impl SamplerScratch {
    /// `logits` after the repetition, then the frequency and presence
    /// penalties of `p` (vLLM's order).
    fn penalized(
        &mut self,
        p: &SamplingParams,
        logits: &[f32],
        prompt: &[u32],
        generated: &[u32],
    ) -> &[f32] {
        self.logits.clear();
        self.logits.extend_from_slice(logits);
        if self.counts.len() < logits.len() {
            self.counts.resize(logits.len(), 0);
        }
        let (work, counts) = (&mut self.logits[..], &mut self.counts[..]);
        if p.repetition_penalty != 1.0 {
            apply_repetition(work, counts, prompt, generated, p.repetition_penalty);
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            let (presence, frequency) = (p.presence_penalty, p.frequency_penalty);
            apply_occurrence(work, counts, generated, presence, frequency);
        }
        &self.logits
    }
}

/// Picks the next token from `logits`.
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    /// A sampled draw's candidates `(id, weight)`, reused between draws.
    cand: Vec<(usize, f64)>,
    scratch: SamplerScratch,
}

impl Sampler {
    /// A sampler with `params`.
    pub fn new(params: SamplingParams) -> Sampler {
        Sampler {
            params,
            rng: Rng::new(params.seed),
            cand: Vec::new(),
            scratch: SamplerScratch::default(),
        }
    }

    /// The next token id from the model's `logits` (left as they are),
    /// after `prompt` and the `generated` tokens so far (the penalties'
    /// history). With no penalty set, the history is not read and the
    /// greedy path allocates nothing; a penalized or sampled choice reuses
    /// buffers sized on its first call.
    ///
    /// # Panics
    /// If a penalty is set and an id of `prompt` or `generated` is not
    /// below `logits.len()`.
    pub fn sample(&mut self, logits: &[f32], prompt: &[u32], generated: &[u32]) -> u32 {
        self.choose(logits, prompt, generated, None)
    }

    /// The token at a drafted position: what [`Sampler::sample`] would
    /// choose there, given that a drafter proposed `draft` (returned when
    /// accepted). Greedy: the argmax. Sampling: the speculative-sampling
    /// rule for a deterministic draft (keep it with its target
    /// probability, else draw from the target without it), so the chosen
    /// token has exactly the distribution of a plain draw.
    pub fn verify(&mut self, logits: &[f32], prompt: &[u32], generated: &[u32], draft: u32) -> u32 {
        self.choose(logits, prompt, generated, Some(draft))
    }

    /// Penalties, then the argmax or a draw (plain, or by the speculative
    /// rule when a `draft` is being verified).
    fn choose(
        &mut self,
        logits: &[f32],
        prompt: &[u32],
        generated: &[u32],
        draft: Option<u32>,
    ) -> u32 {
        let p = self.params;
        let logits = if p.penalized() {
            self.scratch.penalized(&p, logits, prompt, generated)
        } else {
            logits
        };
        if p.greedy() {
            return argmax(logits);
        }
        distribution(&p, &mut self.cand, logits);
        match draft {
            None => pick(&self.cand, self.rng.next_f64()),
            Some(d) => accept_or_resample(&mut self.cand, &mut self.rng, d),
        }
    }
}

/// The sampling distribution of `logits` into `cand` (temperature, then
/// top-k, top-p and min-p: transformers' order): the kept tokens
/// with their probabilities before renormalization (`pick` weighs them).
fn distribution(p: &SamplingParams, cand: &mut Vec<(usize, f64)>, logits: &[f32]) {
    let t = p.temperature as f64;
    cand.clear();
    cand.extend(logits.iter().enumerate().map(|(i, l)| (i, *l as f64 / t)));
    if p.top_k > 0 && p.top_k < cand.len() {
        // The order is total (ids break ties), so the top k are unique.
        cand.select_nth_unstable_by(p.top_k - 1, by_weight);
        cand.truncate(p.top_k);
    }
    cand.sort_unstable_by(by_weight);
    softmax_sorted(cand);
    cand.truncate(top_p_kept(cand, p.top_p));
    if p.min_p > 0.0 {
        cand.truncate(min_p_kept(cand, p.min_p));
    }
}

/// Speculative sampling's rule for a drafted token that was certain to its
/// drafter: keep `draft` with its probability under the target
/// distribution `cand`, else draw from the target without it. The token
/// chosen is distributed exactly as a plain draw from `cand`.
fn accept_or_resample(cand: &mut Vec<(usize, f64)>, rng: &mut Rng, draft: u32) -> u32 {
    let total: f64 = cand.iter().map(|c| c.1).sum();
    let p_draft = cand
        .iter()
        .find(|c| c.0 == draft as usize)
        .map_or(0.0, |c| c.1 / total);
    if p_draft > 0.0 && rng.next_f64() < p_draft {
        return draft;
    }
    cand.retain(|c| c.0 != draft as usize);
    if cand.is_empty() {
        return draft;
    }
    pick(cand, rng.next_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Samples `n` tokens with an empty history.
    fn draws(params: SamplingParams, logits: &[f32], n: usize) -> Vec<u32> {
        let mut s = Sampler::new(params);
        (0..n).map(|_| s.sample(logits, &[], &[])).collect()
    }

    fn sampled(temperature: f32, top_p: f32, top_k: usize, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature,
            top_p,
            top_k,
            seed,
            ..SamplingParams::default()
        }
    }

    /// The sampler as it was before penalties and min-p (sort everything,
    /// truncate, normalize the nucleus, draw).
    fn draw_before(p: SamplingParams, rng: &mut Rng, logits: &[f32]) -> u32 {
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
        let (mut kept, mut cum) = (0, 0.0);
        for c in &mut cand {
            c.1 /= sum;
            cum += c.1;
            kept += 1;
            if cum >= p.top_p as f64 {
                break;
            }
        }
        cand.truncate(kept);
        pick(&cand, rng.next_f64())
    }

    #[test]
    fn greedy_is_argmax() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0], &[1, 2], &[2]), 1);
    }

    #[test]
    fn all_off_gives_the_tokens_of_before() {
        let logits: Vec<f32> = (0..300).map(|i| (i as f32 * 0.37).sin() * 4.0).collect();
        let ties = [1.0f32, 2.0, 2.0, 2.0, 0.5];
        for (logits, params) in [
            (&logits[..], SamplingParams::default()),
            (&logits[..], sampled(1.0, 1.0, 0, 1)),
            (&logits[..], sampled(0.7, 0.9, 0, 2)),
            (&logits[..], sampled(1.5, 1.0, 40, 3)),
            (&logits[..], sampled(0.3, 0.5, 7, 4)),
            (&logits[..], sampled(2.0, 1.0, 1, 5)),
            (&ties[..], sampled(1.0, 1.0, 2, 6)),
            (&ties[..], sampled(1.0, 0.8, 0, 7)),
        ] {
            let mut rng = Rng::new(params.seed);
            let before: Vec<u32> = (0..200)
                .map(|_| draw_before(params, &mut rng, logits))
                .collect();
            let mut s = Sampler::new(params);
            let history: Vec<u32> = (0..logits.len() as u32).collect();
            let now: Vec<u32> = (0..200)
                .map(|_| s.sample(logits, &history, &history))
                .collect();
            assert_eq!(now, before, "{params:?}");
            assert!(s.scratch.logits.is_empty(), "no penalty, no copy");
        }
    }

    #[test]
    fn seed_reproduces_and_top_k_restricts() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let params = sampled(1.0, 1.0, 3, 42);
        let a = draws(params, &logits, 100);
        assert_eq!(a, draws(params, &logits, 100));
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
        let edges = SamplingParams {
            temperature: TEMPERATURE_MAX,
            min_p: 1.0,
            presence_penalty: -2.0,
            frequency_penalty: 2.0,
            repetition_penalty: 1e-3,
            ..ok
        };
        assert!(edges.validate().is_ok());
        type Set = fn(&mut SamplingParams, f32);
        let cases: [(Set, f32, &str); 17] = [
            (|p, v| p.temperature = v, f32::NAN, "temperature"),
            (|p, v| p.temperature = v, -0.5, "temperature"),
            (|p, v| p.temperature = v, f32::INFINITY, "temperature"),
            (|p, v| p.top_p = v, 0.0, "top_p"),
            (|p, v| p.top_p = v, 2.0, "top_p"),
            (|p, v| p.top_p = v, f32::NAN, "top_p"),
            (|p, v| p.min_p = v, -0.1, "min_p"),
            (|p, v| p.min_p = v, 1.5, "min_p"),
            (|p, v| p.min_p = v, f32::NAN, "min_p"),
            (|p, v| p.presence_penalty = v, 2.5, "presence_penalty"),
            (|p, v| p.presence_penalty = v, -2.5, "presence_penalty"),
            (
                |p, v| p.frequency_penalty = v,
                f32::NAN,
                "frequency_penalty",
            ),
            (|p, v| p.frequency_penalty = v, -3.0, "frequency_penalty"),
            (|p, v| p.repetition_penalty = v, 0.0, "repetition_penalty"),
            (|p, v| p.repetition_penalty = v, -1.0, "repetition_penalty"),
            (
                |p, v| p.repetition_penalty = v,
                f32::NAN,
                "repetition_penalty",
            ),
            (
                |p, v| p.repetition_penalty = v,
                f32::INFINITY,
                "repetition_penalty",
            ),
        ];
        for (set, v, needle) in cases {
            let mut bad = ok;
            set(&mut bad, v);
            let e = bad.validate().unwrap_err();
            assert!(e.starts_with(needle), "{needle} {v}: {e}");
        }
    }

    #[test]
    fn tiny_top_p_is_greedy() {
        let logits = [0.0f32, 5.0, 1.0, 4.9];
        let draws = draws(sampled(1.0, 1e-6, 0, 7), &logits, 50);
        assert!(draws.iter().all(|t| *t == 1));
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative() {
        for (logit, penalty, want) in [
            (2.0f32, 2.0f32, 1.0f32),
            (-1.0, 2.0, -2.0),
            (0.0, 2.0, 0.0),
            (3.0, 0.5, 6.0),
            (-3.0, 0.5, -1.5),
            (1e30, 1e-30, f32::MAX),
            (-1e30, 1e30, -f32::MAX),
        ] {
            assert_eq!(
                repetition_penalized(logit, penalty),
                want,
                "{logit} {penalty}"
            );
        }
    }

    #[test]
    fn repetition_penalty_counts_each_token_of_prompt_and_output_once() {
        let params = SamplingParams {
            repetition_penalty: 2.0,
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(params);
        let logits = [2.0f32, -1.0, 0.5, 3.0, 0.0];
        // 0 in the prompt, 1 in both (three times), 4 generated.
        let (prompt, generated) = ([0, 1], [1, 4, 1]);
        assert_eq!(s.sample(&logits, &prompt, &generated), 3);
        assert_eq!(s.scratch.logits, [1.0, -2.0, 0.5, 3.0, 0.0]);
        assert_eq!(logits, [2.0, -1.0, 0.5, 3.0, 0.0], "input untouched");
        assert!(
            s.scratch.counts.iter().all(|c| *c == 0),
            "scratch left zero"
        );
    }

    #[test]
    fn presence_and_frequency_count_the_generated_tokens_only() {
        for (presence, frequency, want) in [
            (0.5f32, 0.25f32, [1.0f32, 0.25, -0.25, 1.0]),
            (0.5, 0.0, [1.0, 0.5, 0.5, 1.0]),
            (0.0, 0.25, [1.0, 0.75, 0.25, 1.0]),
            (-1.0, -0.5, [1.0, 2.5, 3.5, 1.0]),
        ] {
            let params = SamplingParams {
                presence_penalty: presence,
                frequency_penalty: frequency,
                ..SamplingParams::default()
            };
            let mut s = Sampler::new(params);
            // 0 and 3 only in the prompt; 1 generated once, 2 three times.
            s.sample(&[1.0; 4], &[0, 0, 3], &[2, 1, 2, 2]);
            let got = &s.scratch.logits;
            assert_eq!(got, &want, "presence {presence} frequency {frequency}");
            assert!(
                s.scratch.counts.iter().all(|c| *c == 0),
                "scratch left zero"
            );
        }
    }

    #[test]
    fn repetition_comes_before_presence_and_frequency() {
        let params = SamplingParams {
            repetition_penalty: 2.0,
            presence_penalty: 1.0,
            frequency_penalty: 0.5,
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(params);
        // 0: in the prompt only, 4 / 2; 1: generated twice, -2 * 2 - 0.5 * 2 - 1;
        // 2: generated once, 3 / 2 - 0.5 - 1.
        s.sample(&[4.0, -2.0, 3.0, 1.0], &[0], &[1, 2, 1]);
        assert_eq!(s.scratch.logits, [2.0, -6.0, 0.0, 1.0]);
    }

    #[test]
    fn penalties_change_greedy() {
        let on = |set: fn(&mut SamplingParams)| {
            let mut p = SamplingParams::default();
            set(&mut p);
            p
        };
        for (params, want) in [
            (SamplingParams::default(), 0),
            (on(|p| p.repetition_penalty = 2.0), 1),
            (on(|p| p.presence_penalty = 1.5), 1),
            (on(|p| p.frequency_penalty = 0.6), 1),
            (on(|p| p.frequency_penalty = 0.4), 0),
        ] {
            let got = Sampler::new(params).sample(&[5.0, 4.0, 1.0], &[2], &[0, 0]);
            assert_eq!(got, want, "{params:?}");
        }
    }

    #[test]
    fn penalties_apply_before_temperature_sampling() {
        // Token 0 dominates until its presence penalty takes it below 1.
        let params = SamplingParams {
            presence_penalty: 2.0,
            ..sampled(0.01, 1.0, 0, 3)
        };
        let mut s = Sampler::new(params);
        let logits = [1.5f32, 1.0, -3.0];
        assert_eq!(s.sample(&logits, &[], &[]), 0);
        assert!((0..50).all(|_| s.sample(&logits, &[], &[0]) == 1));
    }

    #[test]
    fn min_p_keeps_tokens_near_the_most_likely() {
        let cand = [(3, 0.5), (0, 0.3), (2, 0.15), (1, 0.05)];
        for (min_p, kept) in [
            (0.0f32, 4),
            (0.09, 4),
            (0.29, 3),
            (0.5, 2),
            (0.61, 1),
            (1.0, 1),
        ] {
            assert_eq!(min_p_kept(&cand, min_p), kept, "min_p {min_p}");
        }
    }

    #[test]
    fn min_p_restricts_the_draws() {
        // Probabilities 0.4, 0.3, 0.2, 0.1 at temperature 1.
        let logits: Vec<f32> = [0.4f32, 0.3, 0.2, 0.1].iter().map(|p| p.ln()).collect();
        let params = SamplingParams {
            min_p: 0.6,
            ..sampled(1.0, 1.0, 0, 11)
        };
        let a = draws(params, &logits, 200);
        assert!(a.iter().all(|t| *t < 2), "only p >= 0.24 kept: {a:?}");
        assert!(a.contains(&0) && a.contains(&1));
        let all = draws(sampled(1.0, 1.0, 0, 11), &logits, 200);
        assert!(all.contains(&3), "without min_p the tail is drawn");
    }

    #[test]
    fn top_p_keeps_the_shortest_prefix_reaching_the_mass() {
        let cand = [(3, 0.5), (0, 0.3), (2, 0.15), (1, 0.05)];
        for (top_p, kept) in [(1e-6f32, 1), (0.5, 1), (0.6, 2), (0.95, 3), (1.0, 4)] {
            assert_eq!(top_p_kept(&cand, top_p), kept, "top_p {top_p}");
        }
    }

    /// Speculative acceptance keeps the target distribution: draws of
    /// `verify` with a fixed draft against plain draws, by a chi-square
    /// test of homogeneity (seeded, so the outcome is fixed; a wrong rule
    /// gives a statistic in the hundreds).
    #[test]
    fn verify_draws_match_plain_draws() {
        let logits = [1.0f32, 0.5, 0.2, -0.3, 0.9, -1.0];
        for (draft, params) in [
            (0u32, sampled(1.0, 1.0, 0, 3)),
            (3, sampled(0.8, 0.9, 0, 5)),
            (5, sampled(1.0, 1.0, 4, 7)),
        ] {
            let n = 20_000;
            let mut plain = Sampler::new(params);
            let mut spec = Sampler::new(SamplingParams {
                seed: params.seed + 100,
                ..params
            });
            let (mut a, mut b) = ([0f64; 6], [0f64; 6]);
            for _ in 0..n {
                a[plain.sample(&logits, &[], &[]) as usize] += 1.0;
                b[spec.verify(&logits, &[], &[], draft) as usize] += 1.0;
            }
            let mut chi2 = 0.0;
            let mut cells = 0;
            for i in 0..6 {
                let total = a[i] + b[i];
                if total == 0.0 {
                    continue;
                }
                cells += 1;
                let e = total / 2.0;
                chi2 += (a[i] - e).powi(2) / e + (b[i] - e).powi(2) / e;
            }
            // 99.9th percentile of chi-square with 5 degrees of freedom: 20.5.
            assert!(
                chi2 < 20.5,
                "draft {draft}: chi2 {chi2} over {cells} cells, {a:?} vs {b:?}"
            );
        }
    }

    #[test]
    fn verify_is_argmax_when_greedy() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.verify(&[0.1, 3.0, 2.0], &[], &[], 2), 1);
        assert_eq!(s.verify(&[0.1, 3.0, 2.0], &[], &[], 1), 1);
    }
}
