//! The speculation gate: whether a session drafts this step, decided from
//! figures it measured itself, so `--speculate auto` pays or turns itself
//! off. Pure logic (no clock, no model): the session feeds each decode
//! step's cost and outcome in, and asks before the next step.
//!
//! - Figures: the medians of the last [`COST_WINDOW`] plain steps' and
//!   verify steps' wall time and expert bytes read (a median, so one slow
//!   read on a shared disk does not decide), and moving averages
//!   ([`EMA_WEIGHT`]) of the tokens a verify step produced and of the
//!   acceptance at each draft position.
//! - Gain: tokens per verify step over the verify step's cost in plain
//!   steps (`verify s / plain s`, at least 1: a verify is never cheaper
//!   than a plain step, and a ratio below 1 is noise). The wall time
//!   holds the verify's extra expert reads; their byte ratio is reported
//!   beside it, not counted twice.
//! - Warm-up: drafts on every step but one in [`PLAIN_SAMPLE_EVERY`] (the
//!   plain samples) until [`WARMUP_VERIFY_STEPS`] verify steps are
//!   measured, then plain until [`WARMUP_PLAIN_STEPS`] are; then on while the
//!   gain is at least [`GAIN_MIN`] (a plain step every
//!   [`PLAIN_REFRESH_EVERY`] keeps the plain cost current), off below.
//! - Off: plain steps, with one drafted probe after `probe_every` of them;
//!   a probe (weighted [`PROBE_WEIGHT`] in the averages) that lifts the
//!   gain to [`GAIN_RESUME`] turns drafting back on, one that does not
//!   doubles `probe_every` (from
//!   [`PROBE_EVERY_MIN`] up to [`PROBE_EVERY_MAX`]).
//!
//! Lossless whatever it decides: it only chooses whether drafts are fed,
//! and every token still comes from the target's logits.

/// Weight of the newest step in the acceptance moving averages.
pub const EMA_WEIGHT: f64 = 0.25;
/// Weight of a probe's outcome in the acceptance averages: the figures
/// are stale while off, and the probe is the freshest evidence.
pub const PROBE_WEIGHT: f64 = 0.5;
/// Steps of each kind whose cost the medians are taken over.
pub const COST_WINDOW: usize = 8;
/// Verify steps measured before the first decision.
pub const WARMUP_VERIFY_STEPS: u32 = 8;
/// Plain steps measured before the first decision.
pub const WARMUP_PLAIN_STEPS: u32 = 3;
/// During warm-up, one step in this many is plain (the plain cost sample).
pub const PLAIN_SAMPLE_EVERY: u32 = 4;
/// While on, one step in this many is plain (keeps the plain cost current
/// as the cache warms or the machine's load changes).
pub const PLAIN_REFRESH_EVERY: u32 = 32;
/// Drafting stays on while the gain (tokens per verify step over its cost
/// in plain steps) is at least this: a margin for the drafting's own cost
/// and the noise of the measure.
pub const GAIN_MIN: f64 = 1.05;
/// A probe turns drafting back on when the gain reaches this (above
/// [`GAIN_MIN`], so the gate does not flap).
pub const GAIN_RESUME: f64 = 1.10;
/// Plain steps before the first probe once off.
pub const PROBE_EVERY_MIN: u32 = 8;
/// The most plain steps between probes (the interval doubles while probes
/// keep losing).
pub const PROBE_EVERY_MAX: u32 = 256;

/// What a session does on its next decode step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Feed the drafter's tokens (a verify step).
    Draft,
    /// Feed the last token alone.
    Plain,
}

/// Where the gate stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Warmup,
    On,
    /// Plain steps since the last probe, and the interval between probes.
    Off {
        since: u32,
        probe_every: u32,
    },
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
    /// Drafted steps taken while off.
    pub probes: u64,
    /// Times drafting was turned off, and back on.
    pub turned_off: u64,
    pub turned_on: u64,
    /// The latest figures: the gain, the verify step's wall-time and
    /// expert-byte ratios to a plain step, tokens per verify step, and the
    /// acceptance at each draft position (`None` until measured).
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

/// The gate of one session.
#[derive(Clone, Debug)]
pub struct Gate {
    phase: Phase,
    plain_s: Window,
    plain_bytes: Window,
    plain_n: u32,
    verify_s: Window,
    verify_bytes: Window,
    verify_n: u32,
    tokens: Ema,
    accept_at: Vec<Ema>,
    /// Decode steps since the last plain one.
    since_plain: u32,
    stats: GateStats,
}

impl Default for Gate {
    fn default() -> Gate {
        Gate::new()
    }
}

