//! `ReactorService`: a dedicated thread that owns a [`Reactor`] and serves
//! batches of reads sent over a crossbeam channel, streaming each result
//! back as its completion is reaped. Compute threads never touch the ring;
//! a batch is one message, and results arrive in completion order on the
//! batch's own channel.
//!
//! Batches are served one after another (each keeps up to the reactor's
//! depth in the kernel). Dropping the service closes the request channel;
//! the thread finishes the batch in hand and exits, and the drop joins it.

use std::thread::JoinHandle;

use crossbeam::channel::{self, Receiver, Sender};

use crate::error::IoError;
use crate::reactor::{Reactor, ReadDone, ReadReq};

/// What a batch's channel carries.
#[derive(Debug)]
pub enum BatchEvent {
    /// One read's result (tag and slab, or its error).
    Done(ReadDone),
    /// The ring failed; no further results of this batch will come.
    Failed(IoError),
}

struct Job {
    reqs: Vec<ReadReq>,
    reply: Sender<BatchEvent>,
}

/// A reactor on its own thread.
pub struct ReactorService {
    tx: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl ReactorService {
    /// Moves `reactor` onto a new thread named `moestream-io`.
    pub fn spawn(mut reactor: Reactor) -> Result<ReactorService, IoError> {
        let (tx, rx) = channel::unbounded::<Job>();
        let thread = std::thread::Builder::new()
            .name("moestream-io".into())
            .spawn(move || {
                for job in rx.iter() {
                    let reply = job.reply;
                    let res = reactor.submit_batch_with(job.reqs, |d| {
                        // A caller that stopped listening only loses results.
                        let _ = reply.send(BatchEvent::Done(d));
                    });
                    if let Err(e) = res {
                        let _ = reply.send(BatchEvent::Failed(e));
                    }
                }
            })
            .map_err(|e| IoError::Ring {
                op: "spawn the reactor thread",
                source: e,
            })?;
        Ok(ReactorService {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// Sends a batch; its results (one `Done` per request, or a `Failed`)
    /// arrive on the returned channel in completion order.
    pub fn submit(&self, reqs: Vec<ReadReq>) -> Receiver<BatchEvent> {
        let (reply, rx) = channel::unbounded();
        let job = Job { reqs, reply };
        let tx = self
            .tx
            .as_ref()
            .expect("the request channel lives until drop");
        if let Err(channel::SendError(job)) = tx.send(job) {
            let _ = job.reply.send(BatchEvent::Failed(IoError::Ring {
                op: "submit",
                source: std::io::Error::other("the reactor thread has exited"),
            }));
        }
        rx
    }
}

impl Drop for ReactorService {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
