//! `Slab`, the result of one read, and `SlabPool`, which recycles the aligned
//! buffers slabs are made of.
//!
//! A slab owns its backing memory and a window `[start, start + len)` into
//! it: a direct read fills the aligned superset of the requested range and
//! the window picks the requested bytes out of it. Invariant: the window lies
//! inside the backing memory, and every byte in it came from the file (a read
//! that ended early never becomes a slab).
//!
//! The pool bounds the bytes it keeps (`pooled_bytes_max`); a buffer returned
//! to a full pool is freed. A slab made from a pooled buffer gives it back
//! when dropped.
//!
//! Fresh memory is expensive here: the first touch of a page costs a kernel
//! fault and a clear (0.5-1.4 GB/s on the virtio machines we measure on,
//! against 18 GB/s for memory already touched), and a read into unfaulted
//! pages pays it inside the read. So the pool recycles, and a caller that
//! knows how many buffers it will hold (the expert cache: slots x layers
//! plus those in flight) can [`SlabPool::warm`] it: a background thread at
//! idle priority faults buffers in ahead of need while compute waits on the
//! disk, up to that many bytes alive, never more.
//!
//! Idle priority means the warmer never takes a core from compute, and also
//! that on a busy machine (a background build on every core) it may not run
//! at all. So the pool tells when warming lags ([`SlabPool::warming_lags`]:
//! no buffer finished for longer than one should take), and a caller that
//! waits on warmed buffers (the expert cache's gate) stops waiting: its
//! reads then fault their own buffers, as they would with no warmer.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::aligned::AlignedBuf;
use crate::error::IoError;

/// The memory behind a slab.
enum Backing {
    /// An aligned buffer (direct, buffered, drop and mmap reads; the ring).
    Aligned(AlignedBuf),
    /// A plain vector (the `pread` mode).
    Heap(Vec<u8>),
}

impl Backing {
    fn as_slice(&self) -> &[u8] {
        match self {
            Backing::Aligned(buf) => buf.as_slice(),
            Backing::Heap(vec) => vec.as_slice(),
        }
    }
}

/// The bytes of one completed read.
pub struct Slab {
    backing: Backing,
    start: usize,
    len: usize,
    pool: Option<Arc<SlabPool>>,
}

impl Slab {
    /// A slab over `buf[start..start + len]`, returned to `pool` on drop.
    /// Panics if the window is outside the buffer (a programmer error).
    pub fn from_aligned(
        buf: AlignedBuf,
        start: usize,
        len: usize,
        pool: Option<Arc<SlabPool>>,
    ) -> Self {
        assert_window(start, len, buf.len());
        Slab {
            backing: Backing::Aligned(buf),
            start,
            len,
            pool,
        }
    }

    /// A slab holding all of `vec`.
    pub fn from_vec(vec: Vec<u8>) -> Self {
        let len = vec.len();
        Slab {
            backing: Backing::Heap(vec),
            start: 0,
            len,
            pool: None,
        }
    }

    /// The requested bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.backing.as_slice()[self.start..self.start + self.len]
    }

    /// Number of requested bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length read.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl AsRef<[u8]> for Slab {
    fn as_ref(&self) -> &[u8] {
        self.bytes()
    }
}

impl std::fmt::Debug for Slab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slab")
            .field("start", &self.start)
            .field("len", &self.len)
            .field("pooled", &self.pool.is_some())
            .finish()
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        let Some(pool) = self.pool.take() else {
            return;
        };
        if let Backing::Aligned(buf) =
            std::mem::replace(&mut self.backing, Backing::Heap(Vec::new()))
        {
            pool.give(buf);
        }
    }
}

fn assert_window(start: usize, len: usize, buf_len: usize) {
    assert!(
        start.checked_add(len).is_some_and(|end| end <= buf_len),
        "slab window [{start}, {start}+{len}) outside buffer of {buf_len} bytes"
    );
}

