//! Speculative decoding: a draft source guesses the next tokens; one
//! forward verifies them all (the batch's experts are read once for every
//! drafted position), and the target keeps what it would have chosen.
//!
//! Lossless by construction: each position's token is chosen from the
//! target's own logits (greedy: the argmax; sampling: the speculative
//! sampling rule, [`crate::engine::sampler::Sampler::verify`]); a drafted token
//! survives only when it is that token, and the KV of positions after the
//! first rejection is rolled back.

use super::spec_gate::{Decision, Gate, GateStats, StepCost};
use super::Session;
use crate::engine::sampler::argmax;
use crate::error::Result;
use crate::model::mtp::MtpState;
use crate::model::profile::Profile;
use crate::model::Model;

impl Session {
    /// Before a step: a decoding session feeds its last token and this
    /// step's drafts (at most one fewer than the tokens it may still
    /// produce, so a verify never passes the limit or the KV cache).
    pub(super) fn prepare_feed(&mut self, model: &Model, prof: &mut Profile) -> Result<()> {
        self.drafts.clear();
        self.feed.clear();
        let Some(&last) = self.out.last() else {
            return Ok(());
        };
        let pick = match &mut self.gate {
            Some(g) => match g.decide() {
                Decision::Draft(a) => Some(a),
                Decision::Plain => None,
            },
            None => Some(0),
        };
        self.ask_drafters(pick, model, prof)?;
        self.feed.push(last);
        self.feed.extend_from_slice(&self.drafts);
        Ok(())
    }

    /// Asks drafter `pick` for this step's drafts and the gate's shadowed
    /// drafters for their guesses; the history (prompt and output) is
    /// gathered only when one of them is asked.
    fn ask_drafters(
        &mut self,
        pick: Option<usize>,
        model: &Model,
        prof: &mut Profile,
    ) -> Result<()> {
        let Some(d) = &mut self.drafter else {
            return Ok(());
        };
        let k = d.k.min(self.max_tokens - self.out.len() - 1);
        let gate = self
            .gate
            .as_mut()
            .filter(|g| k > 0 && (0..d.sources.len()).any(|a| g.wants_shadow(a)));
        if pick.is_none() && gate.is_none() {
            return Ok(());
        }
        let mut history = std::mem::take(&mut self.feed);
        history.extend_from_slice(&self.prompt);
        history.extend_from_slice(&self.out);
        if let Some(a) = pick {
            d.sources[a].propose(model, &history, k, &mut self.drafts, prof)?;
            self.drafts.truncate(k);
        }
        if let Some(g) = gate {
            shadow_guesses(g, d, &history, k, model, prof)?;
        }
        history.clear();
        self.feed = history;
        Ok(())
    }

    /// After a step: shows the draft source the positions the KV kept
    /// (`rows` holds the hidden states of the `fed` positions this step
    /// computed, from position `start`), each with the token after it.
    pub(super) fn observe(
        &mut self,
        model: &Model,
        rows: &[f32],
        start: usize,
        prof: &mut Profile,
    ) -> Result<()> {
        let Some(d) = &mut self.drafter else {
            return Ok(());
        };
        if self.done {
            return Ok(());
        }
        let kept = self.kv.len() - start;
        let h = model.cfg.hidden_size;
        let next: Vec<u32> = (start + 1..=self.kv.len())
            .map(|j| {
                if j < self.prompt.len() {
                    self.prompt[j]
                } else {
                    self.out[j - self.prompt.len()]
                }
            })
            .collect();
        for source in &mut d.sources {
            source.observe(model, &rows[..kept * h], &next, prof)?;
        }
        Ok(())
    }

    /// After a step that fed the last token and `k` drafts (`rows`, k + 1
    /// hidden states): the token at each position, in order, from the
    /// target's logits there, until one differs from its draft (or the
    /// session ends); then the KV of the positions after the last kept
    /// draft is rolled back. Returns the tokens produced and the drafts
    /// accepted.
    pub(super) fn verify(&mut self, model: &Model, rows: &[f32]) -> Result<(usize, usize)> {
        let h = model.cfg.hidden_size;
        let k = self.drafts.len();
        let kv_before = self.kv.len() - (k + 1);
        let (mut produced, mut accepted) = (0, 0);
        for i in 0..=k {
            self.logits_of(model, &rows[i * h..(i + 1) * h])?;
            let id = match self.drafts.get(i) {
                Some(&d) => self
                    .sampler
                    .verify(&self.logits, &self.prompt, &self.out, d),
                None => self.sampler.sample(&self.logits, &self.prompt, &self.out),
            };
            self.push(id);
            produced += 1;
            let kept = self.drafts.get(i) == Some(&id);
            accepted += kept as usize;
            if self.done || !kept {
                break;
            }
        }
        self.kv.truncate(kv_before + 1 + accepted);
        self.spec_stats.record(k, accepted, produced);
        Ok((produced, accepted))
    }

