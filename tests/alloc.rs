//! A decode step allocates nothing once warm: with every expert it needs
//! cached, `Model::forward_into` performs no heap allocation (a counting
//! global allocator proves it). This file holds one test so no other test
//! thread allocates while it counts; the harness's main thread, which
//! allocates when it pleases, is not counted. Every other thread is: the
//! caller's, the kernel workers', the read service's.

mod common;

use moestream::engine::sampler::argmax;
use moestream::model::profile::Profile;
use moestream::model::{LoadOptions, Model};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// Counts every allocation and reallocation, on every thread.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
/// The sizes of the last allocations (for the failure message).
static SIZES: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];

/// The threads (kernel ids) that made them.
static TIDS: [AtomicI64; 8] = [const { AtomicI64::new(0) }; 8];

/// Allocations while measuring (their sizes are kept).
static MEASURED: AtomicU64 = AtomicU64::new(0);
static MEASURING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The harness's main thread (kernel id), when the test runs elsewhere;
/// 0 before the test starts.
static HARNESS: AtomicI64 = AtomicI64::new(0);

/// The calling thread's kernel id (a system call: allocates nothing).
fn tid() -> i64 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) }
}

fn note(size: usize) {
    let harness = HARNESS.load(Ordering::Relaxed);
    if harness != 0 && tid() == harness {
        return;
    }
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    if MEASURING.load(Ordering::Relaxed) {
        let i = (MEASURED.fetch_add(1, Ordering::Relaxed) % 8) as usize;
        SIZES[i].store(size as u64, Ordering::Relaxed);
        TIDS[i].store(tid(), Ordering::Relaxed);
    }
}

/// The name of each thread that allocated while measuring, or its id if
/// it has gone.
fn allocating_threads() -> Vec<String> {
    TIDS.iter()
        .map(|t| t.load(Ordering::Relaxed))
        .filter(|&t| t != 0)
        .map(|t| {
            std::fs::read_to_string(format!("/proc/self/task/{t}/comm"))
                .map_or_else(|_| format!("thread {t} (gone)"), |n| n.trim().to_string())
        })
        .collect()
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counter is a relaxed atomic, which does not allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract is passed through.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract is passed through.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: the caller's contract is passed through.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed through.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Greedy decode of `steps` tokens after `prompt`; returns the tokens and
/// the allocations made by the decode steps (the prefill excluded).
fn decode(model: &Model, prompt: &[u32], steps: usize) -> (Vec<u32>, u64) {
    let mut kv = model.new_kv(prompt.len() + steps + 1);
    let mut prof = Profile::default();
    let mut logits = Vec::new();
    let mut tokens = Vec::with_capacity(steps + 1);
    model
        .forward_into(prompt, &mut kv, false, &mut prof, &mut logits)
        .unwrap();
    tokens.push(argmax(&logits));
    // Early reads the prefill issued and did not need may still be landing
    // on the read service's thread (which allocates to answer them): not
    // the decode steps' doing.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while model.store.counters().reads_in_flight > 0 {
        assert!(std::time::Instant::now() < deadline, "reads never land");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    MEASURING.store(true, Ordering::Relaxed);
    for _ in 0..steps {
        let id = *tokens.last().unwrap();
        model
            .forward_into(&[id], &mut kv, false, &mut prof, &mut logits)
            .unwrap();
        tokens.push(argmax(&logits));
    }
    MEASURING.store(false, Ordering::Relaxed);
    (tokens, ALLOCATIONS.load(Ordering::Relaxed) - before)
}

#[test]
fn a_warm_decode_step_allocates_nothing() {
    // SAFETY: getpid takes no arguments and cannot fail.
    let main = i64::from(unsafe { libc::getpid() });
    if tid() != main {
        HARNESS.store(main, Ordering::Relaxed);
    }
    for family in ["qwen3_moe", "mixtral", "deepseek_v3", "glm_moe_dsa"] {
        let opts = LoadOptions {
            expert_cache: 1024,
            pin_history: false,
            ..LoadOptions::default()
        };
        let model = Model::load(&common::fixture(family), &opts).unwrap();
        let prompt = [3u32, 14, 15, 92, 65];
        // The first pass reads every expert this sequence needs and grows
        // the scratch buffers; the second repeats it exactly.
        let (first, cold) = decode(&model, &prompt, 6);
        // The slab pool warms its buffers on a background thread, which
        // allocates while it runs: not the decode step's doing.
        assert!(moestream_io::shared_pool().wait_warmed(std::time::Duration::from_secs(120)));
        MEASURED.store(0, Ordering::Relaxed);
        SIZES.iter().for_each(|s| s.store(0, Ordering::Relaxed));
        TIDS.iter().for_each(|t| t.store(0, Ordering::Relaxed));
        let (second, warm) = decode(&model, &prompt, 6);
        assert_eq!(first, second, "{family}");
        assert!(cold > 0, "{family}: the counter counts");
        let sizes: Vec<u64> = SIZES.iter().map(|s| s.load(Ordering::Relaxed)).collect();
        assert_eq!(
            warm,
            0,
            "{family}: {warm} allocations in 6 warm decode steps (last sizes {sizes:?}, by {:?})",
            allocating_threads()
        );
    }
}
