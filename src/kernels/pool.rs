//! A pool of hot workers for the many short parallel regions of decode
//! (SPEC §5: thread wake-up latency dominated back-to-back expert matmuls
//! in the seed). [`run`] splits a region's numbered chunks into one
//! contiguous range per thread (so each core streams its weights in order
//! and the hardware prefetcher stays trained); a thread that finishes its
//! range claims what is left of the others' from their atomic cursors. The
//! caller never sleeps, and a late worker only ever takes work that is left.
//! Between regions an idle worker spins for [`spin_time`] (default 500 µs,
//! `MOESTREAM_SPIN_US` overrides; 0 parks at once) before parking on a
//! condition variable; the next region wakes parked workers, but the caller
//! starts on the chunks without waiting for them.
//!
//! Invariants: one region runs at a time (a second caller, or a region
//! started from inside a chunk, runs its chunks inline); the caller returns
//! only after every worker that joined the region has left it, which is
//! what makes the borrowed, stack-held job sound. The worker count is
//! `rayon::current_num_threads() - 1` at first use, so `--threads` (which
//! sizes rayon's global pool) sizes this one too.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Default idle spin before a worker parks.
const SPIN_US_DEFAULT: u64 = 500;
/// `state` bit: the current region still admits workers.
const OPEN: usize = 1 << (usize::BITS - 1);
/// Most threads (workers + caller) one region is split over.
const PARTS_MAX: usize = 64;

/// The next unclaimed chunk of one thread's range, alone on its cache line.
#[repr(align(64))]
struct Cursor {
    next: AtomicUsize,
    end: usize,
}

/// One parallel region, held on the caller's stack.
struct Job<'a> {
    body: &'a (dyn Fn(usize) + Sync),
    /// Ranges in use: `cursors[..parts]`.
    parts: usize,
    cursors: [Cursor; PARTS_MAX],
    panicked: AtomicBool,
}

impl<'a> Job<'a> {
    /// `chunks` split into `parts` contiguous ranges.
    fn new(body: &'a (dyn Fn(usize) + Sync), chunks: usize, parts: usize) -> Self {
        Job {
            body,
            parts,
            cursors: std::array::from_fn(|p| Cursor {
                next: AtomicUsize::new(p.min(parts) * chunks / parts),
                end: (p + 1).min(parts) * chunks / parts,
            }),
            panicked: AtomicBool::new(false),
        }
    }
}

/// What the caller and the workers share (leaked: the pool lives forever).
struct Shared {
    /// The open region, or null.
    job: AtomicPtr<Job<'static>>,
    /// `OPEN` while the region admits workers, plus the number inside it.
    state: AtomicUsize,
    /// Bumped once per region: what idle workers watch.
    epoch: AtomicUsize,
    /// Workers parked (or about to park) on `wake`.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    /// Held by the thread whose region is running.
    busy: AtomicBool,
    spin: Duration,
}

struct Pool {
    shared: &'static Shared,
    workers: usize,
}

/// How long an idle worker spins before parking.
pub fn spin_time() -> Duration {
    pool().shared.spin
}

/// Threads that run a region: the workers plus the caller.
pub fn threads() -> usize {
    pool().workers + 1
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let spin_us = std::env::var("MOESTREAM_SPIN_US")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(SPIN_US_DEFAULT);
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            job: AtomicPtr::new(std::ptr::null_mut()),
            state: AtomicUsize::new(0),
            epoch: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            busy: AtomicBool::new(false),
            spin: Duration::from_micros(spin_us),
        }));
        let workers = rayon::current_num_threads().clamp(1, PARTS_MAX) - 1;
        for i in 0..workers {
            std::thread::Builder::new()
                .name(format!("moestream-kernel-{i}"))
                .spawn(move || worker(shared, i + 1))
                .expect("spawning a kernel worker");
        }
        Pool { shared, workers }
    })
}

