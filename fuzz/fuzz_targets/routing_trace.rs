//! A routing trace (Parquet): written to a temporary file and read back
//! into runs, as `moestream replay` reads one.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = std::env::temp_dir().join(format!("moestream-fuzz-{}.parquet", std::process::id()));
    if std::fs::write(&path, data).is_ok() {
        let _ = moestream::trace::read::read(&path, None);
    }
});
