//! The io_uring reactor returns the file's bytes for every request, in
//! completion order, one result per tag, through parking (more requests
//! than queue depth), chunked reads (the short-read resubmission path) and
//! EOF errors. Skips with a message where io_uring is unavailable.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use moestream_io::{
    BatchEvent, IoError, OpenFile, Priority, Reactor, ReactorConfig, ReadReq, SlabPool,
};

const FILE_BYTES: usize = 5 * 65_536 + 777;

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 37 + i / 509) as u8).collect()
}

fn reactor(config: ReactorConfig) -> Option<Reactor> {
    match Reactor::new(config, SlabPool::new(8 << 20)) {
        Ok(reactor) => Some(reactor),
        Err(e) => {
            eprintln!("skipping io_uring test: {e}");
            None
        }
    }
}

fn fixture(dir: &Path) -> (PathBuf, Vec<u8>) {
    let data = pattern(FILE_BYTES);
    let path = dir.join("data.bin");
    std::fs::write(&path, &data).unwrap();
    (path, data)
}

fn requests(file: &Arc<OpenFile>, n: u64) -> Vec<ReadReq> {
    (0..n)
        .map(|tag| ReadReq {
            tag,
            file: file.clone(),
            offset: (tag * 12_289) % (FILE_BYTES as u64 - 30_000),
            len: 1 + (tag as usize * 4099) % 30_000,
        })
        .collect()
}

fn check_batch(reactor: &mut Reactor, file: &Arc<OpenFile>, data: &[u8], n: u64) {
    let reqs = requests(file, n);
    let done = reactor.submit_batch(reqs.clone()).unwrap();
    assert_eq!(done.len(), reqs.len());
    let tags: HashSet<u64> = done.iter().map(|(tag, _)| *tag).collect();
    assert_eq!(tags.len(), reqs.len(), "each tag exactly once");
    for (tag, result) in done {
        let req = &reqs[tag as usize];
        let start = req.offset as usize;
        assert_eq!(
            result.unwrap().bytes(),
            &data[start..start + req.len],
            "tag {tag}"
        );
    }
    assert_eq!((reactor.queued(), reactor.in_kernel()), (0, 0));
}

#[test]
fn probe_reports() {
    match Reactor::probe() {
        Ok(()) => eprintln!("io_uring available"),
        Err(e) => {
            assert!(matches!(e, IoError::RingUnavailable { .. }), "{e}");
            eprintln!("io_uring unavailable: {e}");
        }
    }
}

#[test]
fn batch_larger_than_depth_buffered_and_direct() {
    let config = ReactorConfig {
        depth: 4,
        ..ReactorConfig::default()
    };
    let Some(mut reactor) = reactor(config) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (path, data) = fixture(dir.path());
    for want_direct in [false, true] {
        let file = Arc::new(OpenFile::open(&path, want_direct).unwrap());
        eprintln!("direct requested {want_direct}, got {}", file.is_direct());
        check_batch(&mut reactor, &file, &data, 37);
        check_batch(&mut reactor, &file, &data, 1);
        assert!(reactor.submit_batch(Vec::new()).unwrap().is_empty());
    }
}

#[test]
fn chunked_reads_resubmit_remainder() {
    let config = ReactorConfig {
        depth: 3,
        read_chunk_bytes_max: 4096,
        ..ReactorConfig::default()
    };
    let Some(mut reactor) = reactor(config) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (path, data) = fixture(dir.path());
    for want_direct in [false, true] {
        let file = Arc::new(OpenFile::open(&path, want_direct).unwrap());
        let before = reactor.resubmits();
        check_batch(&mut reactor, &file, &data, 10);
        assert!(
            reactor.resubmits() > before,
            "reads over 4096 bytes were chunked"
        );
    }
}