/// Calls `body(i)` for every `i < chunks`, spread over the caller and the
/// pool's workers; returns when all calls have returned. Runs inline when
/// `chunks <= 1`, the pool has no workers, or another region is running.
/// A panic in `body` is re-raised here after the region has drained.
pub fn run(chunks: usize, body: &(dyn Fn(usize) + Sync)) {
    let pool = pool();
    let sh = pool.shared;
    if chunks <= 1 || pool.workers == 0 || sh.busy.swap(true, Ordering::Acquire) {
        (0..chunks).for_each(body);
        return;
    }
    let job = Job::new(body, chunks, (pool.workers + 1).min(chunks));
    // Only the lifetime is erased: `close` below keeps `job` alive until no
    // worker can reach it.
    sh.job.store(
        (&job as *const Job<'_>).cast::<Job<'static>>().cast_mut(),
        Ordering::Relaxed,
    );
    sh.state.store(OPEN, Ordering::Release);
    sh.epoch.fetch_add(1, Ordering::SeqCst);
    if sh.sleepers.load(Ordering::SeqCst) > 0 {
        let _g = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
        sh.wake.notify_all();
    }
    work(&job, 0);
    close(sh);
    sh.busy.store(false, Ordering::Release);
    if job.panicked.load(Ordering::Relaxed) {
        panic!("a kernel chunk panicked");
    }
}

/// Stops admitting workers and waits for those inside the region to leave.
fn close(sh: &Shared) {
    sh.state.fetch_and(!OPEN, Ordering::AcqRel);
    while sh.state.load(Ordering::Acquire) != 0 {
        std::hint::spin_loop();
    }
    sh.job.store(std::ptr::null_mut(), Ordering::Relaxed);
}

/// Runs thread `me`'s range, then claims what is left of the others'; panics
/// are recorded, not propagated, so a region always drains.
fn work(job: &Job<'_>, me: usize) {
    for k in 0..job.parts {
        let cursor = &job.cursors[(me + k) % job.parts];
        loop {
            let i = cursor.next.fetch_add(1, Ordering::Relaxed);
            if i >= cursor.end {
                break;
            }
            if catch_unwind(AssertUnwindSafe(|| (job.body)(i))).is_err() {
                job.panicked.store(true, Ordering::Relaxed);
            }
        }
    }
}

/// Worker `me` (1-based; the caller is 0).
fn worker(sh: &'static Shared, me: usize) {
    let mut seen = sh.epoch.load(Ordering::Acquire);
    loop {
        seen = wait_for_region(sh, seen);
        if !join(sh) {
            continue;
        }
        // SAFETY: `join` counted this worker into the open region, whose
        // pointer was stored before `state` was opened (the Acquire in `join`
        // makes it visible); the caller's `close` waits for this worker's
        // decrement below before its `Job` goes out of scope.
        let job = unsafe { &*sh.job.load(Ordering::Relaxed) };
        work(job, me);
        sh.state.fetch_sub(1, Ordering::Release);
    }
}

/// Enters the current region if it still admits workers.
fn join(sh: &Shared) -> bool {
    let mut s = sh.state.load(Ordering::Relaxed);
    while s & OPEN != 0 {
        match sh
            .state
            .compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
        {
            Ok(_) => return true,
            Err(now) => s = now,
        }
    }
    false
}

/// Spins, then parks, until the epoch moves past `seen`; returns the new one.
fn wait_for_region(sh: &Shared, seen: usize) -> usize {
    let start = Instant::now();
    let mut k = 0u32;
    loop {
        let e = sh.epoch.load(Ordering::Acquire);
        if e != seen {
            return e;
        }
        if sh.spin.is_zero() || (k.is_multiple_of(256) && start.elapsed() >= sh.spin) {
            break;
        }
        k = k.wrapping_add(1);
        std::hint::spin_loop();
    }
    let mut g = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
    // Dekker pair with `run`: sleepers up, then epoch read (both SeqCst),
    // against `run`'s epoch bump, then sleepers read.
    sh.sleepers.fetch_add(1, Ordering::SeqCst);
    loop {
        let e = sh.epoch.load(Ordering::SeqCst);
        if e != seen {
            sh.sleepers.fetch_sub(1, Ordering::SeqCst);
            return e;
        }
        g = sh.wake.wait(g).unwrap_or_else(|e| e.into_inner());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_runs_once() {
        for chunks in [0usize, 1, 2, 3, 17, 1000] {
            let hits: Vec<AtomicUsize> = (0..chunks).map(|_| AtomicUsize::new(0)).collect();
            run(chunks, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }

    #[test]
    fn concurrent_and_nested_regions_run_inline() {
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..200 {
                        let total = AtomicUsize::new(0);
                        run(8, &|i| {
                            run(3, &|j| {
                                total.fetch_add(i * 3 + j, Ordering::Relaxed);
                            });
                        });
                        assert_eq!(total.load(Ordering::Relaxed), (0..24).sum::<usize>());
                    }
                });
            }
        });
    }

    #[test]
    fn regions_after_parking_still_complete() {
        let total = AtomicUsize::new(0);
        for _ in 0..3 {
            std::thread::sleep(spin_time() + Duration::from_millis(2));
            run(64, &|i| {
                total.fetch_add(i, Ordering::Relaxed);
            });
        }
        assert_eq!(total.load(Ordering::Relaxed), 3 * (0..64).sum::<usize>());
    }

    #[test]
    fn a_panicking_chunk_panics_the_caller_after_draining() {
        let r = catch_unwind(|| {
            run(16, &|i| {
                if i == 5 {
                    panic!("chunk 5");
                }
            })
        });
        assert!(r.is_err());
        // The pool still works.
        let total = AtomicUsize::new(0);
        run(16, &|_| {
            total.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(total.load(Ordering::Relaxed), 16);
    }
}