    /// After a decode step that cost `cost` (the whole step: drafting,
    /// the forward, the verify): tells the gate, if any, what it did.
    pub(super) fn record_gate(&mut self, cost: StepCost, accepted: usize, produced: usize) {
        let Some(gate) = &mut self.gate else {
            return;
        };
        match self.drafts.len() {
            0 => gate.record_plain(cost),
            k => gate.record_verify(cost, k, accepted, produced),
        }
        gate.produced(&self.out[self.out.len() - produced..]);
    }
}

/// Asks each drafter that wants a shadow guess ([`Gate::wants_shadow`])
/// for up to `k` tokens after `history`, and hands them to the gate.
fn shadow_guesses(
    gate: &mut Gate,
    d: &mut Drafters,
    history: &[u32],
    k: usize,
    model: &Model,
    prof: &mut Profile,
) -> Result<()> {
    for a in 0..d.sources.len() {
        if gate.wants_shadow(a) {
            d.shadow.clear();
            d.sources[a].propose(model, history, k, &mut d.shadow, prof)?;
            d.shadow.truncate(k);
            gate.shadow(a, &d.shadow);
        }
    }
    Ok(())
}

/// Proposes the next tokens of a sequence.
pub trait DraftSource: Send {
    /// What the stats call it.
    fn name(&self) -> &'static str {
        "custom"
    }

    /// Takes in the positions a step kept: the main model's hidden states
    /// `hidden` (one row each) and, for each, the token that follows it.
    /// Sources that draft from tokens alone ignore it.
    fn observe(
        &mut self,
        _model: &Model,
        _hidden: &[f32],
        _next: &[u32],
        _prof: &mut Profile,
    ) -> Result<()> {
        Ok(())
    }

    /// Appends up to `k` guesses of what follows `history` (the prompt and
    /// the tokens so far) to `out`; fewer (or none) when it has no guess.
    fn propose(
        &mut self,
        model: &Model,
        history: &[u32],
        k: usize,
        out: &mut Vec<u32>,
        prof: &mut Profile,
    ) -> Result<()>;

    /// Whether a guess costs nothing next to a decode step (no forward of
    /// any model), so the gate may ask for one every step it does not
    /// draft and measure the guesses against the tokens that follow
    /// ([`crate::engine::spec_gate`]'s shadow drafts) instead of probing.
    fn free_guess(&self) -> bool {
        false
    }
}

/// Which draft source a session uses, and how many tokens it drafts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Speculation {
    /// No drafts: one token per step.
    #[default]
    Off,
    /// Prompt lookup: the tokens that followed the latest earlier
    /// occurrence of the sequence's last n-gram.
    Ngram { draft: usize },
    /// The model's own MTP head, recursively (DeepSeek-V3, GLM).
    Mtp { draft: usize },
    /// The MTP head (where the model has one) and prompt lookup behind the
    /// gate ([`crate::engine::spec_gate`]): each step drafts with the one
    /// whose measured acceptance pays best for its measured cost, or not at
    /// all while neither pays.
    Auto { draft: usize },
}

impl Speculation {
    /// The draft sources for a session of `model` holding up to
    /// `positions` positions, and their draft length; `None` when off.
    /// MTP on a model without an MTP head is an error naming the
    /// checkpoint.
    pub fn drafters(self, model: &Model, positions: usize) -> Result<Option<Drafters>> {
        let mtp = |draft| -> Result<Box<dyn DraftSource>> {
            Ok(Box::new(MtpDraft::new(model, positions + draft)?))
        };
        let (sources, k): (Vec<Box<dyn DraftSource>>, usize) = match self {
            Speculation::Off => return Ok(None),
            Speculation::Ngram { draft } => (vec![Box::new(NgramDraft)], draft),
            Speculation::Auto { draft } if model.mtp.is_none() => {
                (vec![Box::new(NgramDraft)], draft)
            }
            Speculation::Mtp { draft } => (vec![mtp(draft)?], draft),
            Speculation::Auto { draft } => (vec![mtp(draft)?, Box::new(NgramDraft)], draft),
        };
        Ok(Some(Drafters::new(sources, k)))
    }

    /// Whether drafting is behind the gate.
    pub fn gated(self) -> bool {
        matches!(self, Speculation::Auto { .. })
    }
}

/// A session's draft sources (the gate picks one per step; without a gate
/// the first drafts every step) and the most tokens drafted per step.
pub struct Drafters {
    pub sources: Vec<Box<dyn DraftSource>>,
    pub k: usize,
    /// A shadow guess's tokens (reused between steps).
    shadow: Vec<u32>,
}

