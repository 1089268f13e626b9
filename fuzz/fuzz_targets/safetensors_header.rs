//! A shard's JSON header, parsed for files of every length around it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let path = Path::new("fuzz.safetensors");
    for extra in [0u64, 1, 4096, u32::MAX as u64] {
        let file_len = 8 + data.len() as u64 + extra;
        let _ = moestream::weights::index::parse_header(path, data, file_len);
    }
});
