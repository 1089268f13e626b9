//! A GGUF header's metadata costs memory in proportion to its bytes: an
//! array is one typed vector (a u8 array a byte per element), not one
//! 32-byte enum per element (a 42 MB file of byte arrays peaked at 1.33
//! GB). A counting global allocator measures the peak of live bytes while
//! the header is parsed; this file holds one test so no other test thread
//! allocates while it measures.

use moestream::formats::gguf::file::{Array, GgufFile, Value};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Tracks live bytes and their peak, on every thread.
struct Peak;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    let now = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counters are relaxed atomics, which do not allocate.
unsafe impl GlobalAlloc for Peak {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: the caller's contract is passed through.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: the caller's contract is passed through.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        grew(new_size);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is passed through.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is passed through.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Peak = Peak;

#[test]
fn metadata_arrays_cost_a_bounded_multiple_of_the_file_not_32_bytes_an_element() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("arrays.gguf");
    let n = 8 << 20;
    let metadata = vec![
        (
            "general.architecture".to_string(),
            Value::Str("qwen3moe".into()),
        ),
        ("x.bytes".to_string(), Value::Array(Array::U8(vec![7; n]))),
        (
            "x.flags".to_string(),
            Value::Array(Array::Bool(vec![true; n])),
        ),
        (
            "x.words".to_string(),
            Value::Array(Array::Str(vec![String::new(); n / 8])),
        ),
    ];
    moestream::convert::gguf_write::write_gguf(&path, &metadata, &[], |_, _| Ok(())).unwrap();
    drop(metadata);
    let file_len = std::fs::metadata(&path).unwrap().len() as usize;
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let f = GgufFile::open(&path).unwrap();
    let peak = PEAK.load(Ordering::Relaxed) - before;
    assert_eq!(f.metadata.len(), 4);
    // The reader's 1 MiB buffer, vectors doubling as they grow (2x), and
    // 24-byte Strings per 8-byte length (3x): well under 4x the file.
    assert!(
        peak < 4 * file_len + (2 << 20),
        "parsing a {file_len}-byte header peaked at {peak} bytes"
    );
}