impl Drafters {
    /// Sources drafting up to `k` tokens a step.
    pub fn new(sources: Vec<Box<dyn DraftSource>>, k: usize) -> Drafters {
        Drafters {
            sources,
            k,
            shadow: Vec::with_capacity(k),
        }
    }

    /// A gate choosing among these sources, the free ones measured by
    /// shadow guesses.
    pub fn gate(&self) -> Gate {
        let names: Vec<&'static str> = self.sources.iter().map(|s| s.name()).collect();
        let free: Vec<bool> = self.sources.iter().map(|s| s.free_guess()).collect();
        Gate::new(&names).with_shadows(&free)
    }
}

/// Drafts with the model's MTP head: row j of its state pairs the main
/// model's hidden state at position j with the token at j + 1 and predicts
/// the token at j + 2. The positions each step kept are held back
/// ([`DraftSource::observe`]) and run through the head only when a draft
/// is asked for (at most [`MTP_PENDING_MAX`] rows wait), so while the
/// gate keeps drafting off the head costs nothing per step; a proposal
/// then runs the head recursively from the last row (its argmax is the
/// draft), and those recursive rows are dropped before the next rows.
pub struct MtpDraft {
    state: MtpState,
    /// Rows of kept positions (the rest are recursive drafts).
    kept: usize,
    /// The last kept row's block output and logits.
    last: Option<(Vec<f32>, Vec<f32>)>,
    /// Kept positions not yet through the head: hidden rows, and the
    /// token after each.
    pending_hidden: Vec<f32>,
    pending_next: Vec<u32>,
}

/// The most kept positions [`MtpDraft`] holds back before running them
/// through its head (one prefill chunk: bounds the rows held, and a batch
/// of that many reads the head's experts once).
pub const MTP_PENDING_MAX: usize = crate::model::PREFILL_CHUNK;

impl MtpDraft {
    /// A drafter for a sequence of up to `capacity` MTP rows.
    pub fn new(model: &Model, capacity: usize) -> Result<MtpDraft> {
        Ok(MtpDraft {
            state: model.new_mtp_state(capacity)?,
            kept: 0,
            last: None,
            pending_hidden: Vec::new(),
            pending_next: Vec::new(),
        })
    }

    /// Kept positions held back, not yet run through the head.
    pub fn pending(&self) -> usize {
        self.pending_next.len()
    }

    /// Runs the held-back positions through the head (dropping the last
    /// proposal's recursive rows first).
    fn catch_up(&mut self, model: &Model, prof: &mut Profile) -> Result<()> {
        if self.pending_next.is_empty() {
            return Ok(());
        }
        self.state.truncate(self.kept);
        self.state.reserve_more(self.pending_next.len());
        let (out, logits) = model.mtp_forward(
            &mut self.state,
            &self.pending_hidden,
            &self.pending_next,
            prof,
        )?;
        self.kept += self.pending_next.len();
        self.pending_hidden.clear();
        self.pending_next.clear();
        let (h, v) = (model.cfg.hidden_size, model.cfg.vocab_size);
        self.last = Some((
            out[out.len() - h..].to_vec(),
            logits[logits.len() - v..].to_vec(),
        ));
        Ok(())
    }
}

impl DraftSource for MtpDraft {
    fn name(&self) -> &'static str {
        "mtp"
    }

    fn observe(
        &mut self,
        model: &Model,
        hidden: &[f32],
        next: &[u32],
        prof: &mut Profile,
    ) -> Result<()> {
        if self.pending_next.len() + next.len() > MTP_PENDING_MAX {
            self.catch_up(model, prof)?;
        }
        self.pending_hidden.extend_from_slice(hidden);
        self.pending_next.extend_from_slice(next);
        Ok(())
    }

    fn propose(
        &mut self,
        model: &Model,
        _history: &[u32],
        k: usize,
        out: &mut Vec<u32>,
        prof: &mut Profile,
    ) -> Result<()> {
        if k == 0 {
            return Ok(());
        }
        self.catch_up(model, prof)?;
        self.state.truncate(self.kept);
        let Some((row, logits)) = &self.last else {
            return Ok(());
        };
        out.push(argmax(logits));
        let mut row = row.clone();
        while out.len() < k {
            self.state.reserve_more(1);
            let token = *out.last().expect("a draft");
            let (next_row, logits) = model.mtp_forward(&mut self.state, &row, &[token], prof)?;
            out.push(argmax(&logits));
            row = next_row;
        }
        Ok(())
    }
}

/// The longest n-gram [`NgramDraft`] matches (it tries shorter ones down
/// to one token).
pub const NGRAM_MAX: usize = 4;

/// Prompt-lookup drafting: find the latest earlier occurrence of the last
/// n tokens (n from [`NGRAM_MAX`] down to 1) and propose what followed it.
#[derive(Default)]
pub struct NgramDraft;

