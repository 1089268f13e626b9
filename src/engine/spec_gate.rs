//! The speculation gate: whether a session drafts this step, and with
//! which of its drafters, decided from figures it measured itself, so
//! `--speculate auto` pays or turns itself off. Pure logic (no clock, no
//! model): the session feeds each decode step's cost and outcome in, and
//! asks before the next step.
//!
//! - Figures: the medians of the last [`COST_WINDOW`] plain steps' wall
//!   time and expert bytes read, and per drafter the same of its verify
//!   steps (a median, so one slow read on a shared disk does not decide),
//!   with moving averages ([`EMA_WEIGHT`]) of the tokens its verify steps
//!   produced, of its acceptance at each draft position, and of how often
//!   it had a guess when asked.
//! - Gain of a drafter: tokens per verify step over the verify step's
//!   cost in plain steps (`verify s / plain s`, at least 1: a verify is
//!   never cheaper than a plain step, and a ratio below 1 is noise),
//!   weighted by how often it had a guess (a step without one is a plain
//!   step: gain 1). The wall time holds the drafting (an MTP head's
//!   forward) and the verify's extra expert reads; their byte ratio is
//!   reported beside it, not counted twice. Acceptance × cost decides
//!   which drafter drafts, not a preference.
//! - Shadow drafts: a drafter whose guess costs nothing next to a step
//!   (prompt lookup; [`Gate::with_shadows`]) is asked on the steps it does
//!   not draft, and its guess is held against the tokens the next steps
//!   produce: the drafts a verify would have kept, measured without one.
//!   Its acceptance figures come from these as well as from its verify
//!   steps, so it needs no probes; until its own verify steps are
//!   measured its verify is taken to cost [`SHADOW_RATIO_PRIOR`] plain
//!   steps. Only drafters whose guess is dear (the MTP head) are probed.
//! - Warm-up: each probed drafter in turn until each was asked
//!   [`WARMUP_VERIFY_STEPS`] times (or [`WARMUP_VERIFY_MIN`] when its gain
//!   is below [`WARMUP_GIVE_UP`] by then: measuring a clear loser further
//!   is the loss), one step in [`PLAIN_SAMPLE_EVERY`] plain (the plain
//!   samples), then plain until [`WARMUP_PLAIN_STEPS`] are measured and
//!   each shadowed drafter has [`WARMUP_SHADOWS`] shadow outcomes; then on
//!   with the best drafter while its gain is at least [`GAIN_MIN`] (a plain
//!   step every [`PLAIN_REFRESH_EVERY`] keeps the plain cost current), off
//!   below.
//! - Probes: while off, one drafted step after `probe_every` plain ones
//!   (the probed drafters in turn); while on, the other probed drafters
//!   at the same interval. A probe's outcome weighs [`PROBE_WEIGHT`] in
//!   the averages. A probe that leaves the choice as it was doubles
//!   `probe_every` (from [`PROBE_EVERY_MIN`] up to [`PROBE_EVERY_MAX`]),
//!   and at least to the interval over which that probe's measured loss
//!   (its verify cost in plain steps less its tokens) is
//!   [`PROBE_LOSS_SHARE`] of the steps; a change of choice resets it. Off
//!   turns on when the best gain reaches [`GAIN_RESUME`] on fresh evidence
//!   (a probe, or a shadow's outcome); on switches drafter when another's
//!   gain is [`SWITCH_MARGIN`] times the current one's (so the gate does
//!   not flap).
//!
//! Lossless whatever it decides: it only chooses whether and whose drafts
//! are fed, and every token still comes from the target's logits.

/// Weight of the newest step in the acceptance moving averages.
pub const EMA_WEIGHT: f64 = 0.25;
/// Weight of a probe's outcome in the acceptance averages: the figures
/// are stale between probes, and the probe is the freshest evidence.
pub const PROBE_WEIGHT: f64 = 0.5;
/// Steps of each kind whose cost the medians are taken over.
pub const COST_WINDOW: usize = 8;
/// Times each probed drafter is asked before the first decision.
pub const WARMUP_VERIFY_STEPS: u32 = 8;
/// Asks after which warm-up stops asking a drafter whose gain is below
/// [`WARMUP_GIVE_UP`].
pub const WARMUP_VERIFY_MIN: u32 = 3;
/// A gain this far below 1 after [`WARMUP_VERIFY_MIN`] asks ends that
/// drafter's warm-up (probes still give it its chances later).
pub const WARMUP_GIVE_UP: f64 = 0.75;
/// Shadow outcomes of each shadowed drafter before the first decision.
pub const WARMUP_SHADOWS: u32 = 8;
/// A shadowed drafter's verify cost in plain steps until its verify steps
/// are measured (prompt lookup's measured 2.1-2.8x at 4 drafts on the
/// trained fixtures, results/trained-speculation.md): its first verify
/// steps are tried once its shadows' tokens per verify reach
/// [`GAIN_RESUME`] times this, and from then on its own cost decides.
pub const SHADOW_RATIO_PRIOR: f64 = 2.0;
/// The share of the decode steps a probe's measured loss may take: the
/// next probe comes no sooner than that loss over this share.
pub const PROBE_LOSS_SHARE: f64 = 0.05;
/// Plain steps measured before the first decision.
pub const WARMUP_PLAIN_STEPS: u32 = 3;
/// During warm-up, one step in this many is plain (the plain cost sample).
pub const PLAIN_SAMPLE_EVERY: u32 = 4;
/// While on, one step in this many is plain (keeps the plain cost current
/// as the cache warms or the machine's load changes).
pub const PLAIN_REFRESH_EVERY: u32 = 32;
/// Drafting stays on while the gain (tokens per verify step over its cost
/// in plain steps) is at least this: a margin for the noise of the measure.
pub const GAIN_MIN: f64 = 1.05;
/// Off turns on when a drafter's gain reaches this (above [`GAIN_MIN`],
/// so the gate does not flap).
pub const GAIN_RESUME: f64 = 1.10;
/// On switches to another drafter when its gain is this many times the
/// current one's.
pub const SWITCH_MARGIN: f64 = 1.10;
/// Steps before the first probe once the choice changed.
pub const PROBE_EVERY_MIN: u32 = 8;
/// The most steps between probes (the interval doubles while probes
/// leave the choice as it was).
pub const PROBE_EVERY_MAX: u32 = 256;

