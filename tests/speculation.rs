//! Speculative decoding is lossless: drafted tokens survive only where the
//! target would have chosen them, so greedy output equals plain greedy in
//! every family, and sampled output has the target's distribution
//! (chi-square homogeneity against plain sampling over many seeds).

mod common;

use common::fixture;
use moestream::engine::generate::{generate, GenOptions};
use moestream::engine::sampler::SamplingParams;
use moestream::engine::spec_gate::{WARMUP_SHADOWS, WARMUP_VERIFY_MIN, WARMUP_VERIFY_STEPS};
use moestream::engine::{DraftSource, Engine, Session, Speculation};
use moestream::model::profile::Profile;
use moestream::model::{LoadOptions, Model};
use std::collections::HashMap;

fn load(family: &str) -> Model {
    let opts = LoadOptions {
        expert_cache: 2,
        pin_history: false,
        ..LoadOptions::default()
    };
    Model::load(&fixture(family), &opts).unwrap()
}

fn opts(max_tokens: usize, sampling: SamplingParams, speculation: Speculation) -> GenOptions {
    GenOptions {
        max_tokens,
        sampling,
        ignore_eos: true,
        eos_ids: Vec::new(),
        speculation,
        constraint: None,
        logit_bias: Vec::new(),
    }
}

/// A prompt that repeats itself, so prompt lookup has drafts to offer.
const PROMPT: [u32; 12] = [3, 14, 15, 92, 65, 3, 14, 15, 92, 65, 3, 14];

#[test]
fn greedy_output_is_the_same_with_drafts_in_every_family() {
    let mut accepted = 0;
    for family in [
        "qwen3_moe",
        "qwen2_moe",
        "mixtral",
        "mixtral_sliding_window",
        "olmoe",
        "deepseek_v3",
        "glm4_moe",
        "glm_moe_dsa",
    ] {
        let model = load(family);
        let greedy = SamplingParams::default();
        let plain = generate(&model, &PROMPT, &opts(30, greedy, Speculation::Off), |_| {
            Ok(())
        })
        .unwrap();
        for draft in [1, 3, 6] {
            let spec = Speculation::Ngram { draft };
            let g = generate(&model, &PROMPT, &opts(30, greedy, spec), |_| Ok(())).unwrap();
            assert_eq!(g.token_ids, plain.token_ids, "{family}, draft {draft}");
            let s = g.stats.speculation.unwrap();
            assert!(s.steps > 0 && s.drafted > 0, "{family}: {s:?}");
            assert!(s.tokens < 30 + s.steps, "{family}: {s:?}");
            accepted += s.accepted;
        }
    }
    assert!(accepted > 0, "some draft was accepted somewhere");
}

/// Counts of the token at `position` over `seeds` sampled runs.
fn histogram(model: &Model, spec: Speculation, seeds: u64, position: usize) -> HashMap<u32, f64> {
    let mut h = HashMap::new();
    for seed in 0..seeds {
        let sampling = SamplingParams {
            temperature: 1.5,
            top_k: 3,
            seed: seed * 7919 + 17,
            ..SamplingParams::default()
        };
        let g = generate(model, &PROMPT, &opts(position + 1, sampling, spec), |_| {
            Ok(())
        })
        .unwrap();
        *h.entry(g.token_ids[position]).or_insert(0.0) += 1.0;
    }
    h
}

/// The 99.9th percentile of chi-square with `df` degrees of freedom
/// (1..=15).
fn chi2_999(df: usize) -> f64 {
    [
        10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88, 29.59, 31.26, 32.91, 34.53,
        36.12, 37.70,
    ][df - 1]
}

#[test]
fn sampled_output_has_the_target_distribution() {
    let model = load("qwen3_moe");
    let seeds = 400;
    let draft = Speculation::Ngram { draft: 3 };
    // Positions 1 and 2 can come from verify steps (position 0 is the
    // prefill's own token).
    for position in [1, 2] {
        let a = histogram(&model, Speculation::Off, seeds, position);
        let b = histogram(&model, draft, seeds, position);
        let mut cells: Vec<(f64, f64)> = Vec::new();
        let (mut rare_a, mut rare_b) = (0.0, 0.0);
        let mut tokens: Vec<u32> = a.keys().chain(b.keys()).copied().collect();
        tokens.sort();
        tokens.dedup();
        for t in tokens {
            let (x, y) = (
                a.get(&t).copied().unwrap_or(0.0),
                b.get(&t).copied().unwrap_or(0.0),
            );
            if x + y >= 10.0 {
                cells.push((x, y));
            } else {
                rare_a += x;
                rare_b += y;
            }
        }
        if rare_a + rare_b > 0.0 {
            cells.push((rare_a, rare_b));
        }
        assert!(cells.len() >= 2, "position {position}: one outcome only");
        let chi2: f64 = cells
            .iter()
            .map(|&(x, y)| {
                let e = (x + y) / 2.0;
                (x - e).powi(2) / e + (y - e).powi(2) / e
            })
            .sum();
        let df = (cells.len() - 1).min(15);
        assert!(
            chi2 < chi2_999(df),
            "position {position}: chi2 {chi2:.1} over {} cells {cells:?}",
            cells.len()
        );
    }
}

