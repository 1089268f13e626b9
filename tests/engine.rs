//! The Engine/Session core: sessions interleaved on one engine, or stepped
//! together in one batch, each get exactly the tokens they get alone; a
//! batched step fetches each MoE layer's experts once, as the union of
//! every session's rows.

mod common;

use common::fixture;
use moestream::engine::generate::{generate, GenOptions};
use moestream::engine::sampler::SamplingParams;
use moestream::engine::{Engine, Session};
use moestream::model::profile::Profile;
use moestream::model::{Ffn, LoadOptions, Model};

fn load(family: &str, expert_cache: usize) -> Model {
    let opts = LoadOptions {
        expert_cache,
        pin_history: false,
        ..LoadOptions::default()
    };
    Model::load(&fixture(family), &opts).unwrap()
}

fn opts(max_tokens: usize, seed: u64, temperature: f32) -> GenOptions {
    GenOptions {
        max_tokens,
        sampling: SamplingParams {
            temperature,
            seed,
            ..SamplingParams::default()
        },
        ignore_eos: true,
        eos_ids: Vec::new(),
        speculation: Default::default(),
        constraint: None,
        logit_bias: Vec::new(),
    }
}

/// Prompts of different lengths (one longer than a prefill chunk would be
/// at a smaller chunk size; all well inside the fixtures' contexts).
fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![3, 14, 15, 92, 65],
        vec![27, 18],
        (1..40).map(|i| (i * 7 % 97) as u32).collect(),
        vec![5],
    ]
}

fn alone(model: &Model, prompt: &[u32], o: &GenOptions) -> Vec<u32> {
    generate(model, prompt, o, |_| Ok(())).unwrap().token_ids
}

fn moe_layers(model: &Model) -> u64 {
    model
        .layers
        .iter()
        .filter(|l| matches!(l.ffn, Ffn::Moe(_)))
        .count() as u64
}

#[test]
fn two_sessions_interleaved_get_their_solo_tokens() {
    for family in ["qwen3_moe", "deepseek_v3", "glm_moe_dsa"] {
        let model = load(family, 2);
        let ps = prompts();
        let (oa, ob) = (opts(9, 1, 0.0), opts(7, 42, 0.8));
        let (want_a, want_b) = (alone(&model, &ps[0], &oa), alone(&model, &ps[2], &ob));
        let engine = Engine::new(&model);
        let mut a = Session::new(&model, &ps[0], &oa).unwrap();
        let mut b = Session::new(&model, &ps[2], &ob).unwrap();
        let mut prof = Profile::default();
        while !(a.is_done() && b.is_done()) {
            engine.step(&mut [&mut a], &mut prof).unwrap();
            engine.step(&mut [&mut b], &mut prof).unwrap();
        }
        assert_eq!(a.tokens(), want_a, "{family}: session a");
        assert_eq!(b.tokens(), want_b, "{family}: session b");
    }
}

#[test]
fn four_sessions_in_one_batch_read_each_expert_once_per_layer() {
    for family in ["qwen3_moe", "deepseek_v3", "glm_moe_dsa", "mixtral"] {
        // No cache: every expert a layer needs is read, so reads count
        // exactly what each fetch asked for.
        let model = load(family, 0);
        let ps = prompts();
        let o: Vec<GenOptions> = (0..4).map(|i| opts(6 + i, i as u64, 0.0)).collect();
        let want: Vec<Vec<u32>> = ps
            .iter()
            .zip(&o)
            .map(|(p, o)| alone(&model, p, o))
            .collect();
        let solo_reads = model.store.counters().demand_reads;

        let engine = Engine::new(&model);
        let mut sessions: Vec<Session> = ps
            .iter()
            .zip(&o)
            .map(|(p, o)| Session::new(&model, p, o).unwrap())
            .collect();
        let before = model.store.counters();
        let mut prof = Profile::default();
        let mut steps = 0;
        while sessions.iter().any(|s| !s.is_done()) {
            let mut batch: Vec<&mut Session> = sessions.iter_mut().collect();
            engine.step(&mut batch, &mut prof).unwrap();
            steps += 1;
        }
        let after = model.store.counters();
        for (s, w) in sessions.iter().zip(&want) {
            assert_eq!(s.tokens(), w.as_slice(), "{family}");
        }
        // One fetch per MoE layer per step, whatever the batch holds, each
        // of a union of distinct experts (asserted by the store), and every
        // miss read exactly once.
        let fetches = after.layer_fetches - before.layer_fetches;
        assert_eq!(fetches, steps * moe_layers(&model), "{family}");
        let reads = after.demand_reads - before.demand_reads;
        assert_eq!(reads, after.misses - before.misses, "{family}");
        // Sharing the union read fewer experts than the four runs alone.
        assert!(
            reads < solo_reads,
            "{family}: {reads} batched vs {solo_reads} alone"
        );
    }
}

