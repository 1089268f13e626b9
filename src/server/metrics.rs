//! What `GET /metrics` reports, in the Prometheus text format: the engine
//! thread writes a [`Snapshot`] after every step; the handler formats the
//! latest one, and the request [`Timings`] the async side records as each
//! answer ends (time to first token, the time between tokens, the whole
//! request, as the client sees them: from the request's arrival).

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// Read-latency histogram bounds, µs.
pub const LATENCY_BOUNDS_US: [u64; 10] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000,
];

/// Time-to-first-token histogram bounds, seconds.
pub const TTFT_BOUNDS_S: [f64; 12] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Time-between-tokens histogram bounds, seconds.
pub const TOKEN_BOUNDS_S: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];
/// Request-duration histogram bounds, seconds.
pub const DURATION_BOUNDS_S: [f64; 12] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// A Prometheus histogram: counts per bucket (not cumulative), the total
/// count and the sum of the observations.
#[derive(Clone, Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// `counts[i]`: observations in (bounds[i-1], bounds[i]]; the last
    /// entry counts those past every bound.
    counts: Vec<u64>,
    count: u64,
    sum: f64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            count: 0,
            sum: 0.0,
        }
    }

    /// Records one observation (a non-finite or negative one as 0).
    pub fn observe(&mut self, seconds: f64) {
        let v = if seconds.is_finite() {
            seconds.max(0.0)
        } else {
            0.0
        };
        let i = self.bounds.partition_point(|&b| b < v);
        self.counts[i] += 1;
        self.count += 1;
        self.sum += v;
    }

    /// Adds `other`'s observations (same bounds).
    pub fn merge(&mut self, other: &Histogram) {
        debug_assert_eq!(self.bounds, other.bounds);
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.count += other.count;
        self.sum += other.sum;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    fn render(&self, m: &mut String, name: &str, help: &str) {
        let name = format!("moestream_{name}");
        let _ = writeln!(m, "# HELP {name} {help}");
        let _ = writeln!(m, "# TYPE {name} histogram");
        let mut below = 0;
        for (bound, n) in self.bounds.iter().zip(&self.counts) {
            below += n;
            let _ = writeln!(m, "{name}_bucket{{le=\"{bound}\"}} {below}");
        }
        let _ = writeln!(m, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(m, "{name}_sum {}", self.sum);
        let _ = writeln!(m, "{name}_count {}", self.count);
    }
}

/// The answered requests' times, as their clients saw them.
#[derive(Clone, Debug)]
pub struct Timings {
    /// From the request's arrival to its first token.
    pub ttft: Histogram,
    /// Between one token and the next.
    pub token: Histogram,
    /// From the request's arrival to its last token.
    pub duration: Histogram,
}

impl Default for Timings {
    fn default() -> Timings {
        Timings {
            ttft: Histogram::new(&TTFT_BOUNDS_S),
            token: Histogram::new(&TOKEN_BOUNDS_S),
            duration: Histogram::new(&DURATION_BOUNDS_S),
        }
    }
}

impl Timings {
    /// The Prometheus text of the three histograms.
    pub fn render(&self) -> String {
        let mut o = String::new();
        self.ttft.render(
            &mut o,
            "time_to_first_token_seconds",
            "From a completion request's arrival to its first token.",
        );
        self.token.render(
            &mut o,
            "time_per_output_token_seconds",
            "Between one generated token of a request and its next.",
        );
        self.duration.render(
            &mut o,
            "request_duration_seconds",
            "From a completion request's arrival to its last token.",
        );
        o
    }
}

/// The window tok/s is measured over.
const RATE_WINDOW: Duration = Duration::from_secs(10);

/// The serving figures at one moment.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub ready: bool,
    pub requests_finished: u64,
    pub requests_failed: u64,
    pub requests_rejected: u64,
    pub prompt_tokens: u64,
    /// Prompt tokens continued from a kept prefix (not prefilled).
    pub prompt_tokens_reused: u64,
    /// Prompt positions prefilled, and the seconds of the steps that
    /// prefilled them.
    pub prefill_tokens: u64,
    pub prefill_seconds: f64,
    pub generated_tokens: u64,
    pub tokens_per_second: f64,
    pub queue_depth: usize,
    pub busy_slots: usize,
    pub slots: usize,
    pub expert_hits: u64,
    pub expert_misses: u64,
    pub bytes_read: u64,
    /// Seconds the compute waited on expert reads, spent in the routed
    /// experts' matmuls, and in attention, summed over every step.
    pub expert_wait_seconds: f64,
    pub expert_matmul_seconds: f64,
    pub attention_seconds: f64,
    /// Positions of the prefixes restored from `--kv-dir` at start, and the
    /// seconds their loading took (before the server took requests).
    pub kv_restored_positions: u64,
    pub kv_restore_seconds: f64,
    /// The eviction policies the MoE layers' caches run now, with how many
    /// layers run each (`--policy auto` chooses per layer), and how often a
    /// layer changed its policy.
    pub policy_layers: std::collections::BTreeMap<&'static str, usize>,
    pub policy_switches: u64,
    /// Cumulative read counts per [`LATENCY_BOUNDS_US`] bound, the count
    /// and the sum (µs).
    pub latency_below: Vec<u64>,
    pub latency_count: u64,
    pub latency_sum_us: f64,
    /// The slots running a request (`/slots`).
    pub running: Vec<crate::engine::SlotState>,
}