/// A bounded pool of aligned buffers, shared between threads.
pub struct SlabPool {
    /// Idle bytes kept; raised (never lowered) by [`SlabPool::warm`].
    pooled_bytes_max: AtomicUsize,
    /// Capacity of buffers this pool made and has not freed (idle or out).
    live_bytes: AtomicUsize,
    /// Of those, the buffers of the size class (capacity `class_len`).
    class_live: AtomicUsize,
    /// Fresh allocations made for [`SlabPool::take`] or by warming; a take
    /// of at most this many bytes allocates this many, so every expert
    /// buffer fits every expert read (0: exact sizes).
    class_len: AtomicUsize,
    counters: PoolCounters,
    /// Warming threads running now.
    warming: AtomicUsize,
    /// When warming last made progress (started, or finished a buffer), in
    /// nanoseconds since `born`.
    warm_progress_ns: AtomicU64,
    born: std::time::Instant,
    free: Mutex<FreeList>,
}

/// How long faulting in one buffer may take before warming counts as
/// lagging: a floor for small buffers, plus the buffer's bytes at the
/// slowest fault rate we have measured (0.5 GB/s on virtio machines),
/// halved again for margin.
const WARM_PATIENCE_MIN: std::time::Duration = std::time::Duration::from_millis(50);
const WARM_FAULT_BYTES_PER_S_MIN: u64 = 250_000_000;

/// Whether warming that last progressed `since` ago, with buffers of
/// `len` bytes, lags behind (see [`SlabPool::warming_lags`]).
fn lags(since: std::time::Duration, len: usize) -> bool {
    let per_buffer_ns = (len as u64).saturating_mul(1_000_000_000) / WARM_FAULT_BYTES_PER_S_MIN;
    since > WARM_PATIENCE_MIN + std::time::Duration::from_nanos(per_buffer_ns)
}

#[derive(Default)]
struct PoolCounters {
    takes: AtomicU64,
    fresh_takes: AtomicU64,
    warmed: AtomicU64,
}

/// What a pool has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Buffers handed out by [`SlabPool::take`].
    pub takes: u64,
    /// Of those, the ones no idle buffer fit, so allocated (and faulted in
    /// by the read that used them).
    pub fresh_takes: u64,
    /// Buffers faulted in ahead of need by [`SlabPool::warm`].
    pub warmed: u64,
}

#[derive(Default)]
struct FreeList {
    bufs: Vec<AlignedBuf>,
    bytes: usize,
    /// Of `bufs`, those of the size class.
    class_bufs: usize,
}

impl SlabPool {
    /// A pool keeping at most `pooled_bytes_max` bytes of idle buffers.
    pub fn new(pooled_bytes_max: usize) -> Arc<Self> {
        Arc::new(SlabPool {
            pooled_bytes_max: AtomicUsize::new(pooled_bytes_max),
            live_bytes: AtomicUsize::new(0),
            class_live: AtomicUsize::new(0),
            class_len: AtomicUsize::new(0),
            counters: PoolCounters::default(),
            warming: AtomicUsize::new(0),
            warm_progress_ns: AtomicU64::new(0),
            born: std::time::Instant::now(),
            free: Mutex::new(FreeList::default()),
        })
    }

    /// A buffer of length `len`: the smallest pooled one that fits, else a
    /// fresh allocation. Its contents are unspecified (zeroes or stale data).
    pub fn take(&self, len: usize) -> Result<AlignedBuf, IoError> {
        self.counters.takes.fetch_add(1, Ordering::Relaxed);
        let mut buf = match self.take_pooled(len) {
            Some(buf) => buf,
            None => {
                self.counters.fresh_takes.fetch_add(1, Ordering::Relaxed);
                let class = self.class_len.load(Ordering::Relaxed);
                self.allocate(if len <= class { class } else { len })?
            }
        };
        buf.set_len(len);
        Ok(buf)
    }

    /// Returns a buffer to the pool; frees it if the pool is at its limit.
    pub fn give(&self, buf: AlignedBuf) {
        if buf.capacity() == 0 {
            return;
        }
        let mut free = self.lock();
        if free.bytes + buf.capacity() > self.pooled_bytes_max() {
            drop(free);
            self.free_buf(buf);
            return;
        }
        free.bytes += buf.capacity();
        free.class_bufs += usize::from(self.is_class(&buf));
        free.bufs.push(buf);
    }