impl Gate {
    pub fn new() -> Gate {
        Gate {
            phase: Phase::Warmup,
            plain_s: Window::default(),
            plain_bytes: Window::default(),
            plain_n: 0,
            verify_s: Window::default(),
            verify_bytes: Window::default(),
            verify_n: 0,
            tokens: Ema::default(),
            accept_at: Vec::new(),
            since_plain: 0,
            stats: GateStats::default(),
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Whether the next decode step drafts.
    pub fn decide(&mut self) -> Decision {
        let d = match self.phase {
            // The verify steps are in: the plain samples still missing.
            Phase::Warmup if self.verify_n >= WARMUP_VERIFY_STEPS => Decision::Plain,
            Phase::Warmup if self.plain_n < WARMUP_PLAIN_STEPS => {
                plain_sample(self.since_plain, PLAIN_SAMPLE_EVERY)
            }
            Phase::Warmup => Decision::Draft,
            Phase::On => plain_sample(self.since_plain, PLAIN_REFRESH_EVERY),
            Phase::Off { since, probe_every } if since >= probe_every => {
                self.stats.probes += 1;
                Decision::Draft
            }
            Phase::Off { .. } => Decision::Plain,
        };
        match d {
            Decision::Draft => self.stats.on_steps += 1,
            Decision::Plain => self.stats.off_steps += 1,
        }
        d
    }

    /// After a step that fed no drafts (the gate kept it plain, or the
    /// drafter had no guess).
    pub fn record_plain(&mut self, cost: StepCost) {
        self.plain_s.add(cost.seconds);
        self.plain_bytes.add(cost.bytes as f64);
        self.plain_n += 1;
        self.since_plain = 0;
        match &mut self.phase {
            Phase::Off { since, .. } => *since += 1,
            _ => self.settle(),
        }
    }

    /// After a verify step of `drafted` drafts, the first `accepted` kept,
    /// `tokens` produced.
    pub fn record_verify(
        &mut self,
        cost: StepCost,
        drafted: usize,
        accepted: usize,
        tokens: usize,
    ) {
        self.verify_s.add(cost.seconds);
        self.verify_bytes.add(cost.bytes as f64);
        self.verify_n += 1;
        self.since_plain += 1;
        let weight = match self.phase {
            Phase::Off { .. } => PROBE_WEIGHT,
            _ => EMA_WEIGHT,
        };
        self.tokens.add(tokens as f64, weight);
        if self.accept_at.len() < drafted {
            self.accept_at.resize(drafted, Ema::default());
        }
        for (i, a) in self.accept_at.iter_mut().take(drafted).enumerate() {
            a.add((i < accepted) as u8 as f64, weight);
        }
        match self.phase {
            Phase::Off { probe_every, .. } => {
                if self.gain().is_some_and(|g| g >= GAIN_RESUME) {
                    self.phase = Phase::On;
                    self.stats.turned_on += 1;
                } else {
                    self.phase = Phase::Off {
                        since: 0,
                        probe_every: (probe_every * 2).min(PROBE_EVERY_MAX),
                    };
                }
            }
            _ => self.settle(),
        }
    }

    /// Warm-up ends once enough is measured; on turns off when the gain
    /// falls below [`GAIN_MIN`].
    fn settle(&mut self) {
        let Some(gain) = self.gain() else {
            return;
        };
        let measured = self.verify_n >= WARMUP_VERIFY_STEPS && self.plain_n >= WARMUP_PLAIN_STEPS;
        match self.phase {
            Phase::Warmup if measured && gain >= GAIN_MIN => self.phase = Phase::On,
            Phase::Warmup if !measured => {}
            Phase::Warmup | Phase::On if gain < GAIN_MIN => {
                self.phase = Phase::Off {
                    since: 0,
                    probe_every: PROBE_EVERY_MIN,
                };
                self.stats.turned_off += 1;
            }
            _ => {}
        }
    }

    /// Tokens per verify step over the verify step's cost in plain steps;
    /// `None` until both kinds of step are measured.
    pub fn gain(&self) -> Option<f64> {
        Some(self.tokens.0? / self.time_ratio()?.max(1.0))
    }

    fn time_ratio(&self) -> Option<f64> {
        ratio(self.verify_s.median()?, self.plain_s.median()?)
    }

    /// What the gate did, with its latest figures.
    pub fn stats(&self) -> GateStats {
        GateStats {
            gain: self.gain(),
            time_ratio: self.time_ratio(),
            bytes_ratio: self
                .verify_bytes
                .median()
                .zip(self.plain_bytes.median())
                .and_then(|(v, p)| ratio(v, p)),
            tokens_per_verify: self.tokens.0,
            acceptance_at: self.accept_at.iter().filter_map(|a| a.0).collect(),
            ..self.stats.clone()
        }
    }
}

/// Plain once `since` drafted steps reach `every - 1`, so one step in
/// `every` is plain.
fn plain_sample(since: u32, every: u32) -> Decision {
    if since + 1 >= every {
        Decision::Plain
    } else {
        Decision::Draft
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

    /// Runs `steps` decode steps: each drafted step accepts `accepted` of
    /// 4 drafts. Returns the decisions.
    fn run(g: &mut Gate, steps: usize, accepted: usize) -> Vec<Decision> {
        (0..steps)
            .map(|_| {
                let d = g.decide();
                match d {
                    Decision::Draft => g.record_verify(VERIFY, 4, accepted, accepted + 1),
                    Decision::Plain => g.record_plain(PLAIN),
                }
                d
            })
            .collect()
    }

    #[test]
    fn warmup_samples_plain_steps_then_decides() {
        let mut g = Gate::new();
        let d = run(&mut g, 14, 0);
        // One plain step in PLAIN_SAMPLE_EVERY until three are measured.
        let plain: Vec<usize> = (0..14).filter(|&i| d[i] == Decision::Plain).collect();
        // (the third right after the eighth verify step, at 9).
        assert_eq!(&plain[..3], &[3, 7, 10]);
        // Never accepted: off once 8 verify steps are in.
        assert!(matches!(g.phase(), Phase::Off { .. }));
        let s = g.stats();
        assert_eq!(s.turned_off, 1);
        assert_eq!(s.time_ratio, Some(1.5));
        assert_eq!(s.bytes_ratio, Some(2.5));
        assert_eq!(s.tokens_per_verify, Some(1.0));
        assert_eq!(s.acceptance_at, [0.0; 4]);
    }

    #[test]
    fn a_paying_drafter_stays_on_with_refresh_samples() {
        let mut g = Gate::new();
        let d = run(&mut g, 200, 3);
        assert_eq!(g.phase(), Phase::On);
        // After warm-up, one plain step in PLAIN_REFRESH_EVERY.
        let plain: Vec<usize> = (8..d.len()).filter(|&i| d[i] == Decision::Plain).collect();
        assert_eq!(plain.len(), 6, "{plain:?}");
        assert!(plain
            .windows(2)
            .all(|w| w[1] - w[0] == PLAIN_REFRESH_EVERY as usize));
        assert_eq!(g.stats().gain, Some(4.0 / 1.5));
        assert_eq!(g.stats().turned_off, 0);
    }

    #[test]
    fn off_probes_with_a_growing_interval() {
        let mut g = Gate::new();
        // Off at the eleventh step (the eighth verify).
        run(&mut g, 11, 0);
        assert_eq!(
            g.phase(),
            Phase::Off {
                since: 0,
                probe_every: PROBE_EVERY_MIN
            }
        );
        let d = run(&mut g, 8 + 1 + 16 + 1 + 32 + 1, 0);
        let probes: Vec<usize> = (0..d.len()).filter(|&i| d[i] == Decision::Draft).collect();
        assert_eq!(probes, [8, 8 + 1 + 16, 8 + 1 + 16 + 1 + 32]);
        assert_eq!(g.stats().probes, 3);
        assert_eq!(
            g.phase(),
            Phase::Off {
                since: 0,
                probe_every: 64
            }
        );
        // The interval stops growing at its maximum.
        run(&mut g, 5000, 0);
        assert!(matches!(
            g.phase(),
            Phase::Off { probe_every, .. } if probe_every == PROBE_EVERY_MAX
        ));
    }

    #[test]
    fn probes_resume_drafting_when_acceptance_returns() {
        let mut g = Gate::new();
        run(&mut g, 12, 0);
        // Acceptance comes back: each probe moves the averages, and once
        // the gain reaches GAIN_RESUME drafting is on again.
        let mut steps = 0;
        while g.phase() != Phase::On {
            run(&mut g, 1, 4);
            steps += 1;
            assert!(steps < 1000, "never resumed");
        }
        let s = g.stats();
        assert_eq!((s.turned_off, s.turned_on), (1, 1));
        assert!(s.gain.unwrap() >= GAIN_RESUME);
        // One probe suffices (tokens 1 → 5 at PROBE_WEIGHT: 3.0, a gain
        // of 2.0).
        assert_eq!(s.probes, 1, "{s:?}");
    }

    #[test]
    fn a_verify_measured_cheaper_than_plain_costs_one_plain_step() {
        let mut g = Gate::new();
        for _ in 0..3 {
            g.record_plain(VERIFY);
        }
        for _ in 0..8 {
            g.record_verify(PLAIN, 4, 0, 1);
        }
        // Noise made verify look cheaper; zero acceptance still loses.
        assert_eq!(g.gain(), Some(1.0));
        assert!(matches!(g.phase(), Phase::Off { .. }));
    }

    #[test]
    fn one_slow_step_does_not_decide() {
        let mut g = Gate::new();
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
        assert!(matches!(g.phase(), Phase::Off { .. }));
    }

    #[test]
    fn no_decision_without_both_figures() {
        let mut g = Gate::new();
        for _ in 0..20 {
            g.record_verify(VERIFY, 2, 0, 1);
        }
        assert_eq!(g.gain(), None);
        assert_eq!(g.phase(), Phase::Warmup);
        assert_eq!(g.stats().acceptance_at, [0.0, 0.0]);
    }
}
