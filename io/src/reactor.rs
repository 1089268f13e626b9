//! `Reactor`: batches of reads through io_uring, returned in completion
//! order; or a stream of reads pulled one at a time as slots free up
//! ([`Reactor::submit_stream_with`]), which keeps the queue full without
//! knowing the requests in advance.
//!
//! Buffer ownership: every in-flight read is an [`Op`] that owns its aligned
//! buffer and an `Arc` of its file. While the kernel may write into the
//! buffer, the op sits in `slots[user_data]`; it leaves the slot only when
//! its completion is reaped (or, on a fatal ring error, it is leaked so the
//! memory and descriptor stay valid forever). No borrowed slice is ever
//! handed to the kernel.
//!
//! Backpressure: at most `depth` reads, and at most `inflight_bytes_max`
//! bytes (one larger read may go alone), are in the kernel. The rest wait,
//! in FIFO order, in `parked`. Completions are first reaped into a list and
//! handled after the reap loop.
//!
//! Priorities: reads are [`Priority::Demand`] (compute waits on them) or
//! [`Priority::Prefetch`] (speculative). Prefetch reads wait in their own
//! FIFO, enter the kernel only while no demand read is parked, and at most
//! `prefetch_depth` of them are in the kernel at once, so a demand read
//! never queues behind more than that many. A parked prefetch read can be
//! promoted to demand (compute now needs it) or cancelled (it is no longer
//! wanted); a read already in the kernel finishes either way.
//!
//! Short reads: a read that returns fewer bytes than asked is resubmitted
//! for the remainder (parked at the front); a read that hits the end of the
//! file before the requested range ends is an [`IoError::ShortRead`].
//!
//! Counters: `queued()` is the number of parked reads, `in_kernel()` the
//! number submitted and not yet reaped; both are zero between batches and
//! streams.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;

use crate::aligned::{AlignedBuf, ALIGN};
use crate::error::IoError;
use crate::file::{DirectSpan, OpenFile};
use crate::ring::{Completion, Ring};
use crate::slab::{Slab, SlabPool};

/// Limits of a [`Reactor`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReactorConfig {
    /// Submission queue entries, and the bound on reads in the kernel.
    pub depth: u32,
    /// Longest single kernel read; longer requests are read in chunks. A
    /// multiple of 4096, at most `u32::MAX` rounded down.
    pub read_chunk_bytes_max: usize,
    /// Bytes the kernel may be reading at once; further reads wait parked
    /// (a single read larger than this still goes, alone).
    pub inflight_bytes_max: usize,
    /// Prefetch reads in the kernel at once (at least 1).
    pub prefetch_depth: u32,
}

impl Default for ReactorConfig {
    fn default() -> Self {
        ReactorConfig {
            depth: 64,
            read_chunk_bytes_max: 1 << 30,
            inflight_bytes_max: 256 << 20,
            prefetch_depth: 2,
        }
    }
}

/// Whether compute waits on a read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Priority {
    /// Compute is blocked until it lands.
    Demand,
    /// Speculative: yields to every parked demand read.
    Prefetch,
}

/// One requested read. `tag` comes back with the result.
#[derive(Clone, Debug)]
pub struct ReadReq {
    pub tag: u64,
    pub file: Arc<OpenFile>,
    pub offset: u64,
    pub len: usize,
}

/// The result of one read, keyed by its request's tag.
pub type ReadDone = (u64, Result<Slab, IoError>);

/// A fault injector for tests: sees every completion as `(tag, result)`
/// (bytes read, or a negated errno) and returns the result the reactor
/// should act on. It may shorten a read (the kernel did fill the bytes; the
/// reactor re-reads the rest, so correctness is unaffected) or turn it into
/// an error such as `-EIO`, `-EINTR` or `-EAGAIN`. It must never claim
/// more bytes than the kernel reported.
pub type FaultInjector = Box<dyn FnMut(u64, i32) -> i32 + Send>;

