//! Layer-major prefill: a prompt longer than one chunk runs in passes of
//! `Model::prefill_pass` positions, each layer over the whole pass before
//! the next (attention and the MLPs a sub-chunk at a time, the routed
//! experts streamed one after another). It gives chunked prefill's bits
//! (greedy tokens, logits, the teacher-forced eval, the KV cache) in every
//! family, reads each routed expert at most once per layer per pass, and
//! never runs a longer pass than the RAM plan set aside activations for.

mod common;

use common::{long_fixture, spread_ids as prompt, FAMILIES};
use moestream::engine::generate::{evaluate, evaluate_in_chunks, generate, GenOptions};
use moestream::engine::sampler::SamplingParams;
use moestream::engine::{Engine, Session};
use moestream::model::mla::{DsaMode, MlaMode};
use moestream::model::profile::Profile;
use moestream::model::progress::{Progress, Work};
use moestream::model::{LoadOptions, Model, PREFILL_CHUNK};
use moestream::store::EarlyReads;
use std::path::Path;
use std::sync::{Arc, Mutex};

fn greedy(max_tokens: usize) -> GenOptions {
    GenOptions {
        max_tokens,
        sampling: SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        ignore_eos: true,
        eos_ids: Vec::new(),
        speculation: Default::default(),
        constraint: None,
        logit_bias: Vec::new(),
    }
}

