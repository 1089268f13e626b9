//! Generation and teacher-forced evaluation over a loaded [`Model`]:
//! prefill the prompt in one batched forward, then decode one token per
//! forward until EOS or the token limit, and the statistics of the run.

use crate::engine::sampler::argmax;
use crate::engine::{Engine, Session};
use crate::error::{Error, Result};
use crate::model::profile::{device_read_bytes, peak_rss_bytes, Profile};
use crate::model::progress::Work;
use crate::model::{Model, PREFILL_CHUNK};
use serde::Serialize;
use std::time::Instant;

pub use crate::engine::GenOptions;

/// Figures of one run; the stats line and `--json` `stats` print these.
#[derive(Clone, Debug, Serialize)]
pub struct RunStats {
    pub prompt_tokens: usize,
    pub tokens: usize,
    pub seconds: f64,
    pub prefill_seconds: f64,
    pub tok_per_s: f64,
    pub expert_hit_rate: f64,
    /// Hits served by pinned (hot-tier) experts, of all lookups.
    pub expert_pinned_hit_rate: f64,
    /// Hits served by the on-demand (warm-tier) cache, of all lookups.
    pub expert_warm_hit_rate: f64,
    /// Pinned and warm hits together.
    pub expert_hits: u64,
    pub expert_misses: u64,
    pub expert_bytes_read: u64,
    /// Bytes this process caused to be read from the block device
    /// (/proc/self/io `read_bytes`; page-cache hits and read-ahead waste
    /// show up as the gap to `expert_bytes_read`). 0 where unavailable.
    pub device_bytes_read: u64,
    pub peak_rss_bytes: u64,
    /// Mean and 99th-percentile latency of one expert read, µs (over the
    /// process so far).
    pub read_latency_mean_us: f64,
    pub read_latency_p99_us: u64,
    /// Time compute was blocked waiting for expert reads.
    pub expert_disk_s: f64,
    pub expert_matmul_s: f64,
    pub attention_s: f64,
    pub other_s: f64,
    /// Time the read path had reads in flight.
    pub disk_busy_s: f64,
    /// Expert bytes read / disk busy time, GB/s.
    pub disk_gb_per_s: f64,
    /// Expert bytes read per generated token.
    pub bytes_read_per_token: f64,
    /// Share of the run when reads and compute ran at once:
    /// (disk busy − compute's wait on reads) / run time.
    pub overlap: f64,
    /// Lookahead prefetch: reads issued, experts then asked for (of which
    /// `late` were still in flight), and bytes read for nothing.
    pub prefetch_issued: u64,
    pub prefetch_used: u64,
    pub prefetch_late: u64,
    pub prefetch_wasted_bytes: u64,
    /// Early reads of a layer-major pass (issued before a layer's
    /// routing, while its attention ran): issued, then asked for by the
    /// routing, and unneeded (cancelled or dropped), with their bytes.
    pub early_issued: u64,
    pub early_used: u64,
    pub early_unneeded: u64,
    pub early_unneeded_bytes: u64,
    /// The most experts one layer's fetch held read and not yet applied
    /// (over the process so far).
    pub read_window_peak: u64,
    /// Share of chosen experts the lookahead guessed, predicting layer L+1
    /// from layer L's post-attention residual (`attn`) or its output
    /// (`output`); single-token forwards only; `None` without any.
    pub recall_attn: Option<f64>,
    pub recall_output: Option<f64>,
    /// The same for the learned predictor's guesses (`--prefetch
    /// learned:FILE`; `None` without one).
    pub recall_learned: Option<f64>,
    /// The same per layer (cumulative over the process), `[attn, output]`.
    pub recall_per_layer: Vec<[Option<f64>; 2]>,
    /// The decode phase alone (after the prefill, the first token's
    /// forward excluded): its steps, seconds, expert bytes read, read-path
    /// busy time and compute's wait on reads.
    pub decode_steps: usize,
    pub decode_s: f64,
    pub decode_bytes_read: u64,
    pub decode_disk_busy_s: f64,
    pub decode_disk_wait_s: f64,
    /// Cache-aware routing: chosen experts that exact routing would not
    /// have chosen, and all it chose (both 0 when it is off).
    pub leaned_moved: u64,
    pub leaned_chosen: u64,
    /// The eviction policy asked for (`--policy`), the policies the MoE
    /// layers' caches ran at the end with how many layers ran each (for
    /// `auto`, each layer's choice), and how often a layer's cache changed
    /// its policy during the run.
    pub policy: &'static str,
    pub policy_layers: std::collections::BTreeMap<&'static str, usize>,
    pub policy_switches: u64,
    /// Speculative decoding's drafts and acceptance (`None` when off).
    pub speculation: Option<crate::engine::SpecStats>,
}