    /// Idle buffers of the size class (each one a read that needs no fresh
    /// memory).
    pub fn idle_class_buffers(&self) -> usize {
        self.lock().class_bufs
    }

    /// Makes `len` the size class of fresh allocations and faults in
    /// buffers of that class on a background thread at idle CPU priority,
    /// pooling them, until `count` of them are live (idle or handed out).
    /// Raises the idle limit by their bytes, so nothing warmed (or later
    /// returned) is freed only to be faulted in again. The caller's RAM
    /// plan must cover `count` buffers. The thread stops early when the
    /// pool is dropped. Returns at once.
    pub fn warm(self: &Arc<Self>, len: usize, count: usize) {
        let class_bytes = crate::aligned::align_up(len).saturating_mul(count);
        let _ = self
            .pooled_bytes_max
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |max| {
                Some(max.saturating_add(class_bytes))
            });
        if self.class_len.swap(len, Ordering::Relaxed) != len {
            self.class_live.store(0, Ordering::Relaxed);
            let mut free = self.lock();
            let class = crate::aligned::align_up(len);
            free.class_bufs = free.bufs.iter().filter(|b| b.capacity() == class).count();
        }
        let pool: Weak<SlabPool> = Arc::downgrade(self);
        self.note_warm_progress();
        self.warming.fetch_add(1, Ordering::Relaxed);
        let spawned = std::thread::Builder::new()
            .name("slab-warm".into())
            .spawn(move || {
                warm_loop(&pool, len, count);
                if let Some(pool) = pool.upgrade() {
                    pool.warming.fetch_sub(1, Ordering::Relaxed);
                }
            });
        // Warming is an optimization: without a thread, reads fault their
        // buffers in themselves.
        if spawned.is_err() {
            self.warming.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Whether a warming thread is running but has finished no buffer for
    /// longer than faulting one in should take (the machine's cores are
    /// busy and its idle priority starves it). A caller that waits on
    /// warmed buffers should stop waiting.
    pub fn warming_lags(&self) -> bool {
        if self.warming.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let last = std::time::Duration::from_nanos(self.warm_progress_ns.load(Ordering::Relaxed));
        let since = self.born.elapsed().saturating_sub(last);
        lags(since, self.class_len.load(Ordering::Relaxed))
    }

    fn note_warm_progress(&self) {
        let now = u64::try_from(self.born.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.warm_progress_ns.store(now, Ordering::Relaxed);
    }

    /// Lowers the limit on idle bytes to at most `bytes` (never raises it),
    /// freeing idle buffers beyond it at once. For a caller whose RAM plan
    /// covers only that much idle memory.
    pub fn limit_idle(&self, bytes: usize) {
        let _ = self
            .pooled_bytes_max
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |max| {
                Some(max.min(bytes))
            });
        let mut free = self.lock();
        while free.bytes > bytes {
            let Some(buf) = free.bufs.pop() else { break };
            free.bytes -= buf.capacity();
            free.class_bufs -= usize::from(self.is_class(&buf));
            drop(free);
            self.free_buf(buf);
            free = self.lock();
        }
    }

    /// Blocks until every warming thread is done (for measurements that
    /// want all the memory in place first, such as a warm-decode
    /// benchmark); at most `timeout`. Returns whether warming finished.
    pub fn wait_warmed(&self, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        while self.warming.load(Ordering::Relaxed) > 0 {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        true
    }

    /// What the pool has done so far.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            takes: self.counters.takes.load(Ordering::Relaxed),
            fresh_takes: self.counters.fresh_takes.load(Ordering::Relaxed),
            warmed: self.counters.warmed.load(Ordering::Relaxed),
        }
    }

    /// Bytes of idle buffers held now.
    pub fn pooled_bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Capacity of the buffers this pool made and has not freed.
    pub fn live_bytes(&self) -> usize {
        self.live_bytes.load(Ordering::Relaxed)
    }

    /// The limit on idle bytes.
    pub fn pooled_bytes_max(&self) -> usize {
        self.pooled_bytes_max.load(Ordering::Relaxed)
    }