#[test]
fn mtp_drafts_are_lossless_and_match_the_reference_drafter() {
    use moestream::engine::{DraftSource, MtpDraft};
    use moestream::model::profile::Profile;
    for family in ["deepseek_v3", "glm4_moe", "glm_moe_dsa"] {
        let model = load(family);
        let greedy = SamplingParams::default();
        let plain = generate(&model, &PROMPT, &opts(20, greedy, Speculation::Off), |_| {
            Ok(())
        })
        .unwrap();
        for spec in [
            Speculation::Mtp { draft: 2 },
            Speculation::Auto { draft: 3 },
        ] {
            let g = generate(&model, &PROMPT, &opts(20, greedy, spec), |_| Ok(())).unwrap();
            assert_eq!(g.token_ids, plain.token_ids, "{family} {spec:?}");
            assert!(g.stats.speculation.unwrap().drafted > 0, "{family}");
        }
        // Incremental drafting after the prompt equals Model::draft, which
        // recomputes everything from the context.
        let mut prof = Profile::default();
        let mut kv = model.new_kv(PROMPT.len());
        let hidden = model.forward_hidden(&PROMPT, &mut kv, &mut prof).unwrap();
        let next = plain.token_ids[0];
        let mut after: Vec<u32> = PROMPT[1..].to_vec();
        after.push(next);
        let mut d = MtpDraft::new(&model, 64).unwrap();
        d.observe(&model, &hidden, &after, &mut prof).unwrap();
        let mut drafts = Vec::new();
        d.propose(&model, &[], 3, &mut drafts, &mut prof).unwrap();
        assert_eq!(drafts, model.draft(&PROMPT, next, 3).unwrap(), "{family}");
        mtp_head_waits_for_a_proposal(&model, family);
    }
    // A model without an MTP head: mtp is refused by name, auto drafts by
    // prompt lookup.
    let model = load("qwen3_moe");
    let greedy = SamplingParams::default();
    let err = generate(
        &model,
        &PROMPT,
        &opts(4, greedy, Speculation::Mtp { draft: 2 }),
        |_| Ok(()),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("no MTP layer"), "{err}");
    let g = generate(
        &model,
        &PROMPT,
        &opts(8, greedy, Speculation::Auto { draft: 2 }),
        |_| Ok(()),
    );
    let gate = g.unwrap().stats.speculation.unwrap().gate.unwrap();
    let ngram = &gate.drafters[..];
    assert_eq!(ngram.len(), 1);
    // Measured by its shadow guesses (which cost no verify step).
    assert!(ngram[0].name == "ngram" && ngram[0].shadows > 0, "{gate:?}");
}

#[test]
fn bench_verify_prints_one_row_per_draft_length() {
    let model = fixture("deepseek_v3");
    let out = common::moestream(&[
        "bench",
        "verify",
        "--model",
        model.to_str().unwrap(),
        "--expert-cache",
        "2",
        "--k",
        "1,3",
        "--pairs",
        "2",
    ]);
    assert!(out.ok, "{}", out.stderr);
    let rows: Vec<&str> = out.stdout.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{}", out.stdout);
    assert!(rows[0].starts_with("1 ") && rows[1].starts_with("3 "));
    // A verify step of 3 drafts computes 4 positions: at least the bytes
    // of a plain step.
    let mb_ratio: f64 = rows[1].split_whitespace().last().unwrap().parse().unwrap();
    assert!(mb_ratio >= 1.0, "{}", out.stdout);
}

/// Drafts a token the target will not choose: the one after the plain
/// greedy output's token at that position (so the gate sees acceptance 0).
struct WrongDraft {
    want: Vec<u32>,
    prompt_len: usize,
    vocab: u32,
}

impl DraftSource for WrongDraft {
    fn propose(
        &mut self,
        _model: &Model,
        history: &[u32],
        k: usize,
        out: &mut Vec<u32>,
        _prof: &mut Profile,
    ) -> moestream::error::Result<()> {
        if let Some(&t) = self.want.get(history.len() - self.prompt_len) {
            out.extend(std::iter::repeat_n((t + 1) % self.vocab, k));
        }
        Ok(())
    }
}

/// Positions observed one at a time are held back, not run through the
/// MTP head, until a draft is asked for; the drafts then equal
/// `Model::draft`'s over the same context.
fn mtp_head_waits_for_a_proposal(model: &Model, family: &str) {
    use moestream::engine::MtpDraft;
    let mut prof = Profile::default();
    let mut kv = model.new_kv(PROMPT.len());
    let hidden = model.forward_hidden(&PROMPT, &mut kv, &mut prof).unwrap();
    let h = model.cfg.hidden_size;
    let mut d = MtpDraft::new(model, 64).unwrap();
    for j in 0..PROMPT.len() - 1 {
        d.observe(
            model,
            &hidden[j * h..(j + 1) * h],
            &PROMPT[j + 1..j + 2],
            &mut prof,
        )
        .unwrap();
        assert_eq!(d.pending(), j + 1, "{family}");
    }
    let mut drafts = Vec::new();
    d.propose(model, &[], 2, &mut drafts, &mut prof).unwrap();
    assert_eq!(d.pending(), 0, "{family}");
    let context = &PROMPT[..PROMPT.len() - 1];
    let want = model.draft(context, PROMPT[PROMPT.len() - 1], 2).unwrap();
    assert_eq!(drafts, want, "{family}");
}