fn load(dir: &Path, opts: LoadOptions) -> Model {
    Model::load(
        dir,
        &LoadOptions {
            pin_history: false,
            ..opts
        },
    )
    .unwrap()
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Today's chunked prefill and the layer-major one agree bit for bit.
fn assert_layer_major_is_chunked(model: &mut Model, ids: &[u32], what: &str) {
    assert!(
        model.prefill_pass.positions >= ids.len(),
        "{what}: one pass"
    );
    let chunked = evaluate_in_chunks(model, ids, PREFILL_CHUNK).unwrap();
    let layered = evaluate(model, ids).unwrap();
    assert!(
        same_bits(&chunked.logits, &layered.logits),
        "{what}: the eval's logits differ"
    );
    assert_eq!(chunked.argmax, layered.argmax, "{what}");
    let pass = model.prefill_pass.positions;
    let layer_major = generate(model, ids, &greedy(3), |_| Ok(())).unwrap();
    model.set_prefill_pass(PREFILL_CHUNK).unwrap();
    let chunk_by_chunk = generate(model, ids, &greedy(3), |_| Ok(())).unwrap();
    model.set_prefill_pass(pass).unwrap();
    assert_eq!(
        layer_major.token_ids, chunk_by_chunk.token_ids,
        "{what}: greedy tokens"
    );
    // The first token's logits, from an engine step each way.
    let first = |model: &Model| {
        let mut s = Session::new(model, ids, &greedy(1)).unwrap();
        let engine = Engine::new(model);
        while !s.is_done() {
            engine.step(&mut [&mut s], &mut Profile::default()).unwrap();
        }
        s.logits().to_vec()
    };
    let layered = first(model);
    model.set_prefill_pass(PREFILL_CHUNK).unwrap();
    let chunked = first(model);
    model.set_prefill_pass(pass).unwrap();
    assert!(same_bits(&layered, &chunked), "{what}: first logits");
}

#[test]
fn layer_major_prefill_is_chunked_prefill_bit_for_bit_in_every_family() {
    for family in FAMILIES {
        let dir = long_fixture(family, 700);
        let mla = family.starts_with("deepseek") || family == "glm_moe_dsa";
        let mut modes = vec![(MlaMode::Auto, DsaMode::Auto)];
        if mla {
            modes.push((MlaMode::Absorb, DsaMode::Auto));
        }
        if family == "glm_moe_dsa" {
            modes.push((MlaMode::Absorb, DsaMode::On));
            modes.push((MlaMode::Auto, DsaMode::On));
        }
        for (m, d) in modes {
            let mut model = load(dir.path(), LoadOptions::default());
            model.set_attention_modes(m, d);
            let ids = prompt(600, model.cfg.vocab_size);
            assert_layer_major_is_chunked(&mut model, &ids, &format!("{family} {m:?} {d:?}"));
        }
    }
    // Quantized at load: the batched int kernels give each row its bits
    // whatever the rows beside it.
    let dir = long_fixture("qwen3_moe", 700);
    let opts = LoadOptions {
        quantize_at_load: Some(moestream::formats::quant::policy::Policy::default()),
        ..LoadOptions::default()
    };
    let mut model = load(dir.path(), opts);
    let ids = prompt(600, model.cfg.vocab_size);
    assert_layer_major_is_chunked(&mut model, &ids, "qwen3_moe quantized at load");
}

/// Cold store counters after a greedy prefill of `ids` (one token) at
/// `pass` positions per pass, under `opts`.
fn counters_under(
    dir: &Path,
    opts: LoadOptions,
    ids: &[u32],
    pass: usize,
) -> moestream::store::StoreCounters {
    let mut model = load(dir, opts);
    model.set_prefill_pass(pass).unwrap();
    let before = model.store.counters();
    generate(&model, ids, &greedy(1), |_| Ok(())).unwrap();
    let after = model.store.counters();
    moestream::store::StoreCounters {
        layer_fetches: after.layer_fetches - before.layer_fetches,
        demand_reads: after.demand_reads - before.demand_reads,
        misses: after.misses - before.misses,
        ..after
    }
}

/// Cold store counters after a greedy prefill of `ids` (one token) at
/// `pass` positions per pass, 2 expert slots per layer.
fn prefill_counters(dir: &Path, ids: &[u32], pass: usize) -> moestream::store::StoreCounters {
    let opts = LoadOptions {
        expert_cache: 2,
        context: 1100,
        ..LoadOptions::default()
    };
    counters_under(dir, opts, ids, pass)
}

/// Every KV cache value, as bits, layer after layer.
fn kv_bits(kv: &moestream::model::kv::KvCache) -> Vec<u32> {
    use moestream::model::kv::LayerKv;
    let mut out = Vec::new();
    for layer in &kv.layers {
        let parts: [&[f32]; 3] = match layer {
            LayerKv::Gqa { k, v } => [k, v, &[]],
            LayerKv::Mla {
                latent,
                k_rope,
                index_k,
            } => [latent, k_rope, index_k],
        };
        out.extend(parts.iter().flat_map(|p| p.iter().map(|x| x.to_bits())));
    }
    out
}

/// A pass longer than its sub-chunk, with 2 expert slots per layer (every
/// layer's experts stream through it, read in id order, most dropped once
/// their rows are done), pipelined and not: the last logits and every
/// layer's KV cache (GQA keys and values, MLA latents and rotary keys, DSA
/// indexer keys) are chunk-by-chunk prefill's, bit for bit, in every
/// family and attention mode.
#[test]
fn a_streamed_pass_gives_the_chunks_logits_and_kv_cache_bit_for_bit_in_every_family() {
    for family in FAMILIES {
        let dir = long_fixture(family, 700);
        let mla = family.starts_with("deepseek") || family == "glm_moe_dsa";
        let mut modes = vec![(MlaMode::Auto, DsaMode::Auto, true)];
        modes.push((MlaMode::Auto, DsaMode::Auto, false));
        if mla {
            modes.push((MlaMode::Absorb, DsaMode::Auto, true));
        }
        if family == "glm_moe_dsa" {
            modes.push((MlaMode::Absorb, DsaMode::On, true));
            modes.push((MlaMode::Explicit, DsaMode::On, false));
        }
        for (m, d, pipeline) in modes {
            let what = format!("{family} {m:?} {d:?} pipelined {pipeline}");
            let mut opts = LoadOptions {
                expert_cache: 2,
                ..LoadOptions::default()
            };
            opts.schedule.pipeline = pipeline;
            let mut model = load(dir.path(), opts);
            model.set_attention_modes(m, d);
            let ids = prompt(600, model.cfg.vocab_size);
            assert!(
                model.prefill_pass.positions >= ids.len(),
                "{what}: one pass"
            );
            assert!(
                model.prefill_pass.sub_rows < ids.len(),
                "{what}: sub-chunks"
            );
            let mut prof = Profile::default();
            let mut layered_kv = model.new_kv(ids.len());
            let layered = model
                .prefill(&ids, &mut layered_kv, false, &mut prof)
                .unwrap();
            let mut chunked_kv = model.new_kv(ids.len());
            let chunked = model
                .forward_chunked(&ids, &mut chunked_kv, false, &mut prof, PREFILL_CHUNK)
                .unwrap();
            assert!(same_bits(&layered, &chunked), "{what}: last logits");
            assert_eq!(layered_kv.len(), chunked_kv.len(), "{what}");
            assert!(
                kv_bits(&layered_kv) == kv_bits(&chunked_kv),
                "{what}: the KV caches differ"
            );
        }
    }
}

/// A prompt whose every row's temporaries (the attention projections, the
/// MLP rows, one routed output row per selected expert) would not fit the
/// plan's pass runs as one pass under a small budget, and reads each
/// routed expert at most once per layer, where chunk-by-chunk prefill
/// re-reads them.
#[test]
fn a_prompt_too_long_for_whole_rows_runs_as_one_pass_reading_each_expert_once_per_layer() {
    let n = 4096;
    // Room for the prompt and the token after it.
    let dir = long_fixture("qwen3_moe", n + 1);
    let free = LoadOptions {
        context: n + 1,
        ..LoadOptions::default()
    };
    let smallest = moestream::inspect::plan::plan(dir.path(), &free)
        .unwrap()
        .smallest_budget_bytes;
    let opts = LoadOptions {
        ram_budget: Some(smallest),
        ..free
    };
    let model = load(dir.path(), opts.clone());
    let plan = model.plan.clone().expect("a plan under a budget");
    let pass = plan.prefill_pass;
    let (layers, experts) = (
        model.store.moe_layers() as u64,
        model.store.experts_in(0) as u64,
    );
    let routed_rows = (model.cfg.top_k * model.cfg.hidden_size * 4) as u64;
    let whole_rows = pass.bytes_per_position + pass.sub_bytes_per_row + routed_rows;
    let ids = prompt(n, model.cfg.vocab_size);
    drop(model);
    assert!(pass.positions >= n, "one pass: {plan}");
    assert!(
        n as u64 * whole_rows > plan.activations() + plan.reserve("prefill pass"),
        "a pass holding every row's temporaries would need several: {plan}"
    );
    assert!((plan.slots_per_layer as u64) < experts, "{plan}");
    let one = counters_under(dir.path(), opts.clone(), &ids, n);
    assert_eq!(one.layer_fetches, layers, "one fetch per layer: {one:?}");
    assert!(
        one.demand_reads <= layers * experts,
        "{} reads for {layers} layers of {experts} experts",
        one.demand_reads
    );
    let chunked = counters_under(dir.path(), opts, &ids, PREFILL_CHUNK);
    assert!(
        chunked.demand_reads > one.demand_reads,
        "chunked {} vs one pass {}",
        chunked.demand_reads,
        one.demand_reads
    );
}

#[test]
fn a_long_prompt_reads_each_expert_at_most_once_per_layer_per_pass() {
    let dir = long_fixture("qwen3_moe", 1100);
    let model = load(dir.path(), LoadOptions::default());
    let (layers, experts) = (
        model.store.moe_layers() as u64,
        model.store.experts_in(0) as u64,
    );
    let ids = prompt(1024, model.cfg.vocab_size);
    drop(model);
    // One pass: each layer fetches once and reads each expert at most once.
    let one = prefill_counters(dir.path(), &ids, 1024);
    assert_eq!(one.layer_fetches, layers, "one fetch per layer");
    assert!(
        one.demand_reads <= layers * experts,
        "{} reads for {layers} layers of {experts} experts",
        one.demand_reads
    );
    // Two passes: twice.
    let two = prefill_counters(dir.path(), &ids, 512);
    assert_eq!(two.layer_fetches, 2 * layers);
    assert!(two.demand_reads <= 2 * layers * experts);
    // Chunk by chunk, a 2-slot cache re-reads the experts every chunk.
    let chunked = prefill_counters(dir.path(), &ids, PREFILL_CHUNK);
    assert_eq!(chunked.layer_fetches, 4 * layers);
    assert!(
        chunked.demand_reads > one.demand_reads,
        "chunked {} vs one pass {}",
        chunked.demand_reads,
        one.demand_reads
    );
}

#[test]
fn the_pass_is_the_plans_and_no_longer() {
    let dir = long_fixture("qwen3_moe", 4096);
    let model = load(
        dir.path(),
        LoadOptions {
            ram_budget: Some(200_000_000),
            ..LoadOptions::default()
        },
    );
    let plan = model.plan.clone().expect("a plan under a budget");
    let pass = plan.prefill_pass;
    assert_eq!(model.prefill_pass, pass, "the loaded pass is the plan's");
    assert!(pass.positions > PREFILL_CHUNK, "{plan}");
    assert!(pass.positions <= 4096);
    assert!(
        pass.bytes() <= plan.activations() + plan.reserve("prefill pass"),
        "{plan}"
    );
    assert!(plan.to_string().contains("prefill pass"), "{plan}");
    // Whatever the budget and context, the pass (what it holds for every
    // position and one sub-chunk's temporaries) is within the items the
    // plan itemizes for it, and never a sub-chunk that is not whole chunks.
    for budget in [60_000_000, 100_000_000, 200_000_000, 1_000_000_000] {
        for context in [100, 256, 1000, 4096] {
            let opts = LoadOptions {
                ram_budget: Some(budget),
                context,
                pin_history: false,
                ..LoadOptions::default()
            };
            let Ok(model) = Model::load(dir.path(), &opts) else {
                continue; // a budget too small for this context
            };
            let p = model.plan.expect("a plan under a budget");
            let pass = p.prefill_pass;
            assert_eq!(model.prefill_pass, pass);
            let what = format!("{budget} B, {context} positions: {p}");
            assert!(pass.positions >= 1 && pass.positions <= context, "{what}");
            assert_eq!(pass.sub_rows % PREFILL_CHUNK, 0, "{what}");
            assert!(
                pass.bytes() <= p.activations() + p.reserve("prefill pass"),
                "{what}"
            );
            assert!(pass.bytes() <= (budget / 8).max(p.activations()), "{what}");
            if pass.positions < context {
                assert_eq!(pass.positions % PREFILL_CHUNK, 0, "{what}");
            }
        }
    }
    let mut model = model;
    let e = model.set_prefill_pass(pass.positions + 1).unwrap_err();
    assert!(e.to_string().contains("prefill_pass"), "{e}");
    assert!(model.set_prefill_pass(0).is_err());
    // Without a budget: the whole context in one pass.
    let free = load(
        dir.path(),
        LoadOptions {
            context: 3000,
            ..LoadOptions::default()
        },
    );
    assert_eq!(free.prefill_pass.positions, 3000);
}

/// Steps a greedy two-token session of `ids` until it is done.
fn run_to_end(engine: &Engine, model: &Model, ids: &[u32]) {
    let mut session = Session::new(model, ids, &greedy(2)).unwrap();
    while !session.is_done() {
        engine
            .step(&mut [&mut session], &mut Profile::default())
            .unwrap();
    }
}

#[test]
fn a_pass_reports_progress_layer_by_layer_and_the_engine_counts_prefill() {
    let dir = long_fixture("olmoe", 1100);
    let mut model = load(dir.path(), LoadOptions::default());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    model.progress = Progress::new(move |w, done, total| {
        if w == Work::Prefill {
            s.lock().unwrap().push((done, total));
        }
    });
    let ids = prompt(1000, model.cfg.vocab_size);
    let engine = Engine::new(&model);
    run_to_end(&engine, &model, &ids);
    let seen = seen.lock().unwrap();
    let layers = model.cfg.num_layers;
    assert_eq!(seen.len(), layers, "one report per layer of the one pass");
    assert!(seen.windows(2).all(|w| w[0].0 < w[1].0), "{seen:?}");
    assert_eq!(seen.last(), Some(&(1000, 1000)));
    let (tokens, seconds) = engine.prefill_totals();
    assert_eq!(tokens, 1000, "prompt positions prefilled");
    assert!(seconds > 0.0);
}

/// A long prefill stops at the next layer once its interrupt is raised
/// (by the server when the shutdown's grace is over): the step fails with
/// `Interrupted` after one layer, the KV cache keeps its length, and a
/// model whose interrupt is not raised prefills the same prompt.
#[test]
fn a_raised_interrupt_stops_a_long_prefill_after_the_layer_under_way() {
    let dir = long_fixture("olmoe", 1100);
    let mut model = load(dir.path(), LoadOptions::default());
    let layers_done = Arc::new(Mutex::new(0));
    let (done, interrupt) = (layers_done.clone(), model.interrupt.clone());
    model.progress = Progress::new(move |w, _, _| {
        if w == Work::Prefill {
            *done.lock().unwrap() += 1;
            interrupt.raise();
        }
    });
    let ids = prompt(1000, model.cfg.vocab_size);
    let mut session = Session::new(&model, &ids, &greedy(2)).unwrap();
    let engine = Engine::new(&model);
    let err = engine
        .step(&mut [&mut session], &mut Profile::default())
        .unwrap_err();
    assert!(
        matches!(err, moestream::Error::Interrupted),
        "{err}: an interrupted prefill fails as interrupted"
    );
    assert_eq!(*layers_done.lock().unwrap(), 1, "stopped after one layer");
    assert!(model.cfg.num_layers > 1);
    assert_eq!(session.prefilled(), 0, "nothing of the pass counts as fed");
    model.interrupt = Default::default();
    model.progress = Progress::default();
    let engine = Engine::new(&model);
    run_to_end(&engine, &model, &ids);
}

/// `moestream serve` with prefill passes of one chunk: a streamed
/// completion of a 700-token prompt asking `return_progress` gets a
/// `prompt_progress` chunk after every pass, its positions increasing to
/// the total, all before the first text; without it, SSE comments say the
/// same and no data chunk carries progress.
#[test]
fn a_streamed_long_prompt_reports_its_prefill_progress_up_to_the_total() {
    use common::server::Server;
    use serde_json::json;
    use std::io::{BufRead, BufReader};
    let dir = long_fixture("qwen3_moe", 1024);
    let s = Server::start(dir.path(), &["--prefill-pass", "256", "--context", "1024"]);
    let ids = prompt(700, 384);
    let body = json!({"prompt": ids, "max_tokens": 2, "temperature": 0, "ignore_eos": true,
                      "stream": true, "return_progress": true});
    let chunks = s.stream("/v1/completions", &body);
    let progress: Vec<(u64, u64, usize)> = chunks
        .iter()
        .enumerate()
        .filter_map(|(i, c)| {
            let p = c.get("prompt_progress")?;
            Some((p["processed"].as_u64()?, p["total"].as_u64()?, i))
        })
        .collect();
    let positions: Vec<(u64, u64)> = progress.iter().map(|p| (p.0, p.1)).collect();
    assert_eq!(positions, [(256, 700), (512, 700), (700, 700)]);
    let first_text = chunks
        .iter()
        .position(|c| c["choices"][0]["text"].is_string())
        .expect("a text chunk");
    assert!(progress.iter().all(|p| p.2 < first_text), "{chunks:?}");
    // Without return_progress: comments, no progress chunks (another
    // prompt, so that none of it continues the first one's kept KV).
    let other: Vec<u32> = ids.iter().map(|&t| (t + 1) % 384).collect();
    let mut plain = body.clone();
    plain["prompt"] = json!(other);
    plain["return_progress"] = json!(false);
    let resp = ureq::post(&format!("{}/v1/completions", s.base))
        .send_json(plain)
        .unwrap();
    let lines: Vec<String> = BufReader::new(resp.into_reader())
        .lines()
        .map(Result::unwrap)
        .collect();
    let comments: Vec<&str> = lines
        .iter()
        .filter(|l| l.starts_with(": prefill"))
        .map(String::as_str)
        .collect();
    assert_eq!(
        comments,
        [
            ": prefill 256/700",
            ": prefill 512/700",
            ": prefill 700/700"
        ]
    );
    assert!(!lines.iter().any(|l| l.contains("prompt_progress")));
}

/// The last logits and every KV value of a streamed 600-row prefill (2
/// expert slots per layer) with early reads `early`, and the counters of
/// the prefill.
fn streamed_under(
    dir: &Path,
    early: Option<EarlyReads>,
) -> (Vec<f32>, Vec<u32>, moestream::store::StoreCounters, usize) {
    let opts = LoadOptions {
        expert_cache: 2,
        ..LoadOptions::default()
    };
    let mut model = load(dir, opts);
    model.store.schedule.early = early;
    let ids = prompt(600, model.cfg.vocab_size);
    assert!(model.prefill_pass.sub_rows < ids.len(), "a streamed pass");
    let mut kv = model.new_kv(ids.len());
    let logits = model
        .prefill(&ids, &mut kv, false, &mut Profile::default())
        .unwrap();
    let allowance = model.store.early_allowance();
    if early.is_some() {
        assert_eq!(allowance + 1, model.store.read_budget());
    }
    (logits, kv_bits(&kv), model.store.counters(), allowance)
}

/// A streamed pass reads a layer's experts while its attention runs
/// (in file order, or the experts its router picks for a sample of the
/// rows entering it), before its routing: the logits and the KV cache are
/// the same bits as with every read after the routing, in every family;
/// the early reads happen, each is either used or counted unneeded, the
/// experts are still read at most once per layer, and the experts held
/// read and not yet applied never exceed the allowance (the read window
/// and the prefetch item of the plan).
#[test]
fn early_reads_change_no_bit_stay_within_the_allowance_and_read_each_expert_once() {
    for family in FAMILIES {
        let dir = long_fixture(family, 700);
        let (logits, kv, off, _) = streamed_under(dir.path(), None);
        assert_eq!(off.early_issued, 0, "{family}: no early reads when off");
        let model = load(dir.path(), LoadOptions::default());
        let (layers, experts, top_k) = (
            model.store.moe_layers() as u64,
            model.cfg.num_experts as u64,
            model.cfg.top_k as u64,
        );
        drop(model);
        assert!(off.read_window_peak <= top_k, "{family}: {off:?}");
        for early in [EarlyReads::Files, EarlyReads::Guess] {
            let what = format!("{family} {}", early.name());
            let (l, k, c, allowance) = streamed_under(dir.path(), Some(early));
            assert!(same_bits(&l, &logits), "{what}: last logits");
            assert!(k == kv, "{what}: the KV caches differ");
            assert!(c.early_issued > 0, "{what}: no early read: {c:?}");
            assert!(c.early_issued <= layers * allowance as u64, "{what}: {c:?}");
            assert_eq!(
                c.early_used + c.early_unneeded,
                c.early_issued,
                "{what}: every early read used or released: {c:?}"
            );
            assert!(
                c.demand_reads + c.early_used <= layers * experts,
                "{what}: an expert read twice in a layer: {c:?}"
            );
            assert!(c.demand_reads < off.demand_reads, "{what}: {c:?}");
            assert!(
                c.read_window_peak <= allowance as u64 + 1,
                "{what}: {} held, budget {}",
                c.read_window_peak,
                allowance + 1
            );
        }
    }
}

/// Early reads a layer's routing does not ask for are released when its
/// fetch begins (cancelled or dropped, counted unneeded); the ones it
/// asks for are handed over without a demand read.
#[test]
fn unneeded_early_reads_are_released_and_needed_ones_used() {
    let dir = long_fixture("qwen3_moe", 700);
    let mut model = load(dir.path(), LoadOptions::default());
    // Room for three early reads in the plan (prefetch item).
    model.store.schedule.prefetch_experts_max = 3;
    let store = &model.store;
    let layer = (0..model.cfg.num_layers)
        .find(|&l| store.experts_in(l) > 0)
        .expect("an MoE layer");
    assert!(store.early_allowance() >= 3, "{}", store.early_allowance());
    assert_eq!(store.read_early(layer, [0, 1, 2]), 3);
    // Asked again: already on their way, nothing started.
    assert_eq!(store.read_early(layer, [0, 1, 2]), 0);
    let mut routes = moestream::store::Routes::default();
    routes.push(&[1], &[1.0], 0.0, None);
    routes.seal();
    let mut cached = Vec::new();
    let mut pending = store.fetch_in_order(layer, &routes, &mut cached).unwrap();
    assert!(cached[0].is_none(), "a miss");
    pending.take(1, true).unwrap();
    pending.finish();
    let c = store.counters();
    assert_eq!((c.early_issued, c.early_used, c.early_unneeded), (3, 1, 2));
    assert_eq!(
        c.demand_reads, 0,
        "the routed expert came from its early read"
    );
    assert_eq!(c.early_unneeded_bytes, 2 * c.early_issued_bytes / 3);
    // Off: nothing is read early.
    drop(model);
    let mut model = load(dir.path(), LoadOptions::default());
    model.store.schedule.early = None;
    assert_eq!(model.store.early_allowance(), 0);
    assert_eq!(model.store.read_early(layer, [0, 1, 2]), 0);
}