#[test]
fn eof_is_short_read_beside_good_reads() {
    let Some(mut reactor) = reactor(ReactorConfig::default()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (path, data) = fixture(dir.path());
    for want_direct in [false, true] {
        let file = Arc::new(OpenFile::open(&path, want_direct).unwrap());
        let n = FILE_BYTES as u64;
        let reqs = vec![
            ReadReq {
                tag: 0,
                file: file.clone(),
                offset: n - 100,
                len: 100,
            },
            ReadReq {
                tag: 1,
                file: file.clone(),
                offset: n - 100,
                len: 101,
            },
            ReadReq {
                tag: 2,
                file: file.clone(),
                offset: 0,
                len: 0,
            },
        ];
        let mut done = reactor.submit_batch(reqs).unwrap();
        done.sort_by_key(|(tag, _)| *tag);
        assert_eq!(
            done[0].1.as_ref().unwrap().bytes(),
            &data[FILE_BYTES - 100..]
        );
        let err = done[1].1.as_ref().unwrap_err();
        assert!(matches!(err, IoError::ShortRead { .. }), "{err}");
        assert!(err.to_string().contains("data.bin"), "{err}");
        assert!(done[2].1.as_ref().unwrap().is_empty());
    }
}

#[test]
fn file_truncated_after_open_is_short_read() {
    let Some(mut reactor) = reactor(ReactorConfig::default()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = fixture(dir.path());
    let file = Arc::new(OpenFile::open(&path, false).unwrap());
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(1000)
        .unwrap();
    let req = ReadReq {
        tag: 9,
        file,
        offset: 500,
        len: 1000,
    };
    let done = reactor.submit_batch(vec![req]).unwrap();
    match &done[0] {
        (9, Err(IoError::ShortRead { got, .. })) => assert_eq!(*got, 500),
        (tag, other) => panic!("tag {tag}: expected ShortRead, got {other:?}"),
    }
}

#[test]
fn parked_reads_leave_in_fifo_order() {
    let config = ReactorConfig {
        depth: 1,
        ..ReactorConfig::default()
    };
    let Some(mut reactor) = reactor(config) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = fixture(dir.path());
    let file = Arc::new(OpenFile::open(&path, false).unwrap());
    let done = reactor.submit_batch(requests(&file, 12)).unwrap();
    let tags: Vec<u64> = done.iter().map(|(tag, _)| *tag).collect();
    assert_eq!(
        tags,
        (0..12).collect::<Vec<_>>(),
        "one in flight: completion order = FIFO"
    );
}

#[test]
fn streamed_results_arrive_once_each_with_the_right_bytes() {
    let Some(mut reactor) = reactor(ReactorConfig {
        depth: 4,
        ..ReactorConfig::default()
    }) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (path, data) = fixture(dir.path());
    let file = Arc::new(OpenFile::open(&path, false).unwrap());
    let reqs = requests(&file, 40);
    let mut seen = HashSet::new();
    reactor
        .submit_batch_with(reqs.clone(), |(tag, result)| {
            let req = &reqs[tag as usize];
            let start = req.offset as usize;
            assert_eq!(
                result.unwrap().bytes(),
                &data[start..start + req.len],
                "tag {tag}"
            );
            assert!(seen.insert(tag), "tag {tag} handed over twice");
        })
        .unwrap();
    assert_eq!(seen.len(), 40);
    assert_eq!((reactor.queued(), reactor.in_kernel()), (0, 0));
}

/// The reactor on its own thread serves batches sent over a channel, each
/// result arriving once, with the file's bytes; dropping the service joins
/// its thread.
#[test]
fn the_service_thread_streams_every_result_of_every_batch() {
    let Some(r) = reactor(ReactorConfig {
        depth: 4,
        ..ReactorConfig::default()
    }) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (path, data) = fixture(dir.path());
    let file = Arc::new(OpenFile::open(&path, false).unwrap());
    let service = moestream_io::ReactorService::spawn(r).unwrap();
    for round in 0..3u64 {
        let reqs = requests(&file, 20 + round);
        let rx = service.submit(reqs.clone());
        let mut seen = HashSet::new();
        for event in rx.iter().take(reqs.len()) {
            let moestream_io::BatchEvent::Done((tag, slab)) = event else {
                panic!("ring failure");
            };
            assert!(seen.insert(tag), "tag {tag} twice");
            let req = &reqs[tag as usize];
            let s = req.offset as usize;
            assert_eq!(slab.unwrap().bytes(), &data[s..s + req.len]);
        }
        assert_eq!(seen.len(), reqs.len());
    }
    drop(service);
}

/// At most `inflight_bytes_max` bytes are in the kernel at once (a single
/// larger read goes alone), and every read still completes exactly.
#[test]
fn in_flight_bytes_stay_under_their_bound() {
    let Some(mut r) = reactor(ReactorConfig {
        depth: 16,
        inflight_bytes_max: 48 << 10,
        ..ReactorConfig::default()
    }) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (path, data) = fixture(dir.path());
    let file = Arc::new(OpenFile::open(&path, false).unwrap());
    check_batch(&mut r, &file, &data, 40);
    let largest = requests(&file, 40).iter().map(|q| q.len).max().unwrap();
    assert!(
        r.peak_kernel_bytes() <= (48 << 10).max(largest),
        "peak {} bytes in the kernel",
        r.peak_kernel_bytes()
    );
    assert!(r.peak_kernel_bytes() > 0);
}

/// The fixture file opened for buffered reads, with its bytes.
fn fixture_file(dir: &Path) -> (Arc<OpenFile>, Vec<u8>) {
    let (path, data) = fixture(dir);
    (Arc::new(OpenFile::open(&path, false).unwrap()), data)
}

/// Drives the reactor until idle, returning the tags in completion order
/// (checking each slab's bytes).
fn drain(r: &mut Reactor, reqs: &[ReadReq], data: &[u8]) -> Vec<u64> {
    let mut order = Vec::new();
    let mut done = Vec::new();
    while !r.is_idle() {
        r.step(&mut done).unwrap();
        for (tag, slab) in done.drain(..) {
            let req = reqs.iter().find(|q| q.tag == tag).unwrap();
            let s = req.offset as usize;
            assert_eq!(slab.unwrap().bytes(), &data[s..s + req.len], "tag {tag}");
            order.push(tag);
        }
    }
    order
}

/// Demand reads enter the kernel before every parked prefetch read; at most
/// `prefetch_depth` prefetch reads ride along, so every demand read
/// completes within the first `demand + prefetch_depth` results.
#[test]
fn demand_reads_pass_parked_prefetch_reads() {
    let Some(mut r) = reactor(ReactorConfig {
        depth: 2,
        prefetch_depth: 1,
        ..ReactorConfig::default()
    }) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (file, data) = fixture_file(dir.path());
    let reqs = requests(&file, 12);
    let mut done = Vec::new();
    for q in &reqs[..8] {
        r.enqueue(q.clone(), Priority::Prefetch, &mut done);
    }
    for q in &reqs[8..] {
        r.enqueue(q.clone(), Priority::Demand, &mut done);
    }
    assert!(done.is_empty());
    let order = drain(&mut r, &reqs, &data);
    assert_eq!(order.len(), 12);
    for demand in 8..12u64 {
        let at = order.iter().position(|&t| t == demand).unwrap();
        assert!(
            at < 4 + 1,
            "demand read {demand} completed {at}th: {order:?}"
        );
    }
}

/// A promoted prefetch read overtakes the other parked prefetch reads; a
/// cancelled one is dropped without I/O and never completes.
#[test]
fn promote_and_cancel_parked_prefetch_reads() {
    let Some(mut r) = reactor(ReactorConfig {
        depth: 1,
        prefetch_depth: 1,
        ..ReactorConfig::default()
    }) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (file, data) = fixture_file(dir.path());
    let reqs = requests(&file, 8);
    let mut done = Vec::new();
    for q in &reqs {
        r.enqueue(q.clone(), Priority::Prefetch, &mut done);
    }
    assert_eq!(r.promote(|t| t == 6 || t == 7), 2);
    let dropped = r.cancel(|t| t == 2 || t == 3);
    let mut dropped_tags: Vec<u64> = dropped.iter().map(|d| d.0).collect();
    dropped_tags.sort();
    assert_eq!(dropped_tags, [2, 3]);
    assert_eq!(dropped[0].1, reqs[dropped[0].0 as usize].len);
    let order = drain(&mut r, &reqs, &data);
    assert_eq!(order, [6, 7, 0, 1, 4, 5]);
}

/// Through the service thread: a cancelled prefetch batch answers every
/// request exactly once (done or cancelled), and the byte counters add up.
#[test]
fn service_cancel_answers_every_request_once() {
    let Some(r) = reactor(ReactorConfig {
        depth: 1,
        prefetch_depth: 1,
        ..ReactorConfig::default()
    }) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (file, data) = fixture_file(dir.path());
    let service = moestream_io::ReactorService::spawn(r).unwrap();
    let reqs = requests(&file, 30);
    let batch = service.submit_at(reqs.clone(), Priority::Prefetch);
    assert_eq!(service.counters().in_flight, reqs.len() as u64);
    service.cancel(batch.id);
    let demand = service.submit(requests(&file, 3));
    assert_eq!(demand.iter().take(3).count(), 3);
    let (mut read, mut cancelled) = (0u64, 0u64);
    let mut seen = HashSet::new();
    for event in batch.events.iter().take(reqs.len()) {
        match event {
            BatchEvent::Done((tag, slab)) => {
                let q = &reqs[tag as usize];
                let s = q.offset as usize;
                assert_eq!(slab.unwrap().bytes(), &data[s..s + q.len]);
                read += q.len as u64;
                assert!(seen.insert(tag));
            }
            BatchEvent::Cancelled(tag) => {
                cancelled += reqs[tag as usize].len as u64;
                assert!(seen.insert(tag));
            }
            BatchEvent::Failed(e) => panic!("{e}"),
        }
    }
    assert_eq!(seen.len(), reqs.len());
    assert!(
        cancelled > 0,
        "a 30-read batch at depth 1 cancels some reads"
    );
    let c = service.counters();
    assert_eq!((c.prefetch_bytes, c.cancelled_bytes), (read, cancelled));
    assert!(c.demand_bytes > 0 && c.busy > std::time::Duration::ZERO);
    // Every read answered: the gauge falls to zero (it is lowered just
    // after each answer is sent).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while service.counters().in_flight > 0 {
        assert!(std::time::Instant::now() < deadline, "reads stay in flight");
        std::thread::yield_now();
    }
}

/// A stream pulls requests only while fewer than `depth` are outstanding,
/// fills the queue to `depth`, and hands every result over once with the
/// file's bytes; a request past the end is a short read and the stream goes
/// on; an empty stream returns at once.
#[test]
fn a_stream_keeps_depth_outstanding_and_hands_over_every_result() {
    use std::cell::Cell;
    let depth = 3;
    let Some(mut r) = reactor(ReactorConfig {
        depth,
        ..ReactorConfig::default()
    }) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (file, data) = fixture_file(dir.path());
    let mut reqs = requests(&file, 30);
    reqs[7].offset = FILE_BYTES as u64 - 10;
    reqs[7].len = 11;
    let (pulled, finished, peak) = (Cell::new(0usize), Cell::new(0usize), Cell::new(0usize));
    let mut seen = HashSet::new();
    r.submit_stream_with(
        || {
            let outstanding = pulled.get() - finished.get();
            assert!(
                outstanding < depth as usize,
                "pulled with {outstanding} outstanding"
            );
            let req = reqs.get(pulled.get()).cloned()?;
            pulled.set(pulled.get() + 1);
            peak.set(peak.get().max(outstanding + 1));
            Some(req)
        },
        |(tag, result)| {
            finished.set(finished.get() + 1);
            assert!(seen.insert(tag), "tag {tag} twice");
            let req = &reqs[tag as usize];
            if tag == 7 {
                let err = result.unwrap_err();
                assert!(matches!(err, IoError::ShortRead { .. }), "{err}");
                return;
            }
            let s = req.offset as usize;
            assert_eq!(result.unwrap().bytes(), &data[s..s + req.len], "tag {tag}");
        },
    )
    .unwrap();
    assert_eq!(seen.len(), 30);
    assert_eq!(peak.get(), depth as usize, "the queue was kept full");
    assert_eq!((r.queued(), r.in_kernel()), (0, 0));
    // An empty stream returns at once; the reactor stays usable.
    r.submit_stream_with(|| None, |_| panic!("no reads"))
        .unwrap();
    check_batch(&mut r, &file, &data, 5);
}
