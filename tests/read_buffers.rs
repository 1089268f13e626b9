//! A bigger expert cache must not make reads pay for fresh memory (issue:
//! decode slowed as the budget grew). Two causes, each checked by a
//! counter, not a clock:
//! - a fresh expert-sized read buffer was zeroed in user space, faulting
//!   every 4 KiB page before the read (and the kernel cleared each again);
//! - every miss until the cache filled read into a fresh buffer, so the
//!   larger the cache, the more reads paid page faults inside the read.
//!
//! Its own test binary: the read-buffer pool is process-wide, and no other
//! test may take buffers from it while this one counts.

mod common;

use common::{fixture, Greedy};
use moestream::convert::{self, ConvertOptions};
use moestream::formats::quant::policy::Policy;
use moestream::model::{LoadOptions, Model};
use moestream_io::{shared_pool, AlignedBuf, MAP_BYTES_MIN};
use std::time::Duration;

/// Minor page faults taken by the calling thread so far.
fn thread_minor_faults() -> i64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage struct into the pointer given.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, usage.as_mut_ptr()) };
    assert_eq!(rc, 0, "getrusage");
    // SAFETY: initialized by the successful call above.
    unsafe { usage.assume_init() }.ru_minflt
}

fn fresh_buffer_allocation_touches_no_page() {
    let len = 64 << 20;
    assert!(len >= MAP_BYTES_MIN);
    let before = thread_minor_faults();
    let buf = AlignedBuf::new(len).unwrap();
    let faults = thread_minor_faults() - before;
    // Zeroing 64 MiB in user space takes 16,384 faults (32 with huge pages).
    assert!(faults < 8, "allocating {len} bytes faulted {faults} pages");
    drop(buf);
}

/// Greedy decode of `steps` tokens after `prompt`; returns the tokens and
/// the pool's fresh allocations during the decode steps (a prefill's burst
/// of misses may hold more buffers than the plan's in-flight item).
fn decode(model: &Model, prompt: &[u32], steps: usize) -> (Vec<u32>, u64) {
    let mut g = Greedy::prefill(model, prompt, steps);
    let before = shared_pool().stats().fresh_takes;
    g.steps(steps);
    (g.tokens, shared_pool().stats().fresh_takes - before)
}

/// Waits until the pool's warming thread is done.
fn wait_for_warming() {
    assert!(shared_pool().wait_warmed(Duration::from_secs(30)));
}

fn reads_recycle_warmed_buffers_whatever_the_cache_size() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("c");
    convert::convert(&ConvertOptions {
        input: fixture("qwen3_moe"),
        output: dst.clone(),
        policy: Policy::default(),
        resume: false,
        force: false,
        progress: false,
        importance: None,
    })
    .expect("convert");
    let prompt = [3, 14, 15, 92, 65, 35];
    let mut reference = None;
    for slots in [1, 2, 4, 8] {
        let opts = LoadOptions {
            expert_cache: slots,
            ..LoadOptions::default()
        };
        let model = Model::load(&dst, &opts).unwrap();
        assert!(model.store.zero_copy());
        wait_for_warming();
        let (tokens, fresh) = decode(&model, &prompt, 12);
        let c = model.store.counters();
        assert!(c.misses > 0, "{slots} slots: the run must read experts");
        assert_eq!(
            fresh, 0,
            "{slots} slots: {fresh} of {} expert reads allocated a fresh buffer",
            c.misses
        );
        assert_eq!(reference.get_or_insert(tokens.clone()), &tokens);
    }
}

#[test]
fn read_buffers_are_never_faulted_in_by_a_read() {
    fresh_buffer_allocation_touches_no_page();
    reads_recycle_warmed_buffers_whatever_the_cache_size();
}