#[test]
fn auto_on_the_trained_models_gives_the_plain_tokens_and_measures_every_drafter() {
    // deepseek_v3 has an MTP head: auto measures it and prompt lookup,
    // and drafts with whichever pays; qwen3_moe drafts by prompt lookup.
    for (family, names) in [
        ("trained/deepseek_v3", &["mtp", "ngram"][..]),
        ("trained/qwen3_moe", &["ngram"][..]),
    ] {
        let model = load(family);
        let greedy = SamplingParams::default();
        let off = opts(64, greedy, Speculation::Off);
        let plain = generate(&model, &PROMPT, &off, |_| Ok(())).unwrap();
        let auto = opts(64, greedy, Speculation::Auto { draft: 4 });
        let g = generate(&model, &PROMPT, &auto, |_| Ok(())).unwrap();
        assert_eq!(g.token_ids, plain.token_ids, "{family}");
        let sp = g.stats.speculation.clone().unwrap();
        let gate = sp.gate.as_ref().expect("gate figures");
        let got: Vec<&str> = gate.drafters.iter().map(|d| d.name).collect();
        assert_eq!(got, names, "{family}");
        for d in &gate.drafters {
            // The MTP head by verify steps (3 when it clearly loses), prompt
            // lookup by shadow guesses.
            match d.name {
                "mtp" => assert!(d.asked >= u64::from(WARMUP_VERIFY_MIN), "{family}: {d:?}"),
                _ => assert!(d.shadows >= u64::from(WARMUP_SHADOWS), "{family}: {d:?}"),
            }
        }
        eprintln!("{family}: {}", sp.line());
    }
}

#[test]
fn the_gate_stops_a_drafter_that_is_never_accepted() {
    let model = load("qwen3_moe");
    let greedy = SamplingParams::default();
    let o = opts(120, greedy, Speculation::Off);
    let plain = generate(&model, &PROMPT, &o, |_| Ok(())).unwrap().token_ids;
    let engine = Engine::new(&model);
    let mut s = Session::new(&model, &PROMPT, &o).unwrap();
    let vocab = model.cfg.vocab_size as u32;
    let draft = WrongDraft {
        want: plain.clone(),
        prompt_len: PROMPT.len(),
        vocab,
    };
    s.set_drafter(Box::new(draft), 4);
    s.gate_drafting();
    let mut prof = Profile::default();
    while !s.is_done() {
        engine.step(&mut [&mut s], &mut prof).unwrap();
    }
    assert_eq!(s.tokens(), plain);
    let st = s.spec_stats();
    let g = st.gate.as_ref().expect("gate figures");
    assert_eq!(st.accepted, 0);
    // Off once the warm-up's verify steps are measured (3 of them when
    // the gain is already below WARMUP_GIVE_UP, else 8), never back on;
    // after that only the probes draft, at a growing interval (8, then
    // 16 or the measured loss's floor, ...: 2-4 in 120 tokens).
    assert_eq!((g.turned_off, g.turned_on), (1, 0), "{g:?}");
    assert!((2..=4).contains(&g.probes), "{g:?}");
    let warmup = st.steps - g.probes;
    assert!(
        warmup == u64::from(WARMUP_VERIFY_MIN) || warmup == u64::from(WARMUP_VERIFY_STEPS),
        "{st:?}"
    );
    assert_eq!(g.tokens_per_verify, Some(1.0));
    assert!(g.off_steps > 90, "{g:?}");
}

#[test]
fn auto_behind_the_gate_gives_the_plain_tokens() {
    // qwen3_moe drafts by prompt lookup, deepseek_v3 with its MTP head;
    // on random weights neither pays, and the gate turns them off.
    for family in ["qwen3_moe", "deepseek_v3"] {
        let model = load(family);
        let greedy = SamplingParams::default();
        let plain = generate(
            &model,
            &PROMPT,
            &opts(100, greedy, Speculation::Off),
            |_| Ok(()),
        )
        .unwrap();
        let auto = Speculation::Auto { draft: 3 };
        let g = generate(&model, &PROMPT, &opts(100, greedy, auto), |_| Ok(())).unwrap();
        assert_eq!(g.token_ids, plain.token_ids, "{family}");
        let sp = g.stats.speculation.clone().unwrap();
        let gate = sp.gate.as_ref().expect("gate figures");
        assert!(gate.on_steps + gate.off_steps > 0, "{family}: {sp:?}");
        assert!(g.stats.line().contains("gate: drafting on"), "{family}");
        eprintln!("{family}: {}", sp.line());
    }
}
