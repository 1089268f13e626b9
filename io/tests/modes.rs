//! Every read mode returns the same bytes as the file holds, for aligned and
//! unaligned ranges and near the end of the file; reads past the end are
//! `ShortRead` errors naming the file.

use std::path::{Path, PathBuf};

use moestream_io::{open, IoError, RangeReader, ReadMode};
use proptest::prelude::*;

/// Not a multiple of 4096, so direct reads near the end are partial blocks.
const FILE_BYTES: usize = 3 * 65_536 + 1234;

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 131 + i / 251) as u8).collect()
}

fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn readers(path: &Path) -> Vec<Box<dyn RangeReader>> {
    ReadMode::ALL
        .into_iter()
        .map(|mode| open(path, mode).unwrap())
        .collect()
}

fn assert_short_read(err: IoError, path: &Path) {
    assert!(matches!(err, IoError::ShortRead { .. }), "{err}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
}

#[test]
fn modes_report_themselves() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "data", &pattern(10_000));
    for mode in ReadMode::ALL {
        let reader = open(&path, mode).unwrap();
        assert_eq!(reader.len_bytes(), 10_000);
        assert_eq!(reader.path(), path);
        let effective = reader.effective_mode();
        let fell_back = mode == ReadMode::Direct && effective == ReadMode::Buffered;
        assert!(effective == mode || fell_back, "{mode} -> {effective}");
    }
}

#[test]
fn edges_of_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(FILE_BYTES);
    let path = write_file(dir.path(), "data", &data);
    let n = FILE_BYTES as u64;
    let ranges = [
        (0, 0),
        (0, 1),
        (0, FILE_BYTES),
        (n - 1, 1),
        (n, 0),
        (4095, 2),
        (n - 5000, 5000),
    ];
    for reader in readers(&path) {
        for (offset, len) in ranges {
            let slab = reader.read(offset, len).unwrap();
            let expected = &data[offset as usize..offset as usize + len];
            assert_eq!(
                slab.bytes(),
                expected,
                "{} {offset}+{len}",
                reader.effective_mode()
            );
        }
    }
}

#[test]
fn past_end_is_short_read_naming_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "truncated.bin", &pattern(FILE_BYTES));
    let n = FILE_BYTES as u64;
    for reader in readers(&path) {
        for (offset, len) in [(n - 10, 11), (n, 1), (n + 4096, 4096), (u64::MAX - 1, 4)] {
            let err = reader.read(offset, len).unwrap_err();
            assert_short_read(err, &path);
        }
    }
}

#[test]
fn file_truncated_after_open_is_short_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "shrinks.bin", &pattern(FILE_BYTES));
    let preads: Vec<_> = [
        ReadMode::Direct,
        ReadMode::Buffered,
        ReadMode::Drop,
        ReadMode::Pread,
    ]
    .into_iter()
    .map(|mode| open(&path, mode).unwrap())
    .collect();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(1000)
        .unwrap();
    for reader in preads {
        let err = reader.read(500, 1000).unwrap_err();
        match &err {
            IoError::ShortRead { got, .. } => assert_eq!(*got, 500, "{}", reader.effective_mode()),
            other => panic!("expected ShortRead, got {other}"),
        }
        assert_short_read(err, &path);
    }
}

#[test]
fn empty_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "empty", &[]);
    for reader in readers(&path) {
        assert!(reader.read(0, 0).unwrap().is_empty());
        assert_short_read(reader.read(0, 1).unwrap_err(), &path);
    }
}

#[test]
fn readers_are_shared_between_threads() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(FILE_BYTES);
    let path = write_file(dir.path(), "data", &data);
    for reader in readers(&path) {
        std::thread::scope(|scope| {
            for t in 0..4u64 {
                let (reader, data) = (&reader, &data);
                scope.spawn(move || {
                    for i in 0..50u64 {
                        let offset = (t * 7919 + i * 104_729) % (FILE_BYTES as u64 - 9000);
                        let slab = reader.read(offset, 9000).unwrap();
                        assert_eq!(slab.bytes(), &data[offset as usize..offset as usize + 9000]);
                    }
                });
            }
        });
    }
}

/// tmpfs rejected O_DIRECT before Linux 6.6; either way the reader works and
/// says which mode it ended up in.
#[test]
fn direct_on_shm_works_or_falls_back() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("skipping: /dev/shm not present");
        return;
    }
    let dir = tempfile::tempdir_in(shm).unwrap();
    let data = pattern(20_000);
    let path = write_file(dir.path(), "data", &data);
    let reader = open(&path, ReadMode::Direct).unwrap();
    eprintln!(
        "direct on /dev/shm: effective mode {}",
        reader.effective_mode()
    );
    assert_eq!(reader.read(5, 12_345).unwrap().bytes(), &data[5..12_350]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn all_modes_byte_identical(
        ranges in prop::collection::vec((0u64..FILE_BYTES as u64, 0usize..70_000), 1..16),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let data = pattern(FILE_BYTES);
        let path = write_file(dir.path(), "data", &data);
        let readers = readers(&path);
        for (offset, len) in ranges {
            let end = offset as usize + len;
            for reader in &readers {
                let result = reader.read(offset, len);
                if end <= FILE_BYTES {
                    let slab = result.unwrap();
                    prop_assert_eq!(slab.bytes(), &data[offset as usize..end]);
                } else {
                    let short = matches!(result, Err(IoError::ShortRead { .. }));
                    prop_assert!(short, "expected ShortRead for {}+{}", offset, len);
                }
            }
        }
    }
}

/// A file that shrinks while served (another process truncated it) gives
/// every mode an error naming the file for the lost range, never a SIGBUS
/// (mmap checks the file's size before each copy).
#[test]
fn a_shard_that_shrinks_mid_run_is_a_named_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "shrinks.bin", &pattern(FILE_BYTES));
    let readers = readers(&path);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(4096)
        .unwrap();
    for r in &readers {
        let err = r.read(65_536, 8192).unwrap_err();
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{}: {err}",
            r.effective_mode()
        );
        if r.effective_mode() == ReadMode::Mmap {
            assert!(
                matches!(err, IoError::FileShrank { now: 4096, .. }),
                "{err}"
            );
        }
    }
}