/// What a session does on its next decode step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Feed this drafter's tokens (a verify step).
    Draft(usize),
    /// Feed the last token alone.
    Plain,
}

/// Where the gate stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Warmup,
    /// Drafting with this drafter.
    On(usize),
    Off,
}

/// One decode step's measured cost.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepCost {
    pub seconds: f64,
    /// Expert bytes the store read during the step.
    pub bytes: u64,
}

/// What the gate did, for the stats line and `--json`.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct GateStats {
    /// Decode steps the gate let draft (probes included), and steps it
    /// kept plain (warm-up and refresh samples included).
    pub on_steps: u64,
    pub off_steps: u64,
    /// Drafted steps taken with a drafter other than the one in use.
    pub probes: u64,
    /// Times drafting was turned off, back on, and switched to another
    /// drafter.
    pub turned_off: u64,
    pub turned_on: u64,
    pub switched: u64,
    /// The drafter in use (`None`: off, or warming up).
    pub drafter: Option<&'static str>,
    /// The figures of the drafter in use, else of the best measured one:
    /// the gain, the verify step's wall-time and expert-byte ratios to a
    /// plain step, tokens per verify step, and the acceptance at each
    /// draft position (`None` until measured).
    pub gain: Option<f64>,
    pub time_ratio: Option<f64>,
    pub bytes_ratio: Option<f64>,
    pub tokens_per_verify: Option<f64>,
    pub acceptance_at: Vec<f64>,
    /// The same figures for each drafter.
    pub drafters: Vec<DrafterStats>,
}

/// One drafter's figures.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct DrafterStats {
    pub name: &'static str,
    /// Times the gate asked it, and verify steps it drafted.
    pub asked: u64,
    pub verify_steps: u64,
    /// Shadow drafts measured against the tokens that followed.
    pub shadows: u64,
    /// How often it had a guess when asked (moving average).
    pub proposed: Option<f64>,
    pub gain: Option<f64>,
    pub time_ratio: Option<f64>,
    pub bytes_ratio: Option<f64>,
    pub tokens_per_verify: Option<f64>,
    pub acceptance_at: Vec<f64>,
}

/// A moving average that starts at its first sample.
#[derive(Clone, Copy, Debug, Default)]
struct Ema(Option<f64>);

impl Ema {
    fn add(&mut self, x: f64, weight: f64) {
        self.0 = Some(match self.0 {
            Some(v) => v + weight * (x - v),
            None => x,
        });
    }
}

/// The last [`COST_WINDOW`] samples, for their median (fixed size: a
/// decode step allocates nothing).
#[derive(Clone, Debug, Default)]
struct Window {
    samples: [f64; COST_WINDOW],
    len: usize,
    next: usize,
}

impl Window {
    fn add(&mut self, x: f64) {
        self.samples[self.next] = x;
        self.len = (self.len + 1).min(COST_WINDOW);
        self.next = (self.next + 1) % COST_WINDOW;
    }

    fn median(&self) -> Option<f64> {
        let mut copy = self.samples;
        let v = &mut copy[..self.len];
        v.sort_by(f64::total_cmp);
        let n = v.len();
        match n {
            0 => None,
            _ if n % 2 == 1 => Some(v[n / 2]),
            _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
        }
    }
}

/// A step's wall time and expert bytes, over [`COST_WINDOW`] steps.
#[derive(Clone, Debug, Default)]
struct Costs {
    seconds: Window,
    bytes: Window,
    n: u32,
}

impl Costs {
    fn add(&mut self, cost: StepCost) {
        self.seconds.add(cost.seconds);
        self.bytes.add(cost.bytes as f64);
        self.n += 1;
    }
}

/// A shadowed drafter's guess, held against the tokens that follow it.
#[derive(Clone, Debug, Default)]
struct Shadow {
    drafts: Vec<u32>,
    /// Leading drafts the tokens so far matched.
    matched: usize,
    pending: bool,
}

/// What the gate measured of one drafter.
#[derive(Clone, Debug, Default)]
struct Arm {
    name: &'static str,
    verify: Costs,
    asked: u32,
    tokens: Ema,
    accept_at: Vec<Ema>,
    /// 1 for an ask that drafted, 0 for one without a guess.
    proposed: Ema,
    /// Whether it is measured by shadow drafts rather than probes.
    shadowed: bool,
    shadow: Shadow,
    shadows: u32,
}

impl Arm {
    /// Adds one outcome: `drafted` drafts, the first `accepted` kept,
    /// `tokens` produced.
    fn add_outcome(&mut self, drafted: usize, accepted: usize, tokens: usize, weight: f64) {
        self.proposed.add(1.0, weight);
        self.tokens.add(tokens as f64, weight);
        if self.accept_at.len() < drafted {
            self.accept_at.resize(drafted, Ema::default());
        }
        for (i, e) in self.accept_at.iter_mut().take(drafted).enumerate() {
            e.add((i < accepted) as u8 as f64, weight);
        }
    }