/// An io_uring reactor with a fixed queue depth.
pub struct Reactor {
    ring: Ring,
    config: ReactorConfig,
    pool: Arc<SlabPool>,
    /// In-flight ops, indexed by the SQE's `user_data`.
    slots: Vec<Option<Op>>,
    free_slots: Vec<usize>,
    parked: VecDeque<Op>,
    /// Prefetch reads waiting; they enter only while `parked` is empty.
    parked_prefetch: VecDeque<Op>,
    /// Prefetch reads in the kernel.
    prefetch_in_kernel: usize,
    completions: Vec<Completion>,
    in_kernel: usize,
    /// Bytes of the reads in the kernel, and each slot's share of it.
    kernel_bytes: usize,
    slot_bytes: Vec<usize>,
    peak_kernel_bytes: usize,
    resubmits: u64,
    /// Set when a fatal ring error left ops in the kernel; the reactor then
    /// refuses further batches.
    broken: bool,
    faults: Option<FaultInjector>,
}

/// An in-flight read: owns its buffer and keeps its file open.
struct Op {
    tag: u64,
    file: Arc<OpenFile>,
    buf: AlignedBuf,
    /// The requested range.
    offset: u64,
    len: usize,
    /// What is read into `buf`: from `span.read_offset`, `buf.len()` bytes.
    span: DirectSpan,
    /// Bytes of `buf` filled so far.
    done: usize,
    priority: Priority,
}

/// What a completion means for its op.
enum Step {
    Done(u64, Slab),
    Failed(u64, IoError),
    Again(Op),
}

impl Reactor {
    /// Checks that io_uring with `IORING_OP_READ` works here, so callers can
    /// choose the synchronous [`crate::RangeReader`] path instead.
    pub fn probe() -> Result<(), IoError> {
        Ring::new(2).map(drop)
    }

    /// Creates a reactor, or [`IoError::RingUnavailable`] when io_uring
    /// cannot be used.
    pub fn new(config: ReactorConfig, pool: Arc<SlabPool>) -> Result<Self, IoError> {
        assert!(config.depth > 0, "reactor depth must be positive");
        assert!(config.prefetch_depth > 0, "prefetch depth must be positive");
        assert!(
            config.read_chunk_bytes_max >= ALIGN
                && config.read_chunk_bytes_max.is_multiple_of(ALIGN)
                && config.read_chunk_bytes_max <= u32::MAX as usize,
            "read_chunk_bytes_max {} must be a multiple of {ALIGN} in [{ALIGN}, u32::MAX]",
            config.read_chunk_bytes_max
        );
        let ring = Ring::new(config.depth)?;
        let depth = config.depth as usize;
        Ok(Reactor {
            ring,
            config,
            pool,
            slots: (0..depth).map(|_| None).collect(),
            free_slots: (0..depth).rev().collect(),
            parked: VecDeque::new(),
            parked_prefetch: VecDeque::new(),
            prefetch_in_kernel: 0,
            completions: Vec::with_capacity(depth),
            in_kernel: 0,
            kernel_bytes: 0,
            slot_bytes: vec![0; depth],
            peak_kernel_bytes: 0,
            resubmits: 0,
            broken: false,
            faults: None,
        })
    }

    /// Installs (or removes) a fault injector (see [`FaultInjector`]): the
    /// fault-test harness's hook.
    pub fn set_fault_injector(&mut self, faults: Option<FaultInjector>) {
        self.faults = faults;
    }

    /// The reactor's limits.
    pub fn config(&self) -> ReactorConfig {
        self.config
    }

    /// Reads waiting for a submission slot (both priorities).
    pub fn queued(&self) -> usize {
        self.parked.len() + self.parked_prefetch.len()
    }

    /// Nothing parked and nothing in the kernel.
    pub fn is_idle(&self) -> bool {
        self.queued() == 0 && self.in_kernel == 0
    }

    /// Reads submitted to the kernel and not yet reaped.
    pub fn in_kernel(&self) -> usize {
        self.in_kernel
    }

    /// The most bytes the kernel was reading at once so far.
    pub fn peak_kernel_bytes(&self) -> usize {
        self.peak_kernel_bytes
    }

    /// Reads resubmitted after a short read, since creation.
    pub fn resubmits(&self) -> u64 {
        self.resubmits
    }

