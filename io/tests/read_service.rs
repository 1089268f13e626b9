//! Both read services (the io_uring reactor where it works, and the reader
//! thread) answer every read of a batch once, and their in-flight gauge
//! counts the reads not yet answered: all of them right after submission,
//! none once every answer has come.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use moestream_io::{
    open, read_service, shared_pool, BatchEvent, Priority, RangeReader, ReactorConfig, ReadMode,
    ReadService, SourceRead,
};

const SPAN: usize = 4096;

fn spans(n: usize) -> Vec<SourceRead> {
    (0..n)
        .map(|i| SourceRead {
            tag: i as u64,
            source: 0,
            offset: (i * SPAN) as u64,
            len: SPAN,
        })
        .collect()
}

/// Waits until `service` holds no read (the gauge is lowered just after
/// each answer is sent, so it may trail the last event a little).
fn wait_quiet(service: &dyn ReadService) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while service.counters().in_flight > 0 {
        assert!(Instant::now() < deadline, "reads stay in flight");
        std::thread::yield_now();
    }
}

#[test]
fn every_read_is_answered_once_and_the_gauge_returns_to_zero() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let n = 24;
    let bytes: Vec<u8> = (0..n * SPAN).map(|i| (i * 7 + i / 4096) as u8).collect();
    std::fs::write(&path, &bytes).unwrap();
    for prefer_reactor in [false, true] {
        let source: Arc<dyn RangeReader> = Arc::from(open(&path, ReadMode::Pread).unwrap());
        let (service, why) = read_service(
            vec![source],
            prefer_reactor,
            ReactorConfig::default(),
            shared_pool(),
        )
        .unwrap();
        let prefetch = service.submit(spans(n), Priority::Prefetch);
        assert_eq!(service.counters().in_flight, n as u64, "{why}");
        service.cancel(prefetch.id);
        let demand = service.submit(spans(2), Priority::Demand);
        for event in demand.events.iter().take(2) {
            assert!(matches!(event, BatchEvent::Done((_, Ok(_)))), "{why}");
        }
        let mut seen = HashSet::new();
        for event in prefetch.events.iter().take(n) {
            let tag = match event {
                BatchEvent::Done((tag, slab)) => {
                    let s = tag as usize * SPAN;
                    assert_eq!(slab.unwrap().bytes(), &bytes[s..s + SPAN], "{why}");
                    tag
                }
                BatchEvent::Cancelled(tag) => tag,
                BatchEvent::Failed(e) => panic!("{why}: {e}"),
            };
            assert!(seen.insert(tag), "{why}: read {tag} answered twice");
        }
        assert_eq!(seen.len(), n, "{why}");
        wait_quiet(service.as_ref());
    }
}