    /// Holds `token`, the next one produced, against a pending shadow;
    /// true when that settles it (a miss, or every draft matched).
    fn shadow_sees(&mut self, token: u32) -> bool {
        let sh = &mut self.shadow;
        if !sh.pending {
            return false;
        }
        let hit = sh.drafts[sh.matched] == token;
        sh.matched += hit as usize;
        if hit && sh.matched < sh.drafts.len() {
            return false;
        }
        sh.pending = false;
        let (drafted, accepted) = (sh.drafts.len(), sh.matched);
        self.shadows += 1;
        self.add_outcome(drafted, accepted, accepted + 1, EMA_WEIGHT);
        true
    }
}

/// What a re-choice rests on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Evidence {
    /// A step of the current choice (or warm-up).
    Step,
    /// A probe of this drafter.
    Probe(usize),
    /// A shadow draft's outcome.
    Shadow,
}

/// The gate of one session.
#[derive(Clone, Debug)]
pub struct Gate {
    phase: Phase,
    plain: Costs,
    arms: Vec<Arm>,
    /// The drafter asked for the step in flight.
    asked: Option<usize>,
    /// Decode steps since the last plain one.
    since_plain: u32,
    /// Steps since the last probe (or change of choice), the interval
    /// between probes, and the drafter the next probe asks.
    since_probe: u32,
    probe_every: u32,
    probe_next: usize,
    stats: GateStats,
}