/// Generated tokens over the last [`RATE_WINDOW`].
#[derive(Default)]
pub struct Rate {
    marks: VecDeque<(Instant, u64)>,
}

impl Rate {
    /// Records that the generated-token total is `total` now; returns
    /// tokens per second over the window.
    pub fn record(&mut self, total: u64) -> f64 {
        let now = Instant::now();
        self.marks.push_back((now, total));
        while self
            .marks
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > RATE_WINDOW)
        {
            self.marks.pop_front();
        }
        let (t0, n0) = self.marks[0];
        let secs = now.duration_since(t0).as_secs_f64();
        if secs > 0.0 {
            (total - n0) as f64 / secs
        } else {
            0.0
        }
    }
}

fn metric(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "# HELP moestream_{name} {help}");
    let _ = writeln!(out, "# TYPE moestream_{name} {kind}");
    let _ = writeln!(out, "moestream_{name} {value}");
}

impl Snapshot {
    /// The Prometheus text exposition of these figures.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let m = &mut o;
        metric(
            m,
            "ready",
            "gauge",
            "1 once the model is loaded.",
            self.ready as u8,
        );
        metric(
            m,
            "requests_finished_total",
            "counter",
            "Requests answered in full.",
            self.requests_finished,
        );
        metric(
            m,
            "requests_failed_total",
            "counter",
            "Requests that failed or were cancelled.",
            self.requests_failed,
        );
        metric(
            m,
            "requests_rejected_total",
            "counter",
            "Requests refused at admission (queue full, bad request).",
            self.requests_rejected,
        );
        metric(
            m,
            "prompt_tokens_total",
            "counter",
            "Prompt tokens of admitted requests.",
            self.prompt_tokens,
        );
        metric(
            m,
            "prompt_tokens_reused_total",
            "counter",
            "Prompt tokens continued from kept KV, not prefilled.",
            self.prompt_tokens_reused,
        );
        metric(
            m,
            "prefill_tokens_total",
            "counter",
            "Prompt positions prefilled.",
            self.prefill_tokens,
        );
        metric(
            m,
            "prefill_seconds_total",
            "counter",
            "Seconds of the engine steps that prefilled (rows decoded alongside included).",
            self.prefill_seconds,
        );
        metric(
            m,
            "generated_tokens_total",
            "counter",
            "Tokens generated.",
            self.generated_tokens,
        );
        metric(
            m,
            "tokens_per_second",
            "gauge",
            "Generated tokens per second over the last 10 s.",
            format!("{:.3}", self.tokens_per_second),
        );
        metric(
            m,
            "queue_depth",
            "gauge",
            "Requests waiting for a slot.",
            self.queue_depth,
        );
        metric(
            m,
            "busy_slots",
            "gauge",
            "Slots running a request.",
            self.busy_slots,
        );
        metric(m, "slots", "gauge", "Slots.", self.slots);
        metric(
            m,
            "expert_hits_total",
            "counter",
            "Expert lookups served from RAM.",
            self.expert_hits,
        );
        metric(
            m,
            "expert_misses_total",
            "counter",
            "Expert lookups read from disk.",
            self.expert_misses,
        );
        let lookups = self.expert_hits + self.expert_misses;
        let rate = if lookups > 0 {
            self.expert_hits as f64 / lookups as f64
        } else {
            0.0
        };
        metric(
            m,
            "expert_hit_rate",
            "gauge",
            "Expert hits over lookups since start.",
            format!("{rate:.4}"),
        );
        metric(
            m,
            "expert_bytes_read_total",
            "counter",
            "Expert bytes read from disk.",
            self.bytes_read,
        );
        self.render_split(m);
        self.render_policies(m);
        self.render_latency(m);
        o
    }

    /// Where the steps' time went, and the start's KV restore.
    fn render_split(&self, m: &mut String) {
        metric(
            m,
            "expert_wait_seconds_total",
            "counter",
            "Seconds the compute waited on expert reads.",
            format!("{:.6}", self.expert_wait_seconds),
        );
        metric(
            m,
            "expert_matmul_seconds_total",
            "counter",
            "Seconds in the routed experts' matmuls.",
            format!("{:.6}", self.expert_matmul_seconds),
        );
        metric(
            m,
            "attention_seconds_total",
            "counter",
            "Seconds in attention.",
            format!("{:.6}", self.attention_seconds),
        );
        metric(
            m,
            "kv_restored_positions",
            "gauge",
            "Positions of the prefixes restored from --kv-dir at start.",
            self.kv_restored_positions,
        );
        metric(
            m,
            "kv_restore_seconds",
            "gauge",
            "Seconds loading the --kv-dir prefixes took at start, before requests were taken.",
            format!("{:.6}", self.kv_restore_seconds),
        );
    }

    fn render_policies(&self, m: &mut String) {
        let name = "moestream_expert_policy_layers";
        let _ = writeln!(
            m,
            "# HELP {name} MoE layers whose cache evicts by each policy now."
        );
        let _ = writeln!(m, "# TYPE {name} gauge");
        for (policy, n) in &self.policy_layers {
            let _ = writeln!(m, "{name}{{policy=\"{policy}\"}} {n}");
        }
        metric(
            m,
            "expert_policy_switches_total",
            "counter",
            "Times a layer's cache changed its eviction policy (--policy auto).",
            self.policy_switches,
        );
    }

    fn render_latency(&self, m: &mut String) {
        let name = "moestream_expert_read_latency_seconds";
        let _ = writeln!(m, "# HELP {name} Latency of one expert read.");
        let _ = writeln!(m, "# TYPE {name} histogram");
        for (bound, n) in LATENCY_BOUNDS_US.iter().zip(&self.latency_below) {
            let le = *bound as f64 / 1e6;
            let _ = writeln!(m, "{name}_bucket{{le=\"{le}\"}} {n}");
        }
        let _ = writeln!(m, "{name}_bucket{{le=\"+Inf\"}} {}", self.latency_count);
        let _ = writeln!(m, "{name}_sum {}", self.latency_sum_us / 1e6);
        let _ = writeln!(m, "{name}_count {}", self.latency_count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_family_once_with_a_histogram() {
        let s = Snapshot {
            generated_tokens: 7,
            expert_hits: 3,
            expert_misses: 1,
            latency_below: vec![1; LATENCY_BOUNDS_US.len()],
            latency_count: 2,
            latency_sum_us: 3000.0,
            policy_layers: [("least-stale", 1), ("lfru", 2)].into_iter().collect(),
            policy_switches: 2,
            ..Snapshot::default()
        };
        let text = s.render();
        assert!(text.contains("moestream_expert_policy_layers{policy=\"lfru\"} 2\n"));
        assert!(text.contains("moestream_expert_policy_layers{policy=\"least-stale\"} 1\n"));
        assert!(text.contains("moestream_expert_policy_switches_total 2\n"));
        assert!(text.contains("moestream_generated_tokens_total 7\n"));
        assert!(text.contains("moestream_expert_hit_rate 0.7500\n"));
        assert!(text.contains("moestream_expert_read_latency_seconds_bucket{le=\"0.0001\"} 1\n"));
        assert!(text.contains("moestream_expert_read_latency_seconds_bucket{le=\"+Inf\"} 2\n"));
        assert!(text.contains("moestream_expert_read_latency_seconds_sum 0.003\n"));
        let types = text.lines().filter(|l| l.starts_with("# TYPE")).count();
        let helps = text.lines().filter(|l| l.starts_with("# HELP")).count();
        assert_eq!(types, helps);
    }

    #[test]
    fn request_histograms_are_cumulative_with_the_edges_inclusive() {
        let mut t = Timings::default();
        for s in [0.01, 0.02, 0.3, 1e9, f64::NAN] {
            t.ttft.observe(s);
        }
        let mut other = Timings::default();
        other.ttft.observe(0.05);
        t.ttft.merge(&other.ttft);
        let text = t.render();
        let bucket = |le: &str| {
            let key = format!("moestream_time_to_first_token_seconds_bucket{{le=\"{le}\"}} ");
            let line = text.lines().find(|l| l.starts_with(&key)).unwrap();
            line[key.len()..].parse::<u64>().unwrap()
        };
        // NaN counts as 0: at or below every bound.
        assert_eq!(bucket("0.01"), 2);
        assert_eq!(bucket("0.025"), 3);
        assert_eq!(bucket("0.05"), 4);
        assert_eq!(bucket("0.5"), 5);
        assert_eq!(bucket("60"), 5);
        assert_eq!(bucket("+Inf"), 6);
        assert!(text.contains("moestream_time_to_first_token_seconds_count 6\n"));
        assert!(text.contains("moestream_request_duration_seconds_count 0\n"));
        assert!(text.contains("# TYPE moestream_time_per_output_token_seconds histogram\n"));
        let types = text.lines().filter(|l| l.starts_with("# TYPE")).count();
        let helps = text.lines().filter(|l| l.starts_with("# HELP")).count();
        assert_eq!(types, helps);
    }
}
