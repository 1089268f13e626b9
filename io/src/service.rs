//! `ReactorService`: a dedicated thread that owns a [`Reactor`] and serves
//! batches of reads sent over a crossbeam channel, streaming each result
//! back on the batch's own channel as its completion is reaped. Compute
//! threads never touch the ring.
//!
//! Batches are not served one after another: every queued read of every
//! batch competes for the kernel, demand reads first (see
//! [`Priority`]). A prefetch batch can later be promoted (compute now waits
//! on it) or cancelled (its parked reads are dropped, each answered with
//! [`BatchEvent::Cancelled`]). The thread blocks on the channel only when
//! the reactor is idle; while reads are in flight it picks up new messages
//! between completions.
//!
//! Counters (shared atomics): time the reactor was busy (any read in the
//! kernel or parked) and bytes completed per priority, so callers can
//! report disk utilisation, overlap and prefetch waste.
//!
//! Dropping the service closes the request channel; the thread finishes
//! the reads in hand and exits, and the drop joins it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam::channel::{self, Receiver, Sender, TryRecvError};

use crate::error::IoError;
use crate::reactor::{Priority, Reactor, ReadDone, ReadReq};

/// What a batch's channel carries.
#[derive(Debug)]
pub enum BatchEvent {
    /// One read's result (tag and slab, or its error).
    Done(ReadDone),
    /// A read of a cancelled batch that was dropped before any I/O.
    Cancelled(u64),
    /// The ring failed; no further results of this batch will come.
    Failed(IoError),
}

/// A submitted batch: its results channel and its id (for promote/cancel).
pub struct Batch {
    pub id: u64,
    pub events: Receiver<BatchEvent>,
}

pub(crate) enum Msg<R> {
    Submit {
        id: u64,
        reqs: Vec<R>,
        priority: Priority,
        reply: Sender<BatchEvent>,
    },
    Promote(u64),
    Cancel(u64),
}

/// The caller's side of a read service running on its own thread: sends
/// batches (`R`: one read request) and promote/cancel messages over a
/// channel, numbers the batches, shares the thread's counters, and joins
/// the thread on drop (after closing the channel, so it drains first). The
/// reactor service and the reader thread both use it.
pub(crate) struct Client<R> {
    tx: Option<Sender<Msg<R>>>,
    thread: Option<JoinHandle<()>>,
    next_id: AtomicU64,
    counters: Arc<ReadCounters>,
    /// The thread, as errors name it ("the reactor thread").
    what: &'static str,
}

impl<R: Send + 'static> Client<R> {
    /// Starts `body` on a thread named `name`, with the request channel
    /// and the counters it updates.
    pub(crate) fn spawn(
        name: &str,
        what: &'static str,
        body: impl FnOnce(Receiver<Msg<R>>, Arc<ReadCounters>) + Send + 'static,
    ) -> std::io::Result<Client<R>> {
        let (tx, rx) = channel::unbounded::<Msg<R>>();
        let counters = Arc::new(ReadCounters::default());
        let c = counters.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || body(rx, c))?;
        Ok(Client {
            tx: Some(tx),
            thread: Some(thread),
            next_id: AtomicU64::new(0),
            counters,
            what,
        })
    }

    /// Sends a batch at `priority`; a thread that has exited answers with
    /// one `Failed` on the batch's channel.
    pub(crate) fn submit_at(&self, reqs: Vec<R>, priority: Priority) -> Batch {
        let (reply, events) = channel::unbounded();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let reads = reqs.len();
        self.counters.add_submitted(reads);
        let msg = Msg::Submit {
            id,
            reqs,
            priority,
            reply,
        };
        if let Err(channel::SendError(Msg::Submit { reply, .. })) = self.sender().send(msg) {
            self.counters.add_answered(reads);
            let _ = reply.send(BatchEvent::Failed(IoError::Ring {
                op: "submit",
                source: std::io::Error::other(format!("{} has exited", self.what)),
            }));
        }
        Batch { id, events }
    }

    /// Raises a prefetch batch to demand priority.
    pub(crate) fn promote(&self, batch: u64) {
        let _ = self.sender().send(Msg::Promote(batch));
    }

    /// Drops a prefetch batch's reads not yet started.
    pub(crate) fn cancel(&self, batch: u64) {
        let _ = self.sender().send(Msg::Cancel(batch));
    }

    /// The counters so far.
    pub(crate) fn counters(&self) -> ServiceCounters {
        self.counters.snapshot()
    }

    fn sender(&self) -> &Sender<Msg<R>> {
        self.tx
            .as_ref()
            .expect("the request channel lives until drop")
    }
}