#[test]
fn sessions_come_and_go_while_the_engine_lives() {
    let model = load("qwen3_moe", 3);
    let ps = prompts();
    let o = opts(5, 0, 0.0);
    let want: Vec<Vec<u32>> = ps.iter().map(|p| alone(&model, p, &o)).collect();
    let engine = Engine::new(&model);
    let mut prof = Profile::default();
    let mut first = Session::new(&model, &ps[0], &o).unwrap();
    engine.step(&mut [&mut first], &mut prof).unwrap();
    engine.step(&mut [&mut first], &mut prof).unwrap();
    // A second session joins mid-way, a third once the first is done.
    let mut second = Session::new(&model, &ps[1], &o).unwrap();
    while !first.is_done() {
        engine
            .step(&mut [&mut first, &mut second], &mut prof)
            .unwrap();
    }
    let mut third = Session::new(&model, &ps[3], &o).unwrap();
    while !(second.is_done() && third.is_done()) {
        engine
            .step(&mut [&mut second, &mut third], &mut prof)
            .unwrap();
    }
    assert_eq!(first.tokens(), want[0]);
    assert_eq!(second.tokens(), want[1]);
    assert_eq!(third.tokens(), want[3]);
    // A done session takes no part in a step.
    assert_eq!(engine.step(&mut [&mut first], &mut prof).unwrap(), [0]);
}

#[test]
fn the_session_pool_admits_queues_refuses_and_batches_by_the_scheduler() {
    use moestream::engine::{PoolError, PoolEvent, SessionPool};
    use moestream_scheduler::{Admission, SchedulerConfig};
    let model = load("deepseek_v3", 2);
    let ps = prompts();
    let o = opts(5, 0, 0.0);
    let want: Vec<Vec<u32>> = ps.iter().map(|p| alone(&model, p, &o)).collect();
    let config = SchedulerConfig {
        kv_slots: 2,
        queue_max: 2,
        queue_wait_ms_max: u64::MAX,
        batch_max: 2,
    };
    let mut pool = SessionPool::new(&model, config);
    let admitted: Vec<Admission> = (0..4)
        .map(|i| pool.submit(i as u64, &ps[i], &o).unwrap())
        .collect();
    assert_eq!(admitted[0], Admission::Running { slot: 0 });
    assert_eq!(admitted[3], Admission::Queued { position: 1 });
    let busy = pool.submit(9, &ps[0], &o).unwrap_err();
    assert!(matches!(busy, PoolError::Busy(_)), "{busy}");
    let bad = pool.submit(10, &[], &o).unwrap_err();
    assert!(matches!(bad, PoolError::Request(_)), "{bad}");
    let before = model.store.counters();
    let (mut steps, mut tokens) = (0u64, vec![Vec::new(); 4]);
    let mut prof = Profile::default();
    while !pool.is_idle() {
        assert!(pool.running_count() <= 2);
        for ev in pool.step(&mut prof) {
            if let PoolEvent::Token(id, t) = ev {
                tokens[id as usize].push(t);
            }
        }
        steps += 1;
    }
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&tokens[i], w, "request {i}");
        assert_eq!(&pool.take_finished(i as u64).unwrap().tokens, w);
    }
    let fetches = model.store.counters().layer_fetches - before.layer_fetches;
    assert_eq!(fetches, steps * moe_layers(&model));
}

#[test]
fn the_session_pool_keeps_running_kv_within_the_ram_plan() {
    use moestream::engine::SessionPool;
    use moestream_scheduler::SchedulerConfig;
    let opts = LoadOptions {
        expert_cache: 2,
        pin_history: false,
        ram_budget: Some(2_000_000_000),
        context: 20,
        ..LoadOptions::default()
    };
    let model = Model::load(&fixture("qwen3_moe"), &opts).unwrap();
    assert_eq!(model.context_budget, Some(20));
    let o = opts_for(5);
    let prompt = [3, 14, 15, 92, 65]; // 5 + 5 = 10 positions a session
    assert_eq!(SessionPool::slots_within_budget(&model, 10, 8), 2);
    let config = SchedulerConfig {
        kv_slots: 3,
        queue_max: 0,
        queue_wait_ms_max: u64::MAX,
        batch_max: 3,
    };
    let mut pool = SessionPool::new(&model, config);
    pool.submit(0, &prompt, &o).unwrap();
    pool.submit(1, &prompt, &o).unwrap();
    let third = pool.submit(2, &prompt, &o).unwrap_err().to_string();
    assert!(third.contains("RAM plan reserved"), "{third}");
    assert_eq!(
        pool.running_count(),
        2,
        "the refused session freed its slot"
    );
}

