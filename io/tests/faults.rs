//! Fault harness for the reactor: many concurrent requests with injected
//! short reads, EINTR/EAGAIN and I/O errors. Every good read still returns
//! exactly the file's bytes, a failed one is a typed error naming file,
//! offset and length (its buffer never handed out), and the reactor stays
//! usable afterwards. Skips with a message where io_uring is unavailable.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use moestream_io::{IoError, OpenFile, Reactor, ReactorConfig, ReadReq, SlabPool, ALIGN};

const FILE_BYTES: usize = 3 << 20;

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 131 + i / 4093) as u8).collect()
}

fn setup(direct: bool) -> Option<(tempfile::TempDir, Arc<OpenFile>, Vec<u8>, Reactor)> {
    let config = ReactorConfig {
        depth: 8,
        ..ReactorConfig::default()
    };
    let reactor = match Reactor::new(config, SlabPool::new(16 << 20)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("skipping the reactor fault harness: {e}");
            return None;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(FILE_BYTES);
    let path = dir.path().join("data.bin");
    std::fs::write(&path, &data).unwrap();
    let file = Arc::new(OpenFile::open(&path, direct).unwrap());
    Some((dir, file, data, reactor))
}

/// 300 requests of odd offsets and lengths up to 64 KiB (in flight 8 at a
/// time, the rest parked).
fn requests(file: &Arc<OpenFile>) -> Vec<ReadReq> {
    (0..300u64)
        .map(|tag| ReadReq {
            tag,
            file: file.clone(),
            offset: (tag * 40_009) % (FILE_BYTES as u64 - 70_000),
            len: 1 + (tag as usize * 7_919) % 65_536,
        })
        .collect()
}

fn check_ok(data: &[u8], req: &ReadReq, got: &[u8]) {
    let s = req.offset as usize;
    assert_eq!(got, &data[s..s + req.len], "tag {}", req.tag);
}

#[test]
fn short_reads_and_retries_still_return_exact_bytes() {
    for direct in [false, true] {
        let Some((_dir, file, data, mut reactor)) = setup(direct) else {
            return;
        };
        // First completion of each tag: shortened to half (a multiple of
        // 4096 for O_DIRECT, as the kernel would), or EINTR / EAGAIN.
        let mut seen: HashMap<u64, u32> = HashMap::new();
        reactor.set_fault_injector(Some(Box::new(move |tag, result| {
            let n = seen.entry(tag).or_default();
            *n += 1;
            if *n > 1 || result <= 0 {
                return result;
            }
            // A short read is never 0 bytes (that is end of file).
            let a = ALIGN as i32;
            match tag % 3 {
                0 if direct && result > a => (result / 2 / a).max(1) * a,
                0 if !direct && result > 1 => result / 2,
                0 => result,
                1 => -libc::EINTR,
                _ => -libc::EAGAIN,
            }
        })));
        let reqs = requests(&file);
        let done = reactor.submit_batch(reqs.clone()).unwrap();
        let tags: HashSet<u64> = done.iter().map(|d| d.0).collect();
        assert_eq!(tags.len(), reqs.len(), "each tag exactly once");
        for (tag, r) in done {
            check_ok(&data, &reqs[tag as usize], r.unwrap().bytes());
        }
        assert!(
            reactor.resubmits() >= 200,
            "{} resubmits",
            reactor.resubmits()
        );
        assert_eq!((reactor.queued(), reactor.in_kernel()), (0, 0));
    }
}

#[test]
fn an_io_error_fails_only_its_read_and_names_it() {
    for direct in [false, true] {
        let Some((_dir, file, data, mut reactor)) = setup(direct) else {
            return;
        };
        let bad: HashSet<u64> = [7, 150, 299].into();
        let inject = bad.clone();
        reactor.set_fault_injector(Some(Box::new(move |tag, result| {
            if inject.contains(&tag) {
                -libc::EIO
            } else {
                result
            }
        })));
        let reqs = requests(&file);
        let done = reactor.submit_batch(reqs.clone()).unwrap();
        assert_eq!(done.len(), reqs.len());
        for (tag, r) in done {
            let req = &reqs[tag as usize];
            if bad.contains(&tag) {
                let e = r.expect_err("an injected EIO is an error");
                let msg = e.to_string();
                assert!(matches!(e, IoError::Os { .. }), "{e:?}");
                assert!(msg.contains("data.bin"), "{msg}");
                assert!(msg.contains(&req.offset.to_string()), "{msg}");
                assert!(msg.contains(&req.len.to_string()), "{msg}");
            } else {
                check_ok(&data, req, r.unwrap().bytes());
            }
        }
        // The reactor is still usable, faults removed.
        reactor.set_fault_injector(None);
        let again = reactor.submit_batch(reqs[..20].to_vec()).unwrap();
        for (tag, r) in again {
            check_ok(&data, &reqs[tag as usize], r.unwrap().bytes());
        }
    }
}

#[test]
fn a_read_cut_short_at_the_end_of_the_file_is_a_short_read_error() {
    let Some((_dir, file, _data, mut reactor)) = setup(false) else {
        return;
    };
    // Every completion of tag 3 reports 0 bytes: the file "ended".
    reactor.set_fault_injector(Some(Box::new(
        |tag, result| if tag == 3 { 0 } else { result },
    )));
    let reqs = requests(&file)[..10].to_vec();
    let done = reactor.submit_batch(reqs).unwrap();
    let (_, r) = done.into_iter().find(|d| d.0 == 3).unwrap();
    assert!(matches!(r, Err(IoError::ShortRead { .. })), "{r:?}");
}
