//! `moestream bench verify`: what one speculative verify step of k drafted
//! positions costs against one plain decode step, in seconds and expert
//! bytes read. One session decodes; its steps alternate between a plain
//! step and a verify step of k drafts (random ids, so nearly all are
//! rejected: the cost of checking, not the gain), for each k in turn;
//! medians per kind.

use super::*;
use moestream::engine::sampler::Rng;
use moestream::engine::{DraftSource, Engine, Session};
use moestream::model::profile::Profile;
use std::time::Instant;

#[derive(Args)]
pub(super) struct VerifyArgs {
    #[command(flatten)]
    pub(super) model: ModelArgs,
    /// Draft lengths to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    k: Vec<usize>,
    /// Pairs of (plain, verify) steps per draft length.
    #[arg(long, default_value_t = 6)]
    pairs: usize,
    /// Prompt text.
    #[arg(
        long,
        default_value = "The engine reads the expert from the disk while the cores compute"
    )]
    prompt: String,
    /// Drop the model files from the page cache first.
    #[arg(long)]
    cold: bool,
}

/// Proposes `k` random ids (a cost probe, not a guess).
struct RandomDraft {
    rng: Rng,
    vocab: u32,
}

impl DraftSource for RandomDraft {
    fn propose(
        &mut self,
        _model: &Model,
        _history: &[u32],
        k: usize,
        out: &mut Vec<u32>,
        _prof: &mut Profile,
    ) -> moestream::error::Result<()> {
        out.extend((0..k).map(|_| (self.rng.next_u64() % self.vocab as u64) as u32));
        Ok(())
    }
}

pub(super) fn cmd_bench_verify(mut a: VerifyArgs) -> Result<()> {
    anyhow::ensure!(
        a.k.iter().all(|&k| (1..=16).contains(&k)),
        "--k: draft lengths in 1..=16"
    );
    super::limits::count("--pairs", a.pairs, 1..=super::limits::REPEATS_MAX)?;
    a.model.no_history = true;
    if a.cold {
        drop_page_cache(&a.model.model)?;
    }
    let model = load(&a.model)?;
    let prompt = Tokenizer::load(&a.model.model)?.encode(&a.prompt)?;
    // Room for every step: plain steps make one token, verify steps one
    // (their drafts are rejected) or a few.
    let steps: usize = a.k.iter().map(|k| a.pairs * (2 + k)).sum();
    let opts = GenOptions {
        max_tokens: steps + 2,
        ignore_eos: true,
        ..GenOptions::default()
    };
    let engine = Engine::new(&model);
    let mut session = Session::new(&model, &prompt, &opts).map_err(with_flags)?;
    let mut prof = Profile::default();
    while session.tokens().is_empty() {
        engine.step(&mut [&mut session], &mut prof)?;
    }
    println!("k  plain s/step  verify s/step  ratio  plain MB/step  verify MB/step  MB ratio");
    for &k in &a.k {
        let (mut plain, mut verify) = (Vec::new(), Vec::new());
        for pair in 0..a.pairs {
            session.stop_speculating();
            plain.push(timed_step(&engine, &mut session, &mut prof)?);
            let rng = Rng::new((k * 1000 + pair) as u64);
            let vocab = model.cfg.vocab_size as u32;
            session.set_drafter(Box::new(RandomDraft { rng, vocab }), k);
            verify.push(timed_step(&engine, &mut session, &mut prof)?);
        }
        let (ps, pb) = medians(&plain);
        let (vs, vb) = medians(&verify);
        println!(
            "{k:<2} {ps:>13.3} {vs:>14.3} {:>6.2} {:>14.1} {:>15.1} {:>9.2}",
            vs / ps.max(1e-9),
            pb / 1e6,
            vb / 1e6,
            vb / pb.max(1.0)
        );
    }
    Ok(())
}

/// One step's seconds and expert bytes read.
fn timed_step(engine: &Engine, session: &mut Session, prof: &mut Profile) -> Result<(f64, f64)> {
    let before = engine.model().store.counters().bytes_read;
    let t = Instant::now();
    engine.step(&mut [&mut *session], prof)?;
    let bytes = engine.model().store.counters().bytes_read - before;
    Ok((t.elapsed().as_secs_f64(), bytes as f64))
}

fn medians(v: &[(f64, f64)]) -> (f64, f64) {
    let median = |mut x: Vec<f64>| {
        x.sort_by(f64::total_cmp);
        x[x.len() / 2]
    };
    (
        median(v.iter().map(|p| p.0).collect()),
        median(v.iter().map(|p| p.1).collect()),
    )
}
