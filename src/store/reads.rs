//! How expert spans travel from the shards to RAM: through the io_uring
//! [`ReactorService`] (every read of a batch in the kernel at once), or
//! through [`SyncReader`], one thread reading spans one after another with
//! the shards' own readers (mmap, drop, `--submit sync`, or no io_uring).
//!
//! Both serve the same protocol: a batch of span reads at a [`Priority`]
//! comes back as one [`BatchEvent`] per read on the batch's channel, demand
//! reads go before parked prefetch reads, and a prefetch batch can be
//! promoted or cancelled. So the expert store never knows which one it has.

use crate::weights::WeightIndex;
use crossbeam::channel::{self, Receiver, Sender, TryRecvError};
use moestream_io::{
    Batch, BatchEvent, OpenFile, Priority, ReactorService, ReadCounters, ReadReq, ServiceCounters,
};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

/// One span to read: bytes `[offset, offset + len)` of shard `shard`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SpanReq {
    pub tag: u64,
    pub shard: usize,
    pub offset: u64,
    pub len: usize,
}

/// The read path of an expert store.
pub(crate) enum Reads {
    /// io_uring on its own thread; `files[shard]` is each shard's descriptor.
    Reactor {
        service: ReactorService,
        files: Vec<Arc<OpenFile>>,
    },
    /// Synchronous reads on one reader thread.
    Sync(SyncReader),
}

impl Reads {
    /// Sends a batch of span reads.
    pub fn submit(&self, reqs: Vec<SpanReq>, priority: Priority) -> Batch {
        match self {
            Reads::Reactor { service, files } => {
                let reqs = reqs
                    .into_iter()
                    .map(|r| ReadReq {
                        tag: r.tag,
                        file: files[r.shard].clone(),
                        offset: r.offset,
                        len: r.len,
                    })
                    .collect();
                service.submit_at(reqs, priority)
            }
            Reads::Sync(s) => s.submit(reqs, priority),
        }
    }

    /// Raises a prefetch batch to demand priority.
    pub fn promote(&self, batch: u64) {
        match self {
            Reads::Reactor { service, .. } => service.promote(batch),
            Reads::Sync(s) => s.send(Msg::Promote(batch)),
        }
    }

    /// Drops a prefetch batch's reads not yet started.
    pub fn cancel(&self, batch: u64) {
        match self {
            Reads::Reactor { service, .. } => service.cancel(batch),
            Reads::Sync(s) => s.send(Msg::Cancel(batch)),
        }
    }

    /// Busy time and bytes per priority so far.
    pub fn counters(&self) -> ServiceCounters {
        match self {
            Reads::Reactor { service, .. } => service.counters(),
            Reads::Sync(s) => s.counters(),
        }
    }

    /// Whether reads go through io_uring.
    pub fn is_reactor(&self) -> bool {
        matches!(self, Reads::Reactor { .. })
    }
}

enum Msg {
    Submit {
        id: u64,
        reqs: Vec<SpanReq>,
        priority: Priority,
        reply: Sender<BatchEvent>,
    },
    Promote(u64),
    Cancel(u64),
}

/// One queued read of the sync thread: (batch id, reply, span).
type Queued = (u64, Sender<BatchEvent>, SpanReq);

/// A thread that reads spans synchronously through the shards' readers,
/// demand reads first.
pub(crate) struct SyncReader {
    tx: Option<Sender<Msg>>,
    thread: Option<JoinHandle<()>>,
    next_id: AtomicU64,
    counters: Arc<ReadCounters>,
}

impl SyncReader {
    /// Starts the reader thread over `index`'s shards.
    pub fn spawn(index: Arc<WeightIndex>) -> std::io::Result<SyncReader> {
        let (tx, rx) = channel::unbounded::<Msg>();
        let counters = Arc::new(ReadCounters::default());
        let c = counters.clone();
        let thread = std::thread::Builder::new()
            .name("moestream-read".into())
            .spawn(move || serve(&index, &rx, &c))?;
        Ok(SyncReader {
            tx: Some(tx),
            thread: Some(thread),
            next_id: AtomicU64::new(0),
            counters,
        })
    }

    fn submit(&self, reqs: Vec<SpanReq>, priority: Priority) -> Batch {
        let (reply, events) = channel::unbounded();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if let Err(channel::SendError(Msg::Submit { reply, .. })) =
            self.sender().send(Msg::Submit {
                id,
                reqs,
                priority,
                reply,
            })
        {
            let _ = reply.send(BatchEvent::Failed(moestream_io::IoError::Ring {
                op: "submit",
                source: std::io::Error::other("the reader thread has exited"),
            }));
        }
        Batch { id, events }
    }

    fn send(&self, msg: Msg) {
        let _ = self.sender().send(msg);
    }

    fn sender(&self) -> &Sender<Msg> {
        self.tx.as_ref().expect("the channel lives until drop")
    }

    fn counters(&self) -> ServiceCounters {
        self.counters.snapshot()
    }
}

impl Drop for SyncReader {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The reader thread: takes every waiting message, then reads one span
/// (demand first); blocks only with nothing queued.
fn serve(index: &WeightIndex, rx: &Receiver<Msg>, counters: &ReadCounters) {
    let mut demand: VecDeque<Queued> = VecDeque::new();
    let mut prefetch: VecDeque<Queued> = VecDeque::new();
    let mut open = true;
    loop {
        if demand.is_empty() && prefetch.is_empty() {
            if !open {
                return;
            }
            match rx.recv() {
                Ok(msg) => take(msg, &mut demand, &mut prefetch, counters),
                Err(_) => return,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(msg) => take(msg, &mut demand, &mut prefetch, counters),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        let (read, priority) = match demand.pop_front() {
            Some(q) => (q, Priority::Demand),
            None => match prefetch.pop_front() {
                Some(q) => (q, Priority::Prefetch),
                None => continue,
            },
        };
        let (_, reply, span) = read;
        let start = Instant::now();
        let result = index.shards[span.shard].reader.read(span.offset, span.len);
        counters.add_busy(start.elapsed());
        if result.is_ok() {
            counters.add_done(priority, span.len);
        }
        // A caller that stopped listening only loses the result.
        let _ = reply.send(BatchEvent::Done((span.tag, result)));
    }
}

fn take(
    msg: Msg,
    demand: &mut VecDeque<Queued>,
    prefetch: &mut VecDeque<Queued>,
    counters: &ReadCounters,
) {
    match msg {
        Msg::Submit {
            id,
            reqs,
            priority,
            reply,
        } => {
            let queue = match priority {
                Priority::Demand => demand,
                Priority::Prefetch => prefetch,
            };
            queue.extend(reqs.into_iter().map(|r| (id, reply.clone(), r)));
        }
        Msg::Promote(id) => {
            let (hit, keep): (VecDeque<Queued>, VecDeque<Queued>) =
                prefetch.drain(..).partition(|q| q.0 == id);
            *prefetch = keep;
            demand.extend(hit);
        }
        Msg::Cancel(id) => {
            let (hit, keep): (VecDeque<Queued>, VecDeque<Queued>) =
                prefetch.drain(..).partition(|q| q.0 == id);
            *prefetch = keep;
            for (_, reply, span) in hit {
                counters.add_cancelled(span.len);
                let _ = reply.send(BatchEvent::Cancelled(span.tag));
            }
        }
    }
}
