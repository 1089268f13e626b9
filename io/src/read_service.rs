//! `ReadService`: how a batch of reads travels from its sources (files) to
//! slabs, behind one trait with two implementations, and the choice
//! between them.
//!
//! - [`ReactorReads`]: the io_uring [`ReactorService`] (every read of a
//!   batch in the kernel at once), for sources that expose a descriptor;
//! - [`ThreadReads`]: one thread reading spans one after another with the
//!   sources' own [`RangeReader`]s (mmap, drop, or where io_uring is
//!   unavailable or not wanted).
//!
//! Both serve the same protocol: a batch of reads at a [`Priority`] comes
//! back as one [`BatchEvent`] per read on the batch's channel, demand reads
//! go before parked prefetch reads, and a prefetch batch can be promoted or
//! cancelled. [`read_service`] picks one and says why, so a caller never
//! needs to know which it has.

use crate::file::OpenFile;
use crate::mode::ReadMode;
use crate::reactor::{Priority, Reactor, ReactorConfig, ReadReq};
use crate::service::{
    Batch, BatchEvent, Client, Msg, ReactorService, ReadCounters, ServiceCounters,
};
use crate::slab::SlabPool;
use crate::source::RangeReader;
use crossbeam::channel::{Receiver, Sender, TryRecvError};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

/// One read: bytes `[offset, offset + len)` of source `source` (an index
/// into the service's sources); `tag` comes back with its event.
#[derive(Clone, Copy, Debug)]
pub struct SourceRead {
    pub tag: u64,
    pub source: usize,
    pub offset: u64,
    pub len: usize,
}

/// A service that reads batches from a fixed list of sources.
pub trait ReadService: Send + Sync {
    /// Queues a batch of reads at `priority`; each answers once on the
    /// batch's channel.
    fn submit(&self, reads: Vec<SourceRead>, priority: Priority) -> Batch;
    /// Raises a prefetch batch to demand priority.
    fn promote(&self, batch: u64);
    /// Drops a prefetch batch's reads not yet started (each answers
    /// `Cancelled`).
    fn cancel(&self, batch: u64);
    /// Busy time and bytes per priority so far.
    fn counters(&self) -> ServiceCounters;
}

/// The io_uring reactor over the sources' descriptors.
pub struct ReactorReads {
    service: ReactorService,
    files: Vec<Arc<OpenFile>>,
}

impl ReadService for ReactorReads {
    fn submit(&self, reads: Vec<SourceRead>, priority: Priority) -> Batch {
        let reqs = reads
            .into_iter()
            .map(|r| ReadReq {
                tag: r.tag,
                file: self.files[r.source].clone(),
                offset: r.offset,
                len: r.len,
            })
            .collect();
        self.service.submit_at(reqs, priority)
    }

    fn promote(&self, batch: u64) {
        self.service.promote(batch);
    }

    fn cancel(&self, batch: u64) {
        self.service.cancel(batch);
    }

    fn counters(&self) -> ServiceCounters {
        self.service.counters()
    }
}

/// What [`read_service`] says when it chose the reactor.
pub const REACTOR_PATH: &str = "the io_uring reactor";

/// The service that reads `sources`, and why it was chosen: the io_uring
/// reactor when `prefer_reactor`, every source has a descriptor and no
/// source drops its pages after each read, and io_uring works here;
/// otherwise a reader thread. The reason is for the user (e.g. "a reader
/// thread (io_uring is unavailable here)").
pub fn read_service(
    sources: Vec<Arc<dyn RangeReader>>,
    prefer_reactor: bool,
    config: ReactorConfig,
    pool: Arc<SlabPool>,
) -> std::io::Result<(Box<dyn ReadService>, &'static str)> {
    let files: Option<Vec<Arc<OpenFile>>> = sources
        .iter()
        .map(|s| {
            s.open_file()
                .filter(|_| s.effective_mode() != ReadMode::Drop)
        })
        .collect();
    let why = if !prefer_reactor {
        "a reader thread (asked for)"
    } else if files.is_none() {
        "a reader thread (this read mode has no descriptor io_uring can read, or drops pages per read)"
    } else if Reactor::probe().is_err() {
        "a reader thread (io_uring is unavailable here)"
    } else {
        match Reactor::new(config, pool).and_then(ReactorService::spawn) {
            Ok(service) => {
                let files = files.expect("checked above");
                return Ok((Box::new(ReactorReads { service, files }), REACTOR_PATH));
            }
            Err(_) => "a reader thread (the io_uring reactor failed to start)",
        }
    };
    Ok((Box::new(ThreadReads::spawn(sources)?), why))
}

/// One queued read of the reader thread: (batch id, reply, read).
type Queued = (u64, Sender<BatchEvent>, SourceRead);

/// A [`ReadService`] on one thread that reads synchronously through its
/// sources' own readers (any read mode), demand reads first.
pub struct ThreadReads {
    client: Client<SourceRead>,
}

impl ThreadReads {
    /// Starts the reader thread over `sources`.
    pub fn spawn(sources: Vec<Arc<dyn RangeReader>>) -> std::io::Result<ThreadReads> {
        let client = Client::spawn(
            "moestream-read",
            "the reader thread",
            move |rx, counters| serve(&sources, &rx, &counters),
        )?;
        Ok(ThreadReads { client })
    }
}

impl ReadService for ThreadReads {
    fn submit(&self, reads: Vec<SourceRead>, priority: Priority) -> Batch {
        self.client.submit_at(reads, priority)
    }

    fn promote(&self, batch: u64) {
        self.client.promote(batch);
    }

    fn cancel(&self, batch: u64) {
        self.client.cancel(batch);
    }

    fn counters(&self) -> ServiceCounters {
        self.client.counters()
    }
}

/// The reader thread: takes every waiting message, then reads one span
/// (demand first); blocks only with nothing queued.
fn serve(
    sources: &[Arc<dyn RangeReader>],
    rx: &Receiver<Msg<SourceRead>>,
    counters: &ReadCounters,
) {
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
        let result = sources[span.source].read(span.offset, span.len);
        counters.add_busy(start.elapsed());
        if result.is_ok() {
            counters.add_done(priority, span.len);
        }
        // A caller that stopped listening only loses the result.
        let _ = reply.send(BatchEvent::Done((span.tag, result)));
        counters.add_answered(1);
    }
}

fn take(
    msg: Msg<SourceRead>,
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
                counters.add_answered(1);
            }
        }
    }
}