    /// Runs every request to completion and returns one result per request,
    /// in completion order (requests rejected before I/O come first). The
    /// outer error is a fatal ring failure; the reactor is then unusable.
    pub fn submit_batch(&mut self, reqs: Vec<ReadReq>) -> Result<Vec<ReadDone>, IoError> {
        let mut out = Vec::with_capacity(reqs.len());
        self.submit_batch_with(reqs, |d| out.push(d))?;
        Ok(out)
    }

    /// Like [`Reactor::submit_batch`], but hands each result to `on_done` as
    /// soon as its completion is reaped, so the caller can consume slabs in
    /// completion order while later reads are still in flight. On a fatal
    /// ring error some results may already have been handed over.
    pub fn submit_batch_with(
        &mut self,
        reqs: Vec<ReadReq>,
        mut on_done: impl FnMut(ReadDone),
    ) -> Result<(), IoError> {
        self.check_usable("submit_batch")?;
        let mut done = Vec::with_capacity(reqs.len());
        for req in reqs {
            self.enqueue(req, Priority::Demand, &mut done);
        }
        done.drain(..).for_each(&mut on_done);
        while !self.is_idle() {
            self.step(&mut done)?;
            done.drain(..).for_each(&mut on_done);
        }
        Ok(())
    }

    /// Reads a stream of requests while keeping up to `depth` of them
    /// outstanding: whenever fewer than `depth` pulled reads are unfinished
    /// it pulls the next request from `next` (which returns `None` to end
    /// the stream), so a freed slot is refilled as soon as its completion
    /// is reaped, and a pulled request enters the kernel in the same
    /// round. Each result goes to `on_done` as soon as it is reaped.
    /// Returns once `next` has returned `None` and every pulled read is
    /// done. Errors as [`Reactor::submit_batch_with`].
    pub fn submit_stream_with(
        &mut self,
        mut next: impl FnMut() -> Option<ReadReq>,
        mut on_done: impl FnMut(ReadDone),
    ) -> Result<(), IoError> {
        self.check_usable("submit_stream_with")?;
        let depth = self.config.depth as usize;
        let mut done = Vec::with_capacity(depth);
        let mut open = true;
        loop {
            while open && self.queued() + self.in_kernel < depth {
                match next() {
                    Some(req) => self.enqueue(req, Priority::Demand, &mut done),
                    None => open = false,
                }
                // Requests finished without I/O (rejected ranges) go out
                // at once, so `next` sees their results before pulling on.
                done.drain(..).for_each(&mut on_done);
            }
            if self.is_idle() {
                if open {
                    continue;
                }
                return Ok(());
            }
            self.step(&mut done)?;
            done.drain(..).for_each(&mut on_done);
        }
    }

    /// Refuses work after a fatal ring error.
    fn check_usable(&self, op: &'static str) -> Result<(), IoError> {
        if self.broken {
            return Err(IoError::Ring {
                op,
                source: io::Error::other("reactor abandoned its ops after a ring failure"),
            });
        }
        Ok(())
    }

    /// Queues one read at `priority` without waiting. A request that fails
    /// before any I/O (a range outside the file, no buffer) lands in `done`
    /// at once; the rest complete through [`Reactor::step`].
    pub fn enqueue(&mut self, req: ReadReq, priority: Priority, done: &mut Vec<ReadDone>) {
        if let Err(e) = req.file.check_range(req.offset, req.len) {
            done.push((req.tag, Err(e)));
            return;
        }
        let span = if req.file.is_direct() {
            DirectSpan::covering(req.offset, req.len)
        } else {
            DirectSpan::exact(req.offset, req.len)
        };
        let buf = match self.pool.take(span.read_len) {
            Ok(buf) => buf,
            Err(e) => return done.push((req.tag, Err(e))),
        };
        let op = Op {
            tag: req.tag,
            file: req.file,
            buf,
            offset: req.offset,
            len: req.len,
            span,
            done: 0,
            priority,
        };
        if op.is_complete() {
            return done.push((op.tag, Ok(op.into_slab(&self.pool))));
        }
        match priority {
            Priority::Demand => self.parked.push_back(op),
            Priority::Prefetch => self.parked_prefetch.push_back(op),
        }
    }

