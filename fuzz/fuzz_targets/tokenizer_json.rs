//! tokenizer.json: parsed; an accepted tokenizer encodes and decodes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(t) = moestream::tokenizer::Tokenizer::from_json(Path::new("tokenizer.json"), text) {
        let _ = t.encode("the engine reads experts");
        let _ = t.decode(&[0, 1, 2, 3]);
    }
});