fn opts_for(max_tokens: usize) -> GenOptions {
    opts(max_tokens, 0, 0.0)
}

/// Runs `pool` until idle; returns each request's tokens by id.
fn drain(pool: &mut moestream::engine::SessionPool) -> std::collections::HashMap<u64, Vec<u32>> {
    use moestream::engine::PoolEvent;
    let mut out: std::collections::HashMap<u64, Vec<u32>> = Default::default();
    let mut prof = Profile::default();
    while !pool.is_idle() {
        for ev in pool.step(&mut prof) {
            match ev {
                PoolEvent::Token(id, t) => out.entry(id).or_default().push(t),
                PoolEvent::Failed(id, e) => panic!("request {id} failed: {e}"),
                _ => {}
            }
        }
    }
    out
}

#[test]
fn a_request_continuing_a_kept_prefix_prefills_only_its_new_tokens() {
    use moestream::engine::SessionPool;
    use moestream_scheduler::SchedulerConfig;
    // Two families: GQA (qwen3_moe) and MLA with DSA (glm_moe_dsa).
    for family in ["qwen3_moe", "glm_moe_dsa"] {
        let model = load(family, 2);
        let config = SchedulerConfig {
            kv_slots: 1,
            queue_max: 1,
            queue_wait_ms_max: u64::MAX,
            batch_max: 1,
        };
        let mut pool = SessionPool::new(&model, config);
        pool.keep_prefixes(2);
        let o = opts(4, 0, 0.0);
        let first = vec![3, 14, 15, 92, 65];
        pool.submit(0, &first, &o).unwrap();
        let reply = drain(&mut pool)[&0].clone();
        // The next turn: the conversation so far, then new tokens.
        let mut second = first.clone();
        second.extend(&reply);
        second.extend([7, 8, 9]);
        pool.submit(1, &second, &o).unwrap();
        let got = drain(&mut pool)[&1].clone();
        assert_eq!(got, alone(&model, &second, &o), "{family}");
        let f = pool.take_finished(1).unwrap();
        // The KV held the first prompt and all but the last reply token.
        assert_eq!(f.reused, first.len() + reply.len() - 1, "{family}");
        // A prompt sharing only a shorter start reuses just that.
        let third = vec![3, 14, 99, 1];
        pool.submit(2, &third, &o).unwrap();
        let got = drain(&mut pool)[&2].clone();
        assert_eq!(got, alone(&model, &third, &o), "{family}");
        assert_eq!(pool.take_finished(2).unwrap().reused, 2, "{family}");
    }
}

#[test]
fn cancel_frees_a_slot_for_the_queue_and_drops_a_queued_request() {
    use moestream::engine::SessionPool;
    use moestream_scheduler::{Admission, SchedulerConfig};
    let model = load("qwen3_moe", 2);
    let config = SchedulerConfig {
        kv_slots: 1,
        queue_max: 2,
        queue_wait_ms_max: u64::MAX,
        batch_max: 1,
    };
    let mut pool = SessionPool::new(&model, config);
    let o = opts(3, 0, 0.0);
    let ps = prompts();
    pool.submit(0, &ps[0], &o).unwrap();
    assert!(matches!(
        pool.submit(1, &ps[1], &o).unwrap(),
        Admission::Queued { .. }
    ));
    pool.submit(2, &ps[3], &o).unwrap();
    assert!(pool.cancel(0), "the running request");
    assert_eq!(pool.running_count(), 1, "request 1 took the freed slot");
    assert!(pool.cancel(2), "the queued request");
    assert_eq!(pool.queued_count(), 0);
    assert!(!pool.cancel(2), "already gone");
    let out = drain(&mut pool);
    assert_eq!(out.keys().copied().collect::<Vec<_>>(), [1]);
    assert_eq!(out[&1], alone(&model, &ps[1], &o));
}