    /// Submits what the limits allow, waits for at least one completion
    /// (unless idle) and appends the finished reads to `done`. A fatal ring
    /// error leaves the reactor unusable.
    pub fn step(&mut self, done: &mut Vec<ReadDone>) -> Result<(), IoError> {
        self.check_usable("step")?;
        if self.is_idle() {
            return Ok(());
        }
        self.fill();
        if let Err(e) = self.ring.submit_and_wait(1) {
            self.abandon();
            return Err(e);
        }
        self.reap(done);
        Ok(())
    }

    /// Moves every parked prefetch read whose tag satisfies `pred` to the
    /// back of the demand queue; returns how many moved.
    pub fn promote(&mut self, mut pred: impl FnMut(u64) -> bool) -> usize {
        let mut moved = 0;
        let mut keep = VecDeque::with_capacity(self.parked_prefetch.len());
        for mut op in self.parked_prefetch.drain(..) {
            if pred(op.tag) {
                op.priority = Priority::Demand;
                self.parked.push_back(op);
                moved += 1;
            } else {
                keep.push_back(op);
            }
        }
        self.parked_prefetch = keep;
        moved
    }

    /// Drops every parked prefetch read whose tag satisfies `pred` (its
    /// buffer goes back to the pool); returns the tags and lengths dropped.
    pub fn cancel(&mut self, mut pred: impl FnMut(u64) -> bool) -> Vec<(u64, usize)> {
        let mut dropped = Vec::new();
        let mut keep = VecDeque::with_capacity(self.parked_prefetch.len());
        for op in self.parked_prefetch.drain(..) {
            if pred(op.tag) {
                dropped.push((op.tag, op.len));
                self.pool.give(op.buf);
            } else {
                keep.push_back(op);
            }
        }
        self.parked_prefetch = keep;
        dropped
    }

    /// Moves parked ops into the submission queue, oldest first, while
    /// fewer than `depth` are in the kernel.
    fn fill(&mut self) {
        while self.in_kernel < self.config.depth as usize {
            let prefetch_open = self.prefetch_in_kernel < self.config.prefetch_depth as usize;
            let (op, from_prefetch) = match self.parked.pop_front() {
                Some(op) => (op, false),
                None if prefetch_open => match self.parked_prefetch.pop_front() {
                    Some(op) => (op, true),
                    None => break,
                },
                None => break,
            };
            let next = (op.buf.len() - op.done).min(self.config.read_chunk_bytes_max);
            if self.in_kernel > 0 && self.kernel_bytes + next > self.config.inflight_bytes_max {
                self.park_front(op, from_prefetch);
                break;
            }
            let slot = self
                .free_slots
                .pop()
                .expect("a free slot when in_kernel < depth");
            let op = self.slots[slot].insert(op);
            let (buf, len, offset) = op.next_chunk(self.config.read_chunk_bytes_max);
            // SAFETY: `buf` points into the op's own heap buffer with `len`
            // bytes left in it, and the op (owning the buffer and an `Arc`
            // keeping the descriptor open) stays in `slots[slot]` until the
            // completion tagged `slot` is reaped in `reap`, or is leaked by
            // `abandon`.
            let pushed = unsafe {
                self.ring
                    .push_read(op.file.fd(), buf, len, offset, slot as u64)
            };
            if !pushed {
                let op = self.slots[slot].take().expect("op just inserted");
                self.free_slots.push(slot);
                self.park_front(op, from_prefetch);
                break;
            }
            self.in_kernel += 1;
            if op.priority == Priority::Prefetch {
                self.prefetch_in_kernel += 1;
            }
            self.slot_bytes[slot] = len as usize;
            self.kernel_bytes += len as usize;
            self.peak_kernel_bytes = self.peak_kernel_bytes.max(self.kernel_bytes);
        }
    }

    /// Returns an op to the front of the queue of its priority.
    fn park_front(&mut self, op: Op, prefetch: bool) {
        if prefetch && op.priority == Priority::Prefetch {
            self.parked_prefetch.push_front(op);
        } else {
            self.parked.push_front(op);
        }
    }

