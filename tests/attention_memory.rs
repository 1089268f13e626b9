//! Attention's workspace over a long context stays per head: a prefill
//! of 4,000 positions through MLA's explicit path (keys and values
//! reconstructed from the latents) never allocates one buffer of every
//! head's keys and values for every position (at 16k positions of
//! DeepSeek-V3 that buffer was 2 GB, outside the RAM plan), and the plan's
//! activations item covers the largest allocation it makes. A counting
//! global allocator records the largest single allocation; this file
//! holds one test so no other test allocates meanwhile.

mod common;

use moestream::engine::generate::GenOptions;
use moestream::engine::{Engine, Session};
use moestream::model::mla::MlaMode;
use moestream::model::profile::Profile;
use moestream::model::{LoadOptions, Model};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

struct Largest;

static MEASURING: AtomicBool = AtomicBool::new(false);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

fn note(size: usize) {
    if MEASURING.load(Ordering::Relaxed) {
        LARGEST.fetch_max(size, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded to the system allocator unchanged.
unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract, passed on to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract, passed on to the system allocator.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: the caller's contract, passed on to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Largest = Largest;

#[test]
fn a_long_mla_prefill_holds_one_heads_keys_and_values_at_a_time() {
    const POSITIONS: usize = 4000;
    let dir = common::long_fixture("deepseek_v3", 4096);
    let opts = LoadOptions {
        pin_history: false,
        mla: MlaMode::Explicit,
        context: 4096,
        ram_budget: Some(8 << 30),
        ..LoadOptions::default()
    };
    let model = Model::load(dir.path(), &opts).unwrap();
    let ids = common::spread_ids(POSITIONS, model.cfg.vocab_size);
    let gen = GenOptions {
        max_tokens: 1,
        ignore_eos: true,
        ..GenOptions::default()
    };
    let mut session = Session::new(&model, &ids, &gen).unwrap();
    let engine = Engine::new(&model);
    MEASURING.store(true, Ordering::SeqCst);
    while session.in_prefill() {
        engine
            .step(&mut [&mut session], &mut Profile::default())
            .unwrap();
    }
    MEASURING.store(false, Ordering::SeqCst);
    let largest = LARGEST.load(Ordering::SeqCst);
    let m = model.cfg.mla.as_ref().expect("an MLA fixture");
    let all_heads = POSITIONS * model.cfg.num_heads * (m.qk_nope_head_dim + m.v_head_dim) * 4;
    assert!(
        largest < all_heads,
        "an allocation of {largest} B: every head's keys and values for every position ({all_heads} B)"
    );
    let planned = model.plan.as_ref().expect("a budget").activations();
    assert!(
        (largest as u64) <= planned,
        "an allocation of {largest} B outside the plan's activations ({planned} B)"
    );
}
