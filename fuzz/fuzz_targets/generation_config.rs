//! generation_config.json's end-of-sequence ids.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = moestream::tokenizer::eos_ids_of(Path::new("generation_config.json"), text);
    }
});