impl RunStats {
    /// The summary every run ends with: one line, and a second with the
    /// speculation figures when drafting was on.
    pub fn line(&self) -> String {
        let mut main = self.main_line();
        if let Some(r) = self.recall_learned {
            main.push_str(&format!(" learned {:.1}%", 100.0 * r));
        }
        if self.policy_layers.len() > 1 || self.policy_layers.keys().any(|&p| p != self.policy) {
            let chose: Vec<String> = self
                .policy_layers
                .iter()
                .map(|(p, n)| format!("{p} {n}"))
                .collect();
            main.push_str(&format!(
                " | policy {} ran {} (layers), {} switches",
                self.policy,
                chose.join(", "),
                self.policy_switches
            ));
        }
        if self.early_issued > 0 {
            main.push_str(&format!(
                " | early reads {} used of {} ({} unneeded)",
                self.early_used, self.early_issued, self.early_unneeded
            ));
        }
        if self.leaned_chosen > 0 {
            main.push_str(&format!(
                " | cache-aware routing moved {} of {} choices ({:.1}%)",
                self.leaned_moved,
                self.leaned_chosen,
                100.0 * self.leaned_moved as f64 / self.leaned_chosen as f64
            ));
        }
        match &self.speculation {
            Some(sp) => format!("{main}\n{}", sp.line()),
            None => main,
        }
    }

    fn main_line(&self) -> String {
        format!(
            "[stats] {} tokens in {:.2} s ({:.2} tok/s) | prompt {} tok, prefill {:.2} s | expert hit rate {:.1}% (pinned {:.1}%) | read {:.1} MiB, device {:.1} MiB, {:.1} MB/token, {:.2} GB/s | peak RSS {:.1} MiB | disk {:.2} s, expert-matmul {:.2} s, attention {:.2} s, other {:.2} s | overlap {:.0}% | prefetch {} used of {} ({} late), {:.1} MiB wasted, recall attn {} output {}",
            self.tokens,
            self.seconds,
            self.tok_per_s,
            self.prompt_tokens,
            self.prefill_seconds,
            self.expert_hit_rate * 100.0,
            self.expert_pinned_hit_rate * 100.0,
            self.expert_bytes_read as f64 / (1 << 20) as f64,
            self.device_bytes_read as f64 / (1 << 20) as f64,
            self.bytes_read_per_token / 1e6,
            self.disk_gb_per_s,
            self.peak_rss_bytes as f64 / (1 << 20) as f64,
            self.expert_disk_s,
            self.expert_matmul_s,
            self.attention_s,
            self.other_s,
            self.overlap * 100.0,
            self.prefetch_used,
            self.prefetch_issued,
            self.prefetch_late,
            self.prefetch_wasted_bytes as f64 / (1 << 20) as f64,
            percent(self.recall_attn),
            percent(self.recall_output),
        )
    }
}

impl crate::engine::SpecStats {
    /// The speculation part of the stats line.
    pub fn line(&self) -> String {
        let rate = |a: u64, d: u64| {
            if d > 0 {
                100.0 * a as f64 / d as f64
            } else {
                0.0
            }
        };
        let per: Vec<String> = (self.drafted_at.iter().zip(&self.accepted_at))
            .map(|(d, a)| format!("{:.0}%", rate(*a, *d)))
            .collect();
        let line = format!(
            "[speculation] drafted {}, accepted {} ({:.0}%; by position {}), {:.2} tokens per verify step over {} steps",
            self.drafted,
            self.accepted,
            rate(self.accepted, self.drafted),
            per.join(" "),
            self.tokens as f64 / self.steps.max(1) as f64,
            self.steps,
        );
        match &self.gate {
            Some(g) => format!("{line} | {}", g.line()),
            None => line,
        }
    }
}

impl crate::engine::spec_gate::GateStats {
    /// The gate's part of the speculation line.
    pub fn line(&self) -> String {
        let fig = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.2}"));
        let per: Vec<String> = self
            .drafters
            .iter()
            .map(|d| {
                format!(
                    "{} gain {}x (verify {}x a plain step's time, {}x its expert bytes; asked {}, shadow guesses {})",
                    d.name,
                    fig(d.gain),
                    fig(d.time_ratio),
                    fig(d.bytes_ratio),
                    d.asked,
                    d.shadows
                )
            })
            .collect();
        format!(
            "gate: drafting on {} steps, off {} ({} probes; turned off {}, on {}, switched {}), drafting with {}; {}",
            self.on_steps,
            self.off_steps,
            self.probes,
            self.turned_off,
            self.turned_on,
            self.switched,
            self.drafter.unwrap_or("none"),
            per.join(", "),
        )
    }
}