    fn allocate(&self, len: usize) -> Result<AlignedBuf, IoError> {
        let buf = AlignedBuf::new(len)?;
        self.live_bytes.fetch_add(buf.capacity(), Ordering::Relaxed);
        if self.is_class(&buf) {
            self.class_live.fetch_add(1, Ordering::Relaxed);
        }
        Ok(buf)
    }

    fn is_class(&self, buf: &AlignedBuf) -> bool {
        buf.capacity() == crate::aligned::align_up(self.class_len.load(Ordering::Relaxed))
    }

    /// Frees a buffer (saturating: a buffer made elsewhere and given to
    /// the pool was never counted live).
    fn free_buf(&self, buf: AlignedBuf) {
        let cap = buf.capacity();
        let _ = self
            .live_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |live| {
                Some(live.saturating_sub(cap))
            });
        if self.is_class(&buf) {
            let _ = self
                .class_live
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    Some(n.saturating_sub(1))
                });
        }
        drop(buf);
    }

    /// The smallest idle buffer that fits `len`: a class buffer when `len`
    /// fits the class (found from the end in O(1) when, as usual, the idle
    /// buffers are all of the class), else the smallest that fits.
    fn take_pooled(&self, len: usize) -> Option<AlignedBuf> {
        let class = crate::aligned::align_up(self.class_len.load(Ordering::Relaxed));
        let mut free = self.lock();
        let pick = if len <= class && free.class_bufs > 0 {
            free.bufs.iter().rposition(|b| b.capacity() == class)
        } else {
            None
        };
        let best = pick.or_else(|| {
            free.bufs
                .iter()
                .enumerate()
                .filter(|(_, buf)| buf.capacity() >= len)
                .min_by_key(|(_, buf)| buf.capacity())
                .map(|(i, _)| i)
        })?;
        let buf = free.bufs.swap_remove(best);
        free.bytes -= buf.capacity();
        free.class_bufs -= usize::from(buf.capacity() == class && class > 0);
        Some(buf)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FreeList> {
        // A panic while holding the lock leaves the list consistent (every
        // mutation is a single push/remove plus counter update), so recover.
        self.free
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The body of [`SlabPool::warm`]'s thread.
fn warm_loop(pool: &Weak<SlabPool>, len: usize, count: usize) {
    set_idle_priority();
    loop {
        let Some(pool) = pool.upgrade() else { return };
        if len == 0 || pool.class_live.load(Ordering::Relaxed) >= count {
            return;
        }
        let Ok(mut buf) = pool.allocate(len) else {
            return;
        };
        buf.prefault();
        pool.counters.warmed.fetch_add(1, Ordering::Relaxed);
        pool.note_warm_progress();
        pool.give(buf);
    }
}

/// Runs the calling thread only when a core would otherwise idle.
fn set_idle_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: changes only the calling thread's (pid 0) scheduling policy,
    // with a valid parameter for SCHED_IDLE. Failure leaves it as it was.
    unsafe {
        libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
    }
}

impl std::fmt::Debug for SlabPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlabPool")
            .field("pooled_bytes", &self.pooled_bytes())
            .field("pooled_bytes_max", &self.pooled_bytes_max())
            .field("live_bytes", &self.live_bytes())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slab_windows_into_buffer() {
        let mut buf = AlignedBuf::new(8192).unwrap();
        for (i, b) in buf.as_mut_slice().iter_mut().enumerate() {
            *b = i as u8;
        }
        let slab = Slab::from_aligned(buf, 100, 3, None);
        assert_eq!(slab.bytes(), &[100, 101, 102]);
        assert_eq!(slab.len(), 3);
    }

    #[test]
    #[should_panic(expected = "outside buffer")]
    fn window_outside_buffer_panics() {
        let buf = AlignedBuf::new(10).unwrap();
        let _ = Slab::from_aligned(buf, 8, 3, None);
    }

    #[test]
    fn vec_slab() {
        let slab = Slab::from_vec(vec![1, 2, 3]);
        assert_eq!(slab.bytes(), &[1, 2, 3]);
    }

    #[test]
    fn limit_idle_frees_beyond_the_limit_and_keeps_it() {
        let pool = SlabPool::new(1 << 20);
        let bufs: Vec<_> = (0..4).map(|_| pool.take(8192).unwrap()).collect();
        bufs.into_iter().for_each(|b| pool.give(b));
        assert_eq!(
            (pool.pooled_bytes(), pool.live_bytes()),
            (4 * 8192, 4 * 8192)
        );
        pool.limit_idle(2 * 8192);
        assert_eq!(
            (pool.pooled_bytes(), pool.live_bytes()),
            (2 * 8192, 2 * 8192)
        );
        let fresh: Vec<_> = (0..3).map(|_| pool.take(8192).unwrap()).collect();
        fresh.into_iter().for_each(|b| pool.give(b));
        assert_eq!(pool.pooled_bytes(), 2 * 8192, "the lower limit stays");
        pool.limit_idle(1 << 30);
        assert_eq!(pool.pooled_bytes_max(), 2 * 8192, "never raised");
    }

    #[test]
    fn pool_recycles_dropped_slabs() {
        let pool = SlabPool::new(1 << 20);
        let buf = pool.take(5000).unwrap();
        assert_eq!(buf.capacity(), 8192);
        let slab = Slab::from_aligned(buf, 0, 5000, Some(pool.clone()));
        drop(slab);
        assert_eq!(pool.pooled_bytes(), 8192);
        let again = pool.take(6000).unwrap();
        assert_eq!(again.capacity(), 8192);
        assert_eq!(again.len(), 6000);
        assert_eq!(pool.pooled_bytes(), 0);
    }

    #[test]
    fn pool_picks_smallest_fit() {
        let pool = SlabPool::new(1 << 20);
        pool.give(AlignedBuf::new(3 * 4096).unwrap());
        pool.give(AlignedBuf::new(4096).unwrap());
        pool.give(AlignedBuf::new(2 * 4096).unwrap());
        assert_eq!(pool.take(4097).unwrap().capacity(), 2 * 4096);
        assert_eq!(pool.take(1).unwrap().capacity(), 4096);
        assert_eq!(pool.pooled_bytes(), 3 * 4096);
    }

    #[test]
    fn warm_pool_serves_takes_without_fresh_allocations() {
        let pool = SlabPool::new(0);
        let len = 3 * 4096 + 1;
        pool.warm(len, 5);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while pool.stats().warmed < 5 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(pool.wait_warmed(std::time::Duration::from_secs(20)));
        assert_eq!(pool.stats().warmed, 5, "warming stops at the live target");
        assert_eq!(pool.idle_class_buffers(), 5);
        assert_eq!(pool.live_bytes(), 5 * 4 * 4096);
        assert_eq!(pool.pooled_bytes_max(), 5 * 4 * 4096);
        let bufs: Vec<_> = (0..5).map(|i| pool.take(len - i).unwrap()).collect();
        assert_eq!(pool.stats().fresh_takes, 0);
        // Past the target a take allocates, in the size class.
        assert_eq!(pool.take(10).unwrap().capacity(), 4 * 4096);
        assert_eq!(pool.stats().fresh_takes, 1);
        drop(bufs);
    }

    #[test]
    fn warming_lags_only_past_its_patience_for_the_buffer_size() {
        use std::time::Duration;
        assert!(!lags(Duration::from_millis(10), 4096));
        assert!(lags(Duration::from_millis(60), 4096));
        // A 19 MB expert buffer may take 76 ms at the slowest fault rate.
        assert!(!lags(Duration::from_millis(100), 19 << 20));
        assert!(lags(Duration::from_millis(200), 19 << 20));
        let pool = SlabPool::new(0);
        assert!(!pool.warming_lags(), "no warming thread, nothing lags");
    }

    #[test]
    fn pool_respects_byte_limit() {
        let pool = SlabPool::new(8192);
        pool.give(AlignedBuf::new(4096).unwrap());
        pool.give(AlignedBuf::new(4096).unwrap());
        pool.give(AlignedBuf::new(4096).unwrap());
        assert_eq!(pool.pooled_bytes(), 8192);
        let zero = SlabPool::new(0);
        zero.give(AlignedBuf::new(1).unwrap());
        assert_eq!(zero.pooled_bytes(), 0);
    }
}