    /// Reaps completions into a list, then handles each.
    fn reap(&mut self, done: &mut Vec<ReadDone>) {
        let mut completions = std::mem::take(&mut self.completions);
        self.ring.reap(&mut completions);
        for completion in completions.drain(..) {
            let slot = completion.user_data as usize;
            let op = self.slots[slot]
                .take()
                .expect("completion for an empty slot");
            self.free_slots.push(slot);
            self.in_kernel -= 1;
            if op.priority == Priority::Prefetch {
                self.prefetch_in_kernel -= 1;
            }
            self.kernel_bytes -= std::mem::take(&mut self.slot_bytes[slot]);
            let result = match &mut self.faults {
                Some(f) => {
                    let r = f(op.tag, completion.result);
                    assert!(
                        r <= completion.result.max(0),
                        "a fault injector may not claim bytes the kernel did not read"
                    );
                    r
                }
                None => completion.result,
            };
            match op.advance(result, &self.pool) {
                Step::Done(tag, slab) => done.push((tag, Ok(slab))),
                Step::Failed(tag, e) => done.push((tag, Err(e))),
                Step::Again(op) => {
                    self.resubmits += 1;
                    let prefetch = op.priority == Priority::Prefetch;
                    self.park_front(op, prefetch);
                }
            }
        }
        self.completions = completions;
    }

    /// Leaks every op the kernel may still touch, so their buffers and
    /// descriptors stay valid, and marks the reactor unusable.
    fn abandon(&mut self) {
        for slot in self.slots.iter_mut() {
            if let Some(op) = slot.take() {
                std::mem::forget(op);
            }
        }
        self.parked.clear();
        self.parked_prefetch.clear();
        self.in_kernel = 0;
        self.prefetch_in_kernel = 0;
        self.kernel_bytes = 0;
        self.broken = true;
    }
}

impl Drop for Reactor {
    fn drop(&mut self) {
        // Only reachable with ops in flight if a panic unwound out of
        // `submit_batch`; the ring closes after this, but the kernel may
        // still write into their buffers until then.
        if self.in_kernel > 0 {
            self.abandon();
        }
    }
}

impl Op {
    /// Bytes of `buf` that must be filled: up to the end of the window.
    fn needed(&self) -> usize {
        self.span.start + self.len
    }

    fn is_complete(&self) -> bool {
        self.done >= self.needed()
    }

    /// The next kernel read: (buffer address, length, file offset).
    fn next_chunk(&mut self, chunk_bytes_max: usize) -> (*mut u8, u32, u64) {
        let remaining = self.buf.len() - self.done;
        let len = remaining.min(chunk_bytes_max) as u32;
        let buf = self.buf.as_mut_ptr().wrapping_add(self.done);
        (buf, len, self.span.read_offset + self.done as u64)
    }

    /// Applies a completion result.
    fn advance(mut self, result: i32, pool: &Arc<SlabPool>) -> Step {
        if result < 0 {
            let err = io::Error::from_raw_os_error(-result);
            if matches!(-result, libc::EINTR | libc::EAGAIN) {
                return Step::Again(self);
            }
            let e = IoError::os(
                "io_uring read",
                self.file.path(),
                self.offset,
                self.len,
                err,
            );
            return self.fail(e, pool);
        }
        self.done += result as usize;
        if self.is_complete() {
            let tag = self.tag;
            return Step::Done(tag, self.into_slab(pool));
        }
        let at_eof = result == 0 || (self.file.is_direct() && !self.done.is_multiple_of(ALIGN));
        if at_eof {
            let got = self.done.saturating_sub(self.span.start);
            let e = self.file.short_read(self.offset, self.len, got);
            return self.fail(e, pool);
        }
        Step::Again(self)
    }

    fn fail(self, e: IoError, pool: &Arc<SlabPool>) -> Step {
        pool.give(self.buf);
        Step::Failed(self.tag, e)
    }

    fn into_slab(self, pool: &Arc<SlabPool>) -> Slab {
        Slab::from_aligned(self.buf, self.span.start, self.len, Some(pool.clone()))
    }
}