fn percent(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{:.0}%", v * 100.0))
}

/// The result of [`generate`].
#[derive(Clone, Debug)]
pub struct Generation {
    pub prompt_ids: Vec<u32>,
    pub token_ids: Vec<u32>,
    pub stats: RunStats,
}

/// Generates from `prompt`, calling `on_token` with each new id as it is chosen.
pub fn generate(
    model: &Model,
    prompt: &[u32],
    opts: &GenOptions,
    mut on_token: impl FnMut(u32) -> Result<()>,
) -> Result<Generation> {
    let mut session = Session::new(model, prompt, opts)?;
    let engine = Engine::new(model);
    let mut probe = Probe::start(model);
    // A prompt of more than one chunk reports its prefill, chunk by chunk.
    let long = prompt.len() > PREFILL_CHUNK;
    while !session.is_done() {
        let prefill = session.in_prefill();
        let produced = engine.step(&mut [&mut session], &mut probe.prof)?[0];
        if prefill && long {
            let done = session.prefilled();
            model
                .progress
                .report(Work::Prefill, done as u64, prompt.len() as u64);
        }
        if produced == 0 {
            continue;
        }
        if prefill {
            probe.prefill_done(model);
        }
        let n = session.tokens().len();
        for i in n - produced..n {
            on_token(session.tokens()[i])?;
        }
    }
    let out = session.tokens().to_vec();
    let mut stats = probe.finish(model, prompt.len(), out.len());
    stats.speculation = (opts.speculation != Default::default()).then(|| session.spec_stats());
    Ok(Generation {
        prompt_ids: prompt.to_vec(),
        token_ids: out,
        stats,
    })
}

/// What a run's stats are measured from: the clock, the store's counters
/// and the device's read bytes at the start and when the prompt was in,
/// and the time split of the forwards. [`Probe::finish`] turns them into
/// [`RunStats`], so the generation loop carries no arithmetic.
struct Probe {
    start: Instant,
    before: crate::store::StoreCounters,
    recall_before: [(u64, u64); 2],
    learned_before: (u64, u64),
    device_before: u64,
    prefill_seconds: f64,
    at_decode: crate::store::StoreCounters,
    prof: Profile,
}

impl Probe {
    fn start(model: &Model) -> Probe {
        let before = model.store.counters();
        Probe {
            start: Instant::now(),
            before,
            recall_before: model.store.recall_totals(),
            learned_before: model.store.learned_recall(),
            device_before: device_read_bytes(),
            prefill_seconds: 0.0,
            at_decode: before,
            prof: Profile::default(),
        }
    }

    /// The prompt is in (the first token was just sampled).
    fn prefill_done(&mut self, model: &Model) {
        self.prefill_seconds = self.start.elapsed().as_secs_f64();
        self.at_decode = model.store.counters();
    }

