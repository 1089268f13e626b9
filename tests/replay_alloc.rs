//! The replay allocates nothing per access: simulating a layer of N
//! fetches and one of 4N allocates the same number of times, for every
//! policy and prefetch mode (a counting global allocator proves it). It
//! counts the measuring thread's allocations only: the test harness's own
//! threads allocate when they please (a count of 13 against 9 was seen on
//! a loaded machine).

use moestream::formats::trace::read::{Fetch, LayerTrace, Run};
use moestream::lab::replay::{simulate, Prefetch, Slots};
use moestream::store::policy::NAMES;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

/// Counts every allocation and reallocation of a thread that asks it to.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Whether this thread's allocations are counted (const-initialized
    /// and without a destructor, so reading it never allocates).
    static COUNTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn count() {
    if COUNTED.with(|c| c.get()) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counter is a relaxed atomic, which does not allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract is passed through.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract is passed through.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: the caller's contract is passed through.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed through.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// One layer of 64 experts, `fetches` single-token fetches of top-4
/// pseudo-random experts, each with a guess.
fn run(fetches: usize) -> Run {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut l = LayerTrace {
        n_experts: 64,
        expert_bytes: 1 << 20,
        ..LayerTrace::default()
    };
    for t in 0..fetches {
        let mut pick: Vec<usize> = (0..4)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % 64) as usize
            })
            .collect();
        pick.sort_unstable();
        pick.dedup();
        let (i0, r0, g0, p0) = (l.ids.len(), l.rows.len(), l.guesses.len(), l.picks.len());
        l.ids.extend_from_slice(&pick);
        l.picks.extend_from_slice(&pick);
        l.rows.push(p0..l.picks.len());
        l.guesses.extend(pick.iter().map(|e| (e + 1) % 64));
        l.fetches.push(Fetch {
            clock: t as u64,
            slots: 8,
            ids: i0..l.ids.len(),
            rows: r0..l.rows.len(),
            guess: [Some(g0..l.guesses.len()), None],
            deeper: [None, None],
        });
    }
    l.next = (0..l.ids.len()).map(|k| (k as u64 / 4) + 3).collect();
    Run {
        id: "r".into(),
        tokens: fetches as u64,
        layers: vec![l],
        ..Run::default()
    }
}

fn allocations(f: impl FnOnce()) -> u64 {
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    COUNTED.with(|c| c.set(true));
    f();
    COUNTED.with(|c| c.set(false));
    ALLOCATIONS.load(Ordering::Relaxed) - before
}

#[test]
fn the_simulation_allocates_per_layer_not_per_access() {
    let (short, long) = (run(500), run(2000));
    for name in NAMES {
        for prefetch in [Prefetch::None, Prefetch::ATTN, Prefetch::Oracle] {
            for slots in [Slots::Fixed(8), Slots::Traced] {
                let a = allocations(|| {
                    simulate(std::slice::from_ref(&short), name, slots, prefetch);
                });
                let b = allocations(|| {
                    simulate(std::slice::from_ref(&long), name, slots, prefetch);
                });
                assert_eq!(a, b, "{name} {prefetch:?} {slots:?}: {a} vs {b}");
            }
        }
    }
}