impl Gate {
    /// A gate choosing among the drafters named `names` (in the session's
    /// order; at least one), each measured by probes.
    pub fn new(names: &[&'static str]) -> Gate {
        assert!(!names.is_empty(), "a gate needs a drafter");
        let arm = |&name| Arm {
            name,
            ..Arm::default()
        };
        Gate {
            phase: Phase::Warmup,
            plain: Costs::default(),
            arms: names.iter().map(arm).collect(),
            asked: None,
            since_plain: 0,
            since_probe: 0,
            probe_every: PROBE_EVERY_MIN,
            probe_next: 0,
            stats: GateStats::default(),
        }
    }

    /// The same gate, with the drafters where `shadowed` is true measured
    /// by shadow drafts (their guesses cost nothing next to a step).
    pub fn with_shadows(mut self, shadowed: &[bool]) -> Gate {
        for (arm, &s) in self.arms.iter_mut().zip(shadowed) {
            arm.shadowed = s;
        }
        self
    }

    /// Whether drafter `a` wants a shadow guess this step: shadowed, none
    /// pending, and not the one drafting.
    pub fn wants_shadow(&self, a: usize) -> bool {
        let arm = &self.arms[a];
        arm.shadowed && !arm.shadow.pending && self.asked != Some(a)
    }

    /// Drafter `a`'s shadow guess of what follows the last token (`drafts`
    /// empty: it had none), to be held against the tokens produced next
    /// ([`Gate::produced`]).
    pub fn shadow(&mut self, a: usize, drafts: &[u32]) {
        let arm = &mut self.arms[a];
        if drafts.is_empty() {
            arm.shadows += 1;
            arm.proposed.add(0.0, EMA_WEIGHT);
            return;
        }
        arm.shadow.drafts.clear();
        arm.shadow.drafts.extend_from_slice(drafts);
        arm.shadow.matched = 0;
        arm.shadow.pending = true;
    }

    /// After a step: the tokens it produced, in order (settles the shadow
    /// guesses they decide).
    pub fn produced(&mut self, tokens: &[u32]) {
        let mut settled = false;
        for arm in &mut self.arms {
            for &t in tokens {
                if arm.shadow_sees(t) {
                    settled = true;
                    break;
                }
            }
        }
        if settled {
            self.settle(Evidence::Shadow);
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Whether the next decode step drafts, and with which drafter.
    pub fn decide(&mut self) -> Decision {
        let phase = self.phase;
        let d = match phase {
            Phase::Warmup => self.warmup_decision(),
            Phase::On(_) if self.since_plain + 1 >= PLAIN_REFRESH_EVERY => Decision::Plain,
            Phase::On(a) => Decision::Draft(self.probe(Some(a)).unwrap_or(a)),
            Phase::Off => self.probe(None).map_or(Decision::Plain, Decision::Draft),
        };
        match d {
            Decision::Draft(a) => {
                self.asked = Some(a);
                self.stats.on_steps += 1;
            }
            Decision::Plain => {
                self.asked = None;
                self.stats.off_steps += 1;
            }
        }
        d
    }

    /// The least-asked probed drafter not yet warmed up, with a plain
    /// sample one step in [`PLAIN_SAMPLE_EVERY`]; plain once every probed
    /// drafter is in (the shadowed ones warm up on plain steps).
    fn warmup_decision(&self) -> Decision {
        let next = (0..self.arms.len())
            .filter(|&a| !self.arms[a].shadowed && !self.warmed(a))
            .min_by_key(|&a| self.arms[a].asked);
        match next {
            None => Decision::Plain,
            Some(_)
                if self.plain.n < WARMUP_PLAIN_STEPS
                    && self.since_plain + 1 >= PLAIN_SAMPLE_EVERY =>
            {
                Decision::Plain
            }
            Some(a) => Decision::Draft(a),
        }
    }

    /// Whether drafter `a` has been measured enough to decide on.
    fn warmed(&self, a: usize) -> bool {
        let arm = &self.arms[a];
        if arm.shadowed {
            return arm.shadows >= WARMUP_SHADOWS;
        }
        arm.asked >= WARMUP_VERIFY_STEPS
            || (arm.asked >= WARMUP_VERIFY_MIN
                && self.arm_gain(a).is_some_and(|g| g < WARMUP_GIVE_UP))
    }

    /// The drafter this step probes, if a probe is due: the next probed
    /// drafter in turn other than `current`. Steps count towards the next
    /// probe only while there is one to probe.
    fn probe(&mut self, current: Option<usize>) -> Option<usize> {
        let n = self.arms.len();
        let a = (0..n)
            .map(|i| (self.probe_next + i) % n)
            .find(|&a| Some(a) != current && !self.arms[a].shadowed)?;
        let due = self.since_probe >= self.probe_every;
        self.since_probe = if due { 0 } else { self.since_probe + 1 };
        if !due {
            return None;
        }
        self.probe_next = a + 1;
        self.stats.probes += 1;
        Some(a)
    }

    /// Plain steps a probe of `a` loses, by its measured figures.
    fn probe_loss(&self, a: usize) -> f64 {
        let tokens = self.arms[a].tokens.0.unwrap_or(1.0);
        let ratio = self.time_ratio(a).unwrap_or(1.0).max(1.0);
        (ratio - tokens).max(0.0)
    }

    /// After a step that fed no drafts (the gate kept it plain, or the
    /// drafter it asked had no guess).
    pub fn record_plain(&mut self, cost: StepCost) {
        self.plain.add(cost);
        self.since_plain = 0;
        let evidence = match self.asked.take() {
            Some(a) => {
                let (evidence, weight) = self.weight(a);
                let arm = &mut self.arms[a];
                arm.asked += 1;
                arm.proposed.add(0.0, weight);
                evidence
            }
            None => Evidence::Step,
        };
        self.settle(evidence);
    }

    /// After a verify step of `drafted` drafts, the first `accepted` kept,
    /// `tokens` produced (by the drafter asked; one drafted without asking
    /// counts for the drafter in use, else the first).
    pub fn record_verify(
        &mut self,
        cost: StepCost,
        drafted: usize,
        accepted: usize,
        tokens: usize,
    ) {
        let a = self.asked.take().unwrap_or(match self.phase {
            Phase::On(c) => c,
            _ => 0,
        });
        let (evidence, weight) = self.weight(a);
        self.since_plain += 1;
        let arm = &mut self.arms[a];
        arm.verify.add(cost);
        arm.asked += 1;
        arm.add_outcome(drafted, accepted, tokens, weight);
        self.settle(evidence);
    }

    /// Whether asking `a` now is a probe, and the weight of its outcome.
    fn weight(&self, a: usize) -> (Evidence, f64) {
        let probe = match self.phase {
            Phase::Warmup => false,
            Phase::On(c) => a != c,
            Phase::Off => true,
        };
        match probe {
            true => (Evidence::Probe(a), PROBE_WEIGHT),
            false => (Evidence::Step, EMA_WEIGHT),
        }
    }

    /// Re-chooses from the figures: warm-up ends once enough is measured;
    /// on turns off, or switches drafter; off turns on.
    fn settle(&mut self, evidence: Evidence) {
        let Some((best, gain)) = self.best() else {
            return;
        };
        let next = match self.phase {
            Phase::Warmup if !self.measured() => return,
            Phase::Warmup | Phase::On(_) if gain < GAIN_MIN => Phase::Off,
            Phase::Warmup => Phase::On(best),
            Phase::On(c) => match self.arm_gain(c) {
                Some(g) if g >= GAIN_MIN && gain < g * SWITCH_MARGIN => Phase::On(c),
                _ => Phase::On(best),
            },
            // Off turns on only on fresh evidence of acceptance (a probe,
            // a shadow's outcome), not on a plain step's cost moving
            // (which would flap with the noise).
            Phase::Off if self.fresh(evidence, best) && gain >= GAIN_RESUME => Phase::On(best),
            Phase::Off => Phase::Off,
        };
        self.move_to(next, evidence);
    }

    /// Whether `evidence` is fresh for drafter `best`'s figures: a probe,
    /// or a shadow's outcome when `best` is shadowed.
    fn fresh(&self, evidence: Evidence, best: usize) -> bool {
        match evidence {
            Evidence::Step => false,
            Evidence::Probe(_) => true,
            Evidence::Shadow => self.arms[best].shadowed,
        }
    }

    fn move_to(&mut self, next: Phase, evidence: Evidence) {
        if next == self.phase {
            if let Evidence::Probe(a) = evidence {
                let floor = (self.probe_loss(a) / PROBE_LOSS_SHARE).ceil() as u32;
                self.probe_every = (self.probe_every * 2).max(floor).min(PROBE_EVERY_MAX);
            }
            return;
        }
        match (self.phase, next) {
            (_, Phase::Off) => self.stats.turned_off += 1,
            (Phase::Off, _) => self.stats.turned_on += 1,
            (Phase::On(_), _) => self.stats.switched += 1,
            _ => {}
        }
        self.phase = next;
        self.since_probe = 0;
        self.probe_every = PROBE_EVERY_MIN;
    }

    /// Every drafter warmed up, and the plain samples in.
    fn measured(&self) -> bool {
        self.plain.n >= WARMUP_PLAIN_STEPS && (0..self.arms.len()).all(|a| self.warmed(a))
    }

    /// The drafter of the highest gain (the first of equals), and its gain.
    fn best(&self) -> Option<(usize, f64)> {
        (0..self.arms.len())
            .filter_map(|a| Some((a, self.arm_gain(a)?)))
            .fold(None, |b, (a, g)| match b {
                Some((_, bg)) if bg >= g => b,
                _ => Some((a, g)),
            })
    }

    /// The gain of the drafter in use, else the best; `None` until a
    /// drafter and the plain steps are measured.
    pub fn gain(&self) -> Option<f64> {
        self.arm_gain(self.shown()?)
    }

    /// Drafter `a`'s gain: a step it drafts gives its tokens per verify
    /// step over the verify's cost in plain steps (a shadowed drafter's
    /// not yet measured: [`SHADOW_RATIO_PRIOR`]), one without a guess is a
    /// plain step.
    fn arm_gain(&self, a: usize) -> Option<f64> {
        let arm = &self.arms[a];
        let proposed = arm.proposed.0?;
        let drafted = match (arm.verify.n, arm.tokens.0) {
            (0, Some(t)) if arm.shadowed => t / SHADOW_RATIO_PRIOR,
            (0, _) => 1.0,
            _ => arm.tokens.0? / self.time_ratio(a)?.max(1.0),
        };
        Some(proposed * drafted + (1.0 - proposed))
    }

    fn time_ratio(&self, a: usize) -> Option<f64> {
        let v = &self.arms[a].verify;
        ratio(v.seconds.median()?, self.plain.seconds.median()?)
    }

    fn bytes_ratio(&self, a: usize) -> Option<f64> {
        let v = &self.arms[a].verify;
        ratio(v.bytes.median()?, self.plain.bytes.median()?)
    }

    /// The drafter whose figures the stats show first.
    fn shown(&self) -> Option<usize> {
        match self.phase {
            Phase::On(a) => Some(a),
            _ => self.best().map(|(a, _)| a),
        }
    }

    /// What the gate did, with its latest figures.
    pub fn stats(&self) -> GateStats {
        let drafters: Vec<DrafterStats> = (0..self.arms.len()).map(|a| self.arm_stats(a)).collect();
        let shown = self
            .shown()
            .map(|a| drafters[a].clone())
            .unwrap_or_default();
        GateStats {
            drafter: match self.phase {
                Phase::On(a) => Some(self.arms[a].name),
                _ => None,
            },
            gain: shown.gain,
            time_ratio: shown.time_ratio,
            bytes_ratio: shown.bytes_ratio,
            tokens_per_verify: shown.tokens_per_verify,
            acceptance_at: shown.acceptance_at,
            drafters,
            ..self.stats.clone()
        }
    }

    fn arm_stats(&self, a: usize) -> DrafterStats {
        let arm = &self.arms[a];
        DrafterStats {
            name: arm.name,
            asked: arm.asked.into(),
            verify_steps: arm.verify.n.into(),
            shadows: arm.shadows.into(),
            proposed: arm.proposed.0,
            gain: self.arm_gain(a),
            time_ratio: self.time_ratio(a),
            bytes_ratio: self.bytes_ratio(a),
            tokens_per_verify: arm.tokens.0,
            acceptance_at: arm.accept_at.iter().filter_map(|e| e.0).collect(),
        }
    }
}

fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| a / b)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: StepCost = StepCost {
        seconds: 1.0,
        bytes: 100,
    };
    const VERIFY: StepCost = StepCost {
        seconds: 1.5,
        bytes: 250,
    };
    /// A verify step that, without acceptance, loses only a little (gain
    /// 1 / 1.2: above [`WARMUP_GIVE_UP`], so warm-up asks 8 times).
    const NEAR: StepCost = StepCost {
        seconds: 1.2,
        bytes: 250,
    };

    /// A drafter's outcome when asked: `None` without a guess, else the
    /// step's cost and how many of 4 drafts were accepted.
    type Outcome = Option<(StepCost, usize)>;

    /// Runs `steps` decode steps, asking `outcome` what each drafted step
    /// gives. Returns the decisions.
    fn run_with(g: &mut Gate, steps: usize, outcome: impl Fn(usize) -> Outcome) -> Vec<Decision> {
        (0..steps)
            .map(|_| {
                let d = g.decide();
                match d {
                    Decision::Draft(a) => match outcome(a) {
                        Some((cost, accepted)) => g.record_verify(cost, 4, accepted, accepted + 1),
                        None => g.record_plain(PLAIN),
                    },
                    Decision::Plain => g.record_plain(PLAIN),
                }
                d
            })
            .collect()
    }

    /// One drafter whose drafted steps cost [`VERIFY`] and accept `accepted`.
    fn run(g: &mut Gate, steps: usize, accepted: usize) -> Vec<Decision> {
        run_with(g, steps, |_| Some((VERIFY, accepted)))
    }

    fn drafted(d: &[Decision]) -> Vec<usize> {
        (0..d.len()).filter(|&i| d[i] != Decision::Plain).collect()
    }

    #[test]
    fn warmup_samples_plain_steps_then_decides() {
        let mut g = Gate::new(&["x"]);
        let d = run_with(&mut g, 14, |_| Some((NEAR, 0)));
        // One plain step in PLAIN_SAMPLE_EVERY until three are measured.
        let plain: Vec<usize> = (0..14).filter(|&i| d[i] == Decision::Plain).collect();
        // (the third right after the eighth verify step, at 9).
        assert_eq!(&plain[..3], &[3, 7, 10]);
        // Never accepted: off once 8 verify steps are in.
        assert_eq!(g.phase(), Phase::Off);
        let s = g.stats();
        assert_eq!(s.turned_off, 1);
        assert_eq!(s.time_ratio, Some(1.2));
        assert_eq!(s.bytes_ratio, Some(2.5));
        assert_eq!(s.tokens_per_verify, Some(1.0));
        assert_eq!(s.acceptance_at, [0.0; 4]);
        assert_eq!(s.drafter, None);
    }

    #[test]
    fn a_paying_drafter_stays_on_with_refresh_samples() {
        let mut g = Gate::new(&["x"]);
        let d = run(&mut g, 200, 3);
        assert_eq!(g.phase(), Phase::On(0));
        // After warm-up, one plain step in PLAIN_REFRESH_EVERY.
        let plain: Vec<usize> = (8..d.len()).filter(|&i| d[i] == Decision::Plain).collect();
        assert_eq!(plain.len(), 6, "{plain:?}");
        assert!(plain
            .windows(2)
            .all(|w| w[1] - w[0] == PLAIN_REFRESH_EVERY as usize));
        let s = g.stats();
        assert_eq!(s.gain, Some(4.0 / 1.5));
        assert_eq!((s.turned_off, s.probes), (0, 0));
        assert_eq!(s.drafter, Some("x"));
    }

    #[test]
    fn off_probes_with_a_growing_interval() {
        let mut g = Gate::new(&["x"]);
        let near = |_| Some((NEAR, 0));
        // Off at the eleventh step (the eighth verify).
        run_with(&mut g, 11, near);
        assert_eq!((g.phase(), g.probe_every), (Phase::Off, PROBE_EVERY_MIN));
        let d = run_with(&mut g, 8 + 1 + 16 + 1 + 32 + 1, near);
        assert_eq!(drafted(&d), [8, 8 + 1 + 16, 8 + 1 + 16 + 1 + 32]);
        assert_eq!(g.stats().probes, 3);
        assert_eq!(g.probe_every, 64);
        // The interval stops growing at its maximum.
        run_with(&mut g, 5000, near);
        assert_eq!((g.phase(), g.probe_every), (Phase::Off, PROBE_EVERY_MAX));
    }

    #[test]
    fn probes_resume_drafting_when_acceptance_returns() {
        let mut g = Gate::new(&["x"]);
        run_with(&mut g, 12, |_| Some((NEAR, 0)));
        // Acceptance comes back: the next probe moves the averages (tokens
        // 1 → 5 at PROBE_WEIGHT: 3.0, a gain of 2.5) and drafting is on
        // from the step after it.
        let d = run(&mut g, 9, 4);
        assert_eq!(drafted(&d), [7, 8]);
        let s = g.stats();
        assert_eq!(g.phase(), Phase::On(0));
        assert_eq!((s.turned_off, s.turned_on, s.probes), (1, 1, 1), "{s:?}");
        // (3.0, then 3.5 after step 8's five tokens; the median verify
        // cost still the warm-up's.)
        assert_eq!(s.gain, Some(3.5 / 1.2));
    }

    #[test]
    fn plain_steps_alone_do_not_turn_drafting_back_on() {
        let mut g = Gate::new(&["x"]);
        // Off: one accepted draft of 4 at 2.5 plain steps (gain 2 / 2.5).
        let dear = StepCost {
            seconds: 2.5,
            bytes: 300,
        };
        run_with(&mut g, 12, |_| Some((dear, 1)));
        assert_eq!(g.phase(), Phase::Off);
        // Plain steps get as dear: the figures soon say drafting would pay
        // (gain 2), but only a probe's fresh evidence turns it on.
        while g.decide() == Decision::Plain {
            g.record_plain(MID);
            assert_eq!(g.phase(), Phase::Off);
        }
        assert_eq!(g.gain(), Some(2.0));
        g.record_verify(dear, 4, 1, 2);
        assert_eq!(g.phase(), Phase::On(0));
    }

    #[test]
    fn a_verify_measured_cheaper_than_plain_costs_one_plain_step() {
        let mut g = Gate::new(&["x"]);
        for _ in 0..3 {
            g.record_plain(VERIFY);
        }
        for _ in 0..8 {
            g.record_verify(PLAIN, 4, 0, 1);
        }
        // Noise made verify look cheaper; zero acceptance still loses.
        assert_eq!(g.gain(), Some(1.0));
        assert_eq!(g.phase(), Phase::Off);
    }

    #[test]
    fn one_slow_step_does_not_decide() {
        let mut g = Gate::new(&["x"]);
        g.record_plain(PLAIN);
        // One plain step stalled on a slow read.
        g.record_plain(StepCost {
            seconds: 50.0,
            bytes: 100,
        });
        g.record_plain(PLAIN);
        for _ in 0..8 {
            g.record_verify(VERIFY, 4, 0, 1);
        }
        assert_eq!(g.stats().time_ratio, Some(1.5));
        assert_eq!(g.phase(), Phase::Off);
    }

    #[test]
    fn no_decision_without_both_figures() {
        let mut g = Gate::new(&["x"]);
        for _ in 0..20 {
            g.record_verify(VERIFY, 2, 0, 1);
        }
        assert_eq!(g.gain(), None);
        assert_eq!(g.phase(), Phase::Warmup);
        assert_eq!(g.stats().drafters[0].acceptance_at, [0.0, 0.0]);
    }

    /// Drafter 0 ("mtp") accepts 3 of 4 but its step costs 4.5 plain
    /// steps (its head's forward); drafter 1 ("ngram") accepts 2 at 1.5.
    fn mtp_and_ngram(a: usize) -> Outcome {
        let dear = StepCost {
            seconds: 4.5,
            bytes: 300,
        };
        Some([(dear, 3), (VERIFY, 2)][a])
    }

    #[test]
    fn acceptance_times_cost_chooses_the_drafter_not_its_order() {
        let mut g = Gate::new(&["mtp", "ngram"]);
        let d = run_with(&mut g, 30, mtp_and_ngram);
        // Warm-up asks them in turn.
        assert_eq!(
            &d[..3],
            &[Decision::Draft(0), Decision::Draft(1), Decision::Draft(0)]
        );
        assert_eq!(g.phase(), Phase::On(1));
        let s = g.stats();
        assert_eq!(s.drafter, Some("ngram"));
        assert_eq!(s.gain, Some(3.0 / 1.5));
        assert_eq!(s.drafters[0].gain, Some(4.0 / 4.5));
        // Asked for its warm-up, then probed once while n-gram drafts.
        assert_eq!(s.probes, 1);
        assert_eq!(s.drafters[0].asked, u64::from(WARMUP_VERIFY_STEPS) + 1);
    }

    const MID: StepCost = StepCost {
        seconds: 3.0,
        bytes: 300,
    };

    #[test]
    fn the_drafter_in_use_gives_way_when_its_acceptance_falls() {
        // MTP: gain 4 / 3; n-gram: 3 / 1.5 = 2, in use.
        let mut g = Gate::new(&["mtp", "ngram"]);
        run_with(&mut g, 30, |a| Some([(MID, 3), (VERIFY, 2)][a]));
        assert_eq!(g.phase(), Phase::On(1));
        // The n-gram drafts stop being accepted: its average falls step by
        // step, and below MTP's gain over SWITCH_MARGIN the gate switches
        // (without turning off).
        let d = run_with(&mut g, 4, |a| Some([(MID, 3), (VERIFY, 0)][a]));
        assert_eq!(d, [Decision::Draft(1); 4]);
        assert_eq!(g.phase(), Phase::On(0));
        let s = g.stats();
        assert_eq!((s.switched, s.turned_off), (1, 0), "{s:?}");
        assert_eq!(s.drafter, Some("mtp"));
    }

    #[test]
    fn a_probe_while_on_switches_to_a_better_drafter() {
        // MTP: gain 4 / 3, in use; n-gram never accepted: 1 / 1.5.
        let mut g = Gate::new(&["mtp", "ngram"]);
        run_with(&mut g, 30, |a| Some([(MID, 3), (VERIFY, 0)][a]));
        assert_eq!(g.phase(), Phase::On(0));
        // The text turns repetitive: n-gram drafts are all accepted. The
        // next probe (tokens 1 → 3 at PROBE_WEIGHT: gain 2) switches.
        let d = run_with(&mut g, 40, |a| Some([(MID, 3), (VERIFY, 4)][a]));
        assert_eq!(g.phase(), Phase::On(1), "{d:?}");
        let s = g.stats();
        assert_eq!(s.switched, 1, "{s:?}");
        // Drafting with n-gram from its probe on; MTP now the one probed,
        // PROBE_EVERY_MIN drafted steps after the switch (a plain refresh
        // sample does not count).
        let first = d.iter().position(|&x| x == Decision::Draft(1)).unwrap();
        let probe = (first..d.len())
            .find(|&i| d[i] == Decision::Draft(0))
            .unwrap();
        let between = d[first + 1..probe]
            .iter()
            .filter(|&&x| x == Decision::Draft(1))
            .count();
        assert_eq!(between, PROBE_EVERY_MIN as usize, "{d:?}");
    }

    #[test]
    fn a_drafter_without_guesses_is_a_plain_step() {
        // Drafter 1 never has a guess: gain 1, never chosen; drafter 0 pays.
        let mut g = Gate::new(&["a", "b"]);
        run_with(&mut g, 40, |a| (a == 0).then_some((VERIFY, 3)));
        assert_eq!(g.phase(), Phase::On(0));
        let s = g.stats();
        assert_eq!(s.drafters[1].gain, Some(1.0));
        assert_eq!(s.drafters[1].verify_steps, 0);
        assert_eq!(s.drafters[1].proposed, Some(0.0));
    }

    #[test]
    fn off_probes_every_drafter_in_turn() {
        let mut g = Gate::new(&["a", "b"]);
        let d = run_with(&mut g, 200, |_| Some((NEAR, 0)));
        assert_eq!(g.phase(), Phase::Off);
        let probes: Vec<Decision> = drafted(&d)
            .into_iter()
            .skip(2 * WARMUP_VERIFY_STEPS as usize)
            .map(|i| d[i])
            .collect();
        // At 8, 16, 32 and 64 steps after the warm-up.
        assert_eq!(probes, [0, 1, 0, 1].map(Decision::Draft));
    }

    /// Decode steps of a session whose text is 0, 1, 2, …: drafter `a`'s
    /// guesses of 4 tokens (shadow or drafted) at step `i` hold the first
    /// `right(a, i)`; its drafted steps cost `cost(a)`, plain ones
    /// [`PLAIN`]. Returns the decisions.
    fn run_shadowed(
        g: &mut Gate,
        steps: usize,
        cost: impl Fn(usize) -> StepCost,
        right: impl Fn(usize, usize) -> usize,
    ) -> Vec<Decision> {
        let mut next = 0u32;
        let guess = |n: u32, r: usize| -> Vec<u32> {
            (0..4u32)
                .map(|j| if (j as usize) < r { n + j } else { u32::MAX })
                .collect()
        };
        (0..steps)
            .map(|i| {
                let d = g.decide();
                for a in 0..g.arms.len() {
                    if g.wants_shadow(a) {
                        g.shadow(a, &guess(next, right(a, i)));
                    }
                }
                let produced = match d {
                    Decision::Draft(a) => {
                        let acc = right(a, i);
                        g.record_verify(cost(a), 4, acc, acc + 1);
                        acc + 1
                    }
                    Decision::Plain => {
                        g.record_plain(PLAIN);
                        1
                    }
                };
                let tokens: Vec<u32> = (next..next + produced as u32).collect();
                g.produced(&tokens);
                next += produced as u32;
                d
            })
            .collect()
    }

    fn shadowed() -> Gate {
        Gate::new(&["ngram"]).with_shadows(&[true])
    }

    #[test]
    fn a_shadowed_drafter_that_never_pays_costs_no_verify_step() {
        let mut g = shadowed();
        let d = run_shadowed(&mut g, 300, |_| VERIFY, |_, _| 0);
        assert_eq!(drafted(&d), Vec::<usize>::new());
        assert_eq!(g.phase(), Phase::Off);
        let s = g.stats();
        assert_eq!((s.probes, s.on_steps), (0, 0));
        // Each guess missed at once: one shadow outcome a step.
        assert_eq!(s.drafters[0].shadows, 300);
        assert_eq!(s.drafters[0].acceptance_at, [0.0; 4]);
    }

    #[test]
    fn shadows_turn_a_paying_drafter_on_and_its_own_cost_then_decides() {
        let mut g = shadowed();
        let d = run_shadowed(&mut g, 200, |_| VERIFY, |_, _| 3);
        // Plain until 8 shadow outcomes (4 steps each) are in, then on.
        let first = drafted(&d)[0];
        assert_eq!(first, 4 * WARMUP_SHADOWS as usize);
        assert_eq!(g.phase(), Phase::On(0));
        let s = g.stats();
        assert_eq!((s.probes, s.time_ratio), (0, Some(1.5)));
        assert_eq!(s.gain, Some(4.0 / 1.5));

        // The same acceptance at a verify of 5 plain steps: one verify
        // step measures it, and drafting stays off after.
        let mut g = shadowed();
        let dear = StepCost {
            seconds: 5.0,
            bytes: 900,
        };
        let d = run_shadowed(&mut g, 300, |_| dear, |_, _| 3);
        assert_eq!(drafted(&d).len(), 1, "{d:?}");
        assert_eq!(g.phase(), Phase::Off);
        assert_eq!(g.gain(), Some(4.0 / 5.0));
    }

    #[test]
    fn shadows_turn_drafting_on_when_the_text_starts_to_repeat() {
        let mut g = shadowed();
        let d = run_shadowed(&mut g, 160, |_| VERIFY, |_, i| if i < 100 { 0 } else { 3 });
        // Off (no verify step) while nothing repeats; on two shadow
        // outcomes (4 steps each) after it does: tokens per guess 1 →
        // 1.75 → 2.31, GAIN_RESUME times the prior's 2.0 at least.
        let on = drafted(&d);
        assert_eq!(on[0], 100 + 2 * 4, "{d:?}");
        assert_eq!(g.phase(), Phase::On(0));
        assert_eq!(g.stats().probes, 0);
    }

    #[test]
    fn a_probed_drafter_and_a_shadowed_one_choose_by_gain() {
        // MTP (probed) accepts 3 at 4.5 plain steps; n-gram (shadowed)
        // accepts 2 at 1.5.
        let mut g = Gate::new(&["mtp", "ngram"]).with_shadows(&[false, true]);
        let dear = StepCost {
            seconds: 4.5,
            bytes: 300,
        };
        let d = run_shadowed(&mut g, 200, |a| [dear, VERIFY][a], |a, _| [3, 2][a]);
        assert_eq!(g.phase(), Phase::On(1));
        let s = g.stats();
        assert_eq!(s.drafter, Some("ngram"));
        // MTP asked for its warm-up and probed, n-gram measured by shadows
        // while MTP warmed up.
        assert_eq!(
            s.drafters[0].asked,
            u64::from(WARMUP_VERIFY_STEPS) + s.probes
        );
        assert!(s.drafters[1].shadows >= u64::from(WARMUP_SHADOWS), "{s:?}");
        let mtp = d.iter().filter(|&&x| x == Decision::Draft(0)).count() as u64;
        assert_eq!(mtp, s.drafters[0].asked);
    }

    #[test]
    fn warmup_gives_up_early_on_a_clear_loser() {
        // Never accepted at 1.5 plain steps: gain 1 / 1.5 after the
        // minimum asks, so warm-up stops asking and takes its plain samples.
        let mut g = Gate::new(&["x"]);
        let d = run(&mut g, 6, 0);
        assert_eq!(drafted(&d), [0, 1, 2]);
        assert_eq!(g.phase(), Phase::Off);
        assert_eq!(g.stats().drafters[0].asked, u64::from(WARMUP_VERIFY_MIN));
    }

    #[test]
    fn a_dear_probe_waits_longer() {
        // A probe that costs 4.5 plain steps and gives 1 token loses 3.5:
        // the next one comes no sooner than 3.5 / PROBE_LOSS_SHARE steps.
        let mut g = Gate::new(&["x"]);
        let dear = StepCost {
            seconds: 4.5,
            bytes: 300,
        };
        let d = run_with(&mut g, 40, |_| Some((dear, 0)));
        assert_eq!(g.phase(), Phase::Off);
        assert_eq!(g.stats().probes, 1, "{d:?}");
        assert_eq!(g.probe_every, (3.5 / PROBE_LOSS_SHARE).ceil() as u32);
    }
}