    /// The stats of a run that fed `prompt_tokens` and produced `tokens`.
    fn finish(self, model: &Model, prompt_tokens: usize, tokens: usize) -> RunStats {
        let Probe {
            start,
            before,
            recall_before,
            learned_before,
            device_before,
            prefill_seconds,
            at_decode,
            prof,
        } = self;
        let seconds = start.elapsed().as_secs_f64();
        let after = model.store.counters();
        let pinned = after.pinned_hits - before.pinned_hits;
        let warm = after.hits - before.hits;
        let hits = pinned + warm;
        let misses = after.misses - before.misses;
        let rate = |x: u64| {
            if hits + misses > 0 {
                x as f64 / (hits + misses) as f64
            } else {
                0.0
            }
        };
        let disk = (after.disk_time - before.disk_time).as_secs_f64();
        let busy = (after.disk_busy - before.disk_busy).as_secs_f64();
        let bytes_read = after.bytes_read - before.bytes_read;
        let recall_after = model.store.recall_totals();
        let recall = |v: usize| {
            let hit = recall_after[v].0 - recall_before[v].0;
            let all = recall_after[v].1 - recall_before[v].1;
            (all > 0).then(|| hit as f64 / all as f64)
        };
        let matmul = prof.expert_matmul.as_secs_f64();
        let attention = prof.attention.as_secs_f64();
        let (latency_mean, latency_p99) = model.store.read_latency_us();
        RunStats {
            prompt_tokens,
            tokens,
            seconds,
            prefill_seconds,
            tok_per_s: if seconds > 0.0 {
                tokens as f64 / seconds
            } else {
                0.0
            },
            expert_hit_rate: rate(hits),
            expert_pinned_hit_rate: rate(pinned),
            expert_warm_hit_rate: rate(warm),
            expert_hits: hits,
            expert_misses: misses,
            expert_bytes_read: bytes_read,
            device_bytes_read: device_read_bytes().saturating_sub(device_before),
            peak_rss_bytes: peak_rss_bytes(),
            read_latency_mean_us: latency_mean,
            read_latency_p99_us: latency_p99,
            expert_disk_s: disk,
            expert_matmul_s: matmul,
            attention_s: attention,
            other_s: (seconds - disk - matmul - attention).max(0.0),
            disk_busy_s: busy,
            disk_gb_per_s: if busy > 0.0 {
                bytes_read as f64 / busy / 1e9
            } else {
                0.0
            },
            bytes_read_per_token: bytes_read as f64 / tokens.max(1) as f64,
            overlap: if seconds > 0.0 {
                ((busy - disk) / seconds).clamp(0.0, 1.0)
            } else {
                0.0
            },
            prefetch_issued: after.prefetch_issued - before.prefetch_issued,
            prefetch_used: after.prefetch_used - before.prefetch_used,
            prefetch_late: after.prefetch_late - before.prefetch_late,
            prefetch_wasted_bytes: after
                .prefetch_wasted_bytes
                .saturating_sub(before.prefetch_wasted_bytes),
            early_issued: after.early_issued - before.early_issued,
            early_used: after.early_used - before.early_used,
            early_unneeded: after.early_unneeded - before.early_unneeded,
            early_unneeded_bytes: after.early_unneeded_bytes - before.early_unneeded_bytes,
            read_window_peak: after.read_window_peak,
            recall_learned: {
                let (hit, all) = model.store.learned_recall();
                let (hit, all) = (hit - learned_before.0, all - learned_before.1);
                (all > 0).then(|| hit as f64 / all as f64)
            },
            recall_attn: recall(0),
            recall_output: recall(1),
            recall_per_layer: model.store.recall(),
            decode_steps: tokens.saturating_sub(1),
            decode_s: seconds - prefill_seconds,
            decode_bytes_read: after.bytes_read - at_decode.bytes_read,
            decode_disk_busy_s: (after.disk_busy - at_decode.disk_busy).as_secs_f64(),
            decode_disk_wait_s: (after.disk_time - at_decode.disk_time).as_secs_f64(),
            leaned_moved: after.leaned_moved - before.leaned_moved,
            leaned_chosen: after.leaned_chosen - before.leaned_chosen,
            policy: model.store.policy().name(),
            policy_layers: model.store.active_policies(),
            policy_switches: after.policy_switches - before.policy_switches,
            speculation: None,
        }
    }
}

/// Teacher-forced evaluation of a sequence.
#[derive(Clone, Debug, Serialize)]
pub struct Evaluation {
    /// Argmax of the logits at every position.
    pub argmax: Vec<u32>,
    /// -log p(ids[i+1] | ids[..=i]) for i in 0..len-1.
    pub nll: Vec<f64>,
    /// Full logits of the last position.
    pub last_logits: Vec<f32>,
    /// Logits of every position, `(ids, vocab)` row-major.
    #[serde(skip)]
    pub logits: Vec<f32>,
}

/// Runs `ids` through the model as a prefill does (layer-major passes of
/// [`Model::prefill_pass`] positions; the logits of chunked prefill, bit
/// for bit) and scores every position.
pub fn evaluate(model: &Model, ids: &[u32]) -> Result<Evaluation> {
    evaluate_by(model, ids, |kv, prof| model.prefill(ids, kv, true, prof))
}

/// [`evaluate`] with `chunk` positions per forward (1: as decoding sees
/// them, one token at a time). The logits do not depend on `chunk` under
/// exact routing; the expert reads, and cache-aware routing, do.
pub fn evaluate_in_chunks(model: &Model, ids: &[u32], chunk: usize) -> Result<Evaluation> {
    if chunk == 0 {
        return Err(Error::Setting {
            name: "chunk",
            reason: "positions per forward must be at least 1".into(),
        });
    }
    evaluate_by(model, ids, |kv, prof| {
        model.forward_chunked(ids, kv, true, prof, chunk)
    })
}