impl<R> Drop for Client<R> {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The live counters of a read service (shared atomics, updated by its
/// thread, read by anyone): also used by read services outside this crate
/// that speak the same protocol.
#[derive(Default, Debug)]
pub struct ReadCounters {
    busy_ns: AtomicU64,
    demand_bytes: AtomicU64,
    prefetch_bytes: AtomicU64,
    cancelled_bytes: AtomicU64,
    in_flight: AtomicU64,
}

impl ReadCounters {
    /// Adds time with reads in flight.
    pub fn add_busy(&self, d: Duration) {
        self.busy_ns
            .fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Adds a completed read of `bytes` at `priority`.
    pub fn add_done(&self, priority: Priority, bytes: usize) {
        let c = match priority {
            Priority::Demand => &self.demand_bytes,
            Priority::Prefetch => &self.prefetch_bytes,
        };
        c.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Adds a prefetch read of `bytes` cancelled before any I/O.
    pub fn add_cancelled(&self, bytes: usize) {
        self.cancelled_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Counts `reads` submitted (each is answered once, or its batch
    /// fails).
    pub fn add_submitted(&self, reads: usize) {
        self.in_flight.fetch_add(reads as u64, Ordering::Relaxed);
    }

    /// Counts `reads` answered (done, cancelled, or failed with their
    /// batch).
    pub fn add_answered(&self, reads: usize) {
        self.in_flight.fetch_sub(reads as u64, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> ServiceCounters {
        ServiceCounters {
            busy: Duration::from_nanos(self.busy_ns.load(Ordering::Relaxed)),
            demand_bytes: self.demand_bytes.load(Ordering::Relaxed),
            prefetch_bytes: self.prefetch_bytes.load(Ordering::Relaxed),
            cancelled_bytes: self.cancelled_bytes.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
        }
    }
}

/// A snapshot of the service's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceCounters {
    /// Time with at least one read parked or in the kernel.
    pub busy: Duration,
    /// Bytes of completed demand reads (promoted prefetch reads included).
    pub demand_bytes: u64,
    /// Bytes of completed prefetch reads.
    pub prefetch_bytes: u64,
    /// Bytes of prefetch reads cancelled before any I/O.
    pub cancelled_bytes: u64,
    /// Reads submitted and not yet answered (parked, in the kernel, or
    /// done but not yet sent): zero when the service has nothing to do.
    pub in_flight: u64,
}

/// A reactor on its own thread.
pub struct ReactorService {
    client: Client<ReadReq>,
}

/// A read of a batch, as the thread tracks it.
struct Route {
    batch: u64,
    tag: u64,
    len: usize,
    priority: Priority,
}

/// The service thread's state.
struct Served {
    reactor: Reactor,
    /// Internal tag -> the request it serves.
    routes: HashMap<u64, Route>,
    /// Batch id -> (reply channel, reads outstanding).
    batches: HashMap<u64, (Sender<BatchEvent>, usize)>,
    next_tag: u64,
    done: Vec<ReadDone>,
    counters: Arc<ReadCounters>,
}

impl Served {
    fn handle(&mut self, msg: Msg<ReadReq>) {
        match msg {
            Msg::Submit {
                id,
                reqs,
                priority,
                reply,
            } => {
                if reqs.is_empty() {
                    return;
                }
                self.batches.insert(id, (reply, reqs.len()));
                for mut req in reqs {
                    let tag = self.next_tag;
                    self.next_tag += 1;
                    self.routes.insert(
                        tag,
                        Route {
                            batch: id,
                            tag: req.tag,
                            len: req.len,
                            priority,
                        },
                    );
                    req.tag = tag;
                    self.reactor.enqueue(req, priority, &mut self.done);
                }
                self.deliver();
            }
            Msg::Promote(id) => {
                let routes = &mut self.routes;
                self.reactor.promote(|t| match routes.get_mut(&t) {
                    Some(r) if r.batch == id => {
                        r.priority = Priority::Demand;
                        true
                    }
                    _ => false,
                });
            }
            Msg::Cancel(id) => {
                let routes = &self.routes;
                let dropped = self
                    .reactor
                    .cancel(|t| routes.get(&t).is_some_and(|r| r.batch == id));
                for (tag, len) in dropped {
                    self.counters.add_cancelled(len);
                    if let Some(route) = self.routes.remove(&tag) {
                        self.answer(route.batch, BatchEvent::Cancelled(route.tag));
                    }
                }
            }
        }
    }

    /// Sends finished reads to their batches.
    fn deliver(&mut self) {
        let done = std::mem::take(&mut self.done);
        for (tag, result) in done {
            let Some(route) = self.routes.remove(&tag) else {
                continue;
            };
            if result.is_ok() {
                self.counters.add_done(route.priority, route.len);
            }
            self.answer(route.batch, BatchEvent::Done((route.tag, result)));
        }
    }

    /// Sends one event of `batch`, forgetting the batch after its last.
    fn answer(&mut self, batch: u64, event: BatchEvent) {
        if let Some((reply, left)) = self.batches.get_mut(&batch) {
            // A caller that stopped listening only loses results.
            let _ = reply.send(event);
            self.counters.add_answered(1);
            *left -= 1;
            if *left == 0 {
                self.batches.remove(&batch);
            }
        }
    }

    /// Fails every outstanding batch after a ring error.
    fn fail_all(&mut self, e: &IoError) {
        for (_, (reply, left)) in self.batches.drain() {
            self.counters.add_answered(left);
            let _ = reply.send(BatchEvent::Failed(IoError::Ring {
                op: "reactor",
                source: std::io::Error::other(e.to_string()),
            }));
        }
        self.routes.clear();
    }

    fn run(mut self, rx: Receiver<Msg<ReadReq>>) {
        let mut broken: Option<IoError> = None;
        loop {
            // Block only when there is nothing to drive.
            if self.reactor.is_idle() {
                match rx.recv() {
                    Ok(msg) => self.handle_or_fail(msg, &broken),
                    Err(_) => return,
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(msg) => self.handle_or_fail(msg, &broken),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) if self.reactor.is_idle() => return,
                    Err(TryRecvError::Disconnected) => break,
                }
            }
            if self.reactor.is_idle() {
                continue;
            }
            let start = Instant::now();
            let res = self.reactor.step(&mut self.done);
            self.counters.add_busy(start.elapsed());
            self.deliver();
            if let Err(e) = res {
                self.fail_all(&e);
                broken = Some(e);
            }
        }
    }

    fn handle_or_fail(&mut self, msg: Msg<ReadReq>, broken: &Option<IoError>) {
        match (msg, broken) {
            (Msg::Submit { reply, reqs, .. }, Some(e)) => {
                self.counters.add_answered(reqs.len());
                let _ = reply.send(BatchEvent::Failed(IoError::Ring {
                    op: "submit",
                    source: std::io::Error::other(e.to_string()),
                }));
            }
            (msg, _) => self.handle(msg),
        }
    }
}

impl ReactorService {
    /// Moves `reactor` onto a new thread named `moestream-io`.
    pub fn spawn(reactor: Reactor) -> Result<ReactorService, IoError> {
        let client = Client::spawn("moestream-io", "the reactor thread", move |rx, counters| {
            let served = Served {
                reactor,
                routes: HashMap::with_capacity(256),
                batches: HashMap::with_capacity(64),
                next_tag: 0,
                done: Vec::with_capacity(64),
                counters,
            };
            served.run(rx)
        })
        .map_err(|e| IoError::Ring {
            op: "spawn the reactor thread",
            source: e,
        })?;
        Ok(ReactorService { client })
    }

    /// Sends a demand batch; its results (one `Done` per request, or a
    /// `Failed`) arrive on the returned channel in completion order.
    pub fn submit(&self, reqs: Vec<ReadReq>) -> Receiver<BatchEvent> {
        self.submit_at(reqs, Priority::Demand).events
    }

    /// Sends a batch at `priority`; each request is answered once on the
    /// batch's channel (`Done`, or `Cancelled` after [`Self::cancel`]), or
    /// the channel gets one `Failed`.
    pub fn submit_at(&self, reqs: Vec<ReadReq>, priority: Priority) -> Batch {
        self.client.submit_at(reqs, priority)
    }

    /// Raises a prefetch batch's parked reads to demand priority.
    pub fn promote(&self, batch: u64) {
        self.client.promote(batch);
    }

    /// Drops a prefetch batch's parked reads (reads in the kernel finish).
    pub fn cancel(&self, batch: u64) {
        self.client.cancel(batch);
    }

    /// The counters so far.
    pub fn counters(&self) -> ServiceCounters {
        self.client.counters()
    }
}
