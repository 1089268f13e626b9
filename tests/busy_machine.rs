//! The expert cache fills on a busy machine (issue: with both cores busy,
//! as a background build keeps them, a `--ram-gb 2` decode hit 4 of 9,712
//! lookups against 0.80 idle). The read-buffer warmer runs at idle CPU
//! priority and the gated cache grew only into warmed buffers, so a warmer
//! that never ran kept the cache empty for the whole run.
//!
//! The test starves the warmer for real: it shares one CPU with 64 threads
//! spinning at normal priority (at `SCHED_IDLE` it then gets ~0.005% of
//! that CPU), while the decode runs on another CPU; the decode's hit
//! rate, counted by the store, must be at least 0.9x the hit rate of the
//! same decode on a quiet machine with warming finished. (A machine with
//! one CPU cannot starve the warmer without starving the decode: the test
//! says so and passes.)
//!
//! Its own test binary: the read-buffer pool is process-wide, and the test
//! sets the CPU affinity of every thread of the process.

mod common;

use common::{moestream, Greedy};
use moestream::lab::synth::{self, SynthSpec};
use moestream::model::{LoadOptions, Model};
use moestream_io::shared_pool;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Experts of ~400 KB at int4 (enough buffers that a starved warmer takes
/// seconds to fault them in, far longer than the decode).
fn model(dir: &Path) -> std::path::PathBuf {
    let spec = SynthSpec {
        hidden: 256,
        layers: 4,
        experts: 16,
        top_k: 2,
        moe_inter: 1024,
        dense_inter: 256,
        heads: 4,
        kv_heads: 2,
        head_dim: 64,
        vocab: 256,
        seed: 5,
    };
    let src = dir.join("bf16");
    std::fs::create_dir(&src).unwrap();
    synth::write(&src, &spec).expect("write synthetic model");
    let dst = dir.join("int4");
    let out = moestream(&[
        "convert",
        "--input",
        src.to_str().unwrap(),
        "--output",
        dst.to_str().unwrap(),
        "--recipe",
        "row4",
    ]);
    assert!(out.ok, "{}", out.stderr);
    dst
}

/// Decode steps before the hit rate is counted: the gate waits 50 ms for a
/// lagging warmer before it opens, and this tiny model decodes a token in
/// about 3 ms (a real one in 30 ms or more), so 48 steps cover that wait
/// on any machine at least as slow as ours.
const WARMUP_STEPS: usize = 48;

/// Greedy decode; (tokens, hit rate of the lookups of `steps` decode steps
/// after the prompt and the warm-up steps).
fn decode(model: &Model, steps: usize) -> (Vec<u32>, f64) {
    let mut g = Greedy::prefill(
        model,
        &[3, 14, 15, 92, 65, 35, 89, 79],
        WARMUP_STEPS + steps,
    );
    g.steps(WARMUP_STEPS);
    let before = model.store.counters();
    g.steps(steps);
    let c = model.store.counters();
    let hits = (c.hits + c.pinned_hits) - (before.hits + before.pinned_hits);
    let misses = c.misses - before.misses;
    (g.tokens, hits as f64 / (hits + misses).max(1) as f64)
}

/// Pins thread `tid` (0: the calling one) to CPU `cpu`; a thread that
/// ended since it was listed is left alone.
fn pin(tid: libc::pid_t, cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes inside it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE (one of the process's CPUs).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: sets one thread's mask from a valid set.
    let rc = unsafe { libc::sched_setaffinity(tid, std::mem::size_of_val(&set), &set) };
    let gone = std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    assert!(rc == 0 || gone, "sched_setaffinity of thread {tid}");
}

/// The CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid buffer for sched_getaffinity.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: fills `set` with the calling thread's mask.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    assert_eq!(rc, 0, "sched_getaffinity");
    // SAFETY: CPU_ISSET reads inside the set.
    (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// Puts the warmer and the hogs (threads named `slab-warm` and `hog`) on
/// CPU `busy` and every other thread of the process on CPU `quiet`.
fn place_threads(busy: usize, quiet: usize) {
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let Ok(tid) = task.file_name().to_string_lossy().parse::<libc::pid_t>() else {
            continue;
        };
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let starved = matches!(comm.trim(), "slab-warm" | "hog");
        pin(tid, if starved { busy } else { quiet });
    }
}

/// 64 threads named `hog` spinning at normal priority until `stop`.
fn hogs(stop: &Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<()>> {
    (0..64)
        .map(|_| {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("hog".into())
                .spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                    }
                })
                .unwrap()
        })
        .collect()
}

#[test]
fn expert_cache_fills_while_cpu_hogs_starve_the_buffer_warmer() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = model(tmp.path());
    let opts = LoadOptions {
        expert_cache: 8,
        ..LoadOptions::default()
    };
    let cpus = allowed_cpus();
    if cpus.len() < 2 {
        eprintln!("one CPU: the warmer cannot be starved apart from the decode; skipped");
        return;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let spinning = hogs(&stop);
    // Busy first: the pool then holds no buffer warmed by an earlier run.
    let busy = Model::load(&dir, &opts).unwrap();
    assert!(busy.store.zero_copy());
    place_threads(cpus[0], cpus[1]);
    let (busy_tokens, busy_rate) = decode(&busy, 160);
    let warmed_while_busy = shared_pool().stats().warmed;
    stop.store(true, Ordering::Relaxed);
    for h in spinning {
        h.join().unwrap();
    }
    drop(busy);
    for cpu in &cpus[1..] {
        place_threads(*cpu, *cpu);
    }
    let idle = Model::load(&dir, &opts).unwrap();
    assert!(shared_pool().wait_warmed(Duration::from_secs(60)));
    let (idle_tokens, idle_rate) = decode(&idle, 160);
    eprintln!(
        "hit rate busy {busy_rate:.3} (warmer made {warmed_while_busy} buffers), idle {idle_rate:.3}"
    );
    assert_eq!(busy_tokens, idle_tokens, "a busy machine changes no token");
    assert!(idle_rate > 0.2, "the idle decode must hit the cache");
    assert!(
        busy_rate >= 0.9 * idle_rate,
        "hit rate under CPU hogs {busy_rate:.3} < 0.9 x idle {idle_rate:.3}"
    );
}
