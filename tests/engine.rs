//! The Engine/Session core: sessions interleaved on one engine, or stepped
//! together in one batch, each get exactly the tokens they get alone; a
//! batched step fetches each MoE layer's experts once, as the union of
//! every session's rows.

mod common;

use common::fixture;
use moestream::engine::{Engine, Session};
use moestream::generate::{generate, GenOptions};
use moestream::model::{Ffn, LoadOptions, Model};
use moestream::profile::Profile;
use moestream::sampler::SamplingParams;

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
    assert_eq!(engine.step(&mut [&mut first], &mut prof).unwrap(), [None]);
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
        for ev in pool.step(&mut prof).unwrap() {
            if let PoolEvent::Token(id, t) = ev {
                tokens[id as usize].push(t);
            }
        }
        steps += 1;
    }
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&tokens[i], w, "request {i}");
        assert_eq!(pool.take_finished(i as u64).unwrap().tokens(), w.as_slice());
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