impl DraftSource for NgramDraft {
    fn name(&self) -> &'static str {
        "ngram"
    }

    fn propose(
        &mut self,
        _model: &Model,
        history: &[u32],
        k: usize,
        out: &mut Vec<u32>,
        _prof: &mut Profile,
    ) -> Result<()> {
        ngram_propose(history, k, out);
        Ok(())
    }

    fn free_guess(&self) -> bool {
        true
    }
}

/// What [`NgramDraft`] proposes (a pure function of the history).
pub fn ngram_propose(history: &[u32], k: usize, out: &mut Vec<u32>) {
    {
        if k == 0 {
            return;
        }
        for n in (1..=NGRAM_MAX.min(history.len().saturating_sub(1))).rev() {
            let tail = &history[history.len() - n..];
            // Latest start before the tail itself.
            let found = (0..history.len() - n)
                .rev()
                .find(|&s| &history[s..s + n] == tail);
            if let Some(s) = found {
                let from = s + n;
                let end = (from + k).min(history.len());
                out.extend_from_slice(&history[from..end]);
                return;
            }
        }
    }
}

/// What speculation did for a session.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct SpecStats {
    /// Verify steps (forwards that carried drafts).
    pub steps: u64,
    pub drafted: u64,
    pub accepted: u64,
    /// Per draft position (0 = the first drafted token): drafted there,
    /// and accepted there.
    pub drafted_at: Vec<u64>,
    pub accepted_at: Vec<u64>,
    /// Tokens produced by verify steps (accepted drafts plus the target's
    /// own token of each step).
    pub tokens: u64,
    /// What the gate did (`None` without one: `--speculate ngram|mtp`).
    pub gate: Option<GateStats>,
}

impl SpecStats {
    /// Records one verify step: `drafted` drafts, the first `accepted`
    /// kept, `tokens` produced.
    pub fn record(&mut self, drafted: usize, accepted: usize, tokens: usize) {
        self.steps += 1;
        self.drafted += drafted as u64;
        self.accepted += accepted as u64;
        self.tokens += tokens as u64;
        if self.drafted_at.len() < drafted {
            self.drafted_at.resize(drafted, 0);
            self.accepted_at.resize(drafted, 0);
        }
        for i in 0..drafted {
            self.drafted_at[i] += 1;
            self.accepted_at[i] += (i < accepted) as u64;
        }
    }

    /// Adds another session's figures.
    pub fn add(&mut self, o: &SpecStats) {
        self.steps += o.steps;
        self.drafted += o.drafted;
        self.accepted += o.accepted;
        self.tokens += o.tokens;
        let n = self.drafted_at.len().max(o.drafted_at.len());
        self.drafted_at.resize(n, 0);
        self.accepted_at.resize(n, 0);
        for i in 0..o.drafted_at.len() {
            self.drafted_at[i] += o.drafted_at[i];
            self.accepted_at[i] += o.accepted_at[i];
        }
        if let Some(og) = &o.gate {
            let g = self.gate.get_or_insert_with(GateStats::default);
            // Counters add; the figures are the latest session's.
            *g = GateStats {
                on_steps: g.on_steps + og.on_steps,
                off_steps: g.off_steps + og.off_steps,
                probes: g.probes + og.probes,
                turned_off: g.turned_off + og.turned_off,
                turned_on: g.turned_on + og.turned_on,
                ..og.clone()
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ngram_proposes_what_followed_the_latest_match() {
        let cases: &[(&[u32], usize, &[u32])] = &[
            (&[1, 2, 3, 9, 1, 2], 3, &[3, 9, 1]),
            // The latest occurrence wins.
            (&[5, 7, 5, 8, 5], 2, &[8, 5]),
            // Longer n-grams first: [2, 3] matches at 4, not the 3 at 6.
            (&[2, 3, 4, 0, 2, 3, 6, 3, 2, 3], 1, &[6]),
            // Runs into the end of the history.
            (&[4, 4], 5, &[4]),
            (&[1, 2, 3], 2, &[]),
            (&[1], 2, &[]),
            (&[1, 2, 1], 0, &[]),
        ];
        for (history, k, want) in cases {
            let mut out = Vec::new();
            ngram_propose(history, *k, &mut out);
            assert_eq!(out, *want, "{history:?} k={k}");
        }
    }

    #[test]
    fn stats_count_per_position() {
        let mut s = SpecStats::default();
        s.record(3, 1, 2);
        s.record(2, 2, 3);
        assert_eq!(s.drafted_at, [2, 2, 1]);
        assert_eq!(s.accepted_at, [2, 1, 0]);
        assert_eq!((s.drafted, s.accepted, s.tokens, s.steps), (5, 3, 5, 2));
        let mut t = SpecStats::default();
        t.add(&s);
        assert_eq!(t, s);
    }
}
