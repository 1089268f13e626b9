//! A GGUF header: parsed from memory (as the start of a file a GiB longer,
//! so tensors may lie in it), and every metadata document (config.json,
//! tokenizer.json, tokenizer_config.json) derived from it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let _ = moestream::gguf::derive_documents(Path::new("fuzz.gguf"), data, data.len() as u64 + (1 << 30));
});