/// Scores `ids` by the logits `forward` gives for every position.
fn evaluate_by(
    model: &Model,
    ids: &[u32],
    forward: impl FnOnce(&mut crate::model::kv::KvCache, &mut Profile) -> Result<Vec<f32>>,
) -> Result<Evaluation> {
    if ids.is_empty() {
        return Err(Error::Request("no token ids to evaluate".into()));
    }
    let context_max = model.cfg.rope.max_position_embeddings;
    if ids.len() > context_max {
        return Err(Error::Request(format!(
            "{} token ids to evaluate; the model's context is {context_max} (max_position_embeddings)",
            ids.len()
        )));
    }
    let mut kv = model.new_kv(ids.len());
    let mut prof = Profile::default();
    let logits = forward(&mut kv, &mut prof)?;
    let v = model.cfg.vocab_size;
    let rows: Vec<&[f32]> = logits.chunks_exact(v).collect();
    let argmax = rows.iter().map(|r| argmax(r)).collect();
    let nll = (0..ids.len() - 1)
        .map(|i| nll_of(rows[i], ids[i + 1]))
        .collect();
    Ok(Evaluation {
        argmax,
        nll,
        last_logits: rows[rows.len() - 1].to_vec(),
        logits,
    })
}

/// Perplexity of a text: every token after the first scored once, with
/// the context of a sliding window.
#[derive(Clone, Debug, Serialize)]
pub struct Perplexity {
    pub perplexity: f64,
    /// Mean negative log-likelihood per scored token (nats).
    pub nll_mean: f64,
    pub tokens: usize,
    /// Tokens scored: all but the first.
    pub scored: usize,
    pub window: usize,
    pub stride: usize,
    pub windows: usize,
}

/// Perplexity of `ids` with windows of `window` positions starting every
/// `stride` positions (as transformers' guide computes it): each window is
/// one teacher-forced forward, and scores only the targets no earlier
/// window scored, so every token after the first counts once, with at
/// least `window - stride` tokens of context once the first window is
/// past. `window` is capped at the model's context; `0 < stride < window`
/// (a stride of a whole window would leave each window's first token
/// without context to be scored from).
pub fn perplexity(model: &Model, ids: &[u32], window: usize, stride: usize) -> Result<Perplexity> {
    let window = window.min(model.cfg.rope.max_position_embeddings);
    if ids.len() < 2 {
        return Err(Error::Request(format!(
            "perplexity needs at least 2 tokens, the text has {}",
            ids.len()
        )));
    }
    if window < 2 || stride == 0 || stride >= window {
        return Err(Error::Request(format!(
            "window {window} and stride {stride}: need a window of at least 2 and 0 < stride < window"
        )));
    }
    let (mut total, mut scored, mut windows, mut done) = (0.0f64, 0usize, 0usize, 0usize);
    let mut begin = 0;
    while done < ids.len() - 1 {
        let end = (begin + window).min(ids.len());
        let e = evaluate(model, &ids[begin..end])?;
        // e.nll[i] scores target begin + i + 1; keep the targets past `done`.
        for t in (done + 1).max(begin + 1)..end {
            total += e.nll[t - begin - 1];
            scored += 1;
        }
        done = end - 1;
        windows += 1;
        begin += stride;
    }
    let nll_mean = total / scored as f64;
    Ok(Perplexity {
        perplexity: nll_mean.exp(),
        nll_mean,
        tokens: ids.len(),
        scored,
        window,
        stride,
        windows,
    })
}

/// The log-likelihood of `continuation` after `context` (both token ids):
/// the sum of log p(continuation\[j\] | context, continuation\[..j\]), from
/// one teacher-forced forward (lm-evaluation-harness's `loglikelihood`).
/// The context must not be empty.
pub fn continuation_loglik(model: &Model, context: &[u32], continuation: &[u32]) -> Result<f64> {
    if context.is_empty() || continuation.is_empty() {
        return Err(Error::Request(
            "a scored choice needs a non-empty context and continuation".into(),
        ));
    }
    let ids: Vec<u32> = context.iter().chain(continuation).copied().collect();
    let e = evaluate(model, &ids)?;
    // e.nll[i] scores ids[i + 1]: the continuation's targets are
    // context.len()..ids.len().
    Ok(-e.nll[context.len() - 1..].iter().sum::<f64>())
}

/// -log_softmax(logits)\[target\], in f64.
pub fn nll_of(logits: &[f32], target: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = logits
        .iter()
        .map(|l| (*l as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    lse - logits[target as usize] as f64
}
